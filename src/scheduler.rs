//! The pipelined run: builds in parallel feed one serial measurement queue per GPU; crashes are retried once, then quarantined.
use crate::build::{self, BuildFailure, BuildOutput, BuildSpec};
use crate::config::Dtype;
use crate::engine::{case_seed, Events, Project, REFERENCE};
use crate::error::{Error, Result};
use crate::executor::{Executor, WorkerEnd, WorkerOutcome};
use crate::protocol::*;
use crate::runlog::Record;
use crate::space::PlannedPoint;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};

/// Which build serves a (variant, dtype, head dim); the reference uses head dim 0.
pub type UnitKey = (String, Dtype, u32);

/// A finished build, as the build tasks report it.
pub type BuildResult = (UnitKey, std::result::Result<BuildOutput, BuildFailure>);

/// Limits on one run, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Budget {
    pub max_variants: Option<usize>,
    pub time_limit: Option<Duration>,
}

#[derive(Debug, Default, Clone)]
pub struct Totals {
    pub variants: usize,
    pub measured: usize,
    pub failed: usize,
    /// The budget that stopped the run early, if one did.
    pub budget_stop: Option<String>,
}

/// How the pipeline ended.
pub enum Ending {
    Finished(Totals),
    /// First Ctrl-C: the measurement in flight finished, nothing new started.
    Interrupted(Totals),
}

struct Job {
    variant: String,
    cases: Vec<CaseSpec>,
    attempt: u32,
}

/// A job to queue again, after a pause when the failure was the infrastructure's.
struct Retry {
    job: Job,
    after: Duration,
}

struct JobResult {
    job: Job,
    device: u32,
    started: Instant,
    seconds: f64,
    outcome: WorkerOutcome,
    /// Set when the GPU failed its health check after this job: that GPU takes no more work.
    unhealthy: Option<String>,
}

/// Infrastructure failures (a worker that did not start) are retried with backoff, up to this many times.
const INFRA_RETRIES: u32 = 3;

pub struct Scheduler<'a> {
    pub project: &'a Project,
    pub executor: &'a Executor,
    pub devices: &'a [u32],
    pub arch: &'a str,
    pub budget: &'a Budget,
    /// Variants a resumed run already finished.
    pub done: &'a BTreeSet<String>,
}

