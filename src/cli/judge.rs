//! `flashtune judge`: judge the working tree's edit once, as `step` does, and print the verdict.
use crate::cli::output::answer_json;
use crate::cli::run_options::{executor, when_busy};
use crate::error::Result;
use crate::model::config::ProjectPaths;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
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
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        space,
        variant,
        gpu,
        fake_gpu,
        wait,
        idea,
        json,
    } = args;
    let judged = async {
        let (policies, _) = crate::model::config::Policies::load(&paths.policies())?;
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
    crate::say!(
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
