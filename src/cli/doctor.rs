//! `flashtune doctor`: check the toolchain, GPU, profiler, repository and disk.
use crate::config::ProjectPaths;
use crate::error::{exit_code, Result};
use std::process::ExitCode;

pub(super) async fn run(paths: ProjectPaths) -> Result<ExitCode> {
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
