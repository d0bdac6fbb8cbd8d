//! The fold's records of what ran around the cases: workers and their faults, GPUs and sentinels, the reference library, roofs, profiles and duels.
use super::fold::Fold;
use super::{
    named_case, worker_fault, worker_never_started, Baseline, BaselineTiming, DisturbedTiming,
    DriftDuel, DuelRecord, Failure, Fault, FaultKind, Finished, Measured, Outcome, Profile,
    SentinelPoint, WorkerRun,
};
use crate::log::runlog::{Entry, Record};
use crate::model::vocab::Roof;

impl<'a> Fold<'a> {
    pub(super) fn worker_failed(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn quarantined(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn profiled(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn baseline_timed(&mut self, line: usize, e: &'a Entry) {
        let Record::BaselineTimed {
            backend,
            shape,
            dtype,
            timing,
            remeasured,
            noisy,
            reused_from,
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
                reused_from: reused_from.as_ref(),
            }),
        });
    }

    pub(super) fn baseline_unavailable(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn roof_unavailable(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn ceiling_measured(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn search_duel(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn duel(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn worker_ran(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn sentinel(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn disturbed(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn drift_duel(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn finished(&mut self, line: usize, e: &'a Entry) {
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
