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

/// Codex reads at most this much of AGENTS.md; flashtune's is held under it.
pub const AGENTS_MD_MAX_BYTES: usize = 32 * 1024;
/// The whole pack (AGENTS.md, PROMPT.md, context/) stays under this; sources that do not fit are listed, not copied.
pub const PACK_MAX_BYTES: u64 = 512 * 1024;
/// A candidate's patch is kept in the log up to this length.
pub const PATCH_MAX_BYTES: usize = 16 * 1024;
/// Entries of history.md (all of them go to history.json, patches only for the last few).
const HISTORY_MD_ENTRIES: usize = 40;
const HISTORY_PATCHES: usize = 8;

/// One earlier attempt at an edit: an in-place step, or one candidate of an agent session's step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntry {
    pub run_id: String,
    pub started_at: String,
    pub step: u32,
    /// The candidate within its step (absent for an in-place `flashtune step`).
    pub candidate: Option<u32>,
    pub base_commit: String,
    pub files: Vec<String>,
    /// `N files, +A -D`, where the log holds the diff.
    pub diff_stat: Option<String>,
    /// The diff of the edit scope (bounded), for the latest entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `committed`, `accepted` (beat HEAD but another candidate was better), `rejected`,
    /// `dropped` (never judged), or `unfinished` (the log ends before a verdict).
    pub verdict: String,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    pub commit: Option<String>,
    pub figures: Vec<DuelFigure>,
    pub cost: Cost,
    pub gpu: String,
    pub fake_gpu: bool,
}

/// One case of a duel, as the log holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DuelFigure {
    pub shape: String,
    pub dtype: Dtype,
    pub champion_us: Option<f64>,
    pub challenger_us: Option<f64>,
    pub gain: Option<f64>,
    pub noise: Option<f64>,
    pub failure: Option<String>,
}

/// What an attempt cost; null where the log does not say.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Cost {
    pub agent_seconds: Option<f64>,
    pub gpu_seconds: Option<f64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub usd: Option<f64>,
}

/// A run log the history reads: its id, when it started, on which GPU.
struct LogMeta {
    run_id: String,
    started_at: String,
    gpu: String,
    fake: bool,
    kernel_sources_hash: String,
}

/// Every run log under `runs_dir` with step records, oldest first (by run id, which starts with the time).
fn step_logs(runs_dir: &Path) -> Vec<(LogMeta, runlog::LoadedLog)> {
    logs_where(runs_dir, |text| {
        text.contains("\"event\":\"step_started\"")
            || text.contains("\"event\":\"candidate_started\"")
    })
}

fn logs_where(runs_dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<(LogMeta, runlog::LoadedLog)> {
    let Ok(dirs) = std::fs::read_dir(runs_dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = dirs
        .filter_map(|e| e.ok().map(|e| e.path().join("log.jsonl")))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        // A cheap look before parsing: most logs of a project are tune runs without steps.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if !wanted(&text) {
            continue;
        }
        let Ok(log) = runlog::read(&path) else {
            continue;
        };
        let Some(h) = log.header() else { continue };
        let meta = LogMeta {
            run_id: h.run_id.clone(),
            started_at: h.started_at.clone(),
            gpu: h.device.name.clone(),
            fake: h.device.fake,
            kernel_sources_hash: h.kernel_sources_hash.clone(),
        };
        out.push((meta, log));
    }
    out
}

/// Every step and candidate that any run log of the project holds, oldest first.
pub fn history(runs_dir: &Path) -> Vec<HistoryEntry> {
    let mut all = Vec::new();
    for (meta, log) in step_logs(runs_dir) {
        all.extend(history_of(&meta, &log));
    }
    let n = all.len();
    for (i, e) in all.iter_mut().enumerate() {
        if i + HISTORY_PATCHES < n {
            e.patch = None;
        }
    }
    all
}

