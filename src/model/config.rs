//! Loads `policies.toml` (and any TOML file) strictly, with errors that name file, line, column and key.
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
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

/// `[sandbox]`: the confinement of proposers and agents (src/sandbox.rs). Like `[slurm]`, it
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
    fn fault(entry: &str) -> Option<String> {
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
fn check_timeout(path: &Path, text: &str, key: &str, seconds: u64) -> Result<()> {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
    /// The token the kernels expect in `-DDTYPE=...`.
    pub fn define(self) -> &'static str {
        match self {
            Dtype::F16 => "DTYPE_F16",
            Dtype::Bf16 => "DTYPE_BF16",
        }
    }
    pub fn bytes(self) -> u64 {
        2
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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

impl Policies {
    pub fn load(path: &Path) -> Result<(Self, String)> {
        if !path.exists() {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            return Err(Error::BadInput(format!(
                "cannot read {}: no such file. flashtune reads policies.toml, variants/ and kernels/ \
                 from the project folder ({}): run it there (cd into the clone) or pass --root PATH",
                path.display(),
                folder.map_or_else(|| ".".to_owned(), |f| f.display().to_string())
            )));
        }
        let text = read_text(path)?;
        let policies: Policies = parse_toml(path, &text)?;
        policies.validate(path, &text)?;
        Ok((policies, text))
    }

    fn validate(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        if self.dtypes.is_empty() {
            return fail("dtypes", "at least one dtype is needed".into());
        }
        for dtype in &self.dtypes {
            if !self.tolerance.contains_key(dtype) {
                return fail(
                    "tolerance",
                    format!("no [tolerance.{dtype}] table for listed dtype {dtype}"),
                );
            }
        }
        for (dtype, tolerance) in &self.tolerance {
            for (key, value) in tolerance.limits() {
                check_number(
                    path,
                    text,
                    &format!("tolerance.{dtype}.{key}"),
                    value,
                    Bound::Positive,
                )?;
            }
        }
        let numbers = [
            (
                "measure.warmup_ms",
                self.measure.warmup_ms,
                Bound::NonNegative("no warm-up"),
            ),
            (
                "measure.min_sample_us",
                self.measure.min_sample_us,
                Bound::Positive,
            ),
            (
                "measure.cpu_reference_max_macs",
                self.measure.cpu_reference_max_macs,
                Bound::NonNegative("no shape is checked on the CPU"),
            ),
            (
                "profile.within_pct",
                self.profile.within_pct,
                Bound::NonNegative("champions only"),
            ),
            (
                "guided.min_gain",
                self.guided.min_gain,
                Bound::NonNegative("beating the noise is enough"),
            ),
            (
                "step.threshold",
                self.step.threshold,
                Bound::NonNegative("beating the noise is enough"),
            ),
            (
                "disk.min_free_gib",
                self.disk.min_free_gib,
                Bound::NonNegative("no floor"),
            ),
            (
                "sentinel.max_drift",
                self.sentinel.max_drift,
                Bound::Positive,
            ),
        ];
        for (key, value, bound) in numbers {
            check_number(path, text, key, value, bound)?;
        }
        self.timeouts.check("timeouts", path, text)?;
        check_timeout(path, text, "profile.timeout_s", self.profile.timeout_s)?;
        check_timeout(
            path,
            text,
            "step.proposer_timeout_s",
            self.step.proposer_timeout_s,
        )?;
        check_timeout(
            path,
            text,
            "slurm.start_timeout_s",
            self.slurm.start_timeout_s,
        )?;
        if self.slurm.tasks == 0 {
            return fail("slurm.tasks", "at least one worker is needed".into());
        }
        for (key, entries) in [
            ("sandbox.writable", &self.sandbox.writable),
            ("sandbox.hidden", &self.sandbox.hidden),
        ] {
            if let Some(why) = entries.iter().find_map(|e| SandboxPolicy::fault(e)) {
                return fail(key, why);
            }
        }
        if self.measure.samples < 3 {
            return fail(
                "samples",
                "at least 3 samples are needed for a median and percentiles".into(),
            );
        }
        if !(1..=self.measure.samples).contains(&self.measure.verified_replays) {
            return fail(
                "verified_replays",
                format!(
                    "must be from 1 to samples ({}), not {}",
                    self.measure.samples, self.measure.verified_replays
                ),
            );
        }
        let race = self.measure.race_samples as usize;
        if race != 0 && !(3..self.measure.samples).contains(&race) {
            return fail(
                "race_samples",
                format!(
                    "must be 0 (time every case in full) or from 3 to below samples ({}), not {race}",
                    self.measure.samples
                ),
            );
        }
        for (name, agent) in &self.agents {
            let unknown = unknown_placeholders(&agent.command);
            if !unknown.is_empty() {
                return Err(config_error_at_key(
                    path,
                    text,
                    "command",
                    format!(
                        "[agents.{name}] command names {{{}}}, which flashtune does not fill (it fills {{{}}})",
                        unknown.join("}, {"),
                        AGENT_PLACEHOLDERS.join("}, {")
                    ),
                ));
            }
        }
        for (model, price) in &self.prices {
            for (key, value) in [
                ("input_per_mtok", Some(price.input_per_mtok)),
                ("output_per_mtok", Some(price.output_per_mtok)),
                ("cached_input_per_mtok", price.cached_input_per_mtok),
                ("cache_write_per_mtok", price.cache_write_per_mtok),
            ] {
                if let Some(v) = value {
                    check_number(
                        path,
                        text,
                        &format!("prices.{model}.{key}"),
                        v,
                        Bound::NonNegative("free"),
                    )?;
                }
            }
        }
        if self.step.rounds < 3 {
            return fail(
                "rounds",
                "at least 3 rounds are needed for a median and percentiles".into(),
            );
        }
        if self.sentinel.reps < 3 {
            return fail(
                "sentinel.reps",
                "at least 3 timings are needed for a median and percentiles".into(),
            );
        }
        if self.guided.max_rounds == 0 {
            return fail("guided.max_rounds", "at least 1 round is needed".into());
        }
        for (arch, limits) in &self.build.targets {
            if limits.max_threads_per_block == 0 || limits.max_smem_optin_bytes == 0 {
                return fail(
                    &format!("build.targets.{arch}"),
                    "max_threads_per_block and max_smem_optin_bytes must be above 0".into(),
                );
            }
        }
        self.target_limits(&self.build.default_arch).map_err(|_| {
            config_error_at_key(
                path,
                text,
                "build.default_arch",
                format!(
                    "no [build.targets.{}] table gives the limits of the default arch",
                    self.build.default_arch
                ),
            )
        })?;
        if self.shapes.is_empty() {
            return fail("shapes", "at least one [[shapes]] entry is needed".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for shape in &self.shapes {
            let at = |field: &str, message: String| {
                Err(config_error_in_shape(
                    path,
                    text,
                    &shape.name,
                    field,
                    message,
                ))
            };
            if !names.insert(&shape.name) {
                return at("name", format!("two shapes are named `{}`", shape.name));
            }
            if !SUPPORTED_HEAD_DIMS.contains(&shape.d) {
                return at(
                    "d",
                    format!(
                        "shape `{}`: head dim {} is not supported (64, 96, 128 or 256)",
                        shape.name, shape.d
                    ),
                );
            }
            for (field, value) in [
                ("b", shape.b),
                ("h", shape.h),
                ("sq", shape.sq),
                ("sk", shape.sk),
            ] {
                if value == 0 {
                    return at(
                        field,
                        format!(
                            "shape `{}`: {field} = 0; every dimension must be at least 1",
                            shape.name
                        ),
                    );
                }
            }
            shape.check_size().or_else(|why| at("name", why))?;
        }
        for rule in &self.guided.rules {
            if !self
                .profile
                .bottlenecks
                .iter()
                .any(|b| b.name == rule.bottleneck)
            {
                return fail(
                    "bottleneck",
                    format!(
                        "guided rule `{}` names bottleneck `{}`, which no [[profile.bottlenecks]] rule defines",
                        rule.name, rule.bottleneck
                    ),
                );
            }
        }
        Ok(())
    }

    /// The correctness limits of `dtype`; a dtype with no `[tolerance.<dtype>]` table cannot be checked.
    pub fn tolerance(&self, dtype: Dtype) -> Result<Tolerance> {
        self.tolerance.get(&dtype).copied().ok_or_else(|| {
            Error::BadInput(format!(
                "policies.toml has no [tolerance.{dtype}] table, so {dtype} results cannot be checked; add one or ask for another dtype"
            ))
        })
    }

    /// The limits of a dtype listed in `dtypes`: load refuses a listed dtype without a table.
    pub fn tolerance_for(&self, dtype: Dtype) -> Tolerance {
        self.tolerance(dtype)
            .expect("Policies::load checks every listed dtype has a [tolerance] table")
    }

    /// What a block may use on `arch` (e.g. `sm_89`), from `[build.targets]`.
    pub fn target_limits(&self, arch: &str) -> Result<TargetLimits> {
        self.build.targets.get(arch).copied().ok_or_else(|| {
            let known: Vec<&str> = self.build.targets.keys().map(String::as_str).collect();
            Error::BadInput(format!(
                "policies.toml has no [build.targets.{arch}] table (known: {}); add one with the GPU's max_threads_per_block and max_smem_optin_bytes to build for {arch}",
                known.join(", ")
            ))
        })
    }
}

/// Which values a policy number may take beside finite ones.
#[derive(Clone, Copy)]
enum Bound {
    /// Above zero.
    Positive,
    /// Zero or above; zero means what the text says.
    NonNegative(&'static str),
}

/// TOML reads `nan` and `inf` as numbers: a limit that is NaN compares false and switches its check off.
fn check_number(path: &Path, text: &str, key: &str, value: f64, bound: Bound) -> Result<()> {
    let ok = value.is_finite()
        && match bound {
            Bound::Positive => value > 0.0,
            Bound::NonNegative(_) => value >= 0.0,
        };
    if ok {
        return Ok(());
    }
    let wanted = match bound {
        Bound::Positive => "a finite number above 0".to_owned(),
        Bound::NonNegative(zero) => format!("a finite number >= 0 (0: {zero})"),
    };
    Err(config_error_at_key(
        path,
        text,
        key,
        format!("must be {wanted}, not {value}"),
    ))
}

pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::BadInput(format!("cannot read {}: {e}", path.display())))
}

/// Deserialize strictly; a failure becomes an [`Error::Config`] pointing at the offending key.
pub fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|err| toml_error(path, text, err))
}

fn toml_error(path: &Path, text: &str, err: toml::de::Error) -> Error {
    let (line, column) = err
        .span()
        .map(|span| line_column(text, span.start))
        .unwrap_or((1, 1));
    // toml only prints the key path when it has no source to show, so ask for that rendering.
    let mut keyless = err.clone();
    keyless.set_input(None);
    let rendered = keyless.to_string();
    let mut key = rendered
        .lines()
        .find_map(|l| l.strip_prefix("in `").and_then(|k| k.strip_suffix('`')))
        .map(str::to_owned)
        .unwrap_or_default();
    let message = err.message().trim().to_owned();
    if let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    {
        key = if key.is_empty() {
            field.to_owned()
        } else {
            format!("{key}.{field}")
        };
    }
    if key.is_empty() {
        key = key_on_line(text, line).unwrap_or_else(|| "?".into());
    }
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key,
        message,
    }
}

