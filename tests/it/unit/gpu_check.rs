//! The tests of `src/gpu/check/mod.rs`, through the library (the library has no test target of its own: see Cargo.toml).

use flashtune::gpu::check::*;
use flashtune::model::config::{Causal, Dtype, Shape, Tolerance};
use flashtune::model::protocol::CheckStats;

#[test]
fn the_fast_row_path_gives_the_careful_paths_figures() {
    // Rows with d a multiple of 4 take the lane path when clean; d = 6 always takes the careful one.
    for (d, dtype) in [(64usize, Dtype::F16), (128, Dtype::Bf16), (6, Dtype::F16)] {
        let rows = 50;
        let reference: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let outputs: Vec<u16> = reference
            .iter()
            .enumerate()
            .map(|(i, &r)| to_bits(dtype, r + (i % 7) as f32 * 1e-3))
            .collect();
        let lse = vec![0.5f32; rows];
        let stats = compare(dtype, d, &outputs, &lse, &reference, &lse, &[]);
        let (mut diff2, mut ref2, mut max_abs, mut row_max) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for row in 0..rows {
            let (mut rd, mut rr) = (0.0f64, 0.0f64);
            for e in row * d..(row + 1) * d {
                let r = reference[e] as f64;
                let diff = (from_bits(dtype, outputs[e]) as f64 - r).abs();
                max_abs = max_abs.max(diff);
                rd += diff * diff;
                rr += r * r;
            }
            diff2 += rd;
            ref2 += rr;
            row_max = row_max.max((rd / rr).sqrt());
        }
        assert_eq!(stats.max_abs, max_abs, "d = {d}");
        assert!(
            (stats.rel_l2 - (diff2 / ref2).sqrt()).abs() <= 1e-12 * stats.rel_l2,
            "d = {d}"
        );
        assert!(
            (stats.row_rel_l2_max - row_max).abs() <= 1e-12 * row_max,
            "d = {d}"
        );
        assert!(stats.max_abs > 0.0 && stats.nan_count == 0 && stats.unwritten_count == 0);
        // One poisoned and one infinite output move their rows to the careful path, which counts them.
        let mut marked = outputs.clone();
        marked[3] = POISON_16;
        marked[d + 1] = to_bits(dtype, f32::INFINITY);
        let stats = compare(dtype, d, &marked, &lse, &reference, &lse, &[]);
        assert_eq!((stats.unwritten_count, stats.nan_count), (1, 1), "d = {d}");
    }
}

fn tol() -> Tolerance {
    Tolerance {
        max_abs: 1e-2,
        rel_l2: 1e-3,
        row_rel_l2: 1e-2,
        lse_max_abs: 1e-3,
    }
}

fn shape(sq: u32, sk: u32, causal: Causal) -> Shape {
    crate::common::shape(1, 1, sq, sk, 64, causal)
}

fn two_heads(sq: u32, sk: u32, causal: Causal) -> Shape {
    Shape {
        h: 2,
        ..shape(sq, sk, causal)
    }
}

fn oracle(shape: &Shape) -> (Vec<f64>, Vec<f64>) {
    let [q, k, v] = [
        (shape.q_elements(), 0),
        (shape.kv_elements(), 1),
        (shape.kv_elements(), 2),
    ]
    .map(|(n, t)| values(Dtype::F16, &random_bits(Dtype::F16, n as usize, 5, t, 1.0)));
    cpu_attention(shape, &q, &k, &v)
}

#[test]
fn the_two_causal_alignments_differ_when_sq_differs_from_sk() {
    for (sq, sk) in [(3, 7), (7, 3)] {
        let top_left = oracle(&two_heads(sq, sk, Causal::TopLeft));
        let bottom_right = oracle(&two_heads(sq, sk, Causal::BottomRight));
        assert_ne!(top_left, bottom_right, "Sq = {sq}, Sk = {sk}");
    }
    let square = |causal| oracle(&two_heads(5, 5, causal));
    assert_eq!(square(Causal::TopLeft), square(Causal::BottomRight));
}

