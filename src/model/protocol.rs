//! The worker protocol: JSON requests on the worker's stdin, one JSON reply per line on a pipe of its own (fd 3), so nothing a kernel prints can pass for a reply; under `srun`, which carries only stdin, stdout and stderr, the worker moves its stdout aside for the replies and points fd 1 at stderr, to the same end.
use crate::model::config::{Dtype, Shape, Tolerance};
use crate::model::space::LaunchShape;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use crate::model::vocab::Condition;

/// The environment variable that tells a worker which file descriptor carries its replies.
/// Unset (a worker run by hand, or under ncu), replies go to stdout.
pub const REPLY_FD_ENV: &str = "FLASHTUNE_REPLY_FD";

/// [`REPLY_FD_ENV`]'s value for a worker whose only way back is its stdout (a Slurm job step): the
/// worker keeps its stdout for replies alone and sends everything else written to fd 1 to stderr.
pub const REPLY_ON_STDOUT: &str = "stdout";

/// A worker serves one GPU for its whole life; requests arrive one per line, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum WorkerRequest {
    /// Describe the GPU and run a known-good kernel on it.
    Probe,
    /// Check, time and verify every case of one variant.
    Run(RunRequest),
    /// Time a champion and a challenger interleaved, each checked and verified as `Run` does.
    Duel(DuelRequest),
    /// Measure the GPU's roofs: device copy and read-only bandwidth, dense matmul per dtype.
    Roofs { dtypes: Vec<Dtype> },
    /// Time the drift sentinel: the worker's own fixed kernels, `reps` times each.
    Sentinel { reps: usize },
}

/// Per pair (one shape and dtype): both kernels loaded in one process, on the same inputs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DuelRequest {
    pub measure: MeasureSpec,
    /// Samples per side, taken alternately: champion, challenger, champion, ...
    pub rounds: usize,
    pub pairs: Vec<DuelPair>,
    /// Stop after the first pair that cannot be judged (a failed check, a CUDA error): a step's
    /// edit that is wrong once is wrong, and the remaining cases are not timed.
    #[serde(default)]
    pub stop_at_failure: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DuelPair {
    pub champion: CaseSpec,
    pub challenger: CaseSpec,
}

/// One side of a duel: its checks and its samples (empty when a check failed or CUDA did).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DuelSide {
    pub check: Option<CheckStats>,
    /// The checks after timing: outputs of the timed launches, fresh inputs, the stress set.
    #[serde(default)]
    pub stages: Vec<StageCheck>,
    /// Per-launch microseconds, in the order taken (sample i belongs to round i).
    #[serde(with = "tagged_f64::vec")]
    pub samples_us: Vec<f64>,
}

impl DuelSide {
    /// Why this side may not be judged on its timing, if it may not.
    pub fn failure(&self) -> Option<String> {
        failure_of(self.check.as_ref(), &self.stages)
    }
}

/// One pair's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DuelResult {
    pub shape: String,
    pub dtype: Dtype,
    pub champion: DuelSide,
    pub challenger: DuelSide,
    pub launches_per_sample: u32,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRequest {
    pub measure: MeasureSpec,
    pub cases: Vec<CaseSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasureSpec {
    pub warmup_ms: f64,
    /// Timed graph replays; 0 runs the check only (what a profiler needs to see).
    pub samples: usize,
    pub min_sample_us: f64,
    /// Timed replays per side whose outputs are verified, drawn at random from all that ran after
    /// they ran (`[measure] verified_replays`).
    #[serde(default = "crate::model::config::default_verified_replays")]
    pub verified_replays: usize,
}

/// One (shape, dtype) of one variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseSpec {
    pub shape: Shape,
    pub dtype: Dtype,
    /// Seed of the input sets of this (shape, dtype): one per run, shared by every variant, so the
    /// reference is computed once per set and every variant is judged on the same inputs.
    pub seed: u64,
    pub tolerance: Tolerance,
    /// Shapes up to this many multiply-adds check the fp32 reference against the CPU f64 oracle on
    /// every row of the first set; larger ones (and the other sets) on sampled rows.
    pub cpu_oracle_max_macs: f64,
    pub forward: ForwardKernel,
    pub reference: ReferenceKernel,
    /// Racing: the bar this case must get under to be timed in full (`[measure] race_samples`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race: Option<RaceBar>,
}

