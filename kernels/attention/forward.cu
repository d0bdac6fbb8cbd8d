// The forward-attention family: one kernel source, specialised at compile time by the defines
// below into the variants the tuner explores (compute path, tile sizes, warps), plus the
// combine kernel that merges split-KV partial results by log-sum-exp.
//
// Launch contract (the Rust planner and worker rely on it):
//   attn_fwd:     grid (ceil(Sq / BLOCK_M), B * H, num_splits), block WARPS * 32,
//                 dynamic smem >= kSmemBytes (the kernel traps if it gets less). Formula:
//                 (BLOCK_M + 2 * STAGES * BLOCK_N) * (HEAD_DIM + if(HEAD_DIM == 96, 40, 8)) * ELEM_BYTES
//                 + if(MMA == "mma", 0, BLOCK_M * (BLOCK_N + 4) * 4)
//                 + if(MMA == "wmma", BLOCK_M * (BLOCK_N + 8) * ELEM_BYTES + BLOCK_M * 4, 0)
//                 and for MMA == "wgmma" (hopper.cuh; 1 KiB of 1024-byte alignment slack and the
//                 mbarriers, unpadded swizzled tiles of whole 64-element columns, so HEAD_DIM
//                 96 is held as 128): 1280 + (BLOCK_M + 2 * STAGES * BLOCK_N) * ((HEAD_DIM + 63) / 64 * 64) * ELEM_BYTES
//                 num_splits = gridDim.z is chosen by the host at run time; KV_SPLIT only names
//                 the variant (KV_SPLIT_AUTO = 0: the host picks a split per shape).
//                 TMA = 1 (wgmma with a producer warp group only; the space's tensor_maps):
//                 three more parameters after `causal`, the CUtensorMaps of Q, K and V by value,
//                 each 3-D (element, row, batch x head) over the [B * H, S, HEAD_DIM] buffer with
//                 boxes of 64 elements x BLOCK_M rows (Q) or BLOCK_N rows (K, V), 128-byte
//                 swizzle, zero fill out of bounds (the worker's TensorMapKey::encode; at
//                 HEAD_DIM 96 the second box's last 32 elements are out of bounds: zeros).
//                 CLUSTER_COMBINE = 1 (wgmma, every warp a consumer; the space's
//                 combine_in_forward): built with cluster dims (1, 1, KV_SPLIT), so gridDim.z
//                 must be KV_SPLIT (2..8); the splits of a query block merge through distributed
//                 shared memory and write O and LSE; O_accum and LSE_accum are not touched and
//                 no attn_combine follows.
//                 LAST_CTA_COMBINE = 1 (wgmma, every warp a consumer; the space's split_counters
//                 and combine_in_forward): one more parameter after `causal` (before any tensor
//                 maps), `unsigned* split_counters`, one word per (query block, batch x head),
//                 zero when first launched and never reset (the kernel counts modulo gridDim.z);
//                 with more than one split, the last split CTA of a query block to finish merges
//                 the block's partials from O_accum and LSE_accum and writes O and LSE; no
//                 attn_combine follows.
//                 PERSISTENT_CTAS = 1 (wgmma with a TMA producer warp group; the space's persistent):
//                 grid (min(tiles, ceil(resident CTAs / num_splits)), 1, num_splits), tiles =
//                 ceil(Sq / BLOCK_M) * B * H; CTA x of split z works tiles x, x + gridDim.x, ...
//                 of that split (persistent_work); the kernel traps on a gridDim.y other than 1.
//                 PERSISTENT_CTAS = 2: the same grid; CTA x of split z works tile x, then the tiles
//                 it draws from word z of `unsigned* split_counters` (the parameter after `causal`,
//                 as for LAST_CTA_COMBINE; the space's split_counters), zero when first launched
//                 and set back to zero by each launch's last draw.
//   attn_combine: grid (ceil(B * H * Sq / COMBINE_ROWS_PER_BLOCK)), block COMBINE_THREADS.
//
// Paths: MMA_SCALAR (fp32 FMAs, FA-1 style), MMA_WMMA (nvcuda::wmma, S/P through smem),
// MMA_MMA (mma.sync m16n8k16 + ldmatrix, S/P in registers, FA2 style; BLOCK_M may be WARPS*16,
// WARPS*32 or (WARPS*16)/k, see MmaPath). STAGES in 1..3 is the depth of the cp.async K/V
// pipeline every path shares. Query blocks run in reverse order (longest causal blocks first).
// MMA_WGMMA (sm_90a only: wgmma.mma_async from shared-memory descriptors, optional producer warp
// group with an mbarrier pipeline and setmaxnreg) brings its own kernel body: hopper.cuh.
#include <mma.h>

#include "common.cuh"

#define MMA_SCALAR 0
#define MMA_WMMA 1
#define MMA_MMA 2
#define MMA_WGMMA 3
// KV_SPLIT=KV_SPLIT_AUTO: the host chooses gridDim.z per shape (waves heuristic).
#define KV_SPLIT_AUTO 0

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined (64, 96, 128 or 256)"
#endif
#ifndef MMA
#error "MMA must be defined (MMA_SCALAR, MMA_WMMA, MMA_MMA or MMA_WGMMA)"
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

