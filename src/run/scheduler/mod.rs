//! The pipelined run: builds in parallel feed one serial measurement queue per GPU; crashes are retried once, then quarantined; a case timed on a throttled or shared GPU is timed again once; the drift sentinel is timed between variants.
use crate::error::{Error, Result};
use crate::gpu::build::{BuildFailure, BuildOutput};
use crate::gpu::executor::Executor;
use crate::log::runlog::Record;
use crate::model::config::Dtype;
use crate::model::protocol::{
    CaseResult, CaseSpec, Condition, ForwardKernel, MeasureSpec, ReferenceKernel, SentinelResult,
};
use crate::model::space::{PlannedPoint, REFERENCE};
use crate::run::budget::Budget;
use crate::run::shared::{input_seed, Events, Project, UnitKey};
use bests::Bests;
use gpu_queue::{gpu_loop, GpuEvent, GpuTasks, LoopPolicy};
use outcome::Books;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};

mod bests;
mod builds;
mod climb;
mod gpu_queue;
mod held;
mod outcome;

pub use builds::{spawn_builds, spawn_builds_with};
pub use held::HeldGpu;

/// A (variant, shape, dtype): the cases `anytime` takes from the results store instead of measuring.
pub type CaseKey = (String, String, Dtype);

/// A finished build, as the build tasks report it.
pub type BuildResult = (UnitKey, std::result::Result<BuildOutput, BuildFailure>);

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
    /// Tries so far, this one included.
    attempt: u32,
    /// Times its worker failed by the variant's own doing (the second quarantines it).
    faults: u32,
    /// Times the cluster ended its worker's step (never held against it).
    lost: u32,
}

/// A job to queue again, after a pause when the failure was the infrastructure's.
struct Retry {
    job: Job,
    after: Duration,
}

/// The conditions of `[gpu_state] retime_on` a case was timed under.
fn flagged(case: &CaseResult, retime_on: &[Condition]) -> Vec<Condition> {
    case.gpu_state.as_ref().map_or_else(Vec::new, |s| {
        s.conditions()
            .into_iter()
            .filter(|c| retime_on.contains(c))
            .collect()
    })
}

/// A case that passed but was timed under a condition of `[gpu_state] retime_on`: its queue times
/// it again in the same session, and the second timing is the one logged.
fn held_for_retime(case: &CaseResult, retime_on: &[Condition]) -> bool {
    case.failure().is_none() && !flagged(case, retime_on).is_empty()
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
    /// The run's input seed: every variant of the run is judged on the same input sets.
    pub run_seed: u64,
    /// The roofs figures are held to; a case beyond one is `implausible`, never `timed`.
    pub roofs: &'a crate::report::roofs::Roofs,
    /// Cases with a result already: supplied by the results store (`--reuse`), or answered before
    /// a resumed run stopped. Never measured again, never skipped.
    pub settled: &'a BTreeSet<crate::run::scheduler::CaseKey>,
    /// Take variants near the leaders ahead of the order (`climb`): a run under a time limit alone.
    pub climb: bool,
}

