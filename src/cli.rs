//! Command-line interface: parses arguments, runs a command, maps errors to exit codes.
use crate::config::ProjectPaths;
use crate::engine;
use crate::error::{exit_code, Error, Result};
use crate::executor::Executor;
use crate::plan::Strategy;
use crate::progress::ProgressReporter;
use crate::run::{self, Budget, Project, Reporter, TuneOptions};
use clap::{Parser, Subcommand};
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "flashtune",
    version,
    about = "Tune CUDA attention kernels unattended: build, check, time, report."
)]
struct Cli {
    /// Project root (holds policies.toml, kernels/, variants/, runs/).
    #[arg(long, global = true, default_value = ".")]
    root: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan, build, check and time a variant space on the GPU; writes runs/<id>/log.jsonl and report.md.
    ///
    /// The shapes are policies.toml's [[shapes]] (those the space names). A causal shape states its
    /// alignment: `causal = "top-left"` (or `true`) lets query i see keys j <= i, as PyTorch's
    /// is_causal; `causal = "bottom-right"` lets it see keys j <= i + Sk - Sq, as FlashAttention >= 2.1
    /// and PyTorch's causal_lower_right (decoding with a KV cache: the last query sees every key).
    /// With Sq > Sk, bottom-right leaves the first Sq - Sk rows no key: their O is 0 and LSE -inf.
    /// TF/s counts exactly the (query, key) pairs the mask admits: 4 * B * H * D * pairs.
    Tune {
        /// Variant space (default: `default_space` in policies.toml).
        #[arg(long)]
        space: Option<PathBuf>,
        /// exhaustive: every valid point; random: --sample points; guided: start point, then the
        /// neighbours policies.toml's [guided] rules propose from each champion's ncu bottleneck.
        #[arg(long, value_enum, default_value_t = StrategyArg::Exhaustive)]
        strategy: StrategyArg,
        /// Points drawn by --strategy random.
        #[arg(long, default_value_t = 16)]
        sample: usize,
        /// Seed of --strategy random.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        run: TuneArgs,
    },
    /// One factor at a time around a run's champion: reset each parameter to the baseline's value, measure, rank.
    Ablate {
        /// The run whose champion is ablated: its folder (runs/20261122-031500-ab12) or its id.
        run_dir: PathBuf,
        /// Ablate around this variant instead of the best geometric mean over the run's shapes.
        #[arg(long)]
        variant: Option<String>,
        #[command(flatten)]
        run: AblateArgs,
    },
    /// Profile one variant of a run under Nsight Compute now; the result joins the run's log.
    Profile {
        /// The run the variant was built and timed in: its folder or its id.
        run_dir: PathBuf,
        /// Variant id, as in the report (e.g. mma-bm128-bn64-w4-auto-s2).
        variant: String,
        /// Only these shapes (default: every shape of the run).
        #[arg(long, value_delimiter = ',')]
        shape: Vec<String>,
        /// Only these dtypes (default: [profile] dtypes).
        #[arg(long, value_delimiter = ',', value_parser = parse_dtype)]
        dtype: Vec<crate::config::Dtype>,
        #[command(flatten)]
        run: GpuArgs,
    },
    /// Continue a crashed or interrupted run from its log: finished variants are not redone.
    Resume {
        /// The run folder (runs/20261122-031500-ab12) or the run id `tune` printed (20261122-031500-ab12).
        run_dir: PathBuf,
        /// Resume even if the GPU, nvcc, kernel sources or policies changed (logged as overridden).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        run: ResumeArgs,
    },
    /// Compile and gate every variant of a space without a GPU, and print the resource table.
    Build {
        /// Variant space (default: `default_space` in policies.toml).
        #[arg(long)]
        space: Option<PathBuf>,
        /// Only a covering sample: per (MMA path, head dim) the points at the extremes of shared
        /// memory and per-thread work, and enough others that every value of every parameter is
        /// built once (a gate that takes a minute, not ten).
        #[arg(long)]
        covering: bool,
        /// nvcc target, e.g. sm_89 (default: policies.toml's build.default_arch). Points are ruled
        /// out with that target's limits from policies.toml's [build.targets.<arch>].
        #[arg(long)]
        arch: Option<String>,
    },
    /// Rebuild a run's reports from its log (report.md, .html, .csv, .json, .t4.json) and print the Markdown.
    Report {
        /// The run folder (runs/20261122-031500-ab12) or the run id `tune` printed (20261122-031500-ab12); its log.jsonl, else log.jsonl.gz.
        run: PathBuf,
    },
    /// Judge the uncommitted edits under kernels/ against HEAD's champion: commit them if faster, else restore HEAD.
    ///
    /// HEAD's champion, per shape and dtype: the variant kernels/attention/tuned.toml names at HEAD;
    /// where it names none, --variant; else the space's last chain step, or its first variant. The
    /// edit is built with the same parameters from the working tree, HEAD's side from HEAD's tree.
    /// Both are checked against HEAD's fp32 reference on fresh inputs with poisoned outputs, then
    /// timed interleaved (A B A B ...) on every shape of the space and every policy dtype. The edit
    /// is committed (trailers Flashtune-Step, -Speedup, -GPU) only if its geomean gain beats
    /// [step] threshold and the median noise, and no case is slower by more than its noise or the
    /// threshold; otherwise its files are restored to HEAD. The reference kernel and tuned.toml are
    /// not editable. Writes runs/<id>/log.jsonl and a Markdown report per step.
    Step {
        /// Variant space (default: `default_space` in policies.toml); its shapes are the cases judged.
        #[arg(long)]
        space: Option<PathBuf>,
        /// The champion variant where HEAD's champion table names none.
        #[arg(long)]
        variant: Option<String>,
        /// Shell command run before each step to edit kernels/ (e.g. an agent). It gets FLASHTUNE_STEP,
        /// FLASHTUNE_LAST_VERDICT, FLASHTUNE_LAST_REASON, FLASHTUNE_LAST_REPORT, FLASHTUNE_RUN_DIR.
        /// Its changes outside kernels/ are undone and reject the step; an edit it leaves after a non-zero
        /// exit or a timeout ([step] proposer_timeout_s) is restored unjudged; a commit of its own is
        /// undone and stops the run, as does any change to the run folder. Exit code 0 whether edits
        /// were kept or not.
        #[arg(long)]
        proposer: Option<String>,
        /// Steps to run (needs --proposer above 1).
        #[arg(long, default_value_t = 1)]
        steps: u32,
        /// Start no new step after this long (e.g. 2h).
        #[arg(long, value_parser = humantime::parse_duration)]
        time_limit: Option<Duration>,
        /// GPU ordinal.
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        /// Use the test double instead of a GPU: synthetic figures, labelled as such.
        #[arg(long)]
        fake_gpu: bool,
        /// If another flashtune run holds the GPU, wait for it instead of exiting with code 5.
        #[arg(long)]
        wait: bool,
        /// Run a coding agent named in policies.toml's [agents] (claude, codex, gemini, aider, or
        /// your own) as the proposer: an agent session. Each candidate works in its own git worktree
        /// of HEAD holding AGENTS.md, PROMPT.md and context/ (figures, bottleneck, history, budget);
        /// the best accepted candidate is committed, every candidate and its cost is logged.
        /// `--proposer CMD` with --candidates runs CMD the same way (placeholders as in [agents]).
        #[arg(long)]
        agent: Option<String>,
        /// Candidates per step, side by side (an agent session; default 1 with --agent).
        #[arg(long)]
        candidates: Option<u32>,
        /// Agent sessions: start no step once the agents' reported dollars reach this.
        #[arg(long)]
        max_cost_usd: Option<f64>,
        /// Agent sessions: stop once every case's champion reaches this fraction of its binding
        /// measured roof (matmul or bandwidth), e.g. 0.9.
        #[arg(long)]
        stop_at_roof: Option<f64>,
        /// Agent sessions: stop after this many steps in a row with nothing accepted.
        #[arg(long)]
        patience: Option<u32>,
        /// Print one JSON document for the whole run when it ends (per step: its verdict, reason,
        /// commit, changed files and the attempts judged) instead of each step's report; an error as
        /// `{"schema_version", "error": {...}}`, with the same exit code.
        #[arg(long)]
        json: bool,
    },
    /// Judge the working tree's edit under kernels/ once, as `step` does (commit or restore), and print the verdict.
    ///
    /// The edit is kept as a patch (runs/<id>/attempts/1.patch; `flashtune show-attempt` gives it
    /// back) and joins the history with its idea and verdict, accepted or not.
    Judge {
        /// Variant space whose shapes are the cases judged (default: `default_space` in policies.toml).
        #[arg(long)]
        space: Option<PathBuf>,
        /// The champion variant where HEAD's champion table names none.
        #[arg(long)]
        variant: Option<String>,
        /// GPU ordinal.
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        /// Use the test double instead of a GPU: synthetic figures, and an accepted edit goes to
        /// refs/flashtune/fake/<run>/step-1, never to your branch.
        #[arg(long)]
        fake_gpu: bool,
        /// If another flashtune run holds the GPU, wait for it instead of exiting with code 5.
        #[arg(long)]
        wait: bool,
        /// What the edit tries, in one line: its entry in the history later attempts read.
        #[arg(long)]
        idea: Option<String>,
        /// Print the verdict as JSON (an error as `{"schema_version", "error": {...}}`, with the
        /// same exit code).
        #[arg(long)]
        json: bool,
    },
    /// Print an earlier attempt's patch (ready for `git apply`), or the whole attempt with --json.
    ShowAttempt {
        /// `<run id>/<step>` or `<run id>/<step>.<candidate>`, as `flashtune history` lists them.
        id: String,
        /// Print the attempt (idea, verdict, reason, per-case figures, metrics, whole patch) as JSON
        /// (an error as `{"schema_version", "error": {...}}`, with the same exit code).
        #[arg(long)]
        json: bool,
    },
    /// The context pack for the next step at HEAD: champion figures, bottleneck, roofs, history (from the run logs).
    Context {
        /// Variant space whose shapes the pack covers (default: `default_space` in policies.toml).
        #[arg(long)]
        space: Option<PathBuf>,
        /// The champion variant where HEAD's champion table names none.
        #[arg(long)]
        variant: Option<String>,
        /// Print the pack as JSON (default: PROMPT.md); an error as `{"schema_version", "error":
        /// {...}}`, with the same exit code.
        #[arg(long)]
        json: bool,
        /// Also write AGENTS.md, PROMPT.md and context/ into this folder.
        #[arg(long)]
        write: Option<PathBuf>,
    },
    /// How a shape's champion moved across runs and commits, from the results store (runs/results.sqlite).
    ///
    /// One row per run and dtype: when it ran, the git commit it ran at, the GPU, its fastest variant
    /// on the shape, µs and TF/s, and what changed against the run before it on the same GPU model.
    /// A figure a run reused names the run it was measured in. `flashtune report <run>` adds a run
    /// that is not in the store yet (one from before the store, or one copied from elsewhere).
    ///
    /// Without a shape: every step and agent candidate tried on this project (from the run logs),
    /// with its diff summary, verdict, reason, figures and cost.
    History {
        /// A shape of policies.toml (matched by its geometry, so a renamed shape keeps its history),
        /// or a name the store knows.
        shape: Option<String>,
        /// Print as JSON: `{"schema_version", "total", "steps": [...]}` without a shape,
        /// `{"schema_version", "shape", "rows": [...]}` with one; an error as `{"schema_version",
        /// "error": {...}}`, with the same exit code.
        #[arg(long)]
        json: bool,
        /// Only this dtype (with a shape).
        #[arg(long, value_parser = parse_dtype)]
        dtype: Option<crate::config::Dtype>,
        /// Only the latest N attempts (without a shape).
        #[arg(long)]
        last: Option<usize>,
    },
    /// Serve judge, profile, history and context as MCP tools on stdin/stdout, for coding agents.
    ///
    /// `judge` runs `flashtune step` on the working tree's edit (commit or restore, as step does);
    /// a call waits up to 45 s for the verdict, sending progress notifications, then returns a job
    /// id that `judge_status` polls. `flashtune mcp print-config --agent NAME` prints the snippet
    /// that registers this server with Claude Code, Codex, Gemini CLI or Cursor.
    Mcp {
        /// Judge and profile on the test double instead of a GPU: synthetic figures, labelled as such.
        #[arg(long)]
        fake_gpu: bool,
        #[command(subcommand)]
        action: Option<McpAction>,
    },
    /// Check the toolchain, GPU, profiler, repository and disk.
    Doctor,
    /// Find nvcc the way every command does (FLASHTUNE_NVCC, PATH, CUDA_HOME, CUDA_PATH,
    /// /usr/local/cuda, then .tools/cuda) and prove it compiles a kernel; when none is found,
    /// install the pinned compiler (scripts/cuda-requirements.txt) from PyPI into .tools/cuda.
    Setup {
        /// The target the proof compiles for (default: policies.toml's default_arch).
        #[arg(long)]
        arch: Option<String>,
    },
    /// Runs `sh -c COMMAND` in its own process group and kills that group when flashtune dies (used
    /// by step and agent sessions for proposers and agents).
    #[command(hide = true)]
    Guard {
        /// The shell command.
        #[arg(last = true)]
        command: String,
    },
    /// The GPU worker process (used by tune): serves JSON requests, one per line on stdin, for one GPU.
    #[command(hide = true)]
    Worker {
        /// GPU ordinal this worker serves.
        #[arg(long, default_value_t = 0)]
        device: u32,
        /// Be the GPU-less test double for this target arch.
        #[arg(long)]
        fake: Option<String>,
        /// Started as a Slurm job step (`--executor slurm`): lock the step's GPUs on this node.
        #[arg(long)]
        slurm_step: bool,
    },
}

