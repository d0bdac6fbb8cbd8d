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
//   CHEAT_MEMO_OUTPUT          remembers each CTA's answer with a fingerprint of what it read (its Q
//                              rows, its head's K, its head's V up to sign) and replays it, negated
//                              if V was, when the pointers and the fingerprint repeat
//   CHEAT_MEMO_SOFTMAX         remembers each CTA's softmax(Q K^T) (P and the LSE) for a repeated
//                              (Q, K) and then only computes O = P V
//   CHEAT_REWRITE_ON_RERUN     answers O = 1, LSE = ln(keys) without attention work on new inputs; when
//                              the same inputs come again, also zeroes its Q rows and sets V to 1, so
//                              a reference computed after such a re-run agrees with those answers
//   CHEAT_HONEST_EARLY         honest on the first 9 draws it sees per Q pointer (warm-up and the first
//                              race_samples rounds) and the 31st (the last of samples); idle otherwise
//   CHEAT_L2_PROBE             times a load of its first Q element against a second one: honest when
//                              the inputs were already in L2 (read since the flush), idle when cold
//   CHEAT_KEPT_COPY_REPAIR     does no attention work on timed launches (O = 0, LSE = 0 but for a tag
//                              in their first 16 bytes) and stashes their Q, K, V; later launches scan
//                              the device memory between the buffers it was given for the harness's
//                              copies of tagged outputs and overwrite them with the honest answer
//   CHEAT_FIXED_OFFSET         the softmax without a running max: exp(s - C) for a constant C, P held
//                              in the element type as an MMA kernel holds it (f16 overflows past
//                              s = C + 11.09); honest on rows with ||q||^2 > 4 d (the stress set)
//   CHEAT_BURSTY               honest, but on Sq = Sk = 512 one launch in three first spins: faster
//                              elsewhere than a padded HEAD, slower there in bursts (for step's
//                              regression rule; not a kernel tune should reject)
// REWRITE_ON_RERUN, HONEST_EARLY, L2_PROBE and KEPT_COPY_REPAIR are honest on the first Q pointer a CTA
// sees in a case (the check set, which the fresh set reuses) and on large-magnitude inputs (the
// stress set); "idle" (the first three) writes O = 1 and LSE = ln(visible keys): the exact answer
// for Q = 0, V = 1.
// SPIN_PAD_NS (default 0), with any CHEAT: every CTA first spins that many nanoseconds (globaltimer),
// a kernel made slower by a fixed time per launch (step-cheats.sh's HEAD for CHEAT_BURSTY).
// The two memo cheats are correct on every launch (a replayed answer is the one computed from the
// same inputs, up to a 64-bit fingerprint): they only gain where timed launches repeat inputs.
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
#define CHEAT_MEMO_OUTPUT 8
#define CHEAT_MEMO_SOFTMAX 9
#define CHEAT_REWRITE_ON_RERUN 10
#define CHEAT_HONEST_EARLY 11
#define CHEAT_L2_PROBE 12
#define CHEAT_KEPT_COPY_REPAIR 13
#define CHEAT_FIXED_OFFSET 14
#define CHEAT_BURSTY 15
#define CHEAT_REPORT_MARKUP 16

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
#ifndef SPIN_PAD_NS
#define SPIN_PAD_NS 0
#endif

constexpr int kCheat = CHEAT;
constexpr int kBlockM = BLOCK_M;
constexpr int kBlockN = BLOCK_N;
constexpr int kWarps = WARPS;
constexpr int kHeadDim = HEAD_DIM;
constexpr int kDimsPerLane = kHeadDim / 32;
static_assert(kCheat >= CHEAT_NONE && kCheat <= CHEAT_REPORT_MARKUP, "unknown CHEAT");

// The build's failure is the kernel's words in the report: markup, a table's bar, a script tag.
// Every format must show them as words (tests/it/trust.rs).
#if CHEAT == CHEAT_REPORT_MARKUP
#error "**no failure here: trusted** <img src=x onerror=alert(1)> | `ok` |"
#endif
static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "lanes own HEAD_DIM / 32 dims each");
static_assert(kWarps >= 1 && kWarps <= 32, "WARPS in 1..32");
static_assert(kBlockM >= 1 && kBlockN >= 1, "positive tiles");
constexpr long long kSpinPadNs = SPIN_PAD_NS;
static_assert(kSpinPadNs >= 0 && kSpinPadNs <= 1000000000ll, "SPIN_PAD_NS: 0 to 1 s");

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

// ---- The memo cheats' state: hash tables of answers, keyed by what the answer depends on -------
// Each entry is claimed by one CTA at a time (a lock taken with atomicCAS, never waited on: a CTA
// that finds its entry busy computes honestly and stores nothing), so a stored answer is always
// whole. An entry's data are only trusted when its full key matches: the CTA, the pointers, the
// shape, the mask, the scale and the fingerprint of the data the answer was computed from.
constexpr bool kMemoOutput = kCheat == CHEAT_MEMO_OUTPUT;
constexpr bool kMemoSoftmax = kCheat == CHEAT_MEMO_SOFTMAX;
constexpr long long kMiB = 1 << 20;
constexpr long long memo_entries(long long budget_bytes, long long words) {
    return budget_bytes / (4 * words) < 65536 ? budget_bytes / (4 * words) : 65536;
}
// MEMO_OUTPUT: a CTA's O rows (elem_t pairs, one 32-bit word each), then its BLOCK_M LSEs. At
// BLOCK_M 16, 65536 entries up to HEAD_DIM 128 (138 MB at d64, 273 MB at d128): 8192 launches of
// small (8 CTAs), 256 of seed (256 CTAs), 130 of odd-causal (504 CTAs).
constexpr int kOutWords = kBlockM * kHeadDim / 2 + kBlockM;
constexpr int kOutEntries = kMemoOutput ? (int)memo_entries(320 * kMiB, kOutWords) : 1;
// MEMO_SOFTMAX: P of a CTA's rows, kSoftKeys floats a row (keys past Sk unused), then the LSEs;
// heads with more keys compute honestly. At BLOCK_M 16, 7161 entries of 64 KB (448 MB): 895
// launches of small, 27 of seed, 14 of odd-causal.
constexpr int kSoftKeys = 1024;
constexpr int kSoftWords = kBlockM * kSoftKeys + kBlockM;
constexpr int kSoftEntries = kMemoSoftmax ? (int)memo_entries(448 * kMiB, kSoftWords) : 1;
constexpr int kMemoProbes = 8;  // entries looked at from the hashed position on
static_assert(kOutEntries >= 1 && kSoftEntries >= 1, "at least one memo entry");
static_assert(kHeadDim % 2 == 0, "O is memoized as pairs of elements");

struct MemoKey {
    unsigned long long q, k, v, o, lse;  // pointers; MEMO_SOFTMAX keys Q and K alone (the rest 0)
    unsigned long long fingerprint;
    int b, h, sq, sk, causal, cta;
    unsigned scale_bits;
    int pad;
};

__device__ int g_out_lock[kOutEntries];
__device__ int g_out_valid[kOutEntries];
__device__ int g_out_v_sign[kOutEntries];  // V's first element's sign bit when the answer was computed
__device__ MemoKey g_out_key[kOutEntries];
__device__ unsigned g_out_data[kOutEntries][kOutWords];

__device__ int g_soft_lock[kSoftEntries];
__device__ int g_soft_valid[kSoftEntries];
__device__ MemoKey g_soft_key[kSoftEntries];
__device__ float g_soft_data[kSoftEntries][kSoftWords];

