//! The tuning pipeline: plan, build, check, time. Every step becomes a run-log record first, then reaches the reporters.
use crate::build::{self, BuildFailure, BuildOutput, BuildSpec, Builder, Toolchain};
use crate::config::{Dtype, Policies, ProjectPaths, Shape};
use crate::error::{Error, Result};
use crate::executor::{Executor, WorkerEnd};
use crate::protocol::*;
use crate::runlog::{self, Entry, Header, Record, RunLog};
use crate::space::{DeviceLimits, PlannedPoint, Space};
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Something that follows the run as it happens (progress bars, summaries, event streams).
pub trait Reporter: Send {
    fn on_entry(&mut self, entry: &Entry);
}

/// Where records go: the log first (so nothing is reported that is not on disk), then every reporter.
pub struct Events {
    log: RunLog,
    reporters: Vec<Box<dyn Reporter>>,
}

impl Events {
    pub fn emit(&mut self, record: Record) -> Result<()> {
        let entry = self.log.append(record)?;
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
    pub device: u32,
}

pub struct TuneOutcome {
    pub run_dir: PathBuf,
    pub report_markdown: String,
    pub interrupted: bool,
}

/// Which forward build serves a (variant, dtype, head dim).
type UnitKey = (String, Dtype, u32);

/// A project loaded for building: policies, space and compiler.
pub struct Project {
    pub paths: ProjectPaths,
    pub policies: Policies,
    pub policies_text: String,
    pub space: Space,
    /// The policy shapes the space is measured on.
    pub shapes: Vec<Shape>,
    pub toolchain: Toolchain,
}

impl Project {
    pub fn load(paths: ProjectPaths, space: Option<&Path>) -> Result<Self> {
        let (policies, policies_text) = Policies::load(&paths.policies())?;
        let space_path = paths.resolve(space.unwrap_or(&policies.default_space));
        let space = Space::load(&space_path)?;
        let shapes = space.select_shapes(&policies.shapes)?;
        let toolchain = build::find_nvcc()?;
        Ok(Project { paths, policies, policies_text, space, shapes, toolchain })
    }

    pub fn head_dims(&self) -> BTreeSet<u32> {
        self.shapes.iter().map(|s| s.d).collect()
    }

    pub fn builder(&self) -> Builder {
        Builder {
            toolchain: self.toolchain.clone(),
            cache_dir: self.paths.build_cache(),
            timeout: Duration::from_secs(self.policies.timeouts.build_s),
        }
    }

