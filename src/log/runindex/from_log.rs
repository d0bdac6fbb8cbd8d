//! `RunIndex::new`: the log's records folded one by one into the index (`Fold::apply`, a method per kind of record).
use super::{
    account, named_case, settle, worker_fault, worker_never_started, Accounting, Baseline,
    BaselineTiming, Build, BuildOutcome, Case, Ceilings, CheckFailure, Confirmation,
    DisturbedTiming, DriftDuel, DuelRecord, Failure, Fault, FaultKind, Finished, Ledger, Measured,
    Outcome, PlannedPoint, Profile, ReusedFrom, RunIndex, SentinelPoint, Timing, WorkerRun,
};
use crate::log::runlog::{Entry, LoadedLog, Record};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::CaseFault;
use crate::model::vocab::Roof;
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
struct Fold<'a> {
    ix: RunIndex<'a>,
    shapes: &'a [Shape],
    dtypes: &'a [Dtype],
    ledger: Ledger,
    /// Resumes so far: two outcomes of one case in one session are a problem, across sessions not.
    session: usize,
    build_seconds: BTreeMap<(&'a str, Dtype, u32), f64>,
    /// The GPU each variant's last worker ran on: its cases' records follow that `worker_ran`
    /// (a log written before a `timed` named its GPU).
    device_of: BTreeMap<&'a str, u32>,
    /// Whether each variant's last failed worker failed by the variant's own doing.
    own_worker_failure: BTreeMap<&'a str, bool>,
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
            Record::RoofUnavailable { .. } => self.roof_unavailable(line, e),
            Record::CeilingMeasured { .. } => self.ceiling_measured(line, e),
            Record::SearchDuel { .. } => self.search_duel(line, e),
            Record::Duel { .. } => self.duel(line, e),
            Record::SearchRound { .. } | Record::SearchStopped { .. } => {
                self.ix.search.push((line, &e.record))
            }
            Record::WorkerRan { .. } => self.worker_ran(line, e),
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

    fn planned(&mut self, line: usize, e: &'a Entry) {
        let Record::Planned {
            variant,
            step,
            params,
            head_dim,
            invalid,
            proposed_by,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.planned.push(PlannedPoint {
            line,
            variant,
            step: step.as_deref(),
            params,
            head_dim: *head_dim,
            invalid: invalid.as_deref(),
            proposed_by: proposed_by.as_ref(),
        });
        if invalid.is_some() {
            return;
        }
        for shape in self.shapes.iter().filter(|s| s.d == *head_dim) {
            for &dtype in self.dtypes {
                let key = (variant.as_str(), shape.name.as_str(), dtype);
                match self.ix.by_key.get(&key) {
                    // Planned again by a resumed run: the plan is refreshed, what the
                    // case already came to stands until a later record decides it anew.
                    Some(&i) => {
                        let c = &mut self.ix.cases[i];
                        c.step = step.as_deref();
                        c.params = params;
                        c.planned_line = line;
                    }
                    None => {
                        self.ix.by_key.insert(key, self.ix.cases.len());
                        self.ledger.decided.push(None);
                        self.ix.cases.push(Case {
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

    fn built(&mut self, line: usize, e: &'a Entry) {
        let Record::Built {
            variant,
            dtype,
            head_dim,
            cached,
            seconds,
            entries,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.build_seconds
            .insert((variant, *dtype, *head_dim), *seconds);
        self.ix.builds.push(Build {
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

    fn build_failed(&mut self, line: usize, e: &'a Entry) {
        let (Record::BuildFailed {
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
        }) = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        let outcome = if matches!(e.record, Record::Rejected { .. }) {
            BuildOutcome::Rejected { reason }
        } else {
            BuildOutcome::Failed { reason }
        };
        self.ix.builds.push(Build {
            line,
            t: e.t,
            variant,
            dtype: *dtype,
            head_dim: *head_dim,
            outcome,
        });
        for shape in self.shapes.iter().filter(|s| s.d == *head_dim) {
            let Some(&i) = self
                .ix
                .by_key
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
                &mut self.ix.cases[i],
                &mut self.ledger.decided[i],
                outcome,
                self.session,
                true,
                &mut self.ledger.problems,
            );
        }
    }

    fn checked(&mut self, e: &'a Entry) {
        let Record::Checked {
            variant,
            shape,
            dtype,
            check,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        if let Some(&i) = self
            .ix
            .by_key
            .get(&(variant.as_str(), shape.as_str(), *dtype))
        {
            self.ix.cases[i].check = Some(check);
        }
    }

    fn check_failed(&mut self, line: usize, e: &'a Entry) {
        let Record::CheckFailed {
            variant,
            shape,
            dtype,
            check,
            reason,
            fault: logged_fault,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.check_failures.push(CheckFailure {
            line,
            variant,
            shape,
            dtype: *dtype,
            reason,
        });
        let fault =
            FaultKind::of_case_fault(logged_fault.unwrap_or_else(|| CaseFault::legacy(reason)));
        self.ix.faults.push(Fault {
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
        if let Some(i) = self.ledger.land(
            &mut self.ix.cases,
            &self.ix.by_key,
            (variant, shape, *dtype),
            outcome,
            "check_failed",
            self.session,
        ) {
            self.ix.cases[i].check = check.as_ref();
        }
    }

    fn timed(&mut self, line: usize, e: &'a Entry) {
        let Record::Timed {
            variant,
            shape,
            dtype,
            kv_splits,
            timing,
            gpu,
            conditions,
            raced,
            placed,
            device,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        let device = device.or_else(|| self.device_of.get(variant.as_str()).copied());
        let sentinel_before = self
            .ix
            .sentinels
            .iter()
            .rposition(|s| Some(s.device) == device || device.is_none());
        self.ix.timings.push(Timing {
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
        self.ledger.land(
            &mut self.ix.cases,
            &self.ix.by_key,
            (variant, shape, *dtype),
            outcome,
            "timed",
            self.session,
        );
    }

    fn reused(&mut self, line: usize, e: &'a Entry) {
        let Record::Reused {
            variant,
            shape,
            dtype,
            kv_splits,
            timing,
            from_run,
            from_line,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

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
        self.ledger.land(
            &mut self.ix.cases,
            &self.ix.by_key,
            (variant, shape, *dtype),
            outcome,
            "reused",
            self.session,
        );
    }

    fn confirming(&mut self, line: usize, e: &'a Entry) {
        let Record::Confirming {
            variant,
            shape,
            dtype,
            stored_median_us,
            from_run,
            from_line,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.confirmations.push(Confirmation {
            line,
            variant,
            shape,
            dtype: *dtype,
            stored_median_us: *stored_median_us,
            from_run,
            from_line: *from_line,
        });
    }

    fn implausible(&mut self, line: usize, e: &'a Entry) {
        let Record::Implausible {
            variant,
            shape,
            dtype,
            kv_splits,
            timing,
            reason,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.faults.push(Fault {
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
        self.ledger.land(
            &mut self.ix.cases,
            &self.ix.by_key,
            (variant, shape, *dtype),
            outcome,
            "implausible",
            self.session,
        );
    }

    fn case_skipped(&mut self, line: usize, e: &'a Entry) {
        let Record::CaseSkipped {
            variant,
            shape,
            dtype,
            reason,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        let outcome = Outcome::Skipped { line, reason };
        self.ledger.land(
            &mut self.ix.cases,
            &self.ix.by_key,
            (variant, shape, *dtype),
            outcome,
            "case_skipped",
            self.session,
        );
    }

    fn worker_failed(&mut self, line: usize, e: &'a Entry) {
        let (Record::TimedOut {
            variant,
            cases_not_run,
            ..
        }
        | Record::WorkerCrashed {
            variant,
            cases_not_run,
            ..
        }) = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.incidents.push((line, &e.record));
        let own = !worker_never_started(&e.record);
        self.own_worker_failure.insert(variant.as_str(), own);
        if own {
            self.ix
                .faults
                .extend(worker_fault(line, &e.record, self.dtypes));
        }
        let kind = if matches!(e.record, Record::TimedOut { .. }) {
            Failure::TimedOut
        } else {
            Failure::Crashed
        };
        // Not terminal: the scheduler retries the cases once, and only a second failure
        // (or the end of the run) leaves them here.
        for case in cases_not_run {
            let Some((shape, dtype)) = named_case(case, self.dtypes) else {
                continue;
            };
            if let Some(&i) = self.ix.by_key.get(&(variant.as_str(), shape, dtype)) {
                let c = &mut self.ix.cases[i];
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

    fn quarantined(&mut self, line: usize, e: &'a Entry) {
        let Record::Quarantined {
            variant,
            reason,
            cases_not_run,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.incidents.push((line, &e.record));
        // A quarantine follows its attempt's failure record: the variant's fault unless
        // that worker never started.
        if self.own_worker_failure.get(variant.as_str()) != Some(&false) {
            self.ix.faults.push(Fault {
                line,
                variant,
                kind: FaultKind::Quarantined,
                case: cases_not_run
                    .first()
                    .and_then(|c| named_case(c, self.dtypes)),
                detail: reason.clone(),
            });
        }
    }

    fn profiled(&mut self, line: usize, e: &'a Entry) {
        let Record::Profiled {
            variant,
            shape,
            dtype,
            profile,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.profiles.push(Profile {
            line,
            variant,
            shape,
            dtype: *dtype,
            profile,
        });
    }

    fn baseline_timed(&mut self, line: usize, e: &'a Entry) {
        let Record::BaselineTimed {
            backend,
            shape,
            dtype,
            timing,
            remeasured,
            noisy,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.baselines.push(Baseline {
            line,
            backend,
            shape,
            dtype: *dtype,
            outcome: Ok(BaselineTiming {
                timing,
                remeasured: *remeasured,
                noisy: *noisy,
            }),
        });
    }

    fn baseline_unavailable(&mut self, line: usize, e: &'a Entry) {
        let Record::BaselineUnavailable {
            backend: Some(backend),
            shape: Some(shape),
            dtype: Some(dtype),
            reason,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.baselines.push(Baseline {
            line,
            backend,
            shape,
            dtype: *dtype,
            outcome: Err(reason),
        });
    }

    fn roof_unavailable(&mut self, line: usize, e: &'a Entry) {
        let Record::RoofUnavailable {
            name,
            dtype,
            reason,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        let what = match dtype {
            Some(d) => format!("{name} ({d})"),
            None => name.clone(),
        };
        self.ix
            .ceilings
            .unavailable
            .push((line, format!("{what}: {reason}")));
    }

    fn ceiling_measured(&mut self, line: usize, e: &'a Entry) {
        let Record::CeilingMeasured {
            name, dtype, value, ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        let m = Measured {
            value: *value,
            line,
        };
        // The worker and the PyTorch adapter may both measure a roof: the higher one is the roof.
        let higher = |old: Option<Measured>| match old {
            Some(o) if o.value >= m.value => Some(o),
            _ => Some(m),
        };
        let c = &mut self.ix.ceilings;
        match (name, dtype) {
            (Roof::Matmul, Some(d)) => {
                let best = higher(c.matmul_tflops.get(d).copied());
                c.matmul_tflops.insert(*d, best.expect("some"));
            }
            (Roof::Matmul, None) => {}
            (Roof::Copy, _) => c.copy_gbs = higher(c.copy_gbs),
            (Roof::Read, _) => c.read_gbs = higher(c.read_gbs),
        }
    }

    fn search_duel(&mut self, line: usize, e: &'a Entry) {
        let Record::SearchDuel {
            shape,
            dtype,
            champion,
            challenger,
            verdict,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.duels.push(DuelRecord {
            line,
            shape,
            dtype: *dtype,
            champion,
            challenger: Some(challenger),
            verdict: verdict.as_ref(),
        });
        self.ix.search.push((line, &e.record));
    }

    fn duel(&mut self, line: usize, e: &'a Entry) {
        let Record::Duel {
            shape,
            dtype,
            variant,
            verdict,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.duels.push(DuelRecord {
            line,
            shape,
            dtype: *dtype,
            champion: variant,
            challenger: None,
            verdict: verdict.as_ref(),
        });
    }

    fn worker_ran(&mut self, line: usize, e: &'a Entry) {
        let Record::WorkerRan {
            variant,
            device,
            started_t,
            seconds,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.device_of.insert(variant, *device);
        self.ix.workers.push(WorkerRun {
            line,
            variant,
            device: *device,
            started_t: *started_t,
            seconds: *seconds,
        })
    }

    fn sentinel(&mut self, line: usize, e: &'a Entry) {
        let Record::Sentinel {
            device,
            when,
            figures,
            gpu,
            max_drift,
            error,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        let index = self.ix.sentinels.len();
        for t in self.ix.timings.iter_mut().rev() {
            if t.device.is_some_and(|d| d != *device) {
                continue;
            }
            if t.sentinel_after.is_some() {
                break;
            }
            t.sentinel_after = Some(index);
        }
        self.ix.sentinels.push(SentinelPoint {
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

    fn disturbed(&mut self, line: usize, e: &'a Entry) {
        let Record::Disturbed {
            variant,
            shape,
            dtype,
            conditions,
            timing,
            gpu,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.disturbed.push(DisturbedTiming {
            line,
            t: e.t,
            variant,
            shape,
            dtype: *dtype,
            conditions,
            timing,
            gpu: gpu.as_ref(),
        });
    }

    fn drift_duel(&mut self, line: usize, e: &'a Entry) {
        let Record::DriftDuel {
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
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.duels.push(DuelRecord {
            line,
            shape,
            dtype: *dtype,
            champion,
            challenger: Some(runner_up),
            verdict: verdict.as_ref(),
        });
        self.ix.drift_duels.push(DriftDuel {
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

    fn finished(&mut self, line: usize, e: &'a Entry) {
        let Record::Finished {
            seconds,
            variants,
            measured_cases,
            failed_cases,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };

        self.ix.finished = Some(Finished {
            line,
            seconds: *seconds,
            variants: *variants,
            measured_cases: *measured_cases,
            failed_cases: *failed_cases,
        })
    }
}
