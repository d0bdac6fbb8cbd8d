// The Hopper path (MMA == MMA_WGMMA, sm_90a only), included by forward.cu in place of its kernel
// body: same launch contract (grid, O/LSE, split-KV partials for attn_combine, masks, tails), its
// own smem layout and main loop.
//
//   * wgmma.mma_async m64nNk16: each consumer warp group (128 threads) owns 64 query rows, so
//     BLOCK_M = 64 * consumer warp groups. S = Q K^T reads Q and K from shared memory through
//     matrix descriptors; O += P V takes P from registers (the S accumulators, repacked) and V
//     from shared memory, read MN-major (transposed) by the instruction itself.
//   * Q, K and V sit in shared memory in the 128-byte-swizzle layout wgmma reads without bank
//     conflicts: 8-row x 128-byte atoms (64 elements of a row), 16-byte chunk c of row r stored
//     at chunk c ^ (r % 8); a HEAD_DIM of 128 is two atom columns one after the other. K and V
//     share the layout; only the descriptor differs (K-major for K, MN-major for V).
//   * Copies are cp.async (16 bytes a thread) or, with TMA = 1 and a producer warp group, TMA:
//     one producer thread issues cp.async.bulk.tensor loads of whole [rows x 64-element] boxes,
//     which the copy engine writes already swizzled and signals on the stage's mbarrier with their
//     byte count (mbarrier.expect_tx / complete_tx). The tensor maps (CUtensorMap) are encoded on
//     the host by the worker, one per Q, K and V buffer, and passed after the usual arguments as
//     __grid_constant__ parameters (the launch contract in forward.cu). cp.async writes through the
//     generic proxy and wgmma reads through the async proxy, so a fence (fence.proxy.async) stands
//     between them: the writer's, before the __syncthreads that publishes a stage, or, with a
//     producer that does not wait for its copies, the reader's, after the mbarrier wait that tells
//     it the stage has landed. TMA writes through the async proxy itself: no fence.
//   * WARPS = 4 * (BLOCK_M / 64) runs every warp as a consumer with a __syncthreads pipeline
//     (STAGES deep, like the other paths), or with TMA = 1 thread 0 issuing whole-tile loads
//     STAGES ahead on mbarriers. WARPS = 4 * (BLOCK_M / 64 + 1) adds a producer warp
//     group (warp specialisation): it issues the copies of up to STAGES tiles ahead, each tile's
//     "full" mbarrier completing by itself once that tile has landed (cp.async.mbarrier.arrive),
//     and waits for the consumers to free a stage ("empty"); setmaxnreg moves its registers to
//     the consumers, and each consumer issues the S of tile j + 1 beside the P V product of tile j
//     (FlashAttention-3's intra-warpgroup pipelining; in some builds ptxas waits for that P V
//     before the softmax's exponentials: Consumer::softmax).
//   * PINGPONG = 1 (two or three consumer warp groups and a producer): the consumers take turns
//     on the tensor cores (FlashAttention-3's ping-pong; FlashAttention-4's round robin of three
//     at d = 64): a group issues its GEMMs only after the one before it has issued its own, so one
//     group's softmax runs while the others' GEMMs do. A named barrier per group hands the turn on.
//   * TWO_CTAS = 1 builds the producer form for two CTAs per SM; POLY_EXP = 1 (2, 3) computes one
//     exp2 in four (eight, sixteen) with a polynomial on the FMA pipe (one in four measured slower
//     on an H100: polyexp-ab);
//     CLUSTER_COMBINE = 1 merges the KV splits inside a thread-block cluster, LAST_CTA_COMBINE = 1
//     in the split that finishes last (no combine kernel either way).
//   * PERSISTENT_CTAS = 1 (TMA producer form): a CTA per resident slot walks many tiles, the
//     producer loading the next tile while the consumers finish this one; 2, the tiles after a
//     CTA's first drawn from a counter as CTAs free up.
//   * SEPARATE_KV = 1 (producer form): K and V of a stage each have their own full and empty
//     mbarriers (FlashAttention-3's two pipelines), and the producer loads K_{j+1} before V_j. A
//     K tile is free once its S has been waited for, not once the P V after it has: with the
//     intra-warpgroup overlap (S_{j+1} issued beside P_j V_j), one barrier for both makes the next
//     K load start only when the consumers already want it, whatever STAGES is.
//   * SPLIT_REDUCTIONS = 1: a row's max and sum over the tile run in four independent chains,
//     joined at the end (FlashAttention-4's fmax_reduce / fadd_reduce), not one chain of BLOCK_N / 4
//     dependent FMNMX or FADD: the same instructions, a quarter of the latency between S landing
//     and its exponentials, and between the exponentials and P V.
//   * EARLY_RESCALE = 1 (producer form): O is rescaled by the last softmax's factors while the
//     next S = Q K^T runs on the tensor cores, just before O += P V is issued, not between the
//     P V wait and the next tile's GEMMs (FlashAttention-4's rescale_O_before_gemm, its d = 256 form).
//   * SMEM_EPILOGUE = 1: each consumer warp group writes its normalised O rows into its own rows of
//     the Q tile (free once its last S has been waited for), then stores them with whole 16-byte
//     chunks, a warp's stores covering contiguous rows: not 4-byte stores of two columns of eight
//     rows a warp instruction (FlashAttention-4 stages O in Q's shared memory too, for a TMA store).
//   * HALF_KEY_TILES = 1 (all-consumer form): a K/V tile whose second half no row of a consumer
//     group sees (every other 128-key tile on the causal diagonal of 64-row groups, or the end of
//     Sk) runs its first half alone: S, the softmax and P V on BLOCK_N / 2 keys.
//   * DESC_ADVANCE = 1: a GEMM's k-step descriptors are its tile's first one plus a compile-time
//     offset (sw128_desc_advance, one add each), not each rebuilt from its address (about six
//     instructions, the mask, shift and fields, between every two wgmma while a group holds its turn).
//   * DESC_ADVANCE = 2: the same adds as 64-bit ones, from descriptors built once
//     (StageDescs): a stage's tile is stage 0's plus whole tiles. ptxas, knowing the tiles' 1024-byte
//     alignment, turned DESC_ADVANCE = 1's adds into ORs of the low word and rebuilt the constant
//     high word beside each (a UMOV per descriptor per wgmma: 35 in the d = 128 champion's loop
//     against FlashAttention-4's 9, whose cubin keeps one 64-bit add per descriptor).
//   * PEEL_MASKED = 1 (producer form, or all-consumer with TMA): the tiles no row of a consumer
//     group masks run in a loop of their own, without the mask's branch (and with the row max's
//     -inf check a select), before the loop of those it may mask (FlashAttention-3 and -4 split
//     their loops so too). With the branch in the producer form's loop, ptxas put the wait for
//     P_j V_j at the join right after it, before the row maxima of S_{j+1}; without it, after the
//     first row's maximum (FlashAttention-4's cubin waits after both, the scaling FFMAs and the
//     first exponentials).
//   * LATE_REFILL = 1 (all-consumer form with TMA): the stage a tile frees is refilled by thread 0
//     after the next tile's S is issued, under that GEMM, not before it.
//   * GROUP_KEY_TILES = 1 (producer form): each consumer group computes only the K/V tiles some
//     of its rows see, a prefix of the CTA's, and for the rest only passes its ping-pong turn and
//     frees the stage. On the causal diagonal a 192-row block's first group sees up to two 128-key
//     tiles fewer than its last (10% of large-64-causal's group tiles); a last block's groups past
//     Sq see none (large-64's last third group). Measured (group-key-tiles, 2026-11-30): the
//     three-group tile 388.5 -> 363.5 us on large-64-causal, 577.4 -> 571.4 on large-64 (f16); the
//     two-group d = 128 one no faster (its skipped tiles ran in the other group's shadow).
//   * HEAD_DIM 64, 96 (held as 128 in shared memory, see kHeadDimSmem), 128 and 256.
//   * First run on an H100 on 2026-11-23 (docs/measurements/2026-11-23-h100/hopper-first-run):
//     the all-consumer form passed every check on every shape; the producer form hung (fixed
//     below). With the producer's copies in flight and ping-pong: 324 of 324 cases correct
//     (hopper-async-producer-pingpong). The layout and descriptors are also checked on the host
//     (tests/fixtures/wgmma_layout.cu).
#pragma once

#include "sw128.cuh"
#include "wgmma_ops.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "MMA_WGMMA needs sm_90a (wgmma, setmaxnreg): -gencode arch=compute_90a,code=sm_90a"
#endif

namespace hopper {

constexpr int kConsumerWGs = kBlockM / 64;
constexpr int kWarpGroups = kWarps / 4;
constexpr bool kProducer = kWarpGroups == kConsumerWGs + 1;
constexpr int kConsumerThreads = kConsumerWGs * 128;
static_assert(kBlockM % 64 == 0 && kConsumerWGs >= 1 && kConsumerWGs <= 3,
              "wgmma: BLOCK_M must be 64, 128 or 192 (64 query rows per consumer warp group)");
static_assert(kWarps % 4 == 0 && (kWarpGroups == kConsumerWGs || kProducer),
              "wgmma: WARPS must be 4 * (BLOCK_M / 64), or that plus 4 for a producer warp group");
// 80: FlashAttention-3's key tile at HEAD_DIM 256, where two stages of 96 or more keys overflow
// shared memory and 64 keys leave S = Q K^T bound by its shared-memory reads (A and B per k-step).
static_assert(kBlockN == 64 || kBlockN == 80 || kBlockN == 96 || kBlockN == 128 || kBlockN == 192 || kBlockN == 256,
              "wgmma: BLOCK_N must be a wgmma N this file instantiates (64, 80, 96, 128, 192, 256)");
static_assert(kBlockN % 16 == 0 && kBlockN % 8 == 0, "wgmma: BLOCK_N is walked in 16-key steps");
// The head dim as held in shared memory: whole 64-element (128-byte) swizzle columns. HEAD_DIM 96
// is held as 128 whose last 32 columns are zeros (TMA's out-of-bounds fill, cp.async's src-size
// 0): Q K^T stops at 96 (six k-steps), O += P V runs N = 128 and the O columns past 96, P x 0,
// are never stored. That costs a third more P V work than an exact 96 (a sixth of the GEMMs) and
// keeps one swizzle mode, one descriptor family and one loader for every head dim.
constexpr int kHeadDimSmem = (kHeadDim + 63) / 64 * 64;
static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 256, "wgmma: HEAD_DIM must be 64, 96, 128 or 256");
static_assert(kStages >= 2, "wgmma: STAGES must be at least 2");
constexpr bool kPingPong = PINGPONG != 0;
static_assert(PINGPONG == 0 || PINGPONG == 1, "wgmma: PINGPONG is 0 or 1");
// Three groups: at d = 64 a group's softmax (64 x BLOCK_N exp2 on the MUFU) takes as long as its
// GEMMs, so with two groups it cannot hide behind the other's GEMMs; with three it has two turns.
static_assert(!kPingPong || (kProducer && (kConsumerWGs == 2 || kConsumerWGs == 3)),
              "wgmma: PINGPONG takes turns between two or three consumer warp groups beside a producer "
              "(BLOCK_M = 128, WARPS = 12 or BLOCK_M = 192, WARPS = 16)");