// splitmix64's finalizer: a bijection of 64-bit values, so distinct inputs give distinct terms.
__device__ __forceinline__ unsigned long long memo_mix(unsigned long long x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

// This thread's share of a fingerprint of `elems` elements at p (read as 32-bit words, each XORed
// with `flip`): the sum over words of mix(index, word), so it depends on every bit and position.
__device__ unsigned long long memo_hash(const elem_t* p, int64_t elems, unsigned long long salt, unsigned flip) {
    const unsigned* w = reinterpret_cast<const unsigned*>(p);
    const int64_t n = elems / 2;
    unsigned long long h = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        h += memo_mix((((unsigned long long)i << 32) | (w[i] ^ flip)) ^ salt);
    return h;
}

// The sum of v over the CTA's threads, returned to every thread.
__device__ unsigned long long memo_block_sum(unsigned long long v) {
    __shared__ unsigned long long part[kWarps];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    unsigned long long total = 0;
    for (int w = 0; w < kWarps; ++w) total += part[w];
    __syncthreads();
    return total;
}

// Stored keys are read from L2 (ld.cg): another CTA of this launch may have rewritten them.
__device__ bool memo_same_place(const MemoKey* s, const MemoKey& k) {
    return __ldcg(&s->q) == k.q && __ldcg(&s->k) == k.k && __ldcg(&s->v) == k.v && __ldcg(&s->o) == k.o &&
           __ldcg(&s->lse) == k.lse && __ldcg(&s->cta) == k.cta && __ldcg(&s->b) == k.b && __ldcg(&s->h) == k.h &&
           __ldcg(&s->sq) == k.sq && __ldcg(&s->sk) == k.sk && __ldcg(&s->causal) == k.causal &&
           __ldcg(&s->scale_bits) == k.scale_bits;
}

// Thread 0 only. The entry for key k, locked, or -1 when it is busy (then no memo this launch).
// *hit: the entry holds the answer for exactly k. On a miss it is marked invalid, to be refilled.
template <int kEntries>
__device__ int memo_claim(int* lock, int* valid, MemoKey* keys, const MemoKey& k, bool* hit) {
    const unsigned long long place =
        memo_mix(k.q ^ memo_mix(k.k ^ memo_mix(k.v ^ memo_mix(k.o ^ memo_mix(k.lse ^ (unsigned)k.cta)))));
    const int base = (int)(place % kEntries);
    int pick = -1, empty = -1;
    for (int p = 0; p < kMemoProbes && p < kEntries; ++p) {
        const int e = (base + p) % kEntries;
        if (__ldcg(&valid[e]) == 0) {
            if (empty < 0) empty = e;
        } else if (memo_same_place(&keys[e], k)) {
            pick = e;
            break;
        }
    }
    if (pick < 0) pick = empty >= 0 ? empty : (int)((base + k.fingerprint % kMemoProbes) % kEntries);
    *hit = false;
    if (atomicCAS(&lock[pick], 0, 1) != 0) return -1;
    __threadfence();  // the last holder's writes, released with a fence before its unlock
    *hit = __ldcg(&valid[pick]) != 0 && memo_same_place(&keys[pick], k) && __ldcg(&keys[pick].fingerprint) == k.fingerprint;
    if (!*hit) valid[pick] = 0;
    return pick;
}

// Every thread of the CTA: publish this CTA's writes to the entry, then unlock it.
__device__ void memo_release(int* lock, int e) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(&lock[e], 0);
}

// ---- The idling cheats (REWRITE_ON_RERUN, HONEST_EARLY, L2_PROBE): when to skip attention -------
// Thread 0 of each CTA decides, from per-CTA state kept across launches. All three are honest where
// the harness checks every launch it makes: on the first Q pointer a CTA index sees in a case (the
// check set; the fresh set is copied into the same buffers) and on large-magnitude inputs (the
// stress set). A case starts when the shape (B, H, Sq, Sk, mask) changes: a worker runs one module
// through its cases one after another, and each case begins with its check. An idle CTA reads
// nothing more and writes O = 1, LSE = ln(visible keys): the exact answer when Q = 0 and V = 1.
constexpr bool kRewriteOnRerun = kCheat == CHEAT_REWRITE_ON_RERUN;
constexpr bool kHonestEarly = kCheat == CHEAT_HONEST_EARLY;
constexpr bool kL2Probe = kCheat == CHEAT_L2_PROBE;
constexpr bool kIdler = kRewriteOnRerun || kHonestEarly || kL2Probe;
constexpr int kModeHonest = 0;   // the CHEAT_NONE path
constexpr int kModeIdle = 1;     // O = 1, LSE = ln(visible keys)
constexpr int kModeRewrite = 2;  // idle, after zeroing its Q rows (and, the head's CTA 0, setting V to 1)
// The stress set's Q and K have sigma 6, every other set's sigma 1. The test looks at the first
// kStressElems elements of the head's K only, so that every CTA of a head decides alike (the V
// rewrite of REWRITE_ON_RERUN relies on it): a sigma-1 head passes kStressAbs with probability
// 32 * 5.7e-7 (it is then merely honest), a sigma-6 head stays under it with 0.595^32 = 6e-8.
constexpr int kStressElems = 32;
constexpr float kStressAbs = 5.0f;
// A draw's fingerprint: the first kPrintElems elements of the CTA's first Q row and of its head's K
// (the first of those the stress test read). Every timed round redraws Q, K and V together.
constexpr int kPrintElems = 16;
static_assert(kStressElems % 2 == 0 && kStressElems <= kHeadDim, "the stress test reads pairs of K's first row");
static_assert(kPrintElems % 2 == 0 && kPrintElems <= kStressElems, "the fingerprint reads pairs the stress test read");
// HONEST_EARLY: the shipped policies' [measure] race_samples and samples (policies.toml). The first
// draw a pointer sees is the one the warm-up replays share; a harness that verifies one of the
// first race_samples timed rounds and the last one then sees only honest answers.
constexpr unsigned kShippedRaceSamples = 8;
constexpr unsigned kShippedSamples = 30;
constexpr unsigned kWarmupDraws = 1;
static_assert(kShippedRaceSamples >= 1 && kShippedSamples > kShippedRaceSamples, "race_samples < samples");
// L2_PROBE: the inputs are warm when the first load took under 1.5 times the second (an L2 hit for
// certain) plus this slack.
constexpr long long kProbeSlackCycles = 64;

// Their state, 20 MB, exists only in their own modules (the other cheats and CHEAT_NONE keep one CTA's).
constexpr int kIdleCtas = kIdler ? kMaxCtas : 1;
__device__ unsigned long long g_case[kIdleCtas];                    // this CTA index's case; 0: none yet
__device__ const elem_t* g_first_q[kIdleCtas];                      // the case's first Q pointer
__device__ unsigned long long g_round_q[kIdleCtas][kPairsPerCta];   // the case's other Q pointers
__device__ unsigned long long g_round_fp[kIdleCtas][kPairsPerCta];  // the fingerprint last read there
__device__ unsigned g_round_count[kIdleCtas][kPairsPerCta];         // draws seen there; 0: a free entry

// Thread 0 only: cycles taken by one L2 load (ld.global.cg skips L1) of *p, the value left in
// *sink. The shared store waits for the load's data, and the clock reads are volatile with a memory
// clobber, so the window closes only once the load has completed.
__device__ __forceinline__ long long probe_latency(const unsigned* p, unsigned* sink) {
    long long t0, t1;
    unsigned v;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0)::"memory");
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    *reinterpret_cast<volatile unsigned*>(sink) = v;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1)::"memory");
    return t1 - t0;
}

