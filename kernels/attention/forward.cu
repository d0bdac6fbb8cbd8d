// The forward-attention family: one kernel source, specialised at compile time by the defines
// below into the variants the tuner explores (compute path, tile sizes, warps), plus the
// combine kernel that merges split-KV partial results by log-sum-exp.
//
// Launch contract (the Rust planner and worker rely on it):
//   attn_fwd:     grid (ceil(Sq / BLOCK_M), B * H, num_splits), block WARPS * 32,
//                 dynamic smem >= kSmemBytes (the kernel traps if it gets less). Formula:
//                 (BLOCK_M + 2 * STAGES * BLOCK_N) * (HEAD_DIM + 8) * ELEM_BYTES
//                 + BLOCK_M * (BLOCK_N + 4) * 4
//                 + if(MMA == "wmma", BLOCK_M * (BLOCK_N + 8) * ELEM_BYTES + BLOCK_M * 4, 0)
//   attn_combine: grid (ceil(B * H * Sq / COMBINE_ROWS_PER_BLOCK)), block COMBINE_THREADS.
#include <mma.h>

#include "common.cuh"

#define MMA_SCALAR 0
#define MMA_WMMA 1
#define MMA_MMA 2

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined (64 or 128)"
#endif
#ifndef MMA
#error "MMA must be defined (MMA_SCALAR, MMA_WMMA or MMA_MMA)"
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
#ifndef KV_SPLIT
#error "KV_SPLIT must be defined"
#endif
#ifndef STAGES
#error "STAGES must be defined"
#endif

#define COMBINE_ROWS_PER_BLOCK 4
#define COMBINE_THREADS 128
static_assert(COMBINE_THREADS == COMBINE_ROWS_PER_BLOCK * 32, "combine: one warp per query row");

constexpr int kHeadDim = HEAD_DIM;
constexpr int kMma = MMA;  // as a C++ constant, an unknown token is an error, not a silent 0
constexpr int kBlockM = BLOCK_M;
constexpr int kBlockN = BLOCK_N;
constexpr int kWarps = WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kKvSplit = KV_SPLIT;
constexpr int kStages = STAGES;

static_assert(kHeadDim == 64 || kHeadDim == 128, "HEAD_DIM must be 64 or 128");
static_assert(kMma == MMA_SCALAR || kMma == MMA_WMMA || kMma == MMA_MMA, "MMA must be MMA_SCALAR, MMA_WMMA or MMA_MMA");
static_assert(kMma != MMA_MMA, "MMA_MMA (mma.sync m16n8k16 + ldmatrix): not implemented yet, later milestone");
static_assert(kBlockM >= 16 && kBlockM % 16 == 0, "BLOCK_M must be a positive multiple of 16");
static_assert(kBlockN >= 16 && kBlockN % 16 == 0, "BLOCK_N must be a positive multiple of 16");
static_assert(kWarps >= 1 && kWarps <= 32, "WARPS must be in 1..32 (at most 1024 threads)");
// The split count is gridDim.z at run time (the host may pick it per shape without a rebuild);
// KV_SPLIT only names the variant, so it is checked but otherwise unused.
static_assert(kKvSplit >= 1, "KV_SPLIT must be >= 1");
static_assert(kStages == 1, "STAGES > 1 (cp.async pipeline): later milestone");
static_assert(kHeadDim % 32 == 0, "combine: each lane owns HEAD_DIM / 32 output dims");

// ---------------------------------------------------------------------------------------------
// Shared-memory layout. Rows are padded so that consecutive rows start in different banks and
// every row start stays 16-byte aligned (vector loads) and every 16-row block 32-byte aligned
// (wmma load/store pointers must be 256-bit aligned).
constexpr int kPadElems = 8;                  // 16 bytes
constexpr int kLdQKV = kHeadDim + kPadElems;  // elements per Q/K/V smem row
constexpr int kLdS = kBlockN + 4;             // floats per score row (wmma float ldm % 4 == 0)
constexpr int kLdP = kBlockN + kPadElems;     // elements per probability row (wmma half ldm % 8 == 0)
constexpr bool kHasP = kMma == MMA_WMMA;      // scalar path multiplies fp32 P straight from S