impl Scheduler<'_> {
    pub async fn run(&self, planned: &[PlannedPoint], events: &mut Events) -> Result<Ending> {
        let started = Instant::now();
        let project = self.project;
        let dtypes = project.policies.dtypes.clone();

        let specs = project.build_specs(planned, self.arch, self.done);
        let mut units_left: BTreeMap<String, usize> = BTreeMap::new();
        let mut variant_order: Vec<String> = Vec::new();
        for ((variant, _, _), _) in specs.iter().filter(|((v, _, _), _)| v != REFERENCE) {
            *units_left.entry(variant.clone()).or_default() += 1;
            if !variant_order.contains(variant) {
                variant_order.push(variant.clone());
            }
        }
        let mut totals = Totals {
            variants: variant_order.len(),
            ..Default::default()
        };
        let mut builds_left = specs.len();
        let (mut build_tasks, mut build_rx) = spawn_builds(project, specs);

        // Measurement: one serial queue per GPU; the orchestrator alone writes the log.
        let (job_tx, job_rx) = mpsc::unbounded_channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (result_tx, mut result_rx) = mpsc::unbounded_channel::<JobResult>();
        let mut gpu_tasks = Vec::new();
        let policy = &project.policies.measure;
        let measure = MeasureSpec {
            warmup_ms: policy.warmup_ms,
            samples: policy.samples,
            min_sample_us: policy.min_sample_us,
        };
        for &device in self.devices {
            let (executor, rx, tx) = (self.executor.clone(), job_rx.clone(), result_tx.clone());
            let timeout = Duration::from_secs(project.timeouts.worker_s);
            gpu_tasks.push(tokio::spawn(gpu_loop(
                executor,
                device,
                measure.clone(),
                timeout,
                rx,
                tx,
            )));
        }
        drop(result_tx);
        let mut live_gpus = self.devices.len();

        let mut cubins: BTreeMap<UnitKey, PathBuf> = BTreeMap::new();
        let mut references_left = dtypes.len();
        let mut ready: Vec<String> = Vec::new();
        let mut in_flight = 0usize;
        let mut dispatched = 0usize;
        // One listener for the whole run: a Ctrl-C that lands while the loop is busy is kept, not lost.
        let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| Error::Other(anyhow::anyhow!("cannot listen for Ctrl-C: {e}")))?;
        let mut stopping: Option<String> = None;
        let (mut running, mut finished): (BTreeSet<String>, BTreeSet<String>) = Default::default();
        let mut interrupted = false;
        loop {
            // Dispatch what is ready, in the space's order, one job per free GPU: work stays in
            // `ready` until a GPU takes it, so budgets and Ctrl-C apply to everything not started.
            if references_left == 0 && stopping.is_none() {
                ready.sort_by_key(|v| variant_order.iter().position(|o| o == v));
                while in_flight < live_gpus && !ready.is_empty() {
                    if let Some(reason) = self.budget_reached(dispatched, started) {
                        let not_measured: Vec<String> = variant_order
                            .iter()
                            .filter(|v| !finished.contains(*v) && !running.contains(*v))
                            .cloned()
                            .collect();
                        events.emit(Record::BudgetReached {
                            reason: reason.clone(),
                            variants_not_measured: not_measured,
                        })?;
                        totals.budget_stop = Some(reason.clone());
                        stopping = Some(reason);
                        build_tasks.abort_all();
                        break;
                    }
                    let variant = ready.remove(0);
                    dispatched += 1;
                    let cases = cases_for(project, planned, &cubins, &variant);
                    if cases.is_empty() {
                        finished.insert(variant.clone());
                        events.emit(Record::VariantDone {
                            variant,
                            measured_cases: 0,
                        })?;
                        continue;
                    }
                    in_flight += 1;
                    running.insert(variant.clone());
                    let _ = job_tx.send(Job {
                        variant,
                        cases,
                        attempt: 1,
                    });
                }
            }
            let building = builds_left > 0 && stopping.is_none();
            if !building && in_flight == 0 && (ready.is_empty() || stopping.is_some()) {
                break;
            }
            tokio::select! {
                Some((key, result)) = build_rx.recv(), if building => {
                    builds_left -= 1;
                    let (variant, dtype, head_dim) = key.clone();
                    if let Some(cubin) = record_build(project, events, key, result)? {
                        cubins.insert((variant.clone(), dtype, head_dim), cubin);
                    }
                    if variant == REFERENCE {
                        references_left -= 1;
                    } else if let Some(left) = units_left.get_mut(&variant) {
                        *left -= 1;
                        if *left == 0 {
                            ready.push(variant);
                        }
                    }
                    if references_left > 0 && builds_left == 0 {
                        return Err(Error::Other(anyhow::anyhow!("the reference kernel did not build; see the build_failed record")));
                    }
                }
                Some(result) = result_rx.recv(), if in_flight > 0 => {
                    in_flight -= 1;
                    if let Some(reason) = &result.unhealthy {
                        live_gpus -= 1;
                        events.emit(Record::GpuUnhealthy { device: result.device, reason: reason.clone() })?;
                    }
                    let variant = result.job.variant.clone();
                    if let Some(Retry { job, after }) = self.record_outcome(events, result, &mut totals)? {
                        in_flight += 1;
                        let tx = job_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            let _ = tx.send(job);
                        });
                    } else {
                        running.remove(&variant);
                        finished.insert(variant);
                    }
                    if live_gpus == 0 && in_flight > 0 {
                        return Err(Error::Other(anyhow::anyhow!("every GPU failed its health check; the log holds what was measured")));
                    }
                }
                _ = sigint.recv() => {
                    if interrupted {
                        // Second Ctrl-C: stop now; dropping the tasks kills the workers.
                        for t in &gpu_tasks {
                            t.abort();
                        }
                        build_tasks.abort_all();
                        return Ok(Ending::Interrupted(totals));
                    }
                    interrupted = true;
                    stopping = Some("Ctrl-C".into());
                    build_tasks.abort_all();
                    eprintln!("\nCtrl-C: finishing the measurement in flight; press Ctrl-C again to stop at once.");
                }
            }
        }
        drop(job_tx);
        for t in gpu_tasks {
            t.abort();
        }
        Ok(if interrupted {
            Ending::Interrupted(totals)
        } else {
            Ending::Finished(totals)
        })
    }

    fn budget_reached(&self, dispatched: usize, started: Instant) -> Option<String> {
        if let Some(max) = self.budget.max_variants {
            if dispatched >= max {
                return Some(format!("--max-variants {max}"));
            }
        }
        if let Some(limit) = self.budget.time_limit {
            if started.elapsed() >= limit {
                return Some(format!("--time-limit {}s", limit.as_secs()));
            }
        }
        None
    }

    /// Log one worker's results; returns a retry job when the worker died and the variant has a second chance.
    fn record_outcome(
        &self,
        events: &mut Events,
        result: JobResult,
        totals: &mut Totals,
    ) -> Result<Option<Retry>> {
        let JobResult {
            job,
            outcome,
            device,
            started,
            seconds,
            ..
        } = result;
        let variant = job.variant.clone();
        let started_t = events.clock() - started.elapsed().as_secs_f64();
        events.emit(Record::WorkerRan {
            variant: variant.clone(),
            device,
            attempt: job.attempt,
            started_t,
            seconds,
        })?;
        let mut measured = 0;
        for case in &outcome.cases {
            let (shape, dtype) = (case.shape.clone(), case.dtype);
            let failure = match (&case.error, &case.check) {
                (Some(err), _) => Some(format!("CUDA error: {err}")),
                (None, Some(check)) if !check.passed() => Some(check.failures.join("; ")),
                (None, Some(_)) => None,
                (None, None) => Some("worker returned no check".into()),
            };
            if let Some(reason) = failure {
                // Wrong answers are final: never retried.
                totals.failed += 1;
                events.emit(Record::CheckFailed {
                    variant: variant.clone(),
                    shape,
                    dtype,
                    check: case.check.clone(),
                    reason,
                })?;
                continue;
            }
            let check = case.check.clone().expect("a passed case has a check");
            events.emit(Record::Checked {
                variant: variant.clone(),
                shape: shape.clone(),
                dtype,
                check,
                function: case.function.clone(),
            })?;
            if let Some(timing) = &case.timing {
                totals.measured += 1;
                measured += 1;
                events.emit(Record::Timed {
                    variant: variant.clone(),
                    shape,
                    dtype,
                    kv_splits: case.kv_splits,
                    timing: timing.clone(),
                })?;
            }
        }
        let remaining: Vec<CaseSpec> = job
            .cases
            .iter()
            .skip(outcome.cases.len())
            .cloned()
            .collect();
        let not_run: Vec<String> = remaining
            .iter()
            .map(|c| format!("{}/{}", c.shape.name, c.dtype))
            .collect();
        let (detail, infrastructure) = match outcome.end {
            WorkerEnd::Clean => {
                events.emit(Record::VariantDone {
                    variant,
                    measured_cases: measured,
                })?;
                return Ok(None);
            }
            WorkerEnd::TimedOut { seconds } => {
                events.emit(Record::TimedOut {
                    variant: variant.clone(),
                    stage: "worker".into(),
                    seconds,
                    cases_not_run: not_run.clone(),
                })?;
                (format!("worker timed out after {seconds} s"), false)
            }
            WorkerEnd::Fatal(detail) => {
                events.emit(Record::WorkerCrashed {
                    variant: variant.clone(),
                    detail: detail.clone(),
                    cases_not_run: not_run.clone(),
                })?;
                (detail, false)
            }
            WorkerEnd::Crashed {
                status,
                stderr_tail,
            } => {
                let detail = format!("{status}: {stderr_tail}");
                events.emit(Record::WorkerCrashed {
                    variant: variant.clone(),
                    detail: detail.clone(),
                    cases_not_run: not_run.clone(),
                })?;
                (detail, status == "not started")
            }
        };
        if remaining.is_empty() {
            events.emit(Record::VariantDone {
                variant,
                measured_cases: measured,
            })?;
            return Ok(None);
        }
        let retries_left = if infrastructure {
            job.attempt <= INFRA_RETRIES
        } else {
            job.attempt < 2
        };
        if retries_left {
            let after = if infrastructure {
                Duration::from_secs(1 << job.attempt.min(4))
            } else {
                Duration::ZERO
            };
            return Ok(Some(Retry {
                job: Job {
                    variant,
                    cases: remaining,
                    attempt: job.attempt + 1,
                },
                after,
            }));
        }
        totals.failed += remaining.len();
        events.emit(Record::Quarantined {
            variant: variant.clone(),
            reason: format!("failed twice: {detail}"),
            cases_not_run: not_run,
        })?;
        events.emit(Record::VariantDone {
            variant,
            measured_cases: measured,
        })?;
        Ok(None)
    }
}

