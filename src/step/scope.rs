//! The edit scope: which paths an edit may change, the oracle's protected sources, and why an edit that strays is refused.
use super::EDIT_SCOPE;
use crate::error::{Error, Result};
use crate::run::shared::Project;
use anyhow::anyhow;
use std::path::Path;

/// Paths under kernels/ that an edit may not touch: the table flashtune writes, and the oracle's
/// whole source closure (the reference and every file it includes), with the reference's folder
/// when the kernels judged live elsewhere, so nothing can be slipped in beside it. A path ending in
/// `/` is a folder. Architecture Invariant: no edit that `step`, `judge`, MCP or an agent session
/// judges can change the oracle.
pub(crate) fn protected(project: &Project) -> Vec<String> {
    let mut out = vec![project.champion_table()];
    out.extend(oracle_sources(project));
    out
}

/// The oracle's sources, repository-relative: its folder (when no forward kernel lives there) and
/// every file of its include closure.
pub(crate) fn oracle_sources(project: &Project) -> Vec<String> {
    let family = &project.space.family;
    let reference = family.reference.to_string_lossy().into_owned();
    let mut out = Vec::new();
    let folder = |p: &Path| p.parent().map(|d| d.to_string_lossy().into_owned());
    if let Some(dir) = folder(&family.reference).filter(|d| !d.is_empty()) {
        if folder(&family.forward).as_deref() != Some(dir.as_str()) {
            out.push(format!("{dir}/"));
        }
    }
    out.push(reference);
    let root = &project.paths.root;
    let root_abs = root.canonicalize().unwrap_or_else(|_| root.clone());
    // A closure that cannot be read (the file is gone) protects what it names and no more.
    for file in
        crate::gpu::build::include_closure(&root.join(&family.reference)).unwrap_or_default()
    {
        if let Ok(rel) = file.strip_prefix(&root_abs) {
            let rel = rel.to_string_lossy().into_owned();
            if !out.contains(&rel) {
                out.push(rel);
            }
        }
    }
    out
}

/// Whether `path` (repository-relative) is protected: named, or inside a protected folder.
pub(crate) fn is_protected(project: &Project, path: &str) -> bool {
    protected(project)
        .iter()
        .any(|p| p == path || (p.ends_with('/') && path.starts_with(p.as_str())))
}

/// Of `paths`, the oracle's sources: an edit that touches one is refused naming them.
pub(crate) fn oracle_touched(project: &Project, paths: &[String]) -> Vec<String> {
    let oracle = oracle_sources(project);
    paths
        .iter()
        .filter(|path| {
            oracle
                .iter()
                .any(|p| p == *path || (p.ends_with('/') && path.starts_with(p.as_str())))
        })
        .cloned()
        .collect()
}

/// Why an edit that changed `stray` (paths outside the edit scope) is refused: the oracle's sources
/// by name first, when it touched any.
pub(crate) fn outside_scope_reason(project: &Project, who: &str, stray: &[String]) -> String {
    let oracle = oracle_touched(project, stray);
    if oracle.is_empty() {
        format!(
            "{who} changed files outside the edit scope: {}",
            stray.join(", ")
        )
    } else {
        format!(
            "{who} changed the oracle's sources ({}), which no edit may touch: the reference every \
             edit is judged by is built from them; outside the edit scope: {}",
            oracle.join(", "),
            stray.join(", ")
        )
    }
}

/// Of the changed `paths` under `root`, those that exist as something other than a regular file (a
/// symbolic link, a FIFO, a socket, a folder where git saw a submodule), each with what it is. An
/// edit is regular files only: a link is followed by nvcc, by the judge and by a later checkout
/// to wherever it points, which may lie outside the project.
pub(crate) fn irregular(root: &Path, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter_map(|p| {
            let kind = std::fs::symlink_metadata(root.join(p)).ok()?.file_type();
            let what = if kind.is_file() {
                return None;
            } else if kind.is_symlink() {
                "a symbolic link"
            } else if kind.is_dir() {
                "a folder"
            } else {
                "not a regular file"
            };
            Some(format!("{p} is {what}"))
        })
        .collect()
}

/// Why an edit with `irregular` paths is refused, naming them.
pub(crate) fn irregular_reason(who: &str, irregular: &[String]) -> String {
    format!(
        "{who} left paths that are not regular files ({}): an edit is regular files only",
        irregular.join(", ")
    )
}

pub(crate) fn in_scope(project: &Project, path: &str) -> bool {
    path.starts_with(EDIT_SCOPE) && !is_protected(project, path)
}

/// Changed paths against HEAD (untracked included), split into the edit scope and the rest; runs/ is flashtune's own.
pub(crate) fn changes(project: &Project, root: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let all = crate::os::vcs::changed_against_head(root)
        .map_err(|e| Error::Other(anyhow!("git status: {}", e.message())))?;
    Ok(all
        .into_iter()
        .filter(|p| !p.starts_with("runs/"))
        .partition(|p| in_scope(project, p)))
}
