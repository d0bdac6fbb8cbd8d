//! The tuning pipeline: plan, build, check, time. Every step becomes a run-log record first, then reaches the reporters.
use crate::build::{self, BuildOutput, BuildSpec, Builder, Toolchain};
use crate::config::{Dtype, Policies, ProjectPaths, Shape, Timeouts};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::protocol::*;
use crate::runlog::{self, Entry, Header, Record, RunLog};
use crate::space::{DeviceLimits, PlannedPoint, Space};
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Something that follows the run as it happens (progress bars, summaries, event streams).
pub trait Reporter: Send {
    fn on_entry(&mut self, entry: &Entry);
}

/// Where records go: the log first (so nothing is reported that is not on disk), then every reporter.
pub struct Events {
    pub log: RunLog,
    reporters: Vec<Box<dyn Reporter>>,
    /// The results store, written as records are logged (none when it cannot be opened).
    store: Option<crate::store::Recorder>,
}

impl Events {
    pub fn new(log: RunLog, reporters: Vec<Box<dyn Reporter>>) -> Self {
        Events {
            log,
            reporters,
            store: None,
        }
    }

    /// From now on also put every measurement into the results store as it is logged; `earlier`
    /// (a resumed or reopened log) goes in first. A store that cannot be opened is warned about and
    /// left out: it is a cache of the logs, never the record.
    pub fn record_into_store(&mut self, paths: &ProjectPaths, earlier: Option<&runlog::LoadedLog>) {
        let path = crate::store::path(paths);
        let lines =
            std::fs::read(&self.log.path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
        let recorder = crate::store::Store::open(&path)
            .and_then(|store| crate::store::Recorder::new(store, earlier, lines));
        match recorder {
            Ok(r) => self.store = Some(r),
            Err(e) => eprintln!(
                "warning: results store left out: {e:#}; this run's measurements stay in its log (`flashtune report <run>` adds them to the store later)"
            ),
        }
    }

    /// Seconds on the run log's clock now.
    pub fn clock(&self) -> f64 {
        self.log.clock()
    }

    pub fn emit(&mut self, record: Record) -> Result<()> {
        let entry = self.log.append(record)?;
        if let Some(store) = &mut self.store {
            store.on_entry(&entry);
        }
        for r in &mut self.reporters {
            r.on_entry(&entry);
        }
        Ok(())
    }
}

pub struct TuneOptions {
    pub paths: ProjectPaths,
    pub space: Option<PathBuf>,
    pub executor: Executor,
    /// GPU ordinals, one worker queue each; empty means every visible GPU.
    pub devices: Vec<u32>,
    pub budget: Budget,
    /// Commit the champion table on `flashtune/<run-id>` when the run finishes.
    pub commit: bool,
    /// How points are chosen; a resumed run keeps its own.
    pub strategy: Strategy,
    /// What to do when another flashtune run holds a chosen GPU.
    pub when_busy: WhenBusy,
    /// Filled in as the run starts: its input seed and the roofs it measured.
    pub run: RunState,
    /// `--reuse`: take matching measurements from the results store instead of measuring them.
    pub reuse: Option<crate::anytime::Reuse>,
}

/// What a run fixes before it measures anything, for every stage after.
#[derive(Debug, Clone, Default)]
pub struct RunState {
    /// Seed of the run's input sets (the header keeps it for `resume`).
    pub seed: u64,
    /// The roofs figures are held to.
    pub roofs: crate::roofs::Roofs,
}

pub struct TuneOutcome {
    pub run_dir: PathBuf,
    /// The short form of the report, for the terminal.
    pub summary: String,
    pub interrupted: bool,
}

use crate::scheduler::{Budget, Ending, Scheduler, UnitKey};
use crate::search::Strategy;

/// A project loaded for building: policies, space and compiler.
pub struct Project {
    pub paths: ProjectPaths,
    pub policies: Policies,
    pub policies_text: String,
    pub space: Space,
    /// The policy shapes the space is measured on.
    pub shapes: Vec<Shape>,
    /// policies.toml's timeouts, or the space's own.
    pub timeouts: Timeouts,
    pub toolchain: Toolchain,
}

impl Project {
    pub fn load(paths: ProjectPaths, space: Option<&Path>) -> Result<Self> {
        let (policies, policies_text) = Policies::load(&paths.policies())?;
        let space_path = paths.resolve(space.unwrap_or(&policies.default_space));
        let space = Space::load(&space_path)?;
        let shapes = space.select_shapes(&policies.shapes)?;
        let timeouts = space
            .timeouts
            .clone()
            .unwrap_or_else(|| policies.timeouts.clone());
        let toolchain = build::find_nvcc()?;
        Ok(Project {
            paths,
            policies,
            policies_text,
            space,
            shapes,
            timeouts,
            toolchain,
        })
    }

