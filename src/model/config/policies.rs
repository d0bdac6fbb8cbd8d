//! The typed tables of `policies.toml`: what is built, how it is judged and measured, and where it runs.
use super::errors::config_error_at_key;
use super::shape::{Dtype, Shape};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Everything that decides what is built, how it is judged and how it is measured.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Policies {
    /// The variant space `flashtune tune` walks when no `--space` is given.
    pub default_space: PathBuf,
    /// Element types every variant is checked and timed in.
    pub dtypes: Vec<Dtype>,
    pub build: BuildPolicy,
    pub gates: Gates,
    /// Correctness limits per dtype, against the fp32 reference kernel.
    pub tolerance: BTreeMap<Dtype, Tolerance>,
    pub measure: MeasurePolicy,
    pub baseline: BaselinePolicy,
    pub profile: ProfilePolicy,
    pub guided: GuidedPolicy,
    pub timeouts: Timeouts,
    /// `flashtune step`: when a kernel edit beats HEAD's champion.
    pub step: StepPolicy,
    /// Free space a run needs before it starts.
    pub disk: DiskPolicy,
    /// The drift sentinel: a fixed kernel timed through the run to show the GPU drifting.
    pub sentinel: SentinelPolicy,
    /// Which states of the GPU make a timing be taken again (and flagged if they stay).
    pub gpu_state: GpuStatePolicy,
    pub shapes: Vec<Shape>,
    /// `flashtune step --agent NAME`: how each named coding agent is started in a candidate's work directory.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentTemplate>,
    /// Dollars per million tokens per model, for agents that report tokens but no dollars.
    #[serde(default)]
    pub prices: crate::model::usage::PriceTable,
    /// `--executor slurm`: how the workers are started as Slurm job steps.
    #[serde(default)]
    pub slurm: SlurmPolicy,
    /// What a proposer or a candidate's agent may write beyond its own work folder (`sandbox`).
    #[serde(default)]
    pub sandbox: SandboxPolicy,
}

/// `[sandbox]`: the confinement of proposers and agents (src/run/sandbox.rs). Like `[slurm]`, it
/// never changes a figure, so a run's policies hash leaves it out.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxPolicy {
    /// Confine proposers and agents where the operating system can (Linux Landlock).
    pub enabled: bool,
    /// Folders (or files) an agent CLI may write besides its work folder and scratch folder: its
    /// config and caches. Absolute, or `~/` for the home folder; one that does not exist is left out.
    /// Not `~/.config` by default: git's and systemd's user settings there run commands unconfined.
    pub writable: Vec<String>,
    /// Folders no proposer or agent may read (where flashtune keeps what it seals logs with):
    /// absolute or `~/`; one that does not exist is left out.
    pub hidden: Vec<String>,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        let home = |p: &[&str]| p.iter().map(|d| format!("~/{d}")).collect::<Vec<_>>();
        SandboxPolicy {
            enabled: true,
            writable: home(&[
                ".gemini",
                ".claude",
                ".claude.json",
                ".codex",
                ".aider",
                ".cache",
                ".npm",
            ]),
            hidden: home(&[".local/state/flashtune"]),
        }
    }
}

impl SandboxPolicy {
    /// An entry as a path: `~/` is the home folder ($HOME); `None` without a home.
    pub fn expand(entry: &str) -> Option<PathBuf> {
        match entry.strip_prefix("~/") {
            Some(rest) => Some(PathBuf::from(std::env::var_os("HOME")?).join(rest)),
            None => Some(PathBuf::from(entry)),
        }
    }

    /// Why `entry` cannot name a folder, if it cannot: relative paths would depend on where the
    /// agent runs, and `..` could climb out of what the entry seems to name.
    pub(super) fn fault(entry: &str) -> Option<String> {
        if !(entry.starts_with('/') || entry.starts_with("~/")) {
            return Some(format!(
                "`{entry}` is relative: write an absolute path, or `~/` for the home folder"
            ));
        }
        if Path::new(entry)
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return Some(format!("`{entry}` holds `..`: name the folder itself"));
        }
        None
    }
}

