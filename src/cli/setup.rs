//! `flashtune setup`: find nvcc (or install the pinned one) and prove it compiles a kernel.
use crate::error::Result;
use crate::model::config::ProjectPaths;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The target the proof compiles for (default: policies.toml's default_arch).
    #[arg(long)]
    arch: Option<String>,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args { arch } = args;
    let arch = match arch {
        Some(a) => a,
        None => crate::model::config::Policies::load(&paths.policies())
            .map(|(p, _)| p.build.default_arch)
            .unwrap_or_else(|_| "sm_90a".into()),
    };
    let (source, tc) = crate::os::toolchain::setup(&paths.root, &arch)?;
    crate::say!(
        "nvcc: {} ({}), found by {}; it compiles for {arch}",
        tc.nvcc.display(),
        tc.version,
        source.describe()
    );
    Ok(ExitCode::SUCCESS)
}
