//! Variant spaces: parse `variants/*.toml`, expand the parameter grid, and judge each point before anything compiles.
pub mod expand;
mod family_from;
mod judge;
mod load;

use evalexpr::Node;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use crate::model::vocab::ParamValue;
pub use expand::{differing, moved, variant_id, MAX_GRID_POINTS};
pub use load::ORACLE_DIR;

// The types live here, so their private fields (the compiled expressions) reach load, expand and
// judge and nothing outside the space.
pub type Params = IndexMap<String, ParamValue>;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainStep {
    pub name: String,
    pub params: Params,
}

/// How a kernel family is built and launched; expressions are over the parameters plus HEAD_DIM and ELEM_BYTES.
#[derive(Debug, Clone)]
pub struct Family {
    pub forward: PathBuf,
    pub forward_entry: String,
    pub combine_entry: String,
    pub reference: PathBuf,
    pub reference_entry: String,
    threads: Expr,
    smem_bytes: Expr,
    rows_per_cta: Expr,
    kv_rows_per_block: Expr,
    kv_splits: Expr,
    tensor_maps: Option<Expr>,
    combine_in_forward: Option<Expr>,
    split_counters: Option<Expr>,
    persistent: Option<Expr>,
    arch_rules: Vec<ArchRule>,
}

impl Family {
    /// The texts of the launch contract's expressions: a parameter one of them names shapes the
    /// launch even where no kernel source reads it.
    pub fn launch_expressions(&self) -> Vec<&str> {
        [
            &self.threads,
            &self.smem_bytes,
            &self.rows_per_cta,
            &self.kv_rows_per_block,
            &self.kv_splits,
        ]
        .into_iter()
        .chain(self.tensor_maps.iter())
        .chain(self.combine_in_forward.iter())
        .chain(self.split_counters.iter())
        .chain(self.persistent.iter())
        .chain(self.arch_rules.iter().map(|r| &r.when))
        .map(|e| e.text.as_str())
        .collect()
    }
}

/// A path that only some nvcc targets have (the instructions it uses exist nowhere else).
#[derive(Debug, Clone)]
struct ArchRule {
    when: Expr,
    archs: Vec<String>,
    reason: String,
}

#[derive(Debug, Clone)]
pub struct Expr {
    text: String,
    tree: Node,
}

#[derive(Debug, Clone)]
pub struct Space {
    pub name: String,
    pub description: String,
    pub path: PathBuf,
    pub text: String,
    pub family: Family,
    /// Every value each parameter takes (the grid, or the union over a chain's steps).
    pub params: IndexMap<String, Vec<ParamValue>>,
    pub chain: Option<Vec<ChainStep>>,
    /// The points of a listed space (`points = [...]`).
    pub points: Option<Vec<Params>>,
    pub shapes: Option<Vec<String>>,
    pub timeouts: Option<crate::model::config::Timeouts>,
    constraints: Vec<Expr>,
    symbols: IndexMap<String, i64>,
    pub baseline: Params,
    pub start: Option<Params>,
    /// The space `family_from` named, as read: its [family] is this space's.
    pub family_source: Option<FamilySource>,
}

/// A file a space was read from beside its own, with the text read (no later write slips in).
#[derive(Debug, Clone)]
pub struct FamilySource {
    pub path: PathBuf,
    pub text: String,
}

impl Space {
    /// Every file this space was read from, with the text read: its own, then the one its family
    /// comes from. What judges an edit must be exactly these.
    pub fn sources(&self) -> Vec<(&std::path::Path, &str)> {
        std::iter::once((self.path.as_path(), self.text.as_str()))
            .chain(
                self.family_source
                    .iter()
                    .map(|s| (s.path.as_path(), s.text.as_str())),
            )
            .collect()
    }

    /// What the run header's space hash covers: the space's text, and its family's file when
    /// that is another (a changed family is a changed space).
    pub fn identity_text(&self) -> std::borrow::Cow<'_, str> {
        match &self.family_source {
            None => std::borrow::Cow::Borrowed(&self.text),
            Some(source) => {
                std::borrow::Cow::Owned(format!("{}\0family_from\0{}", self.text, source.text))
            }
        }
    }
}

