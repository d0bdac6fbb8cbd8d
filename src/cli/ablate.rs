//! `flashtune ablate`: one factor at a time around a run's champion.
use crate::cli::run_options::{BudgetArgs, CommitArg, GpuArgs, RunArgs};
use crate::error::Result;
use crate::model::config::ProjectPaths;
use crate::run::engine;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The run whose champion is ablated: its folder (runs/20261122-031500-ab12) or its id.
    run_dir: PathBuf,
    /// Ablate around this variant instead of the best geometric mean over the run's shapes.
    #[arg(long)]
    variant: Option<String>,
    #[command(flatten)]
    run: AblateArgs,
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

impl From<&AblateArgs> for RunArgs {
    fn from(a: &AblateArgs) -> Self {
        RunArgs::new(&a.gpu, Some(&a.budget), Some(&a.commit), None)
    }
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        run_dir,
        variant,
        run,
    } = args;
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