/// The best timing of a (shape, dtype) so far in the run, as a bar for the cases timed after it: a
/// case whose p10 over its first `samples` samples lies above `p90_us` cannot win or tie, and stops
/// there (its outputs verified all the same).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RaceBar {
    pub samples: u32,
    /// The p90 of the best timing so far.
    #[serde(with = "tagged_f64")]
    pub p90_us: f64,
    /// The variant that set it.
    pub best: String,
}

/// A case stopped by racing: what it measured when it stopped, against which bar.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RacedOut {
    /// Samples taken before it stopped.
    pub samples: u32,
    /// Their p10, above the bar.
    #[serde(with = "tagged_f64")]
    pub p10_us: f64,
    pub bar: RaceBar,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardKernel {
    pub cubin: PathBuf,
    pub entry: String,
    pub combine_entry: String,
    pub launch: LaunchShape,
    /// The -D definitions the cubin was built with (the fake worker reads FAULT and CHEAT from them).
    pub defines: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceKernel {
    pub cubin: PathBuf,
    pub entry: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum WorkerMessage {
    Device(DeviceInfo),
    Case(Box<CaseResult>),
    Duel(Box<DuelResult>),
    Roofs {
        roofs: Vec<RoofMeasured>,
    },
    Sentinel(SentinelResult),
    /// The worker cannot go on (no GPU, a sticky CUDA error); it exits after this.
    Fatal {
        message: String,
    },
    /// The request is answered in full; the worker waits for the next one.
    Done,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    pub sm_count: u32,
    pub compute_capability: (i32, i32),
    /// The nvcc target for this GPU (`sm_90a` on Hopper, so wgmma stays available).
    pub arch: String,
    pub max_threads_per_block: u32,
    pub max_smem_optin_bytes: u32,
    pub driver_version: i32,
    pub total_memory_bytes: u64,
    /// GPUs the driver shows this process (the default set for `--gpus`).
    #[serde(default)]
    pub visible_devices: u32,
    /// Bytes of L2: input sets rotate through more than twice this, so timing never runs from L2.
    #[serde(default)]
    pub l2_bytes: u64,
    /// True for the test double: nothing it reports was measured.
    #[serde(default)]
    pub fake: bool,
    /// Where a worker under Slurm runs: its node, job step and GPUs (none for a local worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// Where a worker started by Slurm runs, as it sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placement {
    /// The node's host name.
    pub node: String,
    /// `SLURM_JOB_ID`: the allocation the step belongs to.
    pub job: String,
    /// `SLURM_STEP_ID`.
    #[serde(default)]
    pub step: Option<String>,
    /// The GPUs the step was given: `SLURM_STEP_GPUS`, else `CUDA_VISIBLE_DEVICES`; none named
    /// when the step asked for no GPU (the test double).
    #[serde(default)]
    pub gpus: Option<String>,
}

impl Placement {
    /// The GPU this placement names, as a lock or a log names it: `node` or `node:gpus`.
    pub fn gpu_label(&self) -> String {
        match &self.gpus {
            Some(g) => format!("{}:gpu{g}", self.node),
            None => self.node.clone(),
        }
    }
}

/// One roof of the GPU, measured by the worker; `error` instead of a value when it could not be.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoofMeasured {
    /// `matmul` (TFLOP/s, per dtype), `copy` or `read` (GB/s).
    pub name: crate::model::vocab::Roof,
    pub dtype: Option<Dtype>,
    pub value: Option<f64>,
    pub unit: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    pub shape: String,
    pub dtype: Dtype,
    /// The first check: set 0, twice (the second run must match the first bit for bit).
    pub check: Option<CheckStats>,
    /// The checks after timing, in the order run.
    #[serde(default)]
    pub stages: Vec<StageCheck>,
    pub timing: Option<TimingStats>,
    pub function: Option<FunctionAttributes>,
    /// The KV split actually launched (the worker resolves `auto` per shape).
    pub kv_splits: u32,
    /// A CUDA error or a launch that could not be made.
    pub error: Option<String>,
    /// Where the worker's time went on this case.
    #[serde(default)]
    pub costs: CaseCosts,
    /// The GPU's state read right after the timed replays (NVML on a GPU; a model on the double).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_state: Option<GpuState>,
    /// Why there is no state: NVML cannot be loaded or read (CI, a container without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_state_missing: Option<String>,
    /// Stopped by racing after a few samples: it could not win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raced: Option<RacedOut>,
}

impl CaseResult {
    /// What went wrong, from what failed (the same check or stage [`CaseResult::failure`] words);
    /// none when the case passed.
    pub fn fault(&self) -> Option<CaseFault> {
        self.failure()?;
        if self.error.is_some() {
            return Some(CaseFault::Crashed);
        }
        let wrote = match &self.check {
            Some(c) if !c.passed() => c.wrote_outside,
            Some(_) => self
                .stages
                .iter()
                .find(|s| !s.stats.passed())
                .is_some_and(|s| s.stage == Stage::Inputs),
            None => false,
        };
        Some(if wrote {
            CaseFault::WroteOutside
        } else {
            CaseFault::Wrong
        })
    }

    pub fn empty(shape: &str, dtype: Dtype, kv_splits: u32) -> Self {
        CaseResult {
            shape: shape.to_owned(),
            dtype,
            check: None,
            stages: Vec::new(),
            timing: None,
            function: None,
            kv_splits,
            error: None,
            costs: CaseCosts::default(),
            gpu_state: None,
            gpu_state_missing: None,
            raced: None,
        }
    }

    /// Why the case failed, naming the stage that caught it; `None` when every check passed.
    pub fn failure(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(format!("{CUDA_ERROR}: {e}"));
        }
        failure_of(self.check.as_ref(), &self.stages)
    }
}

