//! An edit as the tree that would be committed: the base commit's tree with the edit scope's
//! changed files, read once from the working tree into a git tree object when judging starts.
//! Everything judged is built from an export of that object, and that object is what gets
//! committed, byte for byte; what the working tree holds afterwards is the agent's own.
use crate::error::{Error, Result, WriteError};
use anyhow::anyhow;
use std::path::{Path, PathBuf};

/// A snapshotted edit: its tree object, the commit it sits on, and the files it changed.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) base: git2::Oid,
    pub(crate) tree: git2::Oid,
    pub(crate) files: Vec<String>,
}

/// A failed git operation on `repo` (a full disk named as such: [`super::tree::git_failed`]).
fn git<'r>(repo: &'r git2::Repository, what: &'static str) -> impl Fn(git2::Error) -> Error + 'r {
    move |e| super::tree::git_failed(repo.path(), what, e)
}

impl Candidate {
    /// `base`'s tree with each of `files` as `workdir` holds it now (or removed, where it is gone).
    /// Each file is read once, here: a later write to the working tree changes nothing judged.
    /// The caller has refused anything but regular files.
    pub(crate) fn snapshot(
        repo: &git2::Repository,
        base: &str,
        workdir: &Path,
        files: &[String],
    ) -> Result<Candidate> {
        let cannot = git(repo, "cannot snapshot the edit");
        let base = git2::Oid::from_str(base).map_err(&cannot)?;
        let base_tree = repo
            .find_commit(base)
            .and_then(|c| c.tree())
            .map_err(&cannot)?;
        let mut index = git2::Index::new().map_err(&cannot)?;
        index.read_tree(&base_tree).map_err(&cannot)?;
        for file in files {
            let path = workdir.join(file);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_file() => {
                    let bytes = std::fs::read(&path).map_err(|e| {
                        Error::Other(anyhow!("cannot read the edit's {}: {e}", path.display()))
                    })?;
                    let blob = repo.blob(&bytes).map_err(&cannot)?;
                    // The mode HEAD gives the file, where it has it; git attributes and filters
                    // never apply: the bytes read are the bytes committed.
                    let mode = base_tree
                        .get_path(Path::new(file))
                        .map(|e| e.filemode() as u32)
                        .unwrap_or(0o100644);
                    index
                        .add(&crate::os::vcs::index_entry(file, blob, bytes.len(), mode))
                        .map_err(&cannot)?;
                }
                Ok(_) => {
                    return Err(Error::Other(anyhow!(
                        "{file} is not a regular file; it cannot be part of an edit"
                    )))
                }
                Err(_) => {
                    let _ = index.remove_path(Path::new(file));
                }
            }
        }
        let tree = index.write_tree_to(repo).map_err(&cannot)?;
        Ok(Candidate {
            base,
            tree,
            files: files.to_vec(),
        })
    }

    /// Write the candidate's files under `prefix` into `dest`, at their repository paths: the only
    /// sources its builds see.
    pub(crate) fn export(&self, repo: &git2::Repository, prefix: &str, dest: &Path) -> Result<()> {
        super::tree::extract_tree_object(
            repo,
            self.tree,
            prefix,
            dest,
            "write the edit's source to",
        )
    }

    /// Commit the candidate's tree onto `base`. With `refname`, that reference is made or moved and
    /// nothing else changes (the fake GPU's scratch reference); without, the current branch moves
    /// to it and the index takes the candidate's files, so the working tree's later changes, the
    /// agent's own, show as changes against the new HEAD.
    pub(crate) fn commit(
        &self,
        repo: &git2::Repository,
        message: &str,
        refname: Option<&str>,
    ) -> Result<String> {
        let cannot = git(repo, "cannot commit the edit");
        let tree = repo.find_tree(self.tree).map_err(&cannot)?;
        let parent = repo.find_commit(self.base).map_err(&cannot)?;
        let sig = crate::os::vcs::signature(repo).map_err(&cannot)?;
        let commit = match refname {
            Some(name) => {
                let id = repo
                    .commit(None, &sig, &sig, message, &tree, &[&parent])
                    .map_err(&cannot)?;
                repo.reference(name, id, true, "flashtune: synthetic step")
                    .map_err(&cannot)?;
                id
            }
            None => {
                let id = repo
                    .commit(Some("HEAD"), &sig, &sig, message, &tree, &[&parent])
                    .map_err(&cannot)?;
                let mut index = repo.index().map_err(&cannot)?;
                for file in &self.files {
                    match tree.get_path(Path::new(file)) {
                        Ok(entry) => {
                            let blob = repo.find_blob(entry.id()).map_err(&cannot)?;
                            index
                                .add(&crate::os::vcs::index_entry(
                                    file,
                                    entry.id(),
                                    blob.content().len(),
                                    entry.filemode() as u32,
                                ))
                                .map_err(&cannot)?;
                        }
                        Err(_) => {
                            let _ = index.remove_path(Path::new(file));
                        }
                    }
                }
                index.write().map_err(&cannot)?;
                id
            }
        };
        self.confirm(repo, commit)?;
        Ok(commit.to_string())
    }

    /// The commit holds exactly the judged tree: its cubins are the ones judged, since every
    /// build read that tree's export and nothing else.
    fn confirm(&self, repo: &git2::Repository, commit: git2::Oid) -> Result<()> {
        let committed = repo
            .find_commit(commit)
            .map(|c| c.tree_id())
            .map_err(git(repo, "cannot read the commit back"))?;
        if committed != self.tree {
            return Err(Error::Other(anyhow!(
                "commit {commit} holds tree {committed}, not the judged tree {}",
                self.tree
            )));
        }
        Ok(())
    }

    /// The working tree's copy of the candidate's files put back into `workdir` from the tree
    /// (where an agent session's winner lives in a worktree of its own).
    pub(crate) fn write_files(&self, repo: &git2::Repository, workdir: &Path) -> Result<()> {
        let cannot = git(repo, "cannot write the committed edit");
        let tree = repo.find_tree(self.tree).map_err(&cannot)?;
        for file in &self.files {
            let path = workdir.join(file);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
            match tree.get_path(Path::new(file)) {
                Ok(entry) => {
                    let blob = repo.find_blob(entry.id()).map_err(&cannot)?;
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir)
                            .map_err(|e| WriteError::new("create", dir, e))?;
                    }
                    std::fs::write(&path, blob.content())
                        .map_err(|e| WriteError::new("write the committed edit to", &path, e))?;
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(())
    }
}

