//! `flashtune report`: rebuild a run's reports from its log.
use crate::error::{Error, Result};
use crate::model::config::ProjectPaths;
use crate::run::engine;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The run folder (runs/20261122-031500-ab12) or the run id `tune` printed (20261122-031500-ab12); its log.jsonl, else log.jsonl.gz.
    run: PathBuf,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args { run } = args;
    let run = engine::resolve_run_dir(&paths, &run)?;
    // Refused before anything is written: a bad log must not replace good reports.
    let (log, _, sealed) = engine::read_run_and_seals(&run)?;
    // A run from before the store joins it here, if its log is sealed: reports read any
    // log, the store (what --reuse and the best-first order take) only what flashtune wrote.
    let store_path = crate::log::store::path(&paths);
    let stored = sealed.map_err(|e| anyhow::anyhow!(e)).and_then(|sealed| {
        crate::log::store::Store::open(&store_path)
            .and_then(|mut store| crate::log::store::backfill(&mut store, &sealed))
    });
    if let Err(e) = stored {
        crate::tell!("warning: run not added to the results store: {e:#}");
    }
    let out = report_folder(&paths, &run);
    std::fs::create_dir_all(&out)
        .map_err(|e| Error::Other(anyhow::anyhow!("cannot create {}: {e}", out.display())))?;
    let written = crate::report::export::write_all(&out, &log).map_err(|e| {
        Error::Other(anyhow::anyhow!(
            "cannot write the reports in {}: {e}",
            out.display()
        ))
    })?;
    crate::say!("{}", written.markdown);
    crate::say!(
        "Wrote report.md, report.html, report.csv, report.json and report.t4.json in {}",
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Where `report` writes: beside the log, unless git tracks the log's folder (a committed
/// measurement under docs/): then under runs/reports/<folder>, so that reading never changes the tree.
fn report_folder(paths: &ProjectPaths, run: &std::path::Path) -> PathBuf {
    if !crate::os::vcs::holds_tracked_files(run) {
        return run.to_path_buf();
    }
    let canon = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let (run_c, root) = (canon(run), canon(&paths.root));
    let name = run_c
        .strip_prefix(&root)
        .unwrap_or(&run_c)
        .to_string_lossy()
        .replace('/', "-");
    paths.runs().join("reports").join(name)
}