    /// Repository-relative path of the champion table, beside the forward kernel.
    pub fn champion_table(&self) -> String {
        let dir = self
            .space
            .family
            .forward
            .parent()
            .unwrap_or(Path::new("kernels"));
        dir.join("tuned.toml").to_string_lossy().into_owned()
    }

    pub fn head_dims(&self) -> BTreeSet<u32> {
        self.shapes.iter().map(|s| s.d).collect()
    }

    pub fn builder(&self) -> Builder {
        Builder {
            toolchain: self.toolchain.clone(),
            cache_dir: self.paths.build_cache(),
            timeout: Duration::from_secs(self.timeouts.build_s),
        }
    }

    pub fn forward_spec(&self, point: &PlannedPoint, dtype: Dtype, arch: &str) -> BuildSpec {
        BuildSpec {
            source: self.paths.resolve(&self.space.family.forward),
            defines: self
                .space
                .forward_defines(&point.variant, dtype, point.head_dim),
            arch: arch.to_owned(),
            flags: self.policies.build.nvcc_flags.clone(),
        }
    }

    pub fn reference_spec(&self, dtype: Dtype, arch: &str) -> BuildSpec {
        BuildSpec {
            source: self.paths.resolve(&self.space.family.reference),
            defines: vec![("DTYPE".into(), dtype.define().into())],
            arch: arch.to_owned(),
            flags: self.policies.build.nvcc_flags.clone(),
        }
    }

    /// Every build a plan needs: the reference per dtype, then each valid (variant, dtype, head dim) not in `skip`.
    pub fn build_specs(
        &self,
        planned: &[PlannedPoint],
        arch: &str,
        skip: &BTreeSet<String>,
    ) -> Vec<(UnitKey, BuildSpec)> {
        let dtypes = &self.policies.dtypes;
        let mut specs: Vec<(UnitKey, BuildSpec)> = dtypes
            .iter()
            .map(|&d| ((REFERENCE.into(), d, 0), self.reference_spec(d, arch)))
            .collect();
        for p in planned
            .iter()
            .filter(|p| p.invalid.is_none() && !skip.contains(&p.variant.id))
        {
            for &d in dtypes {
                specs.push((
                    (p.variant.id.clone(), d, p.head_dim),
                    self.forward_spec(p, d, arch),
                ));
            }
        }
        specs
    }

    /// The reason a build fails the policy gates, if it does.
    pub fn gate(&self, out: &BuildOutput) -> Option<String> {
        let limit = self.policies.gates.max_spill_bytes;
        out.entries
            .iter()
            .find(|e| e.spill_bytes() > limit)
            .map(|e| {
                format!(
                    "gates: `{}` spills {} bytes (stores {} + loads {}), policy allows {limit}",
                    e.name,
                    e.spill_bytes(),
                    e.spill_store_bytes,
                    e.spill_load_bytes
                )
            })
    }

    pub fn jobs(&self) -> usize {
        match self.policies.build.jobs {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        }
    }
}

pub fn new_run_id() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = now.chars().filter(|c| c.is_ascii_digit()).collect();
    let salt =
        blake3::hash(format!("{now}{}", std::process::id()).as_bytes()).to_hex()[..4].to_owned();
    format!("{}-{}-{salt}", &stamp[..8], &stamp[8..14])
}

