//! A finished or stopped run as later commands find it: its folder as the user names it, its log and header read (sealed for `resume`), and what makes two runs' figures incomparable.
use crate::error::{Error, Result};
use crate::log::runlog::{self, Header};
use crate::model::config::ProjectPaths;
use std::path::{Path, PathBuf};

/// A run folder as the user names it: a path (as given, or under the project root), or the bare
/// run id `tune` prints, looked up under the project's `runs/`.
pub fn resolve_run_dir(paths: &ProjectPaths, given: &Path) -> Result<PathBuf> {
    let mut candidates = vec![given.to_path_buf()];
    if given.is_relative() {
        candidates.push(paths.root.join(given));
    }
    let bare_id = given.components().count() == 1;
    if bare_id {
        candidates.push(paths.runs().join(given));
    }
    candidates.dedup();
    if let Some(found) = candidates.iter().find(|c| runlog::path_in(c).is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates
        .iter()
        .map(|c| c.join("log.jsonl").display().to_string())
        .collect();
    Err(Error::BadInput(format!(
        "no run `{}`: looked for {}. Give a run folder or the run id `tune` printed (e.g. 20261122-031500-ab12)",
        given.display(),
        looked.join(", ")
    )))
}

/// A run's log and its header: a log that is empty, has no header, or was written by a newer
/// flashtune is refused (exit 2) before anything reads, resumes or rewrites it.
pub fn read_run(run_dir: &Path) -> Result<(runlog::LoadedLog, Header)> {
    let loaded =
        runlog::read(&runlog::path_in(run_dir)).map_err(|e| Error::BadInput(format!("{e:#}")))?;
    let header = header_of(&loaded, run_dir)?;
    Ok((loaded, header))
}

fn header_of(loaded: &runlog::LoadedLog, run_dir: &Path) -> Result<Header> {
    let log_path = runlog::path_in(run_dir);
    loaded.header().cloned().ok_or_else(|| {
        let what = if loaded.entries.is_empty() && loaded.torn_tail {
            "holds only a header cut mid-line (the run was killed while writing its first record)"
        } else if loaded.entries.is_empty() {
            "is empty"
        } else {
            "has no header record"
        };
        Error::BadInput(format!(
            "{} {what}: not a flashtune run log (a run writes its header first), so there is nothing to rebuild or continue",
            log_path.display()
        ))
    })
}

/// A past run read once for readers of any log (reports) that also feed what only a sealed log may
/// reach (the results store): its log, its header, and its sealed reading or why the seals do not
/// hold. Refusals of empty, headerless or newer logs come first, as for any reader.
pub fn read_run_and_seals(
    run_dir: &Path,
) -> Result<(
    runlog::LoadedLog,
    Header,
    std::result::Result<runlog::SealedLog, String>,
)> {
    match runlog::read_sealed(&runlog::path_in(run_dir)) {
        Ok(sealed) => {
            let (log, header) = (sealed.clone().into_log(), header_of(&sealed, run_dir)?);
            Ok((log, header, Ok(sealed)))
        }
        Err(e) => {
            let (log, header) = read_run(run_dir)?;
            Ok((log, header, Err(format!("{e:#}"))))
        }
    }
}

/// A run's log for `resume` (of a tune or an agent session), which goes on from what the log says
/// was done and so reads only a sealed log: a `variant_done` written by another hand would skip
/// work, a `timed` one crown a figure never measured.
pub fn read_sealed_run(run_dir: &Path) -> Result<(runlog::SealedLog, Header)> {
    let (_, header, sealed) = read_run_and_seals(run_dir)?;
    let log = sealed.map_err(|e| {
        Error::BadInput(format!(
            "cannot resume: {e}. resume continues only a log whose every line flashtune sealed; start a new run (`flashtune report` still reads this one)"
        ))
    })?;
    Ok((log, header))
}

/// What makes two logs' figures incomparable.
pub fn header_mismatches(old: &Header, new: &Header) -> Vec<String> {
    let mut m = Vec::new();
    let mut check = |what: &str, a: &str, b: &str| {
        if a != b {
            m.push(format!("{what}: was `{a}`, now `{b}`"));
        }
    };
    check("GPU", &old.device.name, &new.device.name);
    check("nvcc", &old.toolchain.version, &new.toolchain.version);
    check(
        "kernel sources",
        &old.kernel_sources_hash,
        &new.kernel_sources_hash,
    );
    check("policies.toml", &old.policies_hash, &new.policies_hash);
    check("variant space", &old.space_hash, &new.space_hash);
    check(
        "schema",
        &old.schema_version.to_string(),
        &new.schema_version.to_string(),
    );
    m
}