/// How a failed case's reason begins when CUDA failed in it.
pub const CUDA_ERROR: &str = "CUDA error";
/// How a failed case's reason begins when the kernel changed memory outside its outputs (an input set).
pub const WROTE_OUTSIDE: &str = "the kernel wrote outside its outputs";
/// How a failed case's reason begins when the worker's reply to it was not protocol.
pub const GARBLED_REPLY: &str = "the worker sent a reply that is not protocol";

/// The status of a worker process that could not be started (the executor's, then the scheduler's
/// `worker_crashed` detail begins with it): a failure of the machine, never of the variant.
pub const WORKER_NOT_STARTED: &str = "not started";

/// What went wrong in a failed case: [`CaseResult::fault`] says it from what failed, and the
/// `check_failed` record carries it (logs before it carry only the reason: [`CaseFault::legacy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseFault {
    /// A CUDA error, or a reply the worker garbled: the process did not survive the kernel intact.
    Crashed,
    /// An input set changed: the kernel wrote outside its outputs.
    WroteOutside,
    /// The outputs were wrong (NaN, unwritten, beyond tolerance, a race, stale after timing).
    Wrong,
}

impl CaseFault {
    /// The fault of a `check_failed` record written before the record carried it, read from the
    /// prefix its reason begins with.
    pub fn legacy(reason: &str) -> CaseFault {
        if reason.starts_with(CUDA_ERROR) || reason.starts_with(GARBLED_REPLY) {
            CaseFault::Crashed
        } else if reason.starts_with(WROTE_OUTSIDE) {
            CaseFault::WroteOutside
        } else {
            CaseFault::Wrong
        }
    }
}

fn failure_of(check: Option<&CheckStats>, stages: &[StageCheck]) -> Option<String> {
    match check {
        None => return Some("the worker returned no check".into()),
        Some(c) if !c.passed() => return Some(c.failures.join("; ")),
        Some(_) => {}
    }
    stages.iter().find(|s| !s.stats.passed()).map(|s| {
        format!(
            "{}: {}",
            s.stage.verdict(&s.detail),
            s.stats.failures.join("; ")
        )
    })
}

/// What the GPU was doing while a case was timed: read right after its timed replays (NVML in the
/// worker, the process that holds the GPU), with the throttling counted during them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuState {
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    /// NVML's clock throttle reasons when read (`sw_power_cap`, `hw_thermal_slowdown`, ...);
    /// `gpu_idle` and `applications_clocks_setting` are not throttling and are not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
    /// Milliseconds the driver held the clocks down for power, and for heat, during the timed
    /// replays (NVML's violation counters), where the GPU counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_violation_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thermal_violation_ms: Option<f64>,
    /// Other processes with a compute context on this GPU (the worker itself left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_processes: Vec<GpuProcess>,
}

/// Another process on the GPU, as NVML sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuProcess {
    /// As the driver knows it (in a container, the host's pid).
    pub pid: u32,
    pub used_bytes: Option<u64>,
}

/// Throttle reasons (as `GpuState` names them) that mean heat, and an outside power brake.
/// `sw_power_cap` is recorded but is none of these (see `Condition::Power`): measured on an H100,
/// every large-shape mma kernel ran at the power cap, and taking that as a disturbance made the
/// slowest, coolest kernel the champion.
pub const THERMAL_REASONS: [&str; 3] =
    ["sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"];
