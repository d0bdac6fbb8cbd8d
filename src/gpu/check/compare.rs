//! A forward output compared with the fp32 reference: the error statistics (computed in
//! crates/numerics, merged from blocks of rows) and the gates a case must pass.
use super::{REFERENCE_LSE_LIMIT, REFERENCE_VS_CPU_LIMIT};
use crate::model::config::{Dtype, Tolerance};
use crate::model::protocol::CheckStats;
pub use flashtune_numerics::compare::ComparePartial;
use flashtune_numerics::rel;

/// The unjudged statistics a comparison's figures make.
pub trait PartialStats {
    /// The statistics of `elements` outputs.
    fn stats(self, elements: u64) -> CheckStats;
}

impl PartialStats for ComparePartial {
    fn stats(self, elements: u64) -> CheckStats {
        CheckStats {
            elements,
            max_abs: self.max_abs,
            rel_l2: rel(self.diff2, self.ref2),
            lse_max_abs: self.lse_max,
            row_rel_l2_max: self.row_max,
            worst_row: self.worst_row,
            nan_count: self.nan,
            unwritten_count: self.unwritten,
            nondeterministic_count: self.differing,
            ..Default::default()
        }
    }
}

/// Compare a forward output (raw bits, rows of `d`) and its LSE with the fp32 reference. A
/// poisoned element counts as never written; a written NaN or infinity counts as such; a reference NaN makes every figure it
/// touches NaN. A row that sees no key has reference O = 0 and LSE = -inf: the kernel must match.
/// The LSE error of each row is divided by its head's entry of `lse_scales` (heads of equal row
/// counts; none: 1), how much larger the inputs made its scores' rounding (`trial::mixture`).
pub fn compare(
    dtype: Dtype,
    d: usize,
    out_bits: &[u16],
    lse: &[f32],
    ref_out: &[f32],
    ref_lse: &[f32],
    lse_scales: &[f64],
) -> CheckStats {
    flashtune_numerics::compare::compare_all(dtype, d, out_bits, lse, ref_out, ref_lse, lse_scales)
        .stats(out_bits.len() as u64)
}

/// Whether `x` is within `limit`; false for a NaN figure (or limit).
pub fn within(x: f64, limit: f64) -> bool {
    x <= limit
}

/// Fill `stats.failures` with every gate the case misses; never loosened, never retried.
/// `lse_scale` widens the reference's limits against the oracle for inputs whose scores are that
/// many times larger (fp32 rounding of a score grows with its magnitude); the LSE error itself came
/// scaled per head from the comparison.
pub fn judge(stats: &mut CheckStats, tol: &Tolerance, lse_scale: f64) {
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
    if !within(stats.max_abs, tol.max_abs) {
        f.push(format!(
            "max abs error {:.3e} > {:.1e}",
            stats.max_abs, tol.max_abs
        ));
    }
    if !within(stats.rel_l2, tol.rel_l2) {
        f.push(format!(
            "relative L2 error {:.3e} > {:.1e}",
            stats.rel_l2, tol.rel_l2
        ));
    }
    if !within(stats.row_rel_l2_max, tol.row_rel_l2) {
        f.push(format!(
            "row {} has relative L2 error {:.3e} > {:.1e}",
            stats.worst_row, stats.row_rel_l2_max, tol.row_rel_l2
        ));
    }
    if !within(stats.lse_max_abs, tol.lse_max_abs) {
        f.push(format!(
            "LSE max abs error {:.3e} > {:.1e} (each head's error over its score scale)",
            stats.lse_max_abs, tol.lse_max_abs
        ));
    }
    if let Some(r) = stats.reference_vs_cpu_rel_l2 {
        let limit = REFERENCE_VS_CPU_LIMIT * lse_scale.max(1.0);
        if !within(r, limit) {
            f.push(format!(
                "fp32 reference kernel disagrees with the CPU f64 oracle: rel L2 {r:.3e} > {limit:.0e} over {} rows",
                stats.reference_rows_checked.unwrap_or(0)
            ));
        }
    }
    if let Some(r) = stats.reference_vs_cpu_lse {
        let limit = REFERENCE_LSE_LIMIT * lse_scale.max(1.0);
        if !within(r, limit) {
            f.push(format!(
                "fp32 reference kernel's LSE disagrees with the CPU f64 oracle: {r:.3e} > {limit:.0e} over {} rows",
                stats.reference_rows_checked.unwrap_or(0)
            ));
        }
    }
    stats.failures = f;
}

/// Bits that differ between two runs of the same kernel on the same inputs.
pub fn differing_bits(a: (&[u16], &[f32]), b: (&[u16], &[f32])) -> u64 {
    let o = a.0.iter().zip(b.0).filter(|(x, y)| x != y).count();
    (o + differing_f32_bits(a.1, b.1)) as u64
}

/// LSE entries whose bits differ.
fn differing_f32_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}