    pub fn forward_spec(&self, point: &PlannedPoint, dtype: Dtype, arch: &str) -> BuildSpec {
        BuildSpec {
            source: self.paths.resolve(&self.space.family.forward),
            defines: self.space.forward_defines(&point.variant, dtype, point.head_dim),
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

    /// The reason a build fails the policy gates, if it does.
    pub fn gate(&self, out: &BuildOutput) -> Option<String> {
        let limit = self.policies.gates.max_spill_bytes;
        out.entries
            .iter()
            .find(|e| e.spill_bytes() > limit)
            .map(|e| format!("gates: `{}` spills {} bytes (stores {} + loads {}), policy allows {limit}", e.name, e.spill_bytes(), e.spill_store_bytes, e.spill_load_bytes))
    }

    pub fn jobs(&self) -> usize {
        match self.policies.build.jobs {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        }
    }
}

/// Builds everything in parallel (one nvcc per job slot); results arrive in completion order.
pub async fn build_all(builder: Arc<Builder>, specs: Vec<(UnitKey, BuildSpec)>, jobs: usize, mut on_done: impl FnMut(UnitKey, std::result::Result<BuildOutput, BuildFailure>) -> Result<()>) -> Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(jobs.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (key, spec) in specs {
        let (builder, slots) = (builder.clone(), slots.clone());
        set.spawn(async move {
            let _slot = slots.acquire_owned().await.expect("semaphore stays open");
            let result = builder.build(&spec).await;
            (key, result)
        });
    }
    while let Some(joined) = set.join_next().await {
        let (key, result) = joined.context("a build task panicked")?;
        on_done(key, result)?;
    }
    Ok(())
}

pub fn new_run_id() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = now.chars().filter(|c| c.is_ascii_digit()).collect();
    let salt = blake3::hash(format!("{now}{}", std::process::id()).as_bytes()).to_hex()[..4].to_owned();
    format!("{}-{}-{salt}", &stamp[..8], &stamp[8..14])
}

/// Hash of every file a kernel build can see.
pub fn sources_hash(dir: &Path) -> String {
    let mut files: Vec<PathBuf> = walk(dir);
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in files {
        h.update(f.strip_prefix(dir).unwrap_or(&f).as_os_str().as_encoded_bytes());
        h.update(&std::fs::read(&f).unwrap_or_default());
    }
    h.finalize().to_hex()[..16].to_owned()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .flat_map(|p| if p.is_dir() { walk(&p) } else { vec![p] })
        .collect()
}

fn short_hash(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex()[..16].to_owned()
}

fn case_seed(base: u64, variant: &str, shape: &Shape, dtype: Dtype) -> u64 {
    let h = blake3::hash(format!("{base}|{variant}|{}|{dtype}", shape.name).as_bytes());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

pub async fn tune(opts: TuneOptions, reporters: Vec<Box<dyn Reporter>>) -> Result<TuneOutcome> {
    let project = Project::load(opts.paths.clone(), opts.space.as_deref())?;
    let device = opts.executor.probe(opts.device).await.map_err(|reason| {
        Error::NoGpu(format!(
            "{reason}\n`flashtune tune` checks and times kernels on an NVIDIA GPU. Without one, `flashtune build` still compiles and gates \
             every variant, and `flashtune doctor` lists what is missing."
        ))
    })?;
    let started = Instant::now();
    let run_id = new_run_id();
    let run_dir = project.paths.runs().join(&run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create {}", run_dir.display()))?;
    let log = RunLog::create(&run_dir.join("log.jsonl"))?;
    let mut events = Events { log, reporters };
    events.emit(Record::Header(Box::new(header(&project, &device, &run_id))))?;

    // Ctrl-C drops the pipeline (and with it the worker, killed on drop), then the log says so.
    let stages = run_stages(&project, &device, &opts, &mut events);
    let totals = tokio::select! {
        totals = stages => Some(totals?),
        _ = tokio::signal::ctrl_c() => None,
    };
    let interrupted = totals.is_none();
    match totals {
        Some(t) => events.emit(Record::Finished { seconds: started.elapsed().as_secs_f64(), variants: t.variants, measured_cases: t.measured, failed_cases: t.failed })?,
        None => events.emit(Record::Interrupted { reason: "Ctrl-C".into() })?,
    }
    let loaded = runlog::read(&run_dir.join("log.jsonl"))?;
    let report_markdown = crate::report::markdown(&loaded);
    std::fs::write(run_dir.join("report.md"), &report_markdown).with_context(|| format!("cannot write report in {}", run_dir.display()))?;
    Ok(TuneOutcome { run_dir, report_markdown, interrupted })
}

fn header(project: &Project, device: &DeviceInfo, run_id: &str) -> Header {
    let kernel_dir = project.paths.resolve(project.space.family.forward.parent().unwrap_or(Path::new("kernels")));
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
    }
}

#[derive(Default)]
struct Totals {
    variants: usize,
    measured: usize,
    failed: usize,
}

async fn run_stages(project: &Project, device: &DeviceInfo, opts: &TuneOptions, events: &mut Events) -> Result<Totals> {
    let limits = DeviceLimits { max_threads_per_block: device.max_threads_per_block, max_smem_optin_bytes: device.max_smem_optin_bytes };
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    for p in &planned {
        events.emit(Record::Planned {
            variant: p.variant.id.clone(),
            params: p.variant.params.clone(),
            head_dim: p.head_dim,
            launch: p.launch.clone(),
            invalid: p.invalid.clone(),
        })?;
    }
    let cubins = build_stage(project, &planned, &device.arch, events).await?;
    let totals = measure_stage(project, &planned, &cubins, opts, events).await?;
    baseline_stage(project, device, events).await?;
    Ok(totals)
}

/// Time the reference library after the variants, so the two never share the GPU.
async fn baseline_stage(project: &Project, device: &DeviceInfo, events: &mut Events) -> Result<()> {
    let unavailable = |reason: String| Record::BaselineUnavailable { backend: None, shape: None, dtype: None, reason };
    if device.fake {
        return events.emit(unavailable("fake GPU: the reference library is not run".into()));
    }
    if project.policies.baseline.command.is_empty() {
        return events.emit(unavailable("baseline.command is empty in policies.toml".into()));
    }
    match crate::baseline::measure(&project.paths.root, &project.policies, &project.shapes).await {
        Err(reason) => events.emit(unavailable(reason)),
        Ok(rows) => {
            for row in rows {
                let (backend, shape, dtype) = (row.backend, row.shape, row.dtype);
                events.emit(match row.outcome {
                    Ok(timing) => Record::BaselineTimed { backend, shape, dtype, timing },
                    Err(reason) => Record::BaselineUnavailable { backend: Some(backend), shape: Some(shape), dtype: Some(dtype), reason },
                })?;
            }
            Ok(())
        }
    }
}

/// Build the reference per dtype and each valid (variant, dtype, head dim); returns the cubins that passed the gates.
async fn build_stage(project: &Project, planned: &[PlannedPoint], arch: &str, events: &mut Events) -> Result<BTreeMap<UnitKey, PathBuf>> {
    let dtypes = &project.policies.dtypes;
    let mut specs: Vec<(UnitKey, BuildSpec)> = dtypes.iter().map(|&d| ((REFERENCE.into(), d, 0), project.reference_spec(d, arch))).collect();
    for p in planned.iter().filter(|p| p.invalid.is_none()) {
        for &d in dtypes {
            specs.push(((p.variant.id.clone(), d, p.head_dim), project.forward_spec(p, d, arch)));
        }
    }
    let mut cubins = BTreeMap::new();
    build_all(Arc::new(project.builder()), specs, project.jobs(), |(variant, dtype, head_dim), result| {
        match result {
            Ok(out) => {
                let gate = project.gate(&out);
                events.emit(Record::Built {
                    variant: variant.clone(),
                    dtype,
                    head_dim,
                    key: out.key.clone(),
                    cached: out.cached,
                    seconds: out.seconds,
                    entries: out.entries.clone(),
                })?;
                match gate {
                    Some(reason) => events.emit(Record::Rejected { variant, dtype, head_dim, reason })?,
                    None => {
                        cubins.insert((variant, dtype, head_dim), out.cubin);
                    }
                }
            }
            Err(failure) => events.emit(Record::BuildFailed {
                variant,
                dtype,
                head_dim,
                reason: failure.to_string(),
                log_tail: build::log_tail(failure.log(), 30),
            })?,
        }
        Ok(())
    })
    .await?;
    Ok(cubins)
}

/// Check and time, one worker per variant, cases in policy order.
async fn measure_stage(project: &Project, planned: &[PlannedPoint], cubins: &BTreeMap<UnitKey, PathBuf>, opts: &TuneOptions, events: &mut Events) -> Result<Totals> {
    let mut variant_ids: Vec<&str> = Vec::new();
    for p in planned.iter().filter(|p| p.invalid.is_none()) {
        if !variant_ids.contains(&p.variant.id.as_str()) {
            variant_ids.push(&p.variant.id);
        }
    }
    let mut totals = Totals { variants: variant_ids.len(), ..Default::default() };
    for variant_id in variant_ids {
        let cases = cases_for(project, planned, cubins, variant_id);
        if cases.is_empty() {
            continue;
        }
        let case_names: Vec<String> = cases.iter().map(|c| format!("{}/{}", c.shape.name, c.dtype)).collect();
        let policy = &project.policies.measure;
        let request = RunRequest {
            device: opts.device,
            measure: MeasureSpec { warmup_ms: policy.warmup_ms, samples: policy.samples, min_sample_us: policy.min_sample_us },
            cases,
        };
        let outcome = opts.executor.run(request).await;
        for case in &outcome.cases {
            let (variant, shape, dtype) = (variant_id.to_owned(), case.shape.clone(), case.dtype);
            let failure = match (&case.error, &case.check) {
                (Some(err), _) => Some(format!("CUDA error: {err}")),
                (None, Some(check)) if !check.passed() => Some(check.failures.join("; ")),
                (None, Some(_)) => None,
                (None, None) => Some("worker returned no check".into()),
            };
            if let Some(reason) = failure {
                totals.failed += 1;
                events.emit(Record::CheckFailed { variant, shape, dtype, check: case.check.clone(), reason })?;
                continue;
            }
            let check = case.check.clone().expect("a passed case has a check");
            events.emit(Record::Checked { variant: variant.clone(), shape: shape.clone(), dtype, check, function: case.function.clone() })?;
            if let Some(timing) = &case.timing {
                totals.measured += 1;
                events.emit(Record::Timed { variant, shape, dtype, kv_splits: case.kv_splits, timing: timing.clone() })?;
            }
        }
        let not_run: Vec<String> = case_names.into_iter().skip(outcome.cases.len()).collect();
        let variant = variant_id.to_owned();
        let lost = not_run.len();
        match outcome.end {
            WorkerEnd::Clean => {}
            WorkerEnd::TimedOut { seconds } => events.emit(Record::TimedOut { variant, stage: "worker".into(), seconds, cases_not_run: not_run })?,
            WorkerEnd::Fatal(detail) => events.emit(Record::WorkerCrashed { variant, detail, cases_not_run: not_run })?,
            WorkerEnd::Crashed { status, stderr_tail } => events.emit(Record::WorkerCrashed { variant, detail: format!("{status}: {stderr_tail}"), cases_not_run: not_run })?,
        }
        totals.failed += lost;
    }
    Ok(totals)
}

fn cases_for(project: &Project, planned: &[PlannedPoint], cubins: &BTreeMap<UnitKey, PathBuf>, variant_id: &str) -> Vec<CaseSpec> {
    let family = &project.space.family;
    let mut cases = Vec::new();
    for shape in &project.shapes {
        let Some(point) = planned.iter().find(|p| p.variant.id == variant_id && p.head_dim == shape.d && p.invalid.is_none()) else { continue };
        for &dtype in &project.policies.dtypes {
            let forward = cubins.get(&(variant_id.to_owned(), dtype, shape.d));
            let reference = cubins.get(&(REFERENCE.to_owned(), dtype, 0));
            let (Some(forward), Some(reference)) = (forward, reference) else { continue };
            cases.push(CaseSpec {
                shape: shape.clone(),
                dtype,
                seed: case_seed(project.policies.measure.seed, variant_id, shape, dtype),
                tolerance: project.policies.tolerance_for(dtype),
                cpu_oracle: shape.macs() <= project.policies.measure.cpu_reference_max_macs,
                forward: ForwardKernel {
                    cubin: forward.clone(),
                    entry: family.forward_entry.clone(),
                    combine_entry: family.combine_entry.clone(),
                    launch: point.launch.clone().expect("valid points have a launch"),
                },
                reference: ReferenceKernel { cubin: reference.clone(), entry: family.reference_entry.clone() },
            });
        }
    }
    cases
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

/// Compile and gate every valid point without a GPU, for the policy's default device.
pub async fn build_space(project: &Project, arch: Option<&str>) -> Result<(Vec<PlannedPoint>, Vec<BuiltRow>)> {
    let dev = &project.policies.build.default_device;
    let arch = arch.unwrap_or(&dev.arch).to_owned();
    let limits = DeviceLimits { max_threads_per_block: dev.max_threads_per_block, max_smem_optin_bytes: dev.max_smem_optin_bytes };
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    let mut specs: Vec<(UnitKey, BuildSpec)> = project.policies.dtypes.iter().map(|&d| ((REFERENCE.into(), d, 0), project.reference_spec(d, &arch))).collect();
    for p in planned.iter().filter(|p| p.invalid.is_none()) {
        for &d in &project.policies.dtypes {
            specs.push(((p.variant.id.clone(), d, p.head_dim), project.forward_spec(p, d, &arch)));
        }
    }
    let order: Vec<UnitKey> = specs.iter().map(|(k, _)| k.clone()).collect();
    let mut done: BTreeMap<UnitKey, BuiltRow> = BTreeMap::new();
    build_all(Arc::new(project.builder()), specs, project.jobs(), |(variant, dtype, head_dim), result| {
        let gate = result.as_ref().ok().and_then(|o| project.gate(o));
        let outcome = result.map_err(|f| format!("{f}\n{}", build::log_tail(f.log(), 30)));
        done.insert((variant.clone(), dtype, head_dim), BuiltRow { variant, dtype, head_dim, outcome, gate });
        Ok(())
    })
    .await?;
    let rows = order.into_iter().filter_map(|k| done.remove(&k)).collect();
    Ok((planned, rows))
}