static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 256,
              "HEAD_DIM must be 64, 96, 128 or 256");
static_assert(kMma == MMA_SCALAR || kMma == MMA_WMMA || kMma == MMA_MMA || kMma == MMA_WGMMA,
              "MMA must be MMA_SCALAR, MMA_WMMA, MMA_MMA or MMA_WGMMA");
static_assert(kBlockM >= 16 && kBlockM % 16 == 0, "BLOCK_M must be a positive multiple of 16");
static_assert(kBlockN >= 16 && kBlockN % 16 == 0, "BLOCK_N must be a positive multiple of 16");
static_assert(kWarps >= 1 && kWarps <= 32, "WARPS must be in 1..32 (at most 1024 threads)");
// The split count is gridDim.z at run time (the host may pick it per shape without a rebuild);
// KV_SPLIT only names the variant, so it is checked but otherwise unused (0 = KV_SPLIT_AUTO).
static_assert(kKvSplit >= 0, "KV_SPLIT must be >= 1, or KV_SPLIT_AUTO (0)");
// Every path shares the cp.async K/V pipeline of the kernel body: STAGES tiles in smem. The wgmma
// path's producer form keeps up to STAGES tiles in flight, and its three consumer groups at d = 64
// hold a tile for three GEMM turns: up to 6 there (the mbarrier region holds 7 stages' barriers;
// hopper.cuh asserts that they and the tiles fit).
static_assert(kStages >= 1 && kStages <= (kMma == MMA_WGMMA ? 6 : 3), "STAGES must be 1, 2 or 3 (up to 6 on the wgmma path)");
static_assert(kHeadDim % 32 == 0, "combine: each lane owns HEAD_DIM / 32 output dims");
// The wgmma path's own switches (hopper.cuh says what each does), 0 when not defined: PINGPONG
// (two consumer warp groups take turns), TMA (loads by the producer warp group), TWO_CTAS (two
// CTAs per SM) and POLY_EXP (some exp2 on the FMA pipe).
#ifndef PINGPONG
#define PINGPONG 0
#endif
#ifndef TMA
#define TMA 0
#endif
#ifndef TWO_CTAS
#define TWO_CTAS 0
#endif
#ifndef POLY_EXP
#define POLY_EXP 0
#endif
#ifndef CLUSTER_COMBINE
#define CLUSTER_COMBINE 0
#endif
#ifndef LAST_CTA_COMBINE
#define LAST_CTA_COMBINE 0
#endif
#ifndef PERSISTENT_CTAS
#define PERSISTENT_CTAS 0
#endif
#ifndef EARLY_RESCALE
#define EARLY_RESCALE 0
#endif
#ifndef SEPARATE_KV
#define SEPARATE_KV 0
#endif
#ifndef SPLIT_REDUCTIONS
#define SPLIT_REDUCTIONS 0
#endif
#ifndef SMEM_EPILOGUE
#define SMEM_EPILOGUE 0
#endif
#ifndef HALF_KEY_TILES
#define HALF_KEY_TILES 0
#endif
#ifndef DESC_ADVANCE
#define DESC_ADVANCE 0
#endif
#ifndef GROUP_KEY_TILES
#define GROUP_KEY_TILES 0
#endif
#ifndef PEEL_MASKED
#define PEEL_MASKED 0
#endif
#ifndef LATE_REFILL
#define LATE_REFILL 0
#endif
// The order CTAs take (query block, head): 0, each head's blocks longest first, head after head;
// 1, FlashAttention-4's L2 sections (tile_order below). Every path.
#ifndef L2_SECTIONS
#define L2_SECTIONS 0
#endif
static_assert(L2_SECTIONS == 0 || L2_SECTIONS == 1, "L2_SECTIONS is 0 or 1");
static_assert((PINGPONG == 0 && TMA == 0 && TWO_CTAS == 0 && POLY_EXP == 0 && CLUSTER_COMBINE == 0 && LAST_CTA_COMBINE == 0 &&
               PERSISTENT_CTAS == 0 && EARLY_RESCALE == 0 && SEPARATE_KV == 0 &&
               SPLIT_REDUCTIONS == 0 && SMEM_EPILOGUE == 0 && HALF_KEY_TILES == 0 && DESC_ADVANCE == 0 && GROUP_KEY_TILES == 0 &&
               PEEL_MASKED == 0 && LATE_REFILL == 0) ||
                  kMma == MMA_WGMMA,
              "PINGPONG, TMA, TWO_CTAS, POLY_EXP, CLUSTER_COMBINE, LAST_CTA_COMBINE, PERSISTENT_CTAS, EARLY_RESCALE, "
              "SEPARATE_KV, SPLIT_REDUCTIONS, SMEM_EPILOGUE, HALF_KEY_TILES, DESC_ADVANCE, GROUP_KEY_TILES, PEEL_MASKED and LATE_REFILL = 1 exist "
              "on the wgmma path "
              "alone");

