//! A scratch repository's git state as judging tests check it: HEAD and what is uncommitted.
use std::path::Path;

/// HEAD's commit id and message.
pub fn head(dir: &Path) -> (String, String) {
    let repo = git2::Repository::open(dir).unwrap();
    let commit = repo.head().unwrap().peel_to_commit().unwrap();
    (
        commit.id().to_string(),
        commit.message().unwrap_or("").to_owned(),
    )
}

/// Paths changed against HEAD, untracked included, runs/ left out.
pub fn dirty(dir: &Path) -> Vec<String> {
    flashtune::vcs::changed_against_head(dir)
        .unwrap()
        .into_iter()
        .filter(|p| !p.starts_with("runs/"))
        .collect()
}
