//! How one worker's answer to one job is logged: each answered case under its one terminal record
//! (as the worker answers it, or at the job's end for a case re-timed), then the job's end: done, retried (the variant's own crash once; a worker that did not start or
//! that the cluster took away, up to their limits), or quarantined after its second own failure.
use super::gpu_queue::{JobResult, StreamedCase};
use super::{flagged, Bests, Job, Retry, Scheduler, Totals, INFRA_RETRIES};
use crate::error::{Error, Result};
use crate::gpu::executor::WorkerEnd;
use crate::log::runlog::Record;
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::{CaseResult, CaseSpec, Placement};
use crate::model::vocab::{SkipReason, WorkerFailure};
use crate::run::shared::Events;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The cases of a variant's job logged as its worker answered them, before the job ended.
#[derive(Default)]
pub(super) struct Streamed {
    cases: BTreeSet<(String, Dtype)>,
    measured: usize,
}

/// What the scheduler keeps of the answers it logged: the totals, the racing bars, and what each
/// job in flight logged before its end.
#[derive(Default)]
pub(super) struct Books {
    pub(super) totals: Totals,
    /// GPUs whose missing state was logged already (once each).
    pub(super) state_reported: BTreeSet<u32>,
    pub(super) bests: Bests,
    /// Per variant in flight, what its job logged so far.
    pub(super) streamed: BTreeMap<String, Streamed>,
}

impl Books {
    /// Whether `variant`'s job in flight has logged this case already.
    pub(super) fn answered(&self, variant: &str, shape: &str, dtype: Dtype) -> bool {
        self.streamed
            .get(variant)
            .is_some_and(|s| s.cases.contains(&(shape.to_owned(), dtype)))
    }
}

