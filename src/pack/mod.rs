//! The context pack an agent reads before a step (AGENTS.md, PROMPT.md, context/), and the step history every run log of the project holds: figures only from logs.
//!
//! Everything here is read from `runs/*/log.jsonl` (and HEAD's tree, through the caller): a figure
//! names the run and log line it came from, and a figure no log holds is written as unknown.
use crate::config::{Dtype, Policies, Shape};
use crate::protocol::DeviceInfo;
use crate::roofs::Roofs;
use crate::runlog::{self, Record};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

mod history;
mod render;

pub use history::{history, Cost, DuelFigure, HistoryEntry};
use history::{logs_where, LogMeta};
pub use render::{agents_md, history_md, is_pack_path, prompt_md, write};

/// Codex reads at most this much of AGENTS.md; flashtune's is held under it.
pub const AGENTS_MD_MAX_BYTES: usize = 32 * 1024;
/// The whole pack (AGENTS.md, PROMPT.md, context/) stays under this; sources that do not fit are listed, not copied.
pub const PACK_MAX_BYTES: u64 = 512 * 1024;
/// A candidate's patch is kept in the log up to this length.
pub const PATCH_MAX_BYTES: usize = 16 * 1024;
/// Entries of history.md (all of them go to history.json, patches only for the last few).
const HISTORY_MD_ENTRIES: usize = 40;
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
    pub metrics: BTreeMap<String, f64>,
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

/// Everything an agent is told at a step; written as AGENTS.md, PROMPT.md and context/.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextPack {
    pub step: u32,
    pub base_commit: String,
    pub edit_scope: String,
    pub protected: Vec<String>,
    /// `[step] threshold`: the geomean gain an edit must show beyond the noise.
    pub threshold: f64,
    pub rounds: usize,
    pub gpu: Option<GpuFacts>,
    pub cases: Vec<CaseContext>,
    /// The champion's sources at the base commit, repository-relative.
    pub sources: Vec<String>,
    pub budget: BudgetLeft,
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
    /// `run::sources_hash` of the base commit's kernels: figures of other sources are not the champion's.
    pub kernel_sources_hash: &'a str,
    pub edit_scope: &'a str,
    pub protected: Vec<String>,
    pub device: Option<&'a DeviceInfo>,
    pub roofs: &'a Roofs,
    pub cases: Vec<PackCase>,
    pub sources: Vec<String>,
    pub budget: BudgetLeft,
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
        .map(|c| case_context(&input, c, &history, &figure_logs))
        .collect();
    ContextPack {
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

fn case_context(
    input: &PackInput,
    c: &PackCase,
    history: &[HistoryEntry],
    logs: &[(LogMeta, runlog::LoadedLog)],
) -> CaseContext {
    let gpu = input.device.map(|d| d.name.as_str());
    let same_gpu = |m: &LogMeta| gpu.is_none_or(|g| g == m.gpu);
    // HEAD's own figure: a duel whose champion side was the base commit, or whose edit became it.
    let mut champion_us: Option<Sourced> = None;
    for h in history.iter().filter(|h| h.gpu == gpu.unwrap_or(&h.gpu)) {
        for f in h
            .figures
            .iter()
            .filter(|f| f.shape == c.shape.name && f.dtype == c.dtype)
        {
            let value = if h.commit.as_deref() == Some(input.base_commit) {
                f.challenger_us
            } else if h.base_commit == input.base_commit {
                f.champion_us
            } else {
                None
            };
            if let Some(v) = value {
                champion_us = Some(Sourced {
                    value: v,
                    from: format!("run {} step {} duel", h.run_id, h.step),
                });
            }
        }
    }
    let mut pytorch_us = None;
    let mut bottleneck: Option<Bottleneck> = None;
    for (meta, log) in logs.iter().filter(|(m, _)| same_gpu(m)) {
        let same_sources = meta.kernel_sources_hash == input.kernel_sources_hash;
        for (line, e) in &log.entries {
            let from = || format!("run {} line {line}", meta.run_id);
            match &e.record {
                Record::Timed {
                    variant,
                    shape,
                    dtype,
                    timing,
                    ..
                } if same_sources
                    && *variant == c.variant
                    && *shape == c.shape.name
                    && *dtype == c.dtype
                    && champion_us.is_none() =>
                {
                    champion_us = Some(Sourced {
                        value: timing.median_us,
                        from: from(),
                    });
                }
                Record::BaselineTimed {
                    shape,
                    dtype,
                    timing,
                    noisy: false,
                    ..
                } if *shape == c.shape.name && *dtype == c.dtype => {
                    pytorch_us = Some(Sourced {
                        value: timing.median_us,
                        from: from(),
                    });
                }
                Record::Profiled {
                    variant,
                    shape,
                    dtype,
                    profile:
                        crate::profile::ProfileOutcome::Profiled {
                            kernels,
                            bottlenecks,
                            ..
                        },
                } if *variant == c.variant && *shape == c.shape.name && *dtype == c.dtype => {
                    // A profile of the champion's current sources beats an older one.
                    if bottleneck
                        .as_ref()
                        .is_some_and(|b| b.same_sources && !same_sources)
                    {
                        continue;
                    }
                    let rules = &input.policies.profile.bottlenecks;
                    let mut metrics = BTreeMap::new();
                    for k in kernels.iter().take(1) {
                        for (name, m) in &k.metrics {
                            let underscored = name.replace('.', "_");
                            let read = rules.iter().any(|r| {
                                bottlenecks.contains(&r.name) && r.when.contains(&underscored)
                            });
                            if read {
                                metrics.insert(name.clone(), m.value);
                            }
                        }
                    }
                    bottleneck = Some(Bottleneck {
                        names: bottlenecks.clone(),
                        metrics,
                        from: from(),
                        same_sources,
                    });
                }
                _ => {}
            }
        }
    }
    let guided = bottleneck
        .as_ref()
        .map(|b| {
            input
                .policies
                .guided
                .rules
                .iter()
                .filter(|r| b.names.contains(&r.bottleneck))
                .map(|r| {
                    let change: Vec<String> =
                        r.change.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    format!("{} ({})", r.name, change.join(", "))
                })
                .collect()
        })
        .unwrap_or_default();
    let tflops = champion_us
        .as_ref()
        .map(|t| c.shape.flops() / (t.value * 1e-6) / 1e12);
    let matmul_roof_fraction = tflops
        .zip(input.roofs.matmul.get(&c.dtype))
        .map(|(t, r)| t / r);
    let bandwidth_roof_fraction = champion_us
        .as_ref()
        .zip(input.roofs.bandwidth_gbps)
        .map(|(t, r)| c.shape.min_dram_bytes(c.dtype) / (t.value * 1e-6) / 1e9 / r);
    CaseContext {
        shape: c.shape.clone(),
        dtype: c.dtype,
        variant: c.variant.clone(),
        params: c.params.clone(),
        champion_us,
        tflops,
        matmul_roof_fraction,
        bandwidth_roof_fraction,
        pytorch_us,
        bottleneck,
        guided,
    }
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