/// Of the quoted includes reachable from `source` in the export `tree`, those that do not resolve
/// inside it although the working tree `workdir` has the file: a git-ignored header, an untracked
/// file outside the edit scope, a file outside the project; or an absolute path. Each is named
/// with the file that includes it. (nvcc's own list of what it read is the backstop for includes
/// no text scan sees, such as a name built by a macro.)
pub fn includes_outside(tree: &Path, workdir: &Path, source: &Path) -> Vec<String> {
    let tree = tree.canonicalize().unwrap_or_else(|_| tree.to_path_buf());
    let start = tree.join(source);
    let search_dir = start.parent().unwrap_or(&tree).to_path_buf();
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut todo = vec![start];
    let mut out = Vec::new();
    let in_tree = |p: &Path| p.is_file() && p.canonicalize().is_ok_and(|c| c.starts_with(&tree));
    while let Some(file) = todo.pop() {
        if seen.contains(&file) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let here = file.parent().unwrap_or(&tree).to_path_buf();
        let shown = file
            .strip_prefix(&tree)
            .unwrap_or(&file)
            .display()
            .to_string();
        for name in crate::gpu::build::quoted_includes(&text) {
            if Path::new(&name).is_absolute() {
                out.push(format!("{shown} includes \"{name}\", an absolute path"));
                continue;
            }
            if let Some(found) = [here.join(&name), search_dir.join(&name)]
                .into_iter()
                .find(|p| in_tree(p))
            {
                todo.push(found);
                continue;
            }
            let outside = [here.join(&name), search_dir.join(&name)]
                .iter()
                .filter_map(|p| p.strip_prefix(&tree).ok().map(|rel| workdir.join(rel)))
                .find(|p| p.exists());
            if let Some(found) = outside {
                out.push(format!(
                    "{shown} includes \"{name}\", which the working tree has ({}) but the edit's \
                     tree does not (git ignores it, or it lies outside kernels/ or the project)",
                    found.display()
                ));
            }
        }
        seen.push(file);
    }
    out
}
