//! The problem a kernel solves: element types, causal masks and attention shapes, with their sizes and FLOPs.
use serde::{Deserialize, Serialize};

/// Element types live with the arithmetic that converts them.
pub use flashtune_numerics::Dtype;

/// Which keys a query row sees. Rows are numbered from 0 in Q, keys from 0 in K.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Causal {
    /// Every key (`causal = false` or `"none"`).
    #[default]
    None,
    /// Query i sees keys j <= i (`causal = true` or `"top-left"`; PyTorch `is_causal`).
    TopLeft,
    /// Query i sees keys j <= i + Sk - Sq (`"bottom-right"`; FlashAttention >= 2.1, PyTorch
    /// `causal_lower_right`): the last query sees every key, as in decoding with a KV cache.
    /// With Sq > Sk the first Sq - Sk rows see no key: their O is 0 and their LSE -inf.
    BottomRight,
}

impl Causal {
    /// The kernels' `causal` argument.
    pub fn code(self) -> i32 {
        match self {
            Causal::None => 0,
            Causal::TopLeft => 1,
            Causal::BottomRight => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Causal::None => "none",
            Causal::TopLeft => "top-left",
            Causal::BottomRight => "bottom-right",
        }
    }

    pub fn is_masked(self) -> bool {
        self != Causal::None
    }

    /// The diagonal: query i sees keys j <= i + offset; `None` when no key is masked.
    pub fn offset(self, sq: u32, sk: u32) -> Option<i64> {
        match self {
            Causal::None => None,
            Causal::TopLeft => Some(0),
            Causal::BottomRight => Some(i64::from(sk) - i64::from(sq)),
        }
    }
}

// Written as the bool it used to be where it can be, so run logs and snapshots of top-left and
// unmasked shapes stay byte-identical; bottom-right has no bool.
impl Serialize for Causal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Causal::None => s.serialize_bool(false),
            Causal::TopLeft => s.serialize_bool(true),
            Causal::BottomRight => s.serialize_str(self.name()),
        }
    }
}

impl<'de> Deserialize<'de> for Causal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Causal;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    r#"true (= "top-left"), false (= "none"), "top-left" or "bottom-right""#,
                )
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> std::result::Result<Causal, E> {
                Ok(if v { Causal::TopLeft } else { Causal::None })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Causal, E> {
                match v {
                    "none" => Ok(Causal::None),
                    "top-left" => Ok(Causal::TopLeft),
                    "bottom-right" => Ok(Causal::BottomRight),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The head dims the kernel family and its reference take; a path that cannot take one is ruled
/// out by its space's constraints, with the reason in the plan.
pub const SUPPORTED_HEAD_DIMS: [u32; 4] = [64, 96, 128, 256];

/// One attention problem: Q is [b, h, sq, d], K and V are [b, h, sk, d].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    pub name: String,
    pub b: u32,
    pub h: u32,
    pub sq: u32,
    pub sk: u32,
    pub d: u32,
    #[serde(default)]
    pub causal: Causal,
}

/// The kernels index rows with 32-bit ints and compute `i + Sk - Sq`: sequences stay below 2^30.
pub const MAX_SEQ_LEN: u32 = 1 << 30;
/// One head per grid row: CUDA's gridDim.y limit bounds B·H.
pub const MAX_HEADS: u64 = 65_535;
/// Q, K, V and O together above this cannot fit on any single GPU: the shape is a typo.
pub const MAX_SHAPE_BYTES: u64 = 256 << 30;

/// A product that cannot wrap: `None` on overflow.
fn checked_product(factors: &[u32]) -> Option<u64> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(u64::from(f)))
}

impl Shape {
    // The size helpers below saturate at u64::MAX instead of wrapping; a shape that passed
    // `check_size` (every policy shape does at load) never comes near it.

    /// B·H: independent attention problems, one grid row each.
    pub fn heads(&self) -> u64 {
        checked_product(&[self.b, self.h]).unwrap_or(u64::MAX)
    }
    /// B·H·Sq: query rows, which is also the number of LSE values.
    pub fn rows(&self) -> u64 {
        checked_product(&[self.b, self.h, self.sq]).unwrap_or(u64::MAX)
    }
    /// B·H·Sk: key (and value) rows.
    pub fn kv_rows(&self) -> u64 {
        checked_product(&[self.b, self.h, self.sk]).unwrap_or(u64::MAX)
    }
    /// B·H·Sq·D: elements of Q, and of O.
    pub fn q_elements(&self) -> u64 {
        checked_product(&[self.b, self.h, self.sq, self.d]).unwrap_or(u64::MAX)
    }
    /// B·H·Sk·D: elements of K, and of V.
    pub fn kv_elements(&self) -> u64 {
        checked_product(&[self.b, self.h, self.sk, self.d]).unwrap_or(u64::MAX)
    }

