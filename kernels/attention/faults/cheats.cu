// Kernels that try to fool the tuner, one per CHEAT value: flashtune must reject each one, by name,
// in `tune` and in `step`. Every cheat but CHEAT_SKIP_LAST_TILE passes a check that looks only at
// the first launches on one input set, which is how such kernels fooled earlier tuners:
//   CHEAT_CACHE_BY_POINTER     computes a (Q, O) pair twice, then skips it: a result cached per pointer
//   CHEAT_FIRST_LAUNCHES       writes its outputs on its first two launches only
//   CHEAT_READ_PREVIOUS_OUTPUT copies the previous launch's output when the shape matches
//   CHEAT_RACE                 merges its warps' partial sums with shared-memory atomics: the order,
//                              and so the bits, change from run to run
//   CHEAT_SMALL_MAGNITUDE      skips the max-subtraction: right until a score passes exp's range
//   CHEAT_SKIP_LAST_TILE       ignores the keys of the last BLOCK_N tile when Sk is not a multiple
//   CHEAT_WRITE_OUTSIDE        answers right, then writes into its input Q: outside its outputs
// CHEAT_NONE is the honest kernel they are all built on. It is simple, not fast: a CTA takes
// BLOCK_M query rows of one (batch, head), one row at a time, its WARPS warps splitting the keys
// (warp w takes keys w, w + WARPS, ...); lane l owns output dims l, l + 32, ...
//
// Launch contract (the family's, as in forward.cu): grid (ceil(Sq / BLOCK_M), B * H, splits),
// block WARPS * 32, no dynamic shared memory needed. Split launches are answered by split 0 alone,
// writing O and LSE directly; the combine kernel does nothing.
#include "../common.cuh"

#define CHEAT_NONE 0
#define CHEAT_CACHE_BY_POINTER 1
#define CHEAT_FIRST_LAUNCHES 2
#define CHEAT_READ_PREVIOUS_OUTPUT 3
#define CHEAT_RACE 4
#define CHEAT_SMALL_MAGNITUDE 5
#define CHEAT_SKIP_LAST_TILE 6
#define CHEAT_WRITE_OUTSIDE 7

#ifndef CHEAT
#error "CHEAT must be defined (CHEAT_NONE, CHEAT_CACHE_BY_POINTER, ...)"
#endif
#ifndef BLOCK_M
#error "BLOCK_M must be defined"
#endif
#ifndef BLOCK_N
#error "BLOCK_N must be defined"
#endif
#ifndef WARPS
#error "WARPS must be defined"
#endif
#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif

constexpr int kCheat = CHEAT;
constexpr int kBlockM = BLOCK_M;
constexpr int kBlockN = BLOCK_N;
constexpr int kWarps = WARPS;
constexpr int kHeadDim = HEAD_DIM;
constexpr int kDimsPerLane = kHeadDim / 32;
static_assert(kCheat >= CHEAT_NONE && kCheat <= CHEAT_WRITE_OUTSIDE, "unknown CHEAT");
static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "lanes own HEAD_DIM / 32 dims each");
static_assert(kWarps >= 1 && kWarps <= 32, "WARPS in 1..32");
static_assert(kBlockM >= 1 && kBlockN >= 1, "positive tiles");

// Per-CTA memory of earlier launches, for the cheats that keep state across launches.
constexpr int kMaxCtas = 1 << 14;
constexpr int kPairsPerCta = 64;
__device__ unsigned long long g_seen_q[kMaxCtas][kPairsPerCta];
__device__ unsigned long long g_seen_o[kMaxCtas][kPairsPerCta];
__device__ unsigned g_seen_count[kMaxCtas][kPairsPerCta];
__device__ unsigned g_launches[kMaxCtas];
__device__ elem_t* g_prev_o[kMaxCtas];
__device__ float* g_prev_lse[kMaxCtas];
__device__ int g_prev_shape[kMaxCtas][4];

