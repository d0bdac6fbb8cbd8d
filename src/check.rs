//! Correctness arithmetic that needs no GPU: input generation, poison patterns, error statistics, the CPU f64 oracle and timing summaries.
use crate::config::{Dtype, Shape, Tolerance};
use crate::protocol::{CheckStats, TimingStats};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use rand_distr::StandardNormal;

/// NaN in both f16 and bf16, and not a pattern arithmetic produces (canonical NaNs are 0x7E00 / 0x7FC0).
pub const POISON_16: u16 = 0xFFFF;
pub const POISON_F32_BITS: u32 = 0xFFFF_FFFF;

pub fn to_bits(dtype: Dtype, x: f32) -> u16 {
    match dtype {
        Dtype::F16 => half::f16::from_f32(x).to_bits(),
        Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
    }
}

pub fn from_bits(dtype: Dtype, bits: u16) -> f32 {
    match dtype {
        Dtype::F16 => half::f16::from_bits(bits).to_f32(),
        Dtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
    }
}

/// Standard-normal values rounded to `dtype`, as the bits to upload. Generated in fixed-size chunks
/// with their own seeds, on every core: the same `(seed, tensor)` gives the same bits on any machine.
pub fn random_bits(dtype: Dtype, len: usize, seed: u64, tensor: u64) -> Vec<u16> {
    const CHUNK: usize = 1 << 18;
    let mut bits = vec![0u16; len];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunks: Vec<(usize, &mut [u16])> = bits.chunks_mut(CHUNK).enumerate().collect();
    let per_thread = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [u16])>> = Vec::new();
    let mut chunks = chunks.into_iter().peekable();
    while chunks.peek().is_some() {
        groups.push(chunks.by_ref().take(per_thread).collect());
    }
    std::thread::scope(|scope| {
        for group in groups {
            scope.spawn(move || {
                for (index, chunk) in group {
                    let mut rng = SmallRng::seed_from_u64(
                        seed ^ tensor.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
                    );
                    for x in chunk.iter_mut() {
                        *x = to_bits(dtype, rng.sample::<f32, _>(StandardNormal));
                    }
                }
            });
        }
    });
    bits
}

/// The exact values a bit pattern holds.
pub fn values(dtype: Dtype, bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| from_bits(dtype, b)).collect()
}

/// Compare the forward output (raw bits) and LSE with the fp32 reference.
pub fn compare(
    dtype: Dtype,
    out_bits: &[u16],
    lse: &[f32],
    ref_out: &[f32],
    ref_lse: &[f32],
) -> CheckStats {
    let mut s = CheckStats {
        elements: out_bits.len() as u64,
        ..Default::default()
    };
    let (mut diff2, mut ref2) = (0.0f64, 0.0f64);
    for (&bits, &r) in out_bits.iter().zip(ref_out) {
        if bits == POISON_16 {
            s.unwritten_count += 1;
            continue;
        }
        let o = from_bits(dtype, bits) as f64;
        if !o.is_finite() {
            s.nan_count += 1;
            continue;
        }
        let d = (o - r as f64).abs();
        s.max_abs = s.max_abs.max(d);
        diff2 += d * d;
        ref2 += (r as f64) * (r as f64);
    }
    s.rel_l2 = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    for (&l, &r) in lse.iter().zip(ref_lse) {
        if l.to_bits() == POISON_F32_BITS {
            s.unwritten_count += 1;
        } else if l == f32::NEG_INFINITY && r == f32::NEG_INFINITY {
            // A row the mask hides entirely (bottom-right, Sq > Sk): both sides say "no key".
        } else if !l.is_finite() {
            s.nan_count += 1;
        } else {
            s.lse_max_abs = s.lse_max_abs.max((l as f64 - r as f64).abs());
        }
    }
    s
}

/// Fill `stats.failures` with every gate the case misses; never loosened, never retried.
pub fn judge(stats: &mut CheckStats, tol: &Tolerance, reference_limit_rel_l2: f64) {
    let mut f = Vec::new();
    if stats.unwritten_count > 0 {
        f.push(format!("{} outputs never written", stats.unwritten_count));
    }
    if stats.nan_count > 0 {
        f.push(format!("{} NaN/inf outputs", stats.nan_count));
    }
    if stats.nondeterministic_count > 0 {
        f.push(format!(
            "{} outputs differ between two runs on the same inputs (race)",
            stats.nondeterministic_count
        ));
    }
    if stats.max_abs > tol.max_abs {
        f.push(format!(
            "max abs error {:.3e} > {:.1e}",
            stats.max_abs, tol.max_abs
        ));
    }
    if stats.rel_l2 > tol.rel_l2 {
        f.push(format!(
            "relative L2 error {:.3e} > {:.1e}",
            stats.rel_l2, tol.rel_l2
        ));
    }
    if stats.lse_max_abs > tol.lse_max_abs {
        f.push(format!(
            "LSE max abs error {:.3e} > {:.1e}",
            stats.lse_max_abs, tol.lse_max_abs
        ));
    }
    if let Some(r) = stats.reference_vs_cpu_rel_l2 {
        if r.is_nan() || r > reference_limit_rel_l2 {
            f.push(format!(
                "fp32 reference kernel disagrees with the CPU f64 oracle: rel L2 {r:.3e}"
            ));
        }
    }
    stats.failures = f;
}

