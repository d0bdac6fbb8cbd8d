//! The fold's records of what became of each case: planned, built, checked, timed, reused, failed, skipped.
use super::fold::Fold;
use super::{
    settle, Build, BuildOutcome, Case, CheckFailure, Confirmation, Failure, Fault, FaultKind,
    Outcome, PlannedPoint, ReusedFrom, Timing,
};
use crate::log::runlog::{Entry, Record};
use crate::model::protocol::CaseFault;

impl<'a> Fold<'a> {
    pub(super) fn planned(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn built(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn build_failed(&mut self, line: usize, e: &'a Entry) {
        let (Record::BuildFailed {
            variant,
            dtype,
            head_dim,
            reason,
            log_tail: _,
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
        let outcome = match &e.record {
            Record::BuildFailed { log_tail, .. } => BuildOutcome::Failed {
                reason,
                first_error: crate::gpu::build::first_error(log_tail),
            },
            _ => BuildOutcome::Rejected { reason },
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

    pub(super) fn checked(&mut self, e: &'a Entry) {
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

    pub(super) fn check_failed(&mut self, line: usize, e: &'a Entry) {
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
        let fault = FaultKind::of_case_fault(logged_fault.unwrap_or(CaseFault::Wrong));
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
        if let Some(i) = self.land((variant, shape, *dtype), outcome, "check_failed") {
            self.ix.cases[i].check = check.as_ref();
        }
    }

    pub(super) fn timed(&mut self, line: usize, e: &'a Entry) {
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
        self.land((variant, shape, *dtype), outcome, "timed");
    }

    pub(super) fn reused(&mut self, line: usize, e: &'a Entry) {
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
        self.land((variant, shape, *dtype), outcome, "reused");
    }

    pub(super) fn confirming(&mut self, line: usize, e: &'a Entry) {
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

    pub(super) fn implausible(&mut self, line: usize, e: &'a Entry) {
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
        self.land((variant, shape, *dtype), outcome, "implausible");
    }

    pub(super) fn case_skipped(&mut self, line: usize, e: &'a Entry) {
        let Record::CaseSkipped {
            variant,
            shape,
            dtype,
            reason,
            skipped_for,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        let outcome = Outcome::Skipped {
            line,
            reason,
            why: *skipped_for,
        };
        self.land((variant, shape, *dtype), outcome, "case_skipped");
    }
}