/// A semantic error about `key` (dotted, e.g. `tolerance.bf16.max_abs`): located at the line that
/// assigns it inside its table, else the first line assigning its last part, else line 1.
pub fn config_error_at_key(path: &Path, text: &str, key: &str, message: String) -> Error {
    let (line, column) = key_in_table(text, key)
        .or_else(|| leaf_anywhere(text, key))
        .unwrap_or((1, 1));
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key: key.to_owned(),
        message,
    }
}

/// A semantic error about `field` of the `[[shapes]]` entry named `shape`: located at that field
/// in that entry (its name line when the field is not written out).
pub fn config_error_in_shape(
    path: &Path,
    text: &str,
    shape: &str,
    field: &str,
    message: String,
) -> Error {
    let lines: Vec<&str> = text.lines().collect();
    let names_it = |l: &&str| {
        l.split_once('=').is_some_and(|(k, v)| {
            k.trim() == "name" && v.trim().trim_matches(|c| c == '"' || c == '\'') == shape
        })
    };
    let location = lines.iter().position(names_it).map(|at| {
        let start = lines[..at]
            .iter()
            .rposition(|l| table_header(l).is_some())
            .map_or(0, |h| h + 1);
        let end = lines[at + 1..]
            .iter()
            .position(|l| table_header(l).is_some())
            .map_or(lines.len(), |n| at + 1 + n);
        (start..end)
            .find(|&i| assigns(lines[i], field))
            .unwrap_or(at)
    });
    let (line, column) = location.map_or((1, 1), |i| (i + 1, indent(lines[i]) + 1));
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key: format!("shapes.{field}"),
        message,
    }
}

