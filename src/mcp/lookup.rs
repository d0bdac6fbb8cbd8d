//! What a tool's arguments name, looked up in the project: a path inside it, a run folder, the variants its spaces have and its runs timed.
use super::{refusal, Workbench};
use crate::log::runlog::Record;
use rmcp::model::CallToolResult;
use serde_json::json;
use std::path::{Component, Path, PathBuf};

impl Workbench {
    /// A path an agent names must stay inside the project: no absolute path elsewhere, no `..` out.
    pub(super) fn inside_project(
        &self,
        given: &str,
    ) -> std::result::Result<PathBuf, CallToolResult> {
        let path = Path::new(given);
        let joined = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        };
        let mut normal = PathBuf::new();
        for c in joined.components() {
            match c {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        let root = self
            .root
            .canonicalize()
            .unwrap_or_else(|_| self.root.clone());
        // The deepest part that exists, resolved (symlinks, a relative root), with the rest after it:
        // a missing file inside the project is "not found", not "outside".
        let mut existing = normal.as_path();
        let mut rest = Vec::new();
        while !existing.exists() {
            match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => break,
            }
        }
        let mut real = existing
            .canonicalize()
            .unwrap_or_else(|_| existing.to_path_buf());
        real.extend(rest.iter().rev());
        if !real.starts_with(&root) {
            return Err(refusal(
                "path_outside_project",
                format!(
                    "`{given}` lies outside the project {}; name files relative to it",
                    root.display()
                ),
                json!({}),
            ));
        }
        if !real.exists() {
            return Err(refusal(
                "not_found",
                format!("`{given}` does not exist in the project {}", root.display()),
                json!({}),
            ));
        }
        Ok(real)
    }

    pub(super) fn run_folder(&self, given: &str) -> std::result::Result<PathBuf, CallToolResult> {
        let dir = if given.contains('/') {
            self.inside_project(given)?
        } else {
            self.paths.runs().join(given)
        };
        if !dir.join("log.jsonl").is_file() {
            return Err(refusal(
                "no_run",
                format!("no run log at {}", dir.join("log.jsonl").display()),
                json!({}),
            ));
        }
        Ok(dir)
    }

    pub(super) fn runs_newest_first(&self) -> Vec<PathBuf> {
        let mut runs: Vec<PathBuf> = std::fs::read_dir(self.paths.runs())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        runs.retain(|p| p.join("log.jsonl").is_file());
        crate::log::runlog::sort_by_start(&mut runs);
        runs.reverse();
        runs
    }

    pub(super) fn newest_run_timing(&self, variant: &str) -> Option<PathBuf> {
        self.runs_newest_first().into_iter().find(|dir| {
            run_log(dir).is_ok_and(|log| timed_variants(&log).iter().any(|v| v == variant))
        })
    }

    /// Every variant of every space beside the default one (`variants/*.toml`).
    pub(super) fn project_variants(&self) -> Vec<String> {
        let Ok((policies, _)) = crate::model::config::Policies::load(&self.paths.policies()) else {
            return Vec::new();
        };
        let default = self.paths.resolve(&policies.default_space);
        let Some(dir) = default.parent() else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
        files
            .iter()
            .filter_map(|p| crate::model::space::Space::load(p).ok()?.variants().ok())
            .flatten()
            .map(|v| v.id)
            .collect()
    }

    pub(super) fn variants_timed(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .runs_newest_first()
            .iter()
            .filter_map(|dir| run_log(dir).ok())
            .flat_map(|log| timed_variants(&log))
            .collect();
        all.sort();
        all.dedup();
        all
    }
}

/// The log of a run under runs/, as the server's lookups read it: another process's run, finished
/// or still running (its last line may be torn), never the server's own.
pub(super) fn run_log(dir: &Path) -> anyhow::Result<crate::log::runlog::LoadedLog> {
    crate::log::runlog::read(&dir.join("log.jsonl"))
}

pub(super) fn timed_variants(log: &crate::log::runlog::LoadedLog) -> Vec<String> {
    let mut v: Vec<String> = log
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Timed { variant, .. } => Some(variant.clone()),
            _ => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}