/// Start every build, at most `jobs` nvcc at a time; results arrive in completion order.
pub fn spawn_builds(
    project: &Project,
    specs: Vec<(UnitKey, BuildSpec)>,
) -> (
    tokio::task::JoinSet<()>,
    mpsc::UnboundedReceiver<BuildResult>,
) {
    spawn_builds_with(project.builder(), project.jobs(), specs)
}

/// [`spawn_builds`] with another builder (another cache folder).
pub fn spawn_builds_with(
    builder: crate::build::Builder,
    jobs: usize,
    specs: Vec<(UnitKey, BuildSpec)>,
) -> (
    tokio::task::JoinSet<()>,
    mpsc::UnboundedReceiver<BuildResult>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let slots = Arc::new(tokio::sync::Semaphore::new(jobs.max(1)));
    let builder = Arc::new(builder);
    let mut tasks = tokio::task::JoinSet::new();
    for (key, spec) in specs {
        let (builder, slots, tx) = (builder.clone(), slots.clone(), tx.clone());
        tasks.spawn(async move {
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            let result = builder.build(&spec).await;
            let _ = tx.send((key, result));
        });
    }
    (tasks, rx)
}

/// Take jobs from the shared queue and run them on one GPU, health-checking after any worker failure.
async fn gpu_loop(
    executor: Executor,
    device: u32,
    measure: MeasureSpec,
    timeout: Duration,
    jobs: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    results: mpsc::UnboundedSender<JobResult>,
) {
    loop {
        let job = { jobs.lock().await.recv().await };
        let Some(job) = job else { return };
        let request = RunRequest {
            device,
            measure: measure.clone(),
            cases: job.cases.clone(),
        };
        let started = Instant::now();
        let outcome = executor.run(request, timeout).await;
        let seconds = started.elapsed().as_secs_f64();
        let unhealthy = match outcome.end {
            WorkerEnd::Clean => None,
            _ => executor.probe(device).await.err(),
        };
        let stop = unhealthy.is_some();
        if results
            .send(JobResult {
                job,
                device,
                started,
                seconds,
                outcome,
                unhealthy,
            })
            .is_err()
            || stop
        {
            return;
        }
    }
}