/// `[table]` or `[[table]]` → `table`.
fn table_header(line: &str) -> Option<&str> {
    let t = line.trim();
    let inner = t.strip_prefix('[')?.trim_start_matches('[');
    let end = inner.find(']')?;
    Some(inner[..end].trim())
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Whether `line` is `key = ...`.
fn assigns(line: &str, key: &str) -> bool {
    line.trim_start()
        .strip_prefix(key)
        .is_some_and(|rest| rest.trim_start().starts_with('='))
}

/// The table header named `key` (or one under it), or `rest = ` under the longest table prefix of `key`.
fn key_in_table(text: &str, key: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let under = format!("{key}.");
    if let Some(i) = lines
        .iter()
        .position(|l| table_header(l).is_some_and(|t| t == key || t.starts_with(&under)))
    {
        return Some((i + 1, indent(lines[i]) + 1));
    }
    let parts: Vec<&str> = key.split('.').collect();
    for split in (1..parts.len()).rev() {
        let (table, rest) = (parts[..split].join("."), parts[split..].join("."));
        let Some(h) = lines
            .iter()
            .position(|l| table_header(l) == Some(table.as_str()))
        else {
            continue;
        };
        for (i, l) in lines.iter().enumerate().skip(h + 1) {
            if table_header(l).is_some() {
                break;
            }
            if assigns(l, &rest) {
                return Some((i + 1, indent(l) + 1));
            }
        }
    }
    None
}

/// The first line assigning the key's last part, or a table whose name starts with it.
fn leaf_anywhere(text: &str, key: &str) -> Option<(usize, usize)> {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    text.lines().enumerate().find_map(|(i, l)| {
        let trimmed = l.trim_start();
        let is_table = trimmed.trim_start_matches('[').starts_with(leaf);
        (assigns(l, leaf) || is_table).then_some((i + 1, indent(l) + 1))
    })
}

/// A semantic error about a value: located where `needle` first appears in the file.
pub fn config_error_at_text(
    path: &Path,
    text: &str,
    needle: &str,
    key: &str,
    message: String,
) -> Error {
    match text.find(needle) {
        Some(offset) => {
            let (line, column) = line_column(text, offset);
            Error::Config {
                file: path.to_path_buf(),
                line,
                column,
                key: key.to_owned(),
                message,
            }
        }
        None => config_error_at_key(path, text, key, message),
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The dotted key assigned on `line`, qualified by the table header above it.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let index = line.checked_sub(1)?;
    let l = lines.get(index)?;
    let (key, _) = l.split_once('=')?;
    let table = lines[..index]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{}", key.trim()),
        _ => key.trim().to_owned(),
    })
}

