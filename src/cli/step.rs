//! `flashtune step`: judge proposed edits under kernels/ step by step, or run an agent session.
use crate::cli::output::{answer_json, session_finished_text};
use crate::cli::run_options::{executor, when_busy};
use crate::error::{Error, Result};
use crate::model::config::ProjectPaths;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub(super) struct Args {
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
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
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
    } = args;
    // The run folder, the stop rule that ended an agent session early, and the last words.
    let ran = async {
        let (policies, _) = crate::model::config::Policies::load(&paths.policies())?;
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
            command: crate::log::runlog::RunCommand::Step,
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
            return Ok((
                outcome.run_dir,
                outcome.log,
                outcome.stopped.map(|r| r.to_string()),
                text,
            ));
        }
        let outcome = crate::step::step(opts).await?;
        let text = format!(
            "{} accepted, {} rejected. Run log: {}\n",
            outcome.accepted,
            outcome.rejected,
            outcome.run_dir.join("log.jsonl").display()
        );
        Ok((outcome.run_dir, outcome.log, None, text))
    }
    .await;
    if json {
        return answer_json(ran.and_then(|(run_dir, log, stopped, _)| {
            crate::agent::step_run_from_log(&run_dir, &log, stopped)
        }));
    }
    crate::os::console::out(&ran?.3);
    Ok(ExitCode::SUCCESS)
}
