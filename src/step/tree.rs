//! The repository side of a step: HEAD, restoring paths, extracting a commit's tree, and the fingerprints that catch a proposer touching flashtune's files.
use super::Fingerprint;
use crate::error::{Error, Result};
use anyhow::anyhow;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub(crate) fn head_of(repo: &git2::Repository) -> Result<(String, String)> {
    let head = repo
        .head()
        .map_err(|e| Error::Other(anyhow!("HEAD: {}", e.message())))?;
    let name = head.name().unwrap_or("HEAD").to_owned();
    let id = head
        .peel_to_commit()
        .map_err(|e| Error::Other(anyhow!("HEAD: {}", e.message())))?
        .id()
        .to_string();
    Ok((id, name))
}

/// A git operation on the repository at `dir` that failed, in git's words; or, where it failed in
/// the operating system (libgit2 may say no more than "failed to write out file") and `dir` has no
/// room to work in, the disk's write error, which the command exits with as with a full disk.
pub(crate) fn git_failed(dir: &Path, doing: &str, e: git2::Error) -> Error {
    let os = matches!(
        e.class(),
        git2::ErrorClass::Os | git2::ErrorClass::Filesystem
    );
    match os.then(|| crate::os::disk::lacks_room(dir)).flatten() {
        Some(full) => Error::Other(
            anyhow::Error::new(full).context(format!("{doing} (git: {})", e.message())),
        ),
        None => Error::Other(anyhow!("{doing}: {}", e.message())),
    }
}

/// Back to the branch and commit the step started from, working tree included.
pub(crate) fn put_head_back(repo: &git2::Repository, reference: &str, commit: &str) -> Result<()> {
    let git = |e: git2::Error| git_failed(repo.path(), "cannot put HEAD back", e);
    let id = git2::Oid::from_str(commit).map_err(git)?;
    let object = repo.find_object(id, None).map_err(git)?;
    if reference.starts_with("refs/") {
        repo.set_head(reference).map_err(git)?;
    }
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    repo.reset(&object, git2::ResetType::Hard, Some(&mut checkout))
        .map_err(git)
}

pub(crate) fn restore(root: &Path, paths: &[String]) -> Result<()> {
    crate::os::vcs::restore_paths(root, paths)
        .map_err(|e| git_failed(root, &format!("cannot restore {}", paths.join(", ")), e))
}

/// Write `commit`'s files under `prefix` into `dest`, keeping their repository-relative paths.
pub(crate) fn extract_tree(
    repo: &git2::Repository,
    commit: &str,
    prefix: &str,
    dest: &Path,
) -> Result<()> {
    let git =
        |e: git2::Error| Error::Other(anyhow!("cannot read HEAD's {prefix}: {}", e.message()));
    let id = git2::Oid::from_str(commit).map_err(git)?;
    let tree = repo.find_commit(id).map(|c| c.tree_id()).map_err(git)?;
    extract_tree_object(repo, tree, prefix, dest, "write HEAD's kernel source to")
}

/// The modification time of every exported file: nvcc writes each source's into the cubin's line
/// table, so a tree's cubins would otherwise depend on when it was written out, not on what it holds.
pub(crate) const EXPORTED_MTIME: std::time::SystemTime = std::time::SystemTime::UNIX_EPOCH;

/// Write the tree object `tree`'s files under `prefix` into `dest`, at their repository paths.
pub(crate) fn extract_tree_object(
    repo: &git2::Repository,
    tree: git2::Oid,
    prefix: &str,
    dest: &Path,
    what: &'static str,
) -> Result<()> {
    let git =
        |e: git2::Error| Error::Other(anyhow!("cannot read the tree's {prefix}: {}", e.message()));
    let tree = repo.find_tree(tree).map_err(git)?;
    let mut failed: Option<crate::error::WriteError> = None;
    let walked = tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        let path = format!("{dir}{}", entry.name().unwrap_or(""));
        if entry.kind() != Some(git2::ObjectType::Blob) || !path.starts_with(prefix) {
            return git2::TreeWalkResult::Ok;
        }
        let Ok(blob) = repo.find_blob(entry.id()) else {
            return git2::TreeWalkResult::Abort;
        };
        let file = dest.join(&path);
        let written = std::fs::create_dir_all(file.parent().unwrap_or(dest)).and_then(|_| {
            match crate::error::injected_write_failure("head-tree") {
                Some(e) => Err(e),
                None => std::fs::write(&file, blob.content()).and_then(|_| {
                    std::fs::File::options()
                        .write(true)
                        .open(&file)?
                        .set_modified(EXPORTED_MTIME)
                }),
            }
        });
        if let Err(source) = written {
            failed = Some(crate::error::WriteError {
                what,
                path: file,
                source,
            });
            return git2::TreeWalkResult::Abort;
        }
        git2::TreeWalkResult::Ok
    });
    // The write's own error first: the walk only says that its callback stopped it.
    if let Some(e) = failed {
        return Err(e.into());
    }
    walked.map_err(git)?;
    Ok(())
}

pub(super) fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .flat_map(|p| {
            if p.is_dir() {
                let mut v = walk(&p);
                v.push(p);
                v
            } else {
                vec![p]
            }
        })
        .collect()
}

/// Size, mtime and ctime (which no user can set), and a content hash for small files.
pub(crate) fn fingerprint(files: &[PathBuf]) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let mut fp = Fingerprint::new();
    for f in files {
        if let Ok(m) = std::fs::symlink_metadata(f) {
            let content = if m.is_file() && m.len() < 1 << 24 {
                std::fs::read(f)
                    .map(|b| {
                        i64::from_le_bytes(
                            blake3::hash(&b).as_bytes()[..8]
                                .try_into()
                                .expect("8 bytes"),
                        )
                    })
                    .unwrap_or(0)
            } else {
                0
            };
            fp.insert(
                f.clone(),
                (
                    m.len(),
                    m.mtime_nsec() + m.mtime() * 1_000_000_000,
                    m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                    content,
                ),
            );
        }
    }
    fp
}

/// Guarded files changed, removed, or (in a guarded folder) added.
pub(crate) fn fingerprint_changes(before: &Fingerprint, after: &Fingerprint) -> Vec<String> {
    let mut changed: BTreeSet<String> = before
        .iter()
        .filter(|(p, v)| after.get(*p) != Some(v))
        .map(|(p, _)| p.display().to_string())
        .collect();
    for dir in before.keys().filter(|p| p.is_dir()) {
        for p in walk(dir) {
            if !before.contains_key(&p) {
                changed.insert(p.display().to_string());
            }
        }
    }
    changed.into_iter().collect()
}

pub(crate) fn file_hash(path: &Path) -> Option<blake3::Hash> {
    std::fs::read(path).ok().map(|b| blake3::hash(&b))
}

pub(crate) fn short(commit: &str) -> &str {
    &commit[..commit.len().min(10)]
}