constexpr bool kTma = TMA != 0;
static_assert(TMA == 0 || TMA == 1, "wgmma: TMA is 0 or 1");
// TMA without a producer warp group: the all-consumer form's thread 0 issues the loads. Not with the
// split merges of that form (CLUSTER_COMBINE, LAST_CTA_COMBINE), whose epilogues reuse the stages.
static_assert(!kTma || kProducer || (CLUSTER_COMBINE == 0 && LAST_CTA_COMBINE == 0),
              "wgmma: TMA in the all-consumer form (WARPS = BLOCK_M / 16) is without CLUSTER_COMBINE and LAST_CTA_COMBINE");
// A TMA box is at most 256 rows, and its 128-byte inner extent is one swizzle atom column.
static_assert(!kTma || (kBlockM <= 256 && kBlockN <= 256), "wgmma: a TMA box holds at most 256 rows");

// POLY_EXP = 1: one exponential in four is computed on the FMA pipe by a polynomial instead of
// on the MUFU unit (FlashAttention-4's trick). At d = 64 a consumer warp group's MUFU time per
// tile (64 x BLOCK_N exp2 at 16 a clock per SM) equals its GEMM time, so MUFU, not the tensor
// cores, may set the pace; at d = 128 the GEMMs take twice as long and it does not matter.
// Measured on an H100 (docs/measurements/2026-11-23-h100/polyexp-ab): 4-13% slower on the d = 64
// champions.
// POLY_EXP = 2 and 3: one in eight and one in sixteen, to balance the MUFU (8 clocks a warp
// instruction) against the issue slots a polynomial takes (about 10). Measured on an H200
// (docs/measurements/2026-11-29-h200-kernels/polyexp): every share slower on every d = 64
// champion, the more so the larger the share (one in eight 2.5-7.5%, one in sixteen 0.2-2.2%).
// So the d = 64 softmax is not bound by the MUFU. A warp that rescaled O only when a row's max
// grew by 2^8 (FlashAttention-4's conditional rescaling; lazy-rescale there) was slower on every
// champion's own shape (up to 7.6%) and failed the bf16 check by 3.1e-2 against 3.0e-2: it is not
// in this file.
static_assert(POLY_EXP >= 0 && POLY_EXP <= 3, "wgmma: POLY_EXP is 0 (off) or 1..3 (one exp2 in 2^(POLY_EXP + 1))");
constexpr int kPolyEvery = POLY_EXP == 0 ? 0 : 2 << POLY_EXP;  // n-tiles (8 keys) per polynomial one
static_assert(kPolyEvery <= kBlockN / 8, "wgmma: POLY_EXP's share is at least one 8-key n-tile of BLOCK_N");

// EARLY_RESCALE = 1: at HEAD_DIM 256 a thread's O is 128 registers, so its rescale is 128 FMULs a
// tile; issued after S_{j+1} (asynchronous) and before P_j V_j, they run beside the S GEMM instead
// of holding back the issue of the next GEMMs. The intra-warpgroup loop is the producer form's.
static_assert(EARLY_RESCALE == 0 || EARLY_RESCALE == 1, "wgmma: EARLY_RESCALE is 0 or 1");
constexpr bool kEarlyRescale = EARLY_RESCALE != 0;
static_assert(SPLIT_REDUCTIONS == 0 || SPLIT_REDUCTIONS == 1, "wgmma: SPLIT_REDUCTIONS is 0 or 1");
// Independent chains a row's max and sum run in; each takes whole 8-key n-tiles (at BLOCK_N = 80,
// ten n-tiles: chains of three and two).
constexpr int kReduceChains = SPLIT_REDUCTIONS ? 4 : 1;

// TWO_CTAS = 1: built for two CTAs per SM (__launch_bounds__ minBlocks = 2), so that a CTA with
// one consumer warp group shares its SM with another CTA whose GEMMs and softmax interleave with
// its own (what ping-pong does inside one CTA), at half the registers each.
static_assert(TWO_CTAS == 0 || TWO_CTAS == 1, "wgmma: TWO_CTAS is 0 or 1");
constexpr int kCtasPerSm = TWO_CTAS ? 2 : 1;

// CLUSTER_COMBINE = 1: the KV_SPLIT CTAs of one query block form a thread-block cluster (1, 1,
// KV_SPLIT) and merge their partials through distributed shared memory (cluster_combine below),
// so a split launch is one kernel, not a forward and a combine with a launch gap between them:
// what decode, a handful of query rows against a long KV cache, spends its last microseconds on.
static_assert(CLUSTER_COMBINE == 0 || CLUSTER_COMBINE == 1, "wgmma: CLUSTER_COMBINE is 0 or 1");
constexpr bool kClusterCombine = CLUSTER_COMBINE != 0;
static_assert(!kClusterCombine || (kKvSplit >= 2 && kKvSplit <= 8),
              "wgmma: CLUSTER_COMBINE needs a fixed KV_SPLIT of 2..8 (a portable cluster size)");
// The producer form's copy warps leave early; a cluster barrier wants every thread of the cluster.
static_assert(!kClusterCombine || !kProducer, "wgmma: CLUSTER_COMBINE is for the all-consumer form (WARPS = BLOCK_M / 16)");

// LAST_CTA_COMBINE = 1: every split writes its partials to O_accum / LSE_accum as for attn_combine,
// then counts itself on its query block's word of split_counters; the split that counts last
// merges the block (last_cta_combine below). One kernel, any split count (the worker's "auto"
// too), no cluster to place; the price is the partials' round trip through L2.
static_assert(LAST_CTA_COMBINE == 0 || LAST_CTA_COMBINE == 1, "wgmma: LAST_CTA_COMBINE is 0 or 1");
constexpr bool kLastCtaCombine = LAST_CTA_COMBINE != 0;
static_assert(!kLastCtaCombine || !kProducer, "wgmma: LAST_CTA_COMBINE is for the all-consumer form (WARPS = BLOCK_M / 16)");
static_assert(!(kLastCtaCombine && kClusterCombine), "wgmma: one way to merge the splits");
// Its weight table (a float per split and row) over the K/V stages: 128 splits, the most the
// worker's "auto" picks, of every row of the block.
constexpr int kMaxMergedSplits = 128;
static_assert(!kLastCtaCombine || kMaxMergedSplits * kBlockM * 4 <= 2 * kStages * kBlockN * kHeadDimSmem * 2,
              "wgmma: LAST_CTA_COMBINE's weights fit the K/V stages");
static_assert(!kLastCtaCombine || kKvSplit <= kMaxMergedSplits, "wgmma: LAST_CTA_COMBINE merges at most 128 splits");

// PERSISTENT_CTAS = 1: a grid of as many CTAs as the SMs hold (LaunchShape::forward_grid), each walking
// tiles blockIdx.x, blockIdx.x + gridDim.x, ... of its split (persistent_work, in the one-CTA-a-tile
// grid's order). The producer runs on into the next tile's Q and K/V while the consumers finish
// this one, so a CTA's start (launch, barrier setup, the first tiles' latency) and its end (the
// last P V product, the epilogue) overlap with work instead of leaving the SM idle once a tile.
// PERSISTENT_CTAS = 2: the same, but a CTA's tiles after its first (blockIdx.x) come from a counter,
// word 0 of split_counters (one split: the kernel traps on a gridDim.z other than 1), in the one-CTA-a-tile grid's order, so a CTA that drew short
// causal tiles takes more of them (FlashAttention-3's dynamic scheduler). A static schedule of the
// causal tiles in the L2 order leaves the last CTA 16% past the ideal, head after head 8% (a model,
// scripts/tile-order-sim.py); handing them out as CTAs free up, 0.2%.
static_assert(PERSISTENT_CTAS >= 0 && PERSISTENT_CTAS <= 2, "wgmma: PERSISTENT_CTAS is 0, 1 or 2");
constexpr bool kPersistent = PERSISTENT_CTAS != 0;
constexpr bool kDynamicTiles = PERSISTENT_CTAS == 2;
// TMA: a cp.async producer's tile loop (128 threads' addresses) spills at the 40 registers it may keep.
static_assert(!kPersistent || (kProducer && kTma),
              "wgmma: PERSISTENT_CTAS is for the TMA producer form (WARPS = 4 * (BLOCK_M / 64 + 1), TMA = 1)");

// setmaxnreg: the producer keeps what a copy loop needs, the consumers take the rest. The CTA's
// registers are what ptxas gives the kernel under __launch_bounds__(threads, CTAs per SM), the
// register file over the SM's threads in steps of 8 (the -Xptxas -v line of every build shows it),
// times its threads. An increase that the pool cannot cover never returns, so the split spends at
// most that:
//   two consumer groups, one CTA: 168 x 384 = 128 x 504, split 40 + 2 x 232 for cp.async
//     (FlashAttention-3's 24 + 2 x 240 spilled 8 bytes in the producer once it stopped waiting for
//     its own copies: cp.async.mbarrier.arrive needs more than 24) and 24 + 2 x 240 for TMA, where
//     one thread issues a handful of bulk copies (40 + 2 x 232 with PERSISTENT_CTAS, whose thread
//     walks the tiles too);
//   three, one CTA: 128 x 512, split 32 + 3 x 160 (24 + 3 x 160 with TMA: 3 x 168 would need 528;
//     32 + 3 x 160 with PERSISTENT_CTAS);
//   one, two CTAs: 128 x 256, split 40 + 216, or 24 + 232 with TMA (40 + 216 with PERSISTENT_CTAS);
//   one, one CTA: ptxas gives 255 already; no split.
constexpr int kLaunchRegs = 65536 / (kThreads * kCtasPerSm) / 8 * 8;
// PERSISTENT_CTAS's TMA thread also walks the tiles: 40 (it spilled at 24 and 32 under -lineinfo);
// beside three consumer groups 32, since 40 leaves them 152 and they spill.
constexpr int kProducerRegs = kTma && !kPersistent ? 24 : (kConsumerWGs == 3 ? 32 : 40);
// What the pool leaves each consumer group, in steps of 8, up to FlashAttention-3's 240.
constexpr int kConsumerRegsLeft = (kLaunchRegs * kWarpGroups - kProducerRegs) / kConsumerWGs / 8 * 8;
constexpr int kConsumerRegs = kConsumerRegsLeft < 240 ? kConsumerRegsLeft : 240;
constexpr bool kSplitRegs = kProducer && kLaunchRegs < kConsumerRegs;
static_assert(!kSplitRegs || 128 * (kProducerRegs + kConsumerWGs * kConsumerRegs) <= kLaunchRegs * kThreads,
              "wgmma: the register split exceeds the CTA's registers (setmaxnreg.inc would wait forever)");