pub const POWER_REASONS: [&str; 1] = ["hw_power_brake_slowdown"];

impl GpuState {
    /// The conditions this state shows, in a fixed order.
    pub fn conditions(&self) -> Vec<Condition> {
        let has = |names: &[&str]| {
            self.throttle_reasons
                .iter()
                .any(|r| names.contains(&r.as_str()))
        };
        let counted = |ms: Option<f64>| ms.is_some_and(|ms| ms > 0.0);
        let mut out = Vec::new();
        if has(&THERMAL_REASONS) || counted(self.thermal_violation_ms) {
            out.push(Condition::Thermal);
        }
        // NVML's power violation counter also counts time at the software cap: not used here.
        if has(&POWER_REASONS) {
            out.push(Condition::Power);
        }
        if !self.other_processes.is_empty() {
            out.push(Condition::Neighbour);
        }
        out
    }
}

/// One figure of the drift sentinel: a fixed kernel on a fixed buffer, timed `reps` times.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SentinelFigure {
    /// `fma` (a compute-bound chain of fused multiply-adds: follows the SM clock) or `read` (a
    /// read-only stream: follows the memory clock).
    pub name: String,
    #[serde(with = "tagged_f64")]
    pub median_us: f64,
    #[serde(with = "tagged_f64")]
    pub p10_us: f64,
    #[serde(with = "tagged_f64")]
    pub p90_us: f64,
}

/// The sentinel's answer: its figures and the GPU's state after them, or why it could not run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SentinelResult {
    pub figures: Vec<SentinelFigure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_state: Option<GpuState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Seconds of worker time on one case, by what it was spent on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CaseCosts {
    /// Drawing input sets and computing (and checking) their references, when this case needed new ones.
    pub inputs_s: f64,
    pub check_s: f64,
    /// GPU time inside timed replays, warm-up included.
    pub replays_s: f64,
    /// Reading back and verifying the outputs of the timed launches.
    #[serde(default)]
    pub verify_s: f64,
    /// `verify_s` by part (zero in logs from before it was kept).
    #[serde(default)]
    pub verify_parts: VerifyParts,
    /// Everything else around timing: capture, warm-up bookkeeping, poisoning, negating V.
    pub timing_overhead_s: f64,
    /// The fresh-input and stress-set checks after timing.
    pub recheck_s: f64,
}

/// Where the verification of the timed launches spends its time: what to make cheaper.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VerifyParts {
    /// Reading a kept round's outputs back to the host as the round ends.
    pub keep_s: f64,
    /// Drawing a kept launch's inputs again and computing its reference (the oracle).
    pub references_s: f64,
    /// Uploading the host's copy and comparing it with the reference.
    pub comparisons_s: f64,
    /// Running each kept round again and comparing its outputs with the host's copy.
    pub reruns_s: f64,
}

impl VerifyParts {
    pub fn add(&mut self, other: &VerifyParts) {
        self.keep_s += other.keep_s;
        self.references_s += other.references_s;
        self.comparisons_s += other.comparisons_s;
        self.reruns_s += other.reruns_s;
    }
}

/// A check after the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The outputs of the timed launches themselves, after a replay, against references for the
    /// inputs each launch read (drawn anew before the replay), and a second run on the same inputs.
    Timed,
    /// A set the module never saw, written into the buffers it was timed on, after timing.
    Fresh,
    /// A third set from the input mixture after timing, in buffers of its own (once the only set
    /// with large scores; now every set and round draws them, so it is no longer apart).
    Stress,
    /// Every input set checksummed after the case, as it was drawn.
    Inputs,
}

impl Stage {
    /// The verdict a failure at this stage gets, as logged.
    pub fn verdict(self, detail: &str) -> String {
        match self {
            Stage::Timed => {
                format!("a timed launch's output is wrong for the inputs it read ({detail})")
            }
            Stage::Fresh => {
                format!("wrong on fresh inputs after timing, in the same loaded module ({detail})")
            }
            Stage::Stress => format!("wrong on another set it never saw, after timing ({detail})"),
            Stage::Inputs => format!("{WROTE_OUTSIDE} ({detail})"),
        }
    }

