//! A forward output compared with the fp32 reference: the error statistics, merged from blocks of rows, and the gates a case must pass.
use super::{
    from_bits, max_nan, parallel_chunks, POISON_16, POISON_F32_BITS, REFERENCE_LSE_LIMIT,
    REFERENCE_VS_CPU_LIMIT,
};
use crate::model::config::{Dtype, Tolerance};
use crate::model::protocol::CheckStats;

/// The row with the larger error; a NaN error is the worst of all and stays.
fn worse_row(a: (f64, u64), b: (f64, u64)) -> (f64, u64) {
    if a.0.is_nan() || !(b.0.is_nan() || b.0 > a.0) {
        a
    } else {
        b
    }
}

/// The figures of a comparison over some rows, before judging: the host computes one per block of
/// rows, the GPU worker's `ft_compare` one per thread block (same fields, same order, as nine
/// 8-byte words); they merge in any order into one [`CheckStats`].
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub struct ComparePartial {
    pub max_abs: f64,
    pub diff2: f64,
    pub ref2: f64,
    pub row_max: f64,
    pub worst_row: u64,
    pub lse_max: f64,
    pub nan: u64,
    pub unwritten: u64,
    /// Outputs that differ from the earlier run they were compared with (a race), when there was one.
    pub differing: u64,
}

impl ComparePartial {
    /// Words per partial in the layout `ft_compare` writes.
    pub const WORDS: usize = 9;

    pub fn merge(mut self, o: ComparePartial) -> ComparePartial {
        self.max_abs = max_nan(self.max_abs, o.max_abs);
        self.diff2 += o.diff2;
        self.ref2 += o.ref2;
        (self.row_max, self.worst_row) =
            worse_row((self.row_max, self.worst_row), (o.row_max, o.worst_row));
        self.lse_max = max_nan(self.lse_max, o.lse_max);
        self.nan += o.nan;
        self.unwritten += o.unwritten;
        self.differing += o.differing;
        self
    }

    /// One partial from the nine words `ft_compare` wrote for one thread block.
    pub fn from_words(w: &[u64]) -> ComparePartial {
        let f = f64::from_bits;
        ComparePartial {
            max_abs: f(w[0]),
            diff2: f(w[1]),
            ref2: f(w[2]),
            row_max: f(w[3]),
            worst_row: w[4],
            lse_max: f(w[5]),
            nan: w[6],
            unwritten: w[7],
            differing: w[8],
        }
    }

    /// The unjudged statistics of `elements` outputs.
    pub fn stats(self, elements: u64) -> CheckStats {
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
    let rows = lse.len().min(ref_lse.len());
    assert!(
        d > 0 && out_bits.len() == rows * d && ref_out.len() == rows * d,
        "compare: buffers must hold {rows} rows of {d}"
    );
    const ROWS_PER_CHUNK: usize = 4096;
    let chunks: Vec<(usize, usize)> = (0..rows)
        .step_by(ROWS_PER_CHUNK)
        .map(|r0| (r0, (r0 + ROWS_PER_CHUNK).min(rows)))
        .collect();
    let partials = std::sync::Mutex::new(Vec::new());
    parallel_chunks(chunks, |(r0, r1)| {
        let p = compare_rows(
            dtype, d, r0, r1, out_bits, lse, ref_out, ref_lse, lse_scales,
        );
        partials.lock().expect("no panics while held").push(p);
    });
    partials
        .into_inner()
        .expect("no panics while held")
        .into_iter()
        .fold(ComparePartial::default(), ComparePartial::merge)
        .stats(out_bits.len() as u64)
}

/// sqrt(diff² / ref²), or the absolute sqrt(diff²) where the reference is zero.
pub(super) fn rel(diff2: f64, ref2: f64) -> f64 {
    if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    }
}

