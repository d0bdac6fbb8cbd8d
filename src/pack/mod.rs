//! The context pack an agent reads before a step (AGENTS.md, PROMPT.md, context/), and the step history every run log of the project holds: figures only from logs.
//!
//! Everything here is read from `runs/*/log.jsonl` (and HEAD's tree, through the caller): a figure
//! names the run and log line it came from, and a figure no log holds is written as unknown.
use crate::model::config::{Dtype, Policies, Shape};
use crate::model::protocol::DeviceInfo;
use crate::report::roofs::Roofs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

mod figures;
pub mod history;
pub mod ideas;
pub mod render;

pub use figures::{has_profile, SpeedOfLight};
use history::logs_where;
pub use history::{
    attempt_id, attempt_patch_path, find_attempt, history, history_in, parse_attempt_id, Cost,
    DuelFigure, HistoryEntry, MetricsMoved,
};
pub use ideas::{is_near_miss, near_misses, IdeaNote};
pub use render::{agents_md, history_md, is_pack_path, prompt_md, write, MCP_TOOLS};

/// The version of every JSON document the workbench prints or writes (`judge --json`, `context
/// --json`, `history --json`, `show-attempt --json`, ledger.json, errors, and the MCP tools' answers,
/// which are the same documents). Their JSON Schema: tests/fixtures/schemas/workbench-1.schema.json.
pub const JSON_SCHEMA_VERSION: u32 = 1;

/// Codex reads at most this much of AGENTS.md; flashtune's is held under it.
pub const AGENTS_MD_MAX_BYTES: usize = 32 * 1024;
/// The whole pack (AGENTS.md, PROMPT.md, context/) stays under this; sources that do not fit are listed, not copied.
pub const PACK_MAX_BYTES: u64 = 512 * 1024;
/// A candidate's patch is kept in the log up to this length.
pub const PATCH_MAX_BYTES: usize = 16 * 1024;
/// Entries of history.md (all of them go to history.json, patches only for the last few).
pub const HISTORY_MD_ENTRIES: usize = 40;
const HISTORY_PATCHES: usize = 8;

/// A figure with the log line it came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sourced {
    pub value: f64,
    /// `run <id> line <n>`.
    pub from: String,
}

/// The GPU the step runs on and its measured roofs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuFacts {
    pub name: String,
    pub arch: String,
    pub sm_count: u32,
    pub compute_capability: (i32, i32),
    pub max_threads_per_block: u32,
    pub max_smem_optin_bytes: u32,
    pub l2_bytes: u64,
    pub total_memory_bytes: u64,
    /// True for the test double: its figures are synthetic.
    pub fake: bool,
    /// Dense matmul TFLOP/s per dtype, measured at the start of this session.
    pub matmul_tflops: BTreeMap<Dtype, f64>,
    /// The faster of copy and read streams, GB/s, measured at the start of this session.
    pub bandwidth_gbps: Option<f64>,
}

/// HEAD's champion on one case, with what the logs know of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaseContext {
    pub shape: Shape,
    pub dtype: Dtype,
    pub variant: String,
    pub params: BTreeMap<String, String>,
    /// Median µs of HEAD's code on this case, the latest any log holds for HEAD's kernel sources.
    pub champion_us: Option<Sourced>,
    pub tflops: Option<f64>,
    /// Fraction of the measured matmul roof (0.4 = 40%).
    pub matmul_roof_fraction: Option<f64>,
    /// Fraction of the measured bandwidth roof, counting Q, K, V read and O written once.
    pub bandwidth_roof_fraction: Option<f64>,
    pub pytorch_us: Option<Sourced>,
    pub bottleneck: Option<Bottleneck>,
    /// What policies.toml's guided rules would try next for that bottleneck.
    pub guided: Vec<String>,
}