// ---------------------------------------------------------------------------------------------
// Shared-memory layout. Rows are padded so that consecutive rows start in different banks and
// every row start stays 16-byte aligned (vector loads) and every 16-row block 32-byte aligned
// (wmma load/store pointers must be 256-bit aligned).
// The Q/K/V pad makes the row pitch 16 bytes mod 128: 8 elements at HEAD_DIM 64, 128 and 256,
// 40 at HEAD_DIM 96 (192-byte rows). The spaces' smem formulas say the same.
constexpr int kPadQKV = ((16 - 2 * kHeadDim) % 128 + 128) % 128 / 2;
constexpr int kPadElems = 8;                  // 16 bytes
constexpr int kLdQKV = kHeadDim + kPadQKV;    // elements per Q/K/V smem row
constexpr int kLdS = kBlockN + 4;             // floats per score row (wmma float ldm % 4 == 0)
constexpr int kLdP = kBlockN + kPadElems;     // elements per probability row (wmma half ldm % 8 == 0)
constexpr bool kHasP = kMma == MMA_WMMA;      // scalar path multiplies fp32 P straight from S
constexpr bool kHasS = kMma != MMA_MMA;       // mma path keeps S and P in registers
// Padding by 16 bytes per row also makes ldmatrix conflict-free: 8 consecutive rows of a
// 16-byte column land in 8 distinct 16-byte bank groups because the row pitch is 16 mod 128.
static_assert((kLdQKV * 2) % 128 == 16, "Q/K/V row pitch must be 16 bytes mod 128 (ldmatrix banks)");

constexpr size_t kQBytes = size_t(kBlockM) * kLdQKV * sizeof(elem_t);
constexpr size_t kKVBytes = size_t(kStages) * kBlockN * kLdQKV * sizeof(elem_t);  // each of K, V
constexpr size_t kSBytes = kHasS ? size_t(kBlockM) * kLdS * sizeof(float) : 0;
constexpr size_t kPBytes = kHasP ? size_t(kBlockM) * kLdP * sizeof(elem_t) : 0;
constexpr size_t kRowBytes = kHasP ? size_t(kBlockM) * sizeof(float) : 0;
// Keep in sync with the formula in the header comment: the planner evaluates that one.
constexpr size_t kSmemBytes = kQBytes + 2 * kKVBytes + kSBytes + kPBytes + kRowBytes;

static_assert(kQBytes % 32 == 0 && kKVBytes % 32 == 0 && kSBytes % 32 == 0 && kPBytes % 32 == 0,
              "each smem region must start 32-byte aligned");
// The Hopper path has its own layout and formula (hopper.cuh); these padded tiles are not its.
static_assert(kMma == MMA_WGMMA || kSmemBytes <= 227 * 1024, "exceeds Hopper's 227 KB opt-in shared memory per block");

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

// Issues (does not wait for) the copy of rows [row0, row0 + ROWS) of a [n_rows, HEAD_DIM]
// matrix into padded smem: 16-byte cp.async per access, consecutive threads on consecutive
// 16-byte chunks of a row (coalesced). Rows past the end are zero-filled, not skipped: masked
// probabilities are 0, but 0 * (stale smem that happens to be NaN) would still be NaN.
template <int ROWS>
__device__ __forceinline__ void load_tile_async(elem_t* dst, const elem_t* __restrict__ src, int row0, int n_rows) {
    constexpr int kVecPerRow = kHeadDim / 8;
    if constexpr (kThreads % kVecPerRow != 0) {
        // HEAD_DIM 96: 12 chunks a row do not divide the threads, so each thread strides over the
        // tile's chunks instead of keeping one column.
        for (int idx = threadIdx.x; idx < ROWS * kVecPerRow; idx += kThreads) {
            const int r = idx / kVecPerRow, c = (idx % kVecPerRow) * 8;
            cp_async_16(dst + r * kLdQKV + c, src + int64_t(row0 + r) * kHeadDim + c, row0 + r < n_rows);
        }
        return;
    }
    constexpr int kRowsPerIter = kThreads / kVecPerRow;
    constexpr int kIters = (ROWS + kRowsPerIter - 1) / kRowsPerIter;
    const int r0 = threadIdx.x / kVecPerRow;
    const int c = (threadIdx.x % kVecPerRow) * 8;
    // One base address per thread; iterations add compile-time offsets. A row past the end
    // is copied with src-size 0: nothing is read (the address is never dereferenced, as in
    // CUTLASS's zfill copies) and the 16 smem bytes become zeros.
    const elem_t* g = src + int64_t(row0 + r0) * kHeadDim + c;
    elem_t* d = dst + r0 * kLdQKV + c;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int r = r0 + it * kRowsPerIter;
        if (ROWS % kRowsPerIter == 0 || r < ROWS)
            cp_async_16(d + it * kRowsPerIter * kLdQKV, g + it * kRowsPerIter * kHeadDim, row0 + r < n_rows);
    }
}

// What every path needs to know about the CTA's work.
struct Ctx {
    int q0;             // first query row of the block
    int sq, sk;
    int causal_offset;  // query i sees keys j <= i + causal_offset (common.cuh; Sk when unmasked)
    float scale_log2;   // softmax_scale * log2(e): scores go straight into exp2f
};

