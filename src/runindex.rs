//! One read model of a run: the log's records sorted once into the plan, the builds, what became of every planned case (with the line that decided it), the profiles, baselines, ceilings, duels and the search; every report and export reads a run through it.
use crate::config::{Dtype, Shape};
use crate::decide::Verdict;
use crate::plan::Proposal;
use crate::profile::ProfileOutcome;
use crate::protocol::{
    CaseFault, CheckStats, Condition, GpuState, SentinelFigure, TimingStats, GARBLED_REPLY,
    WORKER_NOT_STARTED,
};
use crate::ptxas::EntryResources;
use crate::runlog::{Header, LoadedLog, Record};
use crate::space::Params;
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
    /// nvcc failed or timed out.
    Failed { reason: &'a str },
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
        raced: Option<&'a crate::protocol::RacedOut>,
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

    fn of_check_failure(reason: &str) -> FaultKind {
        match CaseFault::of_reason(reason) {
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

impl Outcome<'_> {
    /// The status word of the CSV and JSON exports.
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Measured { .. } => "timed",
            Outcome::Failed { kind, .. } => match kind {
                Failure::Build => "build_failed",
                Failure::Wrong => "wrong",
                Failure::Crashed => "crashed",
                Failure::TimedOut => "timed_out",
            },
            Outcome::Implausible { .. } => "implausible",
            Outcome::Skipped { .. } => "skipped",
            Outcome::NotRun => "not_run",
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
    pub fn raced(&self) -> Option<&'a crate::protocol::RacedOut> {
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
}

/// (p90 - p10) / median of one timed case.
pub fn spread(t: &TimingStats) -> f64 {
    (t.p90_us - t.p10_us) / t.median_us
}

type CaseKey<'a> = (&'a str, &'a str, Dtype);

/// A run log sorted once for its readers; it borrows the log and copies no figure.
pub struct RunIndex<'a> {
    pub log: &'a LoadedLog,
    pub header: Option<&'a Header>,
    /// Every `planned` record, valid or not, in log order.
    pub planned: Vec<PlannedPoint<'a>>,
    pub builds: Vec<Build<'a>>,
    /// Every valid planned (variant, shape, dtype), in the order first planned.
    pub cases: Vec<Case<'a>>,
    pub timings: Vec<Timing<'a>>,
    pub check_failures: Vec<CheckFailure<'a>>,
    pub profiles: Vec<Profile<'a>>,
    pub baselines: Vec<Baseline<'a>>,
    /// Why the reference library was not run at all (the last such record).
    pub baseline_missing: Option<&'a str>,
    pub ceilings: Ceilings,
    pub duels: Vec<DuelRecord<'a>>,
    /// `search_round`, `search_stopped` and `search_duel`, in log order.
    pub search: Vec<(usize, &'a Record)>,
    /// Worker crashes and timeouts, budgets, quarantines and unhealthy GPUs, in log order.
    pub incidents: Vec<(usize, &'a Record)>,
    /// Every runtime fault of every variant, in log order, those a retry or a resume made good included.
    pub faults: Vec<Fault<'a>>,
    /// The run's `[gates] per_shape_dispatch` (from its header): a fault bars a variant from its own shape only.
    pub per_shape_dispatch: bool,
    /// The drift sentinels, in log order.
    pub sentinels: Vec<SentinelPoint<'a>>,
    /// Timings taken under a condition and taken again.
    pub disturbed: Vec<DisturbedTiming<'a>>,
    pub drift_duels: Vec<DriftDuel<'a>>,
    /// GPUs whose state could not be read, and why (log line, device, reason).
    pub state_unavailable: Vec<(usize, u32, &'a str)>,
    pub workers: Vec<WorkerRun<'a>>,
    /// The last `interrupted` record: its line and reason.
    pub interrupted: Option<(usize, &'a str)>,
    /// The last `dispatch_order` record: a budgeted run's order, best first, with its line.
    pub dispatch_order: Option<(usize, &'a [crate::runlog::Ranked])>,
    /// Cases measured again to confirm what the store held.
    pub confirmations: Vec<Confirmation<'a>>,
    pub finished: Option<Finished>,
    /// The latest run clock in the log.
    pub wall_seconds: f64,
    pub accounting: Accounting,
    by_key: BTreeMap<CaseKey<'a>, usize>,
}

/// A case's last terminal record in the current session, to catch two different outcomes.
#[derive(Clone, Copy)]
struct Decided {
    session: usize,
    bin: Bin,
    line: usize,
    status: &'static str,
    /// Decided by its build's failure: a `case_skipped` for it restates that, not a second outcome.
    by_build: bool,
}

impl<'a> RunIndex<'a> {
    pub fn new(log: &'a LoadedLog) -> Self {
        let header = log.header();
        let mut ix = RunIndex {
            log,
            header,
            planned: Vec::new(),
            builds: Vec::new(),
            cases: Vec::new(),
            timings: Vec::new(),
            check_failures: Vec::new(),
            profiles: Vec::new(),
            baselines: Vec::new(),
            baseline_missing: None,
            ceilings: Ceilings::default(),
            duels: Vec::new(),
            search: Vec::new(),
            incidents: Vec::new(),
            faults: Vec::new(),
            per_shape_dispatch: header.is_some_and(|h| h.per_shape_dispatch),
            sentinels: Vec::new(),
            disturbed: Vec::new(),
            drift_duels: Vec::new(),
            state_unavailable: Vec::new(),
            workers: Vec::new(),
            interrupted: None,
            dispatch_order: None,
            confirmations: Vec::new(),
            finished: None,
            wall_seconds: 0.0,
            accounting: Accounting::default(),
            by_key: BTreeMap::new(),
        };
        let shapes: &[Shape] = header.map_or(&[], |h| &h.shapes);
        let dtypes: &[Dtype] = header.map_or(&[], |h| &h.dtypes);
        let mut ledger = Ledger::default();
        let mut session = 0usize;
        let mut build_seconds: BTreeMap<(&str, Dtype, u32), f64> = BTreeMap::new();
        // The GPU each variant's last worker ran on: its cases' records follow that `worker_ran`.
        let mut device_of: BTreeMap<&str, u32> = BTreeMap::new();
        // Whether each variant's last failed worker failed by the variant's own doing.
        let mut own_worker_failure: BTreeMap<&str, bool> = BTreeMap::new();
        for (line, e) in &log.entries {
            let line = *line;
            ix.wall_seconds = ix.wall_seconds.max(e.t);
            match &e.record {
                Record::Planned {
                    variant,
                    step,
                    params,
                    head_dim,
                    invalid,
                    proposed_by,
                    ..
                } => {
                    ix.planned.push(PlannedPoint {
                        line,
                        variant,
                        step: step.as_deref(),
                        params,
                        head_dim: *head_dim,
                        invalid: invalid.as_deref(),
                        proposed_by: proposed_by.as_ref(),
                    });
                    if invalid.is_some() {
                        continue;
                    }
                    for shape in shapes.iter().filter(|s| s.d == *head_dim) {
                        for &dtype in dtypes {
                            let key = (variant.as_str(), shape.name.as_str(), dtype);
                            match ix.by_key.get(&key) {
                                // Planned again by a resumed run: the plan is refreshed, what the
                                // case already came to stands until a later record decides it anew.
                                Some(&i) => {
                                    let c = &mut ix.cases[i];
                                    c.step = step.as_deref();
                                    c.params = params;
                                    c.planned_line = line;
                                }
                                None => {
                                    ix.by_key.insert(key, ix.cases.len());
                                    ledger.decided.push(None);
                                    ix.cases.push(Case {
                                        variant,
                                        step: step.as_deref(),
                                        params,
                                        shape,
                                        dtype,
                                        planned_line: line,
                                        outcome: Outcome::NotRun,
                                        check: None,
                                        build_seconds: 0.0,
                                    });
                                }
                            }
                        }
                    }
                }
                Record::Built {
                    variant,
                    dtype,
                    head_dim,
                    cached,
                    seconds,
                    entries,
                    ..
                } => {
                    build_seconds.insert((variant, *dtype, *head_dim), *seconds);
                    ix.builds.push(Build {
                        line,
                        t: e.t,
                        variant,
                        dtype: *dtype,
                        head_dim: *head_dim,
                        outcome: BuildOutcome::Built {
                            cached: *cached,
                            seconds: *seconds,
                            entries,
                        },
                    });
                }
                Record::BuildFailed {
                    variant,
                    dtype,
                    head_dim,
                    reason,
                    ..
                }
                | Record::Rejected {
                    variant,
                    dtype,
                    head_dim,
                    reason,
                } => {
                    let outcome = if matches!(e.record, Record::Rejected { .. }) {
                        BuildOutcome::Rejected { reason }
                    } else {
                        BuildOutcome::Failed { reason }
                    };
                    ix.builds.push(Build {
                        line,
                        t: e.t,
                        variant,
                        dtype: *dtype,
                        head_dim: *head_dim,
                        outcome,
                    });
                    for shape in shapes.iter().filter(|s| s.d == *head_dim) {
                        let Some(&i) =
                            ix.by_key
                                .get(&(variant.as_str(), shape.name.as_str(), *dtype))
                        else {
                            continue;
                        };
                        let outcome = Outcome::Failed {
                            line,
                            kind: Failure::Build,
                            reason: Some(reason),
                        };
                        settle(
                            &mut ix.cases[i],
                            &mut ledger.decided[i],
                            outcome,
                            session,
                            true,
                            &mut ledger.problems,
                        );
                    }
                }
                Record::Checked {
                    variant,
                    shape,
                    dtype,
                    check,
                    ..
                } => {
                    if let Some(&i) = ix.by_key.get(&(variant.as_str(), shape.as_str(), *dtype)) {
                        ix.cases[i].check = Some(check);
                    }
                }
                Record::CheckFailed {
                    variant,
                    shape,
                    dtype,
                    check,
                    reason,
                } => {
                    ix.check_failures.push(CheckFailure {
                        line,
                        variant,
                        shape,
                        dtype: *dtype,
                        reason,
                    });
                    let fault = FaultKind::of_check_failure(reason);
                    ix.faults.push(Fault {
                        line,
                        variant,
                        kind: fault,
                        case: Some((shape, *dtype)),
                        detail: reason.clone(),
                    });
                    let kind = if fault == FaultKind::Crashed {
                        Failure::Crashed
                    } else {
                        Failure::Wrong
                    };
                    let outcome = Outcome::Failed {
                        line,
                        kind,
                        reason: Some(reason),
                    };
                    if let Some(i) = ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "check_failed",
                        session,
                    ) {
                        ix.cases[i].check = check.as_ref();
                    }
                }
                Record::Timed {
                    variant,
                    shape,
                    dtype,
                    kv_splits,
                    timing,
                    gpu,
                    conditions,
                    raced,
                    placed,
                    ..
                } => {
                    let device = device_of.get(variant.as_str()).copied();
                    let sentinel_before = ix
                        .sentinels
                        .iter()
                        .rposition(|s| Some(s.device) == device || device.is_none());
                    ix.timings.push(Timing {
                        line,
                        t: e.t,
                        variant,
                        shape,
                        dtype: *dtype,
                        timing,
                        conditions,
                        device,
                        placed: placed.as_deref(),
                        gpu: gpu.as_ref(),
                        sentinel_before,
                        sentinel_after: None,
                    });
                    let outcome = Outcome::Measured {
                        line,
                        timing,
                        kv_splits: *kv_splits,
                        reused: None,
                        conditions,
                        raced: raced.as_ref(),
                    };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "timed",
                        session,
                    );
                }
                Record::Reused {
                    variant,
                    shape,
                    dtype,
                    kv_splits,
                    timing,
                    from_run,
                    from_line,
                } => {
                    let outcome = Outcome::Measured {
                        line,
                        timing,
                        kv_splits: *kv_splits,
                        reused: Some(ReusedFrom {
                            run: from_run,
                            line: *from_line,
                        }),
                        // The store keeps only figures measured clean (`store::write_record_in` skips the others).
                        conditions: &[],
                        raced: None,
                    };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "reused",
                        session,
                    );
                }
                Record::Confirming {
                    variant,
                    shape,
                    dtype,
                    stored_median_us,
                    from_run,
                    from_line,
                } => ix.confirmations.push(Confirmation {
                    line,
                    variant,
                    shape,
                    dtype: *dtype,
                    stored_median_us: *stored_median_us,
                    from_run,
                    from_line: *from_line,
                }),
                Record::DispatchOrder { order } => ix.dispatch_order = Some((line, order)),
                Record::Implausible {
                    variant,
                    shape,
                    dtype,
                    kv_splits,
                    timing,
                    reason,
                } => {
                    ix.faults.push(Fault {
                        line,
                        variant,
                        kind: FaultKind::Implausible,
                        case: Some((shape, *dtype)),
                        detail: reason.clone(),
                    });
                    let outcome = Outcome::Implausible {
                        line,
                        timing,
                        kv_splits: *kv_splits,
                        reason,
                    };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "implausible",
                        session,
                    );
                }
                Record::CaseSkipped {
                    variant,
                    shape,
                    dtype,
                    reason,
                } => {
                    let outcome = Outcome::Skipped { line, reason };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "case_skipped",
                        session,
                    );
                }
                Record::TimedOut {
                    variant,
                    cases_not_run,
                    ..
                }
                | Record::WorkerCrashed {
                    variant,
                    cases_not_run,
                    ..
                } => {
                    ix.incidents.push((line, &e.record));
                    let own = !worker_never_started(&e.record);
                    own_worker_failure.insert(variant.as_str(), own);
                    if own {
                        ix.faults.extend(worker_fault(line, &e.record, dtypes));
                    }
                    let kind = if matches!(e.record, Record::TimedOut { .. }) {
                        Failure::TimedOut
                    } else {
                        Failure::Crashed
                    };
                    // Not terminal: the scheduler retries the cases once, and only a second failure
                    // (or the end of the run) leaves them here.
                    for case in cases_not_run {
                        let Some((shape, dtype)) = named_case(case, dtypes) else {
                            continue;
                        };
                        if let Some(&i) = ix.by_key.get(&(variant.as_str(), shape, dtype)) {
                            let c = &mut ix.cases[i];
                            if matches!(c.outcome, Outcome::NotRun) {
                                c.outcome = Outcome::Failed {
                                    line,
                                    kind,
                                    reason: None,
                                };
                            }
                        }
                    }
                }
                Record::Quarantined {
                    variant,
                    reason,
                    cases_not_run,
                } => {
                    ix.incidents.push((line, &e.record));
                    // A quarantine follows its attempt's failure record: the variant's fault unless
                    // that worker never started.
                    if own_worker_failure.get(variant.as_str()) != Some(&false) {
                        ix.faults.push(Fault {
                            line,
                            variant,
                            kind: FaultKind::Quarantined,
                            case: cases_not_run.first().and_then(|c| named_case(c, dtypes)),
                            detail: reason.clone(),
                        });
                    }
                }
                // The cluster's doing: told, never a fault; its cases are run again (or stay not run).
                Record::WorkerLost { .. } => ix.incidents.push((line, &e.record)),
                Record::BudgetReached { .. } | Record::GpuUnhealthy { .. } => {
                    ix.incidents.push((line, &e.record))
                }
                Record::Profiled {
                    variant,
                    shape,
                    dtype,
                    profile,
                    ..
                } => ix.profiles.push(Profile {
                    line,
                    variant,
                    shape,
                    dtype: *dtype,
                    profile,
                }),
                Record::BaselineTimed {
                    backend,
                    shape,
                    dtype,
                    timing,
                    remeasured,
                    noisy,
                } => ix.baselines.push(Baseline {
                    line,
                    backend,
                    shape,
                    dtype: *dtype,
                    outcome: Ok(BaselineTiming {
                        timing,
                        remeasured: *remeasured,
                        noisy: *noisy,
                    }),
                }),
                Record::BaselineUnavailable {
                    backend: Some(backend),
                    shape: Some(shape),
                    dtype: Some(dtype),
                    reason,
                } => ix.baselines.push(Baseline {
                    line,
                    backend,
                    shape,
                    dtype: *dtype,
                    outcome: Err(reason),
                }),
                Record::BaselineUnavailable { reason, .. } => ix.baseline_missing = Some(reason),
                Record::RoofUnavailable {
                    name,
                    dtype,
                    reason,
                } => {
                    let what = match dtype {
                        Some(d) => format!("{name} ({d})"),
                        None => name.clone(),
                    };
                    ix.ceilings
                        .unavailable
                        .push((line, format!("{what}: {reason}")));
                }
                Record::CeilingMeasured {
                    name,
                    dtype,
                    value,
                    unit,
                    ..
                } => {
                    let m = Measured {
                        value: *value,
                        line,
                    };
                    // The worker and the PyTorch adapter may both measure a roof: the higher one is the roof.
                    let higher = |old: Option<Measured>| match old {
                        Some(o) if o.value >= m.value => Some(o),
                        _ => Some(m),
                    };
                    let c = &mut ix.ceilings;
                    match (name.as_str(), dtype, unit.as_str()) {
                        ("matmul", Some(d), "TFLOP/s") => {
                            let best = higher(c.matmul_tflops.get(d).copied());
                            c.matmul_tflops.insert(*d, best.expect("some"));
                        }
                        ("copy", _, "GB/s") => c.copy_gbs = higher(c.copy_gbs),
                        ("read", _, "GB/s") => c.read_gbs = higher(c.read_gbs),
                        _ => {}
                    }
                }
                Record::SearchDuel {
                    shape,
                    dtype,
                    champion,
                    challenger,
                    verdict,
                    ..
                } => {
                    ix.duels.push(DuelRecord {
                        line,
                        shape,
                        dtype: *dtype,
                        champion,
                        challenger: Some(challenger),
                        verdict: verdict.as_ref(),
                    });
                    ix.search.push((line, &e.record));
                }
                Record::Duel {
                    shape,
                    dtype,
                    variant,
                    verdict,
                    ..
                } => ix.duels.push(DuelRecord {
                    line,
                    shape,
                    dtype: *dtype,
                    champion: variant,
                    challenger: None,
                    verdict: verdict.as_ref(),
                }),
                Record::SearchRound { .. } | Record::SearchStopped { .. } => {
                    ix.search.push((line, &e.record))
                }
                Record::WorkerRan {
                    variant,
                    device,
                    started_t,
                    seconds,
                    ..
                } => {
                    device_of.insert(variant, *device);
                    ix.workers.push(WorkerRun {
                        line,
                        variant,
                        device: *device,
                        started_t: *started_t,
                        seconds: *seconds,
                    })
                }
                Record::Sentinel {
                    device,
                    when,
                    figures,
                    gpu,
                    max_drift,
                    error,
                } => {
                    let index = ix.sentinels.len();
                    for t in ix.timings.iter_mut().rev() {
                        if t.device.is_some_and(|d| d != *device) {
                            continue;
                        }
                        if t.sentinel_after.is_some() {
                            break;
                        }
                        t.sentinel_after = Some(index);
                    }
                    ix.sentinels.push(SentinelPoint {
                        line,
                        t: e.t,
                        device: *device,
                        when,
                        figures,
                        gpu: gpu.as_ref(),
                        max_drift: *max_drift,
                        error: error.as_deref(),
                    });
                }
                Record::Disturbed {
                    variant,
                    shape,
                    dtype,
                    conditions,
                    timing,
                    gpu,
                } => ix.disturbed.push(DisturbedTiming {
                    line,
                    t: e.t,
                    variant,
                    shape,
                    dtype: *dtype,
                    conditions,
                    timing,
                    gpu: gpu.as_ref(),
                }),
                Record::GpuStateUnavailable { device, reason } => {
                    ix.state_unavailable.push((line, *device, reason))
                }
                Record::DriftDuel {
                    shape,
                    dtype,
                    champion,
                    runner_up,
                    drift,
                    champion_us,
                    runner_up_us,
                    verdict,
                    failure,
                    placed,
                } => {
                    ix.duels.push(DuelRecord {
                        line,
                        shape,
                        dtype: *dtype,
                        champion,
                        challenger: Some(runner_up),
                        verdict: verdict.as_ref(),
                    });
                    ix.drift_duels.push(DriftDuel {
                        line,
                        shape,
                        dtype: *dtype,
                        champion,
                        runner_up,
                        drift: *drift,
                        champion_us: *champion_us,
                        runner_up_us: *runner_up_us,
                        verdict: verdict.as_ref(),
                        failure: failure.as_deref(),
                        placed: placed.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
                    });
                }
                Record::Interrupted { reason } => ix.interrupted = Some((line, reason)),
                Record::Finished {
                    seconds,
                    variants,
                    measured_cases,
                    failed_cases,
                } => {
                    ix.finished = Some(Finished {
                        line,
                        seconds: *seconds,
                        variants: *variants,
                        measured_cases: *measured_cases,
                        failed_cases: *failed_cases,
                    })
                }
                Record::Resumed { .. } => session += 1,
                Record::Header(_)
                | Record::VariantDone { .. }
                | Record::ChampionsCommitted { .. }
                | Record::ProposerRan { .. }
                | Record::StepStarted { .. }
                | Record::StepDecided { .. }
                | Record::AgentSession(_)
                | Record::CandidateStarted { .. }
                | Record::CandidateProposed { .. }
                | Record::CandidateJudged { .. }
                | Record::CandidateDropped { .. }
                | Record::SessionResumed { .. }
                | Record::SessionStopped { .. } => {}
            }
        }
        let d_of: BTreeMap<&str, u32> = shapes.iter().map(|s| (s.name.as_str(), s.d)).collect();
        for c in &mut ix.cases {
            c.build_seconds = build_seconds
                .get(&(c.variant, c.dtype, d_of[c.shape.name.as_str()]))
                .copied()
                .unwrap_or(0.0);
        }
        ix.accounting = account(&ix.cases, &ledger.unplanned, ledger.problems);
        ix
    }

    pub fn case(&self, variant: &str, shape: &str, dtype: Dtype) -> Option<&Case<'a>> {
        self.by_key
            .get(&(variant, shape, dtype))
            .map(|&i| &self.cases[i])
    }

    /// The parameters a variant was planned with (its last `planned` record).
    pub fn params_of(&self, variant: &str) -> Option<&'a Params> {
        self.planned
            .iter()
            .rev()
            .find(|p| p.variant == variant)
            .map(|p| p.params)
    }

    /// The run's last word is not a `finished` record: interrupted, killed, or still going.
    pub fn unfinished(&self) -> bool {
        match (self.finished, self.interrupted) {
            (None, _) => true,
            (Some(f), Some((line, _))) => line > f.line,
            (Some(_), None) => false,
        }
    }

    pub fn fake(&self) -> bool {
        self.header.is_some_and(|h| h.device.fake)
    }

    /// The measured cases of one (shape, dtype), fastest median first (plan order among equals).
    pub fn ranked(&self, shape: &str, dtype: Dtype) -> Vec<&Case<'a>> {
        let mut ranked: Vec<&Case<'a>> = self
            .cases
            .iter()
            .filter(|c| c.shape.name == shape && c.dtype == dtype && c.measured().is_some())
            .filter(|c| self.disqualified_on(c.variant, shape).is_none())
            .collect();
        ranked.sort_by(|a, b| {
            let median = |c: &Case| c.measured().map_or(f64::INFINITY, |t| t.median_us);
            median(a).total_cmp(&median(b))
        });
        ranked
    }

    /// Why a variant may not be anyone's champion anywhere: its first runtime fault (a wrong answer,
    /// a crash, a hang, a write outside its outputs, a quarantine, a figure beyond the roofs) on any
    /// case, even one a retry later measured. A kernel that faults on one shape is a faulty kernel;
    /// its clean runs elsewhere are luck of the shape.
    pub fn disqualified(&self, variant: &str) -> Option<&Fault<'a>> {
        self.faults.iter().find(|f| f.variant == variant)
    }

    /// Why a variant may not be the champion of `shape`: as [`RunIndex::disqualified`], except that
    /// under per-shape dispatch only a fault on that shape (or on no named case) counts.
    pub fn disqualified_on(&self, variant: &str, shape: &str) -> Option<&Fault<'a>> {
        self.faults
            .iter()
            .find(|f| f.variant == variant && f.bars(shape, self.per_shape_dispatch))
    }

    /// The champion of one (shape, dtype): the fastest measured case, and whether its runner-up ties it.
    /// Cases measured under a condition (throttling, another process) are passed over when a clean
    /// one exists; a drift duel of the two decides between them when the run re-timed them.
    pub fn pick(&self, shape: &str, dtype: Dtype) -> Option<Pick<'_, 'a>> {
        let ranked = self.ranked(shape, dtype);
        let clean: Vec<&Case<'a>> = ranked
            .iter()
            .copied()
            .filter(|c| c.conditions().is_empty())
            .collect();
        let pool = if clean.is_empty() { &ranked } else { &clean };
        let mut best = *pool.first()?;
        let mut runner_up = pool.get(1).copied();
        if let Some(r) = runner_up {
            if self.drift_duel_won(r, best) {
                runner_up = Some(best);
                best = r;
            }
        }
        let tie = runner_up
            .and_then(|r| self.closeness(best, r))
            .filter(Closeness::tied);
        let best_us = best.measured().map_or(f64::INFINITY, |t| t.median_us);
        let passed_over = ranked
            .iter()
            .copied()
            .filter(|c| {
                !c.conditions().is_empty()
                    && best.conditions().is_empty()
                    && c.measured().is_some_and(|t| t.median_us < best_us)
            })
            .collect();
        Some(Pick {
            best,
            runner_up,
            tie,
            passed_over,
        })
    }

    /// Whether `challenger` beat `holder` in the last drift duel between the two.
    fn drift_duel_won(&self, challenger: &Case, holder: &Case) -> bool {
        self.drift_duels
            .iter()
            .rev()
            .find(|d| {
                d.shape == holder.shape.name
                    && d.dtype == holder.dtype
                    && ((d.champion == holder.variant && d.runner_up == challenger.variant)
                        || (d.champion == challenger.variant && d.runner_up == holder.variant))
            })
            .and_then(|d| Some((d, d.verdict?)))
            .is_some_and(|(d, v)| {
                // The verdict judges the runner-up as the challenger.
                if d.runner_up == challenger.variant {
                    v.accept
                } else {
                    v.gain < 0.0 && -v.gain > v.noise
                }
            })
    }

    /// The sentinels of a measured case's GPU just before and after it was timed (its last timing).
    pub fn sentinels_around(
        &self,
        case: &Case,
    ) -> (Option<&SentinelPoint<'a>>, Option<&SentinelPoint<'a>>) {
        let Some(line) = case.outcome.line() else {
            return (None, None);
        };
        let Some(t) = self.timings.iter().find(|t| t.line == line) else {
            return (None, None);
        };
        let at = |i: Option<usize>| i.and_then(|i| self.sentinels.get(i));
        (at(t.sentinel_before), at(t.sentinel_after))
    }

    /// The Slurm GPU a measured case was timed on (its last timing, as `node:gpuN`).
    pub fn placed_of(&self, case: &Case) -> Option<&'a str> {
        let line = case.outcome.line()?;
        self.timings.iter().find(|t| t.line == line)?.placed
    }

    /// How far apart the sentinel stood when two measured cases were timed: the larger gap of their
    /// sentinels before, and of their sentinels after; `None` without sentinels around both.
    pub fn drift_between(&self, a: &Case, b: &Case) -> Option<f64> {
        let (a0, a1) = self.sentinels_around(a);
        let (b0, b1) = self.sentinels_around(b);
        let gap = |x: Option<&SentinelPoint>, y: Option<&SentinelPoint>| {
            let (x, y) = (x?, y?);
            if x.error.is_some() || y.error.is_some() {
                return None;
            }
            sentinel_gap(x.figures, y.figures)
        };
        match (gap(a0, b0), gap(a1, b1)) {
            (Some(g), Some(h)) => Some(g.max(h)),
            (g, h) => g.or(h),
        }
    }

    /// Each GPU's sentinels against its first good one: (point, drift from the first).
    pub fn sentinel_drift(&self) -> Vec<(&SentinelPoint<'a>, f64)> {
        let mut first: BTreeMap<u32, &SentinelPoint<'a>> = BTreeMap::new();
        let mut out = Vec::new();
        for s in self.sentinels.iter().filter(|s| s.error.is_none()) {
            let reference = *first.entry(s.device).or_insert(s);
            if let Some(gap) = sentinel_gap(s.figures, reference.figures) {
                out.push((s, gap));
            }
        }
        out
    }

    /// How close two measured cases of one (shape, dtype) are: by the last interleaved duel of the
    /// two where the log has one with a verdict, else by their medians against their spreads.
    pub fn closeness(&self, a: &Case, b: &Case) -> Option<Closeness> {
        let (ta, tb) = (a.measured()?, b.measured()?);
        let duel = self.duels.iter().rev().find(|d| {
            d.shape == a.shape.name
                && d.dtype == a.dtype
                && d.verdict.is_some()
                && d.challenger.is_some_and(|c| {
                    (d.champion == a.variant && c == b.variant)
                        || (d.champion == b.variant && c == a.variant)
                })
        });
        if let Some(d) = duel {
            let v = d.verdict.expect("filtered on a verdict");
            return Some(Closeness {
                gap: v.gain.abs(),
                noise: v.noise,
                duel_line: Some(d.line),
            });
        }
        let (fast, slow) = if ta.median_us <= tb.median_us {
            (ta, tb)
        } else {
            (tb, ta)
        };
        Some(Closeness {
            gap: slow.median_us / fast.median_us - 1.0,
            noise: spread(ta).max(spread(tb)),
            duel_line: None,
        })
    }
}