fn history_of(meta: &LogMeta, log: &runlog::LoadedLog) -> Vec<HistoryEntry> {
    // Keyed by (step, candidate); an in-place step is candidate None.
    let mut entries: BTreeMap<(u32, Option<u32>), HistoryEntry> = BTreeMap::new();
    let mut base: BTreeMap<u32, String> = BTreeMap::new();
    let blank = |step: u32, candidate: Option<u32>, base: &str| HistoryEntry {
        run_id: meta.run_id.clone(),
        started_at: meta.started_at.clone(),
        step,
        candidate,
        base_commit: base.to_owned(),
        files: Vec::new(),
        diff_stat: None,
        patch: None,
        verdict: "unfinished".into(),
        reason: "the log ends before a verdict".into(),
        geomean_gain: None,
        commit: None,
        figures: Vec::new(),
        cost: Cost::default(),
        gpu: meta.gpu.clone(),
        fake_gpu: meta.fake,
    };
    let mut in_place_seconds: BTreeMap<u32, f64> = BTreeMap::new();
    for (_, e) in &log.entries {
        match &e.record {
            Record::ProposerRan { step, seconds, .. } => {
                in_place_seconds.insert(*step, *seconds);
            }
            Record::CandidateStarted {
                step,
                candidate,
                base_commit,
                ..
            } => {
                base.insert(*step, base_commit.clone());
                entries.insert(
                    (*step, Some(*candidate)),
                    blank(*step, Some(*candidate), base_commit),
                );
            }
            Record::StepStarted {
                step,
                base_commit,
                changed_files,
            } => {
                base.insert(*step, base_commit.clone());
                let mut entry = blank(*step, None, base_commit);
                entry.files = changed_files.clone();
                entry.cost.agent_seconds = in_place_seconds.get(step).copied();
                entries.insert((*step, None), entry);
            }
            Record::CandidateProposed {
                step,
                candidate,
                seconds,
                changed_files,
                outside_scope,
                diff_stat,
                patch,
                usage,
                ..
            } => {
                let b = base.get(step).cloned().unwrap_or_default();
                let entry = entries
                    .entry((*step, Some(*candidate)))
                    .or_insert_with(|| blank(*step, Some(*candidate), &b));
                entry.files = changed_files.iter().chain(outside_scope).cloned().collect();
                entry.diff_stat = Some(diff_stat.clone());
                entry.patch = (!patch.is_empty()).then(|| patch.clone());
                entry.cost.agent_seconds = Some(*seconds);
                if let Some(u) = usage {
                    entry.cost.input_tokens = Some(u.input_tokens + u.cached_input_tokens);
                    entry.cost.output_tokens = Some(u.output_tokens);
                    entry.cost.usd = u.usd;
                }
            }
            Record::Duel {
                step,
                shape,
                dtype,
                champion,
                challenger,
                verdict,
                failure,
                candidate,
                ..
            } => {
                if let Some(entry) = entries.get_mut(&(*step, *candidate)) {
                    entry.figures.push(DuelFigure {
                        shape: shape.clone(),
                        dtype: *dtype,
                        champion_us: champion.as_ref().map(|t| t.median_us),
                        challenger_us: challenger.as_ref().map(|t| t.median_us),
                        gain: verdict.as_ref().map(|v| v.gain),
                        noise: verdict.as_ref().map(|v| v.noise),
                        failure: failure.clone(),
                    });
                }
            }
            Record::CandidateJudged {
                step,
                candidate,
                accepted,
                reason,
                geomean_gain,
                gpu_seconds,
            } => {
                if let Some(entry) = entries.get_mut(&(*step, Some(*candidate))) {
                    entry.verdict = if *accepted { "accepted" } else { "rejected" }.into();
                    entry.reason = reason.clone();
                    entry.geomean_gain = *geomean_gain;
                    entry.cost.gpu_seconds = Some(*gpu_seconds);
                }
            }
            Record::CandidateDropped {
                step,
                candidate,
                reason,
            } => {
                if let Some(entry) = entries.get_mut(&(*step, Some(*candidate))) {
                    entry.verdict = "dropped".into();
                    entry.reason = reason.clone();
                }
            }
            Record::StepDecided {
                step,
                accepted,
                reason,
                geomean_gain,
                commit,
                candidate,
                ..
            } => {
                if let Some(entry) = entries.get_mut(&(*step, None)) {
                    entry.verdict = if *accepted { "committed" } else { "rejected" }.into();
                    entry.reason = reason.clone();
                    entry.geomean_gain = *geomean_gain;
                    entry.commit = commit.clone();
                }
                if let (Some(k), true) = (candidate, *accepted) {
                    if let Some(entry) = entries.get_mut(&(*step, Some(*k))) {
                        entry.verdict = "committed".into();
                        entry.commit = commit.clone();
                    }
                }
            }
            _ => {}
        }
    }
    entries.into_values().collect()
}

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

