//! The one distribution every input of a trial is drawn from: the check, held-out and stress sets
//! and every timed launch alike, so no set can be told from another by what it holds. Each head of
//! each launch draws its own component of a mixture, so hard inputs land in every round, and the
//! hard ones are not only those with the largest norms:
//! - plain: N(0, 1);
//! - wide: Q and K from N(0, σ²), σ in 2..=8 (scores past exp's range: a missing max-subtraction);
//! - aligned: Q and K rows share one direction per head, at ordinary norms (logits of ρg²√d, up to
//!   about 40 at d = 128, with ‖q‖² between d and 3.7d);
//! - spiky: three channels per head carry ±m in Q and K (m in 4..=10), as outlier channels in
//!   real activations do;
//! - outlier tokens: one key row in 16 is scaled by f (f in 4..=40; scores past exp's range too).
//!
//! A quarter of the heads are plain, a quarter wide, a quarter outlier tokens, an eighth aligned and
//! an eighth spiky: whatever a kernel gets wrong, a verified round meets it soon.
//!
//! V is always N(0, 1), so O keeps its usual magnitude and its tolerances. The same choice is made
//! on the GPU by `mixture_component` in `worker/tools.cu`; a GPU test holds the two together.
//! The test double draws one component per tensor (head 0's), so its cheap periodic attention stays
//! periodic; its honest kernels are exact, so the per-head limits never decide for it.
use crate::gpu::check::{self, splitmix64};
use crate::model::config::Dtype;

/// Mixes the launch and head into the hash that picks a head's component ("mixture1").
const TAG: u64 = 0x6d69_7874_7572_6531;
/// ρ of the aligned component, as its two square roots.
const ALIGNED_NOISE: f32 = 0.316_227_77; // √(1 - ρ), ρ = 0.9
const ALIGNED_SHARED: f32 = 0.948_683_3; // √ρ
/// One key row in this many is an outlier token.
const OUTLIER_EVERY: u64 = 16;

/// A head's component of the mixture.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Component {
    Plain,
    Wide { sigma: f32 },
    Aligned { gain: f32 },
    Spiky { magnitude: f32, channels: [u32; 3] },
    Outliers { factor: f32 },
}

/// What a tensor's rows are: `heads` heads (batch × heads) of rows of `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub heads: u32,
    pub d: u32,
}

/// The hash of one head of one launch's draw: every choice the mixture makes for it comes from here.
pub fn head_hash(seed: u64, launch: u64, head: u64) -> u64 {
    splitmix64(
        seed ^ splitmix64(
            TAG ^ launch.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ head.wrapping_mul(0xD1B5_4A32_D192_ED03),
        ),
    )
}

/// The component a head draws (`hash` from [`head_hash`]).
pub fn component(hash: u64, d: u32) -> Component {
    let pick = (hash >> 32) % 8;
    let k = ((hash >> 8) & 0xFFFF) as u32;
    match pick {
        0..=1 => Component::Plain,
        2..=3 => Component::Wide {
            sigma: (2 + k % 7) as f32,
        },
        4 => Component::Aligned {
            gain: 1.0 + 0.25 * (k % 5) as f32,
        },
        5 => Component::Spiky {
            magnitude: (4 + k % 7) as f32,
            channels: [1u64, 2, 3].map(|i| (splitmix64(hash ^ i) % d.max(1) as u64) as u32),
        },
        _ => Component::Outliers {
            factor: (4 + k % 37) as f32,
        },
    }
}

impl Component {
    /// How many times larger ‖q‖‖k‖ / d is than for N(0, 1) inputs: the fp32 rounding of a score,
    /// and so of the LSE, grows by this much (for `Wide` it is σ², the rule the stress set had).
    pub fn lse_scale(&self, d: u32) -> f64 {
        match *self {
            Component::Plain => 1.0,
            Component::Wide { sigma } => (sigma as f64).powi(2),
            Component::Aligned { gain } => {
                (ALIGNED_NOISE as f64).powi(2) + (ALIGNED_SHARED as f64 * gain as f64).powi(2)
            }
            Component::Spiky { magnitude, .. } => {
                1.0 + 3.0 * (magnitude as f64).powi(2) / d.max(1) as f64
            }
            Component::Outliers { factor } => factor as f64,
        }
    }

    /// Element (row, channel) of tensor `t` (0 Q, 1 K, 2 V) of a head drawing this component, from
    /// `z`, the plain N(0, 1) draw of that element; `hash` is the head's.
    pub fn value(&self, hash: u64, t: u64, row: u64, channel: u32, z: f32) -> f32 {
        let (scale, shift) = self.affine(hash, t, row, channel);
        scale * z + shift
    }

    /// Every component is `scale · z + shift` per element: (scale, shift) at (t, row, channel).
    fn affine(&self, hash: u64, t: u64, row: u64, channel: u32) -> (f32, f32) {
        if t >= 2 {
            return (1.0, 0.0);
        }
        match *self {
            Component::Plain => (1.0, 0.0),
            Component::Wide { sigma } => (sigma, 0.0),
            Component::Aligned { gain } => (
                ALIGNED_NOISE,
                ALIGNED_SHARED * gain * row_sign(hash, t, row) * shared_direction(hash, channel),
            ),
            Component::Spiky {
                magnitude,
                channels,
            } => {
                if channels.contains(&channel) {
                    (1.0, row_sign(hash, t, row) * magnitude)
                } else {
                    (1.0, 0.0)
                }
            }
            Component::Outliers { factor } => {
                if t == 1 && splitmix64(hash ^ splitmix64(row ^ 0x6f75_746c)) % OUTLIER_EVERY == 0 {
                    (factor, 0.0)
                } else {
                    (1.0, 0.0)
                }
            }
        }
    }
}

