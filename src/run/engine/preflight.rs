//! What a run checks and takes before it starts: stop signals heard, room on disk, no fake figures committed, a clean champion table, and its GPUs probed, matched and locked.
use crate::error::{Error, Result};
use crate::gpu::executor::Executor;
use crate::model::protocol::DeviceInfo;
use crate::run::shared::{disk_room, lock_gpus, Project, TuneOptions};

/// From here on SIGINT, SIGTERM and SIGHUP end the run in order (see `stop`).
pub(super) fn listen_for_stop() -> Result<()> {
    crate::os::stop::listen()
        .map_err(|e| Error::Other(anyhow::anyhow!("cannot listen for signals: {e}")))
}

/// A run that starts on a nearly full disk stops mid-night: refuse it before it starts.
pub(super) fn check_free_space(project: &Project) -> Result<()> {
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

/// The fake GPU's figures are synthetic: they must never reach the champion table.
pub(super) fn refuse_fake_commit(opts: &TuneOptions) -> Result<()> {
    if opts.commit && opts.executor.is_fake() {
        return Err(Error::BadInput(
            "--commit with --fake-gpu: the fake GPU's figures are synthetic and are never committed to the champion table; \
             drop --commit, or run on a GPU"
                .into(),
        ));
    }
    Ok(())
}

/// flashtune commits the champion table itself; uncommitted edits to it would be lost or mixed in.
pub(super) fn refuse_dirty_table(project: &Project) -> Result<()> {
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

/// Probe the chosen GPUs (all visible ones when none is chosen); they must all be one model. Under
/// Slurm one step is probed, and the queues are the workers `--tasks` asks for (each step's GPU is
/// checked against this one's model when its session opens).
pub(super) async fn probe(executor: &Executor, chosen: &[u32]) -> Result<(DeviceInfo, Vec<u32>)> {
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
        let info = match executor.probe(d).await {
            Ok(info) => info,
            Err(reason) => {
                return Err(no_such_gpu(executor, d, first.as_ref())
                    .await
                    .unwrap_or_else(|| refused(reason)))
            }
        };
        if d >= info.visible_devices.max(1) {
            return Err(beyond(d, info.visible_devices));
        }
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

/// A `--gpus` ordinal the host does not have is a typo, not a broken GPU: said as bad input, with
/// the ordinals there are (learnt from a GPU that opens).
async fn no_such_gpu(executor: &Executor, d: u32, known: Option<&DeviceInfo>) -> Option<Error> {
    let visible = match known {
        Some(info) => info.visible_devices,
        None if d != 0 => executor.probe(0).await.ok()?.visible_devices,
        None => return None,
    };
    (d >= visible.max(1)).then(|| beyond(d, visible))
}

fn beyond(d: u32, visible: u32) -> Error {
    Error::BadInput(format!(
        "--gpus {d}: this host shows {visible} GPU(s), ordinals 0 to {}; pick from those, or leave --gpus out to use them all",
        visible.max(1) - 1
    ))
}

/// The run's GPUs: probed, reachable (Slurm steps see this host's files), locked; from now on every
/// worker session must serve their model.
pub(super) async fn take_gpus(
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