/// Hash of every CUDA source a kernel build can see (not the champion table beside them).
pub fn sources_hash(dir: &Path) -> String {
    let mut files: Vec<PathBuf> = walk(dir)
        .into_iter()
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("cu" | "cuh" | "h")
            )
        })
        .collect();
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in files {
        h.update(
            f.strip_prefix(dir)
                .unwrap_or(&f)
                .as_os_str()
                .as_encoded_bytes(),
        );
        h.update(&std::fs::read(&f).unwrap_or_default());
    }
    h.finalize().to_hex()[..16].to_owned()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .flat_map(|p| if p.is_dir() { walk(&p) } else { vec![p] })
        .collect()
}

fn short_hash(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex()[..16].to_owned()
}

/// Seed of the input sets of one (shape, dtype) in a run: every variant of the run meets the same
/// sets (so each set's reference is computed once), and every run meets new ones.
pub fn input_seed(run_seed: u64, shape: &Shape, dtype: Dtype) -> u64 {
    let h = blake3::hash(format!("{run_seed}|{shape:?}|{dtype}").as_bytes());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// A seed no earlier run had: the policy's seed mixed with the run id and the clock.
pub fn fresh_run_seed(policy_seed: u64, run_id: &str) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let h = blake3::hash(format!("{policy_seed}|{run_id}|{now}|{}", std::process::id()).as_bytes());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// The run's roofs: measured by the worker once per run (a resumed run keeps what its log holds).
pub async fn measure_roofs(
    project: &Project,
    device: u32,
    executor: &Executor,
    events: &mut Events,
    logged: Option<&runlog::LoadedLog>,
) -> Result<crate::roofs::Roofs> {
    let worker_roofs = |log: &runlog::LoadedLog| {
        log.entries.iter().any(|(_, e)| {
            matches!(&e.record, Record::CeilingMeasured { source: Some(s), .. } if s == "worker")
        })
    };
    if let Some(log) = logged.filter(|l| worker_roofs(l)) {
        return Ok(crate::roofs::Roofs::from_log(log));
    }
    let timeout = Duration::from_secs(project.timeouts.worker_s);
    let mut roofs = crate::roofs::Roofs::default();
    match executor
        .roofs(device, &project.policies.dtypes, timeout)
        .await
    {
        Ok(measured) => {
            for r in measured {
                match (r.value, r.error) {
                    (Some(value), None) => {
                        roofs.add(&r.name, r.dtype, value);
                        events.emit(Record::CeilingMeasured {
                            name: r.name,
                            dtype: r.dtype,
                            value,
                            unit: r.unit,
                            source: Some("worker".into()),
                        })?;
                    }
                    (_, error) => events.emit(Record::RoofUnavailable {
                        name: r.name,
                        dtype: r.dtype,
                        reason: error.unwrap_or_else(|| "no value".into()),
                    })?,
                }
            }
        }
        Err(reason) => events.emit(Record::RoofUnavailable {
            name: "all".into(),
            dtype: None,
            reason,
        })?,
    }
    Ok(roofs)
}

pub async fn tune(opts: TuneOptions, reporters: Vec<Box<dyn Reporter>>) -> Result<TuneOutcome> {
    listen_for_stop()?;
    refuse_fake_commit(&opts)?;
    crate::anytime::refuse_reuse(opts.reuse, &opts.strategy)?;
    let project = Project::load(opts.paths.clone(), opts.space.as_deref())?;
    check_free_space(&project)?;
    if opts.commit {
        refuse_dirty_table(&project)?;
    }
    let (device, devices) = probe(&opts.executor, &opts.devices).await?;
    let _locks = lock_gpus(&devices, opts.executor.is_fake(), opts.when_busy)?;
    let opts = TuneOptions { devices, ..opts };
    let run_id = new_run_id();
    let run_dir = project.paths.runs().join(&run_id);
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("cannot create {}", run_dir.display()))?;
    let log = RunLog::create(&run_dir.join("log.jsonl"))?;
    let mut events = Events::new(log, reporters);
    events.record_into_store(&project.paths, None);
    let seed = fresh_run_seed(project.policies.measure.seed, &run_id);
    let mut head = header(&project, &device, &run_id, &opts.strategy);
    head.run_seed = Some(seed);
    events.emit(Record::Header(Box::new(head)))?;
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
    let (loaded, old) = read_run(&run_dir)?;
    crate::anytime::refuse_reuse(opts.reuse, &old.strategy)?;
    let project = Project::load(opts.paths.clone(), Some(&old.space_path))?;
    check_free_space(&project)?;
    if opts.commit {
        refuse_dirty_table(&project)?;
    }
    let (device, devices) = probe(&opts.executor, &opts.devices).await?;
    let _locks = lock_gpus(&devices, opts.executor.is_fake(), opts.when_busy)?;
    let opts = TuneOptions {
        devices,
        strategy: old.strategy.clone(),
        ..opts
    };
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
    crate::stop::listen()
        .map_err(|e| Error::Other(anyhow::anyhow!("cannot listen for signals: {e}")))
}