    /// Why the shape cannot be run, if it cannot: a zero or absurd size, or one the kernels' index arithmetic cannot hold.
    pub fn check_size(&self) -> std::result::Result<(), String> {
        let name = &self.name;
        if self.b == 0 || self.h == 0 || self.sq == 0 || self.sk == 0 || self.d == 0 {
            return Err(format!("shape `{name}` has a zero dimension"));
        }
        for (what, len) in [("sq", self.sq), ("sk", self.sk)] {
            if len > MAX_SEQ_LEN {
                return Err(format!(
                    "shape `{name}`: {what} = {len} is above {MAX_SEQ_LEN} (2^30), the most the kernels' 32-bit row indices allow"
                ));
            }
        }
        let heads = self.heads();
        if heads > MAX_HEADS {
            return Err(format!(
                "shape `{name}`: b * h = {heads} heads, above {MAX_HEADS} (CUDA's grid y limit; the kernels run one head per grid row)"
            ));
        }
        // Q and O, K and V, two bytes an element.
        let bytes = checked_product(&[self.b, self.h, self.d, 2])
            .and_then(|x| x.checked_mul(2 * u64::from(self.sq) + 2 * u64::from(self.sk)))
            .filter(|&bytes| bytes <= MAX_SHAPE_BYTES);
        if bytes.is_none() {
            return Err(format!(
                "shape `{name}`: Q, K, V and O would take more than {} GiB, more than any GPU holds",
                MAX_SHAPE_BYTES >> 30
            ));
        }
        Ok(())
    }

    /// Keys query row `i` sees (0 for a row a bottom-right mask hides entirely).
    pub fn visible_keys(&self, i: u32) -> u32 {
        match self.causal.offset(self.sq, self.sk) {
            None => self.sk,
            Some(offset) => (i64::from(i) + offset + 1).clamp(0, i64::from(self.sk)) as u32,
        }
    }

    /// (query, key) pairs the mask admits in one head: the sum over rows of [`Shape::visible_keys`], in closed form.
    pub fn pairs_per_head(&self) -> u64 {
        let (sq, sk) = (i128::from(self.sq), i128::from(self.sk));
        let Some(offset) = self.causal.offset(self.sq, self.sk) else {
            return (sq * sk) as u64;
        };
        // Row i sees clamp(x, 0, Sk) keys with x = i + offset + 1, x running over [first, last].
        let (first, last) = (i128::from(offset) + 1, i128::from(offset) + sq);
        // Rows with 0 < x < Sk see x keys: an arithmetic series.
        let (lo, hi) = (first.max(1), last.min(sk - 1));
        let partial = if lo <= hi {
            (lo + hi) * (hi - lo + 1) / 2
        } else {
            0
        };
        // Rows with x >= Sk see every key.
        let full_rows = (last - first.max(sk) + 1).max(0);
        (partial + full_rows * sk) as u64
    }

    /// FLOPs of the two matmuls over exactly the pairs the mask admits: 4·B·H·D·pairs.
    /// (Unmasked that is FlashAttention's 4·B·H·Sq·Sk·D; causal with Sq = Sk, about half of it.)
    pub fn flops(&self) -> f64 {
        4.0 * self.heads() as f64 * f64::from(self.d) * self.pairs_per_head() as f64
    }
    /// The least DRAM traffic a forward pass can make: read Q, K, V once and write O once.
    pub fn min_dram_bytes(&self, dtype: Dtype) -> f64 {
        (2.0 * self.q_elements() as f64 + 2.0 * self.kv_elements() as f64) * dtype.bytes() as f64
    }
    /// The kernels' `causal` argument: 0 no mask, 1 top-left (PyTorch `is_causal`), 2 bottom-right.
    pub fn causal_code(&self) -> i32 {
        self.causal.code()
    }
    /// Multiply-adds of a naive implementation, to size the CPU oracle.
    pub fn macs(&self) -> f64 {
        2.0 * self.heads() as f64 * self.sq as f64 * self.sk as f64 * self.d as f64
    }
    pub fn label(&self) -> String {
        let mask = match self.causal {
            Causal::None => "",
            Causal::TopLeft => ",causal",
            Causal::BottomRight => ",causal bottom-right",
        };
        format!(
            "{} ({},{},{},{},{}{mask})",
            self.name, self.b, self.h, self.sq, self.sk, self.d
        )
    }
}
