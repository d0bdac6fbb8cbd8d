//! One GPU's measurement queue: a worker session that takes jobs, hands on each case as the worker answers it, times the drift sentinel between jobs, and re-times cases a disturbed GPU timed.
use super::{held_for_retime, Job};
use crate::gpu::executor::{Executor, Session, WorkerEnd, WorkerOutcome};
use crate::model::config::Shape;
use crate::model::protocol::{
    CaseResult, CaseSpec, Condition, MeasureSpec, Placement, RunRequest, SentinelResult,
    WorkerMessage, WorkerRequest,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};

pub(super) struct JobResult {
    pub(super) job: Job,
    pub(super) device: u32,
    pub(super) started: Instant,
    pub(super) seconds: f64,
    pub(super) outcome: WorkerOutcome,
    /// First timings replaced by a re-timing (taken under a condition of `[gpu_state] retime_on`).
    pub(super) disturbed: Vec<CaseResult>,
    /// Set when the GPU failed its health check after this job: that GPU takes no more work.
    pub(super) unhealthy: Option<String>,
    /// Where the worker ran, when Slurm placed it.
    pub(super) placement: Option<Placement>,
}

/// What a GPU's queue reports: a finished job, or a drift sentinel timed between jobs.
pub(super) enum GpuEvent {
    /// A case the worker answered, the moment it answered: logged at once, so a run killed in the
    /// middle of a variant keeps it. A case to be re-timed is not sent (its job's end decides it).
    Case(StreamedCase),
    Job(JobResult),
    Sentinel {
        device: u32,
        when: &'static str,
        result: SentinelResult,
    },
}

pub(super) struct StreamedCase {
    pub(super) variant: String,
    pub(super) device: u32,
    /// The node and GPU of the Slurm step, when Slurm placed the worker.
    pub(super) placed: Option<String>,
    /// The shape the job asked this case on.
    pub(super) shape: Shape,
    pub(super) case: Box<CaseResult>,
}

/// How a GPU's queue measures: the case policy, the sentinel's, and when a timing is taken again.
pub(super) struct LoopPolicy {
    pub(super) measure: MeasureSpec,
    pub(super) timeout: Duration,
    pub(super) sentinel_every: Duration,
    pub(super) sentinel_reps: usize,
    pub(super) retime_on: Vec<Condition>,
}

/// The GPU queues of one scheduler run: aborted (their workers killed) however the run returns.
pub(super) struct GpuTasks(pub(super) Vec<tokio::task::JoinHandle<()>>);

impl Drop for GpuTasks {
    fn drop(&mut self) {
        self.0.iter().for_each(|t| t.abort());
    }
}

/// The session of a GPU's queue, opened if there is none or the last one ended badly.
async fn live<'s>(
    session: &'s mut Option<Session>,
    executor: &Executor,
    device: u32,
) -> std::result::Result<&'s mut Session, WorkerEnd> {
    if !session.as_ref().is_some_and(|s| s.alive) {
        *session = None;
        *session = Some(executor.open(device).await?);
    }
    Ok(session.as_mut().expect("just opened"))
}

/// Time the drift sentinel in the queue's session and report it.
async fn run_sentinel(
    executor: &Executor,
    device: u32,
    session: &mut Option<Session>,
    policy: &LoopPolicy,
    when: &'static str,
    results: &mpsc::UnboundedSender<GpuEvent>,
) {
    let request = WorkerRequest::Sentinel {
        reps: policy.sentinel_reps,
    };
    let outcome = match live(session, executor, device).await {
        Ok(s) => s.request(&request, policy.timeout).await,
        Err(end) => WorkerOutcome::ended(end),
    };
    if outcome.end != WorkerEnd::Clean {
        *session = None;
    }
    let result = outcome.sentinel.clone().unwrap_or_else(|| SentinelResult {
        error: Some(
            outcome
                .trouble()
                .unwrap_or_else(|| "the worker did not answer".into()),
        ),
        ..Default::default()
    });
    let _ = results.send(GpuEvent::Sentinel {
        device,
        when,
        result,
    });
}