// Both tests are needed even unmasked: tails of K past Sk are zero-filled, not absent.
__device__ __forceinline__ bool key_masked(const Ctx& ctx, int i, int j) {
    return j >= ctx.sk || j > i + ctx.causal_offset;
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
    // Dims d, d + 1 (d even): one 4-byte (elem) or 8-byte (float) store.
    __device__ __forceinline__ void store_o2(int i, int d, float v0, float v1) const {
        const int64_t off = (row0 + i) * kHeadDim + d;
        if (o_accum) *reinterpret_cast<float2*>(o_accum + off) = make_float2(v0, v1);
        else *reinterpret_cast<uint32_t*>(o + off) = pack_elem2(v0, v1);
    }
    // m is the running max in the log2 domain, l the row sum; a row that saw no key in this
    // split (l == 0) reports -inf so the combine gives it zero weight.
    __device__ __forceinline__ void store_lse(int i, float m, float l) const {
        lse[row0 + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : neg_inf();
    }
};

__device__ __forceinline__ float inv_or_zero(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// What one CTA of attn_fwd works on, read from its block index: the launch contract, written once
// for every kernel body (this file's and hopper.cuh's).
struct CtaWork {
    Ctx ctx;
    int64_t bh;                // batch * head
    int split, num_splits;     // blockIdx.z of gridDim.z
    int blk_begin, blk_end;    // this split's K/V tiles (BLOCK_N keys each)
};

// Query block q_rev (counted from the last: see cta_work) of head bh, split `split` of num_splits.
__device__ __forceinline__ CtaWork tile_work(int q_rev, int64_t bh, int split, int num_splits, int Sq, int Sk,
                                             float softmax_scale, int causal) {
    CtaWork w;
    w.bh = bh;
    w.split = split;
    w.num_splits = num_splits;
    const int q_blocks = (Sq + kBlockM - 1) / kBlockM;
    w.ctx.q0 = (q_blocks - 1 - q_rev) * kBlockM;
    w.ctx.sq = Sq;
    w.ctx.sk = Sk;
    w.ctx.causal_offset = causal_offset(causal, Sq, Sk);
    w.ctx.scale_log2 = softmax_scale * kLog2e;

    // Keys the whole query block may see: its last row i sees keys <= i + causal_offset, so KV
    // blocks past that are fully masked and skipped here, not masked later. A block whose rows
    // all see no key (bottom-right, Sq > Sk) runs no KV block at all and its epilogue writes
    // O = 0, LSE = -inf (l = 0); a row with no key inside a running block ends the same way.
    const int last_row = min(Sq, w.ctx.q0 + kBlockM) - 1;
    const int kv_len = max(0, min(Sk, last_row + w.ctx.causal_offset + 1));
    const int n_blocks = (kv_len + kBlockN - 1) / kBlockN;
    // Balanced contiguous shares; a split may get none (then it writes LSE -inf and O 0
    // through the ordinary epilogue, since m = -inf and l = 0).
    w.blk_begin = int(int64_t(n_blocks) * w.split / w.num_splits);
    w.blk_end = int(int64_t(n_blocks) * (w.split + 1) / w.num_splits);
    return w;
}

// The CTAs start in the order of their linear index (blockIdx.x fastest); this maps the index to a
// query block (counted from the last) and a head. Query blocks run in reverse: under a causal mask
// the last blocks have the most keys, and starting the longest CTAs first shortens the tail of the
// last wave (LPT order).
//   L2_SECTIONS = 0: head after head, each head's blocks longest first. The last head's longest
//     block starts near the end of the grid: a greedy schedule of large-128-causal (132 SMs,
//     32 heads x 64 blocks; a model, scripts/tile-order-sim.py) ends 5.6% past the ideal.
//   L2_SECTIONS = 1 (FlashAttention-4's SingleTileLPTScheduler): heads in sections of as many as
//     the L2 holds K and V of (a power of two); inside a section every head's longest block
//     first, then every head's next: LPT over the section, its K and V still in L2 (0.1% past).
constexpr int64_t kL2Bytes = 50ll << 20;  // FlashAttention-4's L2 budget for K and V (H100, H200)
__device__ __forceinline__ void tile_order(int linear, int q_blocks, int heads, int Sk, int& q_rev, int& head) {
    if constexpr (L2_SECTIONS == 0) {
        q_rev = linear % q_blocks;
        head = linear / q_blocks;
    } else {
        const int64_t head_bytes = int64_t(Sk) * kHeadDim * 2 * int64_t(sizeof(elem_t));
        const int fit = int(min(kL2Bytes / max(head_bytes, int64_t(1)), int64_t(1) << 30));
        const int per_section = fit < 1 ? 1 : 1 << (31 - __clz(fit));
        const int section = linear / (per_section * q_blocks);
        const int in_section = linear - section * per_section * q_blocks;
        // The last section may hold fewer heads.
        const int section_heads = min(per_section, heads - section * per_section);
        q_rev = in_section / section_heads;
        head = section * per_section + in_section % section_heads;
    }
}

__device__ __forceinline__ CtaWork cta_work(int Sq, int Sk, float softmax_scale, int causal) {
    // Head after head is the grid itself: no division (two more registers made the mma.sync
    // path's 128 x 64 tile at d = 128 spill).
    int q_rev = blockIdx.x, head = blockIdx.y;
    if constexpr (L2_SECTIONS != 0) tile_order(blockIdx.x + gridDim.x * blockIdx.y, gridDim.x, gridDim.y, Sk, q_rev, head);
    return tile_work(q_rev, head, blockIdx.z, gridDim.z, Sq, Sk, softmax_scale, causal);
}

// PERSISTENT_CTAS = 1 (hopper.cuh): tile t of this CTA's split, of a grid of fewer CTAs than tiles,
// in the order the one-CTA-a-tile grid starts them.
// With tiles drawn from a counter (PERSISTENT_CTAS = 2) the shape passes through an empty volatile
// asm, which stays in the tile loop: what derives from it (the causal offset, the L2 section's size)
// is computed again each tile from the kernel parameters, not held across the loop, where the TMA
// producer of three consumer groups spilled it at its 32 registers with L2_SECTIONS.
__device__ __forceinline__ int per_tile(int x) {
    asm volatile("" : "+r"(x));
    return x;
}
__device__ __forceinline__ CtaWork persistent_work(int tile, int B, int H, int Sq, int Sk, float softmax_scale, int causal) {
    if constexpr (PERSISTENT_CTAS == 2) {
        Sq = per_tile(Sq);
        Sk = per_tile(Sk);
        causal = per_tile(causal);
    }
    int q_rev, head;
    tile_order(tile, (Sq + kBlockM - 1) / kBlockM, B * H, Sk, q_rev, head);
    return tile_work(q_rev, head, blockIdx.z, gridDim.z, Sq, Sk, softmax_scale, causal);
}

// O/LSE with one split, this split's float partials otherwise. Called after the main loop so that
// none of it is live (in registers) across it.
__device__ __forceinline__ Epilogue make_epilogue(elem_t* O, float* LSE, float* O_accum, float* LSE_accum, int B,
                                                  int H, int Sq, const CtaWork& w) {
    Epilogue epi;
    if (w.num_splits > 1) {
        epi.o = nullptr;
        epi.o_accum = O_accum;
        epi.lse = LSE_accum;
        epi.row0 = (int64_t(w.split) * B * H + w.bh) * Sq;
    } else {
        epi.o = O;
        epi.o_accum = nullptr;
        epi.lse = LSE;
        epi.row0 = w.bh * Sq;
    }
    return epi;
}

// ---------------------------------------------------------------------------------------------
// Each path is a struct with init / load_q / step / finish; the kernel body below owns the
// tiling loop, the cp.async K/V pipeline (shared by every path) and the barriers. A later path
// (wgmma) is one more struct and one more #elif.
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

    __device__ __forceinline__ void load_q(const Smem&) {}

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

    __device__ __forceinline__ void load_q(const Smem&) {}

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

#elif MMA == MMA_MMA

// ---- mma.sync m16n8k16 (fp32 accumulate) with ldmatrix operands ------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// D += A (16x16, row) * B (16x8, col); c holds the 16x8 fp32 accumulator fragment.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if DTYPE == DTYPE_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#endif
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// FA2-style: the CTA's warps form a kWarpsM x kWarpsN grid. A warp owns kMT row tiles of 16
// query rows (kMT > 1 when BLOCK_M > WARPS * 16) and a kKeysW-key slice of every K/V tile
// (kWarpsN > 1 when BLOCK_M < WARPS * 16: an intra-CTA KV split, merged in finish()).
// Fragment layouts (PTX ISA, m16n8k16): lane = 4 g + t. C/D: c0,c1 = (row g, cols 2t, 2t+1),
// c2,c3 = (row g + 8, same cols). A: a0 = (g, 2t..), a1 = (g + 8, 2t..), a2 = (g, 2t + 8..),
// a3 = (g + 8, 2t + 8..). B: b0 = (k 2t..2t+1, col g), b1 = (k 2t + 8.., col g).
// So the S accumulators of key tiles 2kk, 2kk + 1 are, packed in pairs, exactly the A operand
// of P for key step kk: P never leaves registers.
struct MmaPath {
    static constexpr int kMT = kBlockM > kWarps * 16 ? kBlockM / (kWarps * 16) : 1;
    static constexpr int kWarpsM = kBlockM / (16 * kMT);
    static constexpr int kWarpsN = kWarps / kWarpsM;
    static constexpr int kKeysW = kBlockN / kWarpsN;  // keys of a tile one warp handles
    // With two row tiles of HEAD_DIM 128 the O accumulators alone take 128 registers, and a
    // 64-key S beside them spilled (255 registers + 56 bytes). Skipping the O rescale when no
    // row max moved (kLazyRescale) shortens the live ranges enough to fit (255, no spill) and
    // measured fastest there (H200, 8k x 8k, D 128: 3246 us vs 3433 us for 32-key sub-slices).
    // Elsewhere the skip costs more than it saves (2k x 2k, D 64: 933 us vs 888 us), so it is
    // off. MMA_KEYS_SUB (optional -D, not a variant parameter) splits the warp's key slice into
    // sub-slices, one online-softmax update each, for experiments (32 fits without the skip).
    static constexpr bool kLazyRescale = kMT * kHeadDim >= 256;
#ifdef MMA_KEYS_SUB
    static constexpr int kKeysSub = MMA_KEYS_SUB;
#else
    static constexpr int kKeysSub = kKeysW;
#endif
    static constexpr int kNT = kKeysSub / 8;           // S n-tiles per row tile (per sub-slice)
    static constexpr int kDT = kHeadDim / 8;           // O n-tiles per row tile
    static constexpr int kKD = kHeadDim / 16;          // k-steps of Q K^T
    static constexpr int kKK = kKeysSub / 16;          // k-steps of P V
    // Q fragments stay in registers unless that would crowd out the O accumulators.
    static constexpr bool kQInRegs = kMT * kHeadDim <= 128;
    static_assert(kBlockM % 16 == 0 && kBlockM == kWarpsM * 16 * kMT, "mma: BLOCK_M must be WARPS*16*k or (WARPS*16)/k");
    static_assert(kMT == 1 || kBlockM == kWarps * 16 * kMT, "mma: BLOCK_M > WARPS*16 must be a multiple of WARPS*16");
    static_assert(kMT <= 2, "mma: at most 2 row tiles per warp (registers)");
    static_assert(kWarpsN >= 1 && kWarpsM * kWarpsN == kWarps, "mma: WARPS must be a multiple of BLOCK_M/16");
    static_assert(kBlockN % kWarpsN == 0 && kKeysW % 16 == 0, "mma: each warp's key slice must be a multiple of 16");
    static_assert(kKeysW % kKeysSub == 0 && kKeysSub % 16 == 0, "mma: key sub-slices tile the warp's slice");
    static_assert(kHeadDim % 16 == 0, "mma: HEAD_DIM must be a multiple of 16");
    // finish() merges the kWarpsN partial rows through the (by then idle) K/V region.
    static constexpr int kLdRed = kHeadDim + 8;  // floats; +8 keeps float2 stores conflict-free
    static constexpr size_t kRedBytes =
        kWarpsN > 1 ? size_t(kWarpsN) * kBlockM * 2 * sizeof(float) + size_t(kWarpsN - 1) * kBlockM * kLdRed * sizeof(float) : 0;
    static_assert(kRedBytes <= 2 * kKVBytes, "mma: the intra-CTA split merge must fit in the K/V stages");

    float o[kMT][kDT][4];
    float m[kMT][2];  // running max of raw scores, rows g and g + 8 (-inf: no key yet)
    float l[kMT][2];  // this lane's partial row sums (reduced over the quad in finish)
    uint32_t qf[kQInRegs ? kMT : 1][kQInRegs ? kKD : 1][4];
    int lane, wm, wn;
    unsigned q_addr, k_off, v_off;  // per-lane ldmatrix addresses / byte offsets

    __device__ __forceinline__ void init(const Smem& sm) {
        const int warp = threadIdx.x / 32;
        lane = threadIdx.x % 32;
        wm = warp % kWarpsM;
        wn = warp / kWarpsM;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) { m[mt][h] = neg_inf(); l[mt][h] = 0.0f; }
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
        }
        const int r8 = lane % 8;
        const int sel1 = (lane >> 3) & 1;
        const int sel2 = lane >> 4;
        // A (Q): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
        q_addr = smem_addr(sm.q + (wm * 16 * kMT + r8 + sel1 * 8) * kLdQKV + sel2 * 8);
        // B (K, non-trans): (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
        k_off = ((wn * kKeysW + r8 + sel2 * 8) * kLdQKV + sel1 * 8) * sizeof(elem_t);
        // B (V, trans): (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15).
        v_off = ((wn * kKeysW + r8 + sel1 * 8) * kLdQKV + sel2 * 8) * sizeof(elem_t);
    }

    __device__ __forceinline__ void load_qfrag(uint32_t (&a)[4], int mt, int kd) const {
        ldmatrix_x4(a, q_addr + (mt * 16 * kLdQKV + kd * 16) * sizeof(elem_t));
    }

    __device__ __forceinline__ void load_q(const Smem&) {
        if constexpr (kQInRegs) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int kd = 0; kd < kKD; ++kd) load_qfrag(qf[mt][kd], mt, kd);
        }
    }

    __device__ __forceinline__ void step(const Smem& sm, const Ctx& ctx, int kv0) {
        // Rolled on purpose: unrolled, ptxas hoists the next sub-slice's loads into this one's
        // softmax and the registers it saved come back. Every array index stays compile-time.
#pragma unroll 1
        for (int sub = 0; sub < kKeysW / kKeysSub; ++sub) step_keys(sm, ctx, kv0, sub * kKeysSub);
    }

    // One online-softmax update over keys [koff, koff + kKeysSub) of this warp's slice.
    __device__ __forceinline__ void step_keys(const Smem& sm, const Ctx& ctx, int kv0, int koff) {
        const unsigned k_base = smem_addr(sm.k) + k_off + koff * kLdQKV * unsigned(sizeof(elem_t));
        const unsigned v_base = smem_addr(sm.v) + v_off + koff * kLdQKV * unsigned(sizeof(elem_t));

        // S = Q K^T for this warp's rows and key slice.
        float s[kMT][kNT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < kKD; ++kd) {
            uint32_t a[kMT][4];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                if constexpr (kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kd][e];
                } else {
                    load_qfrag(a[mt], mt, kd);
                }
            }
