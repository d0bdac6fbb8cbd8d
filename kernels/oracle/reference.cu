// The fp32 oracle every forward variant is checked against. A CTA owns 64 query rows of one
// (batch, head) and walks the keys in tiles of 64 with an online softmax: plain fp32 FMAs, expf
// and logf, fp32 output and LSE. It tiles through shared memory only to be fast enough to run on
// every freshly drawn input set; it must not share tricks (exp2, tensor cores, half arithmetic)
// with what it judges. Its own results are checked against a CPU f64 oracle on sampled rows.
//
// Launch contract: block = kRefThreads = 256 threads, grid = (ceil(Sq / kRefRowsPerBlock), B * H, 1)
// with kRefRowsPerBlock = 64, static shared memory only (about 35 KB; no dynamic shared memory),
// for every head dim D in 32, 64, ..., 256 (a runtime argument; anything else traps). Q, K and V
// must be 16-byte aligned (they are read 8 elements at a time; a misaligned pointer traps).
//
// Per key tile: the scores S = Q K^T of the CTA's 64 rows x 64 keys are summed over D in chunks of
// 32 dims staged (as fp32) in shared memory; thread (ty, tx) of a 16 x 16 grid keeps the scores of
// rows 4 ty .. 4 ty + 3 and keys tx, tx + 16, tx + 32, tx + 48 in registers (each dot product runs
// over d in order, as in a plain loop). The 16 threads of a row group are 16 aligned lanes of one
// warp, so row max and row sum are 16-lane shuffles. The probabilities go to shared memory, and
// O += P V runs over V in the same 32-dim chunks: the thread owns dims 32 c + 2 tx, 32 c + 2 tx + 1
// of chunk c for its 4 rows (64 fp32 accumulators at D = 256), written once at the end.
#include "oracle.cuh"

constexpr int kRefRowsPerBlock = 64;  // query rows per CTA (the grid's x)
constexpr int kRefThreads = 256;      // threads per CTA
constexpr int kRefKeysPerTile = 64;   // keys per pass of the online softmax
constexpr int kRefChunk = 32;         // head dims staged in shared memory at a time
constexpr int kRefMaxDim = 256;
constexpr int kRefMaxChunks = kRefMaxDim / kRefChunk;
constexpr int kRefTx = 16;  // threads across the keys (scores) and the dims (output)
constexpr int kRefTy = kRefThreads / kRefTx;                  // row groups
constexpr int kRefRowsPerThread = kRefRowsPerBlock / kRefTy;  // 4
constexpr int kRefKeysPerThread = kRefKeysPerTile / kRefTx;   // 4
constexpr int kRefDimsPerThread = kRefChunk / kRefTx;         // 2 per chunk
constexpr int kRefStageElems = 8;  // elements one thread stages per 64 x 32 tile (16 bytes)
// Row strides in floats. 36 = 4 mod 32: the 8 rows a quarter-warp reads with float4 loads land
// on distinct banks. 68: two row groups 4 rows apart sit 16 banks apart.
constexpr int kRefChunkStride = kRefChunk + 4;
constexpr int kRefProbStride = kRefKeysPerTile + 4;

static_assert(kRefThreads == kRefTx * kRefTy, "a 16 x 16 thread grid");
static_assert(kRefTx == 16, "row reductions are 16-lane shuffles: a row group is half a warp");
static_assert(kRefRowsPerThread * kRefTy == kRefRowsPerBlock && kRefRowsPerThread == 4, "4 rows per thread");
static_assert(kRefKeysPerThread * kRefTx == kRefKeysPerTile && kRefKeysPerThread == 4, "4 keys per thread");
static_assert(kRefDimsPerThread * kRefTx == kRefChunk && kRefDimsPerThread == 2, "2 dims per thread per chunk");
static_assert(kRefThreads * kRefStageElems == kRefRowsPerBlock * kRefChunk, "one 16-byte load per thread stages a Q chunk");
static_assert(kRefThreads * kRefStageElems == kRefKeysPerTile * kRefChunk, "one 16-byte load per thread stages a K or V chunk");
static_assert(kRefChunk % 4 == 0 && kRefKeysPerTile % 4 == 0, "float4 steps over dims and keys");
static_assert(kRefMaxDim % kRefChunk == 0 && kRefChunk == 32, "D is a multiple of 32, so whole chunks");
static_assert(sizeof(float) * (2 * kRefRowsPerBlock * kRefChunkStride + kRefRowsPerBlock * kRefProbStride) <= 48 * 1024,
              "static shared memory is capped at 48 KB");