#[derive(Subcommand)]
enum McpAction {
    /// Print the snippet that registers `flashtune mcp` for this project with an agent (stdout;
    /// the file it belongs in goes to stderr), with the absolute paths of this binary and project.
    PrintConfig {
        #[arg(long, value_enum)]
        agent: AgentArg,
        /// The server the snippet starts judges on the test double.
        #[arg(long)]
        fake_gpu: bool,
        /// Merge the snippet into the agent's config file instead of printing it: the `flashtune`
        /// server entry is added or replaced, everything else in the file is kept.
        #[arg(long)]
        write: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AgentArg {
    Claude,
    Codex,
    Gemini,
    Cursor,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StrategyArg {
    Exhaustive,
    Random,
    Guided,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum ExecutorArg {
    Local,
    Slurm,
}

/// Where and how a command that runs kernels runs them: every such command takes these.
#[derive(clap::Args)]
struct GpuArgs {
    /// GPU ordinals to use, one measurement queue each (e.g. 0,1); default: every visible GPU.
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<u32>,
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
struct BudgetArgs {
    /// Stop starting new measurements after this long (e.g. 8h, 45m).
    #[arg(long, value_parser = humantime::parse_duration)]
    time_limit: Option<Duration>,
    /// Measure at most this many variants.
    #[arg(long)]
    max_variants: Option<usize>,
}

/// Committing a run's champions.
#[derive(clap::Args)]
struct CommitArg {
    /// Commit the champion table (kernels/attention/tuned.toml) on branch flashtune/<run-id>
    /// (refused with --fake-gpu: synthetic figures are never committed).
    #[arg(long)]
    commit: bool,
}

/// Taking measurements from the results store (exhaustive and random runs).
#[derive(clap::Args)]
struct ReuseArgs {
    /// Take what the results store (runs/results.sqlite) already measured on this GPU model,
    /// driver and nvcc with the same kernel builds, instead of measuring it again; the report marks
    /// each such case with the run and log line it came from. Exhaustive and random runs only.
    #[arg(long)]
    reuse: bool,
    /// With --reuse: measure the N fastest stored cases per shape and dtype again, to confirm them.
    #[arg(long, value_name = "N", requires = "reuse")]
    confirm: Option<usize>,
}

/// `tune`'s flags: all of them.
#[derive(clap::Args)]
struct TuneArgs {
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    commit: CommitArg,
    #[command(flatten)]
    reuse: ReuseArgs,
}

/// `ablate`'s flags: an ablation measures a chain of its own, so it takes nothing from the store.
#[derive(clap::Args)]
struct AblateArgs {
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    commit: CommitArg,
}

/// `resume`'s flags: those of the run it continues, which keeps its own space and strategy.
#[derive(clap::Args)]
struct ResumeArgs {
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    commit: CommitArg,
    #[command(flatten)]
    reuse: ReuseArgs,
}

/// What every command that runs kernels resolves its flags to; a flag a command does not take
/// (and so cannot be given) reads as its default here.
struct RunArgs {
    gpus: Vec<u32>,
    executor: ExecutorArg,
    tasks: Option<u32>,
    time_limit: Option<Duration>,
    max_variants: Option<usize>,
    json: bool,
    fake_gpu: bool,
    commit: bool,
    wait: bool,
    reuse: bool,
    confirm: Option<usize>,
}

impl RunArgs {
    fn new(
        gpu: &GpuArgs,
        budget: Option<&BudgetArgs>,
        commit: Option<&CommitArg>,
        reuse: Option<&ReuseArgs>,
    ) -> Self {
        RunArgs {
            gpus: gpu.gpus.clone(),
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
        }
    }
}

impl From<&TuneArgs> for RunArgs {
    fn from(a: &TuneArgs) -> Self {
        RunArgs::new(&a.gpu, Some(&a.budget), Some(&a.commit), Some(&a.reuse))
    }
}

impl From<&AblateArgs> for RunArgs {
    fn from(a: &AblateArgs) -> Self {
        RunArgs::new(&a.gpu, Some(&a.budget), Some(&a.commit), None)
    }
}

impl From<&ResumeArgs> for RunArgs {
    fn from(a: &ResumeArgs) -> Self {
        RunArgs::new(&a.gpu, Some(&a.budget), Some(&a.commit), Some(&a.reuse))
    }
}

impl From<&GpuArgs> for RunArgs {
    fn from(a: &GpuArgs) -> Self {
        RunArgs::new(a, None, None, None)
    }
}

impl RunArgs {
    fn options(&self, paths: ProjectPaths, space: Option<PathBuf>) -> Result<TuneOptions> {
        let (policies, _) = crate::config::Policies::load(&paths.policies())?;
        if self.tasks.is_some() && self.executor != ExecutorArg::Slurm {
            return Err(Error::BadInput(
                "--tasks sets how many Slurm workers run: it needs --executor slurm (local runs pick GPUs with --gpus)".into(),
            ));
        }
        let probe = Duration::from_secs(PROBE_TIMEOUT_S);
        let arch = &policies.build.default_arch;
        let executor = match (self.executor, self.fake_gpu) {
            (ExecutorArg::Slurm, fake) => {
                let srun = crate::slurm::Srun {
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
        };
        Ok(TuneOptions {
            paths,
            space,
            executor,
            devices: self.gpus.clone(),
            budget,
            commit: self.commit,
            strategy: crate::plan::Strategy::Exhaustive,
            run: run::RunState::default(),
            when_busy: when_busy(self.wait),
            reuse: self.reuse.then_some(crate::run::Reuse {
                confirm: self.confirm.unwrap_or(0),
            }),
        })
    }

    fn reporters(&self) -> Vec<Box<dyn Reporter>> {
        if self.json {
            vec![Box::new(JsonLines)]
        } else {
            vec![Box::new(ProgressReporter::new())]
        }
    }

    fn finish(&self, outcome: engine::TuneOutcome) -> ExitCode {
        if !self.json {
            println!("{}", outcome.summary);
            println!(
                "Full report: {} (and report.html, .csv, .json, .t4.json beside it)",
                outcome.run_dir.join("report.md").display()
            );
            println!("Run log: {}", outcome.run_dir.join("log.jsonl").display());
        }
        if outcome.interrupted {
            // 128 + the signal, as the shell reports a process it killed: 130 Ctrl-C, 143 SIGTERM.
            ExitCode::from(crate::stop::exit_code())
        } else {
            ExitCode::SUCCESS
        }
    }
}

fn when_busy(wait: bool) -> run::WhenBusy {
    if wait {
        run::WhenBusy::Wait
    } else {
        run::WhenBusy::Refuse
    }
}

fn parse_dtype(s: &str) -> std::result::Result<crate::config::Dtype, String> {
    match s {
        "f16" => Ok(crate::config::Dtype::F16),
        "bf16" => Ok(crate::config::Dtype::Bf16),
        other => Err(format!("unknown dtype `{other}` (f16 or bf16)")),
    }
}

/// The worker double with `--fake-gpu`, else the GPU worker.
fn executor(fake_gpu: bool, policies: &crate::config::Policies) -> Result<Executor> {
    let probe = Duration::from_secs(PROBE_TIMEOUT_S);
    if fake_gpu {
        Executor::fake(probe, &policies.build.default_arch)
    } else {
        Executor::subprocess(probe)
    }
    .map_err(|e| Error::Other(e.into()))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Other(e.into()))
}

/// A `--json` command's one answer (issue 43, item 5): the document on stdout and exit code 0, or
/// the error document on stdout, the message on stderr and the error's exit code.
fn answer_json<T: serde::Serialize>(result: Result<T>) -> Result<ExitCode> {
    answer_json_with(result.map(|doc| (doc, ExitCode::SUCCESS)))
}

/// [`answer_json`] for a document that comes with its own exit code.
fn answer_json_with<T: serde::Serialize>(result: Result<(T, ExitCode)>) -> Result<ExitCode> {
    match result.and_then(|(doc, code)| Ok((to_json(&doc)?, code))) {
        Ok((doc, code)) => {
            println!("{doc}");
            Ok(code)
        }
        Err(e) => answer_json_error(&e),
    }
}

/// A `--json` command's error: `{"schema_version", "error": {"code", "message", "exit_code"}}` on
/// stdout (a script reading stdout gets the code and message), the message on stderr.
fn answer_json_error(e: &Error) -> Result<ExitCode> {
    let doc = crate::agent::error_document(
        crate::agent::error_code(e),
        &e.to_string(),
        serde_json::json!({ "exit_code": e.exit_code() }),
    );
    println!("{}", to_json(&doc)?);
    eprintln!("error: {e}");
    Ok(ExitCode::from(e.exit_code()))
}

/// An agent session's last words: the summary and where its log is.
fn session_finished(outcome: &crate::agent::SessionOutcome) -> ExitCode {
    print!("{}", session_finished_text(outcome));
    ExitCode::SUCCESS
}

fn session_finished_text(outcome: &crate::agent::SessionOutcome) -> String {
    format!(
        "{}\n{} steps, {} committed{}. Run log: {}\n",
        outcome.summary,
        outcome.steps,
        outcome.committed,
        outcome
            .stopped
            .as_ref()
            .map_or(String::new(), |s| format!(", stopped: {s}")),
        outcome.run_dir.join("log.jsonl").display()
    )
}

/// A probe creates a context and runs one tiny kernel; a minute means the GPU or driver is stuck.
const PROBE_TIMEOUT_S: u64 = 60;

/// `--json`: the run log's records, as they happen, for scripts.
struct JsonLines;

impl Reporter for JsonLines {
    fn on_entry(&mut self, entry: &crate::runlog::Entry) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if serde_json::to_writer(&mut out, entry).is_ok() {
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
    }
}

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Guard { command } = &cli.command {
        return crate::stop::guard(command);
    }
    crate::toolchain::absolutize_override();
    if let Command::Worker {
        device,
        fake,
        slurm_step,
    } = &cli.command
    {
        return match fake {
            // The double touches no GPU: nothing to lock.
            Some(arch) => crate::fakegpu::serve(arch, *device),
            None => crate::worker::serve(*device, *slurm_step),
        };
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLASHTUNE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit_code::FAILURE);
        }
    };
    let code = match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    };
    // Whatever path the run took out (an error, a signal), no worker, nvcc or ncu outlives it:
    // its tasks are stopped (and with them what they would start next), then every child group.
    crate::stop::kill_children();
    runtime.shutdown_timeout(Duration::from_secs(2));
    crate::stop::kill_children();
    code
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let paths = ProjectPaths::new(cli.root.clone());
    match cli.command {
        Command::Tune {
            space,
            strategy,
            sample,
            seed,
            run,
        } => {
            let run = RunArgs::from(&run);
            let strategy = match strategy {
                StrategyArg::Exhaustive => Strategy::Exhaustive,
                StrategyArg::Random => Strategy::Random {
                    count: sample,
                    seed,
                },
                StrategyArg::Guided => Strategy::Guided,
            };
            let opts = TuneOptions {
                strategy,
                ..run.options(paths, space)?
            };
            let outcome = engine::tune(opts, run.reporters()).await?;
            Ok(run.finish(outcome))
        }
        Command::Ablate {
            run_dir,
            variant,
            run,
        } => {
            let run = RunArgs::from(&run);
            let run_dir = engine::resolve_run_dir(&paths, &run_dir)?;
            let outcome = engine::ablate(
                run.options(paths, None)?,
                &run_dir,
                variant.as_deref(),
                run.reporters(),
            )
            .await?;
            Ok(run.finish(outcome))
        }
        Command::Profile {
            run_dir,
            variant,
            shape,
            dtype,
            run,
        } => {
            let run = RunArgs::from(&run);
            let profiled = async {
                let run_dir = engine::resolve_run_dir(&paths, &run_dir)?;
                let results = engine::profile_on_demand(
                    run.options(paths, None)?,
                    &run_dir,
                    &variant,
                    &shape,
                    &dtype,
                )
                .await?;
                let (log, header) = engine::read_run(&run_dir)?;
                Ok((run_dir, results, log, header))
            }
            .await;
            let (run_dir, results, log, header) = match profiled {
                Ok(p) => p,
                Err(e) if run.json => return answer_json_error(&e),
                Err(e) => return Err(e),
            };
            let line_of = |shape: &str, dtype: crate::config::Dtype| {
                log.entries
                    .iter()
                    .rev()
                    .find_map(|(line, e)| match &e.record {
                        crate::runlog::Record::Profiled {
                            variant: v,
                            shape: s,
                            dtype: d,
                            ..
                        } if v == &variant && s == shape && *d == dtype => Some(*line),
                        _ => None,
                    })
            };
            let profiled = results
                .iter()
                .filter(|(_, _, o)| {
                    matches!(o, Some(crate::profile::ProfileOutcome::Profiled { .. }))
                })
                .count();
            let code = if profiled == 0 {
                ExitCode::from(exit_code::FAILURE)
            } else {
                ExitCode::SUCCESS
            };
            if run.json {
                let profiles: Vec<serde_json::Value> = results
                    .iter()
                    .map(|(shape, dtype, outcome)| {
                        serde_json::json!({
                            "shape": shape,
                            "dtype": dtype,
                            "log_line": line_of(shape, *dtype),
                            "profile": outcome,
                        })
                    })
                    .collect();
                let doc = serde_json::json!({
                    "schema_version": crate::pack::JSON_SCHEMA_VERSION,
                    "run": header.run_id,
                    "variant": variant,
                    "synthetic": header.device.fake,
                    "profiles": profiles,
                });
                return answer_json_with(Ok((doc, code)));
            }
            for (shape, dtype, outcome) in &results {
                let Some(outcome) = outcome else {
                    println!(
                        "{variant} {shape} {dtype}: not built in this run, nothing to profile"
                    );
                    continue;
                };
                let line = line_of(shape, *dtype);
                println!(
                    "{variant} {shape} {dtype}: {}",
                    crate::report::profile_summary(outcome, line.unwrap_or(0))
                );
            }
            println!("Logged in {}", run_dir.join("log.jsonl").display());
            Ok(code)
        }
        Command::Resume {
            run_dir,
            force,
            run,
        } => {
            let run = RunArgs::from(&run);
            let run_dir = engine::resolve_run_dir(&paths, &run_dir)?;
            if crate::agent::is_agent_session(&run_dir) {
                if run.json {
                    return Err(Error::BadInput(
                        "--json streams a tune run's records; an agent session writes ledger.json and summary.md in its run folder instead".into(),
                    ));
                }
                let (policies, _) = crate::config::Policies::load(&paths.policies())?;
                let outcome = crate::agent::resume(
                    crate::agent::ResumeOptions {
                        paths,
                        device: run.gpus.first().copied().unwrap_or(0),
                        executor: executor(run.fake_gpu, &policies)?,
                        when_busy: when_busy(run.wait),
                    },
                    &run_dir,
                )
                .await?;
                return Ok(session_finished(&outcome));
            }
            let outcome =
                engine::resume(run.options(paths, None)?, run_dir, force, run.reporters()).await?;
            Ok(run.finish(outcome))
        }
        Command::Build {
            space,
            arch,
            covering,
        } => {
            let project = Project::load(paths, space.as_deref())?;
            let (planned, rows) = engine::build_space(&project, arch.as_deref(), covering).await?;
            let (table, failures) = build_table(&planned, &rows);
            println!("{table}");
            if failures > 0 {
                eprintln!("{failures} build(s) failed or were rejected by the gates");
                return Ok(ExitCode::from(exit_code::FAILURE));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { run } => {
            let run = engine::resolve_run_dir(&paths, &run)?;
            // Refused before anything is written: a bad log must not replace good reports.
            let (log, _) = engine::read_run(&run)?;
            // A run from before the store joins it here, if its log is sealed: reports read any
            // log, the store (what --reuse and the best-first order take) only what flashtune wrote.
            let store_path = crate::store::path(&paths);
            let stored =
                crate::runlog::read_sealed(&crate::runlog::path_in(&run)).and_then(|sealed| {
                    crate::store::Store::open(&store_path)
                        .and_then(|mut store| crate::store::backfill(&mut store, &sealed))
                });
            if let Err(e) = stored {
                eprintln!("warning: run not added to the results store: {e:#}");
            }
            let out = report_folder(&paths, &run);
            std::fs::create_dir_all(&out).map_err(|e| {
                Error::Other(anyhow::anyhow!("cannot create {}: {e}", out.display()))
            })?;
            let md = crate::export::write_all(&out, &log).map_err(|e| {
                Error::Other(anyhow::anyhow!(
                    "cannot write the reports in {}: {e}",
                    out.display()
                ))
            })?;
            println!("{md}");
            println!(
                "Wrote report.md, report.html, report.csv, report.json and report.t4.json in {}",
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Step {
            space,
            variant,
            proposer,
            steps,
            time_limit,
            gpu,
            fake_gpu,
            wait,
            agent,
            candidates,
            max_cost_usd,
            stop_at_roof,
            patience,
            json,
        } => {
            // The run folder, the stop rule that ended an agent session early, and the last words.
            let ran = async {
                let (policies, _) = crate::config::Policies::load(&paths.policies())?;
                let executor = executor(fake_gpu, &policies)?;
                let session_only =
                    max_cost_usd.is_some() || stop_at_roof.is_some() || patience.is_some();
                if agent.is_none() && candidates.is_none() && session_only {
                    return Err(Error::BadInput(
                        "--max-cost-usd, --stop-at-roof and --patience rule agent sessions: add --agent NAME, or --candidates N with --proposer CMD".into(),
                    ));
                }
                let opts = crate::step::StepOptions {
                    paths,
                    space,
                    variant,
                    proposer: proposer.clone(),
                    steps,
                    time_limit,
                    device: gpu,
                    executor,
                    when_busy: when_busy(wait),
                    // With --json, stdout holds the one document: no step report as it ends.
                    quiet: json,
                    idea: None,
                };
                if agent.is_some() || candidates.is_some() {
                    let named = crate::agent::AgentOptions::named(
                        &policies,
                        agent.as_deref(),
                        proposer.as_deref(),
                    )?;
                    let outcome = crate::agent::session(
                        opts,
                        crate::agent::AgentOptions {
                            candidates: candidates.unwrap_or(1),
                            max_cost_usd,
                            stop_at_roof,
                            patience,
                            ..named
                        },
                    )
                    .await?;
                    let text = session_finished_text(&outcome);
                    return Ok((outcome.run_dir, outcome.stopped, text));
                }
                let outcome = crate::step::step(opts).await?;
                let text = format!(
                    "{} accepted, {} rejected. Run log: {}\n",
                    outcome.accepted,
                    outcome.rejected,
                    outcome.run_dir.join("log.jsonl").display()
                );
                Ok((outcome.run_dir, None, text))
            }
            .await;
            if json {
                return answer_json(ran.and_then(|(run_dir, stopped, _)| {
                    crate::agent::step_run_from_log(&run_dir, stopped)
                }));
            }
            print!("{}", ran?.2);
            Ok(ExitCode::SUCCESS)
        }
        Command::Judge {
            space,
            variant,
            gpu,
            fake_gpu,
            wait,
            idea,
            json,
        } => {
            let judged = async {
                let (policies, _) = crate::config::Policies::load(&paths.policies())?;
                crate::agent::judge_working_tree(crate::agent::JudgeOptions {
                    paths,
                    space,
                    variant,
                    device: gpu,
                    executor: executor(fake_gpu, &policies)?,
                    when_busy: when_busy(wait),
                    idea,
                })
                .await
            }
            .await;
            // A refusal is a document too: a script reading stdout gets the code and message.
            if json {
                return answer_json(judged);
            }
            let verdict = judged?;
            println!(
                "{}: {}\nRun log: {}",
                if verdict.accepted {
                    "accepted"
                } else {
                    "rejected"
                },
                verdict.reason,
                verdict.run_dir.join("log.jsonl").display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Context {
            space,
            variant,
            json,
            write,
        } => {
            let packed = (|| {
                let pack = crate::agent::context_pack(&crate::agent::ContextOptions {
                    paths: paths.clone(),
                    space,
                    variant,
                })?;
                if let Some(dir) = write {
                    crate::agent::write_context_pack(&pack, &paths, &dir)?;
                }
                Ok(pack)
            })();
            if json {
                return answer_json(packed);
            }
            print!("{}", crate::pack::prompt_md(&packed?));
            Ok(ExitCode::SUCCESS)
        }
        Command::ShowAttempt { id, json } => {
            let found = crate::agent::attempt(&paths, &id);
            if json {
                return answer_json(found);
            }
            let doc = found?;
            let patch = doc.entry.patch.as_deref().unwrap_or("");
            if patch.is_empty() {
                return Err(Error::BadInput(format!(
                    "attempt `{id}` changed no file: there is no patch to show"
                )));
            }
            print!("{patch}");
            if let Some(idea) = &doc.entry.idea {
                eprintln!("# {}: {} ({})", doc.entry.attempt, idea.summary, idea.from);
            }
            eprintln!("# verdict: {} — {}", doc.entry.verdict, doc.entry.reason);
            Ok(ExitCode::SUCCESS)
        }
        Command::History {
            shape: None,
            json,
            dtype,
            last,
        } => {
            let listed = match dtype {
                Some(_) => Err(Error::BadInput(
                    "--dtype filters a shape's history: give a shape (`flashtune history seed --dtype f16`)"
                        .into(),
                )),
                None => Ok(crate::agent::step_history(&paths, last)),
            };
            if json {
                return answer_json(listed);
            }
            print!("{}", crate::pack::history_md(&listed?.steps));
            Ok(ExitCode::SUCCESS)
        }
        Command::History {
            shape: Some(shape),
            dtype,
            json,
            last,
        } => {
            // The store's rows for the shape, and the table a person reads.
            let found = (|| {
                if last.is_some() {
                    return Err(Error::BadInput(
                        "--last counts attempts: it goes without a shape (`flashtune history --last 10`)"
                            .into(),
                    ));
                }
                let (policies, _) = crate::config::Policies::load(&paths.policies())?;
                let known = policies.shapes.iter().find(|s| s.name == shape);
                let path = crate::store::path(&paths);
                let store = crate::store::Store::open_existing(&path)
                    .map_err(|e| Error::BadInput(format!("{e:#}")))?
                    .ok_or_else(|| {
                        Error::BadInput(format!(
                            "no results store at {}: `flashtune tune` fills it as it measures, and `flashtune report <run>` adds an earlier run",
                            path.display()
                        ))
                    })?;
                let geometry = known.map(crate::store::geometry);
                let rows = store.history(&shape, geometry.as_deref()).map_err(|e| {
                    Error::Other(e.context(format!("cannot read {}", path.display())))
                })?;
                let rows: Vec<_> = rows
                    .into_iter()
                    .filter(|r| dtype.is_none_or(|d| d == r.dtype))
                    .collect();
                if rows.is_empty() {
                    return Err(Error::BadInput(format!(
                        "{} holds no measurement of shape `{shape}`{}",
                        path.display(),
                        dtype.map_or(String::new(), |d| format!(" in {d}"))
                    )));
                }
                let table = history_table(&shape, known, &rows);
                Ok((rows, table))
            })();
            if json {
                return answer_json(found.map(|(rows, _)| {
                    serde_json::json!({
                        "schema_version": crate::pack::JSON_SCHEMA_VERSION,
                        "shape": shape,
                        "rows": rows,
                    })
                }));
            }
            print!("{}", found?.1);
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp { fake_gpu, action } => match action {
            None => {
                crate::mcp::serve(crate::mcp::McpOptions { paths, fake_gpu }).await?;
                Ok(ExitCode::SUCCESS)
            }
            Some(McpAction::PrintConfig {
                agent,
                fake_gpu,
                write,
            }) => {
                let agent = match agent {
                    AgentArg::Claude => crate::mcp::Agent::Claude,
                    AgentArg::Codex => crate::mcp::Agent::Codex,
                    AgentArg::Gemini => crate::mcp::Agent::Gemini,
                    AgentArg::Cursor => crate::mcp::Agent::Cursor,
                };
                let binary = std::env::current_exe()
                    .map_err(|e| Error::Other(anyhow::anyhow!("cannot find this binary: {e}")))?;
                let root = paths.root.canonicalize().map_err(|e| {
                    Error::BadInput(format!("project root {}: {e}", paths.root.display()))
                })?;
                let (file, snippet) = crate::mcp::client_config(agent, &binary, &root, fake_gpu);
                let place = match file.strip_prefix("~/") {
                    Some(rel) => std::env::var_os("HOME")
                        .map(PathBuf::from)
                        .ok_or_else(|| {
                            Error::BadInput(format!("{file} is under HOME, which is not set"))
                        })?
                        .join(rel),
                    None => root.join(file),
                };
                if write {
                    crate::mcp::write_client_config(agent, &place, &snippet)?;
                    eprintln!("merged the flashtune server into {}", place.display());
                } else {
                    eprintln!(
                        "# belongs in {}; `--write` merges it there, keeping the rest of the file",
                        place.display()
                    );
                    print!("{snippet}");
                }
                Ok(ExitCode::SUCCESS)
            }
        },
        Command::Setup { arch } => {
            let arch = match arch {
                Some(a) => a,
                None => crate::config::Policies::load(&paths.policies())
                    .map(|(p, _)| p.build.default_arch)
                    .unwrap_or_else(|_| "sm_90a".into()),
            };
            let (source, tc) = crate::toolchain::setup(&paths.root, &arch)?;
            println!(
                "nvcc: {} ({}), found by {}; it compiles for {arch}",
                tc.nvcc.display(),
                tc.version,
                source.describe()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor => {
            let checks = crate::doctor::run(&paths).await;
            for c in &checks {
                println!("{c}");
            }
            let failed = checks
                .iter()
                .any(|c| c.status == crate::doctor::Status::Fail);
            Ok(if failed {
                ExitCode::from(exit_code::FAILURE)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Worker { .. } | Command::Guard { .. } => {
            unreachable!("handled before the runtime starts")
        }
    }
}

/// Where `report` writes: beside the log, unless git tracks the log's folder (a committed
/// measurement under docs/): then under runs/reports/<folder>, so that reading never changes the tree.
fn report_folder(paths: &ProjectPaths, run: &std::path::Path) -> PathBuf {
    if !crate::vcs::holds_tracked_files(run) {
        return run.to_path_buf();
    }
    let canon = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let (run_c, root) = (canon(run), canon(&paths.root));
    let name = run_c
        .strip_prefix(&root)
        .unwrap_or(&run_c)
        .to_string_lossy()
        .replace('/', "-");
    paths.runs().join("reports").join(name)
}

/// `flashtune history`: one row per run and dtype, grouped by GPU model, with what changed.
fn history_table(
    shape: &str,
    known: Option<&crate::config::Shape>,
    rows: &[crate::store::HistoryRow],
) -> String {
    let mut t = String::new();
    let title = known.map_or_else(|| format!("`{shape}`"), |s| s.label());
    let _ = writeln!(t, "Champion of {title} per run\n");
    let _ = writeln!(
        t,
        "| started | run | git | GPU | dtype | champion | µs | TF/s | change |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---:|---:|---|");
    let mut before: Option<&crate::store::HistoryRow> = None;
    for r in rows {
        let same_line = before.filter(|b| b.gpu == r.gpu && b.fake == r.fake && b.dtype == r.dtype);
        let change = match same_line {
            None => "first".to_owned(),
            Some(b) if b.variant == r.variant => format!(
                "same champion, {:+.1}%",
                100.0 * (r.median_us / b.median_us - 1.0)
            ),
            Some(b) => format!(
                "was `{}` {:.1} µs: {:+.1}%",
                b.variant,
                b.median_us,
                100.0 * (r.median_us / b.median_us - 1.0)
            ),
        };
        // Every figure names the record it stands on: its own run's line, or the run it was reused from.
        let (run, change) = if r.origin_run == r.run_id {
            (format!("{} line {}", r.run_id, r.origin_line), change)
        } else {
            let from = format!("reused from run {} line {}", r.origin_run, r.origin_line);
            (r.run_id.clone(), format!("{change} ({from})"))
        };
        let git = r
            .git_head
            .as_deref()
            .map_or("—".to_owned(), |g| g.chars().take(10).collect());
        let gpu = if r.fake {
            format!("{} (fake)", r.gpu.split(" (").next().unwrap_or(&r.gpu))
        } else {
            r.gpu.clone()
        };
        let _ = writeln!(
            t,
            "| {} | {run} | {git} | {gpu} | {} | `{}` | {:.2} | {} | {change} |",
            r.started_at,
            r.dtype,
            r.variant,
            r.median_us,
            crate::report::three_digits(r.tflops)
        );
        before = Some(r);
    }
    t
}

fn build_table(
    planned: &[crate::space::PlannedPoint],
    rows: &[engine::BuiltRow],
) -> (String, usize) {
    let mut t = String::new();
    let mut failures = 0;
    let _ = writeln!(t, "| unit | dtype | d | entry | regs | spill st/ld B | stack B | static smem B | build | verdict |");
    let _ = writeln!(t, "|---|---|---:|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        match &r.outcome {
            Ok(out) => {
                if r.gate.is_some() {
                    failures += 1;
                }
                let verdict = r.gate.clone().unwrap_or_else(|| "ok".into());
                let build = if out.cached {
                    "cached".to_owned()
                } else {
                    format!("{:.1} s", out.seconds)
                };
                for e in &out.entries {
                    let _ = writeln!(
                        t,
                        "| `{}` | {} | {} | {} | {} | {}/{} | {} | {} | {build} | {verdict} |",
                        r.variant,
                        r.dtype,
                        if r.head_dim == 0 {
                            "any".into()
                        } else {
                            r.head_dim.to_string()
                        },
                        e.name,
                        e.registers,
                        e.spill_store_bytes,
                        e.spill_load_bytes,
                        e.stack_frame_bytes,
                        e.static_smem_bytes
                    );
                }
            }
            Err(why) => {
                failures += 1;
                let first = why.lines().next().unwrap_or("");
                let _ = writeln!(
                    t,
                    "| `{}` | {} | {} | — | — | — | — | — | — | **{first}** |",
                    r.variant, r.dtype, r.head_dim
                );
                eprintln!(
                    "build of {} {} d{} failed:\n{why}\n",
                    r.variant, r.dtype, r.head_dim
                );
            }
        }
    }
    let invalid: Vec<_> = planned.iter().filter(|p| p.invalid.is_some()).collect();
    if !invalid.is_empty() {
        // One line per reason, its figures folded (a full space rules out tens of thousands).
        let mut groups: std::collections::BTreeMap<String, (usize, &crate::space::PlannedPoint)> =
            Default::default();
        for p in &invalid {
            let reason = p.invalid.as_deref().unwrap_or("");
            // A constraint is named by its text; a limit's figures vary point to point.
            let key = if reason.starts_with("constraints:") {
                reason.to_owned()
            } else {
                let mut key = String::with_capacity(reason.len());
                for c in reason.chars() {
                    if !c.is_ascii_digit() {
                        key.push(c);
                    } else if !key.ends_with('N') {
                        key.push('N');
                    }
                }
                key
            };
            groups.entry(key).or_insert((0, p)).0 += 1;
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        let _ = writeln!(
            t,
            "\n{} points ruled out before compiling, for {} reasons:",
            invalid.len(),
            groups.len()
        );
        for (reason, (count, example)) in &groups {
            let example_reason = example.invalid.as_deref().unwrap_or("");
            let detail = if example_reason == reason {
                String::new()
            } else {
                format!(": {example_reason}")
            };
            let _ = writeln!(
                t,
                "- {count} × {reason} (for example `{}` d={}{detail})",
                example.variant.id, example.head_dim
            );
        }
    }
    let units = rows.len();
    let cached = rows
        .iter()
        .filter(|r| r.outcome.as_ref().is_ok_and(|o| o.cached))
        .count();
    let _ = writeln!(
        t,
        "\n{} points planned: {} valid, {} ruled out; {units} builds ({cached} from the cache), {} failed or rejected by the gates",
        planned.len(),
        planned.len() - invalid.len(),
        invalid.len(),
        failures
    );
    (t, failures)
}