#[allow(clippy::too_many_arguments)]
fn compare_rows(
    dtype: Dtype,
    d: usize,
    r0: usize,
    r1: usize,
    out_bits: &[u16],
    lse: &[f32],
    ref_out: &[f32],
    ref_lse: &[f32],
    lse_scales: &[f64],
) -> ComparePartial {
    let mut p = ComparePartial::default();
    let rows_per_head = lse.len().div_ceil(lse_scales.len().max(1)).max(1);
    let scale = |row: usize| lse_scales.get(row / rows_per_head).copied().unwrap_or(1.0);
    let exp_mask = match dtype {
        Dtype::F16 => 0x7C00u16,
        Dtype::Bf16 => 0x7F80u16,
    };
    for row in r0..r1 {
        let (mut row_diff2, mut row_ref2) = (0.0f64, 0.0f64);
        if let Some((diff2, ref2, max_abs)) = clean_row(
            dtype,
            exp_mask,
            &out_bits[row * d..(row + 1) * d],
            &ref_out[row * d..(row + 1) * d],
        ) {
            p.max_abs = max_nan(p.max_abs, max_abs);
            (row_diff2, row_ref2) = (diff2, ref2);
        } else {
            for e in row * d..(row + 1) * d {
                let bits = out_bits[e];
                let r = ref_out[e] as f64;
                if bits == POISON_16 {
                    p.unwritten += 1;
                    continue;
                }
                let o = from_bits(dtype, bits) as f64;
                if !o.is_finite() {
                    p.nan += 1;
                    continue;
                }
                let diff = (o - r).abs();
                p.max_abs = max_nan(p.max_abs, diff);
                row_diff2 += diff * diff;
                row_ref2 += r * r;
            }
        }
        p.diff2 += row_diff2;
        p.ref2 += row_ref2;
        (p.row_max, p.worst_row) = worse_row(
            (p.row_max, p.worst_row),
            (rel(row_diff2, row_ref2), row as u64),
        );
        let (l, r) = (lse[row], ref_lse[row] as f64);
        if l.to_bits() == POISON_F32_BITS {
            p.unwritten += 1;
        } else if r == f64::NEG_INFINITY && l == f32::NEG_INFINITY {
            // A row that sees no key: -inf is the right answer, not a non-finite output.
        } else if !l.is_finite() {
            p.nan += 1;
        } else {
            p.lse_max = max_nan(p.lse_max, (l as f64 - r).abs() / scale(row));
        }
    }
    p
}

/// A row's (Σ diff², Σ ref², max |diff|) in four independent lanes, or None when any output is
/// poison, NaN or inf, or any reference value is not finite: those rows take the careful path,
/// which counts them. Almost every row is clean, and this path is several times faster.
fn clean_row(
    dtype: Dtype,
    exp_mask: u16,
    out_bits: &[u16],
    ref_out: &[f32],
) -> Option<(f64, f64, f64)> {
    const LANES: usize = 4;
    let (mut diff2, mut ref2, mut max_abs) = ([0.0f64; LANES], [0.0f64; LANES], [0.0f64; LANES]);
    let mut special = false;
    let (o4, r4) = (out_bits.chunks_exact(LANES), ref_out.chunks_exact(LANES));
    if !o4.remainder().is_empty() {
        return None;
    }
    for (o, r) in o4.zip(r4) {
        for l in 0..LANES {
            // All-ones exponent: inf, NaN and the poison pattern alike.
            special |= o[l] & exp_mask == exp_mask;
            let reference = r[l];
            special |= !reference.is_finite();
            let diff = (from_bits(dtype, o[l]) as f64 - reference as f64).abs();
            max_abs[l] = max_abs[l].max(diff);
            diff2[l] += diff * diff;
            ref2[l] += reference as f64 * reference as f64;
        }
    }
    if special {
        return None;
    }
    let max = max_abs.iter().fold(0.0f64, |a, &b| a.max(b));
    Some((diff2.iter().sum(), ref2.iter().sum(), max))
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
