//! The stages of a run once its GPUs are taken: the reference library timed while the plan builds, the points measured, the champions re-duelled and profiled, the log ended and the reports written.
use super::TuneOutcome;
use crate::error::{Error, Result};
use crate::log::runlog::Record;
use crate::model::plan::Strategy;
use crate::model::protocol::DeviceInfo;
use crate::model::space::DeviceLimits;
use crate::model::vocab::Stage;
use crate::run::measure::measure_points;
use crate::run::scheduler::Ending;
use crate::run::shared::{Events, Project, TuneOptions};
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Run a stage unless a stop is requested first; a stop requested while it runs abandons it (its
/// future is dropped, and with it the process group of any tool it started).
async fn unless_stopped<T>(
    stage: impl std::future::Future<Output = Result<T>>,
) -> Result<Option<T>> {
    if crate::os::stop::requested().is_some() {
        return Ok(None);
    }
    tokio::select! {
        done = stage => done.map(Some),
        _ = crate::os::stop::reached(1) => Ok(None),
    }
}

/// Run a stage that measures, abandoned on a signal, never started after the time limit and ended
/// at its grace. True when the time limit kept it from running to its end; its answer when it ran
/// to its end.
async fn measuring_stage<T>(
    budget: &crate::run::budget::Budget,
    stage: impl std::future::Future<Output = Result<T>>,
) -> Result<(bool, Option<T>)> {
    let ran = unless_stopped(crate::run::budget::within_time_limit(budget, stage)).await?;
    Ok((matches!(ran, Some(None)), ran.flatten()))
}

/// Choose points by the run's strategy, measure them, then profile and time the reference library; ends the log and writes the report.
pub(super) async fn drive(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
    done: &BTreeSet<String>,
    run_dir: PathBuf,
) -> Result<TuneOutcome> {
    let started = Instant::now();
    let limits = DeviceLimits {
        max_threads_per_block: device.max_threads_per_block,
        max_smem_optin_bytes: device.max_smem_optin_bytes,
        arch: device.arch.clone(),
    };
    let head_dims = project.head_dims();
    // Guided chooses as it measures; the other strategies fix their points up front.
    let planned = match &opts.strategy {
        Strategy::Guided => None,
        Strategy::Exhaustive => Some(project.space.plan(&head_dims, &limits)?),
        Strategy::Random { count, seed } => Some(crate::run::search::random_sample(
            &project.space.plan(&head_dims, &limits)?,
            *count,
            *seed,
        )),
        Strategy::Ablate { champion, .. } => {
            let variants = crate::run::ablate::variants(&project.space, champion);
            Some(project.space.plan_points(&variants, &head_dims, &limits)?)
        }
    };
    // The reference library holds the run's first GPU beside the case queues (one GPU, one job)
    // while nvcc builds the plan on every core; on one GPU the cases start when it ends.
    let gpus = opts.gpus(device);
    let first_gpu = gpus[0];
    let began = events.stage_start();
    let held = super::baselines::reference_job(project, device, opts, events).await?;
    if held.is_none() {
        // What the store gave (or why nothing is timed), at once.
        events.stage_ran(Stage::Reference, first_gpu, began)?;
    }
    let mut cut_by_time = false;
    let ending = match planned {
        Some(planned) => {
            let no_reasons = BTreeMap::new();
            measure_points(
                project,
                device,
                opts,
                events,
                done,
                &planned,
                &no_reasons,
                &opts.budget,
                held,
            )
            .await?
        }
        None => {
            let search = crate::run::search::Guided {
                project,
                device,
                opts,
                done,
                run_dir: &run_dir,
            };
            search.run(events, &limits, held).await?
        }
    };
    let mut interrupted = matches!(ending, Ending::Interrupted(_));
    if let Ending::Finished(t) = ending {
        // Each stage after the measurements is abandoned on a signal, as the one in flight.
        let began = events.stage_start();
        let reduel = crate::run::duel::reduel_champions(project, device, opts, events);
        let (cut, duelled_on) = measuring_stage(&opts.budget, reduel).await?;
        cut_by_time |= cut;
        log_spans(events, Stage::Duels, duelled_on, first_gpu, began)?;
        let began = events.stage_start();
        let profiles = profile_stage(project, device, &gpus, events, &run_dir);
        let (cut, profiled_on) = measuring_stage(&opts.budget, profiles).await?;
        cut_by_time |= cut;
        log_spans(events, Stage::Profiles, profiled_on, first_gpu, began)?;
        interrupted = crate::os::stop::requested().is_some();
        // The scheduler logs the limit when it falls while variants measure; a stage it kept from
        // starting or ended is the limit's doing too, and the log says so.
        if cut_by_time && t.budget_stop.is_none() && !interrupted {
            events.emit(Record::BudgetReached {
                reason: opts.budget.time_limit_reason().unwrap_or_default(),
                variants_not_measured: Vec::new(),
            })?;
        }
        if !interrupted {
            events.emit(Record::Finished {
                seconds: started.elapsed().as_secs_f64(),
                variants: t.variants,
                measured_cases: t.measured,
                failed_cases: t.failed,
            })?;
        }
    }
    if interrupted {
        events.emit(Record::Interrupted {
            reason: crate::os::stop::reason(),
        })?;
    }
    if opts.commit && !interrupted {
        let loaded = events.records();
        let champions = crate::report::champions::from_log(loaded);
        let path = project.champion_table();
        let (branch, commit) =
            crate::report::champions::commit(&project.paths.root, &path, &loaded, &champions)
                .map_err(|e| {
                    Error::Other(anyhow::anyhow!("cannot commit champions: {}", e.message()))
                })?;
        events.emit(Record::ChampionsCommitted {
            branch,
            commit,
            path,
        })?;
    }
    let loaded = events.records();
    let summary = crate::report::export::write_all(&run_dir, loaded)
        .with_context(|| format!("cannot write the reports in {}", run_dir.display()))?
        .summary;
    Ok(TuneOutcome {
        run_dir,
        summary,
        interrupted,
    })
}

/// A stage's span on each GPU it held (they worked side by side: one span each), or on the first
/// GPU where it ended before saying which it held.
fn log_spans(
    events: &mut Events,
    stage: Stage,
    held: Option<Vec<u32>>,
    first_gpu: u32,
    began: (f64, usize),
) -> Result<()> {
    for gpu in held
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| vec![first_gpu])
    {
        events.stage_ran(stage, gpu, began)?;
    }
    Ok(())
}

