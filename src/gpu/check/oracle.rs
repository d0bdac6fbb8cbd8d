//! The CPU f64 oracle (computed in crates/numerics): attention on the exact input values for chosen rows, and how far the fp32 reference is from it.
use crate::model::config::Shape;
pub use flashtune_numerics::oracle::reference_vs_oracle;
use flashtune_numerics::oracle::Geometry;
use rand::{rngs::SmallRng, Rng, SeedableRng};

/// What the oracle needs of a shape.
pub fn geometry(shape: &Shape) -> Geometry {
    Geometry {
        sq: shape.sq as usize,
        sk: shape.sk as usize,
        d: shape.d as usize,
        causal_offset: shape.causal.offset(shape.sq, shape.sk),
    }
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
    flashtune_numerics::oracle::oracle_rows_keeping(geometry(shape), q, k, v, rows, keep as usize)
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