#pragma unroll
            for (int np = 0; np < kNT / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, k_base + (np * 16 * kLdQKV + kd * 16) * sizeof(elem_t));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
                    mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }

        // Only tiles that cross the end of K or the causal diagonal need per-element masks: the
        // block's first row sees keys <= q0 + causal_offset, its later rows more (unmasked, the
        // offset is Sk and only the tail test can fire).
        const int g = lane / 4;
        const int t = lane % 4;
        const int key0 = kv0 + wn * kKeysW + koff;
        const int row_base = ctx.q0 + wm * 16 * kMT;
        const bool needs_mask = (kv0 + kBlockN > ctx.sk) || (kv0 + kBlockN - 1 > ctx.q0 + ctx.causal_offset);
        if (needs_mask) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int i = row_base + mt * 16 + g + (e / 2) * 8;
                        const int j = key0 + nt * 8 + 2 * t + (e % 2);
                        if (key_masked(ctx, i, j)) s[mt][nt][e] = neg_inf();
                    }
        }

        // Online softmax in registers: a row lives in the 4 lanes of a quad.
        float alphas[kMT][2];
        bool rescale = false;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = m[mt][h];
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // Scores stay raw; scale and log2(e) fold into one FFMA (softmax_scale > 0); the
                // max is scaled once, the same way everywhere (common.cuh, scaled_max).
                const float m_use = mx == neg_inf() ? 0.0f : scaled_max(mx, ctx.scale_log2);
                const float alpha = fast_exp2(scaled_max(m[mt][h], ctx.scale_log2) - m_use);
                m[mt][h] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        const float p = fast_exp2(fmaf(s[mt][nt][e], ctx.scale_log2, -m_use));
                        s[mt][nt][e] = p;
                        sum += p;
                    }
                l[mt][h] = l[mt][h] * alpha + sum;
                if constexpr (kLazyRescale) {
                    alphas[mt][h] = alpha;
                    rescale |= alpha != 1.0f;
                } else {
#pragma unroll
                    for (int dt = 0; dt < kDT; ++dt) {
                        o[mt][dt][2 * h] *= alpha;
                        o[mt][dt][2 * h + 1] *= alpha;
                    }
                }
            }
        }
        // Once the running maxima settle, most tiles leave every row's max unchanged
        // (alpha == 1 exactly): skip the kMT * HEAD_DIM / 2 multiplies then (warp-uniform branch).
        if constexpr (kLazyRescale) {
            if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int dt = 0; dt < kDT; ++dt) {
                            o[mt][dt][2 * h] *= alphas[mt][h];
                            o[mt][dt][2 * h + 1] *= alphas[mt][h];
                        }
            }
        }

        // O += P V, P straight from the S accumulators.