fn pct(x: Option<f64>) -> String {
    x.map_or("unknown".into(), |x| format!("{:.1}%", x * 100.0))
}

fn us(x: Option<&Sourced>) -> String {
    x.map_or("unknown (no log holds it)".into(), |s| {
        format!("{:.2} µs ({})", s.value, s.from)
    })
}

/// AGENTS.md: the standing rules, the same at every step.
pub fn agents_md(pack: &ContextPack) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Rules of this work directory (flashtune)\n\n\
         You are editing CUDA attention kernels. flashtune judges your edit when you stop; you do not\n\
         run the judgement yourself, and nothing you say about your edit is taken into account.\n"
    );
    let _ = writeln!(m, "## What you may change\n");
    let _ = writeln!(
        m,
        "- Only files under `{}`. Everything else is compared with the base commit `{}` and any\n  change outside that folder (a new file included) rejects your whole edit.",
        pack.edit_scope,
        short(&pack.base_commit)
    );
    let _ = writeln!(
        m,
        "- Protected, never edit: {}. The reference kernel is the oracle your outputs are checked against.",
        pack.protected
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        m,
        "- Do not commit, switch branches or move HEAD: flashtune commits an accepted edit itself.\n\
         - `AGENTS.md`, `PROMPT.md` and `context/` are flashtune's notes to you; changes to them are ignored.\n\
         - Scratch files belong in `$TMPDIR`, not here.\n"
    );
    let _ = writeln!(m, "## How the verdict is reached\n");
    let _ = writeln!(
        m,
        "1. Your edit is built with nvcc with the champion's parameters (the same -D defines), in a\n   build cache of its own; a build failure or a spill rejected by the gates ends it.\n\
         2. On the GPU, under a lock (one judgement at a time), HEAD's champion and your edit are\n   checked against HEAD's fp32 reference kernel on fresh random inputs (new every step, with\n   poisoned outputs), then timed interleaved (A B, B A, ...), {} rounds per case, on every case\n   listed in PROMPT.md.\n\
         3. The outputs of the timed launches themselves are verified, fresh and large-magnitude\n   inputs are checked again after timing, and the inputs must be left untouched.\n\
         4. Accepted only if the geometric mean gain (of HEAD's median ÷ yours) over all cases beats\n   {:.1}% and the median case's noise (p10..p90 spread ÷ median), and no case is slower by more\n   than the larger of its own noise and {:.1}%.\n",
        pack.rounds,
        pack.threshold * 100.0,
        pack.threshold * 100.0
    );
    let _ = writeln!(m, "## What gets an edit rejected\n");
    let _ = writeln!(
        m,
        "- **wrong**: outputs differ from the reference beyond the dtype's tolerance, NaN, unwritten outputs.\n\
         - **timed outputs differ**: the launches that were timed did not compute the answer (caching by\n  pointer, skipping launches, reading a previous set's output, races between runs).\n\
         - **implausible**: a time faster than the GPU's measured roofs allow (dense matmul, memory bandwidth).\n\
         - **slower** on any case beyond its noise and the threshold, or a geomean gain not above both.\n\
         - a change outside the edit scope, a commit of your own, an agent that fails or runs out of time.\n"
    );
    let _ = writeln!(
        m,
        "## Where to look\n\n\
         - `PROMPT.md`: this step's task, the champion's figures, its bottleneck, the budget left.\n\
         - `context/history.md` (and `history.json`): every earlier attempt on this repository, with\n  its verdict and reason. Do not repeat a rejected idea without a reason to expect a new result.\n\
         - `context/gpu.json`, `context/cases.json`, `context/champion/`: GPU facts, per-case figures and\n  bottleneck metrics, the champion's sources and parameters.\n"
    );
    debug_assert!(m.len() <= AGENTS_MD_MAX_BYTES);
    m
}

