//! The flags of the commands that run kernels (GPUs, budget, commit, reuse) and what they resolve
//! to: the run's options, its executor and its reporters.
use crate::cli::progress::ProgressReporter;
use crate::error::{Error, Result};
use crate::gpu::executor::Executor;
use crate::model::config::ProjectPaths;
use crate::run::budget::Budget;
use crate::run::engine;
use crate::run::shared::{self, Reporter, TuneOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum ExecutorArg {
    Local,
    Slurm,
}

/// Where and how a command that runs kernels runs them: every such command takes these.
#[derive(clap::Args)]
pub(super) struct GpuArgs {
    /// GPU ordinals to use, one measurement queue each (e.g. 0,1), or `all`; default: every visible GPU.
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::parse::parse_gpu)]
    gpus: Vec<crate::cli::parse::GpuPick>,
    /// Where the workers run: `local`, this host's GPUs; `slurm`, one `srun` job step per worker
    /// (the job's GPUs inside `salloc`/`sbatch`, a job of its own per worker outside one), as
    /// policies.toml's [slurm] says. Builds stay here; the nodes must see the build cache.
    #[arg(long, value_enum, default_value_t = ExecutorArg::Local)]
    executor: ExecutorArg,
    /// With --executor slurm: workers at once, one measurement queue each (default: [slurm] tasks).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    tasks: Option<u32>,
    /// Print every run-log record as a JSON line on stdout instead of progress bars and the table.
    #[arg(long)]
    json: bool,
    /// Use the test double instead of a GPU: synthetic figures, labelled as such everywhere.
    #[arg(long)]
    fake_gpu: bool,
    /// If another flashtune run holds a chosen GPU, wait for it instead of exiting with code 5.
    #[arg(long)]
    wait: bool,
}

/// How much a measuring run may measure.
#[derive(clap::Args)]
pub(super) struct BudgetArgs {
    /// End the run this long after it starts (e.g. 8h, 45m): nothing starts after it (no build,
    /// no variant, no re-duel or profile), and what runs is ended within 10 s; the reports follow.
    #[arg(long, value_parser = humantime::parse_duration)]
    time_limit: Option<Duration>,
    /// Measure at most this many variants (1 or more).
    #[arg(long, value_parser = super::parse::at_least_one)]
    max_variants: Option<usize>,
}

/// Committing a run's champions.
#[derive(clap::Args)]
pub(super) struct CommitArg {
    /// Commit the champion table (kernels/attention/tuned.toml) on branch flashtune/<run-id>
    /// (refused with --fake-gpu: synthetic figures are never committed).
    #[arg(long)]
    commit: bool,
}

/// Taking measurements from the results store (exhaustive and random runs).
#[derive(clap::Args)]
pub(super) struct ReuseArgs {
    /// Take what the results store (runs/results.sqlite) already measured on this GPU model,
    /// driver and nvcc with the same kernel builds, instead of measuring it again; the report marks
    /// each such case with the run and log line it came from. Exhaustive and random runs only.
    #[arg(long)]
    reuse: bool,
    /// With --reuse: measure the N fastest stored cases per shape and dtype again, to confirm them.
    #[arg(long, value_name = "N", requires = "reuse")]
    confirm: Option<usize>,
    /// Time the reference library (PyTorch, FlashAttention-4) again even where the results store
    /// holds its figures for this GPU model, driver and library versions (taken by default, each
    /// citing the run and log line it was measured in).
    #[arg(long)]
    fresh_baselines: bool,
}

/// What every command that runs kernels resolves its flags to; a flag a command does not take
/// (and so cannot be given) reads as its default here.
pub(super) struct RunArgs {
    pub(super) gpus: Vec<u32>,
    executor: ExecutorArg,
    tasks: Option<u32>,
    time_limit: Option<Duration>,
    max_variants: Option<usize>,
    pub(super) json: bool,
    pub(super) fake_gpu: bool,
    commit: bool,
    pub(super) wait: bool,
    reuse: bool,
    confirm: Option<usize>,
    fresh_baselines: bool,
}

impl RunArgs {
    pub(super) fn new(
        gpu: &GpuArgs,
        budget: Option<&BudgetArgs>,
        commit: Option<&CommitArg>,
        reuse: Option<&ReuseArgs>,
    ) -> Self {
        RunArgs {
            gpus: crate::cli::parse::ordinals(&gpu.gpus),
            executor: gpu.executor,
            tasks: gpu.tasks,
            time_limit: budget.and_then(|b| b.time_limit),
            max_variants: budget.and_then(|b| b.max_variants),
            json: gpu.json,
            fake_gpu: gpu.fake_gpu,
            commit: commit.is_some_and(|c| c.commit),
            wait: gpu.wait,
            reuse: reuse.is_some_and(|r| r.reuse),
            confirm: reuse.and_then(|r| r.confirm),
            fresh_baselines: reuse.is_some_and(|r| r.fresh_baselines),
        }
    }
}