/// Give a case the outcome of a terminal record, noting a second, different outcome in one session.
/// What the terminal records decided so far, per planned case, and what they said of cases no plan
/// holds.
#[derive(Default)]
struct Ledger {
    decided: Vec<Option<Decided>>,
    /// (variant, shape, dtype) → the record and line that named a case the run never planned.
    unplanned: BTreeMap<(String, String, Dtype), (&'static str, usize)>,
    problems: Vec<String>,
}

impl Ledger {
    /// Settle the planned case a terminal record names, or note the record as unplanned; returns
    /// the case's index when it was planned.
    fn land<'a>(
        &mut self,
        cases: &mut [Case<'a>],
        by_key: &BTreeMap<CaseKey<'a>, usize>,
        (variant, shape, dtype): (&str, &str, Dtype),
        outcome: Outcome<'a>,
        event: &'static str,
        session: usize,
    ) -> Option<usize> {
        let line = outcome.line().expect("terminal outcomes have a line");
        match by_key.get(&(variant, shape, dtype)) {
            Some(&i) => {
                settle(
                    &mut cases[i],
                    &mut self.decided[i],
                    outcome,
                    session,
                    false,
                    &mut self.problems,
                );
                Some(i)
            }
            None => {
                self.unplanned
                    .insert((variant.to_owned(), shape.to_owned(), dtype), (event, line));
                None
            }
        }
    }
}

/// A `shape/dtype` of a record's `cases_not_run`, when the run has that dtype.
fn named_case<'r>(case: &'r str, dtypes: &[Dtype]) -> Option<(&'r str, Dtype)> {
    let (shape, dtype) = case.split_once('/')?;
    let &dtype = dtypes.iter().find(|d| d.name() == dtype)?;
    Some((shape, dtype))
}

