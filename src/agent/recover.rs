//! Resuming a killed agent session: the step in flight finished with nothing half-done.
use super::worktree::{remove_worktree, worktree_name};
use super::{git, Proposal, Runner};
use crate::error::Result;
use crate::log::runlog::Record;
use crate::model::vocab::ProcessEnd;
use crate::run::shared::Events;
use crate::step;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

impl Runner<'_> {
    /// In-scope files of the main working tree back to HEAD (an edit applied but never committed).
    pub(super) fn restore_scope(&self) -> Result<Vec<String>> {
        let (inside, _) = step::changes(&self.bench.project, &self.bench.root)?;
        if !inside.is_empty() {
            step::restore(&self.bench.root, &inside)?;
        }
        Ok(inside)
    }

    /// Finish step `n`, which a killed session left in flight.
    pub(super) async fn recover(
        &self,
        n: u32,
        loaded: &crate::log::runlog::LoadedLog,
        events: &mut Events,
    ) -> Result<()> {
        let bench = self.bench;
        let repo = git2::Repository::open(&bench.root).map_err(git)?;
        let head = repo.head().and_then(|h| h.peel_to_commit()).map_err(git)?;
        let trailer = format!("Flashtune-Step: {}/{n}\n", bench.run_id);
        // On the fake GPU the step's commit is its scratch reference; on a GPU, HEAD with its trailer.
        let reference = step::scratch_ref(&bench.run_id, n);
        let scratch = repo
            .find_reference(&reference)
            .and_then(|r| r.peel_to_commit())
            .ok()
            .map(|c| c.id().to_string());
        let recovered_commit = match &scratch {
            Some(id) => Some(id.clone()),
            None => head
                .message()
                .is_ok_and(|m| m.contains(&trailer))
                .then(|| head.id().to_string()),
        };
        let restored = self.restore_scope()?;
        events.emit(Record::SessionResumed {
            step: Some(n),
            restored,
            recovered_commit: recovered_commit.clone(),
        })?;
        let InFlight {
            starts,
            proposed,
            closed,
        } = in_flight(loaded, n);
        if let Some(commit) = recovered_commit {
            // The winner was committed before the log said so: the step is decided; the rest dropped.
            for (&k, workdir) in &starts {
                if !closed.contains(&k) {
                    events.emit(Record::CandidateDropped {
                        step: n,
                        candidate: k,
                        reason: "the session was killed after this step's commit; not judged"
                            .into(),
                    })?;
                }
                remove_worktree(&repo, &worktree_name(&bench.run_id, n, k), workdir);
            }
            events.emit(Record::StepDecided {
                step: n,
                accepted: true,
                reason: if scratch.is_some() {
                    "committed before the session was killed; recovered from its scratch reference"
                } else {
                    "committed before the session was killed; recovered from HEAD's trailer"
                }
                .into(),
                geomean_gain: None,
                commit: Some(commit),
                restored: Vec::new(),
                candidate: None,
                scratch_ref: scratch.map(|_| reference),
            })?;
            return Ok(());
        }
        let base = self.base_commit(&head.id().to_string());
        let mut proposals = Vec::new();
        for (&k, workdir) in &starts {
            match proposed.get(&k) {
                Some((changed, ok)) if workdir.is_dir() => {
                    // Judged again from its worktree, as if the session had not stopped.
                    let unjudged = if !ok {
                        Some("the agent did not finish cleanly or left its scope (see candidate_proposed)".into())
                    } else if changed.is_empty() {
                        Some("no edits under kernels/ to judge".into())
                    } else {
                        None
                    };
                    proposals.push(snapshotted(&repo, &base, k, workdir, changed, unjudged)?);
                }
                _ => {
                    if let Some(p) = self.recover_unlogged(n, &repo, &base, k, workdir, events)? {
                        proposals.push(p);
                    }
                }
            }
        }
        let markdown = self.one_step(n, Some(proposals), events).await?;
        if !self.opts.quiet {
            crate::say!("{markdown}");
        }
        Ok(())
    }

    /// A candidate whose proposal the log does not hold: the agent's guard writes its exit code when
    /// the agent ends, so one that finished before the kill is judged as it would have been; one
    /// killed mid-edit is dropped, its patch kept either way.
    fn recover_unlogged(
        &self,
        n: u32,
        repo: &git2::Repository,
        base: &str,
        k: u32,
        workdir: &Path,
        events: &mut Events,
    ) -> Result<Option<Proposal>> {
        let bench = self.bench;
        let exit = std::fs::read_to_string(workdir.with_extension("agent").join("exit"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        let diff = workdir
            .is_dir()
            .then(|| {
                step::diff_against(
                    workdir,
                    base,
                    |p| step::in_scope(&bench.project, p),
                    crate::pack::is_pack_path,
                )
                .ok()
            })
            .flatten();
        if let Some(diff) = &diff {
            if !diff.inside.is_empty() || !diff.outside.is_empty() {
                step::keep_patch(&bench.run_dir, n, Some(k), &diff.patch)?;
            }
            if exit == Some(0) && !diff.inside.is_empty() && diff.outside.is_empty() {
                return snapshotted(repo, base, k, workdir, &diff.inside, None).map(Some);
            }
        }
        events.emit(Record::CandidateDropped {
            step: n,
            candidate: k,
            reason: match exit {
                Some(code) => format!("its agent exited {code} but the session was killed before it was judged; dropped unjudged, its patch kept"),
                None => "the session was killed while this candidate's agent ran; dropped unjudged, its patch kept".into(),
            },
        })?;
        remove_worktree(repo, &worktree_name(&bench.run_id, n, k), workdir);
        Ok(None)
    }
}

/// What the log says of step `n`'s candidates: their worktrees, what each agent proposed (and
/// whether it finished cleanly inside its scope), and which were judged or dropped already.
struct InFlight {
    starts: BTreeMap<u32, PathBuf>,
    proposed: BTreeMap<u32, (Vec<String>, bool)>,
    closed: Vec<u32>,
}

fn in_flight(loaded: &crate::log::runlog::LoadedLog, n: u32) -> InFlight {
    let mut starts: BTreeMap<u32, PathBuf> = BTreeMap::new();
    let mut proposed: BTreeMap<u32, (Vec<String>, bool)> = BTreeMap::new();
    let mut closed: Vec<u32> = Vec::new();
    for (_, e) in &loaded.entries {
        match &e.record {
            Record::CandidateStarted {
                step,
                candidate,
                workdir,
                ..
            } if *step == n => {
                starts.insert(*candidate, workdir.clone());
            }
            Record::CandidateProposed {
                step,
                candidate,
                changed_files,
                outside_scope,
                end,
                ..
            } if *step == n => {
                let ended = end.unwrap_or(ProcessEnd::WaitFailed);
                let ok = ended.succeeded() && outside_scope.is_empty();
                proposed.insert(*candidate, (changed_files.clone(), ok));
            }
            Record::CandidateJudged {
                step, candidate, ..
            }
            | Record::CandidateDropped {
                step, candidate, ..
            } if *step == n => closed.push(*candidate),
            _ => {}
        }
    }
    InFlight {
        starts,
        proposed,
        closed,
    }
}

/// A recovered proposal with its edit snapshotted now, as the session would have when its agent
/// ended; one whose edit holds anything but regular files is left unjudged, saying so.
fn snapshotted(
    repo: &git2::Repository,
    base: &str,
    candidate: u32,
    workdir: &Path,
    changed: &[String],
    unjudged: Option<String>,
) -> Result<Proposal> {
    let mut p = Proposal {
        candidate,
        workdir: workdir.to_path_buf(),
        changed: changed.to_vec(),
        unjudged,
        snapshot: None,
    };
    if p.unjudged.is_some() {
        return Ok(p);
    }
    let not_files = step::irregular(&p.workdir, &p.changed);
    if !not_files.is_empty() {
        p.unjudged = Some(step::irregular_reason("the agent", &not_files));
        return Ok(p);
    }
    p.snapshot = Some(step::Candidate::snapshot(
        repo, base, &p.workdir, &p.changed,
    )?);
    Ok(p)
}
