// The fp32 oracle every forward variant is checked against: one warp per query row, online
// softmax over chunks of 32 keys (one key per lane), plain expf/logf, fp32 output and LSE.
// Deliberately simple and slow; it must not share tricks (exp2, tiling) with what it judges.
#include "common.cuh"

constexpr int kRefRowsPerBlock = 4;
constexpr int kRefThreads = 128;
constexpr int kRefMaxDim = 256;
static_assert(kRefThreads == kRefRowsPerBlock * 32, "one warp per query row");
constexpr int kRefMaxDimsPerLane = kRefMaxDim / 32;

// Launch: block = 128, grid = (ceil(Sq / 4), B * H, 1), no dynamic shared memory.
extern "C" __global__ void __launch_bounds__(kRefThreads)
attn_reference(const elem_t* __restrict__ Q, const elem_t* __restrict__ K,
               const elem_t* __restrict__ V, float* __restrict__ O, float* __restrict__ LSE,
               int B, int H, int Sq, int Sk, int D, float softmax_scale, int causal) {
    // The head dim is a runtime value here; a bad one must fail loudly, not read out of bounds.
    if (D < 32 || D > kRefMaxDim || D % 32 != 0) __trap();

    // Static, not dynamic: the host launches the oracle with no shared-memory argument.
    __shared__ float q_s[kRefRowsPerBlock][kRefMaxDim];

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int i = blockIdx.x * kRefRowsPerBlock + warp;
    const int64_t bh = blockIdx.y;
    if (i >= Sq) return;  // no block-wide barrier below, so a finished warp may leave

    const elem_t* q = Q + (bh * Sq + i) * D;
    const elem_t* Kh = K + bh * Sk * D;
    const elem_t* Vh = V + bh * Sk * D;
    for (int d = lane; d < D; d += 32) q_s[warp][d] = to_float(q[d]);
    __syncwarp();

    // Every mask admits a prefix of the keys, written out here rather than shared with the
    // kernels it judges: 0..i top-left (PyTorch is_causal), 0..i + Sk - Sq bottom-right
    // (causal_lower_right). A bottom-right row with Sq > Sk may see none: the loop below does
    // not run, l stays 0, and the row gets O = 0 and LSE = -inf, the forward kernels' convention.
    int last_key;
    switch (causal) {
        case kCausalNone: last_key = Sk - 1; break;
        case kCausalTopLeft: last_key = i; break;
        case kCausalBottomRight: last_key = i + (Sk - Sq); break;
        default: __trap();
    }
    const int kv_len = max(0, min(Sk, last_key + 1));

    float m = neg_inf();
    float l = 0.0f;
    float acc[kRefMaxDimsPerLane] = {};
    const int dims_per_lane = D / 32;

    for (int c0 = 0; c0 < kv_len; c0 += 32) {
        const int j = c0 + lane;
        const bool valid = j < kv_len;
        float s = neg_inf();
        if (valid) {
            const elem_t* k = Kh + (int64_t)j * D;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d) dot = fmaf(q_s[warp][d], to_float(k[d]), dot);
            s = dot * softmax_scale;
        }
        // Lane 0's key (c0 < kv_len) is always valid, so m_new is finite and m - m_new is
        // either finite or -inf - finite = -inf (expf -> 0): never NaN.
        const float m_new = fmaxf(m, warp_max(s));
        const float alpha = expf(m - m_new);
        const float p = valid ? expf(s - m_new) : 0.0f;
        l = l * alpha + warp_sum(p);
        m = m_new;

        const int n = min(32, kv_len - c0);
#pragma unroll
        for (int e = 0; e < kRefMaxDimsPerLane; ++e) acc[e] *= alpha;
        for (int jj = 0; jj < n; ++jj) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const elem_t* v = Vh + (int64_t)(c0 + jj) * D;
#pragma unroll
            for (int e = 0; e < kRefMaxDimsPerLane; ++e)
                if (e < dims_per_lane) acc[e] = fmaf(pj, to_float(v[lane + 32 * e]), acc[e]);
        }
    }

    // l > 0 whenever a key was seen (the max key contributes exp(0) = 1).
    const bool saw_key = kv_len > 0;
    const float inv_l = saw_key ? 1.0f / l : 0.0f;
    float* o = O + (bh * Sq + i) * D;
#pragma unroll
    for (int e = 0; e < kRefMaxDimsPerLane; ++e)
        if (e < dims_per_lane) o[lane + 32 * e] = acc[e] * inv_l;
    if (lane == 0) LSE[bh * Sq + i] = saw_key ? m + logf(l) : neg_inf();
}
