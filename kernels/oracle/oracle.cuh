// The oracle's own vocabulary: element type, mask codes and the reductions its online softmax uses.
// It shares nothing with the kernels it judges (kernels/attention/), on purpose: `step`, `judge`, MCP
// and agent sessions may edit kernels/ but never this folder (its every file is protected, and
// `the_oracle_reaches_only_its_own_folder` holds reference.cu's include closure to it), so no edit
// can change how the answer is computed. Keep every include here a system header or a file of this
// folder.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// The command line's -DDTYPE=DTYPE_F16 / DTYPE_BF16, the same spelling the kernels are built with.
#define DTYPE_F16 0
#define DTYPE_BF16 1

#ifndef DTYPE
#error "DTYPE must be defined (-DDTYPE=DTYPE_F16 or -DDTYPE=DTYPE_BF16)"
#endif

constexpr int kOracleDtype = DTYPE;
static_assert(kOracleDtype == DTYPE_F16 || kOracleDtype == DTYPE_BF16, "DTYPE must be DTYPE_F16 or DTYPE_BF16");

#if DTYPE == DTYPE_BF16
typedef __nv_bfloat16 elem_t;
#else
typedef __half elem_t;
#endif
static_assert(sizeof(elem_t) == 2, "inputs are 16-bit elements, read 8 at a time");

// The host's mask codes (Shape::causal_code): none, top-left (PyTorch is_causal), bottom-right
// (causal_lower_right).
constexpr int kCausalNone = 0;
constexpr int kCausalTopLeft = 1;
constexpr int kCausalBottomRight = 2;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Butterfly reductions over aligned groups of `width` lanes; every lane of the group ends with the result.
template <int width>
__device__ __forceinline__ float group_max(float v) {
    static_assert(width >= 1 && width <= 32 && (width & (width - 1)) == 0, "width: power of two <= 32");
#pragma unroll
    for (int off = width / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

template <int width>
__device__ __forceinline__ float group_sum(float v) {
    static_assert(width >= 1 && width <= 32 && (width & (width - 1)) == 0, "width: power of two <= 32");
#pragma unroll
    for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