/// `[slurm]`: each worker is one `srun` job step; none of it changes a figure, so a run's policies
/// hash leaves this table out (`resume` on another partition or account is the same experiment).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmPolicy {
    /// Workers at once, one job step and one measurement queue each (`--tasks` overrides it).
    pub tasks: u32,
    /// srun's `--gres` for each worker (`gpu:1`); left out with `--fake-gpu`, whose double needs no
    /// GPU; empty: never asked for (a cluster that hands out GPUs without gres).
    pub gres: String,
    /// srun's `--partition`, `--account` and `--time` for each worker; empty: the cluster's default.
    pub partition: String,
    pub account: String,
    pub time: String,
    /// Further srun arguments, one word each (e.g. `--constraint=h100`, `--mem=32G`).
    pub extra_args: Vec<String>,
    /// Seconds a worker's step may wait for its resources (a queued job, outside an allocation)
    /// before it counts as not started.
    pub start_timeout_s: u64,
    /// Times the cluster may end a variant's worker (step cancelled, node lost, time limit, preempted)
    /// before its remaining cases are skipped; such losses never quarantine it.
    pub max_lost: u32,
}

impl Default for SlurmPolicy {
    fn default() -> Self {
        SlurmPolicy {
            tasks: 4,
            gres: "gpu:1".into(),
            partition: String::new(),
            account: String::new(),
            time: String::new(),
            extra_args: Vec::new(),
            start_timeout_s: 600,
            max_lost: 3,
        }
    }
}

/// The text a run's policies hash covers: the file without its `[slurm]` table, which says how the
/// workers reach their GPUs, and its `[sandbox]` table, which says what an agent may write; neither
/// changes a figure. A file without them hashes as it always did.
pub fn text_for_hash(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_slurm = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[') {
            let name = t
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            in_slurm = ["slurm", "sandbox"]
                .iter()
                .any(|t| name == *t || name.starts_with(&format!("{t}.")));
        }
        if !in_slurm {
            out.push_str(line);
        }
    }
    out
}

/// One coding agent's command line, run by `sh -c` in the candidate's work directory.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTemplate {
    /// Placeholders, each replaced by a shell-quoted value: {workdir}, {prompt_file},
    /// {budget_usd}, {candidate}, {usage_file}.
    pub command: String,
    /// Which output holds the agent's tokens and dollars (none: `$FLASHTUNE_USAGE_FILE` if written).
    #[serde(default)]
    pub usage: Option<crate::model::usage::UsageFormat>,
    /// Environment variables that carry the agent's credentials, any one of which will do. A session
    /// warns before its first step when none is set (the CLI may still be logged in on its own).
    #[serde(default)]
    pub auth_env: Vec<String>,
}

/// The placeholders an agent template may name.
pub const AGENT_PLACEHOLDERS: &[&str] = &[
    "workdir",
    "prompt_file",
    "budget_usd",
    "candidate",
    "usage_file",
];

