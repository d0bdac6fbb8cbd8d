//! The read model's parts: planned points, builds, cases and their outcomes, faults, timings, sentinels, baselines, ceilings, duels, the accounting and the closeness of two cases.
use crate::gpu::decide::Verdict;
use crate::gpu::profile::ProfileOutcome;
use crate::gpu::ptxas::EntryResources;
use crate::model::config::{Dtype, Shape};
use crate::model::plan::Proposal;
use crate::model::protocol::{
    CaseFault, CheckStats, Condition, GpuState, SentinelFigure, TimingStats,
};
use crate::model::space::Params;
use std::collections::BTreeMap;

/// A `planned` record: a (variant, head dim) and, when it will not run, why.
#[derive(Debug, Clone)]
pub struct PlannedPoint<'a> {
    pub line: usize,
    pub variant: &'a str,
    /// The step's name in a chain space.
    pub step: Option<&'a str>,
    pub params: &'a Params,
    pub head_dim: u32,
    pub invalid: Option<&'a str>,
    pub proposed_by: Option<&'a Proposal>,
}

/// One build of a (variant, dtype, head dim), the reference kernel's included.
#[derive(Debug, Clone)]
pub struct Build<'a> {
    pub line: usize,
    /// Run clock of the record, seconds.
    pub t: f64,
    pub variant: &'a str,
    pub dtype: Dtype,
    pub head_dim: u32,
    pub outcome: BuildOutcome<'a>,
}

#[derive(Debug, Clone)]
pub enum BuildOutcome<'a> {
    Built {
        cached: bool,
        seconds: f64,
        entries: &'a [EntryResources],
    },
    /// nvcc failed or timed out; `first_error` is the first line of its output that names an
    /// error (the kernel's own `#error` or static_assert text among them), for the reader.
    Failed {
        reason: &'a str,
        first_error: Option<&'a str>,
    },
    /// Built, then turned away by a policy gate (spills, ...).
    Rejected { reason: &'a str },
}

/// What became of one planned (variant, shape, dtype), decided by its last terminal record.
#[derive(Debug, Clone)]
pub enum Outcome<'a> {
    Measured {
        line: usize,
        timing: &'a TimingStats,
        kv_splits: u32,
        /// Taken from the results store (`tune --reuse`): the run and log line that measured it.
        reused: Option<ReusedFrom<'a>>,
        /// What the figure was measured under, still there when timed again: never a champion alone.
        conditions: &'a [Condition],
        /// Stopped by racing after a few samples: it could not win.
        raced: Option<&'a crate::model::protocol::RacedOut>,
    },
    Failed {
        line: usize,
        kind: Failure,
        /// The record's reason; none for cases a crashed or timed-out worker left undone.
        reason: Option<&'a str>,
    },
    /// Timed beyond a measured roof of the GPU: terminal, never a champion.
    Implausible {
        line: usize,
        timing: &'a TimingStats,
        kv_splits: u32,
        reason: &'a str,
    },
    Skipped {
        line: usize,
        reason: &'a str,
        /// Why, as a type; none only for a record built by hand without it.
        why: Option<crate::model::vocab::SkipReason>,
    },
    /// No record decided it: the run was interrupted, or an older flashtune wrote no `case_skipped`.
    NotRun,
}

/// Where a reused case's figures were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReusedFrom<'a> {
    pub run: &'a str,
    pub line: usize,
}

/// A case the store could have supplied, measured again to confirm it (`--reuse --confirm N`).
#[derive(Debug, Clone)]
pub struct Confirmation<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub stored_median_us: f64,
    pub from_run: &'a str,
    pub from_line: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The build of its (variant, dtype, head dim) failed or was rejected by a gate.
    Build,
    /// Wrong answers (NaN, unwritten outputs, errors above tolerance, a race).
    Wrong,
    /// A CUDA error in the case, or a worker that crashed before reaching it.
    Crashed,
    /// The worker ran past its timeout before reaching it.
    TimedOut,
}