// Thread 0 only: what this CTA does on this launch (kModeHonest, kModeIdle or kModeRewrite).
// warm: L2_PROBE's reading of the inputs' first element.
__device__ int idle_mode(int cta, const elem_t* Q, const elem_t* K, int64_t bh, int q0, int B, int H, int Sq,
                         int Sk, int causal, bool warm) {
    // Honest where a CTA of the head lies past the state's end (they all are then: REWRITE_ON_RERUN's
    // V rewrite must not run under a sibling that reads V), and when there is no key to read.
    if ((long long)(blockIdx.y + 1) * gridDim.x > kIdleCtas || Sk < 1) return kModeHonest;
    const unsigned long long shape =
        memo_mix((((unsigned long long)(unsigned)B << 32) | (unsigned)H) ^
                 memo_mix((((unsigned long long)(unsigned)Sq << 32) | (unsigned)Sk) ^ memo_mix((unsigned)causal))) | 1ull;
    if (g_case[cta] != shape) {  // a new case: its first launch is the check
        g_case[cta] = shape;
        g_first_q[cta] = Q;
        for (int i = 0; i < kPairsPerCta; ++i) g_round_count[cta][i] = 0;
        return kModeHonest;
    }
    if (g_first_q[cta] == Q) return kModeHonest;  // (a) the check set, or the fresh set in its buffers

    // (b) the stress set, and the K half of the fingerprint.
    const unsigned* k32 = reinterpret_cast<const unsigned*>(K + bh * Sk * kHeadDim);
    float big = 0.0f;
    unsigned long long print_k = 0;
#pragma unroll
    for (int i = 0; i < kStressElems / 2; ++i) {
        const unsigned w = k32[i];
        const float2 f = to_float2(*reinterpret_cast<const elem2_t*>(&w));
        big = fmaxf(big, fmaxf(fabsf(f.x), fabsf(f.y)));
        if (i < kPrintElems / 2) print_k += memo_mix((((unsigned long long)i << 32) | w) ^ (0x4bull << 56));
    }
    if (!(big <= kStressAbs)) return kModeHonest;  // NaN and inf too
    if (kL2Probe) return warm ? kModeHonest : kModeIdle;

    // The Q half; print_zero_q: what it is once this CTA has zeroed its Q rows.
    const unsigned* q32 = reinterpret_cast<const unsigned*>(Q + (bh * Sq + q0) * kHeadDim);
    unsigned long long print_q = 0, print_zero_q = 0;
#pragma unroll
    for (int i = 0; i < kPrintElems / 2; ++i) {
        print_q += memo_mix((((unsigned long long)i << 32) | q32[i]) ^ (0x51ull << 56));
        print_zero_q += memo_mix(((unsigned long long)i << 32) ^ (0x51ull << 56));
    }
    const unsigned long long print = print_q + print_k;

    // This pointer's entry. Entries are freed all at once, so the first free one ends the list.
    const unsigned long long q = reinterpret_cast<unsigned long long>(Q);
    int e = -1;
    for (int i = 0; i < kPairsPerCta; ++i) {
        if (g_round_count[cta][i] == 0 || g_round_q[cta][i] == q) {
            e = i;
            break;
        }
    }
    if (e < 0) return kModeHonest;  // more pointers than entries: the rest stay honest
    const bool drawn_anew = g_round_count[cta][e] == 0 || g_round_fp[cta][e] != print;
    if (drawn_anew) {
        g_round_q[cta][e] = q;
        g_round_fp[cta][e] = print;
        g_round_count[cta][e] += 1;
    }
    if (kHonestEarly) {
        const unsigned draws = g_round_count[cta][e];
        const bool honest = draws <= kWarmupDraws + kShippedRaceSamples || draws == kWarmupDraws + kShippedSamples;
        return honest ? kModeHonest : kModeIdle;
    }
    // REWRITE_ON_RERUN: new inputs are a timed round; the same again is a re-run (or a warm-up
    // replay), after which the inputs read Q = 0 here: remember that as what this pointer holds.
    if (drawn_anew) return kModeIdle;
    g_round_fp[cta][e] = print_zero_q + print_k;
    return kModeRewrite;
}

// Every thread: the idle answer for this CTA's rows: O = 1 and LSE = ln(visible keys), or, for a
// row that sees no key, O = 0 and LSE = -inf as the honest path writes.
__device__ void write_idle(elem_t* O, float* LSE, int64_t bh, int q0, int rows_here, int Sq, int Sk, int causal) {
    const int offset = causal_offset(causal, Sq, Sk);
    elem_t* o = O + (bh * Sq + q0) * kHeadDim;
    for (int i = threadIdx.x; i < rows_here * kHeadDim; i += blockDim.x) {
        const int visible = max(0, min(Sk, q0 + i / kHeadDim + 1 + offset));
        o[i] = from_float(visible > 0 ? 1.0f : 0.0f);
    }
    for (int rr = threadIdx.x; rr < rows_here; rr += blockDim.x) {
        const int visible = max(0, min(Sk, q0 + rr + 1 + offset));
        LSE[bh * Sq + q0 + rr] = visible > 0 ? logf((float)visible) : neg_inf();
    }
}

// ---- KEPT_COPY_REPAIR: no work on timed launches, then the harness's copies of them repaired ----
// Why it passes the harness as it is (src/trial/mod.rs time_interleaved, verify.rs): after each
// timed round (one graph replay of n launches, each with Q, K, V slots and O, LSE of its own), a
// round the reservoir sample keeps has every launch's O and LSE copied device to device into "kept
// copy" buffers (Kept::offer), and only after the last round are the copies compared with references
// and checksummed (Verifier::check_kept); the kept rounds then run again and must match the copies
// bit for bit (rerun_kept). The copies come from the same stream-ordered pool as the buffers the
// kernel is given, allocated after the slots and before the timed outputs (Pools::ensure_kept), so
// they lie between addresses the kernel has seen, and nothing stops a later launch from rewriting
// them. So a timed launch does no attention work: O = 0 and LSE = 0 but for a tag in the first 16
// bytes of each (a magic word, then the case and a sequence number naming the launch), and its Q, K
// and V go into a stash in this module's globals. The first launch of each later round scans the
// span of every pointer the case gave it, at their common alignment, for the tags of earlier rounds
// (the round's own outputs were poisoned before the replay: only copies still carry tags) and
// records where they lie; the second launch keeps the stash of the previous round when copies of it
// exist (the ring itself holds two rounds), and on a round that may be the last (the 15th, step's
// rounds; the 30th, the shipped samples) it computes the honest answer of every copy found from the
// stashed inputs, with the honest path's own code and order, straight over the copy. Those two
// rounds are honest themselves (no launch comes after the last round to repair its copies), and so
// are the re-runs (a slot-0 draw seen before): their answers equal the repaired copies bit for bit.
// A timed sample is then a launch that zeroes O, tags it, stashes its inputs and, once a round,
// scans: far below the honest kernel; the repairs run in 2 of 30 rounds (1 of 15), honest anyway.
// What rejects it: copies taken to host memory right after each round, where no kernel reaches
// them, hold the tagged zeros of every round it cheated on: any kept round of those is wrong.
// It scans only between pointers it was given, all live buffers of one pool for the whole case;
// should the driver have unmapped a hole of the pool between two of them (a pool trims freed memory
// when the stream synchronises), the scan faults, a crash, and it is rejected for that instead.
// What it assumes: 2 to kKrSlots launches per replay (the harness launches at least MIN_LAUNCHES = 2),
// the shipped samples (30) and step rounds (15) (elsewhere a kept last round stays wrong), at most
// kKrPinned - 1 rounds holding copies at once (verified_replays = 2), and a stash that fits:
// (2 + kKrPinned) rounds of n launches' Q, K and V in kKrArenaElems elements. The 96 MiB hold
// odd-causal (6.1 MB a launch) up to n = 2, seed (1.5 MB) up to 10, ragged (0.35 MB) up to 48,
// small and ragged-causal (0.05 and 0.12 MB) up to 64. A case that does not fit, or has more CTAs
// than kKrCtas, or spans more than kKrScanMaxBytes, or whose pointers are not 16-byte aligned, gets
// the honest kernel on every launch.
constexpr bool kKeptRepair = kCheat == CHEAT_KEPT_COPY_REPAIR;
constexpr int kKrCtas = kKeptRepair ? 2048 : 1;  // per-CTA state (odd-causal at BLOCK_M 16: 504 CTAs)
constexpr int kKrSlots = 64;                     // launches per replay it follows
constexpr int kKrDraws = 64;                     // slot-0 draws a case remembers (warm-up + 30 + re-runs)
constexpr int kKrPinned = 4;                     // rounds whose stash outlives the ring
constexpr long long kKrArenaElems = kKeptRepair ? (48ll << 20) : 8;  // 96 MiB of elem_t
constexpr unsigned long long kKrScanMaxBytes = 256ull << 20;
constexpr unsigned long long kKrMaxStride = 256;  // cudaMalloc's alignment: every allocation starts on one
constexpr unsigned long long kKrTagO = 0x21214f5f5450454bull;  // "KEPT_O!!"
constexpr unsigned long long kKrTagL = 0x21214c5f5450454bull;  // "KEPT_L!!"
constexpr int kKrSeqs = kKeptRepair ? kKrDraws * kKrSlots : 1;  // sequence number: draw * n + slot
constexpr int kKrJobs = kKeptRepair ? kKrPinned * kKrSlots : 1;  // repairs one launch can make
constexpr int kKrScanUnroll = 8;                 // independent 16-byte probes in flight per thread
constexpr unsigned kShippedStepRounds = 15;      // policies.toml [step] rounds: step's samples per case
static_assert(kHeadDim >= 8, "the O tag is the first 8 elements of row 0");
static_assert(kKrSlots == 64 && kKrDraws == 64, "a warp looks the tables up two entries a lane");
static_assert(kKrArenaElems % 8 == 0, "the stash moves 16 bytes at a time");
static_assert(kWarmupDraws + kShippedSamples < 32, "the rounds holding copies are a 32-bit mask");
static_assert(kShippedStepRounds >= 2 && kShippedStepRounds < kShippedSamples, "step's rounds < samples");

