//! The commands that run a tuning session end to end (`tune`, `resume`, `build`, `ablate`, `profile`): probe and lock the GPUs, choose points by the run's strategy, measure them, profile the champions, time the reference library, write the reports. Every step becomes a run-log record first, then reaches the reporters.
use crate::error::{Error, Result};
use crate::gpu::build::{self, BuildOutput};
use crate::gpu::executor::Executor;
use crate::log::runlog::{self, Header, Record, RunLog};
use crate::model::config::{Dtype, ProjectPaths};
use crate::model::plan::Strategy;
use crate::model::protocol::*;
use crate::model::space::{DeviceLimits, PlannedPoint};
use crate::run::measure::measure_points;
use crate::run::scheduler::Ending;
use crate::run::shared::{
    disk_room, fresh_run_seed, header, input_seed, lock_gpus, measure_roofs, new_run_id,
    profile_case, Events, Project, Reporter, RunState, TuneOptions, UnitKey,
};
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub struct TuneOutcome {
    pub run_dir: PathBuf,
    /// The short form of the report, for the terminal.
    pub summary: String,
    pub interrupted: bool,
}

pub async fn tune(opts: TuneOptions, reporters: Vec<Box<dyn Reporter>>) -> Result<TuneOutcome> {
    listen_for_stop()?;
    refuse_fake_commit(&opts)?;
    crate::run::anytime::refuse_reuse(opts.reuse, &opts.strategy)?;
    let project = Project::load(opts.paths.clone(), opts.space.as_deref())?;
    check_free_space(&project)?;
    if opts.commit {
        refuse_dirty_table(&project)?;
    }
    let (device, _locks, opts) = take_gpus(opts, &project).await?;
    let run_id = new_run_id();
    let run_dir = project.paths.runs().join(&run_id);
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("cannot create {}", run_dir.display()))?;
    let log = RunLog::create(&run_dir.join("log.jsonl"))?;
    let mut events = Events::new(log, reporters);
    let seed = fresh_run_seed(project.policies.measure.seed, &run_id);
    let mut head = header(&project, &device, &run_id, &opts.strategy);
    head.run_seed = Some(seed);
    events.emit_header_then_store(Record::Header(Box::new(head)), &project.paths)?;
    let first = opts.devices.first().copied().unwrap_or(0);
    let roofs = measure_roofs(&project, first, &opts.executor, &mut events, None).await?;
    let opts = TuneOptions {
        run: RunState { seed, roofs },
        ..opts
    };
    drive(
        &project,
        &device,
        &opts,
        &mut events,
        &BTreeSet::new(),
        run_dir,
    )
    .await
}