/// What a variant did wrong when it ran: any one, on any case, keeps it from being a champion (on
/// that case's shape only, under per-shape dispatch). A build that failed or a gate that turned a
/// build away is no fault: that kernel never ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A wrong answer: NaN, unwritten outputs, errors above tolerance, a race, stale after timing.
    Wrong,
    /// A figure beyond a measured roof of the GPU.
    Implausible,
    /// A CUDA error, a garbled reply, or a worker that died on the case.
    Crashed,
    /// The worker ran past its timeout on the case.
    TimedOut,
    /// It changed memory outside its outputs (an input set).
    WroteOutside,
    /// Its worker failed twice; its remaining cases were not run.
    Quarantined,
}

impl FaultKind {
    /// The fault in words, as the reports name it.
    pub fn words(self) -> &'static str {
        match self {
            FaultKind::Wrong => "wrong",
            FaultKind::Implausible => "implausible",
            FaultKind::Crashed => "crashed",
            FaultKind::TimedOut => "timed out",
            FaultKind::WroteOutside => "wrote outside its outputs",
            FaultKind::Quarantined => "quarantined",
        }
    }

    pub(super) fn of_case_fault(fault: CaseFault) -> FaultKind {
        match fault {
            CaseFault::Crashed => FaultKind::Crashed,
            CaseFault::WroteOutside => FaultKind::WroteOutside,
            CaseFault::Wrong => FaultKind::Wrong,
        }
    }
}

/// One fault of a variant and the record that shows it.
#[derive(Debug, Clone)]
pub struct Fault<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub kind: FaultKind,
    /// The (shape, dtype) it happened on: the case in flight when a worker died or hung. `None`
    /// when the record names none (a worker that died after answering every case).
    pub case: Option<(&'a str, Dtype)>,
    /// What the record says happened.
    pub detail: String,
}

impl Fault<'_> {
    /// "crashed on ragged f16: CUDA error: ...", for the reports.
    pub fn describe(&self) -> String {
        match self.case {
            Some((shape, dtype)) => {
                format!("{} on {shape} {dtype}: {}", self.kind.words(), self.detail)
            }
            None => format!("{}: {}", self.kind.words(), self.detail),
        }
    }

    /// Whether it bars its variant from `shape`: everywhere, unless the user dispatches per shape
    /// and the fault happened on another shape.
    pub fn bars(&self, shape: &str, per_shape_dispatch: bool) -> bool {
        !per_shape_dispatch || self.case.is_none_or(|(s, _)| s == shape)
    }
}

/// The accounting bins: every planned case lands in exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bin {
    Measured,
    Failed,
    Implausible,
    Skipped,
    NotRun,
}

/// What became of a case, as the exports name it (`timed`, `build_failed`, ...) and as prose says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseStatus {
    Timed,
    BuildFailed,
    Wrong,
    Crashed,
    TimedOut,
    Implausible,
    Skipped,
    NotRun,
}

impl CaseStatus {
    /// The CSV's and JSON's word.
    pub fn as_str(self) -> &'static str {
        match self {
            CaseStatus::Timed => "timed",
            CaseStatus::BuildFailed => "build_failed",
            CaseStatus::Wrong => "wrong",
            CaseStatus::Crashed => "crashed",
            CaseStatus::TimedOut => "timed_out",
            CaseStatus::Implausible => "implausible",
            CaseStatus::Skipped => "skipped",
            CaseStatus::NotRun => "not_run",
        }
    }

    /// The words of a sentence or a table cell.
    pub fn words(self) -> &'static str {
        match self {
            CaseStatus::BuildFailed => "build failed",
            CaseStatus::TimedOut => "timed out",
            CaseStatus::NotRun => "not run",
            other => other.as_str(),
        }
    }
}