/// Free GiB an unprivileged user may still write on the filesystem holding `path` (or its nearest
/// existing parent: `runs/` need not exist yet); `None` when it cannot be read.
pub fn free_gib(path: &Path) -> Option<f64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct it is given and reads a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as f64 * st.f_frsize as f64 / (1u64 << 30) as f64)
}

/// The folders a run writes to and how much is free under each: runs/, then the build cache.
pub fn disk_room(paths: &ProjectPaths) -> Vec<(&'static str, PathBuf, Option<f64>)> {
    let mut out = vec![("runs/", paths.runs(), free_gib(&paths.runs()))];
    let cache = paths.build_cache();
    out.push(("the build cache", cache.clone(), free_gib(&cache)));
    out
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
    if crate::stop::requested().is_some() {
        return Ok(None);
    }
    tokio::select! {
        done = stage => done.map(Some),
        _ = crate::stop::reached(1) => Ok(None),
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
        let what = if loaded.entries.is_empty() {
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

/// flashtune commits the champion table itself; uncommitted edits to it would be lost or mixed in.
fn refuse_dirty_table(project: &Project) -> Result<()> {
    let table = project.champion_table();
    match crate::vcs::dirty_among(&project.paths.root, &[&table]) {
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

/// Probe the chosen GPUs (all visible ones when none is chosen); they must all be one model.
async fn probe(executor: &Executor, chosen: &[u32]) -> Result<(DeviceInfo, Vec<u32>)> {
    let mut devices = chosen.to_vec();
    let mut first: Option<DeviceInfo> = None;
    if devices.is_empty() {
        let info = executor.probe(0).await.map_err(no_gpu)?;
        devices = (0..info.visible_devices.max(1)).collect();
        first = Some(info);
    }
    for &d in &devices {
        if first.as_ref().is_some_and(|f| f.ordinal == d) {
            continue;
        }
        let info = executor.probe(d).await.map_err(no_gpu)?;
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

fn no_gpu(reason: String) -> Error {
    Error::NoGpu(format!(
        "{reason}\n`flashtune tune` checks and times kernels on an NVIDIA GPU. Without one, `flashtune build` still compiles and gates \
         every variant, and `flashtune doctor` lists what is missing."
    ))
}

/// What a run does when another flashtune run holds one of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenBusy {
    /// Exit at once with [`crate::error::exit_code::GPU_BUSY`].
    #[default]
    Refuse,
    /// Queue behind the holder (`--wait`): two overnight runs follow each other.
    Wait,
}

/// One run per GPU at a time: a second run on the same GPU refuses with the holder's pid, or waits for it.
pub fn lock_gpus(devices: &[u32], fake: bool, when_busy: WhenBusy) -> Result<Vec<std::fs::File>> {
    if fake {
        return Ok(Vec::new());
    }
    devices.iter().map(|&d| lock_gpu(d, when_busy)).collect()
}

fn lock_gpu(device: u32, when_busy: WhenBusy) -> Result<std::fs::File> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let path = std::env::temp_dir().join(format!("flashtune-gpu{device}.lock"));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let flock = |operation| unsafe { libc::flock(file.as_raw_fd(), operation) };
    if flock(libc::LOCK_EX | libc::LOCK_NB) != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        let holder = holder.trim();
        if when_busy == WhenBusy::Refuse {
            return Err(Error::GpuBusy(format!(
                "GPU {device} is in use by another flashtune run (pid {holder}); pass --wait to queue behind it, or pick another GPU with --gpus"
            )));
        }
        eprintln!("GPU {device} is in use by another flashtune run (pid {holder}); waiting for it to finish (--wait)");
        // Blocking on purpose: nothing else of this run has started, and Ctrl-C still ends it.
        while flock(libc::LOCK_EX) != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Other(anyhow::anyhow!(
                    "cannot wait for the lock {}: {err}",
                    path.display()
                )));
            }
        }
    }
    file.set_len(0).ok();
    let _ = write!(file, "{}", std::process::id());
    Ok(file)
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
    };
    let head_dims = project.head_dims();
    // Guided chooses as it measures; the other strategies fix their points up front.
    let planned = match &opts.strategy {
        Strategy::Guided => None,
        Strategy::Exhaustive => Some(project.space.plan(&head_dims, &limits)?),
        Strategy::Random { count, seed } => Some(crate::search::random_sample(
            &project.space.plan(&head_dims, &limits)?,
            *count,
            *seed,
        )),
        Strategy::Ablate { champion, .. } => {
            let variants = crate::ablate::variants(&project.space, champion);
            Some(project.space.plan_points(&variants, &head_dims, &limits)?)
        }
    };
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
            let search = crate::search::Guided {
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
        unless_stopped(reduel_across_drift(project, device, opts, events)).await?;
        unless_stopped(profile_stage(project, device, events, &run_dir)).await?;
        unless_stopped(baseline_stage(project, device, events)).await?;
        interrupted = crate::stop::requested().is_some();
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
            reason: crate::stop::reason(),
        })?;
    }
    if opts.commit && !interrupted {
        let loaded = runlog::read(&run_dir.join("log.jsonl"))?;
        let champions = crate::champions::from_log(&loaded);
        let path = project.champion_table();
        let (branch, commit) =
            crate::champions::commit(&project.paths.root, &path, &loaded, &champions).map_err(
                |e| Error::Other(anyhow::anyhow!("cannot commit champions: {}", e.message())),
            )?;
        events.emit(Record::ChampionsCommitted {
            branch,
            commit,
            path,
        })?;
    }
    let loaded = runlog::read(&run_dir.join("log.jsonl"))?;
    crate::export::write_all(&run_dir, &loaded)
        .with_context(|| format!("cannot write the reports in {}", run_dir.display()))?;
    let summary = crate::report::summary(&loaded);
    Ok(TuneOutcome {
        run_dir,
        summary,
        interrupted,
    })
}

