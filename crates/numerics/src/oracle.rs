//! Attention in f64 on the exact input values, for chosen query rows.
use crate::max_nan;
use crate::parallel::parallel_chunks;

/// What the oracle needs of a shape: per head `sq` queries, `sk` keys of `d` values, and the mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    /// Query i sees keys j <= i + offset; None: every key.
    pub causal_offset: Option<i64>,
}

impl Geometry {
    /// Keys query row `i` sees: every mask admits a prefix of the keys.
    pub fn visible_keys(&self, i: usize) -> usize {
        match self.causal_offset {
            None => self.sk,
            Some(offset) => (i as i64 + offset + 1).clamp(0, self.sk as i64) as usize,
        }
    }
}

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

/// The f64 oracle for some query rows, each a flattened (b, h, query) index, where each head keeps
/// only its first `keep` keys, the mask otherwise unchanged: O rows and LSE. A row that sees no key
/// A row of the reference and where its output and log-sum-exp go.
type RowSlot<'a> = (&'a usize, (&'a mut [f64], &'a mut f64));

/// gets O = 0 and LSE = -inf.
pub fn oracle_rows_keeping(
    g: Geometry,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rows: &[usize],
    keep: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (sq, sk, d) = (g.sq, g.sk, g.d);
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; rows.len() * d];
    let mut lse = vec![0.0f64; rows.len()];
    let items: Vec<RowSlot> = rows
        .iter()
        .zip(out.chunks_mut(d).zip(lse.iter_mut()))
        .collect();
    // Rows in groups so each thread takes many (a row alone is too little work to hand out).
    let mut groups: Vec<Vec<RowSlot>> = Vec::new();
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
            let visible = g.visible_keys(i).min(keep);
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
    (crate::rel(d2, w2), lse_gap)
}
