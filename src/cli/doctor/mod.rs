//! `flashtune doctor`: check the toolchain, GPU, profiler, repository and disk.
pub mod checks;

use crate::error::{exit_code, Result};
use crate::model::config::ProjectPaths;
use std::process::ExitCode;

pub(super) async fn run(paths: ProjectPaths) -> Result<ExitCode> {
    let checks = crate::cli::doctor::checks::run(&paths).await;
    for c in &checks {
        crate::say!("{c}");
    }
    let failed = checks
        .iter()
        .any(|c| c.status == crate::cli::doctor::checks::Status::Fail);
    Ok(if failed {
        ExitCode::from(exit_code::FAILURE)
    } else {
        ExitCode::SUCCESS
    })
}