constexpr size_t kQBytes = size_t(kBlockM) * kLdQKV * sizeof(elem_t);
constexpr size_t kKVBytes = size_t(kStages) * kBlockN * kLdQKV * sizeof(elem_t);  // each of K, V
constexpr size_t kSBytes = size_t(kBlockM) * kLdS * sizeof(float);
constexpr size_t kPBytes = kHasP ? size_t(kBlockM) * kLdP * sizeof(elem_t) : 0;
constexpr size_t kRowBytes = kHasP ? size_t(kBlockM) * sizeof(float) : 0;
// Keep in sync with the formula in the header comment: the planner evaluates that one.
constexpr size_t kSmemBytes = kQBytes + 2 * kKVBytes + kSBytes + kPBytes + kRowBytes;

static_assert(kQBytes % 32 == 0 && kKVBytes % 32 == 0 && kSBytes % 32 == 0 && kPBytes % 32 == 0,
              "each smem region must start 32-byte aligned");
static_assert(kSmemBytes <= 227 * 1024, "exceeds Hopper's 227 KB opt-in shared memory per block");

struct Smem {
    elem_t* q;    // [BLOCK_M][kLdQKV]
    elem_t* k;    // [BLOCK_N][kLdQKV]
    elem_t* v;    // [BLOCK_N][kLdQKV]
    float* s;     // [BLOCK_M][kLdS]  scores, then (scalar path) probabilities
    elem_t* p;    // [BLOCK_M][kLdP]  probabilities as MMA operands (wmma path)
    float* row;   // [BLOCK_M]        per-row factors handed between lanes (wmma path)
};

__device__ __forceinline__ Smem carve_smem(unsigned char* base) {
    Smem sm;
    sm.q = reinterpret_cast<elem_t*>(base);
    sm.k = reinterpret_cast<elem_t*>(base + kQBytes);
    sm.v = reinterpret_cast<elem_t*>(base + kQBytes + kKVBytes);
    sm.s = reinterpret_cast<float*>(base + kQBytes + 2 * kKVBytes);
    sm.p = reinterpret_cast<elem_t*>(base + kQBytes + 2 * kKVBytes + kSBytes);
    sm.row = reinterpret_cast<float*>(base + kQBytes + 2 * kKVBytes + kSBytes + kPBytes);
    return sm;
}

// A host-side smem formula that disagrees with kSmemBytes would silently corrupt memory; trap
// instead so the variant is rejected loudly.
__device__ __forceinline__ void require_dynamic_smem(unsigned need) {
    unsigned have;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
    if (have < need) __trap();
}

// Copies rows [row0, row0 + ROWS) of a [n_rows, HEAD_DIM] matrix into padded smem, 16 bytes per
// access. Rows past the end are zeroed, not skipped: masked probabilities are 0, but 0 * (stale
// smem that happens to be NaN) would still be NaN.
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t* dst, const elem_t* __restrict__ src, int row0, int n_rows) {
    constexpr int kVecPerRow = kHeadDim / 8;
    constexpr int kVecs = ROWS * kVecPerRow;
#pragma unroll 4
    for (int idx = threadIdx.x; idx < kVecs; idx += kThreads) {
        const int r = idx / kVecPerRow;
        const int c = (idx % kVecPerRow) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < n_rows) val = *reinterpret_cast<const uint4*>(src + int64_t(row0 + r) * kHeadDim + c);
        *reinterpret_cast<uint4*>(dst + r * kLdQKV + c) = val;
    }
}

// What every path needs to know about the CTA's work.
struct Ctx {
    int q0;            // first query row of the block
    int sq, sk;
    bool causal;
    float scale_log2;  // softmax_scale * log2(e): scores go straight into exp2f
};

__device__ __forceinline__ bool key_masked(const Ctx& ctx, int i, int j) {
    return j >= ctx.sk || (ctx.causal && j > i);
}

// Where results go: O/LSE directly with one split, float partials otherwise. Each partial is
// normalised by its own row sum so the combine needs only the LSEs as weights.
struct Epilogue {
    elem_t* o;
    float* o_accum;  // non-null iff split
    float* lse;      // LSE or LSE_accum
    int64_t row0;    // flattened row index of query 0 of this (split, b, h)