/// A `worker_crashed` record of a worker that could not be started: the machine's failure.
fn worker_never_started(record: &Record) -> bool {
    matches!(record, Record::WorkerCrashed { detail, .. } if detail.starts_with(WORKER_NOT_STARTED))
}

/// The fault a `timed_out` or `worker_crashed` record shows, on the case that was in flight (the
/// first not run). `None` for a garbled reply: the `check_failed` record before it already holds
/// that fault, on the case that was in flight.
fn worker_fault<'a>(line: usize, record: &'a Record, dtypes: &[Dtype]) -> Option<Fault<'a>> {
    let (variant, kind, detail, cases_not_run) = match record {
        Record::TimedOut {
            variant,
            stage,
            seconds,
            cases_not_run,
        } => (
            variant,
            FaultKind::TimedOut,
            match stage.as_str() {
                "worker" => crate::runlog::timed_out_limit(stage, *seconds),
                _ => format!(
                    "{stage} {}",
                    crate::runlog::timed_out_limit(stage, *seconds)
                ),
            },
            cases_not_run,
        ),
        Record::WorkerCrashed {
            variant,
            detail,
            cases_not_run,
        } if !detail.starts_with(GARBLED_REPLY) => (
            variant,
            FaultKind::Crashed,
            format!("its worker died: {detail}"),
            cases_not_run,
        ),
        _ => return None,
    };
    Some(Fault {
        line,
        variant,
        kind,
        case: cases_not_run.first().and_then(|c| named_case(c, dtypes)),
        detail,
    })
}