impl std::fmt::Display for CaseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Outcome<'_> {
    pub fn status(&self) -> CaseStatus {
        match self {
            Outcome::Measured { .. } => CaseStatus::Timed,
            Outcome::Failed { kind, .. } => match kind {
                Failure::Build => CaseStatus::BuildFailed,
                Failure::Wrong => CaseStatus::Wrong,
                Failure::Crashed => CaseStatus::Crashed,
                Failure::TimedOut => CaseStatus::TimedOut,
            },
            Outcome::Implausible { .. } => CaseStatus::Implausible,
            Outcome::Skipped { .. } => CaseStatus::Skipped,
            Outcome::NotRun => CaseStatus::NotRun,
        }
    }

    pub fn bin(&self) -> Bin {
        match self {
            Outcome::Measured { .. } => Bin::Measured,
            Outcome::Failed { .. } => Bin::Failed,
            Outcome::Implausible { .. } => Bin::Implausible,
            Outcome::Skipped { .. } => Bin::Skipped,
            Outcome::NotRun => Bin::NotRun,
        }
    }

    /// The line of the record that decided the outcome.
    pub fn line(&self) -> Option<usize> {
        match self {
            Outcome::Measured { line, .. }
            | Outcome::Failed { line, .. }
            | Outcome::Implausible { line, .. }
            | Outcome::Skipped { line, .. } => Some(*line),
            Outcome::NotRun => None,
        }
    }

    /// The figures of a timed case, believable or not.
    pub fn timing(&self) -> Option<&TimingStats> {
        match self {
            Outcome::Measured { timing, .. } | Outcome::Implausible { timing, .. } => Some(timing),
            _ => None,
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Outcome::Failed { reason, .. } => *reason,
            Outcome::Implausible { reason, .. } | Outcome::Skipped { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// One planned (variant, shape, dtype) and what became of it.
#[derive(Debug, Clone)]
pub struct Case<'a> {
    pub variant: &'a str,
    pub step: Option<&'a str>,
    pub params: &'a Params,
    pub shape: &'a Shape,
    pub dtype: Dtype,
    /// The `planned` record's line (the latest, when a resumed run planned it again).
    pub planned_line: usize,
    pub outcome: Outcome<'a>,
    /// The errors of the last check: a `checked` record, or a `check_failed` one (which may have none).
    pub check: Option<&'a CheckStats>,
    /// nvcc seconds of its (variant, dtype, head dim) build; 0 when it came from nowhere.
    pub build_seconds: f64,
}

impl<'a> Case<'a> {
    /// The line every figure of the case is cited by: its deciding record, else its plan.
    pub fn log_line(&self) -> usize {
        self.outcome.line().unwrap_or(self.planned_line)
    }

    /// The figures of a case that counts: measured and believable.
    pub fn measured(&self) -> Option<&'a TimingStats> {
        match self.outcome {
            Outcome::Measured { timing, .. } => Some(timing),
            _ => None,
        }
    }

    /// Where the figures came from when the results store supplied them.
    pub fn reused(&self) -> Option<ReusedFrom<'a>> {
        match self.outcome {
            Outcome::Measured { reused, .. } => reused,
            _ => None,
        }
    }

    /// What a measured case was timed under (throttling, another process); empty when clean.
    pub fn conditions(&self) -> &'a [Condition] {
        match self.outcome {
            Outcome::Measured { conditions, .. } => conditions,
            _ => &[],
        }
    }

    /// Where racing stopped a measured case.
    pub fn raced(&self) -> Option<&'a crate::model::protocol::RacedOut> {
        match self.outcome {
            Outcome::Measured { raced, .. } => raced,
            _ => None,
        }
    }
}

/// Every `timed` record, re-timings included, with its run clock.
#[derive(Debug, Clone)]
pub struct Timing<'a> {
    pub line: usize,
    pub t: f64,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub timing: &'a TimingStats,
    /// What it was measured under and still was when timed again; empty when clean.
    pub conditions: &'a [Condition],
    /// The GPU that timed it (from the `worker_ran` record before it), when the log says.
    pub device: Option<u32>,
    /// The node and GPU of the Slurm step that timed it (`node:gpuN`).
    pub placed: Option<&'a str>,
    pub gpu: Option<&'a GpuState>,
    /// The sentinels of its GPU just before and just after it, as indexes into `RunIndex::sentinels`.
    pub sentinel_before: Option<usize>,
    pub sentinel_after: Option<usize>,
}

