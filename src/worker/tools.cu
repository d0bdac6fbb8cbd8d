// The worker's own kernels: they draw input sets, negate V between replays, checksum input sets,
// measure the read-only bandwidth roof and time the drift sentinel (ft_fma and ft_read). They live in the flashtune binary (as the PTX beside this
// file, built by `nvcc -ptx` from this source) and never under kernels/, so no kernel edit can
// change how its inputs are drawn or how its roofs are measured.
//
// Rebuild after an edit (a test compares the two):
//   nvcc -ptx -arch=compute_80 -O3 -o src/worker/tools.ptx src/worker/tools.cu
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// out[i] = sigma * N(0, 1) rounded to f16 (bf16 = 0) or bf16 (bf16 = 1): a pure function of
// (seed, tensor, i). Box-Muller on a counter-based hash: elements 2j and 2j + 1 share one pair.
extern "C" __global__ void ft_generate(uint16_t* out, uint64_t n, uint64_t seed, uint64_t tensor,
                                       float sigma, int bf16) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint64_t h = splitmix64(seed ^ splitmix64(tensor * 0xD1B54A32D192ED03ull + (i >> 1)));
        // u1 in (0, 1] so the log is finite; u2 in [0, 1).
        const float u1 = (float((h >> 40) & 0xFFFFFF) + 1.0f) * (1.0f / 16777216.0f);
        const float u2 = float(h & 0xFFFFFF) * (1.0f / 16777216.0f);
        const float r = sqrtf(-2.0f * logf(u1));
        const float theta = 6.283185307179586f * u2;
        const float z = sigma * r * ((i & 1) ? sinf(theta) : cosf(theta));
        out[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(z)) : __half_as_ushort(__float2half_rn(z));
    }
}

// Flip the sign bit of n 16-bit elements: -x exactly, in f16 and bf16 alike.
extern "C" __global__ void ft_negate(uint16_t* buf, uint64_t n) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    uint32_t* words = reinterpret_cast<uint32_t*>(buf);
    for (uint64_t w = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < n / 2; w += stride)
        words[w] ^= 0x80008000u;
    if (n % 2 == 1 && blockIdx.x == 0 && threadIdx.x == 0) buf[n - 1] ^= 0x8000u;
}

// An order-independent checksum of n 16-bit elements: the sum over i of hash(i, element i).
extern "C" __global__ void ft_checksum(const uint16_t* buf, uint64_t n, unsigned long long* out) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    uint64_t acc = 0;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        acc += splitmix64((i << 16) | buf[i]);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (threadIdx.x % 32 == 0) atomicAdd(out, (unsigned long long)acc);
}

// Reads n_vec 16-byte vectors once (grid-stride, four loads in flight per thread) and writes
// nothing unless the xor of everything it read equals `never`: the read-only bandwidth roof.
extern "C" __global__ void ft_read(const uint4* src, uint64_t n_vec, uint32_t never, uint32_t* sink) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    uint32_t acc = 0;
    uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n_vec; i += 4 * stride) {
        const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);
        const uint4 c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n_vec; i += stride) {
        const uint4 a = __ldcs(src + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == never) sink[blockIdx.x] = acc;
}

// The drift sentinel's compute-bound half: eight independent chains of fused multiply-adds per thread,
// in registers, `iters` steps long; it writes nothing unless the result equals `never`. No memory
// traffic, so its time follows the SM clock alone: a GPU that heats up and throttles shows it here.
extern "C" __global__ void ft_fma(uint32_t iters, float never, float* sink) {
    float a[8];
    for (int j = 0; j < 8; ++j) a[j] = (threadIdx.x + j) * 1e-3f + blockIdx.x * 1e-6f;
    const float x = 0.9999f, y = 1e-4f;
    for (uint32_t i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = fmaf(a[j], x, y);
    }
    float acc = 0.0f;
    for (int j = 0; j < 8; ++j) acc += a[j];
    if (acc == never) sink[blockIdx.x] = acc;
}