/// PROMPT.md: this step's task.
pub fn prompt_md(pack: &ContextPack) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Step {}: make HEAD's attention kernel faster\n\n\
         Edit the kernels under `{}` so that every case below runs faster than HEAD's champion\n\
         (base `{}`), and stays correct. Read `AGENTS.md` for the rules and how you are judged.\n",
        pack.step,
        pack.edit_scope,
        short(&pack.base_commit)
    );
    if let Some(g) = &pack.gpu {
        let _ = writeln!(
            m,
            "GPU: {} ({}, {} SMs, sm {}.{}){}. Measured roofs: {}; bandwidth {}.\n",
            g.name,
            g.arch,
            g.sm_count,
            g.compute_capability.0,
            g.compute_capability.1,
            if g.fake {
                " — the test double: figures are synthetic"
            } else {
                ""
            },
            if g.matmul_tflops.is_empty() {
                "matmul unknown".to_owned()
            } else {
                g.matmul_tflops
                    .iter()
                    .map(|(d, v)| format!("{d} matmul {v:.0} TFLOP/s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            g.bandwidth_gbps
                .map_or("unknown".into(), |b| format!("{b:.0} GB/s"))
        );
    }
    let _ = writeln!(m, "## Cases (all are judged)\n");
    let _ = writeln!(
        m,
        "| case | dtype | champion | HEAD µs | TF/s | % matmul roof | % bandwidth roof | PyTorch µs |"
    );
    let _ = writeln!(m, "|---|---|---|---:|---:|---:|---:|---:|");
    for c in &pack.cases {
        let _ = writeln!(
            m,
            "| {} | {} | `{}` | {} | {} | {} | {} | {} |",
            c.shape.label(),
            c.dtype,
            c.variant,
            c.champion_us
                .as_ref()
                .map_or("unknown".into(), |s| format!("{:.2}", s.value)),
            c.tflops.map_or("unknown".into(), |t| format!("{t:.1}")),
            pct(c.matmul_roof_fraction),
            pct(c.bandwidth_roof_fraction),
            c.pytorch_us
                .as_ref()
                .map_or("unknown".into(), |s| format!("{:.2}", s.value)),
        );
    }
    let _ = writeln!(m, "\nWhere each figure comes from:\n");
    for c in &pack.cases {
        let _ = writeln!(
            m,
            "- {} {}: HEAD {}; PyTorch {}",
            c.shape.name,
            c.dtype,
            us(c.champion_us.as_ref()),
            us(c.pytorch_us.as_ref())
        );
    }
    let _ = writeln!(m, "\n## Bottleneck\n");
    let mut any = false;
    for c in &pack.cases {
        if let Some(b) = &c.bottleneck {
            any = true;
            let metrics: Vec<String> = b
                .metrics
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            let _ = writeln!(
                m,
                "- {} {}: **{}** ({}{}; {})",
                c.shape.name,
                c.dtype,
                b.names.join(", "),
                b.from,
                if b.same_sources {
                    ""
                } else {
                    ", profiled at other kernel sources"
                },
                if metrics.is_empty() {
                    "no metric values logged".into()
                } else {
                    metrics.join(", ")
                }
            );
            for g in &c.guided {
                let _ = writeln!(m, "  - the guided rules would try: {g}");
            }
        }
    }
    if !any {
        let _ = writeln!(
            m,
            "No Nsight Compute profile of the champion is in the run logs (`flashtune profile` adds one)."
        );
    }
    let b = &pack.budget;
    let _ = writeln!(m, "\n## Budget left\n");
    let _ = writeln!(
        m,
        "- steps after this one: {}; candidates this step: {}",
        b.steps_left, b.candidates
    );
    let _ = writeln!(
        m,
        "- dollars: spent {}, limit {}",
        b.spent_usd.map_or("unknown".into(), |x| format!("${x:.2}")),
        b.max_cost_usd.map_or("none".into(), |x| format!("${x:.2}"))
    );
    if let Some(t) = b.time_left_s {
        let _ = writeln!(m, "- time: {:.0} min", t / 60.0);
    }
    if let Some(p) = b.patience_left {
        let _ = writeln!(
            m,
            "- steps without an accepted edit before the session stops: {p}"
        );
    }
    if let Some(f) = b.stop_at_roof {
        let _ = writeln!(
            m,
            "- the session stops when every case reaches {:.0}% of its binding roof",
            f * 100.0
        );
    }
    let tried = pack.history.len();
    let _ = writeln!(
        m,
        "\n## Tried before\n\n{tried} earlier attempts are in `context/history.md`{}.",
        pack.history
            .iter()
            .rev()
            .find(|h| h.verdict == "rejected")
            .map_or(String::new(), |h| format!(
                "; the last rejection: {}",
                h.reason.lines().next().unwrap_or("")
            ))
    );
    m
}

/// history.md: one row per attempt, newest last.
pub fn history_md(history: &[HistoryEntry]) -> String {
    let mut m = String::from("# Earlier attempts on this repository\n\n");
    if history.is_empty() {
        m.push_str("None yet.\n");
        return m;
    }
    let skipped = history.len().saturating_sub(HISTORY_MD_ENTRIES);
    if skipped > 0 {
        let _ = writeln!(m, "{skipped} older attempts are in history.json only.\n");
    }
    let _ = writeln!(
        m,
        "| run | step | cand. | base | diff | verdict | gain | reason | agent s | GPU s | tokens in/out | $ |"
    );
    let _ = writeln!(
        m,
        "|---|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|"
    );
    for h in &history[skipped..] {
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("—".into(), f);
        let _ = writeln!(
            m,
            "| {} | {} | {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {} |",
            h.run_id,
            h.step,
            h.candidate.map_or("—".into(), |c| c.to_string()),
            short(&h.base_commit),
            h.diff_stat.clone().unwrap_or_else(|| h.files.join(" ")),
            h.verdict,
            opt(h.geomean_gain, &|g| format!("{:+.1}%", g * 100.0)),
            h.reason.lines().next().unwrap_or("").replace('|', "/"),
            opt(h.cost.agent_seconds, &|s| format!("{s:.0}")),
            opt(h.cost.gpu_seconds, &|s| format!("{s:.1}")),
            match (h.cost.input_tokens, h.cost.output_tokens) {
                (Some(i), Some(o)) => format!("{i}/{o}"),
                _ => "—".into(),
            },
            opt(h.cost.usd, &|u| format!("{u:.3}"))
        );
    }
    m
}

/// Write the pack into `dir`: AGENTS.md, PROMPT.md and context/. Returns the bytes written.
/// `sources` are (repository-relative path, content) of the champion's files at the base commit.
pub fn write(pack: &ContextPack, sources: &[(String, Vec<u8>)], dir: &Path) -> Result<u64> {
    let agents = agents_md(pack);
    anyhow::ensure!(
        agents.len() <= AGENTS_MD_MAX_BYTES,
        "AGENTS.md would be {} bytes, over the {AGENTS_MD_MAX_BYTES} an agent reads",
        agents.len()
    );
    let context = dir.join("context");
    std::fs::create_dir_all(context.join("champion"))
        .with_context(|| format!("cannot create {}", context.display()))?;
    let mut files: Vec<(PathBuf, Vec<u8>)> = vec![
        (dir.join("AGENTS.md"), agents.into_bytes()),
        (dir.join("PROMPT.md"), prompt_md(pack).into_bytes()),
        (
            context.join("history.md"),
            history_md(&pack.history).into_bytes(),
        ),
        (
            context.join("history.json"),
            serde_json::to_vec_pretty(&pack.history)?,
        ),
        (
            context.join("cases.json"),
            serde_json::to_vec_pretty(&pack.cases)?,
        ),
        (
            context.join("gpu.json"),
            serde_json::to_vec_pretty(&pack.gpu)?,
        ),
        (
            context.join("budget.json"),
            serde_json::to_vec_pretty(&pack.budget)?,
        ),
    ];
    let mut total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let mut left_out = Vec::new();
    for (rel, content) in sources {
        if total + content.len() as u64 > PACK_MAX_BYTES {
            left_out.push(rel.clone());
            continue;
        }
        total += content.len() as u64;
        files.push((context.join("champion").join(rel), content.clone()));
    }
    let params: BTreeMap<String, &BTreeMap<String, String>> = pack
        .cases
        .iter()
        .map(|c| (format!("{} {}", c.shape.name, c.dtype), &c.params))
        .collect();
    let champion = serde_json::json!({
        "variants": pack.cases.iter().map(|c| (format!("{} {}", c.shape.name, c.dtype), c.variant.clone())).collect::<BTreeMap<_, _>>(),
        "params": params,
        "sources": pack.sources,
        "sources_left_out_for_size": left_out,
    });
    files.push((
        context.join("champion.json"),
        serde_json::to_vec_pretty(&champion)?,
    ));
    let mut written = 0;
    for (path, bytes) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, &bytes)
            .with_context(|| format!("cannot write {}", path.display()))?;
        written += bytes.len() as u64;
    }
    Ok(written)
}

/// Paths (relative to a work directory) the pack writes: not part of any candidate's edit.
pub fn is_pack_path(rel: &str) -> bool {
    rel == "AGENTS.md" || rel == "PROMPT.md" || rel == "context" || rel.starts_with("context/")
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(10)]
}