    __device__ __forceinline__ void store_o(int i, int d, float v) const {
        const int64_t off = (row0 + i) * kHeadDim + d;
        if (o_accum) o_accum[off] = v;
        else o[off] = from_float(v);
    }
    // m is the running max in the log2 domain, l the row sum; a row that saw no key in this
    // split (l == 0) reports -inf so the combine gives it zero weight.
    __device__ __forceinline__ void store_lse(int i, float m, float l) const {
        lse[row0 + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : neg_inf();
    }
};

__device__ __forceinline__ float inv_or_zero(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// ---------------------------------------------------------------------------------------------
// Each path is a struct with init / step / finish; the kernel body below owns the tiling loop,
// the loads and the barriers. A later path (MMA_MMA, wgmma) is one more struct and one more
// #elif.
#if MMA == MMA_SCALAR

// FA-1 baseline: a group of kT consecutive lanes owns one query row. Within the group, lane t
// scores keys t, t + kT, ... and owns output dim pairs t, t + kT, ...; the group never leaves
// its warp, so row reductions are shuffles and handing P over needs only __syncwarp.
struct ScalarPath {
    static constexpr int kT = kThreads / kBlockM;
    static_assert(kThreads % kBlockM == 0, "scalar: WARPS * 32 must be a multiple of BLOCK_M");
    static_assert(kT >= 1 && 32 % kT == 0, "scalar: a row's lanes (WARPS*32/BLOCK_M) must divide 32 (BLOCK_M % WARPS == 0)");
    static_assert(kBlockN % kT == 0, "scalar: BLOCK_N must split evenly over a row's lanes");
    static_assert(kHeadDim % (2 * kT) == 0, "scalar: HEAD_DIM must split into pairs over a row's lanes");
    static constexpr int kKeysPerLane = kBlockN / kT;
    static constexpr int kPairsPerLane = kHeadDim / (2 * kT);

    float acc[2 * kPairsPerLane];
    float m, l;
    int row, t;

    __device__ __forceinline__ void init(const Smem&) {
        row = threadIdx.x / kT;
        t = threadIdx.x % kT;
        m = neg_inf();
        l = 0.0f;
#pragma unroll
        for (int a = 0; a < 2 * kPairsPerLane; ++a) acc[a] = 0.0f;
    }

    __device__ __forceinline__ void step(const Smem& sm, const Ctx& ctx, int kv0) {
        const int i = ctx.q0 + row;
        const elem_t* q = sm.q + row * kLdQKV;
        float* s = sm.s + row * kLdS;

        // Scores go through smem rather than registers so BLOCK_N does not drive register use.
        float tile_max = neg_inf();
#pragma unroll 2
        for (int kk = 0; kk < kKeysPerLane; ++kk) {
            const int c = t + kk * kT;
            const elem_t* k = sm.k + c * kLdQKV;
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < kHeadDim; d += 8) {
                const uint4 qv = *reinterpret_cast<const uint4*>(q + d);
                const uint4 kv = *reinterpret_cast<const uint4*>(k + d);
                const elem2_t* q2 = reinterpret_cast<const elem2_t*>(&qv);
                const elem2_t* k2 = reinterpret_cast<const elem2_t*>(&kv);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 qf = to_float2(q2[e]);
                    const float2 kf = to_float2(k2[e]);
                    dot = fmaf(qf.x, kf.x, dot);
                    dot = fmaf(qf.y, kf.y, dot);
                }
            }
            const float x = key_masked(ctx, i, kv0 + c) ? neg_inf() : dot * ctx.scale_log2;
            s[c] = x;
            tile_max = fmaxf(tile_max, x);
        }
        const float m_new = fmaxf(m, group_max<kT>(tile_max));
        const float m_use = safe_max(m_new);
        const float alpha = exp2f(m - m_use);

        float sum = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < kKeysPerLane; ++kk) {
            const int c = t + kk * kT;
            const float p = exp2f(s[c] - m_use);
            s[c] = p;
            sum += p;
        }
        l = l * alpha + group_sum<kT>(sum);
        m = m_new;
        __syncwarp();  // P of the whole row, written by the group's lanes, is read below

#pragma unroll
        for (int a = 0; a < 2 * kPairsPerLane; ++a) acc[a] *= alpha;
#pragma unroll 4
        for (int c = 0; c < kBlockN; ++c) {
            const float p = s[c];
            const elem2_t* v = reinterpret_cast<const elem2_t*>(sm.v + c * kLdQKV);
#pragma unroll
            for (int e = 0; e < kPairsPerLane; ++e) {
                const float2 vf = to_float2(v[t + e * kT]);
                acc[2 * e] = fmaf(p, vf.x, acc[2 * e]);
                acc[2 * e + 1] = fmaf(p, vf.y, acc[2 * e + 1]);
            }
        }
    }

    __device__ __forceinline__ void finish(const Smem&, const Ctx& ctx, const Epilogue& epi) {
        const int i = ctx.q0 + row;
        if (i >= ctx.sq) return;
        const float inv_l = inv_or_zero(l);
#pragma unroll
        for (int e = 0; e < kPairsPerLane; ++e) {
            const int d = 2 * (t + e * kT);
            epi.store_o(i, d, acc[2 * e] * inv_l);
            epi.store_o(i, d + 1, acc[2 * e + 1] * inv_l);
        }
        if (t == 0) epi.store_lse(i, m, l);
    }
};
using Path = ScalarPath;