/// ±1 per (tensor, row) of a head.
fn row_sign(hash: u64, t: u64, row: u64) -> f32 {
    if splitmix64(hash ^ splitmix64((t << 40) ^ row ^ 0x7369_676e)) & 1 == 1 {
        -1.0
    } else {
        1.0
    }
}

/// The aligned component's direction, shared by a head's Q and K: N(0, 1) per channel (Box-Muller on
/// the hash, as the GPU draws its values).
fn shared_direction(hash: u64, channel: u32) -> f32 {
    let h = splitmix64(hash ^ splitmix64(channel as u64 ^ 0x6469_7265));
    let u1 = (((h >> 40) & 0xFF_FFFF) as f32 + 1.0) / 16_777_216.0;
    let u2 = (h & 0xFF_FFFF) as f32 / 16_777_216.0;
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// One launch's inputs as drawn: tensors 3 launch, 3 launch + 1 and 3 launch + 2 of the draw from
/// `seed`. What a comparison needs to know of them: each head's LSE scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaunchDraw {
    pub seed: u64,
    pub launch: u64,
    pub geometry: Geometry,
}

impl LaunchDraw {
    pub fn lse_scales(&self) -> Vec<f64> {
        head_scales(self.seed, self.launch, self.geometry)
    }

    /// The largest head's: what the reference's limits against the CPU oracle widen by.
    pub fn max_lse_scale(&self) -> f64 {
        self.lse_scales().into_iter().fold(1.0, f64::max)
    }
}

/// Plain N(0, 1) bits of `tensor` (`check::random_bits`) made a draw of the mixture, as the test
/// double draws: one component for the whole tensor, head 0's.
pub fn double_bits(dtype: Dtype, len: usize, seed: u64, tensor: u64, d: u32) -> Vec<u16> {
    let mut bits = check::random_bits(dtype, len, seed, tensor, 1.0);
    let hash = head_hash(seed, tensor / 3, 0);
    let c = component(hash, d);
    if c != Component::Plain {
        let d = d.max(1) as usize;
        for (i, b) in bits.iter_mut().enumerate() {
            let z = check::from_bits(dtype, *b);
            *b = check::to_bits(
                dtype,
                c.value(hash, tensor % 3, (i / d) as u64, (i % d) as u32, z),
            );
        }
    }
    bits
}

/// The LSE scale of every head of launch `launch` of a draw from `seed`.
pub fn head_scales(seed: u64, launch: u64, geometry: Geometry) -> Vec<f64> {
    (0..geometry.heads as u64)
        .map(|head| component(head_hash(seed, launch, head), geometry.d).lse_scale(geometry.d))
        .collect()
}

/// The mean of x² over `rows` rows of `d` of tensor `t` of a head drawing `c`, and the standard
/// deviation of that mean (each element is scale · z + shift: E x² = scale² + shift², Var x² =
/// 2 scale⁴ + 4 scale² shift²): what a device's draw must show, head by head.
pub fn mean_square(c: &Component, hash: u64, t: u64, rows: u64, d: u32) -> (f64, f64) {
    let (mut mean, mut var) = (0.0f64, 0.0f64);
    for row in 0..rows {
        for ch in 0..d {
            let (a, b) = c.affine(hash, t, row, ch);
            let (a2, b2) = ((a as f64).powi(2), (b as f64).powi(2));
            mean += a2 + b2;
            var += 2.0 * a2 * a2 + 4.0 * a2 * b2;
        }
    }
    let n = (rows * d as u64) as f64;
    (mean / n, var.sqrt() / n)
}

/// Hold a device's draw to this mixture before it is trusted with a trial: Q and K of one launch
/// over 96 heads of 256 rows of 64, each head's mean square within six standard deviations (and
/// 1 % for the rounding) of what its component gives. The GPU draws in `worker/tools.cu`, this module on the
/// host: this keeps the two the same mixture. The double draws one component per tensor and is not
/// held to it.
pub fn self_check<D: super::Device + ?Sized>(dev: &mut D) -> anyhow::Result<()> {
    let len = (CHECK_GEOMETRY.heads as u64 * CHECK_ROWS * CHECK_GEOMETRY.d as u64) as usize;
    let buf = dev.alloc16(len)?;
    let checked = (|| {
        for t in 0..2u64 {
            dev.generate(buf, Dtype::F16, CHECK_SEED, t, CHECK_GEOMETRY)?;
            check_heads(t, &check::values(Dtype::F16, &dev.read16(buf)?))?;
        }
        Ok(())
    })();
    dev.free(buf);
    checked
}

pub const CHECK_GEOMETRY: Geometry = Geometry { heads: 96, d: 64 };
pub const CHECK_ROWS: u64 = 256;
pub const CHECK_SEED: u64 = 0x6d69_7863_6865_636b;

/// Tensor `t` of launch 0 of the self-check's draw, as read back: every head's mean square.
pub fn check_heads(t: u64, values: &[f32]) -> anyhow::Result<()> {
    let per_head = values.len() / CHECK_GEOMETRY.heads as usize;
    for head in 0..CHECK_GEOMETRY.heads as u64 {
        let hash = head_hash(CHECK_SEED, 0, head);
        let c = component(hash, CHECK_GEOMETRY.d);
        let slice = &values[head as usize * per_head..][..per_head];
        let got = slice.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / per_head as f64;
        let (want, sd) = mean_square(&c, hash, t, CHECK_ROWS, CHECK_GEOMETRY.d);
        if !(got - want).abs().le(&(6.0 * sd + 0.01 * want)) {
            anyhow::bail!(
                "the device's input mixture disagrees with the host's: head {head} of {} ({c:?}) \
                 has mean square {got:.3}, not {want:.3}",
                ["Q", "K"][t as usize]
            );
        }
    }
    Ok(())
}
