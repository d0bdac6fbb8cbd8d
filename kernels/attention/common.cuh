// Shared by every attention kernel: element-type selection from the DTYPE define,
// float <-> elem_t conversions, warp reductions and the numeric constants of the softmax.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

// These must exist before the command line's -DDTYPE=DTYPE_BF16 is expanded.
#define DTYPE_F16 0
#define DTYPE_BF16 1

#ifndef DTYPE
#error "DTYPE must be defined (-DDTYPE=DTYPE_F16 or -DDTYPE=DTYPE_BF16)"
#endif

// A constexpr rather than a bare #if: an unknown token such as -DDTYPE=DTYPE_FP8 would read
// as 0 (= f16) in the preprocessor, but is a hard error as a C++ identifier.
constexpr int kDtype = DTYPE;
static_assert(kDtype == DTYPE_F16 || kDtype == DTYPE_BF16, "DTYPE must be DTYPE_F16 or DTYPE_BF16");

#if DTYPE == DTYPE_BF16
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
#else
typedef __half elem_t;
typedef __half2 elem2_t;
#endif

static_assert(sizeof(elem_t) == 2, "the smem formula reported to the planner assumes ELEM_BYTES == 2");

// The kernels' `int causal` argument (Shape::causal_code on the host). 1 is top-left because the
// argument used to be a bool: `true` must keep meaning what PyTorch's is_causal means.
constexpr int kCausalNone = 0;
constexpr int kCausalTopLeft = 1;        // query i sees keys j <= i (PyTorch is_causal)
constexpr int kCausalBottomRight = 2;    // query i sees keys j <= i + Sk - Sq (FA >= 2.1, causal_lower_right)
static_assert(kCausalNone == 0 && kCausalTopLeft == 1, "causal codes 0 and 1 are the old bool false and true");

// Every mask admits a prefix of the keys: query i sees keys j <= i + causal_offset and j < Sk.
// With no mask the offset is Sk, so that one comparison (j > i + offset) never fires for j < Sk.
// A row with i + offset < 0 sees no key (bottom-right, Sq > Sk): its O is 0 and its LSE -inf.
// Sq and Sk are below 2^30 (the host refuses larger shapes), so i + offset fits an int.
__device__ __forceinline__ int causal_offset(int causal, int sq, int sk) {
    if (causal != kCausalNone && causal != kCausalTopLeft && causal != kCausalBottomRight) __trap();
    return causal == kCausalTopLeft ? 0 : causal == kCausalBottomRight ? sk - sq : sk;
}

// log2(e): the softmax runs in base 2 so that exp2f (one MUFU op) replaces expf.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float to_float(elem_t x) {
#if DTYPE == DTYPE_BF16
    return __bfloat162float(x);
#else
    return __half2float(x);
#endif
}

__device__ __forceinline__ float2 to_float2(elem2_t x) {
#if DTYPE == DTYPE_BF16
    return __bfloat1622float2(x);
#else
    return __half22float2(x);
#endif
}

__device__ __forceinline__ elem_t from_float(float x) {
#if DTYPE == DTYPE_BF16
    return __float2bfloat16_rn(x);
#else
    return __float2half_rn(x);
#endif
}

// Butterfly reductions over aligned groups of `width` lanes (a power of two <= 32); every lane
// of the group ends with the result, so no broadcast is needed afterwards.
template <int width = 32>
__device__ __forceinline__ float group_max(float v) {
    static_assert(width >= 1 && width <= 32 && (width & (width - 1)) == 0, "width: power of two <= 32");
#pragma unroll
    for (int off = width / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

template <int width = 32>
__device__ __forceinline__ float group_sum(float v) {
    static_assert(width >= 1 && width <= 32 && (width & (width - 1)) == 0, "width: power of two <= 32");
#pragma unroll
    for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) { return group_max<32>(v); }
__device__ __forceinline__ float warp_sum(float v) { return group_sum<32>(v); }

// The running max is -inf while a row has seen no key; subtracting it would give
// (-inf) - (-inf) = NaN. Using 0 instead makes every exponent of a masked score -inf -> 0.
__device__ __forceinline__ float safe_max(float m) { return m == neg_inf() ? 0.0f : m; }

// exp2 on the MUFU unit, flushing denormals: ex2.approx(-inf) = +0, which the masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// A row's running max in log2 units, rounded once by an FMUL that is never contracted: the row
// sum is kept in units of 2^-scaled_max, so every rescale and the LSE must use this same rounded
// value. With `m * scale_log2 - m_new` the compiler forms one FFMA of the unrounded product, and
// each rescale then carries that rounding into l: up to half an ulp of the max (3e-5 at 512) per
// change of the max, about 1e-4 in the LSE over a 32k-key row of large scores.
__device__ __forceinline__ float scaled_max(float m, float scale_log2) { return __fmul_rn(m, scale_log2); }

// Two floats rounded to one packed elem2 register (the MMA operand format).
__device__ __forceinline__ uint32_t pack_elem2(float lo, float hi) {
#if DTYPE == DTYPE_BF16
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
#else
    __half2 v = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<uint32_t*>(&v);
}

// ---- cp.async (sm_80+): 16-byte global -> shared copies that bypass L1 (.cg) -----------------
// src_bytes = 0 reads nothing and zero-fills the 16 destination bytes (tails of K/V/Q tiles);
// the source address must still be a valid pointer, so callers pass the tensor base then.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    static_assert(N >= 0, "cp.async.wait_group takes a non-negative count");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