/// Where flashtune finds its files: the project root holding `policies.toml`.
#[derive(Debug, Clone)]
pub struct ProjectPaths {
    pub root: PathBuf,
}

impl ProjectPaths {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
    pub fn policies(&self) -> PathBuf {
        self.root.join("policies.toml")
    }
    pub fn runs(&self) -> PathBuf {
        self.root.join("runs")
    }
    /// Content-addressed cubins; `FLASHTUNE_CACHE_DIR` moves it (tests share one across projects).
    pub fn build_cache(&self) -> PathBuf {
        match std::env::var_os("FLASHTUNE_CACHE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => self.runs().join(".build-cache"),
        }
    }
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.root.join(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(sq: u32, sk: u32, causal: Causal) -> Shape {
        Shape {
            name: "t".into(),
            b: 2,
            h: 3,
            sq,
            sk,
            d: 64,
            causal,
        }
    }

    /// The definition, one (query, key) pair at a time.
    fn brute_force_pairs(s: &Shape) -> u64 {
        let offset = s.causal.offset(s.sq, s.sk);
        let mut n = 0;
        for i in 0..i64::from(s.sq) {
            for j in 0..i64::from(s.sk) {
                n += u64::from(offset.is_none_or(|c| j <= i + c));
            }
        }
        n
    }

    #[test]
    fn per_shape_dispatch_is_off_unless_set_and_only_a_bool_sets_it() {
        let path = Path::new("policies.toml");
        let gates = |text: &str| parse_toml::<Gates>(path, text);
        let absent = gates("max_spill_bytes = 0\nplausibility_margin = 0.05\n").unwrap();
        assert!(!absent.per_shape_dispatch);
        let on = "max_spill_bytes = 0\nplausibility_margin = 0.05\nper_shape_dispatch = true\n";
        assert!(gates(on).unwrap().per_shape_dispatch);
        let word =
            "max_spill_bytes = 0\nplausibility_margin = 0.05\nper_shape_dispatch = \"yes\"\n";
        match gates(word).unwrap_err() {
            Error::Config { key, line, .. } => {
                assert_eq!((key.as_str(), line), ("per_shape_dispatch", 3))
            }
            other => panic!("expected a config error, got {other}"),
        }
    }

    #[test]
    fn pairs_in_closed_form_match_a_brute_force_count() {
        let sizes = [1, 2, 3, 7, 16, 77, 128, 300];
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            for &sq in &sizes {
                for &sk in &sizes {
                    let s = shape(sq, sk, causal);
                    assert_eq!(
                        s.pairs_per_head(),
                        brute_force_pairs(&s),
                        "{causal:?} {sq}x{sk}"
                    );
                    let by_rows: u64 = (0..sq).map(|i| u64::from(s.visible_keys(i))).sum();
                    assert_eq!(s.pairs_per_head(), by_rows, "{causal:?} {sq}x{sk}");
                }
            }
        }
    }