/// Profile each shape's champion (and variants within `within_pct` of it; every step of a chain
/// with `chain_steps`) under ncu, spread over the run's GPUs: one ncu per GPU at a time (ncu
/// serialises the GPU it profiles, and only that one), each profile logged as it ends; cases
/// already profiled in this run are not redone. Returns the GPUs that ran a profile, for the
/// timeline.
async fn profile_stage(
    project: &Project,
    device: &DeviceInfo,
    gpus: &[u32],
    events: &mut Events,
    run_dir: &Path,
) -> Result<Vec<u32>> {
    let policy = &project.policies.profile;
    if !policy.enabled || (device.fake && !policy.on_fake_gpu) {
        return Ok(Vec::new());
    }
    // A snapshot: the profiles of this stage are logged while it is read.
    let log = events.records().clone();
    // The champion by the read model's rule; a reused champion is still the champion: it is not
    // profiled again here (this run did not build it), and no slower variant is profiled in its place.
    let index = crate::log::runindex::RunIndex::new(&log);
    // An ablation explains each step only if each step has its own profile.
    let every_step = policy.chain_steps && project.space.chain.is_some();
    let mut jobs: Vec<(
        &str,
        &crate::model::config::Shape,
        crate::model::config::Dtype,
    )> = Vec::new();
    for shape in &project.shapes {
        for &dtype in policy
            .dtypes
            .iter()
            .filter(|d| project.policies.dtypes.contains(d))
        {
            let Some(pick) = index.pick(&shape.name, dtype) else {
                continue;
            };
            let best = pick.best.measured().map_or(f64::INFINITY, |t| t.median_us);
            // The champion first, then the others within `within_pct` of it (or every step).
            jobs.push((pick.best.variant, shape, dtype));
            jobs.extend(
                index
                    .ranked(&shape.name, dtype)
                    .into_iter()
                    .filter(|c| c.variant != pick.best.variant)
                    .filter(|c| {
                        every_step
                            || c.measured().is_some_and(|t| {
                                t.median_us <= best * (1.0 + policy.within_pct / 100.0)
                            })
                    })
                    .map(|c| (c.variant, shape, dtype)),
            );
        }
    }
    // Only what is still to profile takes a GPU; the rest is logged already. One scan of the log
    // per case, here.
    let jobs: Vec<_> = jobs
        .into_iter()
        .filter_map(|(variant, shape, dtype)| {
            crate::run::shared::logged_case(project, &log, variant, shape, dtype)
                .filter(|c| c.profile.is_none())
                .map(|case| (variant, shape, dtype, case))
        })
        .collect();
    let devices: Vec<DeviceInfo> = gpus
        .iter()
        .map(|&ordinal| DeviceInfo {
            ordinal,
            ..device.clone()
        })
        .collect();
    // Each GPU takes the next case as soon as its last profile ends; the profiles are logged in
    // the order they end.
    let queue = std::sync::Mutex::new(jobs.into_iter());
    let (ended, mut profiled) = tokio::sync::mpsc::unbounded_channel();
    let profilers = futures_util::future::join_all(devices.iter().map(|gpu| {
        let (queue, ended) = (&queue, ended.clone());
        async move {
            loop {
                let next = queue.lock().expect("not poisoned").next();
                let Some((variant, shape, dtype, case)) = next else {
                    break;
                };
                let outcome = crate::run::shared::profile_now(
                    project,
                    gpu,
                    run_dir,
                    variant,
                    shape,
                    dtype,
                    &case.params,
                    case.spec,
                    case.resolved_splits,
                )
                .await;
                // The log stopped taking them (a write failed): start no more.
                if ended
                    .send((variant, shape, dtype, gpu.ordinal, outcome))
                    .is_err()
                {
                    break;
                }
                // The other GPUs' turn: a profile that never waits (the double's) would otherwise
                // take every job before they start.
                tokio::task::yield_now().await;
            }
        }
    }));
    drop(ended);
    let log_them = async {
        let mut used = Vec::new();
        while let Some((variant, shape, dtype, gpu, outcome)) = profiled.recv().await {
            if !used.contains(&gpu) {
                used.push(gpu);
            }
            events.emit(Record::Profiled {
                variant: variant.to_owned(),
                shape: shape.name.clone(),
                dtype,
                profile: outcome?,
                sources: None,
            })?;
        }
        Ok::<_, crate::error::Error>(used)
    };
    let (_, used) = tokio::join!(profilers, log_them);
    let used = used?;
    Ok(used)
}