/// One `sentinel` record: the fixed kernels timed on one GPU.
#[derive(Debug, Clone)]
pub struct SentinelPoint<'a> {
    pub line: usize,
    pub t: f64,
    pub device: u32,
    pub when: &'a str,
    pub figures: &'a [SentinelFigure],
    pub gpu: Option<&'a GpuState>,
    pub max_drift: f64,
    pub error: Option<&'a str>,
}

/// A `disturbed` record: a timing taken under a condition, then taken again.
#[derive(Debug, Clone)]
pub struct DisturbedTiming<'a> {
    pub line: usize,
    pub t: f64,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub conditions: &'a [Condition],
    pub timing: &'a TimingStats,
    pub gpu: Option<&'a GpuState>,
}

/// A `drift_duel` record: a champion re-timed against its runner-up after a drift.
#[derive(Debug, Clone)]
pub struct DriftDuel<'a> {
    pub line: usize,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub champion: &'a str,
    pub runner_up: &'a str,
    pub drift: f64,
    pub champion_us: Option<f64>,
    pub runner_up_us: Option<f64>,
    pub verdict: Option<&'a Verdict>,
    pub failure: Option<&'a str>,
    /// The Slurm GPUs the two were timed on, when they differ.
    pub placed: Option<(&'a str, &'a str)>,
}

/// How far apart two sentinels are: the largest relative gap over the figures both have
/// (slower / faster - 1); `None` when they share no figure.
pub fn sentinel_gap(a: &[SentinelFigure], b: &[SentinelFigure]) -> Option<f64> {
    a.iter()
        .filter_map(|fa| {
            let fb = b.iter().find(|fb| fb.name == fa.name)?;
            let (x, y) = (fa.median_us, fb.median_us);
            (x > 0.0 && y > 0.0).then(|| x.max(y) / x.min(y) - 1.0)
        })
        .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))))
}

/// Every `check_failed` record, superseded ones included (the report lists each failure).
#[derive(Debug, Clone)]
pub struct CheckFailure<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub reason: &'a str,
}

#[derive(Debug, Clone)]
pub struct Profile<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub profile: &'a ProfileOutcome,
}

/// The reference library on one (backend, shape, dtype): timed, or why not.
#[derive(Debug, Clone)]
pub struct Baseline<'a> {
    pub line: usize,
    pub backend: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub outcome: Result<BaselineTiming<'a>, &'a str>,
}

#[derive(Debug, Clone, Copy)]
pub struct BaselineTiming<'a> {
    pub timing: &'a TimingStats,
    /// Times it was timed again because its spread was above `[baseline] max_spread`.
    pub remeasured: u32,
    /// Still above the limit after the re-measurements: its figure is not to be trusted.
    pub noisy: bool,
    /// The earlier run's record it was taken from (the results store), when not timed in this run.
    pub reused_from: Option<&'a crate::log::runlog::Citation>,
}

/// A measured roof of the GPU with the log line that holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub value: f64,
    pub line: usize,
}

/// The roofs `baselines/torch_sdpa.py` measured in this run; absent ones were not measured.
#[derive(Debug, Clone, Default)]
pub struct Ceilings {
    /// Dense matmul TFLOP/s per dtype.
    pub matmul_tflops: BTreeMap<Dtype, Measured>,
    /// Device copy, bytes read + written per second, in GB/s.
    pub copy_gbs: Option<Measured>,
    /// A read-only stream (a reduction), bytes read per second, in GB/s.
    pub read_gbs: Option<Measured>,
    /// Roofs the worker could not measure, with the log line saying why: figures are not gated against them.
    pub unavailable: Vec<(usize, String)>,
}

impl Ceilings {
    pub fn is_empty(&self) -> bool {
        self.matmul_tflops.is_empty() && self.bandwidth().is_none()
    }

