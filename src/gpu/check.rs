//! Correctness arithmetic that needs no GPU: input generation, poison patterns, error statistics, the CPU f64 oracle and timing summaries.
//!
//! Every figure here fails closed: a NaN anywhere propagates into the statistic it touches, and
//! every limit is tested so that NaN fails it.
use crate::model::config::{Dtype, Shape, Tolerance};
use crate::model::protocol::{CheckStats, TimingStats};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use rand_distr::StandardNormal;

/// NaN in both f16 and bf16, and not a pattern arithmetic produces (canonical NaNs are 0x7E00 / 0x7FC0).
pub const POISON_16: u16 = 0xFFFF;
pub const POISON_F32_BITS: u32 = 0xFFFF_FFFF;

/// The fp32 reference kernel must agree with the f64 oracle this closely (it is plain fp32 math).
pub const REFERENCE_VS_CPU_LIMIT: f64 = 1e-5;
/// Its LSE, in absolute terms, for N(0, 1) inputs; both limits widen with the score scale.
pub const REFERENCE_LSE_LIMIT: f64 = 1e-5;

pub fn to_bits(dtype: Dtype, x: f32) -> u16 {
    match dtype {
        Dtype::F16 => half::f16::from_f32(x).to_bits(),
        Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
    }
}

pub fn from_bits(dtype: Dtype, bits: u16) -> f32 {
    match dtype {
        Dtype::F16 => f16_table()[bits as usize],
        // bf16 is the top half of an f32: widening is exact and needs no table.
        Dtype::Bf16 => f32::from_bits((bits as u32) << 16),
    }
}

/// Every f16 value as f32, once per process: verification reads hundreds of millions of outputs
/// per run, and a 256 KiB table (it stays in L2) is several times faster than the software conversion.
fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    })
}

/// Normal values N(0, sigma²) rounded to `dtype`, as the bits to upload. Generated in fixed-size
/// chunks with their own seeds, on every core: the same `(seed, tensor)` gives the same bits anywhere.
pub fn random_bits(dtype: Dtype, len: usize, seed: u64, tensor: u64, sigma: f32) -> Vec<u16> {
    const CHUNK: usize = 1 << 18;
    let mut bits = vec![0u16; len];
    let chunks: Vec<(usize, &mut [u16])> = bits.chunks_mut(CHUNK).enumerate().collect();
    parallel_chunks(chunks, |(index, chunk)| {
        let mut rng = SmallRng::seed_from_u64(
            seed ^ tensor.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
        );
        for x in chunk.iter_mut() {
            *x = to_bits(dtype, sigma * rng.sample::<f32, _>(StandardNormal));
        }
    });
    bits
}

/// Run `work` on every item, the items spread over the machine's cores.
fn parallel_chunks<T: Send>(items: Vec<T>, work: impl Fn(T) + Sync) {
    // Asked once: on Linux the answer reads the cgroup's quota, and a verification calls this for
    // every launch it checks.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads =
        *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if items.len() <= 1 {
        items.into_iter().for_each(work);
        return;
    }
    let per_thread = items.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        groups.push(items.by_ref().take(per_thread).collect());
    }
    let work = &work;
    std::thread::scope(|scope| {
        for group in groups {
            scope.spawn(move || group.into_iter().for_each(work));
        }
    });
}

/// `work` on every item, spread over the cores; results in the items' order.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    let jobs: Vec<(&T, &mut Option<R>)> = items.iter().zip(results.iter_mut()).collect();
    parallel_chunks(jobs, |(item, slot)| *slot = Some(work(item)));
    results
        .into_iter()
        .map(|r| r.expect("every item was worked on"))
        .collect()
}

/// The exact values a bit pattern holds.
pub fn values(dtype: Dtype, bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| from_bits(dtype, b)).collect()
}

/// The larger of two figures, NaN if either is (`f64::max` would drop the NaN).
pub fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

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

/// The word that masks 32-bit element `index` of a reference buffer under `key`. The worker keeps
/// every reference on the GPU XORed with such words under a key drawn per set from the OS, so a
/// kernel under test that finds the reference in device memory finds noise; only the comparison
/// (`ft_compare`, or the host path) is given the key. Same function as `ft_mask` in tools.cu.
pub fn mask_word(key: u64, index: u64) -> u32 {
    splitmix64(key ^ splitmix64(index)) as u32
}

/// XOR every element of a reference buffer with its mask word: masks plain values, unmasks masked
/// ones. On every core: a large shape's reference is tens of millions of elements.
pub fn apply_mask(values: &mut [f32], key: u64, first_index: u64) {
    const CHUNK: usize = 1 << 18;
    let chunks: Vec<(usize, &mut [f32])> = values.chunks_mut(CHUNK).enumerate().collect();
    parallel_chunks(chunks, |(c, chunk)| {
        let first = first_index + (c * CHUNK) as u64;
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = f32::from_bits(v.to_bits() ^ mask_word(key, first + i as u64));
        }
    });
}

/// SplitMix64's finaliser, as in tools.cu.
pub fn splitmix64(x: u64) -> u64 {
    let mut x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
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
fn rel(diff2: f64, ref2: f64) -> f64 {
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
    use crate::model::config::Causal;

    #[test]
    fn the_f16_table_and_the_bf16_shift_are_the_exact_conversions() {
        for b in 0..=u16::MAX {
            let (f, g) = (from_bits(Dtype::F16, b), half::f16::from_bits(b).to_f32());
            assert!(
                f.to_bits() == g.to_bits() || (f.is_nan() && g.is_nan()),
                "f16 {b:#06x}"
            );
            let (f, g) = (from_bits(Dtype::Bf16, b), half::bf16::from_bits(b).to_f32());
            assert!(
                f.to_bits() == g.to_bits() || (f.is_nan() && g.is_nan()),
                "bf16 {b:#06x}"
            );
        }
    }

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
        Shape {
            name: "t".into(),
            b: 1,
            h: 1,
            sq,
            sk,
            d: 64,
            causal,
        }
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
        let [q, k, v] =
            [0, 1, 2].map(|t| values(Dtype::F16, &random_bits(Dtype::F16, 128, 1, t, 1.0)));
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
}