#pragma unroll
        for (int kk = 0; kk < kKK; ++kk) {
            uint32_t a[kMT][4];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                a[mt][0] = pack_elem2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack_elem2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack_elem2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack_elem2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < kDT / 2; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, v_base + (kk * 16 * kLdQKV + dp * 16) * sizeof(elem_t));
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    mma_16816(o[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_16816(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
    }

    __device__ __forceinline__ void finish(const Smem& sm, const Ctx& ctx, const Epilogue& epi) {
        const int g = lane / 4;
        const int t = lane % 4;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
                l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
            }

        if constexpr (kWarpsN > 1) {
            // Merge the kWarpsN key slices of each row: m* = max m_w, L = sum l_w 2^(m_w - m*),
            // O = sum O_w 2^(m_w - m*) / L. The kernel body drained cp.async and barriered.
            float* stats = reinterpret_cast<float*>(sm.k);          // [kWarpsN][BLOCK_M][2]
            float* red = stats + kWarpsN * kBlockM * 2;              // [kWarpsN - 1][BLOCK_M][kLdRed]
            const int rloc0 = wm * 16 * kMT;
            if (t == 0) {
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = rloc0 + mt * 16 + g + 8 * h;
                        stats[(wn * kBlockM + r) * 2] = m[mt][h] == neg_inf() ? neg_inf() : scaled_max(m[mt][h], ctx.scale_log2);
                        stats[(wn * kBlockM + r) * 2 + 1] = l[mt][h];
                    }
            }
            __syncthreads();
            float m_all[kMT][2], l_all[kMT][2];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = rloc0 + mt * 16 + g + 8 * h;
                    float mx = neg_inf();
#pragma unroll
                    for (int w = 0; w < kWarpsN; ++w) mx = fmaxf(mx, stats[(w * kBlockM + r) * 2]);
                    const float m_use = safe_max(mx);
                    float lsum = 0.0f;
#pragma unroll
                    for (int w = 0; w < kWarpsN; ++w)
                        lsum += stats[(w * kBlockM + r) * 2 + 1] * fast_exp2(stats[(w * kBlockM + r) * 2] - m_use);
                    const float mine = m[mt][h] == neg_inf() ? neg_inf() : scaled_max(m[mt][h], ctx.scale_log2);
                    const float f = fast_exp2(mine - m_use) * inv_or_zero(lsum);
#pragma unroll
                    for (int dt = 0; dt < kDT; ++dt) {
                        o[mt][dt][2 * h] *= f;
                        o[mt][dt][2 * h + 1] *= f;
                    }
                    m_all[mt][h] = mx;
                    l_all[mt][h] = lsum;
                }
            if (wn > 0) {
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float* dst = red + ((wn - 1) * kBlockM + rloc0 + mt * 16 + g + 8 * h) * kLdRed + 2 * t;
#pragma unroll
                        for (int dt = 0; dt < kDT; ++dt)
                            *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[mt][dt][2 * h], o[mt][dt][2 * h + 1]);
                    }
            }
            __syncthreads();
            if (wn != 0) return;  // no barrier follows
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = rloc0 + mt * 16 + g + 8 * h;
                    const int i = ctx.q0 + r;
                    if (i >= ctx.sq) continue;