/// Placeholders `{name}` in a template that flashtune does not fill.
pub fn unknown_placeholders(template: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        let is_name =
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_name && !AGENT_PLACEHOLDERS.contains(&name) {
            unknown.push(name.to_owned());
        }
        rest = &after[close + 1..];
    }
    unknown
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiskPolicy {
    /// `tune` and `resume` refuse to start with less free space than this (GiB) under `runs/` or
    /// under the build cache.
    pub min_free_gib: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelPolicy {
    /// Seconds between two sentinels on a GPU while it measures (0: before every variant).
    pub every_s: u64,
    /// A sentinel more than this fraction away from the run's first one is drift (0.03 = 3%).
    pub max_drift: f64,
    /// Timings of each sentinel kernel per sentinel.
    pub reps: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStatePolicy {
    /// A case timed under one of these (`thermal`, `power`, `neighbour`) is timed again once; if the
    /// condition stays, the figure is flagged and never decides a champion alone.
    pub retime_on: Vec<crate::model::vocab::Condition>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StepPolicy {
    /// Smallest geomean gain (0.02 = 2% faster) an edit must show, beyond the noise, to be kept.
    pub threshold: f64,
    /// Interleaved samples per side (champion, challenger) per shape and dtype.
    pub rounds: usize,
    /// Seconds a `--proposer` command may run before its process group is killed.
    pub proposer_timeout_s: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BuildPolicy {
    /// The nvcc target when no GPU is visible (`flashtune build` without `--arch`, the fake GPU).
    pub default_arch: String,
    pub nvcc_flags: Vec<String>,
    /// Parallel nvcc processes; 0 means one per CPU core.
    pub jobs: usize,
    /// Launch limits per nvcc target, for planning without that GPU (`flashtune build --arch`).
    pub targets: BTreeMap<String, TargetLimits>,
}

/// What one GPU generation allows a block; a GPU that is present reports its own instead.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetLimits {
    pub max_threads_per_block: u32,
    /// Dynamic shared memory one block may opt in to, in bytes.
    pub max_smem_optin_bytes: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Gates {
    /// Spill stores + spill loads allowed per entry function, in bytes.
    pub max_spill_bytes: u64,
    /// A timed figure more than this fraction beyond a measured roof (dense matmul TFLOP/s, or the
    /// least traffic per second against the faster of copy and read-only bandwidth) is implausible.
    pub plausibility_margin: f64,
    /// The user dispatches a kernel per shape: a variant's runtime fault (wrong answer, crash, hang,
    /// write outside its outputs, quarantine, figure beyond a roof) keeps it from being the champion
    /// of that shape only. Off (absent) by default: a fault anywhere bars it everywhere.
    #[serde(default)]
    pub per_shape_dispatch: bool,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Largest |O - O_ref| over all elements.
    pub max_abs: f64,
    /// ||O - O_ref||_2 / ||O_ref||_2.
    pub rel_l2: f64,
    /// The same per query row, worst row: one wrong row of a long shape cannot hide in the totals.
    pub row_rel_l2: f64,
    /// Largest |LSE - LSE_ref|.
    pub lse_max_abs: f64,
}

impl Tolerance {
    /// Every limit by its key, so validation covers each one.
    pub fn limits(&self) -> Vec<(&'static str, f64)> {
        // Destructured without `..`: a new limit does not compile until it is listed here too.
        let Tolerance {
            max_abs,
            rel_l2,
            row_rel_l2,
            lse_max_abs,
        } = *self;
        vec![
            ("max_abs", max_abs),
            ("rel_l2", rel_l2),
            ("row_rel_l2", row_rel_l2),
            ("lse_max_abs", lse_max_abs),
        ]
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MeasurePolicy {
    /// Untimed graph replays before sampling, in milliseconds of GPU time.
    pub warmup_ms: f64,
    /// Timed samples kept per (variant, shape, dtype).
    pub samples: usize,
    /// Kernel launches per captured graph are chosen so one sample lasts at least this long.
    pub min_sample_us: f64,
    /// Shapes at most this many multiply-adds are also checked against a CPU f64 oracle.
    pub cpu_reference_max_macs: f64,
    /// Seed of the first input set; each (variant, shape, dtype) derives its own from it.
    pub seed: u64,
    /// Racing: after this many samples a case stops when its p10 lies above the p90 of the best
    /// timing of its (shape, dtype) so far in the run; 0 times every case in full.
    #[serde(default)]
    pub race_samples: u32,
    /// Timed replays per case whose every launch is verified, drawn at random from all that ran,
    /// after they ran.
    #[serde(default = "default_verified_replays")]
    pub verified_replays: usize,
}

/// Two replays per case, as before the choice was made after the fact.
pub fn default_verified_replays() -> usize {
    2
}

/// The reference library timed beside the variants, in the same run.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BaselinePolicy {
    /// Program and arguments, run from the project root; empty to skip.
    pub command: Vec<String>,
    pub backends: Vec<String>,
    /// A row whose (p90 - p10) / median is above this is timed again (0.05 = 5%).
    pub max_spread: f64,
    /// How many times such a row is timed again before it is reported as noisy.
    pub remeasure: u32,
    /// Run the adapter on `--fake-gpu` runs too, where it is not run by default (its figures would
    /// be a real GPU's, or none, beside synthetic ones): for tests of this stage with a scripted
    /// adapter.
    #[serde(default)]
    pub on_fake_gpu: bool,
}

/// The Nsight Compute pass after timing: which variants, which metrics, how to read them.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilePolicy {
    pub enabled: bool,
    /// Profile every variant within this many percent of a shape's champion (0: champions only).
    pub within_pct: f64,
    /// In a chain space, profile every step on every shape, so the ablation table explains each step.
    pub chain_steps: bool,
    /// Only these dtypes are profiled (profiling is slow and the dtypes rarely differ in kind).
    pub dtypes: Vec<Dtype>,
    /// Kernels of the variant (not the reference) by name.
    pub kernel_regex: String,
    pub metrics: Vec<String>,
    pub timeout_s: u64,
    /// The decision tree, as data: the first rules that hold name the bottleneck.
    pub bottlenecks: Vec<BottleneckRule>,
    /// Profile in `--fake-gpu` runs too (the double's synthetic profiles), where `tune` skips the
    /// stage by default: for tests of the stage itself.
    #[serde(default)]
    pub on_fake_gpu: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BottleneckRule {
    pub name: String,
    /// An evalexpr condition over metric names, dots written as underscores.
    pub when: String,
}

/// `tune --strategy guided`: which neighbours of a champion each bottleneck suggests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GuidedPolicy {
    /// Rounds of (profile champions, propose, measure) before the search stops anyway.
    pub max_rounds: u32,
    /// A challenger becomes champion only when faster by more than this fraction and its own p10..p90 spread.
    pub min_gain: f64,
    pub rules: Vec<GuidedRule>,
}

/// One move: when a champion shows `bottleneck`, try it with `change` applied.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GuidedRule {
    /// A `[[profile.bottlenecks]]` name.
    pub bottleneck: String,
    /// What the report shows as the reason for a proposal.
    pub name: String,
    /// Parameter → `"up"` (next value in the space's list), `"down"` (previous), or a value.
    pub change: indexmap::IndexMap<String, crate::model::vocab::ParamValue>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    pub build_s: u64,
    pub worker_s: u64,
    pub baseline_s: u64,
}

/// Longer than any step of a run should take; a larger timeout is a typo (and `2 * t` must not overflow).
pub const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;

impl Timeouts {
    /// Each timeout by its key under `[timeouts]`.
    pub fn by_key(&self) -> Vec<(&'static str, u64)> {
        // Destructured without `..`: a new timeout does not compile until it is listed here too.
        let Timeouts {
            build_s,
            worker_s,
            baseline_s,
        } = *self;
        vec![
            ("build_s", build_s),
            ("worker_s", worker_s),
            ("baseline_s", baseline_s),
        ]
    }

    /// Every timeout under `[table]` must be 1 s ..= [`MAX_TIMEOUT_S`].
    pub fn check(&self, table: &str, path: &Path, text: &str) -> Result<()> {
        for (key, seconds) in self.by_key() {
            check_timeout(path, text, &format!("{table}.{key}"), seconds)?;
        }
        Ok(())
    }
}

/// A timeout of zero would kill every job at once; one beyond [`MAX_TIMEOUT_S`] is a typo.
pub(super) fn check_timeout(path: &Path, text: &str, key: &str, seconds: u64) -> Result<()> {
    if seconds == 0 || seconds > MAX_TIMEOUT_S {
        return Err(config_error_at_key(
            path,
            text,
            key,
            format!("a timeout must be 1..={MAX_TIMEOUT_S} seconds (one week), not {seconds}"),
        ));
    }
    Ok(())
}