#elif MMA == MMA_WMMA

// Tensor cores through nvcuda::wmma 16x16x16: warp w owns query rows [16w, 16w + 16). S is
// staged through smem for the softmax (the fragment layout is opaque), with two lanes per row.
// O stays in accumulator fragments; to rescale it per row we need each element's row, which
// wmma does not expose, so init() loads a matrix whose entries are their own row index into an
// accumulator fragment: element e of any accumulator fragment then lies in row rowmap.x[e].
struct WmmaPath {
    static_assert(kBlockM == kWarps * 16, "wmma: each warp owns 16 query rows (BLOCK_M == WARPS * 16)");
    static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "wmma: tiles are multiples of 16");
    static_assert(kLdS >= 16, "wmma: the epilogue stages a 16x16 block in the score rows");
    static constexpr int kDFrags = kHeadDim / 16;
    static constexpr int kNFrags = kBlockN / 16;

    using AccFrag = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
    using AFrag = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, elem_t, nvcuda::wmma::row_major>;
    // K is [key][dim] in smem, which is K^T in column-major order: no transpose needed.
    using KtFrag = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, elem_t, nvcuda::wmma::col_major>;
    using VFrag = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, elem_t, nvcuda::wmma::row_major>;

    AccFrag o[kDFrags];
    AccFrag rowmap;
    float m, l;  // stats of row lane / 2, duplicated in both lanes of the row
    int warp, lane;

    __device__ __forceinline__ float* stage(const Smem& sm) const { return sm.s + warp * 16 * kLdS; }

    __device__ __forceinline__ void init(const Smem& sm) {
        warp = threadIdx.x / 32;
        lane = threadIdx.x % 32;
        m = neg_inf();
        l = 0.0f;
#pragma unroll
        for (int f = 0; f < kDFrags; ++f) nvcuda::wmma::fill_fragment(o[f], 0.0f);

        float* st = stage(sm);
        for (int e = lane; e < 256; e += 32) st[(e / 16) * kLdS + e % 16] = float(e / 16);
        __syncwarp();
        nvcuda::wmma::load_matrix_sync(rowmap, st, kLdS, nvcuda::wmma::mem_row_major);
        __syncwarp();  // step() overwrites the staging area
    }

    __device__ __forceinline__ void step(const Smem& sm, const Ctx& ctx, int kv0) {
        using namespace nvcuda;
        float* st = stage(sm);
        const elem_t* qw = sm.q + warp * 16 * kLdQKV;

        // S = Q K^T for this warp's 16 rows. The outer loops stay rolled: unrolled, ptxas hoists
        // every fragment load and bf16 / HEAD_DIM 128 ends up near 255 registers.
#pragma unroll 1
        for (int n = 0; n < kNFrags; ++n) {
            AccFrag sacc;
            wmma::fill_fragment(sacc, 0.0f);
#pragma unroll
            for (int kd = 0; kd < kDFrags; ++kd) {
                AFrag qa;
                KtFrag kb;
                wmma::load_matrix_sync(qa, qw + kd * 16, kLdQKV);
                wmma::load_matrix_sync(kb, sm.k + n * 16 * kLdQKV + kd * 16, kLdQKV);
                wmma::mma_sync(sacc, qa, kb, sacc);
            }
            wmma::store_matrix_sync(st + n * 16, sacc, kLdS, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax, two lanes per row, interleaved columns (adjacent lanes, adjacent words).
        const int r = lane / 2;
        const int h = lane % 2;
        const int i = ctx.q0 + warp * 16 + r;
        float* srow = st + r * kLdS;
        float tile_max = neg_inf();
#pragma unroll 4
        for (int c = h; c < kBlockN; c += 2) {
            const float x = key_masked(ctx, i, kv0 + c) ? neg_inf() : srow[c] * ctx.scale_log2;
            srow[c] = x;
            tile_max = fmaxf(tile_max, x);
        }
        const float m_new = fmaxf(m, group_max<2>(tile_max));
        const float m_use = safe_max(m_new);
        const float alpha = exp2f(m - m_use);

        elem_t* prow = sm.p + (warp * 16 + r) * kLdP;
        float sum = 0.0f;
#pragma unroll 4
        for (int c = h; c < kBlockN; c += 2) {
            const float p = exp2f(srow[c] - m_use);
            prow[c] = from_float(p);
            sum += p;
        }
        l = l * alpha + group_sum<2>(sum);
        m = m_new;
        if (h == 0) sm.row[warp * 16 + r] = alpha;
        __syncwarp();  // P and alpha of all 16 rows are read by every lane below

#pragma unroll
        for (int e = 0; e < rowmap.num_elements; ++e) {
            const float a = sm.row[warp * 16 + int(rowmap.x[e])];
#pragma unroll
            for (int f = 0; f < kDFrags; ++f) o[f].x[e] *= a;
        }

        // O += P V
        const elem_t* pw = sm.p + warp * 16 * kLdP;
#pragma unroll 1
        for (int kn = 0; kn < kNFrags; ++kn) {
            AFrag pa;
            wmma::load_matrix_sync(pa, pw + kn * 16, kLdP);
#pragma unroll
            for (int f = 0; f < kDFrags; ++f) {
                VFrag vb;
                wmma::load_matrix_sync(vb, sm.v + kn * 16 * kLdQKV + f * 16, kLdQKV);
                wmma::mma_sync(o[f], pa, vb, o[f]);
            }
        }
    }

    __device__ __forceinline__ void finish(const Smem& sm, const Ctx& ctx, const Epilogue& epi) {
        using namespace nvcuda;
        float* st = stage(sm);
        const int r = lane / 2;
        const int h = lane % 2;
        const int i = ctx.q0 + warp * 16 + r;
        // The previous step's readers of sm.row are this warp's own lanes: a warp barrier suffices.
        __syncwarp();
        const float inv_l = inv_or_zero(l);
        if (i < ctx.sq && h == 0) epi.store_lse(i, m, l);

        // Each 16x16 block of O goes through the staging area so every lane knows its
        // elements' (row, col); lane (r, h) then writes 8 consecutive dims of row r.
#pragma unroll
        for (int f = 0; f < kDFrags; ++f) {
            wmma::store_matrix_sync(st, o[f], kLdS, wmma::mem_row_major);
            __syncwarp();
            if (i < ctx.sq) {
#pragma unroll
                for (int e = 0; e < 8; ++e) epi.store_o(i, f * 16 + h * 8 + e, st[r * kLdS + h * 8 + e] * inv_l);
            }
            __syncwarp();
        }
    }
};
using Path = WmmaPath;

#else
#error "MMA_MMA (mma.sync m16n8k16 + ldmatrix): not implemented yet, later milestone"
#endif

// ---------------------------------------------------------------------------------------------
// minBlocks = 1 on purpose: with the bare thread bound, ptxas picked a 64-register target and
// spilled the scalar path; one CTA per SM is the honest floor, the tuner measures the rest.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
attn_fwd(const elem_t* __restrict__ Q, const elem_t* __restrict__ K, const elem_t* __restrict__ V,
         elem_t* __restrict__ O, float* __restrict__ LSE, float* __restrict__ O_accum,
         float* __restrict__ LSE_accum, int B, int H, int Sq, int Sk, float softmax_scale, int causal) {
    require_dynamic_smem(unsigned(kSmemBytes));
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const Smem sm = carve_smem(smem_raw);

    const int64_t bh = blockIdx.y;
    const int split = blockIdx.z;
    const int num_splits = gridDim.z;

    Ctx ctx;
    ctx.q0 = blockIdx.x * kBlockM;
    ctx.sq = Sq;
    ctx.sk = Sk;
    ctx.causal = causal != 0;
    ctx.scale_log2 = softmax_scale * kLog2e;

    // Keys the whole query block may see. Causal is top-left: the block's last row i sees
    // keys <= i, so KV blocks past it are fully masked and skipped here, not masked later.
    const int kv_len = ctx.causal ? min(Sk, min(Sq, ctx.q0 + kBlockM)) : Sk;
    const int n_blocks = (kv_len + kBlockN - 1) / kBlockN;
    // Balanced contiguous shares; a split may get none (then it writes LSE -inf and O 0
    // through the ordinary epilogue, since m = -inf and l = 0).
    const int blk_begin = int(int64_t(n_blocks) * split / num_splits);
    const int blk_end = int(int64_t(n_blocks) * (split + 1) / num_splits);

    const elem_t* Qh = Q + bh * Sq * kHeadDim;
    const elem_t* Kh = K + bh * Sk * kHeadDim;
    const elem_t* Vh = V + bh * Sk * kHeadDim;

    Epilogue epi;
    if (num_splits > 1) {
        epi.o = nullptr;
        epi.o_accum = O_accum;
        epi.lse = LSE_accum;
        epi.row0 = (int64_t(split) * B * H + bh) * Sq;
    } else {
        epi.o = O;
        epi.o_accum = nullptr;
        epi.lse = LSE;
        epi.row0 = bh * Sq;
    }

    load_tile<kBlockM>(sm.q, Qh, ctx.q0, Sq);
    Path path;
    path.init(sm);

    for (int blk = blk_begin; blk < blk_end; ++blk) {
        const int kv0 = blk * kBlockN;
        __syncthreads();  // previous tile fully consumed (and, on the first pass, Q visible)
        load_tile<kBlockN>(sm.k, Kh, kv0, Sk);
        load_tile<kBlockN>(sm.v, Vh, kv0, Sk);
        __syncthreads();
        path.step(sm, ctx, kv0);
    }
    path.finish(sm, ctx, epi);
}

// Merges the splits' partials of one query row (one warp): weights exp(LSE_s - LSE) with
// LSE = log sum_s exp(LSE_s). Empty splits carry LSE_s = -inf and get weight 0.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
attn_combine(const float* __restrict__ O_accum, const float* __restrict__ LSE_accum,
             elem_t* __restrict__ O, float* __restrict__ LSE, int B, int H, int Sq, int num_splits) {
    constexpr int kDimsPerLane = kHeadDim / 32;
    const int64_t rows = int64_t(B) * H * Sq;
    const int64_t row = int64_t(blockIdx.x) * COMBINE_ROWS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;

    float mx = neg_inf();
    for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, LSE_accum[s * rows + row]);
    mx = warp_max(mx);
    const float m_use = safe_max(mx);
    float sum = 0.0f;
    for (int s = lane; s < num_splits; s += 32) sum += expf(LSE_accum[s * rows + row] - m_use);
    sum = warp_sum(sum);
    const float lse = sum > 0.0f ? m_use + logf(sum) : neg_inf();

    float acc[kDimsPerLane];
#pragma unroll
    for (int e = 0; e < kDimsPerLane; ++e) acc[e] = 0.0f;
    if (sum > 0.0f) {
        for (int s = 0; s < num_splits; ++s) {
            const float w = expf(LSE_accum[s * rows + row] - lse);
            if (w == 0.0f) continue;  // empty split: its O_accum is 0, skip the read
            const float* src = O_accum + (s * rows + row) * kHeadDim;
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) acc[e] = fmaf(w, src[lane + 32 * e], acc[e]);
        }
    }
    elem_t* dst = O + row * kHeadDim;
#pragma unroll
    for (int e = 0; e < kDimsPerLane; ++e) dst[lane + 32 * e] = from_float(acc[e]);
    if (lane == 0) LSE[row] = lse;
}