impl Scheduler<'_> {
    /// Log a case its worker just answered; its job's end will not log it again.
    pub(super) fn record_streamed(
        &self,
        events: &mut Events,
        s: StreamedCase,
        tally: &mut Books,
    ) -> Result<()> {
        note_state_missing(events, s.device, &s.case, &mut tally.state_reported)?;
        let measured = self.record_case(
            events,
            &s.variant,
            s.device,
            &s.case,
            &s.shape,
            s.placed.as_deref(),
            &mut tally.bests,
        )?;
        let so_far = tally.streamed.entry(s.variant).or_default();
        so_far.cases.insert((s.case.shape.clone(), s.case.dtype));
        if measured {
            tally.totals.measured += 1;
            so_far.measured += 1;
        } else {
            tally.totals.failed += 1;
        }
        Ok(())
    }

    /// Log one answered case under its one terminal record; true when it was measured.
    #[allow(clippy::too_many_arguments)]
    fn record_case(
        &self,
        events: &mut Events,
        variant: &str,
        device: u32,
        case: &CaseResult,
        asked: &Shape,
        placed: Option<&str>,
        bests: &mut Bests,
    ) -> Result<bool> {
        let (shape, dtype) = (case.shape.clone(), case.dtype);
        let failure = case.failure().or_else(|| {
            case.timing
                .is_none()
                .then(|| "the worker returned no timing for a case that passed".to_owned())
        });
        if let Some(reason) = failure {
            // Wrong answers are final: never retried.
            events.emit(Record::CheckFailed {
                variant: variant.to_owned(),
                shape,
                dtype,
                check: case.check.clone(),
                reason,
                fault: Some(
                    case.fault()
                        .unwrap_or(crate::model::protocol::CaseFault::Wrong),
                ),
            })?;
            return Ok(false);
        }
        let (Some(check), Some(timing)) = (case.check.clone(), case.timing.clone()) else {
            unreachable!("a case without a check or a timing failed above");
        };
        events.emit(Record::Checked {
            variant: variant.to_owned(),
            shape: shape.clone(),
            dtype,
            check,
            function: case.function.clone(),
        })?;
        let margin = self.project.policies.gates.plausibility_margin;
        if let Some(reason) = self.roofs.beyond(asked, dtype, &timing, margin) {
            events.emit(Record::Implausible {
                variant: variant.to_owned(),
                shape,
                dtype,
                kv_splits: case.kv_splits,
                timing,
                reason,
            })?;
            return Ok(false);
        }
        let conditions = flagged(case, &self.project.policies.gpu_state.retime_on);
        bests.offer(variant, case, &timing, conditions.is_empty());
        events.emit(Record::Timed {
            variant: variant.to_owned(),
            shape,
            dtype,
            kv_splits: case.kv_splits,
            timing,
            verified: case.stages.clone(),
            costs: Some(case.costs.clone()),
            gpu: case.gpu_state.clone(),
            conditions,
            raced: case.raced.clone(),
            placed: placed.map(str::to_owned),
            device: Some(device),
        })?;
        Ok(true)
    }

    /// Log one worker's results; returns a retry job when the worker died and the variant has a second chance.
    pub(super) fn record_outcome(
        &self,
        events: &mut Events,
        result: JobResult,
        tally: &mut Books,
    ) -> Result<Option<Retry>> {
        let JobResult {
            job,
            outcome,
            device,
            started,
            seconds,
            disturbed,
            placement,
            ..
        } = result;
        let variant = job.variant.clone();
        let placed = placement.as_ref().map(Placement::gpu_label);
        let started_t = events.clock() - started.elapsed().as_secs_f64();
        events.emit(Record::WorkerRan {
            variant: variant.clone(),
            device,
            attempt: job.attempt,
            started_t,
            seconds,
            placed: placed.clone(),
        })?;
        let earlier = tally.streamed.remove(&variant).unwrap_or_default();
        let mut measured = earlier.measured;
        let retime_on = &self.project.policies.gpu_state.retime_on;
        let totals = &mut tally.totals;
        for case in &outcome.cases {
            if earlier.cases.contains(&(case.shape.clone(), case.dtype)) {
                continue;
            }
            let asked = job
                .cases
                .iter()
                .find(|s| s.shape.name == case.shape && s.dtype == case.dtype)
                .ok_or_else(|| {
                    Error::Other(anyhow::anyhow!(
                        "the worker answered for {}/{}, which {variant} was not asked",
                        case.shape,
                        case.dtype
                    ))
                })?;
            note_state_missing(events, device, case, &mut tally.state_reported)?;
            let first = disturbed
                .iter()
                .find(|d| d.shape == case.shape && d.dtype == case.dtype);
            if let (Some(first), Some(timing)) = (first, first.and_then(|f| f.timing.clone())) {
                events.emit(Record::Disturbed {
                    variant: variant.clone(),
                    shape: first.shape.clone(),
                    dtype: first.dtype,
                    conditions: flagged(first, retime_on),
                    timing,
                    gpu: first.gpu_state.clone(),
                })?;
            }
            let logged = self.record_case(
                events,
                &variant,
                device,
                case,
                &asked.shape,
                placed.as_deref(),
                &mut tally.bests,
            )?;
            if logged {
                totals.measured += 1;
                measured += 1;
            } else {
                totals.failed += 1;
            }
        }
        // A garbled reply is a failure of the case in flight, logged with the line; never retried.
        let mut answered = outcome.cases.len();
        if let WorkerEnd::Garbled { line } = &outcome.end {
            if let Some(case) = job.cases.get(answered) {
                totals.failed += 1;
                events.emit(Record::CheckFailed {
                    variant: variant.clone(),
                    shape: case.shape.name.clone(),
                    dtype: case.dtype,
                    check: None,
                    reason: crate::gpu::executor::garbled_reason(line),
                    fault: Some(crate::model::protocol::CaseFault::Crashed),
                })?;
                answered += 1;
            }
        }
        let remaining: Vec<CaseSpec> = job.cases.iter().skip(answered).cloned().collect();
        let ended = Ended {
            job,
            remaining,
            measured,
            device,
            placed,
        };
        self.after_end(events, outcome.end, ended, totals)
    }

    /// Log how the job's worker ended, and what becomes of the cases it did not answer.
    fn after_end(
        &self,
        events: &mut Events,
        end: WorkerEnd,
        ended: Ended,
        totals: &mut Totals,
    ) -> Result<Option<Retry>> {
        let variant = ended.job.variant.clone();
        let not_run = ended.not_run();
        let crashed = |events: &mut Events, detail: &str, failure: WorkerFailure| {
            events.emit(Record::WorkerCrashed {
                variant: variant.clone(),
                detail: detail.to_owned(),
                cases_not_run: not_run.clone(),
                failure: Some(failure),
                not_started: None,
            })
        };
        let fault = match end {
            WorkerEnd::Clean => return ended.done(events).map(|()| None),
            WorkerEnd::Lost { loss, detail } => return self.lost(events, ended, loss, detail),
            WorkerEnd::TimedOut { seconds } => {
                events.emit(Record::TimedOut {
                    variant: variant.clone(),
                    stage: crate::log::runlog::TimedOutStage::Worker,
                    seconds,
                    cases_not_run: not_run.clone(),
                })?;
                Fault::Own(format!(
                    "worker timed out: {}",
                    crate::log::runlog::TimedOutStage::Worker.limit(seconds)
                ))
            }
            WorkerEnd::Fatal(detail) => {
                crashed(events, &detail, WorkerFailure::Died)?;
                Fault::Own(detail)
            }
            WorkerEnd::Garbled { line } => {
                let detail = crate::gpu::executor::garbled_reason(&line);
                crashed(events, &detail, WorkerFailure::Garbled)?;
                Fault::Own(detail)
            }
            WorkerEnd::Crashed {
                status,
                stderr_tail,
            } => {
                let detail = format!("{status}: {stderr_tail}");
                crashed(events, &detail, WorkerFailure::Died)?;
                Fault::Own(detail)
            }
            WorkerEnd::NotStarted { why } => {
                let detail = format!("{}: {why}", crate::model::protocol::WORKER_NOT_STARTED);
                crashed(events, &detail, WorkerFailure::NotStarted)?;
                Fault::NotStarted(detail)
            }
        };
        if ended.remaining.is_empty() {
            return ended.done(events).map(|()| None);
        }
        let Ended {
            job,
            remaining,
            measured,
            ..
        } = ended;
        let (retry, detail, after, faults) = match fault {
            // A run that is stopping starts no step: the variant stays unfinished for `resume`.
            Fault::NotStarted(_) if crate::os::stop::requested().is_some() => return Ok(None),
            Fault::NotStarted(detail) => (
                job.attempt <= INFRA_RETRIES,
                detail,
                Duration::from_secs(1 << job.attempt.min(4)),
                job.faults,
            ),
            Fault::Own(detail) => (job.faults + 1 < 2, detail, Duration::ZERO, job.faults + 1),
        };
        if retry {
            return Ok(Some(Retry {
                job: Job {
                    variant,
                    cases: remaining,
                    attempt: job.attempt + 1,
                    faults,
                    lost: job.lost,
                },
                after,
            }));
        }
        totals.failed += remaining.len();
        let reason = format!("failed twice: {detail}");
        events.emit(Record::Quarantined {
            variant: variant.clone(),
            reason: reason.clone(),
            cases_not_run: not_run,
        })?;
        for case in &remaining {
            events.emit(Record::CaseSkipped {
                variant: variant.clone(),
                shape: case.shape.name.clone(),
                dtype: case.dtype,
                reason: format!("quarantined: {reason}"),
                skipped_for: Some(SkipReason::Quarantined),
            })?;
        }
        events.emit(Record::VariantDone {
            variant,
            measured_cases: measured,
        })?;
        Ok(None)
    }

    /// The cluster ended the worker's step: logged, never held against the variant. Its cases go to
    /// another step at once; after `[slurm] max_lost` losses they are skipped (not quarantined); a
    /// run that is stopping leaves them to `resume`. An allocation that ended stops the run.
    fn lost(
        &self,
        events: &mut Events,
        ended: Ended,
        loss: crate::gpu::slurm::StepLoss,
        detail: String,
    ) -> Result<Option<Retry>> {
        events.emit(Record::WorkerLost {
            variant: ended.job.variant.clone(),
            device: ended.device,
            placed: ended.placed.clone(),
            loss,
            detail: detail.clone(),
            cases_not_run: ended.not_run(),
        })?;
        if loss == crate::gpu::slurm::StepLoss::AllocationEnded {
            crate::os::stop::request_because(
                libc::SIGTERM,
                format!("{detail}: stopping the run as on SIGTERM; `flashtune resume` finishes it"),
            );
        }
        if crate::os::stop::requested().is_some() {
            return Ok(None);
        }
        if ended.remaining.is_empty() {
            return ended.done(events).map(|()| None);
        }
        let max_lost = self.project.policies.slurm.max_lost;
        let Ended {
            job,
            remaining,
            measured,
            ..
        } = ended;
        if job.lost < max_lost {
            return Ok(Some(Retry {
                job: Job {
                    variant: job.variant,
                    cases: remaining,
                    attempt: job.attempt + 1,
                    faults: job.faults,
                    lost: job.lost + 1,
                },
                after: Duration::ZERO,
            }));
        }
        let reason = format!(
            "not measured: the cluster ended its worker {} times ([slurm] max_lost = {max_lost}), last: {}",
            job.lost + 1,
            loss.describe()
        );
        for case in &remaining {
            events.emit(Record::CaseSkipped {
                variant: job.variant.clone(),
                shape: case.shape.name.clone(),
                dtype: case.dtype,
                reason: reason.clone(),
                skipped_for: Some(SkipReason::ClusterLost),
            })?;
        }
        events.emit(Record::VariantDone {
            variant: job.variant,
            measured_cases: measured,
        })?;
        Ok(None)
    }
}

/// The first case a GPU answers without its state (no NVML) says why, once per GPU.
fn note_state_missing(
    events: &mut Events,
    device: u32,
    case: &CaseResult,
    reported: &mut BTreeSet<u32>,
) -> Result<()> {
    match &case.gpu_state_missing {
        Some(why) if reported.insert(device) => events.emit(Record::GpuStateUnavailable {
            device,
            reason: why.clone(),
        }),
        _ => Ok(()),
    }
}

/// Whose failure a worker's bad end was.
enum Fault {
    /// The worker never started (or never got its GPU): the machine's, retried with backoff.
    NotStarted(String),
    /// The variant's own: retried once, quarantined the second time.
    Own(String),
}

/// A job whose worker answered what it answered.
struct Ended {
    job: Job,
    remaining: Vec<CaseSpec>,
    measured: usize,
    device: u32,
    placed: Option<String>,
}

impl Ended {
    fn not_run(&self) -> Vec<String> {
        self.remaining
            .iter()
            .map(|c| format!("{}/{}", c.shape.name, c.dtype))
            .collect()
    }

    fn done(self, events: &mut Events) -> Result<()> {
        events.emit(Record::VariantDone {
            variant: self.job.variant,
            measured_cases: self.measured,
        })
    }
}
