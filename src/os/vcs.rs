//! Git through git2: the commit a run starts from, champions committed on their own branch, and the commit-or-revert of kernel edits.
use std::path::Path;

/// `HEAD`'s commit id, with `-dirty` when tracked files have uncommitted changes.
pub fn head(root: &Path) -> Option<String> {
    let repo = git2::Repository::discover(root).ok()?;
    let id = repo.head().ok()?.peel_to_commit().ok()?.id().to_string();
    let dirty = !changed_files(&repo).is_empty();
    Some(if dirty { format!("{id}-dirty") } else { id })
}

/// Whether git tracks any file in `dir` (in the repository that holds it): such a folder is part
/// of the tree a clone gets, and reading it must not write into it.
pub fn holds_tracked_files(dir: &Path) -> bool {
    let Ok(repo) = git2::Repository::discover(dir) else {
        return false;
    };
    let (Some(workdir), Ok(index)) = (repo.workdir(), repo.index()) else {
        return false;
    };
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let Ok(rel) = canon(dir)
        .strip_prefix(canon(workdir))
        .map(Path::to_path_buf)
    else {
        return false;
    };
    index
        .iter()
        .any(|e| std::str::from_utf8(&e.path).is_ok_and(|p| Path::new(p).starts_with(&rel)))
}

/// Tracked files with uncommitted changes (untracked files are not counted).
pub fn changed_files(repo: &git2::Repository) -> Vec<String> {
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(false).include_ignored(false);
    repo.statuses(Some(&mut opts))
        .map(|st| {
            st.iter()
                .filter_map(|e| e.path().ok().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Tracked files among `paths` (repository-relative) with uncommitted changes.
pub fn dirty_among(root: &Path, paths: &[&str]) -> Result<Vec<String>, git2::Error> {
    let repo = git2::Repository::discover(root)?;
    Ok(changed_files(&repo)
        .into_iter()
        .filter(|f| {
            paths
                .iter()
                .any(|p| f == p || f.starts_with(&format!("{p}/")))
        })
        .collect())
}

/// Commit `files` (repository-relative path, new content) on top of HEAD into `refs/heads/<branch>`,
/// leaving HEAD, the index and the working tree alone. Returns the commit id.
pub fn commit_files_to_branch(
    root: &Path,
    branch: &str,
    files: &[(&str, &[u8])],
    message: &str,
) -> Result<String, git2::Error> {
    let repo = git2::Repository::discover(root)?;
    let head = repo.head()?.peel_to_commit()?;
    let mut index = git2::Index::new()?;
    index.read_tree(&head.tree()?)?;
    for (path, content) in files {
        let blob = repo.blob(content)?;
        index.add(&index_entry(path, blob, content.len(), 0o100644))?;
    }
    let tree = repo.find_tree(index.write_tree_to(&repo)?)?;
    let sig = signature(&repo)?;
    let commit = repo.commit(None, &sig, &sig, message, &tree, &[&head])?;
    repo.reference(
        &format!("refs/heads/{branch}"),
        commit,
        true,
        "flashtune: champions",
    )?;
    Ok(commit.to_string())
}

/// References under `prefix` (e.g. `refs/flashtune/fake/<run>/`) with the commit each points at.
pub fn refs_under(root: &Path, prefix: &str) -> Vec<(String, String)> {
    let Ok(repo) = git2::Repository::discover(root) else {
        return Vec::new();
    };
    let Ok(refs) = repo.references_glob(&format!("{prefix}*")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for r in refs {
        let Ok(r) = r else { continue };
        if let (Ok(name), Ok(commit)) = (r.name(), r.peel_to_commit()) {
            out.push((name.to_owned(), commit.id().to_string()));
        }
    }
    out
}

/// Commit the working-tree state of `paths` on the current branch (HEAD moves).
pub fn commit_paths(root: &Path, paths: &[String], message: &str) -> Result<String, git2::Error> {
    let repo = git2::Repository::discover(root)?;
    let mut index = repo.index()?;
    for p in paths {
        if repo.workdir().is_some_and(|w| w.join(p).exists()) {
            index.add_path(Path::new(p))?;
        } else {
            index.remove_path(Path::new(p))?;
        }
    }
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let head = repo.head()?.peel_to_commit()?;
    let sig = signature(&repo)?;
    Ok(repo
        .commit(Some("HEAD"), &sig, &sig, message, &tree, &[&head])?
        .to_string())
}

/// Put `paths` back as HEAD has them (the auto-revert); files HEAD lacks are removed.
pub fn restore_paths(root: &Path, paths: &[String]) -> Result<(), git2::Error> {
    let repo = git2::Repository::discover(root)?;
    let head_tree = repo.head()?.peel_to_tree()?;
    let workdir = repo
        .workdir()
        .ok_or_else(|| git2::Error::from_str("bare repository"))?
        .to_path_buf();
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    let mut any = false;
    for p in paths {
        // A link, a FIFO or a folder goes first, itself: a checkout could write through a link to
        // wherever it points.
        let path = workdir.join(p);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.file_type().is_file()) {
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
        if head_tree.get_path(Path::new(p)).is_ok() {
            checkout.path(p);
            any = true;
        } else {
            let _ = std::fs::remove_file(workdir.join(p));
        }
    }
    if any {
        repo.checkout_head(Some(&mut checkout))?;
    }
    Ok(())
}

/// Files changed against HEAD in the working tree, untracked ones included.
pub fn changed_against_head(root: &Path) -> Result<Vec<String>, git2::Error> {
    let repo = git2::Repository::discover(root)?;
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false);
    let statuses = repo.statuses(Some(&mut opts))?;
    let files = statuses
        .iter()
        .filter_map(|e| e.path().ok().map(str::to_owned))
        .collect();
    Ok(files)
}

/// An index entry for `path` holding the blob `id` (`len` bytes) with `mode`; no stat data, so git
/// compares the working file by content.
pub(crate) fn index_entry(path: &str, id: git2::Oid, len: usize, mode: u32) -> git2::IndexEntry {
    git2::IndexEntry {
        ctime: git2::IndexTime::new(0, 0),
        mtime: git2::IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode,
        uid: 0,
        gid: 0,
        file_size: len as u32,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// The repository's configured identity, or flashtune's own when none is set.
pub(crate) fn signature(repo: &git2::Repository) -> Result<git2::Signature<'static>, git2::Error> {
    repo.signature()
        .map(|s| s.to_owned())
        .or_else(|_| git2::Signature::now("flashtune", "flashtune@localhost"))
}