// Whether this CTA should skip all work (and all writes) on this launch.
__device__ bool cheat_skips(int cta, const elem_t* Q, const elem_t* O) {
    if (cta >= kMaxCtas) return false;
    if (kCheat == CHEAT_FIRST_LAUNCHES) return g_launches[cta]++ >= 2;
    if (kCheat == CHEAT_CACHE_BY_POINTER) {
        const unsigned long long q = reinterpret_cast<unsigned long long>(Q);
        const unsigned long long o = reinterpret_cast<unsigned long long>(O);
        for (int i = 0; i < kPairsPerCta; ++i) {
            if (g_seen_count[cta][i] == 0) {
                g_seen_q[cta][i] = q;
                g_seen_o[cta][i] = o;
                g_seen_count[cta][i] = 1;
                return false;
            }
            if (g_seen_q[cta][i] == q && g_seen_o[cta][i] == o) return ++g_seen_count[cta][i] > 2;
        }
    }
    return false;
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 1)
attn_fwd(const elem_t* __restrict__ Q, const elem_t* __restrict__ K, const elem_t* __restrict__ V,
         elem_t* __restrict__ O, float* __restrict__ LSE, float* __restrict__ O_accum,
         float* __restrict__ LSE_accum, int B, int H, int Sq, int Sk, float softmax_scale, int causal) {
    if (blockIdx.z != 0) return;  // split 0 answers the whole row (see the header)
    __shared__ float s_m[kWarps], s_l[kWarps];
    __shared__ float s_o[kWarps][kHeadDim];
    __shared__ float acc_o[kHeadDim];
    __shared__ float acc_l;
    __shared__ bool skip;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cta = blockIdx.y * gridDim.x + blockIdx.x;
    const int64_t bh = blockIdx.y;
    const int q0 = blockIdx.x * kBlockM;
    if (threadIdx.x == 0) skip = cheat_skips(cta, Q, O);
    __syncthreads();
    if (skip) return;

    if (kCheat == CHEAT_READ_PREVIOUS_OUTPUT && cta < kMaxCtas) {
        elem_t* prev_o = g_prev_o[cta];
        float* prev_lse = g_prev_lse[cta];
        const bool same = prev_o != nullptr && g_prev_shape[cta][0] == B && g_prev_shape[cta][1] == H &&
                          g_prev_shape[cta][2] == Sq && g_prev_shape[cta][3] == Sk && prev_o != O;
        __syncthreads();
        if (threadIdx.x == 0) {
            g_prev_o[cta] = O;
            g_prev_lse[cta] = LSE;
            g_prev_shape[cta][0] = B;
            g_prev_shape[cta][1] = H;
            g_prev_shape[cta][2] = Sq;
            g_prev_shape[cta][3] = Sk;
        }
        if (same) {
            for (int r = q0; r < min(Sq, q0 + kBlockM); ++r) {
                const int64_t row = bh * Sq + r;
                for (int d = threadIdx.x; d < kHeadDim; d += blockDim.x) O[row * kHeadDim + d] = prev_o[row * kHeadDim + d];
                if (threadIdx.x == 0) LSE[row] = prev_lse[row];
            }
            return;
        }
    }

    // Keys a row may see end at kv_end(i): top-left i + 1, bottom-right i + 1 + Sk - Sq.
    const int offset = causal == 2 ? Sk - Sq : 0;
    int keys = Sk;
    if (kCheat == CHEAT_SKIP_LAST_TILE && Sk % kBlockN != 0 && Sk > kBlockN) keys = Sk / kBlockN * kBlockN;

    for (int r = q0; r < min(Sq, q0 + kBlockM); ++r) {
        const int64_t row = bh * Sq + r;
        const int visible = causal ? max(0, min(keys, r + 1 + offset)) : keys;
        float q[kDimsPerLane];
#pragma unroll
        for (int e = 0; e < kDimsPerLane; ++e) q[e] = to_float(Q[row * kHeadDim + lane + 32 * e]);

        // This warp's share of the keys, with an online softmax (or, cheating, none).
        float m = kCheat == CHEAT_SMALL_MAGNITUDE ? 0.0f : neg_inf();
        float l = 0.0f;
        float o[kDimsPerLane];
#pragma unroll
        for (int e = 0; e < kDimsPerLane; ++e) o[e] = 0.0f;
        for (int j = warp; j < visible; j += kWarps) {
            const elem_t* k = K + (bh * Sk + j) * kHeadDim;
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) dot = fmaf(q[e], to_float(k[lane + 32 * e]), dot);
            const float s = warp_sum(dot) * softmax_scale;
            float p, alpha;
            if (kCheat == CHEAT_SMALL_MAGNITUDE) {
                p = expf(s);  // no max-subtraction: overflows once s passes ~88.7
                alpha = 1.0f;
            } else {
                const float m_new = fmaxf(m, s);
                alpha = expf(m - m_new);
                p = expf(s - m_new);
                m = m_new;
            }
            l = l * alpha + p;
            const elem_t* v = V + (bh * Sk + j) * kHeadDim;
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) o[e] = fmaf(p, to_float(v[lane + 32 * e]), o[e] * alpha);
        }
        if (lane == 0) {
            s_m[warp] = m;
            s_l[warp] = l;
        }