impl RunArgs {
    pub(super) fn options(
        &self,
        paths: ProjectPaths,
        space: Option<PathBuf>,
    ) -> Result<TuneOptions> {
        let (policies, _) = crate::model::config::Policies::load(&paths.policies())?;
        if self.tasks.is_some() && self.executor != ExecutorArg::Slurm {
            return Err(Error::BadInput(
                "--tasks sets how many Slurm workers run: it needs --executor slurm (local runs pick GPUs with --gpus)".into(),
            ));
        }
        let probe = Duration::from_secs(PROBE_TIMEOUT_S);
        let arch = &policies.build.default_arch;
        let executor = match (self.executor, self.fake_gpu) {
            (ExecutorArg::Slurm, fake) => {
                let srun = crate::gpu::slurm::Srun {
                    tasks: self.tasks.unwrap_or(policies.slurm.tasks),
                    gres: !fake,
                    policy: policies.slurm.clone(),
                };
                Executor::slurm(probe, fake.then_some(arch.as_str()), srun)
            }
            (ExecutorArg::Local, true) => Executor::fake(probe, arch),
            (ExecutorArg::Local, false) => Executor::subprocess(probe),
        };
        let executor = executor.map_err(|e| Error::Other(e.into()))?;
        let budget = Budget {
            max_variants: self.max_variants,
            time_limit: self.time_limit,
            // Restarted by the engine with the run's log.
            clock: Some(std::time::Instant::now()),
        };
        Ok(TuneOptions {
            paths,
            space,
            executor,
            devices: self.gpus.clone(),
            budget,
            commit: self.commit,
            strategy: crate::model::plan::Strategy::Exhaustive,
            run: shared::RunState::default(),
            when_busy: when_busy(self.wait),
            reuse: self.reuse.then_some(crate::run::shared::Reuse {
                confirm: self.confirm.unwrap_or(0),
            }),
            fresh_baselines: self.fresh_baselines,
        })
    }

    pub(super) fn reporters(&self) -> Vec<Box<dyn Reporter>> {
        if self.json {
            vec![Box::new(JsonLines)]
        } else {
            vec![Box::new(ProgressReporter::new())]
        }
    }

    pub(super) fn finish(&self, outcome: engine::TuneOutcome) -> ExitCode {
        if !self.json {
            crate::say!("{}", outcome.summary);
            crate::say!(
                "Full report: {} (and report.html, .csv, .json, .t4.json beside it)",
                outcome.run_dir.join("report.md").display()
            );
            crate::say!("Run log: {}", outcome.run_dir.join("log.jsonl").display());
            if outcome.interrupted {
                let id = outcome.run_dir.file_name().unwrap_or_default();
                crate::say!("Resume it with: flashtune resume {}", id.to_string_lossy());
            }
        }
        if outcome.interrupted {
            // 128 + the signal, as the shell reports a process it killed: 130 Ctrl-C, 143 SIGTERM.
            ExitCode::from(crate::os::stop::exit_code())
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// The flags of a whole run, `tune`'s and those `resume` takes for the run it continues: GPUs,
/// budget, commit and reuse.
#[derive(clap::Args)]
pub(super) struct FullRunArgs {
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    commit: CommitArg,
    #[command(flatten)]
    reuse: ReuseArgs,
}

impl From<&FullRunArgs> for RunArgs {
    fn from(a: &FullRunArgs) -> Self {
        RunArgs::new(&a.gpu, Some(&a.budget), Some(&a.commit), Some(&a.reuse))
    }
}

impl From<&GpuArgs> for RunArgs {
    fn from(a: &GpuArgs) -> Self {
        RunArgs::new(a, None, None, None)
    }
}

pub(super) fn when_busy(wait: bool) -> shared::WhenBusy {
    if wait {
        shared::WhenBusy::Wait
    } else {
        shared::WhenBusy::Refuse
    }
}

/// The worker double with `--fake-gpu`, else the GPU worker.
pub(super) fn executor(
    fake_gpu: bool,
    policies: &crate::model::config::Policies,
) -> Result<Executor> {
    let probe = Duration::from_secs(PROBE_TIMEOUT_S);
    if fake_gpu {
        Executor::fake(probe, &policies.build.default_arch)
    } else {
        Executor::subprocess(probe)
    }
    .map_err(|e| Error::Other(e.into()))
}

/// A probe creates a context and runs one tiny kernel; a minute means the GPU or driver is stuck.
const PROBE_TIMEOUT_S: u64 = 60;

/// `--json`: the run log's records, as they happen, for scripts.
struct JsonLines;

impl Reporter for JsonLines {
    fn on_entry(&mut self, entry: &crate::log::runlog::Entry) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if serde_json::to_writer(&mut out, entry).is_ok() {
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
    }
}