/// Log a build (and its gate); the cubin when it may run.
fn record_build(
    project: &Project,
    events: &mut Events,
    (variant, dtype, head_dim): UnitKey,
    result: std::result::Result<BuildOutput, BuildFailure>,
) -> Result<Option<PathBuf>> {
    match result {
        Ok(out) => {
            let gate = project.gate(&out);
            events.emit(Record::built(&variant, dtype, head_dim, &out))?;
            match gate {
                Some(reason) => {
                    events.emit(Record::Rejected {
                        variant,
                        dtype,
                        head_dim,
                        reason,
                    })?;
                    Ok(None)
                }
                None => Ok(Some(out.cubin)),
            }
        }
        Err(failure) => {
            events.emit(Record::BuildFailed {
                variant,
                dtype,
                head_dim,
                reason: failure.to_string(),
                log_tail: build::log_tail(failure.log(), 30),
            })?;
            Ok(None)
        }
    }
}

fn cases_for(
    project: &Project,
    planned: &[PlannedPoint],
    cubins: &BTreeMap<UnitKey, PathBuf>,
    variant_id: &str,
) -> Vec<CaseSpec> {
    let family = &project.space.family;
    let policy = &project.policies.measure;
    let mut cases = Vec::new();
    for shape in &project.shapes {
        let Some(point) = planned
            .iter()
            .find(|p| p.variant.id == variant_id && p.head_dim == shape.d && p.invalid.is_none())
        else {
            continue;
        };
        for &dtype in &project.policies.dtypes {
            let forward = cubins.get(&(variant_id.to_owned(), dtype, shape.d));
            let reference = cubins.get(&(REFERENCE.to_owned(), dtype, 0));
            let (Some(forward), Some(reference)) = (forward, reference) else {
                continue;
            };
            cases.push(CaseSpec {
                shape: shape.clone(),
                dtype,
                seed: case_seed(policy.seed, variant_id, shape, dtype),
                tolerance: project.policies.tolerance_for(dtype),
                cpu_oracle: shape.macs() <= policy.cpu_reference_max_macs,
                forward: ForwardKernel {
                    cubin: forward.clone(),
                    entry: family.forward_entry.clone(),
                    combine_entry: family.combine_entry.clone(),
                    launch: point.launch.clone().expect("valid points have a launch"),
                    defines: project
                        .space
                        .forward_defines(&point.variant, dtype, shape.d),
                },
                reference: ReferenceKernel {
                    cubin: reference.clone(),
                    entry: family.reference_entry.clone(),
                },
            });
        }
    }
    cases
}