static_assert(kCtasPerSm == 1 || kProducer, "wgmma: TWO_CTAS is for the producer form (its consumers get registers by setmaxnreg)");
static_assert(!kEarlyRescale || kProducer, "wgmma: EARLY_RESCALE is for the producer form (WARPS = 4 * (BLOCK_M / 64 + 1))");
static_assert(SMEM_EPILOGUE == 0 || SMEM_EPILOGUE == 1, "wgmma: SMEM_EPILOGUE is 0 or 1");
constexpr bool kSmemEpilogue = SMEM_EPILOGUE != 0;
// Its rows of Q are free at the end of a tile only where no next tile's Q is loaded into them
// (PERSISTENT_CTAS) and no split merge reuses shared memory after it.
static_assert(!kSmemEpilogue || (!kPersistent && !kClusterCombine && !kLastCtaCombine),
              "wgmma: SMEM_EPILOGUE is without PERSISTENT_CTAS, CLUSTER_COMBINE and LAST_CTA_COMBINE");
// HALF_KEY_TILES = 1 (all-consumer form): on the causal diagonal of a 64-row group and a 128-key
// tile, every other tile's second half is masked for every row; it then runs as a 64-key tile
// (16 of the 272 tiles of a large-64-causal head). Its half is a wgmma N this file instantiates.
static_assert(HALF_KEY_TILES == 0 || HALF_KEY_TILES == 1, "wgmma: HALF_KEY_TILES is 0 or 1");
constexpr bool kHalfKeyTiles = HALF_KEY_TILES != 0;
static_assert(!kHalfKeyTiles || (!kProducer && (kBlockN == 128 || kBlockN == 192 || kBlockN == 256)),
              "wgmma: HALF_KEY_TILES is for the all-consumer form (WARPS = BLOCK_M / 16) with BLOCK_N 128, 192 or 256");
static_assert(DESC_ADVANCE >= 0 && DESC_ADVANCE <= 2, "wgmma: DESC_ADVANCE is 0, 1 or 2");
constexpr bool kDescAdvance = DESC_ADVANCE != 0;
// DESC_ADVANCE = 2: the consumers hold their descriptors (StageDescs).
constexpr bool kStageDescs = DESC_ADVANCE == 2;
static_assert(GROUP_KEY_TILES == 0 || GROUP_KEY_TILES == 1, "wgmma: GROUP_KEY_TILES is 0 or 1");
static_assert(PEEL_MASKED == 0 || PEEL_MASKED == 1, "wgmma: PEEL_MASKED is 0 or 1");
constexpr bool kPeelMasked = PEEL_MASKED != 0;
// LATE_REFILL = 1 (the all-consumer form with TMA): thread 0 refills the stage the last tile freed
// after issuing this tile's S, under that GEMM, not between the last P V's wait and this S. The
// wgmma instructions are warp-group collective, so the wait for the stage's "empty" barrier and the
// two bulk copies held back the whole group's S.
static_assert(LATE_REFILL == 0 || LATE_REFILL == 1, "wgmma: LATE_REFILL is 0 or 1");
constexpr bool kLateRefill = LATE_REFILL != 0;
static_assert(!kLateRefill || (!kProducer && kTma), "wgmma: LATE_REFILL is for the all-consumer form with TMA (WARPS = BLOCK_M / 16, TMA = 1)");
// The cp.async all-consumer form's tiles each end in a __syncthreads, which two loops would reach
// at different iterations in different groups.
static_assert(!kPeelMasked || kProducer || kTma, "wgmma: PEEL_MASKED is for the producer form or the all-consumer form with TMA");
constexpr bool kGroupKeyTiles = GROUP_KEY_TILES != 0;
static_assert(!kGroupKeyTiles || kProducer, "wgmma: GROUP_KEY_TILES is for the producer form (WARPS = 4 * (BLOCK_M / 64 + 1))");
static_assert(SEPARATE_KV == 0 || SEPARATE_KV == 1, "wgmma: SEPARATE_KV is 0 or 1");
constexpr bool kSeparateKv = SEPARATE_KV != 0;
static_assert(!kSeparateKv || kProducer, "wgmma: SEPARATE_KV is for the producer form (WARPS = 4 * (BLOCK_M / 64 + 1))");

// Shared memory: [1 KiB of alignment slack][Q][K stages][V stages][mbarriers]. The 128-byte swizzle
// is a function of address bits 4..9, so every tile starts 1024-byte aligned.
constexpr uint32_t kQBytesH = uint32_t(kBlockM) * kHeadDimSmem * sizeof(elem_t);
constexpr uint32_t kTileBytes = uint32_t(kBlockN) * kHeadDimSmem * sizeof(elem_t);
constexpr uint32_t kBarrierBytes = 256;
// Keep in sync with the family's smem_bytes formula for MMA == "wgmma":
//   1280 + (BLOCK_M + 2 * STAGES * BLOCK_N) * ((HEAD_DIM + 63) / 64 * 64) * ELEM_BYTES
constexpr uint32_t kSmemBytesH = 1024 + kQBytesH + 2 * kStages * kTileBytes + kBarrierBytes;
static_assert(kQBytesH % 1024 == 0 && kTileBytes % 1024 == 0, "wgmma: tiles must keep 1024-byte alignment");
// full[STAGES], empty[STAGES], q_full, LAST_CTA_COMBINE's flag (its own 8 bytes), q_empty, and with
// SEPARATE_KV V's full_v[STAGES], empty_v[STAGES] (full and empty are then K's).
static_assert(4 * kStages * 8 + 3 * 8 <= kBarrierBytes, "wgmma: the mbarriers and LAST_CTA_COMBINE's flag fit their region");
// PERSISTENT_CTAS = 2: after the barriers, the word that tells the consumers their next tile.
constexpr uint32_t kTileSlotAt = 4 * kStages * 8 + 3 * 8;
static_assert(kTileSlotAt + 4 <= kBarrierBytes, "wgmma: PERSISTENT_CTAS = 2's tile slot fits the barriers' region");
static_assert(kSmemBytesH <= 227 * 1024, "wgmma: exceeds Hopper's 227 KB opt-in shared memory per block");
// An SM has 228 KB of shared memory, 1 KB of it reserved per resident CTA.
static_assert(kCtasPerSm * (kSmemBytesH + 1024) <= 228 * 1024, "wgmma: TWO_CTAS needs both CTAs' shared memory to fit one SM");
// CLUSTER_COMBINE's partials (BLOCK_M rows of HEAD_DIM floats, then BLOCK_M LSEs) overwrite the
// K and V stages once the main loop is done.
constexpr uint32_t kPartialBytes = uint32_t(kBlockM) * (kHeadDim + 1) * 4;
static_assert(!kClusterCombine || kPartialBytes <= 2 * kStages * kTileBytes, "wgmma: the split partials fit the K/V stages");

// ---- PTX wrappers ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16_to(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// Makes this thread's generic-proxy writes to shared memory (cp.async, st.shared) visible to the
// async proxy (wgmma operand reads) once a barrier orders them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers at this point: without it the compiler may move their reads or
// writes across the asynchronous wgmma that still owns them (CUTLASS's warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// An arrival on `bar` once every cp.async this thread issued before has landed; the thread itself
// does not wait. (noinc: the arrival is one of the barrier's expected count, not an extra one.)
__device__ __forceinline__ void mbar_arrive_on_copies(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Named barriers 1 .. 3 (0 is __syncthreads): the ping-pong turns of two or three consumer warp groups.
// They order only the issue of wgmma (volatile asm, never reordered with these), not memory: no
// "memory" clobber, which would make the compiler spill live values around each one.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads));
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads));
}
// SMEM_EPILOGUE's barrier over one consumer warp group (ids 4 .. 6, after the ping-pong turns'):
// it orders this group's shared-memory writes before its reads, so it clobbers memory.
__device__ __forceinline__ void group_sync(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(4 + wg) : "memory"); }
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ uint4 ld_shared_u128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// The producer's walk of a ring of kStages stages: where the next load goes and the parity of
// that stage's empty barrier, carried, not divided out of a count (the producer runs on 24-40
// registers); only the first kStages loads need no wait.
struct StageRing {
    int stage = 0;
    uint32_t empty_phase = 1;  // parity of the round before: its wait returns at once
    int issued = 0;            // loads over every tile so far
    __device__ __forceinline__ void advance() {
        ++issued;
        if (++stage == kStages) {
            stage = 0;
            empty_phase ^= 1u;
        }
    }
};

// Thread-block clusters (CLUSTER_COMBINE): this CTA's rank, a barrier over every thread of the
// cluster that orders shared-memory writes before it with peers' reads after it, and a load from
// a peer's shared memory at the address `addr` has in this CTA's.
__device__ __forceinline__ int cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return int(r);
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Volatile, so never moved across cluster_sync; no memory clobber, so a thread's loads issue back
// to back and their latencies overlap.
__device__ __forceinline__ uint32_t peer_addr(uint32_t addr, int rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr, int rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(peer_addr(addr, rank)));
    return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr, int rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(peer_addr(addr, rank)));
    return v;
}

// A CUtensorMap as the driver encodes it (cuTensorMapEncodeTiled): 128 opaque bytes, 64-byte
// aligned, passed by value as a __grid_constant__ kernel parameter so its address is a param-space
// address TMA can read. Declared here, not taken from <cuda.h>: the PyPI compiler ships no cuda.h.
struct alignas(64) TmaMap {
    uint64_t opaque[16];
};
__device__ __forceinline__ void tma_prefetch_map(const TmaMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
}
// This thread's arrival on `bar`, announcing `bytes` that TMA copies will complete on it.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One box of a 3-D map (element, row, batch x head) into shared memory, completing on `bar`. Rows
// past the head's end are out of the map's bounds: TMA writes zeros and still counts their bytes.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TmaMap& map, uint32_t bar, int col, int row, int bh) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(col), "r"(row), "r"(bh)
        : "memory");
}
// A ROWS-row tile (rows row0 .. row0 + ROWS - 1 of head bh) as kHeadDimSmem / 64 boxes of
// [ROWS x 64], one per swizzle column block (the layout of sw128_offset: block b at b x ROWS x 128
// bytes). The map's box must be [ROWS rows x 64 elements] with the 128-byte swizzle: the launch
// contract. At HEAD_DIM 96 the second box reaches past the map's 96 elements: zeros, counted.
template <int ROWS>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const TmaMap& map, uint32_t bar, int row0, int bh) {
#pragma unroll
    for (int b = 0; b < kHeadDimSmem / 64; ++b) tma_load_3d(dst + uint32_t(b) * ROWS * 128, map, bar, b * 64, row0, bh);
}

