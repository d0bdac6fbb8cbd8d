//! What git says about the project: the commit a run starts from and whether the tree is clean.
use std::path::Path;

/// `HEAD`'s commit id, with `-dirty` when tracked files have uncommitted changes.
pub fn head(root: &Path) -> Option<String> {
    let repo = git2::Repository::discover(root).ok()?;
    let id = repo.head().ok()?.peel_to_commit().ok()?.id().to_string();
    let dirty = !changed_files(&repo).is_empty();
    Some(if dirty { format!("{id}-dirty") } else { id })
}

/// Tracked files with uncommitted changes (untracked files are not counted).
pub fn changed_files(repo: &git2::Repository) -> Vec<String> {
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(false).include_ignored(false);
    repo.statuses(Some(&mut opts))
        .map(|st| st.iter().filter_map(|e| e.path().ok().map(str::to_owned)).collect())
        .unwrap_or_default()
}