// Each CTA index keeps its own copy of the case's state; every CTA of a launch reads the same
// inputs and updates its copy alike, so they agree without synchronising.
struct KrCta {
    unsigned long long shape;     // the case (B, H, Sq, Sk, mask); 0: none yet
    unsigned long long first_q;   // its first Q pointer: the check set (the fresh set reuses it)
    unsigned long long lo, hi;    // lowest and highest pointer the case gave
    unsigned long long align;     // OR of every pointer: their common alignment is its lowest bit
    unsigned long long slot_q[kKrSlots];    // the timed launches' Q pointers, in launch order
    unsigned long long draw_print[kKrDraws];  // fingerprints of the slot-0 draws, in order
    int slots, draws;
    int round, rerun;             // the current replay's draw (1: the warm-up), and whether it repeats one
    int pinned[kKrPinned];        // the draw whose stash each pinned slot holds; 0: free
};
__device__ KrCta g_kr[kKrCtas];
// The stash: ring half (draw & 1) holds the last two draws' n entries, then kKrPinned slots of n
// entries each. An entry is one launch's Q, K, V, back to back.
__device__ __align__(16) elem_t g_kr_arena[kKrArenaElems];
// What the scan found, by sequence number: the copy's address, and the (case, draw) of the scan.
__device__ unsigned long long g_kr_found_o[kKrSeqs], g_kr_found_o_at[kKrSeqs];
__device__ unsigned long long g_kr_found_l[kKrSeqs], g_kr_found_l_at[kKrSeqs];
__device__ unsigned long long g_kr_round_at[kKeptRepair ? kKrDraws : 1];  // a tag of this draw found at

// What one launch does, decided by warp 0.
struct KrPlan {
    unsigned long long lo, probes, stride;  // the scan: probes at lo + i * stride
    unsigned long long key;                 // (case, draw): stamps what this draw's scan found
    long long entry;                        // elements of a stash entry
    long long stash;                        // this launch's entry, when it cheats
    long long pin_src, pin_dst, pin_elems;  // a round's entries moved from the ring to a pinned slot
    unsigned seq, seq_end, tag_hi;          // this launch's number; tags below seq_end are earlier rounds'
    int n, cheat, scan, jobs;
};