#pragma unroll
                    for (int w = 1; w < kWarpsN; ++w) {
                        const float* src = red + ((w - 1) * kBlockM + r) * kLdRed + 2 * t;
#pragma unroll
                        for (int dt = 0; dt < kDT; ++dt) {
                            const float2 v = *reinterpret_cast<const float2*>(src + dt * 8);
                            o[mt][dt][2 * h] += v.x;
                            o[mt][dt][2 * h + 1] += v.y;
                        }
                    }
#pragma unroll
                    for (int dt = 0; dt < kDT; ++dt) epi.store_o2(i, dt * 8 + 2 * t, o[mt][dt][2 * h], o[mt][dt][2 * h + 1]);
                    if (t == 0) epi.store_lse(i, m_all[mt][h], l_all[mt][h]);
                }
        } else {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = ctx.q0 + wm * 16 * kMT + mt * 16 + g + 8 * h;
                    if (i >= ctx.sq) continue;
                    const float inv_l = inv_or_zero(l[mt][h]);
#pragma unroll
                    for (int dt = 0; dt < kDT; ++dt)
                        epi.store_o2(i, dt * 8 + 2 * t, o[mt][dt][2 * h] * inv_l, o[mt][dt][2 * h + 1] * inv_l);
                    if (t == 0) epi.store_lse(i, m[mt][h] == neg_inf() ? neg_inf() : scaled_max(m[mt][h], ctx.scale_log2), l[mt][h]);
                }
        }
    }
};
using Path = MmaPath;