impl Scheduler<'_> {
    /// Over 150 lines on purpose: the event loop. Its state (what is built, ready, running and
    /// finished, the GPUs alive, why it is stopping) is the loop's own locals, each changed in one
    /// arm of one `select!`; cut into methods, it would travel as a dozen `&mut`s.
    /// `held`, when given, holds one of the run's GPUs until it ends (the reference library timed
    /// there while the other GPUs time cases and nvcc builds); that GPU's queue starts then.
    pub async fn run(
        &self,
        planned: &[PlannedPoint],
        events: &mut Events,
        mut held: Option<HeldGpu<'_>>,
    ) -> Result<Ending> {
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
        let mut books = Books {
            totals: Totals {
                variants: variant_order.len(),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut builds_left = specs.len();
        let (mut build_tasks, mut build_rx) = spawn_builds(project, specs);

        // Measurement: one serial queue per GPU; the orchestrator alone writes the log. A held
        // GPU of this host gets its queue when the held work ends (a cluster's GPUs are the
        // workers' steps, never the held work's); on a run's only GPU the held work comes last.
        let mut began_held = events.stage_start();
        let held_here = held
            .as_ref()
            .map(|h| h.gpu)
            .filter(|g| self.devices.contains(g) && self.executor.queues().is_none());
        let turn = held::Turn::of(held_here, self.devices);
        let mut held_waits = turn == held::Turn::Last;
        let queues_now: Vec<u32> = self
            .devices
            .iter()
            .copied()
            .filter(|&d| turn == held::Turn::Last || Some(d) != held_here)
            .collect();
        let (job_tx, mut gpu_tasks, mut result_rx, starter) = self.start_gpu_queues(&queues_now);
        let max_drift = project.policies.sentinel.max_drift;
        let mut live_gpus = queues_now.len();

        let mut cubins: BTreeMap<UnitKey, PathBuf> = BTreeMap::new();
        let mut references_left = dtypes.len();
        let mut ready: Vec<String> = Vec::new();
        let mut in_flight = 0usize;
        let mut dispatched = 0usize;
        // SIGINT, SIGTERM and SIGHUP are kept process-wide: one that landed before this run started,
        // or while the loop was busy, is not lost.
        crate::os::stop::listen()
            .map_err(|e| Error::Other(anyhow::anyhow!("cannot listen for signals: {e}")))?;
        let mut stopping: Option<String> = None;
        let (mut running, mut finished): (BTreeSet<String>, BTreeSet<String>) = Default::default();
        let mut interrupted = false;
        // The time limit wakes the loop when it falls, and ends what still runs at its grace.
        let deadline = self.budget.deadline();
        // Cases stop early enough for held work that comes last to fit before the limit.
        let reserve = (turn == held::Turn::Last)
            .then(|| held::reserve(project.shapes.len() * dtypes.len(), self.budget))
            .unwrap_or_default();
        let cases_until = deadline.map(|d| d - reserve);
        let mut cut_at: Option<Instant> = None;
        let mut climber = self.climb.then(|| self.climber(planned));
        loop {
            // Counted before looking: a signal that lands after this wakes the select below at once.
            let signals = crate::os::stop::count();
            if signals >= 2 {
                // Second signal: stop now; the tasks' drop kills the workers and nvcc.
                build_tasks.abort_all();
                return Ok(Ending::Interrupted(books.totals));
            }
            if !interrupted && signals >= 1 {
                interrupted = true;
                let signal = crate::os::stop::requested().map_or("a signal", crate::os::stop::name);
                stopping = Some(signal.into());
                build_tasks.abort_all();
                // Abandoned, as any stage is on a signal: its records are not logged.
                held = None;
            }
            if stopping.is_none() && cases_until.is_some_and(|d| Instant::now() >= d) {
                let reason = held::time_limit_reason(self.budget, reserve).unwrap_or_default();
                let not_started = not_started(&variant_order, &finished, &running);
                self.stop_for_budget(events, &reason, planned, not_started)?;
                books.totals.budget_stop = Some(reason.clone());
                stopping = Some(reason);
                build_tasks.abort_all();
                cut_at = deadline.map(|d| d + Budget::GRACE);
            }
            // Dispatch what is ready, in the plan's order (best first under a budget), one job per
            // free GPU: work stays in `ready` until a GPU takes it, so budgets and Ctrl-C apply to
            // everything not started.
            if references_left == 0 && stopping.is_none() {
                ready.sort_by_key(|v| variant_order.iter().position(|o| o == v));
                while in_flight < live_gpus && !ready.is_empty() {
                    if let Some(reason) = self.variants_reached(dispatched) {
                        let not_started = not_started(&variant_order, &finished, &running);
                        self.stop_for_budget(events, &reason, planned, not_started)?;
                        books.totals.budget_stop = Some(reason.clone());
                        stopping = Some(reason);
                        build_tasks.abort_all();
                        break;
                    }
                    // --max-variants N measures exactly the first N of the order: the next one
                    // waits for its own build rather than let a later one that built sooner in.
                    let next = variant_order
                        .iter()
                        .find(|v| !finished.contains(*v) && !running.contains(*v));
                    if self.budget.max_variants.is_some() && next != ready.first() {
                        break;
                    }
                    let variant = climb::next(
                        climber.as_mut(),
                        &mut ready,
                        &books.bests,
                        &variant_order,
                        events,
                    )?;
                    dispatched += 1;
                    let cases = self.cases_to_measure(planned, &cubins, &variant, &books.bests);
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
                        faults: 0,
                        lost: 0,
                    });
                }
            }
            let building = builds_left > 0 && stopping.is_none();
            // Held work that comes last starts once no case is left to time, or none may start.
            if held_waits
                && in_flight == 0
                && (stopping.is_some() || (!building && ready.is_empty()))
            {
                held_waits = false;
                began_held = events.stage_start();
                // Nothing starts after the time limit, held work that came last included.
                if self.budget.time_is_up() {
                    held = None;
                }
            }
            if !building
                && in_flight == 0
                && held.is_none()
                && (ready.is_empty() || stopping.is_some())
            {
                break;
            }
            tokio::select! {
                Some((key, result)) = build_rx.recv(), if building => {
                    builds_left -= 1;
                    let variant = key.0.clone();
                    // A stop's signal (a cancelled Slurm job's SIGTERM) reaches nvcc too: a build
                    // that fails while the run is being stopped is no verdict on its variant.
                    if matches!(&result, Err(BuildFailure::Compiler { .. }))
                        && stopped_meanwhile().await
                    {
                        continue;
                    }
                    self.take_build(events, (key, result), &mut cubins)?;
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
                Some(event) = result_rx.recv(), if in_flight > 0 => {
                    let result = match event {
                        GpuEvent::Sentinel { device, when, result } => {
                            record_sentinel(events, device, when, result, max_drift)?;
                            continue;
                        }
                        GpuEvent::Case(case) => {
                            self.record_streamed(events, case, &mut books)?;
                            continue;
                        }
                        GpuEvent::Job(result) => result,
                    };
                    in_flight -= 1;
                    if let Some(reason) = &result.unhealthy {
                        live_gpus -= 1;
                        events.emit(Record::GpuUnhealthy { device: result.device, reason: reason.clone() })?;
                    }
                    let variant = result.job.variant.clone();
                    if let Some(retry) = self.record_outcome(events, result, &mut books)? {
                        in_flight += 1;
                        requeue(&job_tx, retry);
                    } else {
                        running.remove(&variant);
                        finished.insert(variant);
                    }
                    if live_gpus == 0 && in_flight > 0 {
                        return Err(Error::Other(anyhow::anyhow!("every GPU failed its health check; the log holds what was measured")));
                    }
                }
                records = held::ended(&mut held), if !held_waits => {
                    let ended = held.take().expect("the branch runs only while one is held");
                    events.emit_all(records)?;
                    events.stage_ran(ended.stage, ended.gpu, began_held)?;
                    if turn == held::Turn::First && held_here == Some(ended.gpu) && stopping.is_none() {
                        starter.start(&mut gpu_tasks, ended.gpu);
                        live_gpus += 1;
                    }
                }
                // The top of the loop acts on it.
                _ = crate::os::stop::reached(signals + 1) => {}
                _ = sleep_until(cases_until), if stopping.is_none() && cases_until.is_some() => {}
                _ = sleep_until(cut_at), if cut_at.is_some() && (in_flight > 0 || held.is_some()) => {
                    self.skip_cut_short(events, planned, &running, &books)?;
                    break;
                }
            }
        }
        drop(job_tx);
        // Every queue's results sender goes with its queue: the last sentinels end with them.
        drop(starter);
        if cut_at.is_some() {
            // After the time limit nothing more is timed, a last sentinel included: ending the
            // queues ends their workers.
            drop(gpu_tasks);
        } else {
            // Each queue times its last sentinel once it sees the queue closed (not when stopping).
            last_sentinels(events, &mut result_rx, max_drift).await?;
            drop(gpu_tasks);
        }
        Ok(if interrupted {
            Ending::Interrupted(books.totals)
        } else {
            Ending::Finished(books.totals)
        })
    }

    /// One measurement queue per GPU of `devices`, each with its worker session: the jobs go in
    /// through the sender, the queues' cases, job ends and sentinels come out of the receiver; the
    /// last part starts one more queue on the same channels.
    fn start_gpu_queues(
        &self,
        devices: &[u32],
    ) -> (
        mpsc::UnboundedSender<Job>,
        GpuTasks,
        mpsc::UnboundedReceiver<GpuEvent>,
        QueueStarter,
    ) {
        let (job_tx, job_rx) = mpsc::unbounded_channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (result_tx, result_rx) = mpsc::unbounded_channel::<GpuEvent>();
        let policies = &self.project.policies;
        let loop_policy = Arc::new(LoopPolicy {
            measure: MeasureSpec {
                warmup_ms: policies.measure.warmup_ms,
                samples: policies.measure.samples,
                min_sample_us: policies.measure.min_sample_us,
                verified_replays: policies.measure.verified_replays,
            },
            timeout: Duration::from_secs(self.project.timeouts.worker_s),
            sentinel_every: Duration::from_secs(policies.sentinel.every_s),
            sentinel_reps: policies.sentinel.reps,
            retime_on: policies.gpu_state.retime_on.clone(),
        });
        let starter = QueueStarter {
            executor: self.executor.clone(),
            policy: loop_policy,
            jobs: job_rx,
            results: result_tx,
        };
        let mut gpu_tasks = GpuTasks(Vec::new());
        for &device in devices {
            starter.start(&mut gpu_tasks, device);
        }
        (job_tx, gpu_tasks, result_rx, starter)
    }

    /// A budget ran out: logged, with every case of the variants not started skipped for it.
    fn stop_for_budget(
        &self,
        events: &mut Events,
        reason: &str,
        planned: &[PlannedPoint],
        not_measured: Vec<String>,
    ) -> Result<()> {
        events.emit(Record::BudgetReached {
            reason: reason.to_owned(),
            variants_not_measured: not_measured.clone(),
        })?;
        for variant in &not_measured {
            for (shape, dtype) in self.case_names(planned, variant) {
                events.emit(Record::CaseSkipped {
                    variant: variant.clone(),
                    shape,
                    dtype,
                    reason: format!("not measured: {reason}"),
                    skipped_for: Some(crate::model::vocab::SkipReason::Budget),
                })?;
            }
        }
        Ok(())
    }

    /// Log a finished build: its cubin joins `cubins`, or its cases are skipped with the reason. A
    /// disk that filled up stops the run as the write error it is, recording nothing against the
    /// variant (the build is not its fault).
    fn take_build(
        &self,
        events: &mut Events,
        (key, result): BuildResult,
        cubins: &mut BTreeMap<UnitKey, PathBuf>,
    ) -> Result<()> {
        let (variant, dtype, head_dim) = key.clone();
        let result = match result {
            Err(BuildFailure::Disk(full)) => {
                return Err(crate::gpu::build::stopped_by_the_disk(
                    &format!("{variant} ({dtype}, d={head_dim})"),
                    full,
                    &format!(
                        "nothing is recorded against it; free space under {} and the run folder, then `flashtune resume` the run (nothing it logged is lost)",
                        self.project.paths.build_cache().display()
                    ),
                ))
            }
            result => result,
        };
        match record_build(self.project, events, key, result)? {
            Ok(cubin) => {
                cubins.insert((variant, dtype, head_dim), cubin);
            }
            Err(reason) if variant != REFERENCE => {
                self.skip_unit(events, &variant, dtype, head_dim, &reason)?;
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// The cases of a variant's job: those it has a kernel for and no result yet, each with the bar
    /// racing holds it to.
    fn cases_to_measure(
        &self,
        planned: &[PlannedPoint],
        cubins: &BTreeMap<UnitKey, PathBuf>,
        variant: &str,
        bests: &Bests,
    ) -> Vec<CaseSpec> {
        let race_samples = self.project.policies.measure.race_samples;
        let mut cases = cases_for(self.project, planned, cubins, variant, self.run_seed);
        cases.retain(|c| {
            let case = (variant.to_owned(), c.shape.name.clone(), c.dtype);
            !self.settled.contains(&case)
        });
        for case in &mut cases {
            case.race = bests.bar(case, race_samples);
        }
        cases
    }

    /// The climb over this run's variants: each one's parameters and unsettled cases, in one pass
    /// over the plan (a space can hold tens of thousands of points).
    fn climber(&self, planned: &[PlannedPoint]) -> climb::Climber {
        let mut by_variant = climb::Points::new();
        for p in planned.iter().filter(|p| p.invalid.is_none()) {
            let (_, cases) = by_variant
                .entry(p.variant.id.clone())
                .or_insert_with(|| (p.variant.params.clone(), BTreeSet::new()));
            for shape in self.project.shapes.iter().filter(|s| s.d == p.head_dim) {
                for &dtype in &self.project.policies.dtypes {
                    let key = (p.variant.id.clone(), shape.name.clone(), dtype);
                    if !self.settled.contains(&key) {
                        cases.insert((shape.name.clone(), dtype));
                    }
                }
            }
        }
        climb::Climber::new(by_variant)
    }

    /// The (shape, dtype) cases a planned variant has.
    fn case_names(&self, planned: &[PlannedPoint], variant: &str) -> Vec<(String, Dtype)> {
        let mut names = Vec::new();
        for shape in &self.project.shapes {
            let valid = planned
                .iter()
                .any(|p| p.variant.id == variant && p.head_dim == shape.d && p.invalid.is_none());
            if valid {
                for &dtype in &self.project.policies.dtypes {
                    let case = (variant.to_owned(), shape.name.clone(), dtype);
                    if !self.settled.contains(&case) {
                        names.push((shape.name.clone(), dtype));
                    }
                }
            }
        }
        names
    }

    /// Every case a failed or gated build leaves without a kernel.
    fn skip_unit(
        &self,
        events: &mut Events,
        variant: &str,
        dtype: Dtype,
        head_dim: u32,
        reason: &str,
    ) -> Result<()> {
        for shape in self.project.shapes.iter().filter(|s| s.d == head_dim) {
            events.emit(Record::CaseSkipped {
                variant: variant.to_owned(),
                shape: shape.name.clone(),
                dtype,
                reason: reason.to_owned(),
                skipped_for: Some(crate::model::vocab::SkipReason::Build),
            })?;
        }
        Ok(())
    }

    /// Why no more variants may start under `--max-variants`, if it is spent (the time limit is
    /// watched by the loop itself: it falls whether or not anything is ready).
    fn variants_reached(&self, dispatched: usize) -> Option<String> {
        let max = self.budget.max_variants?;
        (dispatched >= max).then(|| format!("--max-variants {max}"))
    }

    /// The time limit's grace ran out with variants still measuring: every case of theirs not
    /// answered yet is skipped for the budget, so each case still ends as one record.
    fn skip_cut_short(
        &self,
        events: &mut Events,
        planned: &[PlannedPoint],
        running: &BTreeSet<String>,
        books: &Books,
    ) -> Result<()> {
        let limit = self.budget.time_limit.unwrap_or_default().as_secs_f64();
        for variant in running {
            for (shape, dtype) in self.case_names(planned, variant) {
                if books.answered(variant, &shape, dtype) {
                    continue;
                }
                events.emit(Record::CaseSkipped {
                    variant: variant.clone(),
                    shape,
                    dtype,
                    reason: format!(
                        "not measured: still running {}s after --time-limit {limit}s, and ended",
                        Budget::GRACE.as_secs()
                    ),
                    skipped_for: Some(crate::model::vocab::SkipReason::Budget),
                })?;
            }
        }
        Ok(())
    }
}

/// What a GPU's queue is started with: the shared job queue and results channel.
struct QueueStarter {
    executor: Executor,
    policy: Arc<LoopPolicy>,
    jobs: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    results: mpsc::UnboundedSender<GpuEvent>,
}

impl QueueStarter {
    fn start(&self, tasks: &mut GpuTasks, device: u32) {
        tasks.0.push(tokio::spawn(gpu_loop(
            self.executor.clone(),
            device,
            self.policy.clone(),
            self.jobs.clone(),
            self.results.clone(),
        )));
    }
}

/// Queue a job again, after its pause.
fn requeue(job_tx: &mpsc::UnboundedSender<Job>, Retry { job, after }: Retry) {
    let tx = job_tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let _ = tx.send(job);
    });
}

/// The queues' last sentinels, logged as they come until every queue has ended (a second signal
/// stops waiting).
async fn last_sentinels(
    events: &mut Events,
    result_rx: &mut mpsc::UnboundedReceiver<GpuEvent>,
    max_drift: f64,
) -> Result<()> {
    let drain = async {
        while let Some(event) = result_rx.recv().await {
            if let GpuEvent::Sentinel {
                device,
                when,
                result,
            } = event
            {
                record_sentinel(events, device, when, result, max_drift)?;
            }
        }
        Ok::<(), Error>(())
    };
    tokio::select! {
        drained = drain => drained,
        _ = crate::os::stop::reached(2) => Ok(()),
    }
}

/// The variants of `order` neither finished nor running: what a budget keeps from starting.
fn not_started(
    order: &[String],
    finished: &BTreeSet<String>,
    running: &BTreeSet<String>,
) -> Vec<String> {
    order
        .iter()
        .filter(|v| !finished.contains(*v) && !running.contains(*v))
        .cloned()
        .collect()
}

/// Whether a stop is requested now or within a moment (the listener that counts a signal may run
/// just after the child the same signal ended was reaped).
async fn stopped_meanwhile() -> bool {
    if crate::os::stop::requested().is_some() {
        return true;
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    crate::os::stop::requested().is_some()
}

/// Sleep until `when`; never wakes when there is none (the branch is disabled then anyway).
async fn sleep_until(when: Option<Instant>) {
    match when {
        Some(when) => tokio::time::sleep_until(when.into()).await,
        None => std::future::pending().await,
    }
}

/// A `sentinel` record from a queue's report.
fn record_sentinel(
    events: &mut Events,
    device: u32,
    when: &str,
    result: SentinelResult,
    max_drift: f64,
) -> Result<()> {
    events.emit(Record::Sentinel {
        device,
        when: when.to_owned(),
        figures: result.figures,
        gpu: result.gpu_state,
        max_drift,
        error: result.error,
    })
}

/// Log a build (and its gate); the cubin when it may run, else why not.
fn record_build(
    project: &Project,
    events: &mut Events,
    (variant, dtype, head_dim): UnitKey,
    result: std::result::Result<BuildOutput, BuildFailure>,
) -> Result<std::result::Result<PathBuf, String>> {
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
                        reason: reason.clone(),
                    })?;
                    Ok(Err(format!("rejected by the gates: {reason}")))
                }
                None => Ok(Ok(out.cubin)),
            }
        }
        Err(failure) => {
            events.emit(Record::build_failed(&variant, dtype, head_dim, &failure))?;
            Ok(Err(format!("build failed: {failure}")))
        }
    }
}

fn cases_for(
    project: &Project,
    planned: &[PlannedPoint],
    cubins: &BTreeMap<UnitKey, PathBuf>,
    variant_id: &str,
    run_seed: u64,
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
                seed: input_seed(run_seed, shape, dtype),
                tolerance: project.policies.tolerance_for(dtype),
                cpu_oracle_max_macs: policy.cpu_reference_max_macs,
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
                race: None,
            });
        }
    }
    cases
}
