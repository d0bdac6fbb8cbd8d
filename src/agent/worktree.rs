//! Candidate worktrees: made at the base commit, diffed against it, removed.
use super::git;
use crate::error::{Error, Result};
use crate::step;
use anyhow::{anyhow, Context};
use std::path::Path;

pub(super) fn worktree_name(run_id: &str, n: u32, k: u32) -> String {
    format!("flashtune-{run_id}-s{n}-c{k}")
}

/// A linked worktree of `repo` at `path`, its HEAD detached at `commit`.
pub(super) fn make_worktree(
    repo: &git2::Repository,
    name: &str,
    commit: &str,
    path: &Path,
) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // libgit2 makes a branch for a new worktree; the worktree is then detached and the branch deleted.
    let wt = repo.worktree(name, path, None).map_err(|e| {
        Error::Other(anyhow!(
            "cannot make the worktree {}: {}",
            path.display(),
            e.message()
        ))
    })?;
    let wrepo = git2::Repository::open_from_worktree(&wt).map_err(git)?;
    let id = git2::Oid::from_str(commit).map_err(git)?;
    wrepo.set_head_detached(id).map_err(git)?;
    let object = wrepo.find_object(id, None).map_err(git)?;
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    wrepo
        .reset(&object, git2::ResetType::Hard, Some(&mut checkout))
        .map_err(git)?;
    if let Ok(mut branch) = repo.find_branch(name, git2::BranchType::Local) {
        let _ = branch.delete();
    }
    Ok(())
}

/// Remove a candidate's worktree and its record in the repository; what cannot be removed stays (harmless).
pub(super) fn remove_worktree(repo: &git2::Repository, name: &str, path: &Path) {
    let _ = std::fs::remove_dir_all(path);
    if let Ok(wt) = repo.find_worktree(name) {
        let mut opts = git2::WorktreePruneOptions::new();
        opts.valid(true).working_tree(true);
        let _ = wt.prune(Some(&mut opts));
    }
    if let Ok(mut branch) = repo.find_branch(name, git2::BranchType::Local) {
        let _ = branch.delete();
    }
}

/// The champion's sources at `base`: every file of the edit scope except the protected ones.
pub(super) fn sources_at(
    repo: &git2::Repository,
    base: &str,
    paths: &[String],
) -> Result<Vec<(String, Vec<u8>)>> {
    let id = git2::Oid::from_str(base).map_err(git)?;
    let tree = repo.find_commit(id).and_then(|c| c.tree()).map_err(git)?;
    let mut out = Vec::new();
    for p in paths {
        let entry = tree.get_path(Path::new(p)).map_err(git)?;
        let blob = repo.find_blob(entry.id()).map_err(git)?;
        out.push((p.clone(), blob.content().to_vec()));
    }
    Ok(out)
}

/// Files of the edit scope at `base` that the champion is built from (the space's family folder).
pub(super) fn champion_sources(
    project: &crate::run::shared::Project,
    repo: &git2::Repository,
    base: &str,
) -> Result<Vec<String>> {
    let id = git2::Oid::from_str(base).map_err(git)?;
    let tree = repo.find_commit(id).and_then(|c| c.tree()).map_err(git)?;
    let forward = project.space.family.forward.to_string_lossy().into_owned();
    let folder = forward.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
    let mut out = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        let path = format!("{dir}{}", entry.name().unwrap_or(""));
        if entry.kind() == Some(git2::ObjectType::Blob)
            && dir.trim_end_matches('/') == folder
            && !step::is_protected(project, &path)
        {
            out.push(path);
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(git)?;
    Ok(out)
}