/// Champions whose case and runner-up's were timed on different sides of a drift of the sentinel
/// (their sentinels further apart than `[sentinel] max_drift`) are re-timed against each other,
/// interleaved in one worker on the same inputs, before the champion table is committed: the
/// `drift_duel` record decides which of the two holds the case.
async fn reduel_across_drift(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
) -> Result<()> {
    let log = runlog::read(&events.log.path)?;
    let ix = crate::runindex::RunIndex::new(&log);
    let max_drift = project.policies.sentinel.max_drift;
    let mut pairs = Vec::new();
    let mut names = Vec::new();
    for shape in &project.shapes {
        for &dtype in &project.policies.dtypes {
            let Some(pick) = ix.pick(&shape.name, dtype) else {
                continue;
            };
            let Some(runner_up) = pick.runner_up else {
                continue;
            };
            let (best, runner_up) = (pick.best.variant, runner_up.variant);
            let Some(drift) = ix.drift_between(pick.best, pick.runner_up.expect("some")) else {
                continue;
            };
            let judged = ix.drift_duels.iter().any(|d| {
                d.shape == shape.name
                    && d.dtype == dtype
                    && [d.champion, d.runner_up].contains(&best)
                    && [d.champion, d.runner_up].contains(&runner_up)
            });
            if drift <= max_drift || judged {
                continue;
            }
            let (Some(a), Some(b)) = (
                logged_case(project, &log, best, shape, dtype),
                logged_case(project, &log, runner_up, shape, dtype),
            ) else {
                continue;
            };
            pairs.push(DuelPair {
                champion: a.spec,
                challenger: b.spec,
            });
            names.push((
                shape.clone(),
                dtype,
                best.to_owned(),
                runner_up.to_owned(),
                drift,
            ));
        }
    }
    if pairs.is_empty() {
        return Ok(());
    }
    let measure = &project.policies.measure;
    let rounds = project.policies.step.rounds;
    let request = DuelRequest {
        measure: MeasureSpec {
            warmup_ms: measure.warmup_ms,
            samples: rounds,
            min_sample_us: measure.min_sample_us,
        },
        rounds,
        pairs,
    };
    let timeout = Duration::from_secs(project.timeouts.worker_s * 2);
    let outcome = opts.executor.duel(device.ordinal, request, timeout).await;
    for (i, (shape, dtype, champion, runner_up, drift)) in names.into_iter().enumerate() {
        // Which of the two is faster beyond the duel's own noise: no threshold on top.
        let judged = crate::step::judge_pair(
            outcome.duels.get(i),
            &outcome,
            0.0,
            &shape,
            &opts.run.roofs,
            project.policies.gates.plausibility_margin,
        );
        events.emit(Record::DriftDuel {
            shape: shape.name.clone(),
            dtype,
            champion,
            runner_up,
            drift,
            champion_us: judged.champion.map(|t| t.median_us),
            runner_up_us: judged.challenger.map(|t| t.median_us),
            verdict: judged.verdict,
            failure: judged.failure,
        })?;
    }
    Ok(())
}

