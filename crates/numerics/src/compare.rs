//! An output compared with its reference: the error statistics, merged from blocks of rows.
use crate::dtype::{from_bits, Dtype};
use crate::parallel::parallel_chunks;
use crate::{max_nan, rel};

/// NaN in both f16 and bf16, and not a pattern arithmetic produces (canonical NaNs are 0x7E00 / 0x7FC0).
pub const POISON_16: u16 = 0xFFFF;
pub const POISON_F32_BITS: u32 = 0xFFFF_FFFF;

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
}

/// The statistics of a forward output (raw bits, rows of `d`) and its LSE against the fp32
/// reference, over every row, on every core; see flashtune's `check::compare` for what each counts.
pub fn compare_all(
    dtype: Dtype,
    d: usize,
    out_bits: &[u16],
    lse: &[f32],
    ref_out: &[f32],
    ref_lse: &[f32],
    lse_scales: &[f64],
) -> ComparePartial {
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