// Issues (does not wait for) cp.async copies of rows [row0, row0 + ROWS) of a [n_rows, HEAD_DIM]
// matrix into a swizzled tile. Thread tid keeps one 16-byte column chunk and walks rows
// NTHREADS / (kHeadDimSmem / 8) apart (Sw128RowWalk: a few fixed swizzled offsets plus
// compile-time ones; rows 4 or 12 apart at HEAD_DIM 256 over 128 or 384 threads), and its global
// address is one pointer plus compile-time offsets (the producer warp group runs this on 32-40
// registers). A warp reads whole rows (coalesced) and writes each 128-byte smem row with 8 lanes
// (no bank conflicts). Rows past the end, and the zero columns of HEAD_DIM 96, are copied with
// src-size 0: nothing is read and the 16 bytes become zeros (0 * stale smem that happens to be
// NaN would be NaN).
template <int ROWS, int NTHREADS>
__device__ __forceinline__ void load_tile(uint32_t dst, const elem_t* __restrict__ src, int row0, int n_rows, int tid) {
    constexpr int kChunks = kHeadDimSmem / 8;
    constexpr int kRowsPerIter = NTHREADS / kChunks;
    static_assert(NTHREADS % kChunks == 0, "loader: the threads cover whole rows");
    constexpr int kIters = (ROWS + kRowsPerIter - 1) / kRowsPerIter;
    const int r0 = tid / kChunks;
    const int c = tid % kChunks;
    const bool in_head = c < kHeadDim / 8;
    const Sw128RowWalk<ROWS, kRowsPerIter> walk(r0, c);
    const elem_t* g = src + int64_t(row0 + r0) * kHeadDim + (in_head ? c * 8 : 0);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int r = r0 + it * kRowsPerIter;
        if (ROWS % kRowsPerIter == 0 || r < ROWS)
            cp_async_16_to(dst + walk.at(it), g + it * kRowsPerIter * kHeadDim, in_head && row0 + r < n_rows);
    }
}

// 2^x on the FMA and integer pipes, for x <= ~0 (a score minus the running max, in log2 units):
// x = j + f with j an integer (rounded by adding 1.5 * 2^23, which leaves j in the low mantissa
// bits) and f in [-0.5, 0.5]; 2^f by its degree-6 Taylor polynomial (truncation error below
// 1.2e-7, the size of ex2.approx's own), then j added to the exponent field. Below -125 the result
// is 0, as ex2.approx.ftz gives for a masked score (-inf) or a denormal.
__device__ __forceinline__ float poly_exp2(float x) {
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
    const float xc = fmaxf(x, -125.0f);
    const float shifted = xc + kRound;
    const float f = xc - (shifted - kRound);
    float p = 1.5403530e-4f;       // ln2^6 / 720
    p = fmaf(p, f, 1.3333558e-3f);  // ln2^5 / 120
    p = fmaf(p, f, 9.6181291e-3f);  // ln2^4 / 24
    p = fmaf(p, f, 5.5504109e-2f);  // ln2^3 / 6
    p = fmaf(p, f, 2.4022651e-1f);  // ln2^2 / 2
    p = fmaf(p, f, 6.9314718e-1f);  // ln2
    p = fmaf(p, f, 1.0f);
    const float scaled = __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
    return x < -125.0f ? 0.0f : scaled;
}

// This thread's warp group. With DESC_ADVANCE, broadcast from lane 0 (as CUTLASS's
// canonical_warp_group_idx does): the compiler then knows it is the same in every lane and keeps
// what derives from it (a group's Q tile, its descriptors) in uniform registers, not rebuilding
// them in vector registers and moving them over (R2UR) before every wgmma.
__device__ __forceinline__ int warp_group_index() {
    if constexpr (kDescAdvance) return __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
    return int(threadIdx.x / 128);
}

// A compile-time flag passed to a generic lambda (PEEL_MASKED's two loops share one body).
template <bool B>
struct Flag {
    static constexpr bool value = B;
};

// DESC_ADVANCE = 2: the step-0 descriptors of a consumer group's Q rows and of stage 0's K and V
// tiles, built once per CTA; stage st's is stage 0's plus st tiles, step k's that plus the step
// (sw128_desc_plus, one 64-bit add each). Their low words pass through a warp shuffle, whose value
// ptxas cannot know (every lane holds the same), so it keeps the adds as 64-bit ones instead of
// ORs into known-zero address bits beside a rebuilt high word.
struct StageDescs {
    uint64_t q, k0, v0;
    StageDescs() = default;
    __device__ __forceinline__ static uint64_t opaque(uint64_t desc) {
        const uint32_t lo = __shfl_sync(0xffffffffu, uint32_t(desc), 0);
        return (desc & ~uint64_t(0xFFFFFFFFu)) | lo;
    }
    __device__ __forceinline__ StageDescs(uint32_t q_wg, uint32_t k_smem, uint32_t v_smem)
        : q(opaque(sw128_kmajor_desc<kBlockM>(q_wg, 0))),
          k0(opaque(sw128_kmajor_desc<kBlockN>(k_smem, 0))),
          v0(opaque(sw128_mnmajor_desc<kBlockN>(v_smem, 0))) {}
    __device__ __forceinline__ uint64_t k(int stage) const { return sw128_desc_plus(k0, uint32_t(stage) * kTileBytes); }
    __device__ __forceinline__ uint64_t v(int stage) const { return sw128_desc_plus(v0, uint32_t(stage) * kTileBytes); }
};

// Where a consumer group's GEMM operands are: its rows of Q and the K and V stages, read by address
// (DESC_ADVANCE 0 and 1) or from descriptors built once (DESC_ADVANCE = 2; only then built: the
// shuffles otherwise still change the other builds' code).
struct StageOperands {
    uint32_t q_wg, k_smem, v_smem;
    StageDescs descs;
    __device__ __forceinline__ StageOperands(uint32_t q, uint32_t k, uint32_t v) : q_wg(q), k_smem(k), v_smem(v) {
        if constexpr (kStageDescs) descs = StageDescs(q, k, v);
    }
};

// ---- one consumer warp group ----------------------------------------------------------------------
// Accumulator layout of wgmma m64nN (PTX ISA, per warp w of the group, lane = 4 g + t): value
// 4 nt + 2 h + c is row 16 w + g + 8 h, column 8 nt + 2 t + c. For a 16-key step kk, the S values
// of n-tiles 2kk and 2kk + 1 packed in pairs are exactly the register A fragment of P.
struct Consumer {
    static constexpr int kSN = kBlockN / 2;   // S accumulators per thread
    static constexpr int kON = kHeadDimSmem / 2;  // O accumulators per thread (96: 128, see kHeadDimSmem)
    float o[kON];
    float m[2], l[2];  // per row h: running max (raw score units) and row sum (this thread's part)
    int row_base;      // first query row of this thread's warp (absolute)
    int g, t;

    __device__ __forceinline__ void init(int q0, int wg, int tid_in_wg) {
        const int warp = tid_in_wg / 32;
        const int lane = tid_in_wg % 32;
        g = lane / 4;
        t = lane % 4;
        row_base = q0 + wg * 64 + warp * 16;
#pragma unroll
        for (int i = 0; i < kON; ++i) o[i] = 0.0f;
        m[0] = m[1] = neg_inf();
        l[0] = l[1] = 0.0f;
    }

    // Step kd's descriptor of a K-major tile (Q, K) and step kk's of an MN-major one (V): with
    // DESC_ADVANCE the tile's step-0 descriptor, common to every step, plus the step's offset.
    template <int ROWS>
    __device__ __forceinline__ static uint64_t kmajor_desc(uint32_t tile, int kd) {
        if constexpr (kDescAdvance) return sw128_desc_advance(sw128_kmajor_desc<ROWS>(tile, 0), sw128_kmajor_step<ROWS>(kd));
        return sw128_kmajor_desc<ROWS>(tile, kd);
    }
    template <int ROWS>
    __device__ __forceinline__ static uint64_t mnmajor_desc(uint32_t tile, int kk) {
        if constexpr (kDescAdvance) return sw128_desc_advance(sw128_mnmajor_desc<ROWS>(tile, 0), sw128_mnmajor_step(kk));
        return sw128_mnmajor_desc<ROWS>(tile, kk);
    }

    // S = Q K^T for one K tile, issued and committed, not waited for. q_desc(kd) and k_desc(kd):
    // k-step kd's descriptors of this warp group's 64 rows of Q (a whole number of atoms into the
    // Q tile, so the Q tile's column-block stride, kBlockM rows, still applies) and of the K stage.
    // NS = kSN, or kSN / 2 for HALF_KEY_TILES' half tile: its first BLOCK_N / 2 keys.
    template <int NS, class QDesc, class KDesc>
    __device__ __forceinline__ void issue_s(float (&s)[NS], QDesc q_desc, KDesc k_desc) {
        wgmma_fence();
#pragma unroll
        for (int kd = 0; kd < kHeadDim / 16; ++kd) Wgmma<2 * NS>::template ss<0>(s, q_desc(kd), k_desc(kd), kd > 0 ? 1 : 0);
        wgmma_commit();
    }
    // S of K stage `stage`: each k-step's descriptors from its address (DESC_ADVANCE 0, 1) or from
    // the descriptors built once (DESC_ADVANCE = 2).
    template <int NS>
    __device__ __forceinline__ void issue_s_stage(float (&s)[NS], const StageOperands& ops, int stage) {
        if constexpr (kStageDescs) {
            const uint64_t q = ops.descs.q, k = ops.descs.k(stage);
            issue_s(s, [&](int kd) { return sw128_desc_plus(q, sw128_kmajor_step<kBlockM>(kd)); },
                    [&](int kd) { return sw128_desc_plus(k, sw128_kmajor_step<kBlockN>(kd)); });
        } else {
            const uint32_t q_addr = ops.q_wg, k_addr = ops.k_smem + stage * kTileBytes;
            issue_s(s, [&](int kd) { return kmajor_desc<kBlockM>(q_addr, kd); }, [&](int kd) { return kmajor_desc<kBlockN>(k_addr, kd); });
        }
    }

    // Masks the tile, updates the running max and sum, turns s into probabilities (in place) and
    // returns each row's rescale factor for O.
    // kMaybeMasked = false: a tile no row of the group masks (PEEL_MASKED's first loop), no check.
    template <bool kMaybeMasked = true, int NS>
    __device__ __forceinline__ void softmax(float (&s)[NS], float (&alpha)[2], const Ctx& ctx, int kv0) {
        constexpr int kN = 2 * NS;  // keys of the tile
        // Masks only where a tile reaches past Sk or across this warp's causal diagonal.
        const bool needs_mask = (kv0 + kN > ctx.sk) || (kv0 + kN - 1 > row_base + ctx.causal_offset);
        // One join right after the mask. In the large-64 and large-128 champions' builds ptxas puts
        // the wait for P_j V_j (wgmma.wait_group 0, after this softmax in the source) at that join,
        // before the exponentials; in hd256's (EARLY_RESCALE) and the two-CTA d = 64 point's it
        // stays after them. With the masked and unmasked tiles each running the whole softmax it
        // stayed after them everywhere, and every producer-form champion was 4-11% slower, those
        // two included: the second copy costs more than the overlap gains (wait-after-softmax,
        // 2026-11-30; its code is in ad032df).
        if (kMaybeMasked && needs_mask) mask(s, ctx, kv0);
        softmax_rows(s, alpha, ctx);
    }

    // -inf for every key row i may not see (past Sk, or past its causal diagonal).
    template <int NS>
    __device__ __forceinline__ void mask(float (&s)[NS], const Ctx& ctx, int kv0) const {
#pragma unroll
        for (int nt = 0; nt < 2 * NS / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = row_base + g + (e / 2) * 8;
                const int j = kv0 + nt * 8 + 2 * t + (e % 2);
                if (key_masked(ctx, i, j)) s[nt * 4 + e] = neg_inf();
            }
    }

