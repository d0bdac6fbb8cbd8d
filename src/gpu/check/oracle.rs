//! The CPU f64 oracle: attention on the exact input values for chosen rows, and how far the fp32 reference is from it.
use super::compare::rel;
use super::{max_nan, parallel_chunks};
use crate::model::config::Shape;
use rand::{rngs::SmallRng, Rng, SeedableRng};

/// Σ a·b in f64, in eight independent sums so the compiler can keep them in vector registers.
fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += x[l] as f64 * y[l] as f64;
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(&x, &y)| x as f64 * y as f64).sum();
    lanes.iter().sum::<f64>() + tail
}

/// The f64 oracle for some query rows, each a flattened (b, h, query) index: O rows and LSE.
/// A row that sees no key gets O = 0 and LSE = -inf.
pub fn oracle_rows(
    shape: &Shape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rows: &[usize],
) -> (Vec<f64>, Vec<f64>) {
    oracle_rows_keeping(shape, q, k, v, rows, shape.sk)
}

/// [`oracle_rows`] where each head keeps only its first `keep` keys, the mask otherwise unchanged:
/// what a kernel that drops its last key tile computes (the test double's model of one).
pub fn oracle_rows_keeping(
    shape: &Shape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rows: &[usize],
    keep: u32,
) -> (Vec<f64>, Vec<f64>) {
    let (sq, sk, d) = (shape.sq as usize, shape.sk as usize, shape.d as usize);
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; rows.len() * d];
    let mut lse = vec![0.0f64; rows.len()];
    let items: Vec<(&usize, (&mut [f64], &mut f64))> = rows
        .iter()
        .zip(out.chunks_mut(d).zip(lse.iter_mut()))
        .collect();
    // Rows in groups so each thread takes many (a row alone is too little work to hand out).
    let mut groups: Vec<Vec<(&usize, (&mut [f64], &mut f64))>> = Vec::new();
    for item in items {
        match groups.last_mut() {
            Some(g) if g.len() < 64 => g.push(item),
            _ => groups.push(vec![item]),
        }
    }
    parallel_chunks(groups, |group| {
        let mut scores = vec![0.0f64; sk];
        for (&row, (o, l)) in group {
            let (bh, i) = (row / sq, row % sq);
            // Every mask admits a prefix of the keys: 0..visible.
            let visible = shape.visible_keys(i as u32).min(keep) as usize;
            if visible == 0 {
                *l = f64::NEG_INFINITY;
                continue;
            }
            let qi = &q[row * d..][..d];
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate().take(visible) {
                *s = dot_f64(qi, &k[(bh * sk + j) * d..][..d]) * scale;
                max = max_nan(max, *s);
            }
            let mut sum = 0.0;
            for (j, s) in scores.iter().enumerate().take(visible) {
                let p = (s - max).exp();
                sum += p;
                let vj = &v[(bh * sk + j) * d..][..d];
                for (oc, &vc) in o.iter_mut().zip(vj) {
                    *oc += p * vc as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
            *l = max + sum.ln();
        }
    });
    (out, lse)
}

/// f64 attention on the exact input values, every row; O is [b,h,sq,d], LSE is [b,h,sq].
pub fn cpu_attention(shape: &Shape, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let rows: Vec<usize> = (0..q.len() / shape.d as usize).collect();
    oracle_rows(shape, q, k, v, &rows)
}

/// Rows worth recomputing on a shape too large for the whole oracle: per (batch, head) the first
/// and last query (the first sees one key under top-left causal, none under bottom-right with
/// Sq > Sk) and `extra` drawn from `seed`.
pub fn sample_rows(shape: &Shape, extra: usize, seed: u64) -> Vec<usize> {
    let (heads, sq) = (shape.b as usize * shape.h as usize, shape.sq as usize);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut rows = Vec::new();
    for bh in 0..heads {
        let mut picks = vec![0, sq - 1];
        picks.extend((0..extra).map(|_| rng.random_range(0..sq)));
        picks.sort_unstable();
        picks.dedup();
        rows.extend(picks.into_iter().map(|i| bh * sq + i));
    }
    rows
}

/// How far an fp32 reference's rows are from the oracle's: relative L2 over O, largest LSE gap.
pub fn reference_vs_oracle(
    ref_out: &[f32],
    ref_lse: &[f32],
    rows: &[usize],
    oracle_out: &[f64],
    oracle_lse: &[f64],
    d: usize,
) -> (f64, f64) {
    let (mut d2, mut w2, mut lse_gap) = (0.0f64, 0.0f64, 0.0f64);
    for (n, &row) in rows.iter().enumerate() {
        for c in 0..d {
            let got = ref_out[row * d + c] as f64;
            let want = oracle_out[n * d + c];
            // A non-finite reference output is infinitely wrong, NaN included.
            let diff = if got.is_finite() {
                got - want
            } else {
                f64::INFINITY
            };
            d2 += diff * diff;
            w2 += want * want;
        }
        let (got, want) = (ref_lse[row] as f64, oracle_lse[n]);
        let gap = if got == want {
            0.0
        } else if got.is_finite() && want.is_finite() {
            (got - want).abs()
        } else {
            f64::INFINITY
        };
        lse_gap = max_nan(lse_gap, gap);
    }
    (rel(d2, w2), lse_gap)
}
