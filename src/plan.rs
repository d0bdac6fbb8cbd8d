//! How a run chooses its points, in the words its log records: the strategy, and why the guided search proposed a point. Types only, so the run log can name them without depending on the search that produces them.
use crate::config::Dtype;
use crate::space::Params;
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