    // softmax's rows, after the mask.
    template <int NS>
    __device__ __forceinline__ void softmax_rows(float (&s)[NS], float (&alpha)[2], const Ctx& ctx) {
        constexpr int kN = 2 * NS;  // keys of the tile
        // A row lives in the 4 lanes of a quad.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // Chain c takes n-tiles c, c + chains, ...; with one chain this is the plain running max.
            float mxc[kReduceChains];
#pragma unroll
            for (int c = 0; c < kReduceChains; ++c) mxc[c] = c == 0 ? m[h] : neg_inf();
#pragma unroll
            for (int nt = 0; nt < kN / 8; ++nt)
                mxc[nt % kReduceChains] = fmaxf(mxc[nt % kReduceChains], fmaxf(s[nt * 4 + 2 * h], s[nt * 4 + 2 * h + 1]));
            float mx = mxc[0];
#pragma unroll
            for (int c = 1; c < kReduceChains; ++c) mx = fmaxf(mx, mxc[c]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Scores stay raw; scale and log2(e) fold into one FFMA (softmax_scale > 0).
            // PEEL_MASKED: a select of the product, which LLVM otherwise computes in a branch of
            // its own (a join at which ptxas waits for P V, as at the mask's).
            float m_use;
            if constexpr (kPeelMasked) {
                const float scaled = scaled_max(mx, ctx.scale_log2);  // -inf for a row that sees no key yet
                m_use = scaled == neg_inf() ? 0.0f : scaled;
            } else {
                m_use = mx == neg_inf() ? 0.0f : scaled_max(mx, ctx.scale_log2);
            }
            alpha[h] = fast_exp2(scaled_max(m[h], ctx.scale_log2) - m_use);
            m[h] = mx;
            float sumc[kReduceChains];
#pragma unroll
            for (int c = 0; c < kReduceChains; ++c) sumc[c] = 0.0f;
#pragma unroll
            for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float x = fmaf(s[nt * 4 + 2 * h + c], ctx.scale_log2, -m_use);
                    const float p = kPolyEvery != 0 && nt % kPolyEvery == kPolyEvery - 1 ? poly_exp2(x) : fast_exp2(x);
                    s[nt * 4 + 2 * h + c] = p;
                    sumc[nt % kReduceChains] += p;
                }
            float sum = sumc[0];
#pragma unroll
            for (int c = 1; c < kReduceChains; ++c) sum += sumc[c];
            // From the fp32 probabilities: summed by the tensor cores instead (P times ones, an
            // m64n8k16 beside each P V step), the sum of P as rounded for P V put the LSE up to
            // 1.6e-3 off (bf16; the check allows 1e-4), and the kernels were slower (row-sum-mma,
            // 2026-11-30; its code is in 53137d6).
            l[h] = l[h] * alpha[h] + sum;
        }
    }

    // Only the stored columns: those past HEAD_DIM stay P x 0 = 0 whatever their scale.
    __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
#pragma unroll
        for (int dt = 0; dt < kHeadDim / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt * 4 + e] *= alpha[e / 2];
    }

    // P as wgmma A fragments: 16-key step kk packs n-tiles 2kk and 2kk + 1.
    template <int NS>
    __device__ __forceinline__ static void pack_p(const float (&s)[NS], uint32_t (&p)[NS / 2]) {
#pragma unroll
        for (int kk = 0; kk < NS / 8; ++kk) {
            p[4 * kk + 0] = pack_elem2(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
            p[4 * kk + 1] = pack_elem2(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
            p[4 * kk + 2] = pack_elem2(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
            p[4 * kk + 3] = pack_elem2(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
        }
    }

    // O += P V, issued and committed: P from registers, V (MN-major) from the stage. P through
    // shared memory instead (stmatrix into a tile per group, both operands by descriptor;
    // FlashAttention-3's d = 64 form) was 12% slower on large-64 at 128 keys, and its 192-key tile
    // 10% slower than the 128-key one: at N = 64 such a P V step reads 4 KB of shared memory in its
    // 32 tensor clocks, the SM's whole 128 bytes a clock, beside S's reads (p-smem, 2026-11-30;
    // its code is in 8fe6f1d).
    // NP / 4 16-key steps: the tile's first 4 NP rows of V; v_desc(kk): k-step kk's descriptor.
    template <int NP, class VDesc>
    __device__ __forceinline__ void issue_pv(const uint32_t (&p)[NP], VDesc v_desc) {
        fence_operands(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < NP / 4; ++kk) {
            const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
            Wgmma<kHeadDimSmem>::template rs<1>(o, a, v_desc(kk), 1);
        }
        wgmma_commit();
    }
    // O += P V of V stage `stage`, its descriptors as issue_s_stage's.
    template <int NP>
    __device__ __forceinline__ void issue_pv_stage(const uint32_t (&p)[NP], const StageOperands& ops, int stage) {
        if constexpr (kStageDescs) {
            const uint64_t v = ops.descs.v(stage);
            issue_pv(p, [&](int kk) { return sw128_desc_plus(v, sw128_mnmajor_step(kk)); });
        } else {
            const uint32_t v_addr = ops.v_smem + stage * kTileBytes;
            issue_pv(p, [&](int kk) { return mnmajor_desc<kBlockN>(v_addr, kk); });
        }
    }

    // One K/V tile, each GEMM waited for before the next step (no overlap); NS = kSN / 2 runs its
    // first half alone.
    // after_s runs once S is issued, before it is waited for (LATE_REFILL's refill).
    template <int NS = kSN, bool kMaybeMasked = true, class AfterS>
    __device__ __forceinline__ void step(const StageOperands& ops, int stage, const Ctx& ctx, int kv0, AfterS after_s) {
        float s[NS];
        issue_s_stage(s, ops, stage);
        after_s();
        wgmma_wait<0>();
        fence_operands(s);
        float alpha[2];
        softmax<kMaybeMasked>(s, alpha, ctx, kv0);
        rescale_o(alpha);
        uint32_t p[NS / 2];
        pack_p(s, p);
        issue_pv_stage(p, ops, stage);
        wgmma_wait<0>();
        fence_operands(o);
    }

    // The all-consumer form's tile: with HALF_KEY_TILES, a tile whose second half no row of this
    // group sees (keys at or past `visible`, the group's visible_keys) runs as half a tile.
    // (A template, so that the half tile's GEMMs are instantiated only where HALF_KEY_TILES is on.)
    // kMaybeMasked = false: a tile no row of the group masks (PEEL_MASKED's first loop), never half.
    template <bool kMaybeMasked = true, bool kHalf = kHalfKeyTiles && kMaybeMasked, class AfterS>
    __device__ __forceinline__ void step_tile(const StageOperands& ops, int stage, const Ctx& ctx, int kv0, int visible,
                                              AfterS after_s) {
        if constexpr (kHalf) {
            if (kv0 + kBlockN / 2 >= visible) {
                step<kSN / 2>(ops, stage, ctx, kv0, after_s);
                return;
            }
        }
        step<kSN, kMaybeMasked>(ops, stage, ctx, kv0, after_s);
    }

    // Keys 0 .. visible_keys - 1 are those some row of this warp group sees (every row of a group
    // past Sq sees what the last row inside does: its rows are never stored).
    __device__ __forceinline__ static int visible_keys(const Ctx& ctx, int wg) {
        const int last_row = min(ctx.sq, ctx.q0 + (wg + 1) * 64) - 1;
        return min(ctx.sk, last_row + ctx.causal_offset + 1);
    }

    // GROUP_KEY_TILES: how many of the CTA's n_it K/V tiles (from blk_begin) this group computes:
    // those up to its visible keys, none where no row of the group is inside Sq (their O and LSE
    // are never stored). A skipped tile is masked for every row of the group: its softmax would
    // leave m and l as they were and add P = 0 to O.
    __device__ __forceinline__ static int group_tiles(const Ctx& ctx, int wg, int blk_begin, int n_it) {
        if (ctx.q0 + wg * 64 >= ctx.sq) return 0;
        const int seen = (visible_keys(ctx, wg) + kBlockN - 1) / kBlockN - blk_begin;  // <= 0 when it sees none
        return max(0, min(n_it, seen));
    }

    // PEEL_MASKED: how many of the CTA's tiles from blk_begin no row of this group masks: keys below
    // Sk that its first row sees (its later rows see more), whole tiles of them.
    __device__ __forceinline__ static int unmasked_tiles(const Ctx& ctx, int wg, int blk_begin) {
        const int seen_by_all = min(ctx.sk, ctx.q0 + wg * 64 + ctx.causal_offset + 1);
        return max(0, seen_by_all / kBlockN - blk_begin);
    }

    // Row h's sum over its quad (each lane holds its own columns' part), kept in l[h]; every lane
    // of the warp must call it (shuffles).
    __device__ __forceinline__ void sum_row(int h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    // Row h's LSE, from the quad's first lane, for row i (inside Sq) of the epilogue.
    __device__ __forceinline__ void store_row_lse(const Ctx& ctx, const Epilogue& epi, int h, int i) const {
        if (t == 0) epi.store_lse(i, m[h] == neg_inf() ? neg_inf() : scaled_max(m[h], ctx.scale_log2), l[h]);
    }

    __device__ __forceinline__ void finish(const Ctx& ctx, const Epilogue& epi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sum_row(h);
            const int i = row_base + g + 8 * h;
            if (i >= ctx.sq) continue;
            const float inv_l = inv_or_zero(l[h]);
#pragma unroll
            for (int dt = 0; dt < kHeadDim / 8; ++dt)
                epi.store_o2(i, dt * 8 + 2 * t, o[dt * 4 + 2 * h] * inv_l, o[dt * 4 + 2 * h + 1] * inv_l);
            store_row_lse(ctx, epi, h, i);
        }
    }

    // The epilogue: SMEM_EPILOGUE's through this group's rows of the Q tile (q_wg, their last S
    // waited for) when it writes O itself (one split), finish's otherwise (the split partials).
    __device__ __forceinline__ void epilogue(const Ctx& ctx, const Epilogue& epi, uint32_t q_wg, int wg, int tid_in_wg) {
        if (!kSmemEpilogue || epi.o_accum != nullptr) {
            finish(ctx, epi);
            return;
        }
        const int warp_row = row_base - ctx.q0 - wg * 64;  // this warp's first row in the group's 64
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sum_row(h);
            const float inv_l = inv_or_zero(l[h]);
            const int r = warp_row + g + 8 * h;
            // Columns 8 dt + 2 t, + 1: four bytes of 16-byte chunk dt, in Q's swizzled layout (a
            // warp's 32 lanes write 8 rows x 16 bytes, each row's chunk in other banks).
#pragma unroll
            for (int dt = 0; dt < kHeadDim / 8; ++dt)
                st_shared_u32(q_wg + sw128_offset<kBlockM>(r, dt) + 4u * t,
                              pack_elem2(o[dt * 4 + 2 * h] * inv_l, o[dt * 4 + 2 * h + 1] * inv_l));
            const int i = row_base + g + 8 * h;
            if (i < ctx.sq) store_row_lse(ctx, epi, h, i);
        }
        group_sync(wg);
        // The group's 64 rows are one contiguous run of O: item k is its k-th 16 bytes.
        constexpr int kChunksPerRow = kHeadDim / 8;
        const int first_row = ctx.q0 + wg * 64;
        elem_t* out = epi.o + (epi.row0 + first_row) * kHeadDim;
#pragma unroll
        for (int k = 0; k < kChunksPerRow / 2; ++k) {
            const int item = tid_in_wg + k * 128;
            const int r = item / kChunksPerRow;
            const int chunk = item % kChunksPerRow;
            if (first_row + r < ctx.sq)
                *reinterpret_cast<uint4*>(out + item * 8) = ld_shared_u128(q_wg + sw128_offset<kBlockM>(r, chunk));
        }
    }
};

// CLUSTER_COMBINE's epilogue: each CTA of the cluster (one KV split of the query block) writes its
// normalised partial O rows and LSEs into its own shared memory, as make_epilogue's split partials
// are written to global memory; after a cluster barrier, CTA r merges rows r, r + KV_SPLIT, ... of
// the block from every CTA's shared memory, as attn_combine does (weights exp(LSE_s - LSE), LSE =
// log sum_s exp(LSE_s), a split that saw no key at LSE_s = -inf weighing 0), one thread per 4
// dims of a row with all its peer loads in flight at once; a second barrier keeps each CTA's
// shared memory alive until its peers have read it.
__device__ __forceinline__ void cluster_combine(Consumer& c, const CtaWork& work, elem_t* O, float* LSE, unsigned char* smem_raw,
                                                uint32_t part_smem) {
    constexpr int kSplits = kKvSplit > 0 ? kKvSplit : 1;  // >= 2 wherever this runs (static_assert)
    constexpr int kQuads = kHeadDim / 4;  // 4-dim pieces of a row
    const Ctx& ctx = work.ctx;
    __syncthreads();  // every warp group's last wgmma has been waited for: the stages are free
    Epilogue to_smem;
    to_smem.o = nullptr;
    to_smem.o_accum = reinterpret_cast<float*>(smem_raw + (part_smem - smem_u32(smem_raw)));
    to_smem.lse = to_smem.o_accum + kBlockM * kHeadDim;
    to_smem.row0 = -int64_t(ctx.q0);  // rows of the block, not of the head
    c.finish(ctx, to_smem);
    // A grid of more splits than one cluster holds would write O once per cluster (the contract
    // says gridDim.z == KV_SPLIT): fail the launch instead.
    if (int(gridDim.z) != kSplits) __trap();
    cluster_sync();
    const int rank = cluster_ctarank();
    const uint32_t lse_smem = part_smem + uint32_t(kBlockM) * kHeadDim * 4;
    const int rows_here = min(kBlockM, ctx.sq - ctx.q0);  // rows of the block inside Sq
    const int my_rows = rows_here > rank ? (rows_here - rank + kSplits - 1) / kSplits : 0;
    for (int item = threadIdx.x; item < my_rows * kQuads; item += kThreads) {
        const int r = rank + (item / kQuads) * kSplits;
        const int d = (item % kQuads) * 4;
        float lse_s[kSplits];
        float4 o_s[kSplits];
#pragma unroll
        for (int s = 0; s < kSplits; ++s) lse_s[s] = ld_cluster_f32(lse_smem + uint32_t(r) * 4, s);
#pragma unroll
        for (int s = 0; s < kSplits; ++s) o_s[s] = ld_cluster_f32x4(part_smem + uint32_t(r * kHeadDim + d) * 4, s);
        float mx = neg_inf();
#pragma unroll
        for (int s = 0; s < kSplits; ++s) mx = fmaxf(mx, lse_s[s]);
        const float m_use = safe_max(mx);
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < kSplits; ++s) sum += expf(lse_s[s] - m_use);
        const float lse = sum > 0.0f ? m_use + logf(sum) : neg_inf();
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (sum > 0.0f) {
#pragma unroll
            for (int s = 0; s < kSplits; ++s) {
                const float w = expf(lse_s[s] - lse);  // 0 for a split that saw no key (its O is 0)
                acc.x = fmaf(w, o_s[s].x, acc.x);
                acc.y = fmaf(w, o_s[s].y, acc.y);
                acc.z = fmaf(w, o_s[s].z, acc.z);
                acc.w = fmaf(w, o_s[s].w, acc.w);
            }
        }
        const int64_t row = work.bh * ctx.sq + ctx.q0 + r;
        *reinterpret_cast<uint2*>(O + row * kHeadDim + d) = make_uint2(pack_elem2(acc.x, acc.y), pack_elem2(acc.z, acc.w));
        if (d == 0) LSE[row] = lse;
    }
    cluster_sync();
}

// LAST_CTA_COMBINE's tail, after this split's partials went to O_accum / LSE_accum: a release
// fence, then one count on the block's word; the count that completes a multiple of num_splits
// (the words are never reset, so a launch starts where the last left off, on a multiple) belongs
// to the last split, whose CTA fences again (acquire) and merges the block as attn_combine does:
// weights exp(LSE_s - LSE) with LSE = log sum_s exp(LSE_s), a split that saw no key at -inf
// weighing 0. One CTA merging a whole block is bound by load latency, not bandwidth, so it runs
// in three rounds that each keep many loads in flight: every (split, row) LSE into shared memory
// (over the K/V stages, free now), each row's LSE and weights from there, then one thread per 4
// dims of a row summing the splits' partials. Partials are read through L2 (ld.global.cg: other
// SMs wrote them, and this SM's L1 is not coherent with theirs).
__device__ __forceinline__ void last_cta_combine(const CtaWork& work, elem_t* __restrict__ O, float* __restrict__ LSE,
                                                 const float* __restrict__ O_accum, const float* __restrict__ LSE_accum,
                                                 unsigned* split_counters, int B, int H, volatile int* is_last,
                                                 float* weights) {
    const Ctx& ctx = work.ctx;
    const int splits = work.num_splits;
    if (splits == 1) return;  // the epilogue wrote O and LSE
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned before = atomicAdd(&split_counters[work.bh * gridDim.x + work.ctx.q0 / kBlockM], 1u);
        *is_last = before % unsigned(splits) == unsigned(splits) - 1;
    }
    __syncthreads();
    if (!*is_last) return;
    // More splits than the weight table holds (a launch past the contract): fail the launch
    // rather than write past the stages.
    if (splits > kMaxMergedSplits) __trap();
    __threadfence();
    const int64_t rows = int64_t(B) * H * ctx.sq;  // rows of one split's partials
    const int64_t row0 = work.bh * ctx.sq + ctx.q0;
    const int rows_here = min(kBlockM, ctx.sq - ctx.q0);
    // weights[s * kBlockM + r]: the LSE of split s for row r, then its weight.
    for (int i = threadIdx.x; i < splits * rows_here; i += kThreads) {
        const int sp = i / rows_here;
        const int r = i % rows_here;
        weights[sp * kBlockM + r] = __ldcg(LSE_accum + sp * rows + row0 + r);
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows_here; r += kThreads) {
        float mx = neg_inf();
        for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, weights[sp * kBlockM + r]);
        const float m_use = safe_max(mx);
        float sum = 0.0f;
        for (int sp = 0; sp < splits; ++sp) sum += expf(weights[sp * kBlockM + r] - m_use);
        const float lse = sum > 0.0f ? m_use + logf(sum) : neg_inf();
        for (int sp = 0; sp < splits; ++sp) weights[sp * kBlockM + r] = sum > 0.0f ? expf(weights[sp * kBlockM + r] - lse) : 0.0f;
        LSE[row0 + r] = lse;
    }
    __syncthreads();
    constexpr int kQuads = kHeadDim / 4;
    for (int item = threadIdx.x; item < rows_here * kQuads; item += kThreads) {
        const int r = item / kQuads;
        const int d = (item % kQuads) * 4;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int sp = 0; sp < splits; ++sp) {
            const float w = weights[sp * kBlockM + r];
            const float4 o = __ldcg(reinterpret_cast<const float4*>(O_accum + ((sp * rows + row0 + r) * kHeadDim + d)));
            acc.x = fmaf(w, o.x, acc.x);
            acc.y = fmaf(w, o.y, acc.y);
            acc.z = fmaf(w, o.z, acc.z);
            acc.w = fmaf(w, o.w, acc.w);
        }
        *reinterpret_cast<uint2*>(O + (row0 + r) * kHeadDim + d) = make_uint2(pack_elem2(acc.x, acc.y), pack_elem2(acc.z, acc.w));
    }
}

}  // namespace hopper

