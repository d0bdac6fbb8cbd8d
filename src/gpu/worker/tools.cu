// The worker's own kernels: they draw input sets (one at a time, or every timed launch's inputs in
// one launch before each replay), checksum input sets,
// mask references and compare outputs with them (ft_mask, ft_compare), measure the read-only
// bandwidth roof and time the drift sentinel (ft_fma and ft_read). They live in the flashtune binary (as the PTX beside this
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

// N(0, 1) for elements 2j and 2j + 1 of `tensor` (j = pair): a pure function of (seed, tensor, j).
// Box-Muller on a counter-based hash, with the fast log and sine units: the values only have to be
// random and of unit scale, and drawing every timed launch's inputs before each replay must cost
// little beside the replay (a decode shape's K and V are a gigabyte).
__device__ __forceinline__ float2 normal_pair(uint64_t seed, uint64_t tensor, uint64_t pair) {
    const uint64_t h = splitmix64(seed ^ splitmix64(tensor * 0xD1B54A32D192ED03ull + pair));
    // u1 in (0, 1] so the log is finite; u2 in [0, 1).
    const float u1 = (float((h >> 40) & 0xFFFFFF) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = float(h & 0xFFFFFF) * (1.0f / 16777216.0f);
    const float r = sqrtf(-2.0f * __logf(u1));
    float s, c;
    __sincosf(6.283185307179586f * u2, &s, &c);
    return make_float2(r * c, r * s);
}

__device__ __forceinline__ uint32_t to_bits16(float x, int bf16) {
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}

// The input mixture, as trial::mixture has it (the same hashes and thresholds; a GPU test holds the
// two together): each head of each launch (tensors 3 launch .. 3 launch + 2) draws one component.
constexpr uint64_t kMixTag = 0x6d69787475726531ull;  // "mixture1"
constexpr float kAlignedNoise = 0.31622777f;          // sqrt(1 - rho), rho = 0.9
constexpr float kAlignedShared = 0.9486833f;          // sqrt(rho)
constexpr uint64_t kOutlierEvery = 16;
enum MixKind { kPlain = 0, kWide = 1, kAligned = 2, kSpiky = 3, kOutliers = 4 };
struct MixComponent {
    int kind;
    float param;  // sigma, gain, magnitude or factor
    uint32_t ch[3];
};

__device__ __forceinline__ uint64_t mixture_head_hash(uint64_t seed, uint64_t launch, uint64_t head) {
    return splitmix64(seed ^ splitmix64(kMixTag ^ (launch * 0x9E3779B97F4A7C15ull) ^ (head * 0xD1B54A32D192ED03ull)));
}

__device__ __forceinline__ MixComponent mixture_component(uint64_t hash, uint32_t d) {
    const uint64_t pick = (hash >> 32) % 8;
    const uint32_t k = uint32_t((hash >> 8) & 0xFFFF);
    MixComponent c = {kPlain, 0.0f, {0, 0, 0}};
    if (pick <= 1) return c;
    if (pick <= 3) {
        c.kind = kWide;
        c.param = float(2 + k % 7);
    } else if (pick == 4) {
        c.kind = kAligned;
        c.param = 1.0f + 0.25f * float(k % 5);
    } else if (pick == 5) {
        c.kind = kSpiky;
        c.param = float(4 + k % 7);
        for (int i = 0; i < 3; ++i) c.ch[i] = uint32_t(splitmix64(hash ^ uint64_t(i + 1)) % (d ? d : 1));
    } else {
        c.kind = kOutliers;
        c.param = float(4 + k % 37);
    }
    return c;
}

__device__ __forceinline__ float mixture_row_sign(uint64_t hash, uint64_t t, uint64_t row) {
    return (splitmix64(hash ^ splitmix64((t << 40) ^ row ^ 0x7369676eull)) & 1) ? -1.0f : 1.0f;
}

__device__ __forceinline__ float mixture_shared_direction(uint64_t hash, uint32_t channel) {
    const uint64_t h = splitmix64(hash ^ splitmix64(uint64_t(channel) ^ 0x64697265ull));
    const float u1 = (float((h >> 40) & 0xFFFFFF) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = float(h & 0xFFFFFF) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

// What the component makes of an element's plain draw z: in tensor t (0 Q, 1 K, 2 V), at (row, channel).
// `row_factor` is the row's own part (its sign, or the outlier factor), computed once per row.
__device__ __forceinline__ float mixture_value(const MixComponent& c, uint64_t hash, float row_factor,
                                               uint32_t channel, float z) {
    switch (c.kind) {
        case kWide: return c.param * z;
        case kAligned: return kAlignedNoise * z + kAlignedShared * c.param * row_factor * mixture_shared_direction(hash, channel);
        case kSpiky:
            return (channel == c.ch[0] || channel == c.ch[1] || channel == c.ch[2]) ? z + row_factor * c.param : z;
        case kOutliers: return row_factor * z;
        default: return z;
    }
}

__device__ __forceinline__ float mixture_row_factor(const MixComponent& c, uint64_t hash, uint64_t t, uint64_t row) {
    if (c.kind == kAligned || c.kind == kSpiky) return mixture_row_sign(hash, t, row);
    if (c.kind == kOutliers)
        return (t == 1 && splitmix64(hash ^ splitmix64(row ^ 0x6f75746cull)) % kOutlierEvery == 0) ? c.param : 1.0f;
    return 1.0f;
}

// Fill n elements of `tensor` of a draw from the mixture (rows of d, `heads` heads of equal size;
// 16-byte aligned, as every allocation is): eight elements (one 16-byte store, one row, since d is a
// multiple of 8) per thread and step, the component and the row's factor once per step.
__device__ __forceinline__ void fill_mixture(uint16_t* out, uint64_t n, uint64_t seed, uint64_t tensor,
                                             uint32_t heads, uint32_t d, int bf16, uint64_t first, uint64_t stride) {
    const uint64_t t = tensor % 3, launch = tensor / 3;
    const uint64_t head_elems = heads ? n / heads : n;
    uint4* out8 = reinterpret_cast<uint4*>(out);
    uint64_t cached_head = ~0ull, hash = 0;
    MixComponent c = {kPlain, 0.0f, {0, 0, 0}};
    for (uint64_t v = first; v < n / 8; v += stride) {
        const uint64_t e = 8 * v;
        const uint64_t head = head_elems ? e / head_elems : 0;
        if (head != cached_head) {
            cached_head = head;
            hash = mixture_head_hash(seed, launch, head);
            c = mixture_component(hash, d);
        }
        const uint64_t in_head = e - head * head_elems;
        const uint64_t row = in_head / d;
        const uint32_t ch0 = uint32_t(in_head % d);
        const float rf = (t < 2) ? mixture_row_factor(c, hash, t, row) : 1.0f;
        uint32_t w[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const float2 z = normal_pair(seed, tensor, 4 * v + p);
            float lo = z.x, hi = z.y;
            if (t < 2 && c.kind != kPlain) {
                lo = mixture_value(c, hash, rf, ch0 + 2 * p, lo);
                hi = mixture_value(c, hash, rf, ch0 + 2 * p + 1, hi);
            }
            w[p] = to_bits16(lo, bf16) | (to_bits16(hi, bf16) << 16);
        }
        out8[v] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    // A tail of fewer than eight (d is a multiple of 8, so only a buffer that is not whole rows).
    for (uint64_t i = n / 8 * 8 + first; i < n; i += stride) {
        const float2 z = normal_pair(seed, tensor, i / 2);
        out[i] = uint16_t(to_bits16((i & 1) ? z.y : z.x, bf16));
    }
}

extern "C" __global__ void ft_generate(uint16_t* out, uint64_t n, uint64_t seed, uint64_t tensor,
                                       uint32_t heads, uint32_t d, int bf16) {
    fill_mixture(out, n, seed, tensor, heads, d, bf16, uint64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                 uint64_t(gridDim.x) * blockDim.x);
}

// One buffer of a list the host passes as a table in device memory (trial::Device::draw_inputs).
struct BufferEntry {
    uint16_t* ptr;
    uint64_t n;
};
static_assert(sizeof(BufferEntry) == 16, "two 8-byte words, as the host writes them");

// Every buffer of the table drawn in one launch, buffer b as tensor b: the inputs of every timed
// launch, redrawn before each replay from a seed the kernel under test cannot know.
// blockIdx.y picks the buffer (grid-stride over y as well, for tables past the grid's y limit).
extern "C" __global__ void ft_generate_many(const BufferEntry* table, uint32_t count, uint64_t seed,
                                            uint32_t heads, uint32_t d, int bf16) {
    for (uint32_t b = blockIdx.y; b < count; b += gridDim.y)
        fill_mixture(table[b].ptr, table[b].n, seed, b, heads, d, bf16, uint64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                     uint64_t(gridDim.x) * blockDim.x);
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

// One order-independent checksum over every buffer of the table: the sum over (b, i) of
// hash(b, i, element i of buffer b). It changes when any element of any buffer changes.
extern "C" __global__ void ft_checksum_many(const BufferEntry* table, uint32_t count, unsigned long long* out) {
    uint64_t acc = 0;
    for (uint32_t b = blockIdx.y; b < count; b += gridDim.y) {
        const uint16_t* buf = table[b].ptr;
        const uint64_t n = table[b].n, salt = splitmix64(b + 1);
        const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
        for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
            acc += splitmix64(salt ^ ((i << 16) | buf[i]));
    }
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

// The word that masks 32-bit element i of a reference under `key` (check::mask_word on the host).
__device__ __forceinline__ uint32_t mask_word(uint64_t key, uint64_t i) {
    return uint32_t(splitmix64(key ^ splitmix64(i)));
}

// XOR n 32-bit elements with their mask words: masks a plain reference, unmasks a masked one.
extern "C" __global__ void ft_mask(uint32_t* buf, uint64_t n, uint64_t key) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        buf[i] ^= mask_word(key, i);
}

// The figures check::compare_rows computes, per thread block; the host merges the blocks'
// partials (check::ComparePartial: these nine words in this order).
struct ComparePartial {
    double max_abs, diff2, ref2, row_max;
    unsigned long long worst_row;
    double lse_max;
    unsigned long long nan, unwritten, differing;
};
static_assert(sizeof(ComparePartial) == 9 * 8, "nine 8-byte words, as the host reads them");

constexpr int kCompareThreads = 256;
constexpr int kCompareWarps = kCompareThreads / 32;
constexpr uint16_t kPoison16 = 0xFFFFu;
constexpr uint32_t kPoisonF32 = 0xFFFFFFFFu;

// max, but a NaN on either side wins (check::max_nan).
__device__ __forceinline__ double max_nan(double a, double b) {
    return (isnan(a) || isnan(b)) ? __longlong_as_double(0x7FF8000000000000ll) : fmax(a, b);
}
// sqrt(diff² / ref²), or the absolute sqrt(diff²) where the reference is zero (check::rel).
__device__ __forceinline__ double rel_l2(double diff2, double ref2) {
    return ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
}
// The row with the larger error; a NaN error is the worst of all and stays (check::worse_row).
__device__ __forceinline__ void worse_row(double& a, unsigned long long& a_row, double b,
                                          unsigned long long b_row) {
    if (!(isnan(a) || !(isnan(b) || b > a))) {
        a = b;
        a_row = b_row;
    }
}
__device__ __forceinline__ ComparePartial merge(ComparePartial a, const ComparePartial& b) {
    a.max_abs = max_nan(a.max_abs, b.max_abs);
    a.diff2 += b.diff2;
    a.ref2 += b.ref2;
    worse_row(a.row_max, a.worst_row, b.row_max, b.worst_row);
    a.lse_max = max_nan(a.lse_max, b.lse_max);
    a.nan += b.nan;
    a.unwritten += b.unwritten;
    a.differing += b.differing;
    return a;
}

// Compare a forward output (rows of d 16-bit elements, f16 or bf16) and its LSE with a masked fp32
// reference, as check::compare does on the host: a poisoned element counts as never written, a
// written NaN or inf as such, a reference NaN makes every figure it touches NaN, and a row that sees
// no key must have LSE = -inf. With `earlier_o` (else null), also count the outputs whose bits differ
// from an earlier run on the same inputs (check::differing_bits). Each row's LSE error is divided by
// its head's entry of `lse_scales` (`heads` of them, rows split evenly; none: 1). One warp per row;
// `partials` gets one ComparePartial per block.
extern "C" __global__ void __launch_bounds__(kCompareThreads)
ft_compare(const uint16_t* __restrict__ o, const float* __restrict__ lse,
           const uint32_t* __restrict__ ref_o, const uint32_t* __restrict__ ref_lse,
           uint64_t o_key, uint64_t lse_key, uint64_t rows, int d, int bf16,
           const uint16_t* __restrict__ earlier_o, const float* __restrict__ earlier_lse,
           const double* __restrict__ lse_scales, uint64_t heads, ComparePartial* __restrict__ partials) {
    const uint64_t rows_per_head = heads ? (rows + heads - 1) / heads : rows;
    __shared__ ComparePartial warp_partials[kCompareWarps];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    ComparePartial p = {};
    for (uint64_t row = uint64_t(blockIdx.x) * kCompareWarps + warp; row < rows;
         row += uint64_t(gridDim.x) * kCompareWarps) {
        double row_diff2 = 0.0, row_ref2 = 0.0, max_abs = 0.0;
        unsigned long long nan = 0, unwritten = 0, differing = 0;
        for (int c = lane; c < d; c += 32) {
            const uint64_t e = row * d + c;
            const uint16_t bits = o[e];
            const float r = __uint_as_float(ref_o[e] ^ mask_word(o_key, e));
            if (earlier_o) differing += bits != earlier_o[e];
            if (bits == kPoison16) {
                ++unwritten;
                continue;
            }
            const float x = bf16 ? __bfloat162float(__ushort_as_bfloat16(bits))
                                 : __half2float(__ushort_as_half(bits));
            if (!isfinite(x)) {
                ++nan;
                continue;
            }
            const double diff = fabs(double(x) - double(r));
            max_abs = max_nan(max_abs, diff);
            row_diff2 += diff * diff;
            row_ref2 += double(r) * double(r);
        }
        for (int off = 16; off > 0; off /= 2) {
            row_diff2 += __shfl_xor_sync(0xffffffffu, row_diff2, off);
            row_ref2 += __shfl_xor_sync(0xffffffffu, row_ref2, off);
            max_abs = max_nan(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, off));
            nan += __shfl_xor_sync(0xffffffffu, nan, off);
            unwritten += __shfl_xor_sync(0xffffffffu, unwritten, off);
            differing += __shfl_xor_sync(0xffffffffu, differing, off);
        }
        if (lane == 0) {
            p.max_abs = max_nan(p.max_abs, max_abs);
            p.diff2 += row_diff2;
            p.ref2 += row_ref2;
            worse_row(p.row_max, p.worst_row, rel_l2(row_diff2, row_ref2), row);
            p.nan += nan;
            p.unwritten += unwritten;
            p.differing += differing;
            const float l = lse[row];
            const uint32_t l_bits = __float_as_uint(l);
            const float r = __uint_as_float(ref_lse[row] ^ mask_word(lse_key, row));
            if (earlier_lse) p.differing += l_bits != __float_as_uint(earlier_lse[row]);
            if (l_bits == kPoisonF32) {
                ++p.unwritten;
            } else if (isinf(r) && r < 0.0f && isinf(l) && l < 0.0f) {
                // A row that sees no key: -inf is the right answer, not a non-finite output.
            } else if (!isfinite(l)) {
                ++p.nan;
            } else {
                const double scale = heads ? lse_scales[row / rows_per_head] : 1.0;
                p.lse_max = max_nan(p.lse_max, fabs(double(l) - double(r)) / scale);
            }
        }
    }
    if (lane == 0) warp_partials[warp] = p;
    __syncthreads();
    if (threadIdx.x == 0) {
        ComparePartial block = warp_partials[0];
        for (int w = 1; w < kCompareWarps; ++w) block = merge(block, warp_partials[w]);
        partials[blockIdx.x] = block;
    }
}