    /// The bandwidth roof: the faster of the measured streams (a kernel can beat a copy's read/write mix).
    pub fn bandwidth(&self) -> Option<Measured> {
        match (self.copy_gbs, self.read_gbs) {
            (Some(c), Some(r)) => Some(if r.value > c.value { r } else { c }),
            (c, r) => c.or(r),
        }
    }
}

/// An interleaved re-timing of two contenders on one (shape, dtype): the guided search's
/// `search_duel`, or `step`'s `duel` of HEAD's champion against the edit (which has no variant id of its own).
#[derive(Debug, Clone)]
pub struct DuelRecord<'a> {
    pub line: usize,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub champion: &'a str,
    /// `None` for `step`'s edit, built with the champion's parameters.
    pub challenger: Option<&'a str>,
    pub verdict: Option<&'a Verdict>,
}

#[derive(Debug, Clone, Copy)]
pub struct WorkerRun<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub device: u32,
    pub started_t: f64,
    pub seconds: f64,
}

/// One `stage_ran` record: a stage that held a GPU outside the workers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageRun {
    pub stage: crate::model::vocab::Stage,
    pub device: u32,
    pub started_t: f64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    pub line: usize,
    pub seconds: f64,
    pub variants: usize,
    pub measured_cases: usize,
    pub failed_cases: usize,
}

/// planned = measured + failed + implausible + skipped + not run, with what breaks it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accounting {
    pub planned: usize,
    pub measured: usize,
    /// Of `measured`, the cases the results store supplied (`--reuse`).
    pub reused: usize,
    pub failed: usize,
    pub implausible: usize,
    pub skipped: usize,
    pub not_run: usize,
    /// Why the books do not balance: a case with two different outcomes in one session of the run,
    /// a terminal record for a case that was never planned. Empty when they do.
    pub problems: Vec<String>,
}

impl Accounting {
    pub fn holds(&self) -> bool {
        self.problems.is_empty()
            && self.planned
                == self.measured + self.failed + self.implausible + self.skipped + self.not_run
    }
}

/// How far apart two timed cases are, and the noise they are judged against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Closeness {
    /// slower median / faster median - 1 (from a duel: |its gain|).
    pub gap: f64,
    /// The larger relative p10..p90 spread of the two (from a duel: the duel's noise).
    pub noise: f64,
    /// The interleaved duel that judged the pair, when one did.
    pub duel_line: Option<usize>,
}

impl Closeness {
    pub fn tied(&self) -> bool {
        self.gap <= self.noise
    }

    /// In words, for the reports.
    pub fn describe(&self) -> String {
        match self.duel_line {
            Some(line) => format!(
                "{:.1}% apart in an interleaved duel whose noise is {:.1}% (log line {line})",
                self.gap * 100.0,
                self.noise * 100.0
            ),
            None => format!(
                "{:.1}% apart, within the {:.1}% p10..p90 spread",
                self.gap * 100.0,
                self.noise * 100.0
            ),
        }
    }
}

/// One (shape, dtype)'s fastest measured case and its runner-up.
#[derive(Debug, Clone)]
pub struct Pick<'i, 'a> {
    pub best: &'i Case<'a>,
    pub runner_up: Option<&'i Case<'a>>,
    /// Set when the runner-up is within the noise: the two are tied and neither is the finding.
    pub tie: Option<Closeness>,
    /// Faster cases passed over because they were measured under a condition (throttling, another
    /// process) and a clean case exists.
    pub passed_over: Vec<&'i Case<'a>>,
    /// Faster cases that rank below the champion because they lost their last duel with a case
    /// ranked above them (a search round's interleaved re-timing, a drift duel).
    pub outdueled: Vec<&'i Case<'a>>,
    /// The leaders of the other GPUs the cases were timed on (each GPU's pick among its own cases)
    /// that the champion has not yet met in a duel on one GPU: until it has, its title rests on a
    /// ratio across two chips.
    pub unmet_leaders: Vec<&'i Case<'a>>,
}

/// (p90 - p10) / median of one timed case.
pub fn spread(t: &TimingStats) -> f64 {
    (t.p90_us - t.p10_us) / t.median_us
}
