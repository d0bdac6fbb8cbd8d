//! The one stop path of every run that edits the tree (`step`, `judge`, agent sessions): on SIGINT, SIGTERM or SIGHUP the work in flight is dropped, its children ended, the edit restored with its patch kept, and `interrupted` logged.
use super::{attempt, changes, head_of, in_scope, restore, Session};
use crate::error::{Error, Result};
use crate::log::runlog::{Record, RunCommand};
use crate::run::shared::Events;
use anyhow::anyhow;
use std::future::Future;

/// `work`, unless a stop request comes first (or came already): then `None`, and `work` is dropped
/// at the point where it waits, which ends the proposer, agents and workers it started.
pub(crate) async fn unless_stopped<T>(work: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        _ = crate::os::stop::reached(1) => None,
        done = work => Some(done),
    }
}

impl Session<'_> {
    /// End the run on a stop request that came during step `n`: every child ended (nothing writes
    /// on in the tree), the edit in the working tree restored to HEAD with its patch kept as the
    /// step's attempt, `interrupted` logged naming both. The error is what the command exits with
    /// (128 + the signal).
    pub(crate) fn interrupted(&self, n: u32, events: &mut Events) -> Error {
        crate::os::stop::kill_children();
        let signal = crate::os::stop::requested().unwrap_or(libc::SIGINT);
        let edit = match self.put_edit_away(n) {
            Ok(note) => note,
            Err(e) => format!("the edit could not be restored: {e}; `git status` shows it"),
        };
        let mut reason = format!("{}; {edit}", crate::os::stop::reason());
        if self.opts.command == RunCommand::AgentSession {
            reason.push_str(&format!(
                "; `flashtune resume {}` takes the session up (its candidates' worktrees are kept)",
                self.run_id
            ));
        }
        if let Err(e) = events.emit(Record::Interrupted {
            reason: reason.clone(),
        }) {
            crate::tell!("cannot log `interrupted`: {e}");
        }
        Error::Interrupted {
            signal,
            message: format!("interrupted: {reason}"),
        }
    }

    /// Restore what step `n` left in the working tree, its patch kept first; says what it did.
    /// With a proposer (or an agent session) every change is the run's own, since the tree was
    /// clean outside the scope when it began; without one, only the edit under the scope is.
    fn put_edit_away(&self, n: u32) -> Result<String> {
        let (inside, outside) = changes(self.project, self.root)?;
        let proposed =
            self.opts.proposer.is_some() || self.opts.command == RunCommand::AgentSession;
        let edit: Vec<String> = inside
            .into_iter()
            .chain(outside.into_iter().filter(|_| proposed))
            .collect();
        if edit.is_empty() {
            return Ok("no edit was left in the working tree".into());
        }
        let repo = git2::Repository::open(self.root)
            .map_err(|e| Error::Other(anyhow!("{}", e.message())))?;
        let (base, _) = head_of(&repo)?;
        let diff = attempt::diff_against(
            self.root,
            &base,
            |p| in_scope(self.project, p),
            |p| !edit.iter().any(|e| e == p),
        )?;
        attempt::keep_patch(self.run_dir, n, None, &diff.patch)?;
        restore(self.root, &edit)?;
        Ok(format!(
            "step {n}'s edit ({}) was restored to HEAD, its patch kept as {} (`git apply` it to have the edit back)",
            edit.join(", "),
            crate::pack::attempt_patch_path(self.run_dir, n, None).display()
        ))
    }
}
