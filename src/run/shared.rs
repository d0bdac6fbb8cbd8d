//! What every running command shares: the loaded project, the event stream into the run log, the run's options and seeds, the GPU locks, the roofs, and rebuilding or profiling one logged case. Strategies, the scheduler and `step` build on it; it knows none of them.
use crate::error::Result;
use crate::gpu::build::{self, BuildOutput, BuildSpec, Builder, Toolchain};
use crate::gpu::executor::Executor;
use crate::log::runlog::{self, Entry, Header, Record, RunLog};
use crate::model::config::{Dtype, Policies, ProjectPaths, Shape, Timeouts};
use crate::model::plan::Strategy;
use crate::model::protocol::*;
use crate::model::space::{PlannedPoint, Space, REFERENCE};
use anyhow::Context;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `--reuse`: cases the results store already measured are taken from it, not measured again.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reuse {
    /// Per (shape, dtype), the N fastest stored cases are measured again to confirm them.
    pub confirm: usize,
}

/// Which build serves a (variant, dtype, head dim); the reference uses head dim 0.
pub type UnitKey = (String, Dtype, u32);

/// Something that follows the run as it happens (progress bars, summaries, event streams).
pub trait Reporter: Send {
    fn on_entry(&mut self, entry: &Entry);
}

/// Where records go: the log first (so nothing is reported that is not on disk), then every reporter.
pub struct Events {
    pub log: RunLog,
    reporters: Vec<Box<dyn Reporter>>,
    /// The results store, written as records are logged (none when it cannot be opened).
    store: Option<crate::log::store::Recorder>,
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
    /// (a resumed or reopened log) goes in first, when it is sealed (a store row stands only on
    /// what flashtune wrote; without it, records appended to the log reach no row either). A store
    /// that cannot be opened is warned about and left out: it is a cache of the logs, never the record.
    pub fn record_into_store(&mut self, paths: &ProjectPaths, earlier: Option<&runlog::SealedLog>) {
        self.open_store(paths, earlier, self.log.lines());
    }

    fn open_store(
        &mut self,
        paths: &ProjectPaths,
        earlier: Option<&runlog::SealedLog>,
        lines: usize,
    ) {
        let path = crate::log::store::path(paths);
        let recorder = crate::log::store::Store::open(&path)
            .and_then(|store| crate::log::store::Recorder::new(store, earlier, lines));
        match recorder {
            Ok(r) => self.store = Some(r),
            Err(e) => crate::tell!(
                "warning: results store left out: {e:#}; this run's measurements stay in its log (`flashtune report <run>` adds them to the store later)"
            ),
        }
    }

    /// The run so far, as its log holds it: what every stage reads instead of the file.
    pub fn records(&self) -> &runlog::LoadedLog {
        self.log.records()
    }

    /// Seconds on the run log's clock now.
    pub fn clock(&self) -> f64 {
        self.log.clock()
    }

    /// Log that `stage` held `device` from `started_t` (the clock when it began, with `records`
    /// then in the log) until now, if it logged anything: a stage with nothing to do is not one.
    pub fn stage_ran(
        &mut self,
        stage: crate::model::vocab::Stage,
        device: u32,
        (started_t, records): (f64, usize),
    ) -> Result<()> {
        if self.records().entries.len() == records {
            return Ok(());
        }
        let seconds = self.clock() - started_t;
        self.emit(Record::StageRan {
            stage,
            device,
            started_t,
            seconds,
        })
    }

    /// The clock and the record count now: where a stage begins, for [`Events::stage_ran`].
    pub fn stage_start(&self) -> (f64, usize) {
        (self.clock(), self.records().entries.len())
    }

    /// Log many records at once (one sync), then show each to the store and the reporters.
    pub fn emit_all(&mut self, records: Vec<Record>) -> Result<()> {
        for entry in self.log.append_all(records)? {
            if let Some(store) = &mut self.store {
                store.on_entry(&entry);
            }
            for r in &mut self.reporters {
                r.on_entry(&entry);
            }
        }
        Ok(())
    }

