//! One step of an agent session: the base it builds on, the champion profiled, a worktree and a
//! context pack per candidate (the last one may start from a near miss), the agents, the judging,
//! and the best accepted candidate committed (to a scratch reference on the fake GPU).
use super::context::{build_pack, PackFor};
use super::ledger::{step_markdown, Ledger};
use super::worktree::{make_worktree, remove_worktree, sources_at, worktree_name};
use super::{git, write, Judged, Proposal, Runner};
use crate::error::{Error, Result};
use crate::log::runlog::Record;
use crate::pack::{self, BudgetLeft, ContextPack};
use crate::run::shared::Events;
use crate::step::{self, Pairing, EDIT_SCOPE};
use anyhow::Context;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

impl Runner<'_> {
    /// One step: make the worktrees and packs, run the agents side by side, judge, commit the best.
    /// With `recovered`, the agents already ran (a resumed step): those proposals are judged.
    pub(super) async fn one_step(
        &self,
        n: u32,
        recovered: Option<Vec<Proposal>>,
        events: &mut Events,
    ) -> Result<String> {
        let bench = self.bench;
        let session = self.session();
        // Absolute: agents run in their worktrees, and paths handed to them must not depend on the cwd.
        let step_dir = std::path::absolute(bench.run_dir.join(format!("step-{n}")))
            .with_context(|| format!("cannot resolve {}", bench.run_dir.display()))?;
        let repo = git2::Repository::open(&bench.root).map_err(git)?;
        let (head, head_ref) = step::head_of(&repo)?;
        let base = self.base_commit(&head);
        let pairings = session.champions(&repo)?;
        let head_tree = step_dir.join("head");
        if !head_tree.exists() {
            step::extract_tree(&repo, &base, EDIT_SCOPE, &head_tree)?;
        }
        let head_cubins = session.build_head(&pairings, &head_tree, events).await?;
        let proposals = match recovered {
            Some(p) => p,
            None => {
                let sources =
                    crate::run::shared::kernel_sources_hash(&bench.project, Some(&head_tree));
                session
                    .profile_champions(&pairings, &head_cubins, &sources, events)
                    .await?;
                let workdirs =
                    self.start_candidates(n, &repo, &base, &pairings, &step_dir, events)?;
                crate::tell!(
                    "step {n}: {} candidate agent(s) at work on {} ({})",
                    workdirs.len(),
                    step::short(&base),
                    self.agent.name
                );
                self.run_agents(n, &workdirs, &base, (&head, &head_ref), &repo, events)
                    .await?
            }
        };
        let judged = self
            .judge_all(n, &proposals, &pairings, &head_cubins, &step_dir, events)
            .await?;
        let decided = self.decide(n, &proposals, &judged)?;
        crate::tell!(
            "step {n}: {}: {}",
            if decided.accepted {
                "accepted"
            } else {
                "rejected"
            },
            decided.reason.lines().next().unwrap_or("")
        );
        events.emit(Record::StepDecided {
            step: n,
            accepted: decided.accepted,
            reason: decided.reason.clone(),
            geomean_gain: decided.gain,
            commit: decided.commit.clone(),
            restored: Vec::new(),
            candidate: decided.candidate,
            scratch_ref: decided.scratch_ref.clone(),
        })?;
        for p in &proposals {
            remove_worktree(
                &repo,
                &worktree_name(&bench.run_id, n, p.candidate),
                &p.workdir,
            );
        }
        let markdown = step_markdown(
            n,
            &base,
            &bench.device,
            &judged,
            &proposals,
            &decided,
            &Ledger::of(events.records()),
        );
        write(
            &bench.run_dir.join(format!("step-{n}.md")),
            markdown.as_bytes(),
        )?;
        Ok(markdown)
    }

    /// The commit a step builds on: HEAD, or on the fake GPU this session's latest scratch commit
    /// (its accepted edits never reach a branch, yet each step builds on the last one kept).
    pub(super) fn base_commit(&self, head: &str) -> String {
        if !self.bench.device.fake {
            return head.to_owned();
        }
        let prefix = format!("refs/flashtune/fake/{}/", self.bench.run_id);
        crate::os::vcs::refs_under(&self.bench.root, &prefix)
            .into_iter()
            .filter_map(|(name, id)| {
                let n: u32 = name.rsplit("step-").next()?.parse().ok()?;
                Some((n, id))
            })
            .max_by_key(|(n, _)| *n)
            .map_or_else(|| head.to_owned(), |(_, id)| id)
    }

    /// A worktree of the base and a context pack per candidate. With two candidates or more, the
    /// last starts from the best near miss of the archive not yet tried as a start in this session
    /// (its patch applied, uncommitted): the simplest form of islands.
    fn start_candidates(
        &self,
        n: u32,
        repo: &git2::Repository,
        base: &str,
        pairings: &[Pairing],
        step_dir: &Path,
        events: &mut Events,
    ) -> Result<Vec<(u32, PathBuf)>> {
        let bench = self.bench;
        let pack = self.pack(n, base, pairings, repo, events.records())?;
        let sources = sources_at(repo, base, &pack.sources)?;
        pack::write(&pack, &sources, &step_dir.join("pack"))
            .map_err(|e| Error::Other(e.context("cannot write the context pack")))?;
        let islands = if self.agent.candidates >= 2 {
            self.islands(&pack, events.records())
        } else {
            Vec::new()
        };
        let mut workdirs = Vec::new();
        for k in 1..=self.agent.candidates {
            let workdir = step_dir.join(format!("cand-{k}"));
            make_worktree(repo, &worktree_name(&bench.run_id, n, k), base, &workdir)?;
            // The best near miss whose patch applies to this base.
            let start = islands
                .iter()
                .filter(|_| k == self.agent.candidates)
                .find(|note| match apply_patch(&workdir, note) {
                    Ok(()) => true,
                    Err(why) => {
                        crate::tell!(
                            "step {n} candidate {k}: near miss {} does not apply to this base ({why})",
                            note.attempt
                        );
                        false
                    }
                });
            let mut own = pack.clone();
            own.start_from = start.cloned();
            let bytes = pack::write(&own, &sources, &workdir)
                .map_err(|e| Error::Other(e.context("cannot write the context pack")))?;
            events.emit(Record::CandidateStarted {
                step: n,
                candidate: k,
                workdir: workdir.clone(),
                base_commit: base.to_owned(),
                pack_bytes: bytes,
                start_from: start.map(|s| s.attempt.clone()),
            })?;
            workdirs.push((k, workdir));
        }
        Ok(workdirs)
    }

    /// The near misses with a patch that no candidate of this session started from yet, best first.
    fn islands(
        &self,
        pack: &ContextPack,
        log: &crate::log::runlog::LoadedLog,
    ) -> Vec<pack::IdeaNote> {
        let tried: Vec<String> = log
            .entries
            .iter()
            .filter_map(|(_, e)| match &e.record {
                Record::CandidateStarted {
                    start_from: Some(s),
                    ..
                } => Some(s.clone()),
                _ => None,
            })
            .collect();
        pack.worth_retrying
            .iter()
            .filter(|n| n.patch_file.is_some() && !tried.contains(&n.attempt))
            .cloned()
            .collect()
    }

    /// The best accepted candidate, committed: onto the branch on a GPU (copied into the main tree
    /// first), onto this step's scratch reference on the fake GPU (the main tree untouched).
    fn decide(&self, n: u32, proposals: &[Proposal], judged: &[Judged]) -> Result<Decided> {
        let bench = self.bench;
        let root = &bench.root;
        let winner = judged
            .iter()
            .filter(|j| j.accepted)
            .max_by(|a, b| a.gain.unwrap_or(0.0).total_cmp(&b.gain.unwrap_or(0.0)));
        let Some(w) = winner else {
            let reason = if judged.is_empty() {
                "no candidate to judge".to_owned()
            } else {
                format!(
                    "no candidate accepted: {}",
                    judged
                        .iter()
                        .map(|j| format!(
                            "{}: {}",
                            j.candidate,
                            j.reason.lines().next().unwrap_or("")
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            };
            return Ok(Decided {
                accepted: false,
                reason,
                gain: None,
                commit: None,
                candidate: None,
                scratch_ref: None,
            });
        };
        let p = proposals
            .iter()
            .find(|p| p.candidate == w.candidate)
            .expect("a judged candidate has a proposal");
        let overall = w
            .overall
            .as_ref()
            .expect("an accepted candidate has a verdict");
        let mut message = self
            .session()
            .commit_message(n, &p.changed, overall, &w.duels);
        let _ = writeln!(
            message,
            "Flashtune-Candidate: {} of {} ({})",
            w.candidate, self.agent.candidates, self.agent.name
        );
        let snapshot = p
            .snapshot
            .as_ref()
            .expect("an accepted candidate was judged from its snapshot");
        let repo = git2::Repository::open(root).map_err(git)?;
        let (commit, scratch_ref) = if bench.device.fake {
            let reference = step::scratch_ref(&bench.run_id, n);
            (
                snapshot.commit(&repo, &message, Some(&reference))?,
                Some(reference),
            )
        } else {
            let commit = snapshot.commit(&repo, &message, None)?;
            // The main tree takes the committed files, so it stands at the new HEAD.
            snapshot.write_files(&repo, root)?;
            (commit, None)
        };
        Ok(Decided {
            accepted: true,
            reason: format!("candidate {}: {}", w.candidate, w.reason),
            gain: w.gain,
            commit: Some(commit),
            candidate: Some(w.candidate),
            scratch_ref,
        })
    }

    /// The pack for step `n` from the logs and the base's tree.
    pub(super) fn pack(
        &self,
        n: u32,
        base: &str,
        pairings: &[Pairing],
        repo: &git2::Repository,
        log: &crate::log::runlog::LoadedLog,
    ) -> Result<ContextPack> {
        let ledger = Ledger::of(log);
        let budget = BudgetLeft {
            steps_left: self.opts.steps.saturating_sub(n),
            candidates: self.agent.candidates,
            spent_usd: Some(ledger.known_usd()),
            max_cost_usd: self.agent.max_cost_usd,
            time_left_s: self
                .opts
                .time_limit
                .map(|t| t.saturating_sub(self.started.elapsed()).as_secs_f64()),
            patience_left: self
                .agent
                .patience
                .map(|k| k.saturating_sub(ledger.steps_since_commit())),
            stop_at_roof: self.agent.stop_at_roof,
        };
        build_pack(PackFor {
            project: &self.bench.project,
            repo,
            base,
            pairings,
            device: Some(&self.bench.device),
            roofs: &self.bench.roofs,
            step: n,
            budget,
        })
    }
}

/// How a step of a session ended.
pub(super) struct Decided {
    pub(super) accepted: bool,
    pub(super) reason: String,
    pub(super) gain: Option<f64>,
    pub(super) commit: Option<String>,
    pub(super) candidate: Option<u32>,
    pub(super) scratch_ref: Option<String>,
}

/// Apply a near miss's whole patch to a fresh worktree's files (nothing staged, nothing committed).
fn apply_patch(workdir: &Path, note: &pack::IdeaNote) -> std::result::Result<(), String> {
    let file = note.patch_file.as_ref().ok_or("no patch kept")?;
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let diff = git2::Diff::from_buffer(&bytes).map_err(|e| e.message().to_owned())?;
    let repo = git2::Repository::open(workdir).map_err(|e| e.message().to_owned())?;
    repo.apply(&diff, git2::ApplyLocation::WorkDir, None)
        .map_err(|e| e.message().to_owned())
}
