//! The test double's attention on its own draws, exact and cheap: inputs that repeat every
//! `period` elements make every head's keys repeat with a short period, so the scores of each
//! distinct (query row, key row) pair are computed once, then per query row a weighted sum over one
//! period of keys, counted by how often each appears among the keys the mask admits.
use crate::oracle::Geometry;
use std::collections::HashMap;

/// Attention in f64, stored in fp32, on inputs that repeat every `period` elements (a multiple of
/// `g.d`), over `heads` heads, each keeping its first `keep` keys. `qp`, `kp` and `vp` hold one
/// period of Q, K and V (or all of each, when shorter). With p = period / d rows per period, query
/// row g (over all heads) is row g mod p of Q's first period, and key j of head h is row
/// (h·Sk + j) mod p of K's and V's: so head h walks the period's rows starting at (h·Sk) mod p.
pub fn periodic_attention(
    g: Geometry,
    heads: usize,
    period: usize,
    [qp, kp, vp]: [&[f64]; 3],
    keep: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (sq, sk, d) = (g.sq, g.sk, g.d);
    let p = period / d;
    let (q_rows, k_rows) = (qp.len() / d, kp.len() / d);
    let scale = 1.0 / (d as f64).sqrt();
    // Every distinct score: query class × key class.
    let scores: Vec<f64> = (0..q_rows * k_rows)
        .map(|x| {
            let (a, b) = (x / k_rows, x % k_rows);
            qp[a * d..][..d]
                .iter()
                .zip(&kp[b * d..][..d])
                .map(|(x, y)| x * y)
                .sum::<f64>()
                * scale
        })
        .collect();
    let keep = keep.min(sk);
    let mut o = vec![0.0f32; heads * sq * d];
    let mut lse = vec![f32::NEG_INFINITY; heads * sq];
    // Heads grouped by where their keys start in the period: each group shares its sums.
    let mut by_start: HashMap<usize, Vec<usize>> = HashMap::new();
    for h in 0..heads {
        by_start.entry(h * sk % p).or_default().push(h);
    }
    // Prefix sums over one period of keys, in the order a head meets them: weights and weighted V.
    let period_len = p.min(sk.max(1));
    let mut weights = vec![0.0f64; period_len + 1];
    let mut sums = vec![0.0f64; (period_len + 1) * d];
    for (&start, group) in &by_start {
        for class in 0..q_rows {
            let key_class = |t: usize| (start + t) % p % k_rows;
            let score = |t: usize| scores[class * k_rows + key_class(t)];
            let m = (0..period_len).map(score).fold(f64::NEG_INFINITY, f64::max);
            for t in 0..period_len {
                let w = (score(t) - m).exp();
                weights[t + 1] = weights[t] + w;
                let vrow = &vp[key_class(t) * d..][..d];
                let (done, next) = sums.split_at_mut((t + 1) * d);
                for ((out, &prev), &x) in next[..d].iter_mut().zip(&done[t * d..]).zip(vrow) {
                    *out = prev + w * x;
                }
            }
            for &h in group {
                // Rows i of head h whose query class is `class`: (h·sq + i) mod p == class.
                let first = (class + p - h * sq % p) % p;
                for i in (first..sq).step_by(p) {
                    if (h * sq + i) % p % q_rows != class {
                        continue;
                    }
                    let n = g.visible_keys(i).min(keep);
                    if n == 0 {
                        continue;
                    }
                    let (full, rem) = ((n / period_len) as f64, n % period_len);
                    let den = full * weights[period_len] + weights[rem];
                    let row = h * sq + i;
                    for (c, out) in o[row * d..][..d].iter_mut().enumerate() {
                        *out = ((full * sums[period_len * d + c] + sums[rem * d + c]) / den) as f32;
                    }
                    lse[row] = (m + den.ln()) as f32;
                }
            }
        }
    }
    (o, lse)
}