    /// Log a run's header, then open the results store with it: on a nearly full disk the log gets
    /// the bytes first, never an empty file beside a store's write-ahead log.
    pub fn emit_header_then_store(&mut self, header: Record, paths: &ProjectPaths) -> Result<()> {
        let entry = self.log.append(header)?;
        for r in &mut self.reporters {
            r.on_entry(&entry);
        }
        // The store follows the log from its first line: the header is its line 1.
        self.open_store(paths, None, 0);
        if let Some(store) = &mut self.store {
            store.on_entry(&entry);
        }
        Ok(())
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
    pub budget: crate::run::budget::Budget,
    /// Commit the champion table on `flashtune/<run-id>` when the run finishes.
    pub commit: bool,
    /// How points are chosen; a resumed run keeps its own.
    pub strategy: Strategy,
    /// What to do when another flashtune run holds a chosen GPU.
    pub when_busy: WhenBusy,
    /// Filled in as the run starts: its input seed and the roofs it measured.
    pub run: RunState,
    /// `--reuse`: take matching measurements from the results store instead of measuring them.
    pub reuse: Option<crate::run::shared::Reuse>,
    /// `--fresh-baselines`: time the reference library even where the store holds its figures.
    pub fresh_baselines: bool,
}

impl TuneOptions {
    /// The GPUs the run holds, in order: those `--gpus` resolved to, else the probed one (a
    /// cluster's run names none).
    pub fn gpus(&self, probed: &DeviceInfo) -> Vec<u32> {
        if self.devices.is_empty() {
            vec![probed.ordinal]
        } else {
            self.devices.clone()
        }
    }
}

/// What a run fixes before it measures anything, for every stage after.
#[derive(Debug, Clone, Default)]
pub struct RunState {
    /// Seed of the run's input sets (the header keeps it for `resume`).
    pub seed: u64,
    /// The roofs figures are held to.
    pub roofs: crate::report::roofs::Roofs,
}

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

/// A parameter no kernel source reads (the forward kernel and what it includes) and no launch
/// expression names builds the same kernel for each of its values: refused, naming its line.
fn refuse_unread_parameters(paths: &ProjectPaths, space: &Space) -> Result<()> {
    let forward = paths.resolve(&space.family.forward);
    let Ok(closure) = build::include_closure(&forward) else {
        return Ok(()); // A missing source is reported by its build, with its path.
    };
    let sources: Vec<String> = closure
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect();
    let expressions = space.family.launch_expressions();
    let names_word = |text: &str, word: &str| {
        text.match_indices(word).any(|(at, _)| {
            let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
            let before = text[..at].chars().next_back().is_none_or(|c| !ident(c));
            let after = text[at + word.len()..]
                .chars()
                .next()
                .is_none_or(|c| !ident(c));
            before && after
        })
    };
    for name in space.params.keys() {
        let read = sources.iter().any(|t| names_word(t, name))
            || expressions.iter().any(|e| names_word(e, name))
            || crate::gpu::fakegpu::DEFINES_THE_DOUBLE_READS.contains(&name.as_str());
        if !read {
            return Err(crate::model::config::config_error_at_key(
                &space.path,
                &space.text,
                &format!("params.{name}"),
                format!(
                    "parameter `{name}` is read by no kernel source ({} and what it includes) and \
                     named by no launch expression: each of its values would build the same kernel",
                    space.family.forward.display()
                ),
            ));
        }
    }
    Ok(())
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
        refuse_unread_parameters(&paths, &space)?;
        let toolchain = build::find_nvcc(&paths.root)?;
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
            confine: None,
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

/// The one rule for "the kernel sources" that figures are matched on: every `.cu`, `.cuh` and `.h`
/// under the forward kernel's folder (`kernels/attention`), named relative to that folder. Run
/// headers (and through them the results store), context packs and profiles all hash with it, so a
/// `tune` at HEAD and a pack built from HEAD's extracted tree agree. `tree_root`: a checkout or an
/// extracted tree holding the project's paths; `None` is the project itself.
pub fn kernel_sources_hash(project: &Project, tree_root: Option<&Path>) -> String {
    let folder = project
        .space
        .family
        .forward
        .parent()
        .unwrap_or(Path::new("kernels"));
    match tree_root {
        Some(root) => sources_hash(&root.join(folder)),
        None => sources_hash(&project.paths.resolve(folder)),
    }
}

/// Hash of every CUDA source a kernel build can see (not the champion table beside them).
fn sources_hash(dir: &Path) -> String {
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
) -> Result<crate::report::roofs::Roofs> {
    let worker_roofs = |log: &runlog::LoadedLog| {
        log.entries.iter().any(|(_, e)| {
            matches!(
                &e.record,
                Record::CeilingMeasured {
                    source: Some(crate::model::vocab::RoofSource::Worker),
                    ..
                }
            )
        })
    };
    if let Some(log) = logged.filter(|l| worker_roofs(l)) {
        return Ok(crate::report::roofs::Roofs::from_log(log));
    }
    let timeout = Duration::from_secs(project.timeouts.worker_s);
    let mut roofs = crate::report::roofs::Roofs::default();
    match executor
        .roofs(device, &project.policies.dtypes, timeout)
        .await
    {
        Ok(measured) => {
            for r in measured {
                match (r.value, r.error) {
                    (Some(value), None) => {
                        roofs.add(r.name, r.dtype, value);
                        events.emit(Record::CeilingMeasured {
                            name: r.name,
                            dtype: r.dtype,
                            value,
                            unit: r.unit,
                            source: Some(crate::model::vocab::RoofSource::Worker),
                            reused_from: None,
                        })?;
                    }
                    (_, error) => events.emit(Record::RoofUnavailable {
                        name: serde_json::to_value(r.name)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
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

/// Free GiB an unprivileged user may still write on the filesystem holding `path` (or its nearest
/// existing parent: `runs/` need not exist yet); `None` when it cannot be read.
pub fn free_gib(path: &Path) -> Option<f64> {
    crate::os::disk::free_bytes(path).map(|b| b as f64 / (1u64 << 30) as f64)
}

/// The folders a run writes to and how much is free under each: runs/, then the build cache.
pub fn disk_room(paths: &ProjectPaths) -> Vec<(&'static str, PathBuf, Option<f64>)> {
    let mut out = vec![("runs/", paths.runs(), free_gib(&paths.runs()))];
    let cache = paths.build_cache();
    out.push(("the build cache", cache.clone(), free_gib(&cache)));
    out
}

pub use crate::os::gpulock::WhenBusy;

/// One run per GPU at a time: a second run on the same GPU refuses with the holder's pid, or waits for it.
pub fn lock_gpus(devices: &[u32], fake: bool, when_busy: WhenBusy) -> Result<Vec<std::fs::File>> {
    if fake {
        return Ok(Vec::new());
    }
    devices
        .iter()
        .map(|&d| crate::os::gpulock::lock_gpu(d, when_busy))
        .collect()
}

/// The header of a run `command` starts.
pub fn header(
    project: &Project,
    device: &DeviceInfo,
    run_id: &str,
    strategy: &Strategy,
    command: runlog::RunCommand,
) -> Header {
    Header {
        schema_version: runlog::SCHEMA_VERSION,
        flashtune_version: env!("CARGO_PKG_VERSION").into(),
        run_id: run_id.to_owned(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        git_head: crate::os::vcs::head(&project.paths.root),
        device: device.clone(),
        toolchain: project.toolchain.clone(),
        policies_hash: short_hash(&crate::model::config::text_for_hash(&project.policies_text)),
        kernel_sources_hash: kernel_sources_hash(project, None),
        space: project.space.name.clone(),
        space_path: project.space.path.clone(),
        space_hash: short_hash(&project.space.identity_text()),
        baseline: project.space.baseline_id(),
        dtypes: project.policies.dtypes.clone(),
        shapes: project.shapes.clone(),
        strategy: strategy.clone(),
        run_seed: None,
        per_shape_dispatch: project.policies.gates.per_shape_dispatch,
        build_jobs: Some(project.jobs() as u32),
        gpus: Vec::new(),
        command: Some(command),
    }
}

/// What the log knows about one built case of this run: enough to run it again.
pub struct LoggedCase {
    pub spec: CaseSpec,
    pub params: crate::model::space::Params,
    /// The KV split the worker chose when it timed this case (`auto` is resolved per shape).
    pub resolved_splits: Option<u32>,
    pub profile: Option<crate::gpu::profile::ProfileOutcome>,
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
                ..
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
    let point = crate::model::space::Variant {
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
        race: None,
    };
    Some(LoggedCase {
        spec,
        params,
        resolved_splits,
        profile,
    })
}

/// Profile one case now: Nsight Compute on a GPU (ncu's report and the parsed metrics under
/// `run_dir/profiles/`), the double's synthetic figures on the fake GPU. `splits`: the KV split the
/// worker chose for an `auto` variant, where known.
#[allow(clippy::too_many_arguments)]
pub async fn profile_now(
    project: &Project,
    device: &DeviceInfo,
    run_dir: &Path,
    variant: &str,
    shape: &Shape,
    dtype: Dtype,
    params: &crate::model::space::Params,
    spec: CaseSpec,
    splits: Option<u32>,
) -> Result<crate::gpu::profile::ProfileOutcome> {
    let launch = spec.forward.launch.clone();
    let policy = &project.policies.profile;
    if device.fake {
        return Ok(crate::gpu::fakegpu::profile(
            policy, params, &launch, shape, device,
        ));
    }
    let request = WorkerRequest::Run(RunRequest {
        measure: MeasureSpec {
            warmup_ms: 0.0,
            samples: 0,
            min_sample_us: 0.0,
            verified_replays: crate::model::config::default_verified_replays(),
        },
        cases: vec![spec],
    });
    let json = serde_json::to_vec(&request).expect("requests serialize");
    let profiles = run_dir.join("profiles");
    std::fs::create_dir_all(&profiles)
        .with_context(|| format!("cannot create {}", profiles.display()))?;
    // A split variant launches forward + combine; otherwise, or when the forward merges its
    // splits itself, the first forward is enough. `auto` is resolved per shape by the worker:
    // the timed record says what it chose.
    let splits = splits.unwrap_or(launch.kv_splits);
    let launches = if splits == 1 || launch.combine_in_forward {
        1
    } else {
        2
    };
    let base = profiles.join(format!("{variant}-{}-{dtype}", shape.name));
    let outcome = crate::gpu::profile::profile(
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
    Ok(outcome)
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
) -> Result<Option<crate::gpu::profile::ProfileOutcome>> {
    let Some(case) = logged_case(project, log, variant, shape, dtype) else {
        return Ok(None);
    };
    if let Some(earlier) = case.profile {
        return Ok(Some(earlier));
    }
    let splits = case.resolved_splits;
    let outcome = profile_now(
        project,
        device,
        run_dir,
        variant,
        shape,
        dtype,
        &case.params,
        case.spec,
        splits,
    )
    .await?;
    events.emit(Record::Profiled {
        variant: variant.to_owned(),
        shape: shape.name.clone(),
        dtype,
        profile: outcome.clone(),
        sources: None,
    })?;
    Ok(Some(outcome))
}
