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
    flashtune::os::vcs::changed_against_head(dir)
        .unwrap()
        .into_iter()
        .filter(|p| !p.starts_with("runs/"))
        .collect()
}

/// The fake GPU's commits: each scratch reference under refs/flashtune/fake/, with its commit id and
/// message, in name order.
pub fn scratch_commits(dir: &Path) -> Vec<(String, String, String)> {
    let repo = git2::Repository::open(dir).unwrap();
    let mut out: Vec<(String, String, String)> = repo
        .references_glob("refs/flashtune/fake/*")
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            let c = r.peel_to_commit().unwrap();
            (
                r.name().unwrap().to_owned(),
                c.id().to_string(),
                c.message().unwrap_or("").to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// A file as `commit` has it.
pub fn file_at(dir: &Path, commit: &str, path: &str) -> String {
    let repo = git2::Repository::open(dir).unwrap();
    let tree = repo
        .find_commit(git2::Oid::from_str(commit).unwrap())
        .unwrap()
        .tree()
        .unwrap();
    let blob = repo
        .find_blob(tree.get_path(Path::new(path)).unwrap().id())
        .unwrap();
    String::from_utf8_lossy(blob.content()).into_owned()
}
