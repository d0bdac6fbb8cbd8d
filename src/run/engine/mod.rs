//! The commands that run a tuning session end to end (`tune`, `resume`, `build`, `ablate`, `profile`): probe and lock the GPUs, choose points by the run's strategy, measure them, profile the champions, time the reference library, write the reports. Every step becomes a run-log record first, then reaches the reporters.
use crate::error::{Error, Result};
use crate::log::runlog::{Record, RunCommand, RunLog};
use crate::model::config::Dtype;
use crate::model::plan::Strategy;
use crate::run::shared::{
    fresh_run_seed, header, input_seed, lock_gpus, measure_roofs, new_run_id, profile_case, Events,
    Project, Reporter, RunState, TuneOptions,
};
use anyhow::Context;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod baselines;
mod folder;
mod offline;
mod preflight;
mod stages;

pub use folder::{
    header_mismatches, read_run, read_run_and_seals, read_sealed_run, resolve_run_dir,
};
pub use offline::{build_space, gate_spec_keys, offline_limits, BuiltRow};
use preflight::{
    check_free_space, listen_for_stop, probe, refuse_dirty_table, refuse_fake_commit, take_gpus,
};
use stages::drive;

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
    let budget = opts.budget.clone().counted_from(std::time::Instant::now());
    let mut events = Events::new(log, reporters);
    let seed = fresh_run_seed(project.policies.measure.seed, &run_id);
    let mut head = header(&project, &device, &run_id, &opts.strategy, RunCommand::Tune);
    head.run_seed = Some(seed);
    // Local queues are GPUs of this host (the double's too); Slurm's are workers it places.
    if opts.executor.queues().is_none() {
        head.gpus = opts.devices.clone();
    }
    events.emit_header_then_store(Record::Header(Box::new(head)), &project.paths)?;
    let first = opts.devices.first().copied().unwrap_or(0);
    let began = events.stage_start();
    let roofs = measure_roofs(&project, first, &opts.executor, &mut events, None).await?;
    events.stage_ran(crate::model::vocab::Stage::Roofs, first, began)?;
    let opts = TuneOptions {
        run: RunState { seed, roofs },
        budget,
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
    // The command line hands every other log to the command that wrote it; this is the last guard.
    if old.command() != RunCommand::Tune {
        return Err(Error::BadInput(format!(
            "{} is the log of a `flashtune {}`, not of a tune: it is not resumed as one",
            run_dir.display(),
            old.command().name()
        )));
    }
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
        crate::tell!(
            "resume: the last line of {} was cut short or never sealed (the record being written when the run stopped); it is dropped and what it recorded is done again",
            log_path.display()
        );
    }
    let fresh = header(
        &project,
        &device,
        &old.run_id,
        &old.strategy,
        RunCommand::Tune,
    );
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
    let kept_cases = crate::run::measure::answered_before(&loaded)
        .iter()
        .filter(|(variant, _, _)| !done.contains(variant))
        .count();
    crate::tell!(
        "resume: {} variant(s) finished; {kept_cases} case(s) of the variants in flight were answered and are kept",
        done.len()
    );
    let log = RunLog::reopen(&log_path, &loaded)?;
    // A resumed run's time limit counts from the resume.
    let budget = opts.budget.clone().counted_from(std::time::Instant::now());
    let mut events = Events::new(log, reporters);
    events.record_into_store(&project.paths, Some(&loaded));
    events.emit(Record::Resumed {
        after_line,
        finished_variants: done.len(),
        kept_cases: Some(kept_cases),
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
    let began = events.stage_start();
    let roofs = measure_roofs(&project, first, &opts.executor, &mut events, Some(&loaded)).await?;
    events.stage_ran(crate::model::vocab::Stage::Roofs, first, began)?;
    let opts = TuneOptions {
        run: RunState { seed, roofs },
        budget,
        ..opts
    };
    drive(&project, &device, &opts, &mut events, &done, run_dir).await
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
    crate::tell!("ablating around `{id}` from run {}", header.run_id);
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
    let (loaded, header, sealed) = read_run_and_seals(run_dir)?;
    // Refused before a GPU is probed or a line is logged: nothing is profiled, nothing written.
    let planned: BTreeSet<&str> = loaded
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Planned { variant, .. } => Some(variant.as_str()),
            _ => None,
        })
        .collect();
    if !planned.contains(variant) {
        return Err(Error::UnknownVariant(format!(
            "`{variant}` is not a variant of run {} (its variants: {})",
            header.run_id,
            planned.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
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
    events.record_into_store(&project.paths, sealed.ok().as_ref());
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