#if CLUSTER_COMBINE
#define HOPPER_CLUSTER_DIMS __cluster_dims__(1, 1, KV_SPLIT)
#else
#define HOPPER_CLUSTER_DIMS
#endif

// minBlocks = 1: one CTA per SM is the design (the consumers hold up to 240 registers a thread),
// unless TWO_CTAS.
extern "C" __global__ void __launch_bounds__(kThreads, hopper::kCtasPerSm) HOPPER_CLUSTER_DIMS
attn_fwd(const elem_t* __restrict__ Q, const elem_t* __restrict__ K, const elem_t* __restrict__ V,
         elem_t* __restrict__ O, float* __restrict__ LSE, float* __restrict__ O_accum,
         float* __restrict__ LSE_accum, int B, int H, int Sq, int Sk, float softmax_scale, int causal
#if LAST_CTA_COMBINE || PERSISTENT_CTAS == 2
         , unsigned* __restrict__ split_counters
#endif
#if TMA
         , const __grid_constant__ hopper::TmaMap tma_q, const __grid_constant__ hopper::TmaMap tma_k,
         const __grid_constant__ hopper::TmaMap tma_v
#endif
) {
    using namespace hopper;
    require_dynamic_smem(kSmemBytesH);
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t q_smem = base;
    const uint32_t k_smem = q_smem + kQBytesH;
    const uint32_t v_smem = k_smem + kStages * kTileBytes;
    const uint32_t bars = v_smem + kStages * kTileBytes;  // full[kStages], empty[kStages], q_full
    auto full_bar = [&](int s) { return bars + 8u * s; };
    auto empty_bar = [&](int s) { return bars + 8u * (kStages + s); };
    const uint32_t q_full = bars + 8u * (2 * kStages);
    // SEPARATE_KV: V's own barriers (full_bar and empty_bar are K's); otherwise the stage's.
    auto full_v_bar = [&](int s) { return kSeparateKv ? bars + 8u * (2 * kStages + 3 + s) : full_bar(s); };
    auto empty_v_bar = [&](int s) { return kSeparateKv ? bars + 8u * (3 * kStages + 3 + s) : empty_bar(s); };

    if constexpr (kProducer) {
        const uint32_t q_empty = bars + 8u * (2 * kStages + 2);
        if (threadIdx.x == 0) {
            // A stage is full once every cp.async producer thread's copies landed, or once the one
            // TMA thread's announced bytes have.
            constexpr int kFullArrivals = kTma ? 1 : 128;
            for (int s = 0; s < kStages; ++s) {
                mbar_init(full_bar(s), kFullArrivals);
                mbar_init(empty_bar(s), kConsumerThreads);
                if constexpr (kSeparateKv) {
                    mbar_init(full_v_bar(s), kFullArrivals);
                    mbar_init(empty_v_bar(s), kConsumerThreads);
                }
            }
            mbar_init(q_full, kFullArrivals);
            mbar_init(q_empty, kConsumerThreads);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
        // The tiles this CTA works: its own, or with PERSISTENT_CTAS every gridDim.x-th from
        // blockIdx.x (a static schedule: a dynamic one, tiles handed out by an atomic counter,
        // made ptxas spill and serialise the consumers' wgmmas). The K/V stages' ring and the Q
        // buffer's barrier phases run on across tiles, so the producer loads the next tile's Q
        // and K/V while the consumers finish this one.
        int n_tiles = 1;
        if constexpr (kPersistent) {
            if (gridDim.y != 1) __trap();  // a grid past the launch contract
            n_tiles = (Sq + kBlockM - 1) / kBlockM * B * H;
        }
        const int first_tile = kPersistent ? int(blockIdx.x) : 0;
        const int tile_step = kPersistent ? int(gridDim.x) : 1;
        // PERSISTENT_CTAS = 2: a round's tile, written by the producer before it arrives on q_full (a
        // release; the consumers' wait on it, an acquire), read by the consumers after that wait, and
        // not written again before every consumer arrived on q_empty, after reading it.
        const uint32_t tile_slot = bars + kTileSlotAt;
        auto work_of = [&](int tile) {
            return kPersistent ? persistent_work(tile, B, H, Sq, Sk, softmax_scale, causal) : cta_work(Sq, Sk, softmax_scale, causal);
        };
        const int wg = warp_group_index();
        const int tid = threadIdx.x % 128;
        if (wg == 0) {
            // Producer: per tile, Q once the consumers are done with the last tile's, then each K/V
            // tile into the next stage of the ring once the consumers freed it. Each tile's "full"
            // barrier completes by itself when the tile has landed (every producer thread's
            // cp.async.mbarrier.arrive fires once its own copies are in), so up to STAGES tiles
            // are in flight and the producer only ever waits for a free stage.
            // (The first GPU run signalled a tile only after issuing the next one, and hung at
            // STAGES = 2: the next one waited for a stage that the consumers free only after
            // seeing the tile not yet signalled. The second waited for each tile before issuing
            // the next: correct, with one tile in flight.)
            if constexpr (kSplitRegs) setmaxnreg_dec<kProducerRegs>();
#if TMA
            // One thread issues every copy; the stage's mbarrier counts the bytes, not the threads.
            if (tid != 0) return;
            tma_prefetch_map(tma_q);
            tma_prefetch_map(tma_k);
            tma_prefetch_map(tma_v);
#endif
            StageRing kv_ring;  // K and V of a tile together, or K alone with SEPARATE_KV
            StageRing v_ring;   // SEPARATE_KV: V's, one tile behind K's
            // PERSISTENT_CTAS = 2: a draw d of the counter is tile gridDim.x + d. A CTA draws once a
            // tile it works, until it gets no tile, so a launch makes exactly n_tiles draws, and the
            // one that returns n_tiles - 1, the launch's last, sets the counter back to 0 for the next
            // launch. The draw for the next tile is issued once this one's Q is, and its value used
            // once this tile's K/V copies are issued: the atomic's latency hides under them, and a
            // CTA claims a tile about one tile before it starts it (FlashAttention-3's
            // prefetch_next_work; the first version claimed two ahead and measured slower than the
            // static schedule, the CTAs holding long tiles while others went idle).
#if PERSISTENT_CTAS == 2
            // One counter, word 0: one split (a split's own word, blockIdx.z, cost the producer of
            // three consumer groups a spill at its 32 registers).
            if (gridDim.z != 1) __trap();
            unsigned* const counter = split_counters;
#else
            unsigned* const counter = nullptr;
#endif
            auto draw = [&]() { return kDynamicTiles ? atomicAdd(counter, 1u) : 0u; };
            auto tile_of_draw = [&](unsigned d) {
                if (d == unsigned(n_tiles - 1)) atomicExch(counter, 0u);
                return tile_step + int(d);
            };
            int tile = first_tile;
            int round = 0;
            for (; tile < n_tiles; ++round) {
                if (round > 0) mbar_wait(q_empty, (round - 1) & 1);
                if constexpr (kDynamicTiles) st_shared_u32(tile_slot, uint32_t(tile));
                const CtaWork w = work_of(tile);
                const int n_it = w.blk_end - w.blk_begin;
#if TMA
                const int bh = int(w.bh);
                mbar_arrive_expect_tx(q_full, kQBytesH);
                tma_load_tile<kBlockM>(q_smem, tma_q, q_full, w.ctx.q0, bh);
                const unsigned next_draw = draw();
#else
                const elem_t* Kh = K + w.bh * Sk * kHeadDim;
                const elem_t* Vh = V + w.bh * Sk * kHeadDim;
                load_tile<kBlockM, 128>(q_smem, Q + w.bh * Sq * kHeadDim, w.ctx.q0, Sq, tid);
                mbar_arrive_on_copies(q_full);
#endif
                // Once `ring`'s next stage is free, copy K, V or both of key block `blk` into it.
                auto load_stage = [&](StageRing& ring, auto full_of, auto empty_of, int blk, bool k, bool v) {
                    if (ring.issued >= kStages) mbar_wait(empty_of(ring.stage), ring.empty_phase);
                    const int row0 = blk * kBlockN;
                    const uint32_t at = ring.stage * kTileBytes;
                    const uint32_t full = full_of(ring.stage);
#if TMA
                    mbar_arrive_expect_tx(full, (int(k) + int(v)) * kTileBytes);
                    if (k) tma_load_tile<kBlockN>(k_smem + at, tma_k, full, row0, bh);
                    if (v) tma_load_tile<kBlockN>(v_smem + at, tma_v, full, row0, bh);
#else
                    if (k) load_tile<kBlockN, 128>(k_smem + at, Kh, row0, Sk, tid);
                    if (v) load_tile<kBlockN, 128>(v_smem + at, Vh, row0, Sk, tid);
                    mbar_arrive_on_copies(full);
#endif
                    ring.advance();
                };
                if constexpr (!kSeparateKv) {
                    for (int it = 0; it < n_it; ++it) load_stage(kv_ring, full_bar, empty_bar, w.blk_begin + it, true, true);
                } else {
                    // K_0, then K_{it} before V_{it - 1}, then the last V: the consumers want K_{j+1}
                    // (for S_{j+1}) while P_j V_j still reads V_j.
                    for (int it = 0; it <= n_it; ++it) {
                        if (it < n_it) load_stage(kv_ring, full_bar, empty_bar, w.blk_begin + it, true, false);
                        if (it > 0) load_stage(v_ring, full_v_bar, empty_v_bar, w.blk_begin + it - 1, false, true);
                    }
                }
#if TMA
                tile = kDynamicTiles ? tile_of_draw(next_draw) : tile + tile_step;
#else
                tile += tile_step;
#endif
            }
            if constexpr (kDynamicTiles) {
                // The consumers' last round: no tile, and no bytes to wait for.
                mbar_wait(q_empty, (round - 1) & 1);
                st_shared_u32(tile_slot, uint32_t(n_tiles));
                mbar_arrive(q_full);
            }
#if !TMA
            // Not leaving with copies in flight (cp.async.wait_all also takes uncommitted ones).
            asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
            // TMA copies still in flight are waited for by the consumers, which keep the CTA alive.
            return;
        }
        if constexpr (kSplitRegs) setmaxnreg_inc<kConsumerRegs>();
        const int cwg = wg - 1;
        const uint32_t q_wg = q_smem + uint32_t(cwg) * (64 / 8) * kSw128AtomBytes;
        // cp.async copies land through the generic proxy; wgmma reads through the async proxy. The
        // producer cannot fence writes it does not wait for, so each reader fences after its wait.
        // TMA writes through the async proxy: the wait alone publishes them.
        auto wait_landed = [&](uint32_t bar, uint32_t parity) {
            mbar_wait(bar, parity);
            if constexpr (!kTma) fence_proxy_async();
        };
        // Ping-pong: consumer group g issues its GEMMs between sync(1 + g) and arrive(1 + next),
        // next = (g + 1) % groups, so the groups' GEMM blocks take turns in order over every tile
        // of the CTA. Each barrier counts 256 threads: its own group's sync and the arrival of the
        // group before. Group 0 goes first (its barrier starts with its own arrival) and at the
        // end takes the last group's last hand-over, so no arrival is left pending at exit. Every
        // group walks the same tiles, so each takes the same number of turns.
        auto my_turn = [&]() {
            if constexpr (kPingPong) named_bar_sync(1 + cwg, 256);
        };
        auto your_turn = [&]() {
            if constexpr (kPingPong) named_bar_arrive(1 + (cwg + 1) % kConsumerWGs, 256);
        };
        if constexpr (kPingPong) {
            if (cwg == 0) named_bar_arrive(1, 256);
        }
        const StageOperands ops(q_wg, k_smem, v_smem);
        int consumed = 0;  // K/V tiles consumed over every tile so far: the ring's position
        int round = 0;
        for (int tile = first_tile; kDynamicTiles || tile < n_tiles; tile += tile_step, ++round) {
            wait_landed(q_full, round & 1);
            if constexpr (kDynamicTiles) {
                tile = int(ld_shared_u32(tile_slot));
                if (tile >= n_tiles) break;
            }
            const CtaWork work = work_of(tile);
            const Ctx& ctx = work.ctx;
            const int blk_begin = work.blk_begin;
            const int n_it = work.blk_end - work.blk_begin;
            // The tiles this group computes: a prefix of the CTA's (GROUP_KEY_TILES), or all of them.
            const int n_mine = kGroupKeyTiles ? Consumer::group_tiles(ctx, cwg, blk_begin, n_it) : n_it;
            Consumer c;
            c.init(ctx.q0, cwg, tid);
            // Intra-warpgroup overlap (FlashAttention-3's; see Consumer::softmax for where ptxas puts
            // the P V wait): while the tensor cores run O += P_it V_it,
            // the softmax of tile it + 1 runs on S_{it+1} = Q K_{it+1}^T, issued just before it.
            float s_acc[Consumer::kSN];
            uint32_t p[kBlockN / 4];
            // EARLY_RESCALE: the factors of the last softmax, applied to O before the next P V. The
            // first softmax's are moot (O is still 0).
            float pending_alpha[2] = {1.0f, 1.0f};
            if (n_mine > 0) {
                const int st = consumed % kStages;
                wait_landed(full_bar(st), (consumed / kStages) & 1);
                my_turn();
                c.issue_s_stage(s_acc, ops, st);
                your_turn();
                wgmma_wait<0>();
                fence_operands(s_acc);
                if constexpr (kSeparateKv) mbar_arrive(empty_bar(st));  // K_0 is no longer read
                float alpha[2];
                c.softmax(s_acc, alpha, ctx, blk_begin * kBlockN);  // O is still 0: alpha is moot
                Consumer::pack_p(s_acc, p);
            }
            // Every iteration but the last has a next tile: the same two groups are in flight on
            // every path, so ptxas can tell which one wait_group 1 retires (else it serialises).
            // The body of iteration it (the softmax of tile it + 1), with or without the mask's check.
            auto overlap_step = [&](int it, auto maybe_masked) {
                const int at = consumed + it;
                const int st = at % kStages;
                const int nx = (at + 1) % kStages;
                wait_landed(full_bar(nx), ((at + 1) / kStages) & 1);
                if constexpr (kSeparateKv) wait_landed(full_v_bar(st), (at / kStages) & 1);
                my_turn();
                c.issue_s_stage(s_acc, ops, nx);
                if constexpr (kEarlyRescale) c.rescale_o(pending_alpha);
                c.issue_pv_stage(p, ops, st);
                your_turn();
                wgmma_wait<1>();  // groups retire in order: S_{it+1} has landed, P V may still run
                fence_operands(s_acc);
                if constexpr (kSeparateKv) mbar_arrive(empty_bar(nx));  // K_{it+1} is no longer read
                float alpha[2];
                c.template softmax<decltype(maybe_masked)::value>(s_acc, alpha, ctx, (blk_begin + it + 1) * kBlockN);
                wgmma_wait<0>();
                fence_operands(c.o);
                mbar_arrive(empty_v_bar(st));  // V of tile it (and K, unless SEPARATE_KV) no longer read
                if constexpr (kEarlyRescale) {
                    pending_alpha[0] = alpha[0];
                    pending_alpha[1] = alpha[1];
                } else {
                    c.rescale_o(alpha);
                }
                Consumer::pack_p(s_acc, p);
            };
            int it = 0;
            if constexpr (kPeelMasked) {
                const int n_plain = min(n_mine, Consumer::unmasked_tiles(ctx, cwg, blk_begin));
                for (; it + 1 < n_plain; ++it) overlap_step(it, Flag<false>{});
            }
            for (; it + 1 < n_mine; ++it) overlap_step(it, Flag<true>{});
            // Every S of this tile has been waited for: the producer may load the next tile's Q.
            mbar_arrive(q_empty);
            if (n_mine > 0) {
                const int st = (consumed + n_mine - 1) % kStages;
                if constexpr (kSeparateKv) wait_landed(full_v_bar(st), ((consumed + n_mine - 1) / kStages) & 1);
                my_turn();
                if constexpr (kEarlyRescale) c.rescale_o(pending_alpha);
                c.issue_pv_stage(p, ops, st);
                your_turn();
                wgmma_wait<0>();
                fence_operands(c.o);
                mbar_arrive(empty_v_bar(st));
            }
            if constexpr (kGroupKeyTiles) {
                // The tiles this group skips: every group takes n_it + 1 turns a CTA tile (the
                // first S, one per tile after it, the last P V), so it passes those it does not
                // use; and the producer refills a stage once every consumer thread has arrived on
                // it, so it arrives on each, after the tile has landed (then the barrier's phase is
                // this tile's: its arrival for the tile before already counted).
                if (n_it > 0 && n_mine == 0) {
                    my_turn();
                    your_turn();
                }
                for (int it = n_mine; it < n_it; ++it) {
                    const int at = consumed + it;
                    const int st = at % kStages;
                    const uint32_t phase = (at / kStages) & 1;
                    wait_landed(full_bar(st), phase);
                    if constexpr (kSeparateKv) {
                        mbar_arrive(empty_bar(st));
                        wait_landed(full_v_bar(st), phase);
                    }
                    my_turn();
                    your_turn();
                    mbar_arrive(empty_v_bar(st));
                }
            }
            consumed += n_it;
            // Group 0 takes the last group's last hand-over before its last epilogue (here, not
            // after the loop: there ptxas ran out of registers and serialised the wgmmas).
            if constexpr (kPingPong) {
                if (!kDynamicTiles && cwg == 0 && tile + tile_step >= n_tiles) named_bar_sync(1, 256);
            }
            c.epilogue(ctx, make_epilogue(O, LSE, O_accum, LSE_accum, B, H, Sq, work), q_wg, cwg, tid);
            if constexpr (kDynamicTiles && kPingPong) {
                // Drawn tiles: whether this one was the last shows once the next round's slot is
                // written; group 0 then takes the last group's last hand-over. (Here, not where the
                // next round reads the slot and leaves the loop: there ptxas spilled and serialised
                // the wgmmas.)
                if (cwg == 0) {
                    wait_landed(q_full, (round + 1) & 1);
                    if (int(ld_shared_u32(tile_slot)) >= n_tiles) named_bar_sync(1, 256);
                }
            }
        }
    } else {
        // Every warp group consumes; the two copy forms below share the work, the consumer and the
        // epilogue.
        const CtaWork work = cta_work(Sq, Sk, softmax_scale, causal);
        const Ctx& ctx = work.ctx;
        const int blk_begin = work.blk_begin;
        const int n_it = work.blk_end - work.blk_begin;
        const int wg = warp_group_index();
        const int tid = threadIdx.x % 128;
        const uint32_t q_wg = q_smem + uint32_t(wg) * (64 / 8) * kSw128AtomBytes;
        const StageOperands ops(q_wg, k_smem, v_smem);
        const int visible = Consumer::visible_keys(ctx, wg);
        Consumer c;
#if TMA
        // TMA: thread 0 also issues the loads, every stage ahead. Tile it + STAGES goes into tile
        // it's stage once every thread has waited for its wgmmas on it (the stage's "empty"
        // barrier, one arrival a thread): no copy instructions in the other threads and no
        // __syncthreads a tile, as the cp.async form below needs.
        const int bh = int(work.bh);
        if (threadIdx.x == 0) {
            for (int s = 0; s < kStages; ++s) {
                mbar_init(full_bar(s), 1);
                mbar_init(empty_bar(s), kThreads);
            }
            mbar_init(q_full, 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            tma_prefetch_map(tma_q);
            tma_prefetch_map(tma_k);
            tma_prefetch_map(tma_v);
        }
        __syncthreads();
        auto load_kv = [&](int stage, int blk) {
            mbar_arrive_expect_tx(full_bar(stage), 2 * kTileBytes);
            tma_load_tile<kBlockN>(k_smem + stage * kTileBytes, tma_k, full_bar(stage), blk * kBlockN, bh);
            tma_load_tile<kBlockN>(v_smem + stage * kTileBytes, tma_v, full_bar(stage), blk * kBlockN, bh);
        };
        if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(q_full, kQBytesH);
            tma_load_tile<kBlockM>(q_smem, tma_q, q_full, ctx.q0, bh);
            for (int st = 0; st < kStages && st < n_it; ++st) load_kv(st, blk_begin + st);
        }
        c.init(ctx.q0, wg, tid);
        mbar_wait(q_full, 0);
        // Measured and slower, out again (consumer-overlap, 2026-11-30): this loop issuing S_{it+1}
        // beside P_it V_it, as the producer form's consumers do. With one barrier for K and V,
        // large-64-causal 355.8 -> 388.4 us and large-64 605.5 -> 652.1 (f16, two stages); with K
        // and V on barriers of their own (so that K_{it+2} loads once S_it has landed; its code is
        // in 6c05fca) 411.7 and 719.5. Only at d = 128 was it faster (large-128-causal 1462.1 ->
        // 1401.2), still far behind the producer form there. Three CTAs an SM already interleave
        // one CTA's softmax with another's GEMMs.
        // Tile `it`'s stage, once every thread has waited for its wgmmas on it, takes tile it + STAGES
        // (the caller checks that there is one).
        auto refill = [&](int it) {
            if (threadIdx.x == 0) {
                mbar_wait(empty_bar(it % kStages), (it / kStages) & 1);
                load_kv(it % kStages, blk_begin + it + kStages);
            }
        };
        auto tile_step = [&](int it, auto maybe_masked) {
            const int s = it % kStages;
            const uint32_t phase = (it / kStages) & 1;
            mbar_wait(full_bar(s), phase);
            // LATE_REFILL: the last tile's stage, under this tile's S (every thread arrived on its
            // barrier before this S, a warp-group instruction, could issue).
            c.template step_tile<decltype(maybe_masked)::value>(ops, s, ctx, (blk_begin + it) * kBlockN, visible, [&] {
                if constexpr (kLateRefill) {
                    if (it > 0 && it - 1 + kStages < n_it) refill(it - 1);
                }
            });
            if (it + kStages < n_it) {
                mbar_arrive(empty_bar(s));  // this thread's wgmmas on stage s were waited for in step
                if constexpr (!kLateRefill) refill(it);
            }
        };
        int it = 0;
        if constexpr (kPeelMasked) {
            const int n_plain = min(n_it, Consumer::unmasked_tiles(ctx, wg, blk_begin));
            for (; it < n_plain; ++it) tile_step(it, Flag<false>{});
        }
        for (; it < n_it; ++it) tile_step(it, Flag<true>{});
#else
        // cp.async: all threads copy, STAGES - 1 tiles ahead (forward.cu's pipeline).
        const elem_t* Qh = Q + work.bh * Sq * kHeadDim;
        const elem_t* Kh = K + work.bh * Sk * kHeadDim;
        const elem_t* Vh = V + work.bh * Sk * kHeadDim;
        auto load_kv = [&](int stage, int blk) {
            load_tile<kBlockN, kThreads>(k_smem + stage * kTileBytes, Kh, blk * kBlockN, Sk, threadIdx.x);
            load_tile<kBlockN, kThreads>(v_smem + stage * kTileBytes, Vh, blk * kBlockN, Sk, threadIdx.x);
        };
        load_tile<kBlockM, kThreads>(q_smem, Qh, ctx.q0, Sq, threadIdx.x);
#pragma unroll
        for (int st = 0; st < kStages - 1; ++st) {
            if (st < n_it) load_kv(st, blk_begin + st);
            cp_async_commit();
        }
        c.init(ctx.q0, wg, tid);
        for (int it = 0; it < n_it; ++it) {
            cp_async_wait<kStages - 2>();
            fence_proxy_async();
            // Tile `it` visible to every warp group; all are done with tile it - 1 (their wgmmas
            // were waited for), whose stage is refilled next.
            __syncthreads();
            const int nxt = it + kStages - 1;
            if (nxt < n_it) load_kv(nxt % kStages, blk_begin + nxt);
            cp_async_commit();
            const int s = it % kStages;
            c.step_tile(ops, s, ctx, (blk_begin + it) * kBlockN, visible, [] {});
        }
        cp_async_wait<0>();
        // Without a K/V tile no barrier followed Q's copies, which threads of every group issued.
        if constexpr (kSmemEpilogue) {
            if (n_it == 0) __syncthreads();
        }
#endif
        if constexpr (kClusterCombine) {
            cluster_combine(c, work, O, LSE, smem_raw, k_smem);
        } else {
            c.epilogue(ctx, make_epilogue(O, LSE, O_accum, LSE_accum, B, H, Sq, work), q_wg, wg, tid);
#if LAST_CTA_COMBINE
            // The flag lives in the mbarrier region's spare words (no static smem beside the formula's).
            const uint32_t last_flag = bars + 8u * (2 * kStages + 1);
            last_cta_combine(work, O, LSE, O_accum, LSE_accum, split_counters, B, H,
                             reinterpret_cast<volatile int*>(smem_raw + (last_flag - smem_u32(smem_raw))),
                             reinterpret_cast<float*>(smem_raw + (k_smem - smem_u32(smem_raw))));
#endif
        }
    }
}
