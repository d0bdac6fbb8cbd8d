//! Holding the device's output comparison to the host's on crafted outputs, before any verdict of the device is trusted.
use super::mixture::{Geometry, LaunchDraw};
use super::{compare_on_host, Buf, Comparison, Device, Earlier, MaskedReference};
use crate::gpu::check;
use crate::model::config::Dtype;
use crate::model::protocol::CheckStats;
use anyhow::{bail, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How a failed comparison self-check begins, so the run can say what it means.
pub const COMPARISON_DISAGREES: &str = "the device's output comparison disagrees with the host's";

/// Hold the device's output comparison to the host's ([`compare_on_host`]) on crafted outputs,
/// before a device is trusted with any verdict: both dtypes, both head dims, an odd row count and
/// one past the comparison kernel's grid (its grid-stride loop), poisoned, NaN, infinite and badly
/// wrong outputs, a row that sees no key, a zero reference row, a NaN in the reference, and an
/// earlier run that differs bit for bit (including -0 against +0). The reference is masked by the device and unmasked by the host, so the two mask functions are held
/// to each other too. Counts must agree exactly; sums to 1e-9 relative (their order differs).
pub fn self_check_comparison<D: Device>(dev: &mut D) -> Result<()> {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for (rows, d) in [(37usize, 128usize), (9001, 64)] {
            for nan_reference in [false, true] {
                let crafted = CraftedOutputs::new(dtype, rows, d, nan_reference);
                let bufs = crafted.upload(dev)?;
                let checked = (|| -> Result<()> {
                    // Heads of their own LSE scales on the second: both sides divide alike.
                    let jobs = [
                        (None, false, "no earlier run"),
                        (
                            Some(bufs.earlier),
                            true,
                            "an earlier run, LSE scaled per head",
                        ),
                    ];
                    for (earlier, scaled, what) in jobs {
                        let job = Comparison {
                            dtype,
                            d,
                            o: bufs.o,
                            lse: bufs.lse,
                            reference: bufs.reference,
                            earlier: earlier.map(|(o, lse)| Earlier { o, lse }),
                            draw: scaled.then_some(LaunchDraw {
                                seed: 11,
                                launch: 0,
                                geometry: Geometry {
                                    heads: 9,
                                    d: d as u32,
                                },
                            }),
                        };
                        let (device, host) = (dev.compare(&job)?, compare_on_host(dev, &job)?);
                        if let Some(field) = first_disagreement(&device, &host) {
                            bail!(
                                "{COMPARISON_DISAGREES} on crafted outputs ({dtype}, {rows} rows of {d}, {}reference, {what}): {field}",
                                if nan_reference { "NaN in the " } else { "" }
                            );
                        }
                    }
                    Ok(())
                })();
                bufs.free(dev);
                checked?;
            }
        }
    }
    Ok(())
}