#[test]
fn bottom_right_decode_row_sees_every_key() {
    // Sq = 1 < Sk: the one query is the last position, so it attends to all keys, unmasked.
    let masked = oracle(&two_heads(1, 9, Causal::BottomRight));
    assert_eq!(masked, oracle(&two_heads(1, 9, Causal::None)));
    // Top-left lets it see key 0 only: its output is V's first row.
    let top_left = oracle(&two_heads(1, 9, Causal::TopLeft));
    assert_ne!(masked, top_left);
}

#[test]
fn rows_a_bottom_right_mask_hides_are_zero_with_lse_minus_infinity() {
    // Sq = 7 > Sk = 3: rows 0..4 see no key, row 4 sees key 0, row 6 sees all three.
    let s = two_heads(7, 3, Causal::BottomRight);
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

fn judged(out: &[u16], lse: &[f32], reference: &[f32], ref_lse: &[f32]) -> CheckStats {
    let mut s = compare(Dtype::F16, 2, out, lse, reference, ref_lse, &[]);
    judge(&mut s, &tol(), 1.0);
    s
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
    let s = judged(&out, &[0.5, 0.5], &reference, &[0.5, 0.5]);
    assert_eq!(s.unwritten_count, 1);
    assert!(!s.passed());

    out[2] = to_bits(Dtype::F16, 3.5);
    let s = judged(&out, &[0.5, 0.5], &reference, &[0.5, 0.5]);
    assert!(
        s.failures.iter().any(|f| f.contains("max abs")),
        "{:?}",
        s.failures
    );

    out[2] = to_bits(Dtype::F16, 3.0);
    let s = judged(&out, &[0.5, 0.5], &reference, &[0.5, 0.5]);
    assert!(s.passed(), "{:?}", s.failures);
}

#[test]
fn a_nan_reference_fails_every_figure_it_touches() {
    let out: Vec<u16> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .map(|&x| to_bits(Dtype::F16, x))
        .collect();
    let reference = [1.0, f32::NAN, 3.0, 4.0];
    let s = judged(&out, &[0.5, 0.5], &reference, &[0.5, 0.5]);
    assert!(s.max_abs.is_nan() && s.rel_l2.is_nan() && s.row_rel_l2_max.is_nan());
    assert!(!s.passed());
    let ok = [1.0, 2.0, 3.0, 4.0];
    let s = judged(&out, &[0.5, 0.5], &ok, &[0.5, f32::NAN]);
    assert!(s.lse_max_abs.is_nan() && !s.passed(), "{:?}", s);
}

#[test]
fn one_wrong_row_on_a_long_shape_fails_where_global_figures_would_not() {
    // 2·16·2048 rows, as a long shape has: zeroing one moves rel L2 by only 1/sqrt(rows) = 0.006.
    let (rows, d) = (65536usize, 64usize);
    let reference: Vec<f32> = (0..rows * d)
        .map(|i| 0.02 * (((i * 7919) % 13) as f32 / 6.0 - 1.0))
        .collect();
    let mut out: Vec<u16> = reference.iter().map(|&x| to_bits(Dtype::Bf16, x)).collect();
    out[40000 * d..40001 * d].fill(to_bits(Dtype::Bf16, 0.0));
    let lse = vec![1.0f32; rows];
    let mut s = compare(Dtype::Bf16, d, &out, &lse, &reference, &lse, &[]);
    let bf16 = Tolerance {
        max_abs: 3e-2,
        rel_l2: 1e-2,
        row_rel_l2: 2e-2,
        lse_max_abs: 1e-4,
    };
    judge(&mut s, &bf16, 1.0);
    assert!(s.max_abs < bf16.max_abs && s.rel_l2 < bf16.rel_l2, "{s:?}");
    assert_eq!(s.worst_row, 40000);
    assert!(
        s.failures.len() == 1 && s.failures[0].starts_with("row 40000"),
        "{:?}",
        s.failures
    );
}

#[test]
fn fully_masked_rows_must_be_zero_with_minus_infinite_lse() {
    let reference = [0.0f32, 0.0, 1.0, 2.0];
    let ref_lse = [f32::NEG_INFINITY, 0.3];
    let out: Vec<u16> = reference.iter().map(|&x| to_bits(Dtype::F16, x)).collect();
    let s = judged(&out, &[f32::NEG_INFINITY, 0.3], &reference, &ref_lse);
    assert!(s.passed(), "{:?}", s.failures);
    let s = judged(&out, &[0.0, 0.3], &reference, &ref_lse);
    assert!(!s.passed() && s.lse_max_abs.is_infinite(), "{s:?}");
    let mut wrong = out.clone();
    wrong[1] = to_bits(Dtype::F16, 0.5);
    let s = judged(&wrong, &[f32::NEG_INFINITY, 0.3], &reference, &ref_lse);
    assert!(!s.passed(), "a masked row with a non-zero output must fail");
}

#[test]
fn nan_limits_and_figures_never_pass() {
    assert!(!within(f64::NAN, 1.0));
    assert!(!within(0.5, f64::NAN));
    assert!(max_nan(1.0, f64::NAN).is_nan() && max_nan(f64::NAN, 1.0).is_nan());
}

#[test]
fn cpu_oracle_matches_a_hand_computed_case() {
    // One query, two keys, d = 64: scores 0 and 8 * 1/8 = 1.
    let q = vec![1.0f32; 64];
    let mut k = vec![0.0f32; 128];
    k[64..72].iter_mut().for_each(|x| *x = 1.0);
    let v: Vec<f32> = (0..128).map(|i| if i < 64 { 0.0 } else { 1.0 }).collect();
    let (o, lse) = cpu_attention(&shape(1, 2, Causal::None), &q, &k, &v);
    let e = std::f64::consts::E;
    assert!((o[0] - e / (1.0 + e)).abs() < 1e-12);
    assert!((lse[0] - (1.0 + e).ln()).abs() < 1e-12);
}

#[test]
fn causal_first_row_sees_only_key_zero() {
    let [q, k, v] = [0, 1, 2].map(|t| values(Dtype::F16, &random_bits(Dtype::F16, 128, 1, t, 1.0)));
    let (o, _) = cpu_attention(&shape(2, 2, Causal::TopLeft), &q, &k, &v);
    for c in 0..64 {
        assert!((o[c] - v[c] as f64).abs() < 1e-12);
    }
}

#[test]
fn sampled_rows_agree_with_the_full_oracle() {
    let s = Shape {
        b: 2,
        h: 2,
        ..shape(40, 24, Causal::TopLeft)
    };
    let n = |rows: u32| (s.b * s.h * rows * s.d) as usize;
    let [q, k, v] = [(0, n(s.sq)), (1, n(s.sk)), (2, n(s.sk))]
        .map(|(t, len)| values(Dtype::F16, &random_bits(Dtype::F16, len, 3, t, 1.0)));
    let (all_o, all_l) = cpu_attention(&s, &q, &k, &v);
    let rows = sample_rows(&s, 3, 9);
    assert!(rows.contains(&0) && rows.contains(&(4 * 40 - 1)));
    let (o, l) = oracle_rows(&s, &q, &k, &v, &rows);
    for (n, &row) in rows.iter().enumerate() {
        assert_eq!(l[n], all_l[row]);
        assert_eq!(o[n * 64..][..64], all_o[row * 64..][..64]);
    }
}

#[test]
fn random_inputs_are_reproducible_and_not_degenerate() {
    let a = random_bits(Dtype::Bf16, 1_000_003, 7, 1, 1.0);
    assert_eq!(a, random_bits(Dtype::Bf16, 1_000_003, 7, 1, 1.0));
    assert_ne!(a, random_bits(Dtype::Bf16, 1_000_003, 7, 2, 1.0));
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
