//! How a run chooses its points, in the words its log records: the strategy, and why the guided search proposed a point. Types only, so the run log can name them without depending on the search that produces them.
use crate::model::config::Dtype;
use crate::model::space::Params;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Strategy {
    /// Every valid point of the space (or every step of a chain).
    #[default]
    Exhaustive,
    /// `count` valid points drawn without replacement, reproducibly from `seed`.
    Random { count: usize, seed: u64 },
    /// Start point, then neighbours proposed by the policy's rules from each champion's bottleneck.
    Guided,
    /// One factor at a time around `champion` (taken from run `parent_run`): each parameter set back to the baseline's value.
    Ablate {
        parent_run: String,
        champion: Params,
    },
}

impl Strategy {
    pub fn label(&self) -> String {
        match self {
            Strategy::Exhaustive => "exhaustive".into(),
            Strategy::Random { count, seed } => format!("random ({count} points, seed {seed})"),
            Strategy::Guided => "guided".into(),
            Strategy::Ablate { parent_run, .. } => {
                format!("ablate (around run {parent_run}'s champion)")
            }
        }
    }
}

/// Why the guided search tried a point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub round: u32,
    pub rule: String,
    pub bottleneck: String,
    /// The champion it is a neighbour of, and where that champion was champion.
    pub from_variant: String,
    pub shape: String,
    pub dtype: Dtype,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundChampion {
    pub shape: String,
    pub dtype: Dtype,
    pub variant: String,
    pub median_us: f64,
}

/// The step name the champion itself carries in an ablation run.
pub const CHAMPION_STEP: &str = "champion";

/// Why a point is in the covering sample, and so in which dtypes it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoverRole {
    /// At an extreme of what a thread holds (accumulator rows, score tiles): built in every dtype,
    /// whose conversions move the registers.
    Registers,
    /// At an extreme of shared memory, which is the element size's doing alone: built in one dtype
    /// of each element size (f16 and bf16 share one).
    SharedMemory,
    /// Brings a parameter value no other sampled point of its group has: built in one dtype, the
    /// dtypes taking turns over these points (the switch's code path is the same in each; the full
    /// build gate's manifest certifies every dtype of every point).
    Value,
}

/// A point of the covering sample and why it is there.
#[derive(Debug, Clone)]
pub struct Covering {
    pub point: crate::model::space::PlannedPoint,
    pub role: CoverRole,
}

/// A sample of a plan's valid points that a build gate can afford on every commit, where the whole
/// plan takes many minutes of nvcc: per (MMA path, head dim), the points at the extremes of what
/// drives registers and shared memory (the most shared memory, the most accumulator rows and score
/// tiles per thread, the least shared memory), then, greedily, points until every value of every
/// parameter that the group holds appears at least once (every code path a switch selects is
/// compiled). Deterministic: the same plan gives the same sample, in plan order.
pub fn covering_sample(planned: &[crate::model::space::PlannedPoint]) -> Vec<Covering> {
    use crate::model::space::{LaunchShape, PlannedPoint};
    use std::collections::{BTreeMap, BTreeSet};
    let valid: Vec<(usize, &PlannedPoint, &LaunchShape)> = planned
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((i, p, p.launch.as_ref().filter(|_| p.invalid.is_none())?)))
        .collect();
    let mut groups: BTreeMap<(String, u32), Vec<usize>> = BTreeMap::new();
    for (n, (_, p, _)) in valid.iter().enumerate() {
        let path = p
            .variant
            .params
            .get("MMA")
            .map_or_else(String::new, ToString::to_string);
        groups.entry((path, p.head_dim)).or_default().push(n);
    }
    // Per thread, in thousandths: rows of `width` values a thread of the CTA holds.
    let per_thread = |l: &LaunchShape, width: u32| {
        l.rows_per_cta as u64 * width as u64 * 1000 / l.threads.max(1) as u64
    };
    let pairs = |p: &PlannedPoint| -> BTreeSet<(String, String)> {
        p.variant
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    };
    let mut chosen: BTreeMap<usize, CoverRole> = BTreeMap::new();
    for members in groups.values() {
        let at = |n: &usize| valid[*n];
        let registers = [
            members
                .iter()
                .max_by_key(|n| per_thread(at(n).2, at(n).1.head_dim)),
            members
                .iter()
                .max_by_key(|n| per_thread(at(n).2, at(n).2.kv_rows_per_block)),
        ];
        let shared_memory = [
            members.iter().max_by_key(|n| at(n).2.smem_bytes),
            members.iter().min_by_key(|n| at(n).2.smem_bytes),
        ];
        let mut picked: BTreeMap<usize, CoverRole> = BTreeMap::new();
        for n in shared_memory.into_iter().flatten() {
            picked.insert(*n, CoverRole::SharedMemory);
        }
        // A point at both kinds of extreme is built as the registers' one: in every dtype.
        for n in registers.into_iter().flatten() {
            picked.insert(*n, CoverRole::Registers);
        }
        let mut covered: BTreeSet<(String, String)> =
            picked.keys().flat_map(|n| pairs(at(n).1)).collect();
        chosen.extend(picked.iter().map(|(n, role)| (valid[*n].0, *role)));
        while let Some(n) = members
            .iter()
            .filter(|n| pairs(at(n).1).difference(&covered).count() > 0)
            .max_by_key(|n| {
                (
                    pairs(at(n).1).difference(&covered).count(),
                    std::cmp::Reverse(**n),
                )
            })
        {
            covered.extend(pairs(at(n).1));
            chosen.insert(valid[*n].0, CoverRole::Value);
        }
    }
    chosen
        .into_iter()
        .map(|(i, role)| Covering {
            point: planned[i].clone(),
            role,
        })
        .collect()
}