/// The first figure two comparisons disagree on, named with both values.
fn first_disagreement(device: &CheckStats, host: &CheckStats) -> Option<String> {
    let close = |a: f64, b: f64| {
        (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
    };
    let counts = [
        ("elements", device.elements, host.elements),
        ("NaN/inf outputs", device.nan_count, host.nan_count),
        (
            "unwritten outputs",
            device.unwritten_count,
            host.unwritten_count,
        ),
        (
            "differing outputs",
            device.nondeterministic_count,
            host.nondeterministic_count,
        ),
        ("worst row", device.worst_row, host.worst_row),
    ];
    let figures = [
        ("max abs error", device.max_abs, host.max_abs),
        ("relative L2", device.rel_l2, host.rel_l2),
        (
            "worst row's relative L2",
            device.row_rel_l2_max,
            host.row_rel_l2_max,
        ),
        ("LSE max abs error", device.lse_max_abs, host.lse_max_abs),
    ];
    counts
        .iter()
        .find(|(_, a, b)| a != b)
        .map(|(name, a, b)| format!("{name}: {a} on the device, {b} on the host"))
        .or_else(|| {
            figures
                .iter()
                .find(|(_, a, b)| !close(*a, *b))
                .map(|(name, a, b)| format!("{name}: {a:e} on the device, {b:e} on the host"))
        })
}

/// Outputs with one of everything a comparison must count, against a reference of N(0, 1) values.
struct CraftedOutputs {
    o: Vec<u16>,
    lse: Vec<f32>,
    ref_o: Vec<f32>,
    ref_lse: Vec<f32>,
    earlier: (Vec<u16>, Vec<f32>),
}

struct CraftedBuffers {
    o: Buf,
    lse: Buf,
    reference: MaskedReference,
    earlier: (Buf, Buf),
}

impl CraftedBuffers {
    fn free<D: Device>(&self, dev: &mut D) {
        for b in [
            self.o,
            self.lse,
            self.reference.o,
            self.reference.lse,
            self.earlier.0,
            self.earlier.1,
        ] {
            dev.free(b);
        }
    }
}

impl CraftedOutputs {
    fn new(dtype: Dtype, rows: usize, d: usize, nan_reference: bool) -> Self {
        let mut rng = SmallRng::seed_from_u64(0x5e1f_c4ec ^ (rows * d) as u64);
        let mut normal = || -> f32 { rng.sample(rand_distr::StandardNormal) };
        let ref_o: Vec<f32> = (0..rows * d).map(|_| normal()).collect();
        let ref_lse: Vec<f32> = (0..rows).map(|_| 3.0 * normal()).collect();
        let mut c = CraftedOutputs {
            o: ref_o
                .iter()
                .map(|&r| check::to_bits(dtype, r + 1e-3 * normal()))
                .collect(),
            lse: ref_lse.iter().map(|&l| l + 1e-4 * normal()).collect(),
            ref_o,
            ref_lse,
            earlier: (Vec::new(), Vec::new()),
        };
        let at = |row: usize, col: usize| row * d + col;
        // A row that sees no key: O = 0 and LSE = -inf on both sides.
        c.ref_o[at(3, 0)..at(4, 0)].fill(0.0);
        c.o[at(3, 0)..at(4, 0)].fill(0);
        c.ref_lse[3] = f32::NEG_INFINITY;
        c.lse[3] = f32::NEG_INFINITY;
        // A zero reference row with a written error: the row's error is absolute.
        c.ref_o[at(5, 0)..at(6, 0)].fill(0.0);
        c.o[at(7, 1)] = check::POISON_16;
        c.o[at(8, 2)] = check::to_bits(dtype, f32::NAN);
        c.o[at(9, 3)] = check::to_bits(dtype, f32::INFINITY);
        c.lse[10] = f32::from_bits(check::POISON_F32_BITS);
        c.lse[11] = f32::NAN;
        c.lse[12] = f32::NEG_INFINITY;
        // The one badly wrong row: the worst row is unique.
        for col in 0..d {
            c.o[at(13, col)] = check::to_bits(dtype, c.ref_o[at(13, col)] + 0.5);
        }
        if nan_reference {
            c.ref_o[at(rows - 1, d - 1)] = f32::NAN;
        }
        let mut earlier = (c.o.clone(), c.lse.clone());
        earlier.0[at(0, 0)] ^= 1;
        earlier.0[at(rows - 1, 5)] ^= 0x8000;
        earlier.1[rows / 2] = f32::from_bits(earlier.1[rows / 2].to_bits() ^ 1);
        // -0 against +0 is a difference in bits.
        c.o[at(4, 7)] = 0x0000;
        earlier.0[at(4, 7)] = 0x8000;
        c.earlier = earlier;
        c
    }

    fn upload<D: Device>(&self, dev: &mut D) -> Result<CraftedBuffers> {
        let mut pair = |o: &[u16], lse: &[f32]| -> Result<(Buf, Buf)> {
            let (ob, lb) = (dev.alloc16(o.len())?, dev.alloc32(lse.len())?);
            dev.upload16(ob, o)?;
            dev.upload32(lb, lse)?;
            Ok((ob, lb))
        };
        let (o, lse) = pair(&self.o, &self.lse)?;
        let earlier = pair(&self.earlier.0, &self.earlier.1)?;
        let (ref_o, ref_lse) = (
            dev.alloc32(self.ref_o.len())?,
            dev.alloc32(self.ref_lse.len())?,
        );
        dev.upload32(ref_o, &self.ref_o)?;
        dev.upload32(ref_lse, &self.ref_lse)?;
        let reference = MaskedReference::mask(dev, ref_o, ref_lse)?;
        Ok(CraftedBuffers {
            o,
            lse,
            reference,
            earlier,
        })
    }
}