/// Log the points (with the search's reason for each), then build, check and time the valid ones not yet done.
#[allow(clippy::too_many_arguments)]
pub async fn measure_points(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
    done: &BTreeSet<String>,
    planned: &[PlannedPoint],
    reasons: &BTreeMap<String, crate::search::Proposal>,
    budget: &Budget,
) -> Result<Ending> {
    for p in planned.iter().filter(|p| !done.contains(&p.variant.id)) {
        events.emit(Record::Planned {
            variant: p.variant.id.clone(),
            step: p.variant.step.clone(),
            params: p.variant.params.clone(),
            head_dim: p.head_dim,
            launch: p.launch.clone(),
            invalid: p.invalid.clone(),
            proposed_by: reasons.get(&p.variant.id).cloned(),
        })?;
    }
    let prepared = crate::anytime::prepare(project, device, opts, events, done, planned, budget)?;
    let scheduler = Scheduler {
        project,
        executor: &opts.executor,
        devices: &opts.devices,
        arch: &device.arch,
        budget,
        done,
        run_seed: opts.run.seed,
        roofs: &opts.run.roofs,
        reused: &prepared.reused,
    };
    scheduler.run(&prepared.planned, events).await
}

pub fn header(project: &Project, device: &DeviceInfo, run_id: &str, strategy: &Strategy) -> Header {
    let kernel_dir = project.paths.resolve(
        project
            .space
            .family
            .forward
            .parent()
            .unwrap_or(Path::new("kernels")),
    );
    Header {
        schema_version: runlog::SCHEMA_VERSION,
        flashtune_version: env!("CARGO_PKG_VERSION").into(),
        run_id: run_id.to_owned(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        git_head: crate::vcs::head(&project.paths.root),
        device: device.clone(),
        toolchain: project.toolchain.clone(),
        policies_hash: short_hash(&project.policies_text),
        kernel_sources_hash: sources_hash(&kernel_dir),
        space: project.space.name.clone(),
        space_path: project.space.path.clone(),
        space_hash: short_hash(&project.space.text),
        baseline: project.space.baseline_id(),
        dtypes: project.policies.dtypes.clone(),
        shapes: project.shapes.clone(),
        strategy: strategy.clone(),
        run_seed: None,
    }
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

/// What the log knows about one built case of this run: enough to run it again.
pub struct LoggedCase {
    pub spec: CaseSpec,
    pub params: crate::space::Params,
    /// The KV split the worker chose when it timed this case (`auto` is resolved per shape).
    pub resolved_splits: Option<u32>,
    pub profile: Option<crate::profile::ProfileOutcome>,
}

/// Rebuild one case's request from the run log's `planned`, `built` and `timed` records; `None` when it was never built.
pub fn logged_case(
    project: &Project,
    log: &runlog::LoadedLog,
    variant: &str,
    shape: &Shape,
    dtype: Dtype,
) -> Option<LoggedCase> {
    let mut key = None;
    let mut ref_key = None;
    let mut planned = None;
    let mut resolved_splits = None;
    let mut profile = None;
    for (_, e) in &log.entries {
        match &e.record {
            Record::Timed {
                variant: v,
                shape: s,
                dtype: d,
                kv_splits,
                ..
            } if v == variant && s == &shape.name && *d == dtype => {
                resolved_splits = Some(*kv_splits);
            }
            Record::Profiled {
                variant: v,
                shape: s,
                dtype: d,
                profile: p,
            } if v == variant && s == &shape.name && *d == dtype => {
                profile = Some(p.clone());
            }
            Record::Built {
                variant: v,
                dtype: d,
                head_dim,
                key: k,
                ..
            } if *d == dtype => {
                if v == variant && *head_dim == shape.d {
                    key = Some(k.clone());
                } else if v == REFERENCE {
                    ref_key = Some(k.clone());
                }
            }
            Record::Planned {
                variant: v,
                params,
                head_dim,
                launch: Some(launch),
                ..
            } if v == variant && *head_dim == shape.d => {
                planned = Some((params.clone(), launch.clone()));
            }
            _ => {}
        }
    }
    let (key, ref_key, (params, launch)) = (key?, ref_key?, planned?);
    let family = &project.space.family;
    let point = crate::space::Variant {
        id: variant.to_owned(),
        params: params.clone(),
        step: None,
    };
    let cache = project.paths.build_cache();
    let spec = CaseSpec {
        shape: shape.clone(),
        dtype,
        seed: input_seed(
            log.header()
                .and_then(|h| h.run_seed)
                .unwrap_or(project.policies.measure.seed),
            shape,
            dtype,
        ),
        tolerance: project.policies.tolerance_for(dtype),
        cpu_oracle_max_macs: project.policies.measure.cpu_reference_max_macs,
        forward: ForwardKernel {
            cubin: cache.join(&key).join("kernel.cubin"),
            entry: family.forward_entry.clone(),
            combine_entry: family.combine_entry.clone(),
            launch,
            defines: project.space.forward_defines(&point, dtype, shape.d),
        },
        reference: ReferenceKernel {
            cubin: cache.join(&ref_key).join("kernel.cubin"),
            entry: family.reference_entry.clone(),
        },
    };
    Some(LoggedCase {
        spec,
        params,
        resolved_splits,
        profile,
    })
}

/// The run's earlier profile of one case, else a new one (ncu; synthetic on the fake GPU), logged as `profiled`.
/// `None` when the case was never built in this run, so there is nothing to profile.
pub async fn profile_case(
    project: &Project,
    device: &DeviceInfo,
    events: &mut Events,
    // The log as read before a batch of distinct cases: this case's own profile cannot be newer.
    log: &runlog::LoadedLog,
    run_dir: &Path,
    variant: &str,
    shape: &Shape,
    dtype: Dtype,
) -> Result<Option<crate::profile::ProfileOutcome>> {
    let Some(case) = logged_case(project, log, variant, shape, dtype) else {
        return Ok(None);
    };
    if let Some(earlier) = case.profile {
        return Ok(Some(earlier));
    }
    let launch = case.spec.forward.launch.clone();
    let outcome = if device.fake {
        crate::fakegpu::profile(
            &project.policies.profile,
            &case.params,
            &launch,
            shape,
            device,
        )
    } else {
        let request = WorkerRequest::Run(RunRequest {
            measure: MeasureSpec {
                warmup_ms: 0.0,
                samples: 0,
                min_sample_us: 0.0,
            },
            cases: vec![case.spec],
        });
        let json = serde_json::to_vec(&request).expect("requests serialize");
        let profiles = run_dir.join("profiles");
        std::fs::create_dir_all(&profiles)
            .with_context(|| format!("cannot create {}", profiles.display()))?;
        // A split variant launches forward + combine; otherwise the first forward is enough.
        // `auto` is resolved per shape by the worker: the timed record says what it chose.
        let splits = case.resolved_splits.unwrap_or(launch.kv_splits);
        let launches = if splits == 1 { 1 } else { 2 };
        let policy = &project.policies.profile;
        let base = profiles.join(format!("{variant}-{}-{dtype}", shape.name));
        let outcome = crate::profile::profile(
            policy,
            device.ordinal,
            &json,
            &base,
            launches,
            Duration::from_secs(policy.timeout_s),
        )
        .await;
        // The parsed metrics beside ncu's own report, for tools that read JSON rather than the log.
        let parsed = serde_json::to_vec_pretty(&outcome).expect("profiles serialize");
        std::fs::write(base.with_extension("json"), parsed)
            .with_context(|| format!("cannot write {}", base.with_extension("json").display()))?;
        outcome
    };
    events.emit(Record::Profiled {
        variant: variant.to_owned(),
        shape: shape.name.clone(),
        dtype,
        profile: outcome.clone(),
    })?;
    Ok(Some(outcome))
}

/// Time the reference library after the variants, so the two never share the GPU.
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
    // PyTorch's calls rotate over at least as many distinct input sets as the variants' timed
    // launches did on each shape, so neither side is timed on inputs sitting in L2.
    let log = runlog::read(&events.log.path)?;
    let mut sets: BTreeMap<String, u32> = BTreeMap::new();
    for t in log.timed() {
        let n = sets.entry(t.shape.to_owned()).or_insert(crate::trial::MIN_LAUNCHES);
        *n = (*n).max(t.timing.launches_per_sample);
    }
    let measured = crate::baseline::measure_rotating(
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

/// The unit name under which the fp32 reference kernel is built and logged.
pub const REFERENCE: &str = "reference";

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
        crate::config::config_error_at_key(
            &project.paths.policies(),
            &project.policies_text,
            "build.targets",
            e.to_string(),
        )
    })?;
    Ok(DeviceLimits {
        max_threads_per_block: target.max_threads_per_block,
        max_smem_optin_bytes: target.max_smem_optin_bytes,
    })
}