// One element's 16 bits widened to fp32 (exact for both types).
__device__ __forceinline__ float ref_bits_to_float(unsigned bits) {
#if DTYPE == DTYPE_BF16
    return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits)));
#else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#endif
}

// Staging goes through registers so that the next chunk's global loads are in flight while the
// current chunk is computed: ref_load8 reads 8 consecutive elements (16 bytes), or zeros where the
// row does not exist (src is then never read; zero bits are 0.0 in both types), and ref_store8
// widens them to fp32 into dst[0..7].
__device__ __forceinline__ uint4 ref_load8(const elem_t* src, bool exists) {
    return exists ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ void ref_store8(float* dst, uint4 raw) {
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
    float f[kRefStageElems];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[2 * k] = ref_bits_to_float(w[k] & 0xffffu);  // the lower address is the low half
        f[2 * k + 1] = ref_bits_to_float(w[k] >> 16);
    }
    reinterpret_cast<float4*>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// How many keys query row i sees: every mask admits a prefix, written out here rather than shared
// with the kernels it judges: 0..i top-left (PyTorch is_causal), 0..i + Sk - Sq bottom-right
// (causal_lower_right), all Sk with no mask. A bottom-right row with Sq > Sk may see none. Rows
// past Sq (the last CTA's tail) see none and are never written.
__device__ __forceinline__ int ref_visible_keys(int i, int Sq, int Sk, int causal) {
    if (i >= Sq) return 0;
    int last_key;
    switch (causal) {
        case kCausalNone: last_key = Sk - 1; break;
        case kCausalTopLeft: last_key = i; break;
        case kCausalBottomRight: last_key = i + (Sk - Sq); break;  // Sq, Sk < 2^30: no overflow
        default: __trap();
    }
    return max(0, min(Sk, last_key + 1));
}

extern "C" __global__ void __launch_bounds__(kRefThreads, 1)
attn_reference(const elem_t* __restrict__ Q, const elem_t* __restrict__ K,
               const elem_t* __restrict__ V, float* __restrict__ O, float* __restrict__ LSE,
               int B, int H, int Sq, int Sk, int D, float softmax_scale, int causal) {
    // The head dim is a runtime value here; a bad one must fail loudly, not read out of bounds.
    if (D < 32 || D > kRefMaxDim || D % kRefChunk != 0) __trap();
    if (causal != kCausalNone && causal != kCausalTopLeft && causal != kCausalBottomRight) __trap();
    if (((reinterpret_cast<uintptr_t>(Q) | reinterpret_cast<uintptr_t>(K) | reinterpret_cast<uintptr_t>(V)) & 15) != 0)
        __trap();

    // Static, not dynamic: the host launches the oracle with no shared-memory argument.
    __shared__ __align__(16) float q_s[kRefRowsPerBlock][kRefChunkStride];   // Q chunk
    __shared__ __align__(16) float kv_s[kRefKeysPerTile][kRefChunkStride];   // K chunk, then V chunk
    __shared__ __align__(16) float p_s[kRefRowsPerBlock][kRefProbStride];    // probabilities of the tile

    const int tid = threadIdx.x;
    const int tx = tid % kRefTx;  // keys tx + 16 c; dims 32 c + 2 tx (+1)
    const int ty = tid / kRefTx;  // rows 4 ty .. 4 ty + 3 of the CTA
    const int64_t bh = blockIdx.y;
    const int q0 = blockIdx.x * kRefRowsPerBlock;
    const int nchunks = D / kRefChunk;
    const elem_t* Qh = Q + bh * Sq * D;
    const elem_t* Kh = K + bh * Sk * D;
    const elem_t* Vh = V + bh * Sk * D;

    int vis[kRefRowsPerThread];  // keys each of this thread's rows sees
#pragma unroll
    for (int r = 0; r < kRefRowsPerThread; ++r) vis[r] = ref_visible_keys(q0 + ty * kRefRowsPerThread + r, Sq, Sk, causal);
    // Visible prefixes grow with i, so the CTA's last real row sees the most keys.
    const int cta_keys = ref_visible_keys(min(Sq, q0 + kRefRowsPerBlock) - 1, Sq, Sk, causal);

    float m[kRefRowsPerThread], l[kRefRowsPerThread];
    float acc[kRefRowsPerThread][kRefMaxChunks][kRefDimsPerThread];
#pragma unroll
    for (int r = 0; r < kRefRowsPerThread; ++r) {
        m[r] = neg_inf();
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < kRefMaxChunks; ++c)
#pragma unroll
            for (int e = 0; e < kRefDimsPerThread; ++e) acc[r][c][e] = 0.0f;
    }

    // Staging: thread tid copies row (or key) tid / 4, dims 8 (tid % 4) .. + 7 of a 64 x 32 chunk.
    // Rows past Sq and keys past Sk are staged as zeros (and masked below).
    const int st_row = tid / 4;
    const int st_col = (tid % 4) * kRefStageElems;
    const int st_q = q0 + st_row;
    auto load_q = [&](int ch) {
        return ref_load8(Qh + (int64_t)st_q * D + ch * kRefChunk + st_col, st_q < Sq);
    };
    auto load_k = [&](int k0, int ch) {
        const int j = k0 + st_row;
        return ref_load8(Kh + (int64_t)j * D + ch * kRefChunk + st_col, j < Sk);
    };
    auto load_v = [&](int k0, int ch) {
        const int j = k0 + st_row;
        return ref_load8(Vh + (int64_t)j * D + ch * kRefChunk + st_col, j < Sk);
    };

    // The next chunk to stage, loaded one step ahead: Q and K chunks for the scores, then V chunks
    // (in raw_kv) for the output, then the next tile's first Q and K chunks.
    uint4 raw_q = make_uint4(0u, 0u, 0u, 0u), raw_kv = make_uint4(0u, 0u, 0u, 0u);
    if (cta_keys > 0) {
        raw_q = load_q(0);
        raw_kv = load_k(0, 0);
    }

    for (int k0 = 0; k0 < cta_keys; k0 += kRefKeysPerTile) {
        // ---- S = Q K^T for 64 rows x 64 keys, summed over D one 32-dim chunk at a time ----
        float s[kRefRowsPerThread][kRefKeysPerThread];
#pragma unroll
        for (int r = 0; r < kRefRowsPerThread; ++r)
#pragma unroll
            for (int c = 0; c < kRefKeysPerThread; ++c) s[r][c] = 0.0f;

        for (int ch = 0; ch < nchunks; ++ch) {
            ref_store8(&q_s[st_row][st_col], raw_q);
            ref_store8(&kv_s[st_row][st_col], raw_kv);
            __syncthreads();
            if (ch + 1 < nchunks) {
                raw_q = load_q(ch + 1);
                raw_kv = load_k(k0, ch + 1);
            } else {
                raw_kv = load_v(k0, 0);
            }
#pragma unroll
            for (int d = 0; d < kRefChunk; d += 4) {
                float4 kv[kRefKeysPerThread];
#pragma unroll
                for (int c = 0; c < kRefKeysPerThread; ++c)
                    kv[c] = *reinterpret_cast<const float4*>(&kv_s[tx + kRefTx * c][d]);
#pragma unroll
                for (int r = 0; r < kRefRowsPerThread; ++r) {
                    const float4 qv = *reinterpret_cast<const float4*>(&q_s[ty * kRefRowsPerThread + r][d]);
#pragma unroll
                    for (int c = 0; c < kRefKeysPerThread; ++c) {
                        s[r][c] = fmaf(qv.x, kv[c].x, s[r][c]);
                        s[r][c] = fmaf(qv.y, kv[c].y, s[r][c]);
                        s[r][c] = fmaf(qv.z, kv[c].z, s[r][c]);
                        s[r][c] = fmaf(qv.w, kv[c].w, s[r][c]);
                    }
                }
            }
            __syncthreads();  // q_s and kv_s are overwritten next
        }

        // ---- online softmax over the tile, row by row ----
        float alpha[kRefRowsPerThread];
#pragma unroll
        for (int r = 0; r < kRefRowsPerThread; ++r) {
            float tile_max = neg_inf();
#pragma unroll
            for (int c = 0; c < kRefKeysPerThread; ++c) {
                const int j = k0 + tx + kRefTx * c;
                s[r][c] = j < vis[r] ? s[r][c] * softmax_scale : neg_inf();
                tile_max = fmaxf(tile_max, s[r][c]);
            }
            tile_max = group_max<kRefTx>(tile_max);
            const float m_new = fmaxf(m[r], tile_max);
            // While a row has seen no key m_new is -inf; subtracting 0 instead keeps every exponent
            // -inf (p = 0, alpha = 0) rather than -inf - -inf = NaN. Otherwise m_new is finite.
            const float m_sub = m_new == neg_inf() ? 0.0f : m_new;
            alpha[r] = expf(m[r] - m_sub);
            float p_sum = 0.0f;
#pragma unroll
            for (int c = 0; c < kRefKeysPerThread; ++c) {
                const float p = expf(s[r][c] - m_sub);
                p_s[ty * kRefRowsPerThread + r][tx + kRefTx * c] = p;
                p_sum += p;
            }
            l[r] = l[r] * alpha[r] + group_sum<kRefTx>(p_sum);
            m[r] = m_new;
        }
#pragma unroll
        for (int r = 0; r < kRefRowsPerThread; ++r)
#pragma unroll
            for (int c = 0; c < kRefMaxChunks; ++c)
#pragma unroll
                for (int e = 0; e < kRefDimsPerThread; ++e) acc[r][c][e] *= alpha[r];

        // ---- O += P V, one 32-dim chunk of V at a time (unrolled: acc needs constant indices) ----
#pragma unroll
        for (int ch = 0; ch < kRefMaxChunks; ++ch) {
            if (ch < nchunks) {  // the same for the whole CTA, so the barriers inside are safe
                // Keys past Sk are zeros (their p is 0 too): no garbage times 0 = NaN.
                ref_store8(&kv_s[st_row][st_col], raw_kv);
                __syncthreads();  // the V chunk, and on the first chunk p_s, are complete
                if (ch + 1 < nchunks) {
                    raw_kv = load_v(k0, ch + 1);
                } else if (k0 + kRefKeysPerTile < cta_keys) {
                    raw_q = load_q(0);
                    raw_kv = load_k(k0 + kRefKeysPerTile, 0);
                }
#pragma unroll 4
                for (int j = 0; j < kRefKeysPerTile; j += 4) {
                    float4 pv[kRefRowsPerThread];
                    float2 vv[4];
#pragma unroll
                    for (int r = 0; r < kRefRowsPerThread; ++r)
                        pv[r] = *reinterpret_cast<const float4*>(&p_s[ty * kRefRowsPerThread + r][j]);
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj)
                        vv[jj] = *reinterpret_cast<const float2*>(&kv_s[j + jj][kRefDimsPerThread * tx]);
#pragma unroll
                    for (int r = 0; r < kRefRowsPerThread; ++r) {
                        float* a = acc[r][ch];
                        a[0] = fmaf(pv[r].x, vv[0].x, a[0]);
                        a[1] = fmaf(pv[r].x, vv[0].y, a[1]);
                        a[0] = fmaf(pv[r].y, vv[1].x, a[0]);
                        a[1] = fmaf(pv[r].y, vv[1].y, a[1]);
                        a[0] = fmaf(pv[r].z, vv[2].x, a[0]);
                        a[1] = fmaf(pv[r].z, vv[2].y, a[1]);
                        a[0] = fmaf(pv[r].w, vv[3].x, a[0]);
                        a[1] = fmaf(pv[r].w, vv[3].y, a[1]);
                    }
                }
                __syncthreads();  // kv_s (and after the last chunk p_s) are overwritten next
            }
        }
    }

    // l >= 1 whenever a key was seen (the running max contributes exp(0) = 1). A row that saw no
    // key gets O = 0 and LSE = -inf, the forward kernels' convention.
#pragma unroll
    for (int r = 0; r < kRefRowsPerThread; ++r) {
        const int i = q0 + ty * kRefRowsPerThread + r;
        if (i >= Sq) continue;
        const bool saw_key = vis[r] > 0;
        const float inv_l = saw_key ? 1.0f / l[r] : 0.0f;
        float* o = O + (bh * Sq + i) * D;
#pragma unroll
        for (int ch = 0; ch < kRefMaxChunks; ++ch)
            if (ch < nchunks)
#pragma unroll
                for (int e = 0; e < kRefDimsPerThread; ++e)
                    o[ch * kRefChunk + kRefDimsPerThread * tx + e] = acc[r][ch][e] * inv_l;
        if (tx == 0) LSE[bh * Sq + i] = saw_key ? m[r] + logf(l[r]) : neg_inf();
    }
}