#elif MMA == MMA_WGMMA
// sm_90a: wgmma + warp specialisation, with its own kernel body (hopper.cuh).
#include "hopper.cuh"
#else
#error "unknown MMA path"
#endif

#if MMA != MMA_WGMMA

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

    const CtaWork work = cta_work(Sq, Sk, softmax_scale, causal);
    const Ctx& ctx = work.ctx;
    const int64_t bh = work.bh;
    const int blk_begin = work.blk_begin;
    const int blk_end = work.blk_end;

    const elem_t* Qh = Q + bh * Sq * kHeadDim;
    const elem_t* Kh = K + bh * Sk * kHeadDim;
    const elem_t* Vh = V + bh * Sk * kHeadDim;

    // cp.async pipeline over this split's K/V tiles, STAGES buffers deep. Q rides in the first
    // group. Every thread commits exactly one group per prologue slot and per iteration (empty
    // ones included), so wait_group<STAGES - 2> at iteration `it` means tile `it` has landed.
    const int n_it = blk_end - blk_begin;
    auto load_kv = [&](int stage, int blk) {
        load_tile_async<kBlockN>(sm.k + stage * kBlockN * kLdQKV, Kh, blk * kBlockN, Sk);
        load_tile_async<kBlockN>(sm.v + stage * kBlockN * kLdQKV, Vh, blk * kBlockN, Sk);
    };
    load_tile_async<kBlockM>(sm.q, Qh, ctx.q0, Sq);
    if constexpr (kStages > 1) {
#pragma unroll
        for (int st = 0; st < kStages - 1; ++st) {
            if (st < n_it) load_kv(st, blk_begin + st);
            cp_async_commit();
        }
    }
    Path path;
    path.init(sm);

    for (int it = 0; it < n_it; ++it) {
        const int blk = blk_begin + it;
        int stage = 0;
        if constexpr (kStages == 1) {
            if (it > 0) __syncthreads();  // previous tile fully consumed
            load_kv(0, blk);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
        } else {
            cp_async_wait<kStages - 2>();
            // Tile `it` visible to all; every warp is done with tile it - 1, whose stage
            // ((it - 1) % STAGES == (it + STAGES - 1) % STAGES) is refilled next.
            __syncthreads();
            const int nxt = it + kStages - 1;
            if (nxt < n_it) load_kv(nxt % kStages, blk_begin + nxt);
            cp_async_commit();
            stage = it % kStages;
        }
        if (it == 0) path.load_q(sm);
        Smem cur = sm;
        cur.k = sm.k + stage * kBlockN * kLdQKV;
        cur.v = sm.v + stage * kBlockN * kLdQKV;
        path.step(cur, ctx, blk * kBlockN);
    }
    // Drain (only empty groups can remain) and make the K/V region reusable by finish().
    cp_async_wait<0>();
    __syncthreads();
    path.finish(sm, ctx, make_epilogue(O, LSE, O_accum, LSE_accum, B, H, Sq, work));
}
#endif  // MMA != MMA_WGMMA

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
