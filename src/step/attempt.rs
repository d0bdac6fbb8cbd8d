//! What an attempt leaves behind whatever its verdict: its diff against the base (the whole patch in
//! the run folder, a bounded one in the log) and a one-line summary of its idea.
use crate::error::{Error, Result};
use crate::log::runlog::Idea;
use anyhow::{anyhow, Context};
use std::path::Path;

/// A tree's changes against the base commit.
pub(crate) struct TreeDiff {
    /// Changed paths in the edit scope.
    pub(crate) inside: Vec<String>,
    /// Changed paths outside it.
    pub(crate) outside: Vec<String>,
    /// `N files, +A -D` over the whole diff.
    pub(crate) stat: String,
    /// The whole diff, `git apply`-ready.
    pub(crate) patch: String,
}

impl TreeDiff {
    /// The patch cut to what the log keeps.
    pub(crate) fn bounded(&self) -> String {
        if self.patch.len() <= crate::pack::PATCH_MAX_BYTES {
            return self.patch.clone();
        }
        let mut cut = crate::pack::PATCH_MAX_BYTES;
        while !self.patch.is_char_boundary(cut) {
            cut -= 1;
        }
        format!(
            "{}\n[cut: the whole patch is in the run folder's attempts/]\n",
            &self.patch[..cut]
        )
    }

    /// What an attempt with no summary of its own tried: the files it touched, in one line.
    pub(crate) fn as_idea(&self) -> Idea {
        let names: Vec<&str> = self
            .inside
            .iter()
            .chain(&self.outside)
            .map(|f| f.rsplit('/').next().unwrap_or(f))
            .collect();
        Idea {
            summary: format!("edits {} ({})", names.join(", "), self.stat),
            from: "diff".into(),
        }
    }
}

/// Compare a work tree's files (whatever its HEAD) with the base commit's tree, untracked files
/// included; paths `skip` names (the pack's notes, flashtune's runs/) are not the edit.
pub(crate) fn diff_against(
    workdir: &Path,
    base: &str,
    in_scope: impl Fn(&str) -> bool,
    skip: impl Fn(&str) -> bool,
) -> Result<TreeDiff> {
    let git = |e: git2::Error| Error::Other(anyhow!("git: {}", e.message()));
    let wrepo = git2::Repository::open(workdir).map_err(git)?;
    let id = git2::Oid::from_str(base).map_err(git)?;
    let tree = wrepo.find_commit(id).and_then(|c| c.tree()).map_err(git)?;
    let mut opts = git2::DiffOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true);
    let diff = wrepo
        .diff_tree_to_workdir(Some(&tree), Some(&mut opts))
        .map_err(git)?;
    summarize(&diff, in_scope, skip)
}

/// A snapshotted candidate against the commit it sits on: the patch of exactly what is judged and
/// would be committed.
pub(crate) fn diff_candidate(
    repo: &git2::Repository,
    candidate: &super::candidate::Candidate,
    in_scope: impl Fn(&str) -> bool,
) -> Result<TreeDiff> {
    let git = |e: git2::Error| Error::Other(anyhow!("git: {}", e.message()));
    let base = repo
        .find_commit(candidate.base)
        .and_then(|c| c.tree())
        .map_err(git)?;
    let tree = repo.find_tree(candidate.tree).map_err(git)?;
    let diff = repo
        .diff_tree_to_tree(Some(&base), Some(&tree), None)
        .map_err(git)?;
    summarize(&diff, in_scope, |_| false)
}

/// The changed paths (split by scope), the stat and the patch of `diff`, less what `skip` names.
fn summarize(
    diff: &git2::Diff<'_>,
    in_scope: impl Fn(&str) -> bool,
    skip: impl Fn(&str) -> bool,
) -> Result<TreeDiff> {
    let git = |e: git2::Error| Error::Other(anyhow!("git: {}", e.message()));
    let path_of = |d: &git2::DiffDelta| {
        d.new_file()
            .path()
            .or_else(|| d.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for d in diff.deltas() {
        let path = path_of(&d);
        if path.is_empty() || skip(&path) {
            continue;
        }
        if in_scope(&path) {
            inside.push(path);
        } else {
            outside.push(path);
        }
    }
    let mut patch = String::new();
    let (mut plus, mut minus) = (0usize, 0usize);
    diff.print(git2::DiffFormat::Patch, |delta, _hunk, line| {
        if skip(&path_of(&delta)) {
            return true;
        }
        match line.origin() {
            '+' => plus += 1,
            '-' => minus += 1,
            _ => {}
        }
        if matches!(line.origin(), '+' | '-' | ' ') {
            patch.push(line.origin());
        }
        patch.push_str(&String::from_utf8_lossy(line.content()));
        true
    })
    .map_err(git)?;
    let files = inside.len() + outside.len();
    Ok(TreeDiff {
        stat: format!(
            "{files} file{}, +{plus} -{minus}",
            if files == 1 { "" } else { "s" }
        ),
        inside,
        outside,
        patch,
    })
}

/// Keep an attempt's whole patch in the run folder (`attempts/<step>[.<candidate>].patch`).
pub(crate) fn keep_patch(
    run_dir: &Path,
    step: u32,
    candidate: Option<u32>,
    patch: &str,
) -> Result<()> {
    let path = crate::pack::attempt_patch_path(run_dir, step, candidate);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let written = match crate::error::injected_write_failure("attempt-patch") {
        Some(e) => Err(e),
        None => std::fs::write(&path, patch),
    };
    written.map_err(|source| crate::error::WriteError {
        what: "write the attempt's patch to",
        path: path.clone(),
        source,
    })?;
    Ok(())
}

/// One line, at most 200 characters.
pub(crate) fn one_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut out: String = line.chars().take(200).collect();
    if line.chars().count() > 200 {
        out.push('…');
    }
    Some(out)
}

/// The `IDEA: ...` line an agent or proposer printed (the last one), if any.
pub(crate) fn idea_line(text: &str) -> Option<String> {
    text.lines().rev().find_map(|l| {
        let l = l.trim().trim_start_matches(['*', '-', '#', ' ', '`', '"']);
        let rest = l
            .strip_prefix("IDEA:")
            .or_else(|| l.strip_prefix("Idea:"))?;
        one_line(rest.trim_end_matches(['`', '"', '*']))
    })
}
