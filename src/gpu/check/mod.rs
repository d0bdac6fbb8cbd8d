//! Correctness arithmetic that needs no GPU: input generation and poison patterns here; error statistics (`compare`), the CPU f64 oracle (`oracle`) and timing summaries (`timing`) beside.
//!
//! Every figure here fails closed: a NaN anywhere propagates into the statistic it touches, and
//! every limit is tested so that NaN fails it.
mod compare;
mod oracle;
mod timing;

pub use compare::{compare, differing_bits, judge, within, ComparePartial, PartialStats};
pub use oracle::{
    cpu_attention, geometry, oracle_rows, oracle_rows_keeping, reference_vs_oracle, sample_rows,
};
pub use timing::{percentile, summarize};
// The arithmetic itself builds optimised in its own crate (crates/numerics).
pub use flashtune_numerics::compare::{POISON_16, POISON_F32_BITS};
pub use flashtune_numerics::dtype::{from_bits, random_bits, repeated, rounded, to_bits, values};
pub use flashtune_numerics::mask::{apply_mask, mask_word, splitmix64};
pub use flashtune_numerics::max_nan;
pub use flashtune_numerics::parallel::parallel_map;

/// The fp32 reference kernel must agree with the f64 oracle this closely (it is plain fp32 math).
pub const REFERENCE_VS_CPU_LIMIT: f64 = 1e-5;
/// Its LSE, in absolute terms, for N(0, 1) inputs; both limits widen with the score scale.
pub const REFERENCE_LSE_LIMIT: f64 = 1e-5;
