//! `flashtune tune`: plan, build, check and time a variant space.
use crate::cli::run_options::{FullRunArgs, RunArgs};
use crate::error::Result;
use crate::model::config::ProjectPaths;
use crate::model::plan::Strategy;
use crate::run::engine;
use crate::run::shared::TuneOptions;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// Variant space (default: `default_space` in policies.toml).
    #[arg(long)]
    space: Option<PathBuf>,
    /// exhaustive: every valid point; random: --sample points; guided: start point, then the
    /// neighbours policies.toml's [guided] rules propose from each champion's ncu bottleneck.
    #[arg(long, value_enum, default_value_t = StrategyArg::Exhaustive)]
    strategy: StrategyArg,
    /// Points drawn by --strategy random (1 or more).
    #[arg(long, default_value_t = 16, value_parser = super::parse::at_least_one)]
    sample: usize,
    /// Seed of --strategy random.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    run: FullRunArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StrategyArg {
    Exhaustive,
    Random,
    Guided,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        space,
        strategy,
        sample,
        seed,
        run,
    } = args;
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
