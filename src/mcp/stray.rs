//! Changes outside the edit scope that the agent made while the server ran: undone with the edit,
//! and the refusal logged as a run of its own, its patch kept, like any judged edit.
use super::{refusal, to_value, JudgeArgs, Workbench};
use crate::run::shared::Project;
use rmcp::model::CallToolResult;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

impl Workbench {
    /// Changes outside the edit scope that were not there when the server started are the agent's:
    /// undo them and every edit inside the scope too (half an edit is not judged), and say so.
    /// Without a project (its policies do not load), only `kernels/` is in scope.
    pub(super) fn undo_stray_changes(
        &self,
        project: Option<&Project>,
        args: &JudgeArgs,
    ) -> Option<CallToolResult> {
        let changed = match crate::os::vcs::changed_against_head(&self.root) {
            Ok(c) => c,
            Err(e) => {
                return Some(refusal(
                    "not_a_repository",
                    format!("judge commits or restores through git: {}", e.message()),
                    json!({}),
                ))
            }
        };
        let (inside, outside): (Vec<String>, Vec<String>) = changed
            .into_iter()
            .filter(|p| !p.starts_with("runs/"))
            .partition(|p| match project {
                Some(project) => crate::step::in_scope(project, p),
                None => p.starts_with(crate::step::EDIT_SCOPE),
            });
        let stray: Vec<String> = outside
            .into_iter()
            .filter(|p| self.baseline.get(p) != Some(&read_opt(&self.root.join(p))))
            .collect();
        if stray.is_empty() {
            return None;
        }
        let restored: Vec<String> = inside.iter().chain(&stray).cloned().collect();
        // The edit's patch before it is undone: the history keeps it like any judged edit's.
        let base = crate::os::vcs::head(&self.root)
            .map(|h| h.trim_end_matches("-dirty").to_owned())
            .unwrap_or_default();
        let diff = crate::step::diff_against(
            &self.root,
            &base,
            |p| inside.iter().any(|i| i == p),
            |p| !restored.iter().any(|r| r == p),
        )
        .ok();
        let mut failed = Vec::new();
        let mut to_head: Vec<String> = inside.clone();
        for p in &stray {
            match self.baseline.get(p) {
                Some(Some(bytes)) => {
                    if let Err(e) = std::fs::write(self.root.join(p), bytes) {
                        failed.push(format!("{p}: {e}"));
                    }
                }
                Some(None) => {
                    let _ = std::fs::remove_file(self.root.join(p));
                }
                None => to_head.push(p.clone()),
            }
        }
        if let Err(e) = crate::os::vcs::restore_paths(&self.root, &to_head) {
            failed.push(e.message().to_owned());
        }
        let reason = format!(
            "changes outside the edit scope ({}, except {}): {}; all the edit's changes were restored unjudged",
            crate::step::EDIT_SCOPE,
            project.map_or("nothing".to_owned(), |p| crate::step::protected(p).join(" and ")),
            stray.join(", ")
        );
        if !failed.is_empty() {
            return Some(refusal(
                "restore_failed",
                format!(
                    "{reason}; but some could not be restored: {}",
                    failed.join("; ")
                ),
                json!({ "restored": restored }),
            ));
        }
        let logged = crate::agent::log_refusal(crate::agent::Refusal {
            paths: self.paths.clone(),
            space: args.space.as_ref().map(PathBuf::from),
            fake: self.fake_gpu,
            base,
            files: restored.clone(),
            diff_stat: diff.as_ref().map_or(String::new(), |d| d.stat.clone()),
            patch: diff.map_or(String::new(), |d| d.patch),
            reason: reason.clone(),
            idea: args.idea.clone(),
        });
        Some(match logged {
            Ok(verdict) => CallToolResult::structured(to_value(&verdict)),
            // The edit is undone whatever the log says; the verdict is still the agent's to read.
            Err(e) => refusal(
                "judge_refused",
                format!("{reason} (and the refusal could not be logged: {e})"),
                json!({ "restored": restored }),
            ),
        })
    }
}

/// Every changed path outside `runs/` with its content now (None: deleted).
pub(super) fn outside_scope_now(root: &Path) -> Option<BTreeMap<String, Option<Vec<u8>>>> {
    let changed = crate::os::vcs::changed_against_head(root).ok()?;
    Some(
        changed
            .into_iter()
            .filter(|p| !p.starts_with("runs/"))
            .map(|p| {
                let content = read_opt(&root.join(&p));
                (p, content)
            })
            .collect(),
    )
}

pub(super) fn read_opt(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}
