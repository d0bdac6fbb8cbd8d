//! The step loop: each step from HEAD's build through the proposer and the judge to its verdict, the edit committed or restored.
use super::bench::Bench;
use super::{
    attempt, changes, extract_tree, head_of, in_scope, irregular, irregular_reason,
    outside_scope_reason, restore, scratch_ref, short, step_markdown, Candidate, Decided, DuelRow,
    Outcome, Proposed, Session, StepOptions, StepOutcome, StepSummary, EDIT_SCOPE,
};
use crate::error::{Error, Result};
use crate::gpu::decide;
use crate::log::runlog::{Idea, Record};
use crate::run::shared::Events;
use anyhow::{anyhow, Context};
use std::fmt::Write as _;
use std::time::Instant;

pub async fn step(opts: StepOptions) -> Result<StepOutcome> {
    if opts.steps > 1 && opts.proposer.is_none() {
        return Err(Error::BadInput(
            "--steps above 1 needs --proposer: without one, every step would judge the same edit"
                .into(),
        ));
    }
    let (bench, mut events) = Bench::open(&opts, opts.proposer.is_some(), None).await?;
    let session = bench.session(&opts);
    let run_dir = bench.run_dir.clone();
    let started = Instant::now();
    let mut last: Option<Decided> = None;
    let mut report = String::new();
    let (mut accepted, mut rejected) = (0, 0);
    for n in 1..=opts.steps {
        if opts
            .time_limit
            .is_some_and(|limit| started.elapsed() >= limit)
        {
            let _ = writeln!(report, "Time limit reached before step {n}.\n");
            break;
        }
        let Some(stepped) =
            super::unless_stopped(session.one_step(n, last.as_ref(), &mut events)).await
        else {
            return Err(session.interrupted(n, &mut events));
        };
        let (decided, markdown) = stepped?;
        // Printed as each step ends: an unattended loop shows its progress.
        if !opts.quiet {
            crate::say!("{markdown}");
        }
        report.push_str(&markdown);
        report.push('\n');
        if decided.accepted {
            accepted += 1;
        } else {
            rejected += 1;
        }
        last = Some(decided);
    }
    std::fs::write(run_dir.join("report.md"), &report)
        .with_context(|| format!("cannot write {}", run_dir.join("report.md").display()))?;
    Ok(StepOutcome {
        run_dir,
        log: events.records().clone(),
        report_markdown: report,
        accepted,
        rejected,
    })
}

