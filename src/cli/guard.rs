//! `flashtune guard` (hidden): run a shell command in its own process group, killed when flashtune dies.
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The shell command.
    #[arg(last = true)]
    command: String,
}

pub(super) fn run(args: &Args) -> ExitCode {
    crate::os::stop::guard(&args.command)
}