    #[test]
    fn flops_count_what_the_mask_admits() {
        let full = |s: &Shape| 4.0 * 6.0 * 64.0 * f64::from(s.sq) * f64::from(s.sk);
        let square = shape(1000, 1000, Causal::TopLeft);
        assert_eq!(square.flops(), full(&square) * 1001.0 / 2000.0);
        // The smoke space's ragged-causal: 87 % of the full work, not half.
        let ragged = shape(300, 77, Causal::TopLeft);
        assert_eq!(ragged.pairs_per_head(), 77 * 78 / 2 + (300 - 77) * 77);
        assert!((ragged.flops() / full(&ragged) - 0.873).abs() < 1e-3);
        // Bottom-right, Sq > Sk: 223 rows see nothing, the last 77 a triangle.
        let hidden = shape(300, 77, Causal::BottomRight);
        assert_eq!(hidden.pairs_per_head(), 77 * 78 / 2);
        // Decode: one query, bottom-right, sees every key; top-left sees key 0 only.
        assert_eq!(shape(1, 4096, Causal::BottomRight).pairs_per_head(), 4096);
        assert_eq!(shape(1, 4096, Causal::TopLeft).pairs_per_head(), 1);
        assert_eq!(
            shape(1, 4096, Causal::None).flops(),
            full(&shape(1, 4096, Causal::None))
        );
        // Sizes where Sq·Sk overflows u32 (and i32) still count exactly.
        let big = shape(MAX_SEQ_LEN, MAX_SEQ_LEN, Causal::TopLeft);
        let n = u64::from(MAX_SEQ_LEN);
        assert_eq!(big.pairs_per_head(), n * (n + 1) / 2);
    }