impl CaseContext {
    /// The binding roof's fraction: the larger of the two.
    pub fn roof_fraction(&self) -> Option<f64> {
        match (self.matmul_roof_fraction, self.bandwidth_roof_fraction) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The bottleneck ncu named for the champion, with the metric values its rules read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Bottleneck {
    pub names: Vec<String>,
    /// The evidence: the values of the metrics the naming rules read.
    pub metrics: BTreeMap<String, f64>,
    pub speed_of_light: SpeedOfLight,
    pub from: String,
    /// The profile was taken of these kernel sources (the champion's may have changed since).
    pub same_sources: bool,
}

/// What is left of the session when the step starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BudgetLeft {
    pub steps_left: u32,
    pub candidates: u32,
    pub spent_usd: Option<f64>,
    pub max_cost_usd: Option<f64>,
    pub time_left_s: Option<f64>,
    pub patience_left: Option<u32>,
    pub stop_at_roof: Option<f64>,
}

/// How to build the champion's kernel by hand, as the judge builds it (defines and flags).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BuildHint {
    /// `small f16`, ... : the cases this build serves.
    pub cases: Vec<String>,
    pub variant: String,
    /// The nvcc command line, relative to the work directory.
    pub command: String,
}

/// Everything an agent is told at a step; written as AGENTS.md, PROMPT.md and context/. The same
/// document `flashtune context --json` prints and the MCP `context` tool returns.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextPack {
    pub schema_version: u32,
    /// True where the GPU is the fake one: every figure is synthetic.
    pub synthetic: bool,
    pub step: u32,
    pub base_commit: String,
    pub edit_scope: String,
    pub protected: Vec<String>,
    /// `[step] threshold`: the geomean gain an edit must show beyond the noise.
    pub threshold: f64,
    pub rounds: usize,
    /// How an edit is judged, in words.
    pub how_judged: String,
    /// What gets an edit rejected.
    pub rejected_when: Vec<String>,
    /// How to build the champion's kernel locally, per distinct build.
    pub build: Vec<BuildHint>,
    pub gpu: Option<GpuFacts>,
    pub cases: Vec<CaseContext>,
    /// The champion's sources at the base commit, repository-relative.
    pub sources: Vec<String>,
    pub budget: BudgetLeft,
    /// Earlier attempts not to repeat: rejected, and not close.
    pub avoid: Vec<IdeaNote>,
    /// Earlier attempts that came close (correct, within the threshold of HEAD, or beaten only by
    /// another candidate): worth another try, their patches in `context/attempts/`.
    pub worth_retrying: Vec<IdeaNote>,
    /// The near-miss this work directory starts from (its patch is already applied).
    pub start_from: Option<IdeaNote>,
    pub history: Vec<HistoryEntry>,
}

/// One case the pack describes: HEAD's champion on (shape, dtype).
pub struct PackCase {
    pub shape: Shape,
    pub dtype: Dtype,
    pub variant: String,
    pub params: BTreeMap<String, String>,
}

/// What the caller knows that the logs do not: the repository's state and this session's.
pub struct PackInput<'a> {
    pub policies: &'a Policies,
    pub runs_dir: &'a Path,
    pub step: u32,
    pub base_commit: &'a str,
    /// `run::kernel_sources_hash` of the base commit: figures of other sources are not the champion's.
    pub kernel_sources_hash: &'a str,
    pub edit_scope: &'a str,
    pub protected: Vec<String>,
    pub device: Option<&'a DeviceInfo>,
    pub roofs: &'a Roofs,
    pub cases: Vec<PackCase>,
    pub sources: Vec<String>,
    pub budget: BudgetLeft,
    pub build: Vec<BuildHint>,
    /// The near-miss (attempt id) the work directory starts from.
    pub start_from: Option<String>,
}

