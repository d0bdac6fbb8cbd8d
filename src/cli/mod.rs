//! Command-line interface: parses arguments, runs a command, maps errors to exit codes.
//!
//! A file per command holds its flags (clap's derive) beside its handler, `run`; `dispatch` only
//! routes. Helpers that several commands share live in files named for what they do.
mod ablate;
mod build;
mod context;
pub mod doctor;
mod guard;
mod history;
mod judge;
mod mcp;
mod output;
mod parse;
mod profile;
pub mod progress;
mod report;
mod resume;
mod run_options;
mod setup;
mod show_attempt;
mod step;
mod tune;
mod worker;

use crate::error::{exit_code, Result};
use crate::model::config::ProjectPaths;
use clap::{Parser, Subcommand};
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
    Tune(tune::Args),
    /// One factor at a time around a run's champion: reset each parameter to the baseline's value, measure, rank.
    Ablate(ablate::Args),
    /// Profile one variant of a run under Nsight Compute now; the result joins the run's log.
    Profile(profile::Args),
    /// Continue a crashed or interrupted run from its log: finished variants are not redone.
    Resume(resume::Args),
    /// Compile and gate every variant of a space without a GPU, and print the resource table.
    Build(build::Args),
    /// Rebuild a run's reports from its log (report.md, .html, .csv, .json, .t4.json) and print the Markdown.
    Report(report::Args),
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
    Step(step::Args),
    /// Judge the working tree's edit under kernels/ once, as `step` does (commit or restore), and print the verdict.
    ///
    /// The edit is kept as a patch (runs/<id>/attempts/1.patch; `flashtune show-attempt` gives it
    /// back) and joins the history with its idea and verdict, accepted or not.
    Judge(judge::Args),
    /// Print an earlier attempt's patch (ready for `git apply`), or the whole attempt with --json.
    ShowAttempt(show_attempt::Args),
    /// The context pack for the next step at HEAD: champion figures, bottleneck, roofs, history (from the run logs).
    Context(context::Args),
    /// How a shape's champion moved across runs and commits, from the results store (runs/results.sqlite).
    ///
    /// One row per run and dtype: when it ran, the git commit it ran at, the GPU, its fastest variant
    /// on the shape, µs and TF/s, and what changed against the run before it on the same GPU model.
    /// A figure a run reused names the run it was measured in. `flashtune report <run>` adds a run
    /// that is not in the store yet (one from before the store, or one copied from elsewhere).
    ///
    /// Without a shape: every step and agent candidate tried on this project (from the run logs),
    /// with its diff summary, verdict, reason, figures and cost.
    History(history::Args),
    /// Serve judge, profile, history and context as MCP tools on stdin/stdout, for coding agents.
    ///
    /// `judge` runs `flashtune step` on the working tree's edit (commit or restore, as step does);
    /// a call waits up to 45 s for the verdict, sending progress notifications, then returns a job
    /// id that `judge_status` polls. `flashtune mcp print-config --agent NAME` prints the snippet
    /// that registers this server with Claude Code, Codex, Gemini CLI or Cursor.
    Mcp(mcp::Args),
    /// Check the toolchain, GPU, profiler, repository and disk.
    Doctor,
    /// Find nvcc the way every command does (FLASHTUNE_NVCC, PATH, CUDA_HOME, CUDA_PATH,
    /// /usr/local/cuda, then .tools/cuda) and prove it compiles a kernel; when none is found,
    /// install the pinned compiler (scripts/cuda-requirements.txt) from PyPI into .tools/cuda.
    Setup(setup::Args),
    /// Runs `sh -c COMMAND` in its own process group and kills that group when flashtune dies (used
    /// by step and agent sessions for proposers and agents).
    #[command(hide = true)]
    Guard(guard::Args),
    /// The GPU worker process (used by tune): serves JSON requests, one per line on stdin, for one GPU.
    #[command(hide = true)]
    Worker(worker::Args),
}

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Guard(args) = &cli.command {
        return guard::run(args);
    }
    crate::os::toolchain::absolutize_override();
    if let Command::Worker(args) = &cli.command {
        return worker::run(args);
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
            crate::tell!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit_code::FAILURE);
        }
    };
    let code = match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            crate::tell!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    };
    // Whatever path the run took out (an error, a signal), no worker, nvcc or ncu outlives it:
    // its tasks are stopped (and with them what they would start next), then every child group.
    crate::os::stop::kill_children();
    runtime.shutdown_timeout(Duration::from_secs(2));
    crate::os::stop::kill_children();
    code
}

async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let paths = ProjectPaths::new(cli.root.clone());
    match cli.command {
        Command::Tune(args) => tune::run(args, paths).await,
        Command::Ablate(args) => ablate::run(args, paths).await,
        Command::Profile(args) => profile::run(args, paths).await,
        Command::Resume(args) => resume::run(args, paths).await,
        Command::Build(args) => build::run(args, paths).await,
        Command::Report(args) => report::run(args, paths).await,
        Command::Step(args) => step::run(args, paths).await,
        Command::Judge(args) => judge::run(args, paths).await,
        Command::Context(args) => context::run(args, paths).await,
        Command::ShowAttempt(args) => show_attempt::run(args, paths).await,
        Command::History(args) => history::run(args, paths).await,
        Command::Mcp(args) => mcp::run(args, paths).await,
        Command::Setup(args) => setup::run(args, paths).await,
        Command::Doctor => doctor::run(paths).await,
        Command::Worker(_) | Command::Guard(_) => {
            unreachable!("handled before the runtime starts")
        }
    }
}