    #[test]
    fn causal_reads_bools_and_names_and_writes_bools_where_it_can() {
        #[derive(Deserialize, Serialize)]
        struct W {
            causal: Causal,
        }
        for (toml_value, want) in [
            ("true", Causal::TopLeft),
            ("false", Causal::None),
            ("\"none\"", Causal::None),
            ("\"top-left\"", Causal::TopLeft),
            ("\"bottom-right\"", Causal::BottomRight),
        ] {
            let w: W = toml::from_str(&format!("causal = {toml_value}")).unwrap();
            assert_eq!(w.causal, want, "{toml_value}");
        }
        let json = |c| serde_json::to_string(&W { causal: c }).unwrap();
        assert_eq!(json(Causal::TopLeft), r#"{"causal":true}"#);
        assert_eq!(json(Causal::None), r#"{"causal":false}"#);
        assert_eq!(json(Causal::BottomRight), r#"{"causal":"bottom-right"}"#);
        let back: W = serde_json::from_str(&json(Causal::BottomRight)).unwrap();
        assert_eq!(back.causal, Causal::BottomRight);
        let err = toml::from_str::<W>("causal = \"lower-right\"")
            .err()
            .unwrap();
        assert!(err.to_string().contains("bottom-right"), "{err}");
        assert_eq!(
            [Causal::None, Causal::TopLeft, Causal::BottomRight].map(Causal::code),
            [0, 1, 2]
        );
    }

    #[test]
    fn size_helpers_never_wrap_and_absurd_shapes_are_refused() {
        let mut s = shape(u32::MAX, u32::MAX, Causal::None);
        s.b = u32::MAX;
        s.h = u32::MAX;
        assert_eq!(s.heads(), u64::from(u32::MAX) * u64::from(u32::MAX));
        assert_eq!(s.q_elements(), u64::MAX, "saturates instead of wrapping");
        assert!(s.check_size().is_err());
        let ok = shape(8192, 8192, Causal::TopLeft);
        assert_eq!(ok.q_elements(), 6 * 8192 * 64);
        assert_eq!(ok.rows(), 6 * 8192);
        assert!(ok.check_size().is_ok());
        let many_heads = Shape {
            b: 1024,
            h: 128,
            ..ok.clone()
        };
        assert!(many_heads.check_size().unwrap_err().contains("65535"));
        let long = Shape {
            sk: MAX_SEQ_LEN + 1,
            ..ok.clone()
        };
        assert!(long.check_size().unwrap_err().contains("2^30"));
        let huge = Shape {
            b: 64,
            h: 64,
            sq: 1 << 20,
            sk: 1 << 20,
            ..ok
        };
        assert!(huge.check_size().unwrap_err().contains("GiB"));
    }

    #[test]
    fn keys_are_located_inside_their_table() {
        let text = "[tolerance.f16]\nmax_abs = 1\n\n[tolerance.bf16]\n  max_abs = nan\n[build.targets.sm_80]\nx = 1\n";
        let at = |key| match config_error_at_key(Path::new("p.toml"), text, key, String::new()) {
            Error::Config { line, column, .. } => (line, column),
            _ => unreachable!(),
        };
        assert_eq!(at("tolerance.bf16.max_abs"), (5, 3));
        assert_eq!(at("tolerance.f16.max_abs"), (2, 1));
        assert_eq!(at("build.targets"), (6, 1));
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("a = 1\nbc = 2\n", 6), (2, 1));
        assert_eq!(line_column("a = 1\nbc = 2\n", 11), (2, 6));
    }
}
