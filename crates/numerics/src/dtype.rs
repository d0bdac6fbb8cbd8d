//! The element types kernels read and write, their exact conversions, and normal draws.
use crate::parallel::parallel_chunks;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
    /// The token the kernels expect in `-DDTYPE=...`.
    pub fn define(self) -> &'static str {
        match self {
            Dtype::F16 => "DTYPE_F16",
            Dtype::Bf16 => "DTYPE_BF16",
        }
    }
    pub fn bytes(self) -> u64 {
        2
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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

/// The exact values a bit pattern holds.
pub fn values(dtype: Dtype, bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| from_bits(dtype, b)).collect()
}

/// Values rounded to `dtype`, as a kernel writing `dtype` stores them.
pub fn rounded(dtype: Dtype, values: &[f32]) -> Vec<u16> {
    values.iter().map(|&x| to_bits(dtype, x)).collect()
}

/// Elements `start..start + len` of a sequence that repeats `period`.
pub fn repeated(period: &[u16], start: usize, len: usize) -> Vec<u16> {
    (start..start + len)
        .map(|i| period[i % period.len()])
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