/// Compile and gate every valid point without a GPU, for `arch` (default: policies.toml's `default_arch`) and its limits.
pub async fn build_space(
    project: &Project,
    arch: Option<&str>,
) -> Result<(Vec<PlannedPoint>, Vec<BuiltRow>)> {
    let arch = arch
        .unwrap_or(&project.policies.build.default_arch)
        .to_owned();
    let limits = offline_limits(project, &arch)?;
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    let specs = project.build_specs(&planned, &arch, &BTreeSet::new());
    let order: Vec<UnitKey> = specs.iter().map(|(k, _)| k.clone()).collect();
    let mut done: BTreeMap<UnitKey, BuiltRow> = BTreeMap::new();
    let (_tasks, mut results) = crate::scheduler::spawn_builds(project, specs);
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
    let (id, champion) = crate::ablate::choose_champion(&log, variant)
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
) -> Result<Vec<(String, Dtype, Option<crate::profile::ProfileOutcome>)>> {
    let log_path = run_dir.join("log.jsonl");
    let (loaded, header) = read_run(run_dir)?;
    let project = Project::load(opts.paths.clone(), Some(&header.space_path))?;
    let (device, devices) = probe(&opts.executor, &opts.devices).await?;
    let _locks = lock_gpus(&devices[..1], opts.executor.is_fake(), opts.when_busy)?;
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
    events.record_into_store(&project.paths, Some(&loaded));
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