impl Session<'_> {
    async fn one_step(
        &self,
        n: u32,
        last: Option<&Decided>,
        events: &mut Events,
    ) -> Result<(Decided, String)> {
        let project = self.project;
        let step_dir = self.run_dir.join(format!("step-{n}"));
        let report_path = self.run_dir.join(format!("step-{n}.md"));
        let repo = git2::Repository::open(self.root)
            .map_err(|e| Error::Other(anyhow!("{}", e.message())))?;
        let (base, base_ref) = head_of(&repo)?;
        let pairings = self.champions(&repo)?;
        // HEAD's side is built before the proposer runs, so the proposer cannot plant its cubins.
        let head_tree = step_dir.join("head");
        extract_tree(&repo, &base, EDIT_SCOPE, &head_tree)?;
        let head_cubins = self.build_head(&pairings, &head_tree, events).await?;
        let mut duels = Vec::new();
        let proposed = match &self.opts.proposer {
            Some(command) => {
                let sources = crate::run::shared::kernel_sources_hash(project, Some(&head_tree));
                self.profile_champions(&pairings, &head_cubins, &sources, events)
                    .await?;
                let revision: (&str, &str) = (&base, &base_ref);
                Some((self.propose(n, command, last, &repo, revision, &head_cubins, events)).await?)
            }
            None => None,
        };
        let (inside, outside) = changes(project, self.root)?;
        // Only a proposer can stray: without one, the user's own files outside the scope are theirs.
        let stray: Vec<String> = outside.into_iter().filter(|_| proposed.is_some()).collect();
        let proposer_failed = proposed.as_ref().is_some_and(|p| !p.finished);
        let edit: Vec<String> = inside.iter().chain(&stray).cloned().collect();
        let not_files = irregular(self.root, &inside);
        // The edit as it is judged and would be committed, read from the working tree once, now.
        let candidate =
            if not_files.is_empty() && stray.is_empty() && !proposer_failed && !inside.is_empty() {
                Some(Candidate::snapshot(&repo, &base, self.root, &inside)?)
            } else {
                None
            };
        let diff = match &candidate {
            Some(c) => attempt::diff_candidate(&repo, c, |p| in_scope(project, p))?,
            None => attempt::diff_against(
                self.root,
                &base,
                |p| in_scope(project, p),
                |p| !edit.iter().any(|e| e == p),
            )?,
        };
        if !edit.is_empty() {
            attempt::keep_patch(self.run_dir, n, None, &diff.patch)?;
        }
        let idea = self.idea_of(proposed.as_ref(), &edit, &diff);
        events.emit(Record::StepStarted {
            step: n,
            base_commit: base.clone(),
            changed_files: edit.clone(),
            diff_stat: Some(diff.stat.clone()),
            patch: (!edit.is_empty()).then(|| diff.bounded()),
            idea,
        })?;
        if !edit.is_empty() {
            crate::tell!(
                "step {n}: {} against HEAD {} ({})",
                edit.join(", "),
                short(&base),
                diff.stat
            );
        }
        let refused =
            self.refused_unjudged(proposed.as_ref(), &not_files, &stray, &inside, &edit)?;
        let outcome = if let Some(refused) = refused {
            refused
        } else if let Some(candidate) = &candidate {
            let judged = self
                .judge_edit(
                    n,
                    &pairings,
                    &head_cubins,
                    &step_dir,
                    candidate,
                    events,
                    &mut duels,
                )
                .await?;
            match judged {
                Ok(overall) if overall.accept => {
                    self.keep_in_place(n, &repo, candidate, &overall, &duels)?
                }
                Ok(overall) => {
                    restore(self.root, &inside)?;
                    Outcome::rejected(overall.reason, Some(overall.geomean_gain), inside.clone())
                }
                Err(why) => {
                    restore(self.root, &inside)?;
                    Outcome::rejected(why, None, inside.clone())
                }
            }
        } else {
            Outcome::rejected("no edits under kernels/ to judge".into(), None, Vec::new())
        };
        crate::tell!(
            "step {n}: {}: {}",
            if outcome.accepted {
                "accepted"
            } else {
                "rejected"
            },
            outcome.reason.lines().next().unwrap_or("")
        );
        events.emit(Record::StepDecided {
            step: n,
            accepted: outcome.accepted,
            reason: outcome.reason.clone(),
            geomean_gain: outcome.geomean_gain,
            commit: outcome.commit.clone(),
            restored: outcome.restored.clone(),
            candidate: None,
            scratch_ref: outcome.scratch_ref.clone(),
        })?;
        let markdown = step_markdown(&StepSummary {
            step: n,
            base: &base,
            device: self.device,
            files: &inside,
            outcome: &outcome,
            duels: &duels,
        });
        std::fs::write(&report_path, &markdown)
            .with_context(|| format!("cannot write {}", report_path.display()))?;
        Ok((
            Decided {
                accepted: outcome.accepted,
                reason: outcome.reason,
                report: report_path,
            },
            markdown,
        ))
    }

    /// What the step tried, in one line: the caller's words, else the agent's `IDEA:` line, else
    /// the diff's own summary.
    fn idea_of(
        &self,
        proposed: Option<&Proposed>,
        edit: &[String],
        diff: &attempt::TreeDiff,
    ) -> Option<Idea> {
        self.opts
            .idea
            .as_deref()
            .and_then(attempt::one_line)
            .map(|summary| Idea {
                summary,
                from: "caller".into(),
            })
            .or_else(|| {
                let said = attempt::idea_line(&proposed?.output)?;
                Some(Idea {
                    summary: said,
                    from: "agent".into(),
                })
            })
            .or_else(|| (!edit.is_empty()).then(|| diff.as_idea()))
    }

    /// An edit refused before it is judged, all its changes restored: one that is not regular
    /// files, one that reached outside the scope, or one a proposer left unfinished. `None`: judge it.
    fn refused_unjudged(
        &self,
        proposed: Option<&Proposed>,
        not_files: &[String],
        stray: &[String],
        inside: &[String],
        edit: &[String],
    ) -> Result<Option<Outcome>> {
        let proposer_failed = proposed.is_some_and(|p| !p.finished);
        Ok(Some(if !not_files.is_empty() {
            restore(self.root, edit)?;
            Outcome::rejected(
                format!(
                    "{}; all its changes were restored",
                    irregular_reason(
                        if proposed.is_some() {
                            "the proposer"
                        } else {
                            "the edit"
                        },
                        not_files
                    )
                ),
                None,
                edit.to_vec(),
            )
        } else if !stray.is_empty() {
            // The proposer stepped outside its scope: undo all of it, judge nothing.
            restore(self.root, edit)?;
            Outcome::rejected(
                format!(
                    "{}; all its changes were restored",
                    outside_scope_reason(self.project, "the proposer", stray)
                ),
                None,
                edit.to_vec(),
            )
        } else if proposer_failed {
            // A proposer that failed or ran out of time may have left half an edit.
            restore(self.root, inside)?;
            let refused = proposed
                .and_then(|p| crate::run::sandbox::refusal_note(&p.output, EDIT_SCOPE))
                .map_or(String::new(), |note| format!("; {note}"));
            Outcome::rejected(
                format!("the proposer did not finish cleanly (see proposer_ran); its edits were restored unjudged{refused}"),
                None,
                inside.to_vec(),
            )
        } else {
            return Ok(None);
        }))
    }

    /// Commit an accepted in-place edit, as the tree it was judged from: on a GPU onto the current
    /// branch (HEAD moves); on the fake GPU onto the scratch reference `scratch_ref`, never a
    /// branch, the working tree back at HEAD.
    fn keep_in_place(
        &self,
        n: u32,
        repo: &git2::Repository,
        candidate: &Candidate,
        overall: &decide::Overall,
        duels: &[DuelRow],
    ) -> Result<Outcome> {
        let message = self.commit_message(n, &candidate.files, overall, duels);
        let (commit, restored, reference) = if self.device.fake {
            let reference = scratch_ref(self.run_id, n);
            let commit = candidate.commit(repo, &message, Some(&reference))?;
            restore(self.root, &candidate.files)?;
            (commit, candidate.files.clone(), Some(reference))
        } else {
            (candidate.commit(repo, &message, None)?, Vec::new(), None)
        };
        Ok(Outcome {
            accepted: true,
            reason: overall.reason.clone(),
            geomean_gain: Some(overall.geomean_gain),
            commit: Some(commit),
            restored,
            scratch_ref: reference,
        })
    }
}
