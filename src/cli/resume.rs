//! `flashtune resume`: continue a crashed or interrupted tune or agent session from its log, as the command its header names; a step or a judge is refused, saying why and how to judge again.
use crate::cli::output::session_finished;
use crate::cli::run_options::{executor, when_busy, FullRunArgs, RunArgs};
use crate::error::{Error, Result};
use crate::log::runlog::RunCommand;
use crate::model::config::ProjectPaths;
use crate::run::engine;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The run folder (runs/20261122-031500-ab12) or the run id `tune` printed (20261122-031500-ab12).
    run_dir: PathBuf,
    /// Resume even if the GPU, nvcc, kernel sources or policies changed (logged as overridden).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    run: FullRunArgs,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        run_dir,
        force,
        run,
    } = args;
    let mut run = RunArgs::from(&run);
    let run_dir = engine::resolve_run_dir(&paths, &run_dir)?;
    let (_, header) = engine::read_run(&run_dir)?;
    // Each run is taken up as the command that wrote it, which its header names; whatever goes on
    // from a log, or says what became of its edit, reads it sealed (an unsealed one is refused).
    match header.command() {
        RunCommand::Step | RunCommand::Judge => {
            let (log, header) = engine::read_sealed_run(&run_dir)?;
            return Err(crate::step::refuse_resume(&run_dir, &log, &header));
        }
        RunCommand::AgentSession | RunCommand::Tune => {}
    }
    // A run the test double timed can only go on there (a GPU's figures would not compare).
    if !run.fake_gpu && header.device.fake {
        crate::tell!(
            "resume: {} was timed on the fake GPU: it goes on there (its figures are synthetic)",
            run_dir.display()
        );
        run.fake_gpu = true;
    }
    if header.command() == RunCommand::AgentSession {
        if run.json {
            return Err(Error::BadInput(
                "--json streams a tune run's records; an agent session writes ledger.json and summary.md in its run folder instead".into(),
            ));
        }
        let (policies, _) = crate::model::config::Policies::load(&paths.policies())?;
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
