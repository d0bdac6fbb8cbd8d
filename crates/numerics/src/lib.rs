//! flashtune's verification arithmetic, in a crate of its own so that it builds optimised while the
//! rest of flashtune builds quickly (the root `Cargo.toml` gives each its opt-level): the loops every
//! test and every run spend their CPU time in.
//!
//! - [`dtype`]: the element types, their exact conversions and normal draws;
//! - [`oracle`]: attention in f64 on the exact input values, for chosen rows;
//! - [`compare`]: the error statistics of an output against a reference;
//! - [`mask`]: the masks that keep references unreadable in device memory;
//! - [`periodic`]: the test double's exact attention on inputs that repeat;
//! - [`parallel`]: work spread over the cores.
//!
//! Slices and numbers in, numbers out: the only type shared with flashtune is [`Dtype`].
pub mod compare;
pub mod dtype;
pub mod mask;
pub mod oracle;
pub mod parallel;
pub mod periodic;

pub use dtype::Dtype;

/// The larger of two figures, NaN if either is (`f64::max` would drop the NaN).
pub fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// sqrt(diff² / ref²), or the absolute sqrt(diff²) where the reference is zero.
pub fn rel(diff2: f64, ref2: f64) -> f64 {
    if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    }
}