/// Gather the pack from the project's logs.
pub fn gather(input: PackInput) -> ContextPack {
    let history = history(input.runs_dir);
    let figure_logs = logs_where(input.runs_dir, |text| {
        text.contains("\"event\":\"timed\"")
            || text.contains("\"event\":\"duel\"")
            || text.contains("\"event\":\"profiled\"")
            || text.contains("\"event\":\"baseline_timed\"")
    });
    let cases = input
        .cases
        .iter()
        .map(|c| figures::case_context(&input, c, &history, &figure_logs))
        .collect();
    let gpu = input.device.map(|d| d.name.as_str());
    let threshold = input.policies.step.threshold;
    let avoid = ideas::to_avoid(&history, threshold, gpu);
    let worth_retrying = near_misses(&history, threshold, gpu)
        .into_iter()
        .take(ideas::RETRY_MAX)
        .map(IdeaNote::of)
        .collect();
    let start_from = input
        .start_from
        .as_deref()
        .and_then(|id| history.iter().find(|h| h.attempt == id).map(IdeaNote::of));
    ContextPack {
        schema_version: JSON_SCHEMA_VERSION,
        synthetic: input.device.is_some_and(|d| d.fake),
        how_judged: how_judged(input.policies),
        rejected_when: REJECTED_WHEN.iter().map(|s| (*s).to_owned()).collect(),
        build: input.build.clone(),
        avoid,
        worth_retrying,
        start_from,
        step: input.step,
        base_commit: input.base_commit.to_owned(),
        edit_scope: input.edit_scope.to_owned(),
        protected: input.protected.clone(),
        threshold: input.policies.step.threshold,
        rounds: input.policies.step.rounds,
        gpu: input.device.map(|d| GpuFacts {
            name: d.name.clone(),
            arch: d.arch.clone(),
            sm_count: d.sm_count,
            compute_capability: d.compute_capability,
            max_threads_per_block: d.max_threads_per_block,
            max_smem_optin_bytes: d.max_smem_optin_bytes,
            l2_bytes: d.l2_bytes,
            total_memory_bytes: d.total_memory_bytes,
            fake: d.fake,
            matmul_tflops: input.roofs.matmul.clone(),
            bandwidth_gbps: input.roofs.bandwidth_gbps,
        }),
        cases,
        sources: input.sources.clone(),
        budget: input.budget.clone(),
        history,
    }
}

/// What gets an edit rejected, in words (the pack's and the MCP server's).
pub const REJECTED_WHEN: &[&str] = &[
    "it does not build, spills registers, or breaks a gate in policies.toml",
    "it is wrong on any case (max abs, relative L2, NaN or unwritten outputs against the reference)",
    "the outputs of the timed launches differ from the checked launch (caching, skipping work)",
    "it is wrong on fresh inputs after timing, or on any input of the one mixture every set and round is drawn from (large scores, aligned or spiky channels, outlier tokens)",
    "its figure is implausible (beyond the GPU's measured roofs)",
    "it is slower on any case beyond HEAD's noise, its timing on a case is far noisier than HEAD's (unstable), or it is not faster overall",
    "it changes anything outside the edit scope or a protected file",
];

/// How an edit is judged, in words.
pub fn how_judged(policies: &Policies) -> String {
    let step = &policies.step;
    format!(
        "HEAD's champion and your edit are built with the same parameters (HEAD's from HEAD's tree, yours from the working tree), \
         checked against HEAD's fp32 reference on fresh inputs with poisoned outputs, then timed interleaved {} rounds on every \
         shape and dtype. The edit is committed only if its geomean gain beats {:.1}% and the noise, and no case is slower \
         by more than its noise.",
        step.rounds,
        step.threshold * 100.0
    )
}

/// A time's fraction of its binding measured roof (the larger of matmul and bandwidth); none without a roof.
pub fn roof_fraction(shape: &Shape, dtype: Dtype, us: f64, roofs: &Roofs) -> Option<f64> {
    let seconds = us * 1e-6;
    let compute = roofs
        .matmul
        .get(&dtype)
        .map(|r| shape.flops() / seconds / 1e12 / r);
    let memory = roofs
        .bandwidth_gbps
        .map(|r| shape.min_dram_bytes(dtype) / seconds / 1e9 / r);
    match (compute, memory) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