    /// A failed check of this stage that has only a reason.
    pub fn failed(self, why: String) -> StageCheck {
        StageCheck {
            stage: self,
            detail: why,
            stats: CheckStats {
                failures: vec!["its inputs must stay as they were drawn".into()],
                ..Default::default()
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageCheck {
    pub stage: Stage,
    /// Which launch, replay or set this is, in words.
    pub detail: String,
    pub stats: CheckStats,
}

/// How the forward kernel's output compares with the reference on one input set.
/// Every figure is NaN-safe: a NaN anywhere makes it NaN, and a NaN fails the check.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckStats {
    pub elements: u64,
    #[serde(with = "tagged_f64")]
    pub max_abs: f64,
    #[serde(with = "tagged_f64")]
    pub rel_l2: f64,
    #[serde(with = "tagged_f64")]
    pub lse_max_abs: f64,
    /// The largest per-row relative L2 error (|o_i - ref_i| / |ref_i| over one query row).
    #[serde(default, with = "tagged_f64")]
    pub row_rel_l2_max: f64,
    /// Flattened index (b, h, query) of that row.
    #[serde(default)]
    pub worst_row: u64,
    /// NaN or infinite outputs that were written by the kernel.
    pub nan_count: u64,
    /// Outputs still holding the poison pattern: never written.
    pub unwritten_count: u64,
    /// Elements whose bits differ between two runs on the same inputs: a race.
    pub nondeterministic_count: u64,
    /// fp32 reference kernel against the CPU f64 oracle (relative L2 over the rows checked).
    #[serde(default, with = "tagged_f64::option")]
    pub reference_vs_cpu_rel_l2: Option<f64>,
    /// The reference's LSE against the oracle's, largest absolute difference.
    #[serde(default, with = "tagged_f64::option")]
    pub reference_vs_cpu_lse: Option<f64>,
    /// Rows of the reference the oracle recomputed (all of them on small shapes).
    #[serde(default)]
    pub reference_rows_checked: Option<u64>,
    pub failures: Vec<String>,
    /// One of `failures` is the kernel writing outside its outputs (an input set, a reference or
    /// an earlier run's outputs changed under it): the case's fault is that, whatever else failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wrote_outside: bool,
}

impl CheckStats {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TimingStats {
    /// Per-launch time of every sample, in microseconds.
    #[serde(with = "tagged_f64::vec")]
    pub samples_us: Vec<f64>,
    pub launches_per_sample: u32,
    #[serde(with = "tagged_f64")]
    pub median_us: f64,
    #[serde(with = "tagged_f64")]
    pub p10_us: f64,
    #[serde(with = "tagged_f64")]
    pub p90_us: f64,
    #[serde(with = "tagged_f64")]
    pub tflops: f64,
}

/// What the driver says the loaded forward kernel uses, to cross-check ptxas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionAttributes {
    pub registers: i32,
    pub local_bytes: i32,
    pub max_active_ctas_per_sm: u32,
}

/// f64 fields that survive JSON when they are not finite: NaN and infinities are written as the
/// strings "NaN", "inf" and "-inf" (JSON has no such numbers; serde_json would write `null`, which
/// then no longer reads back as a number). `null` reads as NaN, for logs written before.
pub mod tagged_f64 {
    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
        Null(()),
    }

    fn to_repr(x: f64) -> Repr {
        if x.is_finite() {
            Repr::Number(x)
        } else if x.is_nan() {
            Repr::Text("NaN".into())
        } else if x > 0.0 {
            Repr::Text("inf".into())
        } else {
            Repr::Text("-inf".into())
        }
    }

    fn from_repr<E: de::Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Number(x) => Ok(x),
            Repr::Null(()) => Ok(f64::NAN),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(E::custom(format!("`{other}` is not a number"))),
            },
        }
    }

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        to_repr(*x).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        from_repr(Repr::deserialize(d)?)
    }

    pub mod option {
        use super::*;
        pub fn serialize<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            x.map(to_repr).serialize(s)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            // An absent or null optional stays None: only a tagged string means a non-finite value.
            match Option::<Repr>::deserialize(d)? {
                None | Some(Repr::Null(())) => Ok(None),
                Some(r) => from_repr(r).map(Some),
            }
        }
    }

    pub mod vec {
        use super::*;
        pub fn serialize<S: Serializer>(xs: &[f64], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(xs.iter().map(|&x| to_repr(x)))
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
            Vec::<Repr>::deserialize(d)?
                .into_iter()
                .map(from_repr)
                .collect()
        }
    }
}
