//! One read model of a run: the log's records sorted once into the plan, the builds, what became of every planned case (with the line that decided it), the profiles, baselines, ceilings, duels and the search; every report and export reads a run through it.
mod fold;
mod fold_cases;
mod fold_runs;
mod model;
mod queries;

use crate::log::runlog::{Header, LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::vocab::WorkerFailure;
pub use model::{
    sentinel_gap, spread, Accounting, Baseline, BaselineTiming, Bin, Build, BuildOutcome, Case,
    CaseStatus, Ceilings, CheckFailure, Closeness, Confirmation, DisturbedTiming, DriftDuel,
    DuelRecord, Failure, Fault, FaultKind, Finished, Measured, Outcome, Pick, PlannedPoint,
    Profile, ReusedFrom, SentinelPoint, StageRun, Timing, WorkerRun,
};
use std::collections::BTreeMap;

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
    /// The reference library's package versions (its `reference_library` record).
    pub reference_library: Option<&'a std::collections::BTreeMap<String, String>>,
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
    /// The stages that held a GPU outside the workers, as their `stage_ran` records say.
    pub stages: Vec<StageRun>,
    /// The last `interrupted` record: its line and reason.
    pub interrupted: Option<(usize, &'a str)>,
    /// The last `dispatch_order` record: a budgeted run's order, best first, with its line.
    pub dispatch_order: Option<(usize, &'a [crate::log::runlog::Ranked])>,
    /// How many variants a time-limited run took for being near its leaders (`climbed`).
    pub climbs: usize,
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
    status: CaseStatus,
    /// Decided by its build's failure: a `case_skipped` for it restates that, not a second outcome.
    by_build: bool,
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

/// A `worker_crashed` record of a worker that could not be started: the machine's failure. A log
/// written before the record said so reads it from its detail's first words.
fn worker_never_started(record: &Record) -> bool {
    matches!(
        record,
        Record::WorkerCrashed {
            failure: Some(WorkerFailure::NotStarted),
            ..
        }
    )
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
            stage.limit(*seconds),
            cases_not_run,
        ),
        Record::WorkerCrashed {
            variant,
            detail,
            cases_not_run,
            failure,
            ..
        } if *failure != Some(WorkerFailure::Garbled) => (
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
