// Fault injection for flashtune's supervision: the forward ABI, misbehaving in the way FAULT names.
// FAULT_NONE compiles the real family unchanged, so good and faulty variants share one space
// (variants/faults.toml) and the run must measure the good ones whatever the bad ones do.
#define FAULT_NONE 0
#define FAULT_HANG 1
#define FAULT_ILLEGAL_ADDRESS 2
#define FAULT_NAN 3
#define FAULT_WRONG 4
#define FAULT_SMEM 5
#define FAULT_COMPILE_ERROR 6
#define FAULT_SLOW_COMPILE 7

#ifndef FAULT
#error "FAULT must be defined (FAULT_NONE, FAULT_HANG, ...)"
#endif

#if FAULT == FAULT_NONE
#include "../forward.cu"
#else
#include "../common.cuh"

__device__ int never_set;

extern "C" __global__ void attn_fwd(const elem_t* Q, const elem_t* K, const elem_t* V, elem_t* O, float* LSE,
                                    float* O_accum, float* LSE_accum, int B, int H, int Sq, int Sk,
                                    float softmax_scale, int causal) {
#if FAULT == FAULT_HANG
  // Spins on a flag nothing sets; only the supervisor's timeout ends it.
  while (atomicAdd(&never_set, 0) == 0) {
  }
#elif FAULT == FAULT_ILLEGAL_ADDRESS
  reinterpret_cast<float*>(0x8)[threadIdx.x] = 1.0f;
#elif FAULT == FAULT_NAN || FAULT == FAULT_WRONG
  // Writes every output it owns, so the failure is the values, not unwritten memory.
  const float value = FAULT == FAULT_NAN ? __int_as_float(0x7fc00000) : 0.0f;
  const long rows = long(B) * H * Sq;
  const long first = long(blockIdx.y) * Sq + long(blockIdx.x) * BLOCK_M;
  for (long r = first + threadIdx.x / 32; r < first + BLOCK_M && r - long(blockIdx.y) * Sq < Sq; r += blockDim.x / 32) {
    if (r >= rows) break;
    for (int d = threadIdx.x % 32; d < HEAD_DIM; d += 32) O[r * HEAD_DIM + d] = from_float(value);
    if (threadIdx.x % 32 == 0) LSE[r] = value;
  }
#elif FAULT == FAULT_SMEM
  // 256 KiB of static shared memory: more than any GPU has per block.
  __shared__ float too_much[64 * 1024];
  too_much[threadIdx.x] = 1.0f;
  __syncthreads();
  O[threadIdx.x] = from_float(too_much[(threadIdx.x + 1) % blockDim.x]);
#elif FAULT == FAULT_COMPILE_ERROR
  this_is_not_cuda(Q);
#elif FAULT == FAULT_SLOW_COMPILE
#if __has_include("slow-compile.fifo")
  // A named pipe nothing writes (the supervision tests make one): the preprocessor waits on it for
  // ever, a compile that never ends without taking a core from the tests that run beside it.
#include "slow-compile.fifo"
#else
  // 4^9 copies of a dependent statement, pasted by the preprocessor: minutes of nvcc.
#define FT_X4(s) s s s s
#define FT_X256(s) FT_X4(FT_X4(FT_X4(FT_X4(s))))
  float acc = softmax_scale;
  FT_X256(FT_X4(FT_X4(FT_X4(FT_X4(FT_X4(acc = acc * 1.0001f + __sinf(acc);))))))
  LSE[0] = acc;
#endif
#else
#error "unknown FAULT"
#endif
}

extern "C" __global__ void attn_combine(const float* O_accum, const float* LSE_accum, elem_t* O, float* LSE, int B,
                                        int H, int Sq, int num_splits) {}
#endif
