//! `RunIndex::new`: the log's records folded one by one into the index (`Fold::apply`, a method per
//! kind of record: what became of each case in `fold_cases.rs`, the workers, GPUs, baselines,
//! roofs and duels in `fold_runs.rs`).
use super::{account, Accounting, Ceilings, Ledger, RunIndex, StageRun};
use crate::log::runlog::{Entry, LoadedLog, Record};
use crate::model::config::{Dtype, Shape};
use std::collections::BTreeMap;

impl<'a> RunIndex<'a> {
    /// The index of a log: its records folded in order through [`Fold::apply`], the one fold a past
    /// run is opened with and a running one is read through.
    pub fn new(log: &'a LoadedLog) -> Self {
        let mut fold = Fold::new(log);
        for (line, e) in &log.entries {
            fold.apply(*line, e);
        }
        fold.finish()
    }
}

/// A log being folded into its index, record by record: the index so far and what the fold
/// carries between records.
pub(super) struct Fold<'a> {
    pub(super) ix: RunIndex<'a>,
    pub(super) shapes: &'a [Shape],
    pub(super) dtypes: &'a [Dtype],
    pub(super) ledger: Ledger,
    /// Resumes so far: two outcomes of one case in one session are a problem, across sessions not.
    pub(super) session: usize,
    pub(super) build_seconds: BTreeMap<(&'a str, Dtype, u32), f64>,
    /// The GPU each variant's last worker ran on: its cases' records follow that `worker_ran`
    /// (a log written before a `timed` named its GPU).
    pub(super) device_of: BTreeMap<&'a str, u32>,
    /// Whether each variant's last failed worker failed by the variant's own doing.
    pub(super) own_worker_failure: BTreeMap<&'a str, bool>,
}

impl<'a> Fold<'a> {
    fn new(log: &'a LoadedLog) -> Self {
        let header = log.header();
        Fold {
            ix: RunIndex {
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
                reference_library: None,
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
                stages: Vec::new(),
                interrupted: None,
                dispatch_order: None,
                climbs: 0,
                confirmations: Vec::new(),
                finished: None,
                wall_seconds: 0.0,
                accounting: Accounting::default(),
                by_key: BTreeMap::new(),
            },
            shapes: header.map_or(&[], |h| &h.shapes),
            dtypes: header.map_or(&[], |h| &h.dtypes),
            ledger: Ledger::default(),
            session: 0,
            build_seconds: BTreeMap::new(),
            device_of: BTreeMap::new(),
            own_worker_failure: BTreeMap::new(),
        }
    }

    /// Fold one record in: one method per kind of record that the index keeps more than a line of.
    fn apply(&mut self, line: usize, e: &'a Entry) {
        self.ix.wall_seconds = self.ix.wall_seconds.max(e.t);
        match &e.record {
            Record::Planned { .. } => self.planned(line, e),
            Record::Built { .. } => self.built(line, e),
            Record::BuildFailed { .. } | Record::Rejected { .. } => self.build_failed(line, e),
            Record::Checked { .. } => self.checked(e),
            Record::CheckFailed { .. } => self.check_failed(line, e),
            Record::Timed { .. } => self.timed(line, e),
            Record::Reused { .. } => self.reused(line, e),
            Record::Confirming { .. } => self.confirming(line, e),
            Record::DispatchOrder { order } => self.ix.dispatch_order = Some((line, order)),
            Record::Climbed { .. } => self.ix.climbs += 1,
            Record::Implausible { .. } => self.implausible(line, e),
            Record::CaseSkipped { .. } => self.case_skipped(line, e),
            Record::TimedOut { .. } | Record::WorkerCrashed { .. } => self.worker_failed(line, e),
            Record::Quarantined { .. } => self.quarantined(line, e),
            // The cluster's doing: told, never a fault; its cases are run again (or stay not run).
            Record::WorkerLost { .. } => self.ix.incidents.push((line, &e.record)),
            Record::BudgetReached { .. } | Record::GpuUnhealthy { .. } => {
                self.ix.incidents.push((line, &e.record))
            }
            Record::Profiled { .. } => self.profiled(line, e),
            Record::BaselineTimed { .. } => self.baseline_timed(line, e),
            Record::BaselineUnavailable {
                backend: Some(_),
                shape: Some(_),
                dtype: Some(_),
                ..
            } => self.baseline_unavailable(line, e),
            Record::BaselineUnavailable { reason, .. } => self.ix.baseline_missing = Some(reason),
            Record::ReferenceLibrary { versions, .. } => self.ix.reference_library = Some(versions),
            Record::RoofUnavailable { .. } => self.roof_unavailable(line, e),
            Record::CeilingMeasured { .. } => self.ceiling_measured(line, e),
            Record::SearchDuel { .. } => self.search_duel(line, e),
            Record::Duel { .. } => self.duel(line, e),
            Record::SearchRound { .. } | Record::SearchStopped { .. } => {
                self.ix.search.push((line, &e.record))
            }
            Record::WorkerRan { .. } => self.worker_ran(line, e),
            &Record::StageRan {
                stage,
                device,
                started_t,
                seconds,
            } => self.ix.stages.push(StageRun {
                stage,
                device,
                started_t,
                seconds,
            }),
            Record::Sentinel { .. } => self.sentinel(line, e),
            Record::Disturbed { .. } => self.disturbed(line, e),
            Record::GpuStateUnavailable { device, reason } => {
                self.ix.state_unavailable.push((line, *device, reason))
            }
            Record::DriftDuel { .. } => self.drift_duel(line, e),
            Record::Interrupted { reason } => self.ix.interrupted = Some((line, reason)),
            Record::Finished { .. } => self.finished(line, e),
            Record::Resumed { .. } => self.session += 1,
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

    /// Settle the case a terminal record names (see `Ledger::land`); its index when it was planned.
    pub(super) fn land(
        &mut self,
        case: (&str, &str, Dtype),
        outcome: super::Outcome<'a>,
        event: &'static str,
    ) -> Option<usize> {
        (self.ledger).land(
            &mut self.ix.cases,
            &self.ix.by_key,
            case,
            outcome,
            event,
            self.session,
        )
    }

    /// The index once every record is in: each case's build time, and the accounting.
    fn finish(mut self) -> RunIndex<'a> {
        let d_of: BTreeMap<&str, u32> =
            self.shapes.iter().map(|s| (s.name.as_str(), s.d)).collect();
        for c in &mut self.ix.cases {
            c.build_seconds = self
                .build_seconds
                .get(&(c.variant, c.dtype, d_of[c.shape.name.as_str()]))
                .copied()
                .unwrap_or(0.0);
        }
        self.ix.accounting = account(&self.ix.cases, &self.ledger.unplanned, self.ledger.problems);
        self.ix
    }
}