#pragma unroll
        for (int e = 0; e < kDimsPerLane; ++e) s_o[warp][lane + 32 * e] = o[e];
        if (threadIdx.x < kHeadDim) acc_o[threadIdx.x] = 0.0f;
        if (threadIdx.x == 0) acc_l = 0.0f;
        __syncthreads();

        // Merge the warps' partials, weighted by exp(m_w - M).
        float M = neg_inf();
        for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w]);
        const float m_use = M == neg_inf() ? 0.0f : M;
        if (kCheat == CHEAT_RACE) {
            // Every warp adds its share with atomics: the order of the adds, and so the low bits, vary.
            const float wgt = s_l[warp] > 0.0f ? expf(s_m[warp] - m_use) : 0.0f;
            if (lane == 0) atomicAdd(&acc_l, wgt * s_l[warp]);
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) atomicAdd(&acc_o[lane + 32 * e], wgt * s_o[warp][lane + 32 * e]);
            __syncthreads();
        } else if (warp == 0) {
            float total_l = 0.0f, total_o[kDimsPerLane];
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) total_o[e] = 0.0f;
            for (int w = 0; w < kWarps; ++w) {
                const float wgt = s_l[w] > 0.0f ? expf(s_m[w] - m_use) : 0.0f;
                total_l += wgt * s_l[w];
#pragma unroll
                for (int e = 0; e < kDimsPerLane; ++e) total_o[e] += wgt * s_o[w][lane + 32 * e];
            }
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) acc_o[lane + 32 * e] = total_o[e];
            if (lane == 0) acc_l = total_l;
        }
        __syncthreads();
        if (warp == 0) {
            // A row that sees no key: O = 0, LSE = -inf.
            const float inv = acc_l > 0.0f ? 1.0f / acc_l : 0.0f;
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) O[row * kHeadDim + lane + 32 * e] = from_float(acc_o[lane + 32 * e] * inv);
            if (lane == 0) LSE[row] = acc_l > 0.0f ? m_use + logf(acc_l) : neg_inf();
        }
        __syncthreads();
    }
    // Every row of the block is answered; now one write where no output lives (the CTA's own rows
    // of Q, which only this CTA reads, so the answers above stay right).
    if (kCheat == CHEAT_WRITE_OUTSIDE && threadIdx.x == 0 && q0 < Sq)
        const_cast<elem_t*>(Q)[(bh * Sq + q0) * kHeadDim] = from_float(0.0f);
}

extern "C" __global__ void attn_combine(const float* O_accum, const float* LSE_accum, elem_t* O, float* LSE,
                                        int B, int H, int Sq, int num_splits) {}