/// The limits a launch must respect, read from the GPU (or the policy's default device).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceLimits {
    pub max_threads_per_block: u32,
    pub max_smem_optin_bytes: u32,
    /// The nvcc target: the GPU's compute capability as the worker names it (`sm_90a` on
    /// Hopper), or `flashtune build --arch`. The family's `arch_rules` are judged against it.
    pub arch: String,
}

/// A point of the space.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Variant {
    pub id: String,
    pub params: Params,
    /// The chain step's name, in a chain space.
    #[serde(default)]
    pub step: Option<String>,
}

/// What one compiled kernel needs at launch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchShape {
    pub threads: u32,
    pub smem_bytes: u32,
    pub rows_per_cta: u32,
    /// Keys per K/V tile: the unit a KV split divides.
    pub kv_rows_per_block: u32,
    /// Split count; 0 lets the worker choose per shape (the waves heuristic).
    pub kv_splits: u32,
    /// The kernel takes TMA tensor maps of Q, K and V (boxes of [rows_per_cta or
    /// kv_rows_per_block rows x 64 elements], 128-byte swizzle) after its usual arguments.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tensor_maps: bool,
    /// A split launch merges its splits in the forward kernel (CLUSTER_COMBINE, LAST_CTA_COMBINE):
    /// no combine kernel is launched after it. Without `split_counters` (a cluster) its split
    /// count is fixed, the cluster's size.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub combine_in_forward: bool,
    /// The kernel takes `unsigned* split_counters` after `causal` (LAST_CTA_COMBINE): one word
    /// per (query block, batch x head), zero when first launched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub split_counters: bool,
    /// Persistent CTAs (PERSISTENT_CTAS): the grid holds no more CTAs than the GPU at once, and each
    /// walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... of its split (forward_grid).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persistent: bool,
    /// The CTAs the GPU holds at once (SMs x the kernel's occupancy): a persistent launch's grid.
    /// Resolved by the trial once the kernel is loaded, as an "auto" split count is; 0 in a plan.
    #[serde(default, skip_serializing_if = "crate::model::vocab::is_zero")]
    pub resident_ctas: u32,
}

impl LaunchShape {
    /// A split's tiles for a shape with `heads` = batch x heads: query blocks x heads (one CTA
    /// each, unless persistent).
    pub fn tiles(&self, sq: u32, heads: u32) -> u32 {
        sq.div_ceil(self.rows_per_cta) * heads
    }

    /// attn_fwd's grid for a shape with `heads` = batch x heads: one CTA per query block, head and
    /// split; or, persistent, per split as many CTAs as the GPU holds at once over the splits, and
    /// no more than the split's tiles (query blocks x heads).
    pub fn forward_grid(&self, sq: u32, heads: u32) -> (u32, u32, u32) {
        let splits = self.kv_splits.max(1);
        if self.persistent {
            let per_split = self.resident_ctas.max(1).div_ceil(splits);
            (self.tiles(sq, heads).min(per_split), 1, splits)
        } else {
            (sq.div_ceil(self.rows_per_cta), heads, splits)
        }
    }
}

/// A (variant, head dim) with its verdict; dtype does not change validity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlannedPoint {
    pub variant: Variant,
    pub head_dim: u32,
    pub launch: Option<LaunchShape>,
    /// Why the point cannot run; `None` when valid.
    pub invalid: Option<Invalid>,
}

impl PlannedPoint {
    /// The reason the point cannot run, as the log says it; `None` when valid.
    pub fn why_invalid(&self) -> Option<&str> {
        self.invalid.as_ref().map(|i| i.reason.as_str())
    }
}

/// Why a point cannot run: what ruled it out, and the reason as the log and the reports say it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Invalid {
    pub by: RuledOutBy,
    pub reason: String,
}

/// What rules a point out before it is compiled.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RuledOutBy {
    /// One of the space's `constraints`, named by its text.
    Constraint,
    /// The family's architecture rules (a wgmma point off Hopper).
    Arch,
    /// The family's own rules about its launch.
    Family,
    /// The device's limits (threads per block, shared memory), with the point's figures.
    DeviceLimits,
    /// A launch shape that cannot run at all.
    Launch,
}

/// The unit name under which the fp32 reference kernel is built and logged.
pub const REFERENCE: &str = "reference";