/// Continue a run from its log: finished variants are skipped, builds come from the cache.
pub async fn resume(
    opts: TuneOptions,
    run_dir: PathBuf,
    force: bool,
    reporters: Vec<Box<dyn Reporter>>,
) -> Result<TuneOutcome> {
    listen_for_stop()?;
    refuse_fake_commit(&opts)?;
    let log_path = run_dir.join("log.jsonl");
    let (loaded, old) = read_sealed_run(&run_dir)?;
    crate::run::anytime::refuse_reuse(opts.reuse, &old.strategy)?;
    let project = Project::load(opts.paths.clone(), Some(&old.space_path))?;
    check_free_space(&project)?;
    if opts.commit {
        refuse_dirty_table(&project)?;
    }
    let (device, _locks, opts) = take_gpus(opts, &project).await?;
    let opts = TuneOptions {
        strategy: old.strategy.clone(),
        ..opts
    };
    if loaded.torn_tail {
        // Said, not silent: the record being written when the run stopped is dropped (its case runs again).
        eprintln!(
            "resume: the last line of {} was cut short or never sealed (the record being written when the run stopped); it is dropped and what it recorded is done again",
            log_path.display()
        );
    }
    let fresh = header(&project, &device, &old.run_id, &old.strategy);
    let mismatches = header_mismatches(&old, &fresh);
    if !mismatches.is_empty() && !force {
        return Err(Error::BadInput(format!(
            "cannot resume {}: the run's conditions changed, so old and new figures would not be comparable:\n  - {}\nStart a new run, or pass --force to resume anyway (the override is logged).",
            run_dir.display(),
            mismatches.join("\n  - ")
        )));
    }
    let done: BTreeSet<String> = loaded
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::VariantDone { variant, .. } => Some(variant.clone()),
            _ => None,
        })
        .collect();
    let after_line = loaded.entries.last().map_or(0, |(l, _)| *l);
    let log = RunLog::reopen(&log_path, &loaded)?;
    let mut events = Events::new(log, reporters);
    events.record_into_store(&project.paths, Some(&loaded));
    events.emit(Record::Resumed {
        after_line,
        finished_variants: done.len(),
        overridden: mismatches,
    })?;
    // Logs from before run seeds keep their old inputs' seed; nothing after depends on which.
    let seed = old.run_seed.unwrap_or_else(|| {
        input_seed(
            project.policies.measure.seed,
            &project.shapes[0],
            Dtype::F16,
        )
    });
    let first = opts.devices.first().copied().unwrap_or(0);
    let roofs = measure_roofs(&project, first, &opts.executor, &mut events, Some(&loaded)).await?;
    let opts = TuneOptions {
        run: RunState { seed, roofs },
        ..opts
    };
    drive(&project, &device, &opts, &mut events, &done, run_dir).await
}

/// From here on SIGINT, SIGTERM and SIGHUP end the run in order (see `stop`).
fn listen_for_stop() -> Result<()> {
    crate::os::stop::listen()
        .map_err(|e| Error::Other(anyhow::anyhow!("cannot listen for signals: {e}")))
}