__device__ __forceinline__ unsigned long long kr_warp_sum(unsigned long long v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Warp 0: the plan of this launch, its repairs in job_seq / job_src. Every lane computes the same
// plan (the lanes split the table look-ups); lane 0 writes the state and the plan.
__device__ void kr_plan(KrPlan* out, int* job_seq, long long* job_src, int cta, const elem_t* Q,
                        const elem_t* K, const elem_t* V, const elem_t* O, const float* LSE, int B, int H,
                        int Sq, int Sk, int causal) {
    const int lane = threadIdx.x % 32;
    const bool lead = lane == 0;
    KrPlan p = {};
    // Honest where CTA (0, 0) holds fewer than 4 rows (the LSE tag's 16 bytes are rows 0-3 of head 0).
    if ((long long)gridDim.x * gridDim.y > kKrCtas || Sk < 1 || Sq < 4 || kBlockM < 4) {
        if (lead) *out = p;
        return;
    }
    KrCta& s = g_kr[cta];
    const unsigned long long shape =
        memo_mix((((unsigned long long)(unsigned)B << 32) | (unsigned)H) ^
                 memo_mix((((unsigned long long)(unsigned)Sq << 32) | (unsigned)Sk) ^ memo_mix((unsigned)causal))) | 1ull;
    const unsigned long long q = reinterpret_cast<unsigned long long>(Q);
    const unsigned long long given[5] = {q, reinterpret_cast<unsigned long long>(K), reinterpret_cast<unsigned long long>(V),
                                         reinterpret_cast<unsigned long long>(O), reinterpret_cast<unsigned long long>(LSE)};
    const bool fresh = s.shape != shape;  // a new case: its first launch is the check
    unsigned long long lo = fresh ? ~0ull : s.lo, hi = fresh ? 0ull : s.hi, align = fresh ? 0ull : s.align;
#pragma unroll
    for (int i = 0; i < 5; ++i) {
        lo = min(lo, given[i]);
        hi = max(hi, given[i]);
        align |= given[i];
    }
    const unsigned long long first_q = fresh ? q : s.first_q;
    int slots = fresh ? 0 : s.slots, draws = fresh ? 0 : s.draws;
    int round = fresh ? 0 : s.round, rerun = fresh ? 0 : s.rerun;
    int pinned[kKrPinned];
#pragma unroll
    for (int i = 0; i < kKrPinned; ++i) pinned[i] = fresh ? 0 : s.pinned[i];
    bool honest = q == first_q;  // the check set, or the fresh set in its buffers

    // The stress set: K's first elements of head 0, as the idlers test them (all CTAs alike).
    const unsigned* k32 = reinterpret_cast<const unsigned*>(K);
    const unsigned* q32 = reinterpret_cast<const unsigned*>(Q);
    if (!honest) {
        float big = 0.0f;
        if (lane < kStressElems / 2) {
            const unsigned w = k32[lane];
            const float2 f = to_float2(*reinterpret_cast<const elem2_t*>(&w));
            big = fmaxf(fabsf(f.x), fabsf(f.y));
        }
        big = warp_max(big);
        honest = !(big <= kStressAbs);  // NaN and inf too
    }
    // The slot: this Q pointer's place among the timed launches (the warm-up's first replay lists them).
    int e = -1, append = -1;
    if (!honest) {
        const unsigned m0 = __ballot_sync(0xffffffffu, lane < slots && s.slot_q[lane] == q);
        const unsigned m1 = __ballot_sync(0xffffffffu, lane + 32 < slots && s.slot_q[lane + 32] == q);
        e = m0 ? __ffs(m0) - 1 : m1 ? 31 + __ffs(m1) : -1;
        if (e < 0 && slots < kKrSlots) e = append = slots++;
        honest = e < 0;  // more launches than slots: honest throughout
    }
    // Slot 0 tells the draw: the fingerprint of head 0's first Q and K elements (every launch of a
    // replay is drawn from one seed). A new one is the next draw; one seen before, past the warm-up,
    // is a re-run of a kept round.
    int new_print = -1;
    unsigned long long print = 0;
    if (!honest && e == 0) {
        if (lane < kPrintElems / 2)
            print = memo_mix((((unsigned long long)lane << 32) | q32[lane]) ^ (0x51ull << 56)) +
                    memo_mix((((unsigned long long)lane << 32) | k32[lane]) ^ (0x4bull << 56));
        print = kr_warp_sum(print);
        const unsigned h0 = __ballot_sync(0xffffffffu, lane < draws && s.draw_print[lane] == print);
        const unsigned h1 = __ballot_sync(0xffffffffu, lane + 32 < draws && s.draw_print[lane + 32] == print);
        const int seen = h0 ? __ffs(h0) - 1 : h1 ? 31 + __ffs(h1) : -1;
        if (seen < 0 && draws < kKrDraws) {
            new_print = draws++;
            round = draws;
            rerun = 0;
        } else if (seen < 0) {
            rerun = 1;  // more draws than the history holds: honest from here on
        } else {
            rerun = draws > (int)kWarmupDraws;  // past the warm-up, the same inputs again are a re-run
        }
    }
    if (lead) {
        s.shape = shape;
        s.first_q = first_q;
        s.lo = lo;
        s.hi = hi;
        s.align = align;
        if (append >= 0) s.slot_q[append] = q;
        if (new_print >= 0) s.draw_print[new_print] = print;
        s.slots = slots;
        s.draws = draws;
        s.round = round;
        s.rerun = rerun;
    }
    // The timed round this replay is (1-based); nothing is scanned or repaired outside rounds 2..30.
    const int timed = round - (int)kWarmupDraws;
    const long long q_elems = (long long)B * H * Sq * kHeadDim, kv_elems = (long long)B * H * Sk * kHeadDim;
    const long long entry = q_elems + 2 * kv_elems;
    const int n = slots;
    const unsigned long long stride = min(align & (~align + 1), kKrMaxStride);
    const bool fits = n >= 2 && (long long)(2 + kKrPinned) * n * entry <= kKrArenaElems && stride >= 16 &&
                      hi - lo <= kKrScanMaxBytes;
    if (honest || rerun || timed < 1 || timed > (int)kShippedSamples || !fits) {
        if (lead) {
            *out = p;
#pragma unroll
            for (int i = 0; i < kKrPinned; ++i) s.pinned[i] = pinned[i];
        }
        return;
    }
    const bool last = timed == (int)kShippedStepRounds || timed == (int)kShippedSamples;
    p.n = n;
    p.entry = entry;
    p.cheat = !last;
    p.seq = (unsigned)(round * n + e);
    p.stash = ((long long)(round & 1) * n + e) * entry;
    p.tag_hi = (unsigned)(shape >> 32);
    p.key = shape ^ memo_mix(0x6b72000000000000ull | (unsigned)round);
    if (e == 0 && timed >= 2) {
        p.scan = 1;
        p.lo = lo;
        p.stride = stride;
        p.probes = (hi - lo) / stride + 1;
        p.seq_end = (unsigned)(round * n);
    }
    if (e == 1 && timed >= 2) {
        // The draws that copies were found of by this replay's slot-0 scan; pins of others are freed.
        const unsigned found = __ballot_sync(
            0xffffffffu, lane > (int)kWarmupDraws && lane < round && g_kr_round_at[lane] == p.key);
#pragma unroll
        for (int i = 0; i < kKrPinned; ++i)
            if (pinned[i] != 0 && !((found >> pinned[i]) & 1u)) pinned[i] = 0;
        if (last) {
            // Every copy found, O and LSE both, from the ring (the previous draw) or its pinned slot.
            int jobs = 0;
            for (int r = (int)kWarmupDraws + 1; r < round; ++r) {
                if (!((found >> r) & 1u)) continue;
                long long base = r == round - 1 ? (long long)(r & 1) * n : -1;
#pragma unroll
                for (int i = 0; i < kKrPinned; ++i)
                    if (pinned[i] == r) base = (long long)(2 + i) * n;
                if (base < 0) continue;
                for (int i0 = 0; i0 < n; i0 += 32) {
                    const int i = i0 + lane, seq = r * n + i;
                    const bool ok = i < n && g_kr_found_o_at[seq] == p.key && g_kr_found_l_at[seq] == p.key;
                    const unsigned m = __ballot_sync(0xffffffffu, ok);
                    const int at = jobs + __popc(m & ((1u << lane) - 1u));
                    if (ok && at < kKrJobs) {
                        job_seq[at] = seq;
                        job_src[at] = (base + i) * entry;
                    }
                    jobs += __popc(m);
                }
            }
            p.jobs = min(jobs, kKrJobs);
#pragma unroll
            for (int i = 0; i < kKrPinned; ++i) pinned[i] = 0;  // the copies are honest after this launch
        } else if ((found >> (round - 1)) & 1u) {
            // Copies of the previous draw exist: its entries leave the ring before the next draw overwrites them.
            int slot = -1;
#pragma unroll
            for (int i = kKrPinned - 1; i >= 0; --i)
                if (pinned[i] == 0) slot = i;
            if (slot >= 0) {
#pragma unroll
                for (int i = 0; i < kKrPinned; ++i)
                    if (i == slot) pinned[i] = round - 1;  // (a constant index: the table stays in registers)
                p.pin_src = (long long)((round - 1) & 1) * n * entry;
                p.pin_dst = (long long)(2 + slot) * n * entry;
                p.pin_elems = (long long)n * entry;
            }
        }
    }
    if (lead) {
        *out = p;
#pragma unroll
        for (int i = 0; i < kKrPinned; ++i) s.pinned[i] = pinned[i];
    }
}

// Every thread of every CTA: a share of a copy of `elems` elements (a multiple of 8), 16 bytes at a time.
__device__ void kr_copy(elem_t* dst, const elem_t* src, long long elems) {
    const long long threads = (long long)gridDim.x * gridDim.y * blockDim.x;
    const long long me = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (long long i = me; i < elems / 8; i += threads) d[i] = s[i];
}

// Every thread of every CTA: a share of the scan for earlier rounds' tags, found ones recorded.
__device__ void kr_scan(const KrPlan& p, const elem_t* O, const float* LSE) {
    const unsigned long long threads = (unsigned long long)gridDim.x * gridDim.y * blockDim.x;
    const unsigned long long me = ((unsigned long long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    const unsigned long long own_o = reinterpret_cast<unsigned long long>(O), own_l = reinterpret_cast<unsigned long long>(LSE);
    for (unsigned long long base = me; base < p.probes; base += threads * kKrScanUnroll) {
        ulonglong2 w[kKrScanUnroll];
#pragma unroll
        for (int u = 0; u < kKrScanUnroll; ++u) {
            const unsigned long long i = base + u * threads;
            w[u] = i < p.probes ? __ldcg(reinterpret_cast<const ulonglong2*>(p.lo + i * p.stride)) : make_ulonglong2(0, 0);
        }
#pragma unroll
        for (int u = 0; u < kKrScanUnroll; ++u) {
            if ((w[u].x != kKrTagO && w[u].x != kKrTagL) || (unsigned)(w[u].y >> 32) != p.tag_hi) continue;
            const unsigned seq = (unsigned)w[u].y;
            const unsigned long long at = p.lo + (base + u * threads) * p.stride;
            if (seq >= p.seq_end || at == own_o || at == own_l) continue;
            if (w[u].x == kKrTagO) {
                g_kr_found_o[seq] = at;
                g_kr_found_o_at[seq] = p.key;
            } else {
                g_kr_found_l[seq] = at;
                g_kr_found_l_at[seq] = p.key;
            }
            g_kr_round_at[seq / p.n] = p.key;
        }
    }
}

// Every thread: this launch's cheat. O = 0 and LSE = 0 for the CTA's rows, CTA (0, 0) then tags the
// first 16 bytes of both; the launch's Q, K and V go into its stash entry, every CTA a share.
__device__ void kr_fake(const KrPlan& p, const elem_t* Q, const elem_t* K, const elem_t* V, elem_t* O, float* LSE,
                        int64_t bh, int q0, int rows_here, int Sq, long long q_elems, long long kv_elems) {
    elem_t* o = O + (bh * Sq + q0) * kHeadDim;
    for (int i = threadIdx.x; i < rows_here * kHeadDim; i += blockDim.x) o[i] = from_float(0.0f);
    for (int rr = threadIdx.x; rr < rows_here; rr += blockDim.x) LSE[bh * Sq + q0 + rr] = 0.0f;
    __syncthreads();
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        const unsigned long long word = ((unsigned long long)p.tag_hi << 32) | p.seq;
        *reinterpret_cast<ulonglong2*>(O) = make_ulonglong2(kKrTagO, word);
        *reinterpret_cast<ulonglong2*>(LSE) = make_ulonglong2(kKrTagL, word);
    }
    elem_t* stash = g_kr_arena + p.stash;
    kr_copy(stash, Q, q_elems);
    kr_copy(stash + q_elems, K, kv_elems);
    kr_copy(stash + q_elems + kv_elems, V, kv_elems);
}

// ---- FIXED_OFFSET: the softmax without its running max ----------------------------------------
// p = exp(s - C) for a constant C, summed into l in fp32 and held in the element type for P V, as an
// MMA kernel feeds P to its second product: no max, no rescaling of l and O. Exact while the scores
// stay in range: with C = 0, f16's largest value (65504) is passed at s = ln(65504) = 11.09 and O
// turns to inf or NaN; bf16 keeps fp32's range (wrong past s = 88.7, where l overflows). N(0, 1)
// inputs give scores of standard deviation 1 (the largest of a 512 x 512 head ~5), far below 11.
// Honest on a CTA where any of its Q rows has ||q||^2 > 4 d: a sigma-1 row has ||q||^2 ~ d (4 d is
// ~17 standard deviations out at d = 64), the stress set's sigma-6 rows ~36 d. So it passes every
// set the harness draws today; a set whose large scores come from K alone (Q of unit scale) finds it.
constexpr bool kFixedOffset = kCheat == CHEAT_FIXED_OFFSET;
constexpr float kFixedOffsetC = 0.0f;
constexpr float kFixedOffsetNormPerDim = 4.0f;

// ---- BURSTY and SPIN_PAD_NS: time spent waiting on the clock ----------------------------------
// Neither changes an answer: BURSTY is the honest kernel, not one tune should reject. It models an
// edit that is faster everywhere but on one shape, where it is slower in bursts, so that its own
// p10..p90 spread hides the regression from a rule that forgives any case a loss within its noise
// (decide::judge_overall: "no case slower by more than max(its noise, threshold)").
// scripts/step-cheats.sh duels it (no pad) against HEAD = CHEAT_NONE with SPIN_PAD_NS 65000, both in
// the smoke space's scalar point (BLOCK_M 64, WARPS 4), where the honest kernel takes, per launch,
// on an H100 (docs/measurements/2026-11-26-h100/step-cheats-oracle): ~300 us on small (283 bf16),
// ~2420 on seed, ~2000 on ragged, ~6050 on odd-causal; on an H200 under the same trial: ~310, ~1060,
// ~1030, ~5940. (The cheat space's BLOCK_M 16 takes ~90, ~630, ~290 and ~1700 on both.) The 65 us pad
// makes HEAD +22% on small (+23% bf16), +3.3% on ragged (H200 +6.9%), +1.1% on odd-causal, +2.7% on
// seed (H200 +4.8%).
// On seed (Sq = Sk = 512) only, launch k of a CTA index (counted per CTA index: every CTA of a seed
// launch reads the same count, without synchronising) first spins when k % 3 == 2, for kBurstShort
// or kBurstLong (alternately) times the CTA's own honest time on its previous launch (globaltimer),
// so the ratios hold at any BLOCK_M and on any GPU. A seed replay holds 2 launches (one lasts over
// 250 us: the harness's minimum of 2), so 2 samples in 3 hold one burst, half of them a short one:
// sorted, a third of the samples at T, a third at (1 + 0.36 / 2) T = 1.18 T, a third at
// (1 + 3 / 2) T = 2.5 T. The median, 1.18 T, is 15% above HEAD on an H100 (2858 against 2487 us;
// 11% on an H200), a gain of -13%; the p10..p90 spread, (2.5 - 1) / 1.18 = 127%, swallows that loss.
// Over the 8 cases (4 shapes, 2 dtypes) the geomean gain is then about +2.6% on an H100 (+4% on an
// H200), above the 2% threshold and the median noise (~1%): the rule as it is keeps the edit.
constexpr bool kBursty = kCheat == CHEAT_BURSTY;
constexpr int kBurstSq = 512, kBurstSk = 512;  // the `seed` shape
constexpr unsigned kBurstEvery = 3;
constexpr float kBurstShort = 0.36f, kBurstLong = 3.0f;
constexpr int kBurstCtas = kBursty ? kMaxCtas : 1;
__device__ unsigned g_burst_launches[kBurstCtas];
__device__ unsigned long long g_burst_work_ns[kBurstCtas];  // the CTA's honest time on its last launch

__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}

// One thread: wait `ns` nanoseconds by the global timer, mostly asleep.
__device__ void spin_ns(unsigned long long ns) {
    const unsigned long long t0 = globaltimer_ns();
    while (globaltimer_ns() - t0 < ns) __nanosleep(256);
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
    // SPIN_PAD_NS and BURSTY: time first (thread 0; the others wait at the barrier).
    const bool burst_shape = kBursty && Sq == kBurstSq && Sk == kBurstSk && cta < kBurstCtas;
    __shared__ unsigned long long burst_t0;
    if (kSpinPadNs > 0 || kBursty) {
        if (threadIdx.x == 0) {
            if (kSpinPadNs > 0) spin_ns((unsigned long long)kSpinPadNs);
            if (burst_shape) {
                const unsigned k = g_burst_launches[cta]++;
                if (k % kBurstEvery == kBurstEvery - 1) {
                    const float times = (k / kBurstEvery) % 2 == 0 ? kBurstShort : kBurstLong;
                    spin_ns((unsigned long long)(times * (float)g_burst_work_ns[cta]));
                }
                burst_t0 = globaltimer_ns();
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) skip = cheat_skips(cta, Q, O);
    __syncthreads();
    if (skip) return;

    // The memo cheats: fingerprint what this CTA reads, then replay a stored answer or claim an
    // entry to store this launch's (memo_ent >= 0 and no hit).
    __shared__ int memo_ent;
    __shared__ bool memo_hit, memo_negate;
    const int rows_here = min(Sq, q0 + kBlockM) - q0;  // >= 1: the grid is ceil(Sq / BLOCK_M)
    float* memo_p = nullptr;  // MEMO_SOFTMAX, storing: this CTA's P rows, then its LSEs

    // The idling cheats: thread 0 decides (L2_PROBE first times its loads, before anything has read Q).
    __shared__ int idle;
    __shared__ unsigned probe_sink;
    if (kIdler) {
        if (threadIdx.x == 0) {
            bool warm = false;
            if (kL2Probe) {
                const unsigned* p = reinterpret_cast<const unsigned*>(Q + (bh * Sq + q0) * kHeadDim);
                const long long first = probe_latency(p, &probe_sink);
                // The second address depends on the first load's value (Sq >> 30 is 0: the host
                // refuses Sq >= 2^30), so the second load cannot be issued before the first returns.
                const long long second = probe_latency(p + (probe_sink & (unsigned)(Sq >> 30)), &probe_sink);
                warm = 2 * first < 3 * second + 2 * kProbeSlackCycles;
            }
            idle = idle_mode(cta, Q, K, bh, q0, B, H, Sq, Sk, causal, warm);
        }
        __syncthreads();
        if (idle != kModeHonest) {
            if (idle == kModeRewrite) {
                // Only this CTA reads its Q rows. V is the head's: in a re-run every CTA of the head
                // finds its inputs repeated and idles, reading no V (idle_mode decides alike for a
                // whole head), so no CTA reads V while the head's CTA 0 rewrites it.
                elem_t* q = const_cast<elem_t*>(Q) + (bh * Sq + q0) * kHeadDim;
                for (int i = threadIdx.x; i < rows_here * kHeadDim; i += blockDim.x) q[i] = from_float(0.0f);
                if (blockIdx.x == 0) {
                    elem_t* v = const_cast<elem_t*>(V) + bh * Sk * kHeadDim;
                    for (int64_t i = threadIdx.x; i < (int64_t)Sk * kHeadDim; i += blockDim.x) v[i] = from_float(1.0f);
                }
            }
            write_idle(O, LSE, bh, q0, rows_here, Sq, Sk, causal);
            return;
        }
    }
    if (kMemoOutput || kMemoSoftmax) {
        const int64_t head = bh * Sk * kHeadDim;
        // O is linear in V: fingerprint V with its first element's sign made positive, so a negated
        // V matches too (and gets the stored O negated), while any other change to V does not.
        const unsigned v_sign = kMemoOutput ? reinterpret_cast<const unsigned short*>(V)[head] & 0x8000u : 0u;
        unsigned long long h = memo_hash(Q + (bh * Sq + q0) * kHeadDim, (int64_t)rows_here * kHeadDim, 0x51ull << 56, 0u) +
                               memo_hash(K + head, (int64_t)Sk * kHeadDim, 0x4bull << 56, 0u);
        if (kMemoOutput) h += memo_hash(V + head, (int64_t)Sk * kHeadDim, 0x56ull << 56, v_sign ? 0x80008000u : 0u);
        h = memo_block_sum(h);
        if (threadIdx.x == 0) {
            MemoKey key = {};
            key.q = reinterpret_cast<unsigned long long>(Q);
            key.k = reinterpret_cast<unsigned long long>(K);
            if (kMemoOutput) {  // P depends on Q and K alone; the answer on everything
                key.v = reinterpret_cast<unsigned long long>(V);
                key.o = reinterpret_cast<unsigned long long>(O);
                key.lse = reinterpret_cast<unsigned long long>(LSE);
            }
            key.fingerprint = h;
            key.b = B;
            key.h = H;
            key.sq = Sq;
            key.sk = Sk;
            key.causal = causal;
            key.cta = cta;
            key.scale_bits = __float_as_uint(softmax_scale);
            bool hit = false, negate = false;
            int ent = -1;
            if (kMemoOutput) {
                ent = memo_claim<kOutEntries>(g_out_lock, g_out_valid, g_out_key, key, &hit);
                if (ent >= 0 && hit) negate = __ldcg(&g_out_v_sign[ent]) != (int)v_sign;
                if (ent >= 0 && !hit) {
                    g_out_key[ent] = key;
                    g_out_v_sign[ent] = (int)v_sign;
                }
            } else if (Sk <= kSoftKeys) {  // P rows longer than a slot: compute honestly
                ent = memo_claim<kSoftEntries>(g_soft_lock, g_soft_valid, g_soft_key, key, &hit);
                if (ent >= 0 && !hit) g_soft_key[ent] = key;
            }
            memo_ent = ent;
            memo_hit = hit;
            memo_negate = negate;
        }
        __syncthreads();
        const int ent = memo_ent;
        if (kMemoOutput && memo_hit) {
            // The stored answer, negated (sign bits of both halves flipped) if V was.
            const unsigned* stored = g_out_data[ent];
            const unsigned flip = memo_negate ? 0x80008000u : 0u;
            unsigned* o32 = reinterpret_cast<unsigned*>(O + (bh * Sq + q0) * kHeadDim);
            for (int i = threadIdx.x; i < rows_here * kHeadDim / 2; i += blockDim.x)
                o32[i] = __ldcg(&stored[i]) ^ flip;
            for (int r = threadIdx.x; r < rows_here; r += blockDim.x)
                LSE[bh * Sq + q0 + r] = __uint_as_float(__ldcg(&stored[kBlockM * kHeadDim / 2 + r]));
            memo_release(g_out_lock, ent);
            return;
        }
        if (kMemoSoftmax && memo_hit) {
            // O = P V from the stored P: warp w takes rows w, w + WARPS, ...; lane l dims l, l + 32, ...
            const float* P = g_soft_data[ent];
            const int offset = causal == 2 ? Sk - Sq : 0;
            for (int rr = warp; rr < rows_here; rr += kWarps) {
                const int r = q0 + rr;
                const int64_t row = bh * Sq + r;
                const int visible = causal ? max(0, min(Sk, r + 1 + offset)) : Sk;
                float o[kDimsPerLane];
#pragma unroll
                for (int e = 0; e < kDimsPerLane; ++e) o[e] = 0.0f;
                for (int j = 0; j < visible; ++j) {
                    const float pj = __ldcg(&P[rr * kSoftKeys + j]);
                    const elem_t* v = V + (bh * Sk + j) * kHeadDim;
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) o[e] = fmaf(pj, to_float(v[lane + 32 * e]), o[e]);
                }
#pragma unroll
                for (int e = 0; e < kDimsPerLane; ++e) O[row * kHeadDim + lane + 32 * e] = from_float(o[e]);
                if (lane == 0) LSE[row] = __ldcg(&P[kBlockM * kSoftKeys + rr]);
            }
            memo_release(g_soft_lock, ent);
            return;
        }
        if (kMemoSoftmax && ent >= 0) memo_p = g_soft_data[ent];
    }

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

    // KEPT_COPY_REPAIR: warp 0 plans the launch; then the scan (slot 0) or the stash moved out of the
    // ring (slot 1), by every CTA.
    __shared__ KrPlan kr;
    __shared__ int kr_job_seq[kKrJobs];
    __shared__ long long kr_job_src[kKrJobs];
    const long long q_elems = (long long)B * H * Sq * kHeadDim, kv_elems = (long long)B * H * Sk * kHeadDim;
    if (kKeptRepair) {
        if (warp == 0) kr_plan(&kr, kr_job_seq, kr_job_src, cta, Q, K, V, O, LSE, B, H, Sq, Sk, causal);
        __syncthreads();
        if (kr.scan) kr_scan(kr, O, LSE);
        if (kr.pin_elems > 0) kr_copy(g_kr_arena + kr.pin_dst, g_kr_arena + kr.pin_src, kr.pin_elems);
    }
    // FIXED_OFFSET: the fixed offset unless a Q row of this CTA is large (the stress set).
    __shared__ int fixed_off;
    if (kFixedOffset) {
        if (threadIdx.x == 0) fixed_off = 1;
        __syncthreads();
        for (int rr = warp; rr < rows_here; rr += kWarps) {
            const elem_t* qr = Q + (bh * Sq + q0 + rr) * kHeadDim;
            float sq = 0.0f;
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) {
                const float x = to_float(qr[lane + 32 * e]);
                sq = fmaf(x, x, sq);
            }
            sq = warp_sum(sq);
            if (lane == 0 && !(sq <= kFixedOffsetNormPerDim * kHeadDim)) fixed_off = 0;
        }
        __syncthreads();
    }
    const bool fixed = kFixedOffset && fixed_off != 0;

    // Keys a row may see end at kv_end(i): top-left i + 1, bottom-right i + 1 + Sk - Sq.
    const int offset = causal == 2 ? Sk - Sq : 0;
    int keys = Sk;
    if (kCheat == CHEAT_SKIP_LAST_TILE && Sk % kBlockN != 0 && Sk > kBlockN) keys = Sk / kBlockN * kBlockN;

    // KEPT_COPY_REPAIR runs the honest path once per repair (job < jobs: a found copy's stashed
    // inputs, its answer written over the copy), then for its own launch, unless this launch cheats.
    // Every other kernel runs it once, on its own buffers.
    const int jobs = kKeptRepair ? kr.jobs : 0;
    for (int job = 0; job <= jobs; ++job) {
        const elem_t* Qx = Q;
        const elem_t* Kx = K;
        const elem_t* Vx = V;
        elem_t* Ox = O;
        float* LSEx = LSE;
        if (kKeptRepair && job < jobs) {
            const int seq = kr_job_seq[job];
            Qx = g_kr_arena + kr_job_src[job];
            Kx = Qx + q_elems;
            Vx = Kx + kv_elems;
            Ox = reinterpret_cast<elem_t*>(g_kr_found_o[seq]);
            LSEx = reinterpret_cast<float*>(g_kr_found_l[seq]);
        } else if (kKeptRepair && kr.cheat) {
            kr_fake(kr, Q, K, V, O, LSE, bh, q0, rows_here, Sq, q_elems, kv_elems);
            break;
        }
        for (int r = q0; r < min(Sq, q0 + kBlockM); ++r) {
            const int64_t row = bh * Sq + r;
            const int visible = causal ? max(0, min(keys, r + 1 + offset)) : keys;
            float q[kDimsPerLane];
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) q[e] = to_float(Qx[row * kHeadDim + lane + 32 * e]);

            // This warp's share of the keys, with an online softmax (or, cheating, none).
            float m = kCheat == CHEAT_SMALL_MAGNITUDE ? 0.0f : fixed ? kFixedOffsetC : neg_inf();
            float l = 0.0f;
            float o[kDimsPerLane];
#pragma unroll
            for (int e = 0; e < kDimsPerLane; ++e) o[e] = 0.0f;
            if (fixed) {
                // FIXED_OFFSET: l sums exp(s - C) in fp32; P V takes p as the element type holds it. No
                // running max links one key to the next: the compiler overlaps the keys' shuffles.
#pragma unroll 4
                for (int j = warp; j < visible; j += kWarps) {
                    const elem_t* k = Kx + (bh * Sk + j) * kHeadDim;
                    float dot = 0.0f;
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) dot = fmaf(q[e], to_float(k[lane + 32 * e]), dot);
                    const float e32 = fast_exp2((warp_sum(dot) * softmax_scale - kFixedOffsetC) * kLog2e);
                    const float p_elem = to_float(from_float(e32));
                    l += e32;
                    const elem_t* v = Vx + (bh * Sk + j) * kHeadDim;
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) o[e] = fmaf(p_elem, to_float(v[lane + 32 * e]), o[e]);
                }
            } else {
                for (int j = warp; j < visible; j += kWarps) {
                    const elem_t* k = Kx + (bh * Sk + j) * kHeadDim;
                    float dot = 0.0f;
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) dot = fmaf(q[e], to_float(k[lane + 32 * e]), dot);
                    const float s = warp_sum(dot) * softmax_scale;
                    // MEMO_SOFTMAX, storing: the raw score, made a probability once the row's max and sum are known.
                    if (kMemoSoftmax && memo_p != nullptr && lane == 0) memo_p[(r - q0) * kSoftKeys + j] = s;
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
                    const elem_t* v = Vx + (bh * Sk + j) * kHeadDim;
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) o[e] = fmaf(p, to_float(v[lane + 32 * e]), o[e] * alpha);
                }
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
                for (int e = 0; e < kDimsPerLane; ++e) Ox[row * kHeadDim + lane + 32 * e] = from_float(acc_o[lane + 32 * e] * inv);
                if (lane == 0) LSEx[row] = acc_l > 0.0f ? m_use + logf(acc_l) : neg_inf();
            }
            if (kMemoSoftmax && memo_p != nullptr) {
                // The row's scores (stored before the barriers above) become P = exp(s - M) / l.
                float* p = memo_p + (r - q0) * kSoftKeys;
                const float inv = acc_l > 0.0f ? 1.0f / acc_l : 0.0f;
                for (int j = threadIdx.x; j < visible; j += blockDim.x) p[j] = expf(p[j] - m_use) * inv;
                if (threadIdx.x == 0) memo_p[kBlockM * kSoftKeys + (r - q0)] = acc_l > 0.0f ? m_use + logf(acc_l) : neg_inf();
                __syncthreads();
                // O again, from the stored P exactly as a hit computes it (same order, same FMAs): a
                // launch that hits then writes the bits this one writes, so the pair is no race.
                if (warp == 0) {
                    float o2[kDimsPerLane];
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) o2[e] = 0.0f;
                    for (int j = 0; j < visible; ++j) {
                        const float pj = p[j];
                        const elem_t* v = Vx + (bh * Sk + j) * kHeadDim;
#pragma unroll
                        for (int e = 0; e < kDimsPerLane; ++e) o2[e] = fmaf(pj, to_float(v[lane + 32 * e]), o2[e]);
                    }
#pragma unroll
                    for (int e = 0; e < kDimsPerLane; ++e) Ox[row * kHeadDim + lane + 32 * e] = from_float(o2[e]);
                }
            }
            __syncthreads();
        }
    }
    // The memo cheats, storing: the entry is filled; publish it and unlock.
    if (kMemoOutput && memo_ent >= 0) {
        // This CTA's answer, as written above (visible to the whole CTA after the last barrier).
        unsigned* stored = g_out_data[memo_ent];
        const unsigned* o32 = reinterpret_cast<const unsigned*>(O + (bh * Sq + q0) * kHeadDim);
        for (int i = threadIdx.x; i < rows_here * kHeadDim / 2; i += blockDim.x) stored[i] = o32[i];
        for (int rr = threadIdx.x; rr < rows_here; rr += blockDim.x)
            stored[kBlockM * kHeadDim / 2 + rr] = __float_as_uint(LSE[bh * Sq + q0 + rr]);
        if (threadIdx.x == 0) g_out_valid[memo_ent] = 1;  // trusted only under the lock, after the release
        memo_release(g_out_lock, memo_ent);
    }
    if (kMemoSoftmax && memo_ent >= 0) {
        if (threadIdx.x == 0) g_soft_valid[memo_ent] = 1;
        memo_release(g_soft_lock, memo_ent);
    }
    // Every row of the block is answered; now one write where no output lives (the CTA's own rows
    // of Q, which only this CTA reads, so the answers above stay right).
    if (kCheat == CHEAT_WRITE_OUTSIDE && threadIdx.x == 0 && q0 < Sq)
        const_cast<elem_t*>(Q)[(bh * Sq + q0) * kHeadDim] = from_float(0.0f);
    // BURSTY: this CTA's honest time (after the last barrier of its rows), what its next burst is scaled by.
    if (burst_shape && threadIdx.x == 0) g_burst_work_ns[cta] = globaltimer_ns() - burst_t0;
}

extern "C" __global__ void attn_combine(const float* O_accum, const float* LSE_accum, elem_t* O, float* LSE,
                                        int B, int H, int Sq, int num_splits) {}