/// Take jobs from the shared queue and run them on one GPU in one worker session; a session that
/// ends badly is dropped (its process group killed), the GPU health-checked when the end may be the
/// GPU's, and the next job gets a fresh worker. The drift sentinel runs in the same session before
/// the first job (and the first on each new GPU: a new Slurm step may land on another), then whenever
/// `[sentinel] every_s` has passed, and once more when the queue closes (unless the run is stopping).
pub(super) async fn gpu_loop(
    executor: Executor,
    device: u32,
    policy: Arc<LoopPolicy>,
    jobs: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    results: mpsc::UnboundedSender<GpuEvent>,
) {
    let mut session: Option<Session> = None;
    let mut last_sentinel: Option<Instant> = None;
    let mut last_placement: Option<Placement> = None;
    loop {
        let job = { jobs.lock().await.recv().await };
        let Some(job) = job else {
            if last_sentinel.is_some() && crate::os::stop::requested().is_none() {
                run_sentinel(&executor, device, &mut session, &policy, "end", &results).await;
            }
            return;
        };
        let mut placement = None;
        let opened = match live(&mut session, &executor, device).await {
            Ok(s) => {
                placement = s.device.as_ref().and_then(|d| d.placement.clone());
                Ok(())
            }
            Err(end) => Err(end),
        };
        let gpu = |p: &Option<Placement>| p.as_ref().map(Placement::gpu_label);
        if placement.is_some() && gpu(&placement) != gpu(&last_placement) {
            last_placement = placement.clone();
            last_sentinel = None;
        }
        if opened.is_ok() && last_sentinel.is_none_or(|t| t.elapsed() >= policy.sentinel_every) {
            let when = if last_sentinel.is_none() {
                "start"
            } else {
                "periodic"
            };
            run_sentinel(&executor, device, &mut session, &policy, when, &results).await;
            last_sentinel = Some(Instant::now());
        }
        let request = WorkerRequest::Run(RunRequest {
            measure: policy.measure.clone(),
            cases: job.cases.clone(),
        });
        let started = Instant::now();
        let mut outcome = match opened {
            Err(end) => WorkerOutcome::ended(end),
            Ok(()) => match live(&mut session, &executor, device).await {
                Ok(s) => {
                    let placed = placement.as_ref().map(Placement::gpu_label);
                    let stream = |m: &WorkerMessage| {
                        let WorkerMessage::Case(case) = m else {
                            return;
                        };
                        // An answer for a case the job did not ask is the job's end's to refuse.
                        let asked = job
                            .cases
                            .iter()
                            .find(|s| s.shape.name == case.shape && s.dtype == case.dtype);
                        if let Some(spec) =
                            asked.filter(|_| !held_for_retime(case, &policy.retime_on))
                        {
                            let _ = results.send(GpuEvent::Case(StreamedCase {
                                variant: job.variant.clone(),
                                device,
                                placed: placed.clone(),
                                shape: spec.shape.clone(),
                                case: case.clone(),
                            }));
                        }
                    };
                    s.request_each(&request, policy.timeout, stream).await
                }
                Err(end) => WorkerOutcome::ended(end),
            },
        };
        let mut disturbed = Vec::new();
        if outcome.end == WorkerEnd::Clean && crate::os::stop::requested().is_none() {
            disturbed = retime(&mut session, &policy, &job, &mut outcome).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        if outcome.end != WorkerEnd::Clean {
            session = None;
        }
        let unhealthy = match outcome.end.may_be_gpus() {
            true => executor.probe(device).await.err(),
            false => None,
        };
        let stop = unhealthy.is_some();
        if results
            .send(GpuEvent::Job(JobResult {
                job,
                device,
                started,
                seconds,
                outcome,
                disturbed,
                unhealthy,
                placement,
            }))
            .is_err()
            || stop
        {
            return;
        }
    }
}

/// Time once more, in the same session, the cases timed under a condition of `[gpu_state]
/// retime_on`; their second results replace the first, which are returned. A re-timing that goes
/// wrong keeps the first results (flagged) and ends the session.
async fn retime(
    session: &mut Option<Session>,
    policy: &LoopPolicy,
    job: &Job,
    outcome: &mut WorkerOutcome,
) -> Vec<CaseResult> {
    let again: Vec<CaseSpec> = outcome
        .cases
        .iter()
        .filter(|c| held_for_retime(c, &policy.retime_on))
        .filter_map(|c| {
            job.cases
                .iter()
                .find(|s| s.shape.name == c.shape && s.dtype == c.dtype)
                .cloned()
        })
        .collect();
    let Some(s) = session.as_mut().filter(|s| s.alive && !again.is_empty()) else {
        return Vec::new();
    };
    let request = WorkerRequest::Run(RunRequest {
        measure: policy.measure.clone(),
        cases: again,
    });
    let second = s.request(&request, policy.timeout).await;
    if second.end != WorkerEnd::Clean {
        *session = None;
        return Vec::new();
    }
    let mut replaced = Vec::new();
    for r in second.cases {
        if let Some(slot) = outcome
            .cases
            .iter_mut()
            .find(|c| c.shape == r.shape && c.dtype == r.dtype)
        {
            replaced.push(std::mem::replace(slot, r));
        }
    }
    replaced
}