/// A run that starts on a nearly full disk stops mid-night: refuse it before it starts.
fn check_free_space(project: &Project) -> Result<()> {
    let floor = project.policies.disk.min_free_gib;
    for (what, dir, free) in disk_room(&project.paths) {
        match free {
            Some(free) if free < floor => {
                return Err(Error::DiskFull(format!(
                    "only {free:.2} GiB free under {} ({what}); policies.toml [disk] min_free_gib asks for {floor} GiB before a run starts. \
                     Free space there (or move the build cache with FLASHTUNE_CACHE_DIR), or lower the floor.",
                    dir.display()
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

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

/// The fake GPU's figures are synthetic: they must never reach the champion table.
fn refuse_fake_commit(opts: &TuneOptions) -> Result<()> {
    if opts.commit && opts.executor.is_fake() {
        return Err(Error::BadInput(
            "--commit with --fake-gpu: the fake GPU's figures are synthetic and are never committed to the champion table; \
             drop --commit, or run on a GPU"
                .into(),
        ));
    }
    Ok(())
}

/// A run folder as the user names it: a path (as given, or under the project root), or the bare
/// run id `tune` prints, looked up under the project's `runs/`.
pub fn resolve_run_dir(paths: &ProjectPaths, given: &Path) -> Result<PathBuf> {
    let mut candidates = vec![given.to_path_buf()];
    if given.is_relative() {
        candidates.push(paths.root.join(given));
    }
    let bare_id = given.components().count() == 1;
    if bare_id {
        candidates.push(paths.runs().join(given));
    }
    candidates.dedup();
    if let Some(found) = candidates.iter().find(|c| runlog::path_in(c).is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates
        .iter()
        .map(|c| c.join("log.jsonl").display().to_string())
        .collect();
    Err(Error::BadInput(format!(
        "no run `{}`: looked for {}. Give a run folder or the run id `tune` printed (e.g. 20261122-031500-ab12)",
        given.display(),
        looked.join(", ")
    )))
}

/// A run's log and its header: a log that is empty, has no header, or was written by a newer
/// flashtune is refused (exit 2) before anything reads, resumes or rewrites it.
pub fn read_run(run_dir: &Path) -> Result<(runlog::LoadedLog, Header)> {
    let log_path = runlog::path_in(run_dir);
    let loaded = runlog::read(&log_path).map_err(|e| Error::BadInput(format!("{e:#}")))?;
    let header = loaded.header().cloned().ok_or_else(|| {
        let what = if loaded.entries.is_empty() && loaded.torn_tail {
            "holds only a header cut mid-line (the run was killed while writing its first record)"
        } else if loaded.entries.is_empty() {
            "is empty"
        } else {
            "has no header record"
        };
        Error::BadInput(format!(
            "{} {what}: not a flashtune run log (a run writes its header first), so there is nothing to rebuild or continue",
            log_path.display()
        ))
    })?;
    Ok((loaded, header))
}

/// A run's log for `resume`, which goes on from what the log says was done and so reads only a
/// sealed log: a `variant_done` written by another hand would skip work, a `timed` one crown a
/// figure never measured. Refusals of empty, headerless or newer logs come first, as for any reader.
fn read_sealed_run(run_dir: &Path) -> Result<(runlog::SealedLog, Header)> {
    let (_, header) = read_run(run_dir)?;
    let log = runlog::read_sealed(&runlog::path_in(run_dir)).map_err(|e| {
        Error::BadInput(format!(
            "cannot resume: {e:#}. resume continues only a log whose every line flashtune sealed; start a new run (`flashtune report` still reads this one)"
        ))
    })?;
    Ok((log, header))
}

/// flashtune commits the champion table itself; uncommitted edits to it would be lost or mixed in.
fn refuse_dirty_table(project: &Project) -> Result<()> {
    let table = project.champion_table();
    match crate::os::vcs::dirty_among(&project.paths.root, &[&table]) {
        Ok(dirty) if !dirty.is_empty() => Err(Error::BadInput(format!(
            "uncommitted changes to {} — flashtune commits that file itself; commit or revert them first",
            dirty.join(", ")
        ))),
        Ok(_) => Ok(()),
        Err(e) => Err(Error::BadInput(format!("--commit needs a git repository at {}: {}", project.paths.root.display(), e.message()))),
    }
}

/// What makes two logs' figures incomparable.
pub fn header_mismatches(old: &Header, new: &Header) -> Vec<String> {
    let mut m = Vec::new();
    let mut check = |what: &str, a: &str, b: &str| {
        if a != b {
            m.push(format!("{what}: was `{a}`, now `{b}`"));
        }
    };
    check("GPU", &old.device.name, &new.device.name);
    check("nvcc", &old.toolchain.version, &new.toolchain.version);
    check(
        "kernel sources",
        &old.kernel_sources_hash,
        &new.kernel_sources_hash,
    );
    check("policies.toml", &old.policies_hash, &new.policies_hash);
    check("variant space", &old.space_hash, &new.space_hash);
    check(
        "schema",
        &old.schema_version.to_string(),
        &new.schema_version.to_string(),
    );
    m
}

/// Probe the chosen GPUs (all visible ones when none is chosen); they must all be one model. Under
/// Slurm one step is probed, and the queues are the workers `--tasks` asks for (each step's GPU is
/// checked against this one's model when its session opens).
async fn probe(executor: &Executor, chosen: &[u32]) -> Result<(DeviceInfo, Vec<u32>)> {
    if let Some(tasks) = executor.queues() {
        if !chosen.is_empty() {
            return Err(Error::BadInput(
                "--gpus picks GPUs of this host; with --executor slurm the cluster places each worker: set how many with --tasks"
                    .into(),
            ));
        }
        let info = executor.probe(0).await.map_err(refused)?;
        return Ok((info, (0..tasks).collect()));
    }
    let mut devices = chosen.to_vec();
    let mut first: Option<DeviceInfo> = None;
    if devices.is_empty() {
        let info = executor.probe(0).await.map_err(refused)?;
        devices = (0..info.visible_devices.max(1)).collect();
        first = Some(info);
    }
    for &d in &devices {
        if first.as_ref().is_some_and(|f| f.ordinal == d) {
            continue;
        }
        let info = executor.probe(d).await.map_err(refused)?;
        match &first {
            None => first = Some(info),
            Some(f) if f.name != info.name => {
                return Err(Error::BadInput(format!(
                    "GPUs {} ({}) and {d} ({}) differ; one run times one kind of GPU",
                    f.ordinal, f.name, info.name
                )));
            }
            Some(_) => {}
        }
    }
    let first = first.ok_or_else(|| Error::BadInput("no GPU selected".into()))?;
    Ok((first, devices))
}

/// The run's GPUs: probed, reachable (Slurm steps see this host's files), locked; from now on every
/// worker session must serve their model.
async fn take_gpus(
    opts: TuneOptions,
    project: &Project,
) -> Result<(DeviceInfo, Vec<std::fs::File>, TuneOptions)> {
    let (device, devices) = probe(&opts.executor, &opts.devices).await?;
    check_reach(&opts.executor, project).await?;
    let locks = lock_gpus(&devices, !opts.executor.local_gpus(), opts.when_busy)?;
    let executor = opts.executor.clone().expecting(&device.name);
    let opts = TuneOptions {
        devices,
        executor,
        ..opts
    };
    Ok((device, locks, opts))
}

/// Workers elsewhere must see the cubins built here: refuse a run whose Slurm steps do not.
async fn check_reach(executor: &Executor, project: &Project) -> Result<()> {
    executor
        .check_reach(&project.paths.build_cache())
        .await
        .map_err(|why| Error::BadInput(format!("--executor slurm: {why}")))
}

/// Why a probe failed: no GPU, or a GPU whose own output comparison cannot be trusted.
fn refused(reason: String) -> Error {
    if reason.contains(crate::gpu::trial::COMPARISON_DISAGREES) {
        return Error::Other(anyhow::anyhow!(
            "{reason}\nNo verdict from this GPU can be trusted, so the run does not start: the worker's \
             comparison kernel (ft_compare, built into the flashtune binary) must agree with the host's \
             figure for figure. Rebuild flashtune from a clean checkout; if it persists, report it with \
             the output of `flashtune doctor`."
        ));
    }
    no_gpu(reason)
}

fn no_gpu(reason: String) -> Error {
    Error::NoGpu(format!("{reason}\n{}", crate::error::NO_GPU_NEXT_STEPS))
}

/// Choose points by the run's strategy, measure them, then profile and time the reference library; ends the log and writes the report.
async fn drive(
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
    // The GPU's first job is the reference library (and its roofs), while nvcc builds the plan's
    // kernels into the cache on every core: the measurement then starts on built kernels.
    unless_stopped(baseline_while_building(
        project,
        device,
        events,
        planned.as_deref(),
        done,
    ))
    .await?;
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
            search.run(events, &limits).await?
        }
    };
    let mut interrupted = matches!(ending, Ending::Interrupted(_));
    if let Ending::Finished(t) = ending {
        // Each stage after the measurements is abandoned on a signal, as the one in flight.
        unless_stopped(crate::run::duel::reduel_champions(
            project, device, opts, events,
        ))
        .await?;
        unless_stopped(profile_stage(project, device, events, &run_dir)).await?;
        interrupted = crate::os::stop::requested().is_some();
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
        let loaded = runlog::read(&run_dir.join("log.jsonl"))?;
        let champions = crate::report::champions::from_log(&loaded);
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
    let loaded = runlog::read(&run_dir.join("log.jsonl"))?;
    crate::report::export::write_all(&run_dir, &loaded)
        .with_context(|| format!("cannot write the reports in {}", run_dir.display()))?;
    let summary = crate::report::markdown::summary(&loaded);
    Ok(TuneOutcome {
        run_dir,
        summary,
        interrupted,
    })
}

/// Profile each shape's champion (and variants within `within_pct` of it; every step of a chain with `chain_steps`) under ncu, one at a time; cases already profiled in this run are not redone.
async fn profile_stage(
    project: &Project,
    device: &DeviceInfo,
    events: &mut Events,
    run_dir: &Path,
) -> Result<()> {
    let policy = &project.policies.profile;
    if !policy.enabled || device.fake {
        return Ok(());
    }
    let log = runlog::read(&events.log.path)?;
    let mut timed: BTreeMap<(String, Dtype), Vec<(String, f64)>> = BTreeMap::new();
    for t in log.timed() {
        timed
            .entry((t.shape.to_owned(), t.dtype))
            .or_default()
            .push((t.variant.to_owned(), t.timing.median_us));
    }
    // A reused champion is still the champion: it is not profiled again here (this run did not
    // build it), and no slower variant is profiled in its place.
    for (_, e) in &log.entries {
        if let Record::Reused {
            variant,
            shape,
            dtype,
            timing,
            ..
        } = &e.record
        {
            timed
                .entry((shape.clone(), *dtype))
                .or_default()
                .push((variant.clone(), timing.median_us));
        }
    }
    // An ablation explains each step only if each step has its own profile.
    let every_step = policy.chain_steps && project.space.chain.is_some();
    for shape in &project.shapes {
        for &dtype in policy
            .dtypes
            .iter()
            .filter(|d| project.policies.dtypes.contains(d))
        {
            let Some(results) = timed.get(&(shape.name.clone(), dtype)) else {
                continue;
            };
            let best = results.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
            // A variant timed twice (a resumed run) is profiled once.
            let chosen: BTreeSet<&String> = results
                .iter()
                .filter(|r| every_step || r.1 <= best * (1.0 + policy.within_pct / 100.0))
                .map(|r| &r.0)
                .collect();
            for variant in chosen {
                profile_case(
                    project, device, events, &log, run_dir, variant, shape, dtype,
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Time the reference library before the variants (never beside them: one GPU, one job), while the
/// planned kernels build into the cache on the CPU; builds still running when it ends are dropped
/// and the scheduler builds them as usual. A resumed run that has its baseline skips it.
async fn baseline_while_building(
    project: &Project,
    device: &DeviceInfo,
    events: &mut Events,
    planned: Option<&[PlannedPoint]>,
    done: &BTreeSet<String>,
) -> Result<()> {
    let log = runlog::read(&events.log.path)?;
    let measured = log.entries.iter().any(|(_, e)| {
        matches!(
            e.record,
            Record::BaselineTimed { .. } | Record::BaselineUnavailable { .. }
        )
    });
    if measured {
        return Ok(());
    }
    let prebuild = planned.filter(|_| !device.fake).map(|p| {
        crate::run::scheduler::spawn_builds(project, project.build_specs(p, &device.arch, done))
    });
    let result = baseline_stage(project, device, events).await;
    // Dropping the set aborts the builds still running; the finished ones are in the cache, and
    // their first request reports the compile they were (the run statistics count nvcc's time).
    if let Some((tasks, mut results)) = prebuild {
        drop(tasks);
        let mut ahead = project.compiled_ahead.lock().expect("not poisoned");
        while let Ok((_, built)) = results.try_recv() {
            match built {
                Ok(out) if !out.cached => {
                    ahead.insert(out.key, out.seconds);
                }
                _ => {}
            }
        }
    }
    result
}

/// Time the reference library on every shape of the run.
async fn baseline_stage(project: &Project, device: &DeviceInfo, events: &mut Events) -> Result<()> {
    let unavailable = |reason: String| Record::BaselineUnavailable {
        backend: None,
        shape: None,
        dtype: None,
        reason,
    };
    if device.fake {
        return events.emit(unavailable(
            "fake GPU: the reference library is not run".into(),
        ));
    }
    if project.policies.baseline.command.is_empty() {
        return events.emit(unavailable(
            "baseline.command is empty in policies.toml".into(),
        ));
    }
    // PyTorch's calls rotate over enough distinct input sets to fill twice the L2 cache, so it is
    // not timed on inputs sitting in L2 (the variants' inputs are drawn anew and L2 flushed
    // before each replay).
    let sets: BTreeMap<String, u32> = project
        .shapes
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                crate::gpu::baseline::rotating_sets(s, device.l2_bytes),
            )
        })
        .collect();
    let measured = crate::gpu::baseline::measure_rotating(
        &project.paths.root,
        &project.policies,
        &project.shapes,
        &sets,
    );
    match measured.await {
        Err(reason) => events.emit(unavailable(reason)),
        Ok((rows, ceilings)) => {
            for row in rows {
                let (backend, shape, dtype) = (row.backend, row.shape, row.dtype);
                events.emit(match row.outcome {
                    Ok(timing) => Record::BaselineTimed {
                        backend,
                        shape,
                        dtype,
                        timing,
                        remeasured: row.remeasured,
                        noisy: row.noisy,
                    },
                    Err(reason) => Record::BaselineUnavailable {
                        backend: Some(backend),
                        shape: Some(shape),
                        dtype: Some(dtype),
                        reason,
                    },
                })?;
            }
            for c in ceilings {
                events.emit(Record::CeilingMeasured {
                    name: c.name,
                    dtype: c.dtype,
                    value: c.value,
                    unit: c.unit,
                    source: Some("pytorch".into()),
                })?;
            }
            Ok(())
        }
    }
}

/// One row of `flashtune build`'s table.
pub struct BuiltRow {
    pub variant: String,
    pub dtype: Dtype,
    pub head_dim: u32,
    pub outcome: std::result::Result<BuildOutput, String>,
    pub gate: Option<String>,
}

/// What `arch` allows a block, from policies.toml's `[build.targets]` (no GPU to ask).
pub fn offline_limits(project: &Project, arch: &str) -> Result<DeviceLimits> {
    let target = project.policies.target_limits(arch).map_err(|e| {
        crate::model::config::config_error_at_key(
            &project.paths.policies(),
            &project.policies_text,
            "build.targets",
            e.to_string(),
        )
    })?;
    Ok(DeviceLimits {
        max_threads_per_block: target.max_threads_per_block,
        max_smem_optin_bytes: target.max_smem_optin_bytes,
        arch: arch.to_owned(),
    })
}

/// Compile and gate every valid point without a GPU, for `arch` (default: policies.toml's `default_arch`) and its limits.
pub async fn build_space(
    project: &Project,
    arch: Option<&str>,
    covering: bool,
) -> Result<(Vec<PlannedPoint>, Vec<BuiltRow>)> {
    let arch = arch
        .unwrap_or(&project.policies.build.default_arch)
        .to_owned();
    let limits = offline_limits(project, &arch)?;
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    let to_build = if covering {
        crate::model::plan::covering_sample(&planned)
    } else {
        planned.clone()
    };
    let specs = project.build_specs(&to_build, &arch, &BTreeSet::new());
    let order: Vec<UnitKey> = specs.iter().map(|(k, _)| k.clone()).collect();
    let mut done: BTreeMap<UnitKey, BuiltRow> = BTreeMap::new();
    let (_tasks, mut results) = crate::run::scheduler::spawn_builds(project, specs);
    while let Some(((variant, dtype, head_dim), result)) = results.recv().await {
        let gate = result.as_ref().ok().and_then(|o| project.gate(o));
        let outcome = result.map_err(|f| format!("{f}\n{}", build::log_tail(f.log(), 30)));
        done.insert(
            (variant.clone(), dtype, head_dim),
            BuiltRow {
                variant,
                dtype,
                head_dim,
                outcome,
                gate,
            },
        );
    }
    let rows = order.into_iter().filter_map(|k| done.remove(&k)).collect();
    Ok((planned, rows))
}

/// The spec keys (`build::spec_key`) of every build the whole plan of the project's space needs
/// for `arch`, sorted: what the full build gate certifies in its manifest.
pub fn gate_spec_keys(project: &Project, arch: Option<&str>) -> Result<Vec<String>> {
    let arch = arch
        .unwrap_or(&project.policies.build.default_arch)
        .to_owned();
    let limits = offline_limits(project, &arch)?;
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    let mut keys = project
        .build_specs(&planned, &arch, &BTreeSet::new())
        .iter()
        .map(|(_, spec)| build::spec_key(spec))
        .collect::<Result<Vec<_>>>()?;
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// `flashtune ablate`: a new run over the parent run's space, measuring its champion and each one-factor reset.
pub async fn ablate(
    opts: TuneOptions,
    parent_dir: &Path,
    variant: Option<&str>,
    reporters: Vec<Box<dyn Reporter>>,
) -> Result<TuneOutcome> {
    refuse_fake_commit(&opts)?;
    let log_path = parent_dir.join("log.jsonl");
    let (log, header) = read_run(parent_dir)?;
    let (id, champion) = crate::run::ablate::choose_champion(&log, variant)
        .map_err(|e| Error::BadInput(format!("{}: {e}", log_path.display())))?;
    eprintln!("ablating around `{id}` from run {}", header.run_id);
    let opts = TuneOptions {
        space: Some(header.space_path.clone()),
        strategy: Strategy::Ablate {
            parent_run: header.run_id.clone(),
            champion,
        },
        ..opts
    };
    tune(opts, reporters).await
}

/// `flashtune profile`: profile one variant of a finished run on demand; the outcomes join that run's log.
pub async fn profile_on_demand(
    opts: TuneOptions,
    run_dir: &Path,
    variant: &str,
    shapes: &[String],
    dtypes: &[Dtype],
) -> Result<Vec<(String, Dtype, Option<crate::gpu::profile::ProfileOutcome>)>> {
    let log_path = run_dir.join("log.jsonl");
    let (loaded, header) = read_run(run_dir)?;
    let project = Project::load(opts.paths.clone(), Some(&header.space_path))?;
    let (device, devices) = probe(&opts.executor, &opts.devices).await?;
    let _locks = lock_gpus(&devices[..1], !opts.executor.local_gpus(), opts.when_busy)?;
    if device.name != header.device.name {
        return Err(Error::BadInput(format!(
            "run {} was timed on {}, this GPU is {}: profile it where it ran",
            header.run_id, header.device.name, device.name
        )));
    }
    for s in shapes {
        if !project.shapes.iter().any(|p| &p.name == s) {
            return Err(Error::BadInput(format!(
                "run {} has no shape `{s}`",
                header.run_id
            )));
        }
    }
    let dtypes: Vec<Dtype> = if dtypes.is_empty() {
        project.policies.profile.dtypes.clone()
    } else {
        dtypes.to_vec()
    };
    for &dtype in &dtypes {
        project.policies.tolerance(dtype)?;
    }
    let mut events = Events::new(RunLog::reopen(&log_path, &loaded)?, Vec::new());
    // Its measurements reach the store only from a sealed log.
    let sealed = runlog::read_sealed(&log_path).ok();
    events.record_into_store(&project.paths, sealed.as_ref());
    let mut out = Vec::new();
    for shape in project
        .shapes
        .iter()
        .filter(|s| shapes.is_empty() || shapes.contains(&s.name))
    {
        for &dtype in &dtypes {
            let outcome = profile_case(
                &project,
                &device,
                &mut events,
                &loaded,
                run_dir,
                variant,
                shape,
                dtype,
            )
            .await?;
            out.push((shape.name.clone(), dtype, outcome));
        }
    }
    Ok(out)
}