/// f64 attention on the exact input values; O is [b,h,sq,d], LSE is [b,h,sq]. A row the mask
/// hides entirely (bottom-right with Sq > Sk) has O = 0 and LSE = -inf, as the kernels write it.
pub fn cpu_attention(shape: &Shape, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (sq, sk, d) = (shape.sq as usize, shape.sk as usize, shape.d as usize);
    let heads = shape.heads() as usize;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; shape.q_elements() as usize];
    let mut lse = vec![f64::NEG_INFINITY; shape.rows() as usize];
    let mut scores = vec![0.0f64; sk];
    for bh in 0..heads {
        for i in 0..sq {
            // Keys 0..visible: every mask admits a prefix of the keys.
            let visible = shape.visible_keys(i as u32) as usize;
            if visible == 0 {
                continue;
            }
            let qi = &q[(bh * sq + i) * d..][..d];
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate().take(visible) {
                let kj = &k[(bh * sk + j) * d..][..d];
                *s = qi
                    .iter()
                    .zip(kj)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale;
                max = max.max(*s);
            }
            let mut sum = 0.0;
            let o = &mut out[(bh * sq + i) * d..][..d];
            for (j, s) in scores.iter().enumerate().take(visible) {
                let p = (s - max).exp();
                sum += p;
                let vj = &v[(bh * sk + j) * d..][..d];
                for (oc, &vc) in o.iter_mut().zip(vj) {
                    *oc += p * vc as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
            lse[bh * sq + i] = max + sum.ln();
        }
    }
    (out, lse)
}

/// Relative L2 distance of an fp32 result from the f64 oracle.
pub fn rel_l2_f64(got: &[f32], want: &[f64]) -> f64 {
    let (mut d2, mut w2) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        d2 += (g as f64 - w).powi(2);
        w2 += w * w;
    }
    if w2 > 0.0 {
        (d2 / w2).sqrt()
    } else {
        d2.sqrt()
    }
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

pub fn summarize(samples_us: Vec<f64>, launches_per_sample: u32, flops: f64) -> TimingStats {
    let mut sorted = samples_us.clone();
    sorted.sort_by(f64::total_cmp);
    let median_us = percentile(&sorted, 50.0);
    TimingStats {
        samples_us,
        launches_per_sample,
        median_us,
        p10_us: percentile(&sorted, 10.0),
        p90_us: percentile(&sorted, 90.0),
        tflops: flops / (median_us * 1e-6) / 1e12,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Causal;

    fn tol() -> Tolerance {
        Tolerance {
            max_abs: 1e-2,
            rel_l2: 1e-3,
            lse_max_abs: 1e-3,
        }
    }

    #[test]
    fn poison_is_nan_in_both_dtypes() {
        assert!(from_bits(Dtype::F16, POISON_16).is_nan());
        assert!(from_bits(Dtype::Bf16, POISON_16).is_nan());
        assert!(f32::from_bits(POISON_F32_BITS).is_nan());
    }

    #[test]
    fn unwritten_and_wrong_outputs_fail() {
        let reference = vec![1.0f32, 2.0, 3.0, 4.0];
        let mut out: Vec<u16> = reference.iter().map(|&x| to_bits(Dtype::F16, x)).collect();
        out[2] = POISON_16;
        let mut s = compare(Dtype::F16, &out, &[0.5], &reference, &[0.5]);
        judge(&mut s, &tol(), 1e-5);
        assert_eq!(s.unwritten_count, 1);
        assert!(!s.passed());

        out[2] = to_bits(Dtype::F16, 3.5);
        let mut s = compare(Dtype::F16, &out, &[0.5], &reference, &[0.5]);
        judge(&mut s, &tol(), 1e-5);
        assert!(
            s.failures.iter().any(|f| f.contains("max abs")),
            "{:?}",
            s.failures
        );

        out[2] = to_bits(Dtype::F16, 3.0);
        let mut s = compare(Dtype::F16, &out, &[0.5], &reference, &[0.5]);
        judge(&mut s, &tol(), 1e-5);
        assert!(s.passed(), "{:?}", s.failures);
    }

    #[test]
    fn cpu_oracle_matches_a_hand_computed_case() {
        // One query, two keys, d = 64: scores 0 and 8 * 1/8 = 1.
        let shape = Shape {
            name: "t".into(),
            b: 1,
            h: 1,
            sq: 1,
            sk: 2,
            d: 64,
            causal: Causal::None,
        };
        let q = vec![1.0f32; 64];
        let mut k = vec![0.0f32; 128];
        k[64..72].iter_mut().for_each(|x| *x = 1.0);
        let v: Vec<f32> = (0..128).map(|i| if i < 64 { 0.0 } else { 1.0 }).collect();
        let (o, lse) = cpu_attention(&shape, &q, &k, &v);
        let e = std::f64::consts::E;
        assert!((o[0] - e / (1.0 + e)).abs() < 1e-12);
        assert!((lse[0] - (1.0 + e).ln()).abs() < 1e-12);
    }

    #[test]
    fn causal_first_row_sees_only_key_zero() {
        let shape = Shape {
            name: "t".into(),
            b: 1,
            h: 1,
            sq: 2,
            sk: 2,
            d: 64,
            causal: Causal::TopLeft,
        };
        let [q, k, v] = [0, 1, 2].map(|t| values(Dtype::F16, &random_bits(Dtype::F16, 128, 1, t)));
        let (o, _) = cpu_attention(&shape, &q, &k, &v);
        for c in 0..64 {
            assert!((o[c] - v[c] as f64).abs() < 1e-12);
        }
    }

    fn shape(sq: u32, sk: u32, causal: Causal) -> Shape {
        Shape {
            name: "t".into(),
            b: 1,
            h: 2,
            sq,
            sk,
            d: 64,
            causal,
        }
    }

    fn oracle(shape: &Shape) -> (Vec<f64>, Vec<f64>) {
        let [q, k, v] = [
            (shape.q_elements(), 0),
            (shape.kv_elements(), 1),
            (shape.kv_elements(), 2),
        ]
        .map(|(n, t)| values(Dtype::F16, &random_bits(Dtype::F16, n as usize, 5, t)));
        cpu_attention(shape, &q, &k, &v)
    }

    #[test]
    fn the_two_causal_alignments_differ_when_sq_differs_from_sk() {
        for (sq, sk) in [(3, 7), (7, 3)] {
            let top_left = oracle(&shape(sq, sk, Causal::TopLeft));
            let bottom_right = oracle(&shape(sq, sk, Causal::BottomRight));
            assert_ne!(top_left, bottom_right, "Sq = {sq}, Sk = {sk}");
        }
        let square = |causal| oracle(&shape(5, 5, causal));
        assert_eq!(square(Causal::TopLeft), square(Causal::BottomRight));
    }

    #[test]
    fn bottom_right_decode_row_sees_every_key() {
        // Sq = 1 < Sk: the one query is the last position, so it attends to all keys, unmasked.
        let masked = oracle(&shape(1, 9, Causal::BottomRight));
        assert_eq!(masked, oracle(&shape(1, 9, Causal::None)));
        // Top-left lets it see key 0 only: its output is V's first row.
        let top_left = oracle(&shape(1, 9, Causal::TopLeft));
        assert_ne!(masked, top_left);
    }

    #[test]
    fn rows_a_bottom_right_mask_hides_are_zero_with_lse_minus_infinity() {
        // Sq = 7 > Sk = 3: rows 0..4 see no key, row 4 sees key 0, row 6 sees all three.
        let s = shape(7, 3, Causal::BottomRight);
        assert_eq!(
            (0..7).map(|i| s.visible_keys(i)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 2, 3]
        );
        let (o, lse) = oracle(&s);
        for head in 0..2 {
            for row in 0..7 {
                let r = head * 7 + row;
                let hidden = row < 4;
                assert_eq!(lse[r] == f64::NEG_INFINITY, hidden, "row {row}");
                assert!(lse[r].is_finite() || hidden);
                let o_row = &o[r * 64..][..64];
                assert_eq!(o_row.iter().all(|&x| x == 0.0), hidden, "row {row}");
            }
        }
    }

    #[test]
    fn random_inputs_are_reproducible_and_not_degenerate() {
        let a = random_bits(Dtype::Bf16, 1_000_003, 7, 1);
        assert_eq!(a, random_bits(Dtype::Bf16, 1_000_003, 7, 1));
        assert_ne!(a, random_bits(Dtype::Bf16, 1_000_003, 7, 2));
        let v = values(Dtype::Bf16, &a);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.02,
            "mean {mean} var {var}"
        );
        // Chunks differ from each other (no repeated seed per chunk).
        assert_ne!(a[..1000], a[1 << 18..(1 << 18) + 1000]);
    }

    #[test]
    fn percentiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&s, 50.0), 3.0);
        assert!((percentile(&s, 10.0) - 1.4).abs() < 1e-12);
    }
}