fn settle<'a>(
    case: &mut Case<'a>,
    decided: &mut Option<Decided>,
    outcome: Outcome<'a>,
    session: usize,
    by_build: bool,
    problems: &mut Vec<String>,
) {
    let line = outcome.line().expect("terminal outcomes have a line");
    let (bin, status) = (outcome.bin(), outcome.status());
    if let Some(before) = *decided {
        // A `case_skipped` after its build failed says the same thing per case; a resumed run may
        // re-run a case and come to something else, and then its last record is what counts.
        let restated = before.by_build && bin == Bin::Skipped;
        if before.session == session && before.bin != bin && !restated {
            problems.push(format!(
                "`{}` {} {}: two different outcomes, {} (log line {}) and then {} (log line {line})",
                case.variant, case.shape.name, case.dtype, before.status, before.line, status
            ));
        }
    }
    *decided = Some(Decided {
        session,
        bin,
        line,
        status,
        by_build,
    });
    case.outcome = outcome;
}

fn account(
    cases: &[Case],
    unplanned: &BTreeMap<(String, String, Dtype), (&'static str, usize)>,
    mut problems: Vec<String>,
) -> Accounting {
    let mut a = Accounting {
        planned: cases.len(),
        ..Accounting::default()
    };
    let mut count = |bin: Bin| match bin {
        Bin::Measured => a.measured += 1,
        Bin::Failed => a.failed += 1,
        Bin::Implausible => a.implausible += 1,
        Bin::Skipped => a.skipped += 1,
        Bin::NotRun => a.not_run += 1,
    };
    for c in cases {
        count(c.outcome.bin());
    }
    a.reused = cases.iter().filter(|c| c.reused().is_some()).count();
    for ((variant, shape, dtype), (event, line)) in unplanned {
        // Counted where it says it belongs, so the sum visibly exceeds what was planned.
        count(match *event {
            "timed" | "reused" => Bin::Measured,
            "implausible" => Bin::Implausible,
            "case_skipped" => Bin::Skipped,
            _ => Bin::Failed,
        });
        problems.push(format!(
            "`{variant}` {shape} {dtype}: a `{event}` record (log line {line}) for a case that was never planned"
        ));
    }
    a.problems = problems;
    a
}
