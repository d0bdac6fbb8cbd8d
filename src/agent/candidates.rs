//! Running a step's candidates: their agents side by side in their worktrees, each edit read back with its cost, then every judgeable edit built and judged against HEAD's champion.
use super::ledger::Ledger;
use super::{git, AgentRun, Judged, Proposal, Runner};
use crate::error::{Error, Result};
use crate::log::runlog::{Idea, Record};
use crate::model::usage::{Usage, UsageFormat};
use crate::model::vocab::ProcessEnd;
use crate::pack;
use crate::run::shared::Events;
use crate::step::{self, Pairing, EDIT_SCOPE};
use anyhow::{anyhow, Context};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

impl Runner<'_> {
    /// Run every candidate's agent at once; as each ends, read its edit and usage into the log.
    pub(super) async fn run_agents(
        &self,
        n: u32,
        workdirs: &[(u32, PathBuf)],
        base: &str,
        (head, head_ref): (&str, &str),
        repo: &git2::Repository,
        events: &mut Events,
    ) -> Result<Vec<Proposal>> {
        let bench = self.bench;
        let project = &bench.project;
        let last = last_decided(events.records(), &bench.run_dir, n);
        let run_dir = std::path::absolute(&bench.run_dir)
            .with_context(|| format!("cannot resolve {}", bench.run_dir.display()))?;
        let timeout = Duration::from_secs(project.policies.step.proposer_timeout_s);
        let budget = self.agent.max_cost_usd.map_or(1_000_000.0, |max| {
            let spent = Ledger::of(events.records()).known_usd();
            ((max - spent) / f64::from(self.agent.candidates)).max(0.0)
        });
        let mut log_hash = step::file_hash(&events.log.path);
        let mut set = tokio::task::JoinSet::new();
        for (k, workdir) in workdirs {
            let agent_dir = workdir.with_extension("agent");
            std::fs::create_dir_all(&agent_dir)
                .with_context(|| format!("cannot create {}", agent_dir.display()))?;
            let usage_file = agent_dir.join("usage.json");
            let values: BTreeMap<&str, String> = [
                ("workdir", workdir.display().to_string()),
                (
                    "prompt_file",
                    workdir.join("PROMPT.md").display().to_string(),
                ),
                ("budget_usd", format!("{budget:.2}")),
                ("candidate", k.to_string()),
                ("usage_file", usage_file.display().to_string()),
            ]
            .into_iter()
            .collect();
            let command = fill(&self.agent.command, &values);
            let mut cmd = crate::os::stop::guarded_shell(&command)
                .with_context(|| format!("cannot start the agent `{command}`"))?;
            cmd.current_dir(workdir)
                .env("FLASHTUNE_STEP", n.to_string())
                .env("FLASHTUNE_STEPS", self.opts.steps.to_string())
                .env("FLASHTUNE_CANDIDATE", k.to_string())
                .env("FLASHTUNE_CANDIDATES", self.agent.candidates.to_string())
                .env("FLASHTUNE_WORKDIR", workdir)
                .env("FLASHTUNE_PROMPT_FILE", workdir.join("PROMPT.md"))
                .env("FLASHTUNE_CONTEXT_DIR", workdir.join("context"))
                .env("FLASHTUNE_USAGE_FILE", &usage_file)
                .env(crate::os::stop::GUARD_EXIT_FILE, agent_dir.join("exit"))
                .env("FLASHTUNE_BUDGET_USD", format!("{budget:.2}"))
                .env("FLASHTUNE_EDIT_SCOPE", EDIT_SCOPE)
                .env("FLASHTUNE_PROTECTED", step::protected(project).join(" "))
                .env(
                    "FLASHTUNE_THRESHOLD",
                    project.policies.step.threshold.to_string(),
                )
                // What `--proposer`'s help promises every proposer, a candidate's included.
                .env("FLASHTUNE_RUN_DIR", &run_dir)
                .env("FLASHTUNE_LAST_VERDICT", &last.0)
                .env("FLASHTUNE_LAST_REASON", &last.1)
                .env("FLASHTUNE_LAST_REPORT", &last.2)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            // It writes its worktree, its .agent folder and a scratch folder (src/run/sandbox.rs).
            let scratch = crate::run::sandbox::confine(
                &mut cmd,
                project,
                self.opts.executor.exe(),
                &[(workdir, "its worktree"), (&agent_dir, "its .agent folder")],
                &format!("{}-s{n}-c{k}", bench.run_id),
            )?;
            let k = *k;
            let child = cmd
                .spawn()
                .with_context(|| format!("cannot start the agent `{command}`"))?;
            set.spawn(wait_for_agent(child, k, timeout, scratch, usage_file));
        }
        let mut proposals = Vec::new();
        while let Some(done) = set.join_next().await {
            let run = done.map_err(|e| Error::Other(anyhow!("an agent task failed: {e}")))?;
            let workdir = workdirs
                .iter()
                .find(|(k, _)| *k == run.candidate)
                .map(|(_, w)| w.clone())
                .expect("every agent has a workdir");
            let _ = std::fs::write(
                workdir.with_extension("agent").join("output.txt"),
                &run.output,
            );
            if step::file_hash(&events.log.path) != log_hash {
                return Err(Error::Other(anyhow!(
                    "an agent modified flashtune's run log; the run can no longer be trusted, stopping"
                )));
            }
            // What the tool trusts and did not build: the worker binary and the toolchain.
            self.opts
                .executor
                .check_untouched()
                .and(project.toolchain.check_untouched())
                .map_err(|t| Error::Other(anyhow!("{t}")))?;
            let proposal = self.read_proposal(n, &run, &workdir, base, events)?;
            log_hash = step::file_hash(&events.log.path);
            proposals.push(proposal);
        }
        proposals.sort_by_key(|p| p.candidate);
        self.drop_if_main_tree_touched(n, repo, (head, head_ref), &mut proposals, events)?;
        Ok(proposals)
    }

    /// An agent that reached outside its worktree: the main tree or HEAD changed under the step.
    /// HEAD is put back, the tree restored, and every candidate of the step dropped, logged.
    fn drop_if_main_tree_touched(
        &self,
        n: u32,
        repo: &git2::Repository,
        (head, head_ref): (&str, &str),
        proposals: &mut [Proposal],
        events: &mut Events,
    ) -> Result<()> {
        let (project, bench) = (&self.bench.project, self.bench);
        let (now, now_ref) = step::head_of(repo)?;
        let moved = now != head || now_ref != head_ref;
        if moved {
            step::put_head_back(repo, head_ref, head)?;
        }
        let (inside, outside) = step::changes(project, &bench.root)?;
        let touched: Vec<String> = inside.into_iter().chain(outside).collect();
        if moved || !touched.is_empty() {
            step::restore(&bench.root, &touched)?;
            let reason = format!(
                "an agent changed the main working tree ({}){}: every candidate of this step is dropped and the tree restored",
                touched.join(", "),
                if moved { " and moved HEAD" } else { "" }
            );
            for p in proposals.iter_mut() {
                events.emit(Record::CandidateDropped {
                    step: n,
                    candidate: p.candidate,
                    reason: reason.clone(),
                })?;
                p.unjudged = Some(reason.clone());
            }
        }
        Ok(())
    }

    /// What a candidate changed in its worktree, what it tried and what it cost, into the log; its
    /// whole patch into the run folder, judged or not.
    pub(super) fn read_proposal(
        &self,
        n: u32,
        run: &AgentRun,
        workdir: &Path,
        base: &str,
        events: &mut Events,
    ) -> Result<Proposal> {
        let project = &self.bench.project;
        let mut diff = step::diff_against(
            workdir,
            base,
            |p| step::in_scope(project, p),
            pack::is_pack_path,
        )?;
        let touched = !diff.inside.is_empty() || !diff.outside.is_empty();
        let finished = run.end.succeeded();
        let unjudged = if !finished {
            let refused = crate::run::sandbox::refusal_note(&run.output, "its worktree")
                .map_or(String::new(), |note| format!("; {note}"));
            Some(format!(
                "the agent did not finish cleanly ({}); its edit is not judged{refused}",
                run.status
            ))
        } else if !diff.outside.is_empty() {
            Some(step::outside_scope_reason(
                project,
                "the agent",
                &diff.outside,
            ))
        } else if let Some(not_files) =
            Some(step::irregular(workdir, &diff.inside)).filter(|n| !n.is_empty())
        {
            Some(step::irregular_reason("the agent", &not_files))
        } else if diff.inside.is_empty() {
            Some("no edits under kernels/ to judge".into())
        } else {
            None
        };
        // Read once, as the agent ends: a sibling writing into this worktree later changes nothing
        // judged or committed, and the kept patch is the snapshot's.
        let snapshot = match unjudged {
            Some(_) => None,
            None => {
                let repo = git2::Repository::open(&self.bench.root).map_err(git)?;
                let snapshot = step::Candidate::snapshot(&repo, base, workdir, &diff.inside)?;
                diff = step::diff_candidate(&repo, &snapshot, |p| step::in_scope(project, p))?;
                Some(snapshot)
            }
        };
        if touched {
            step::keep_patch(&self.bench.run_dir, n, Some(run.candidate), &diff.patch)?;
        }
        let (usage, usage_error): (Option<Usage>, Option<String>) = {
            let format = self
                .agent
                .usage
                .or_else(|| run.usage_file.as_ref().map(|_| UsageFormat::File));
            match format {
                None => (
                    None,
                    Some("the agent reports no usage and wrote no $FLASHTUNE_USAGE_FILE".into()),
                ),
                Some(f) => match crate::model::usage::read(
                    f,
                    &run.stdout,
                    run.usage_file.as_deref(),
                    &project.policies.prices,
                ) {
                    Ok(u) => (Some(u), None),
                    Err(e) => (None, Some(e)),
                },
            }
        };
        let idea = idea_of(self.agent.usage, run, workdir, base)
            .or_else(|| touched.then(|| diff.as_idea()));
        crate::tell!(
            "step {n} candidate {}: the agent ended ({}) after {:.0} s: {}{}",
            run.candidate,
            run.status,
            run.seconds,
            diff.stat,
            idea.as_ref()
                .map_or(String::new(), |i| format!("; idea: {}", i.summary))
        );
        events.emit(Record::CandidateProposed {
            step: n,
            candidate: run.candidate,
            seconds: run.seconds,
            status: run.status.clone(),
            timed_out: run.end == ProcessEnd::TimedOut,
            output_tail: crate::gpu::build::log_tail(&run.output, 40),
            end: Some(run.end),
            changed_files: diff.inside.clone(),
            outside_scope: diff.outside.clone(),
            diff_stat: diff.stat.clone(),
            patch: diff.bounded(),
            usage,
            usage_error,
            idea,
        })?;
        Ok(Proposal {
            candidate: run.candidate,
            workdir: workdir.to_path_buf(),
            changed: diff.inside,
            unjudged,
            snapshot,
        })
    }

    /// Build every judgeable candidate at once, then duel each against HEAD's champion in turn.
    pub(super) async fn judge_all(
        &self,
        n: u32,
        proposals: &[Proposal],
        pairings: &[Pairing],
        head_cubins: &BTreeMap<crate::run::shared::UnitKey, PathBuf>,
        step_dir: &Path,
        events: &mut Events,
    ) -> Result<Vec<Judged>> {
        let session = self.session();
        let project = &self.bench.project;
        let mut judged = Vec::new();
        let ready: Vec<&Proposal> = proposals.iter().filter(|p| p.unjudged.is_none()).collect();
        for p in proposals.iter().filter(|p| p.unjudged.is_some()) {
            let reason = p.unjudged.clone().unwrap_or_default();
            events.emit(Record::CandidateJudged {
                step: n,
                candidate: p.candidate,
                accepted: false,
                reason: reason.clone(),
                geomean_gain: None,
                gpu_seconds: 0.0,
            })?;
            judged.push(Judged {
                candidate: p.candidate,
                accepted: false,
                reason,
                gain: None,
                overall: None,
                duels: Vec::new(),
            });
        }
        let jobs = (project.jobs() / ready.len().max(1)).max(1);
        // Each from the export of its snapshot, into a cache of its own (no candidate's cubin
        // serves another); builds run side by side.
        let mut pending = Vec::new();
        for p in &ready {
            let snapshot = p
                .snapshot
                .as_ref()
                .expect("a judgeable proposal has its snapshot");
            let exported = session.export_candidate(
                snapshot,
                &p.workdir,
                &step_dir.join(format!("cand-{}.tree", p.candidate)),
            )?;
            pending.push(exported.map(|tree| {
                session.spawn_edit_build(
                    pairings,
                    &tree,
                    crate::model::vocab::BuildRole::Candidate(p.candidate),
                    step_dir.join(format!("cand-{}.build", p.candidate)),
                    jobs,
                )
            }));
        }
        let mut built = Vec::new();
        for (p, pending) in ready.iter().zip(pending) {
            let cubins = match pending {
                Ok(pending) => step::collect_builds(pending, project, events).await?,
                Err(why) => Err(why),
            };
            built.push((p, cubins));
        }
        // The GPU judges one candidate at a time (the session holds its lock).
        for (p, cubins) in built {
            let role = crate::model::vocab::BuildRole::Candidate(p.candidate);
            let mut duels = Vec::new();
            let started = Instant::now();
            let verdict = match cubins {
                Err(why) => Err(why),
                Ok(cubins) => {
                    session
                        .duel_edit(
                            n,
                            Some(p.candidate),
                            pairings,
                            head_cubins,
                            &cubins,
                            role,
                            events,
                            &mut duels,
                        )
                        .await?
                }
            };
            let gpu_seconds = if duels.is_empty() {
                0.0
            } else {
                started.elapsed().as_secs_f64()
            };
            let (accepted, reason, gain, overall) = match verdict {
                Ok(o) => (o.accept, o.reason.clone(), Some(o.geomean_gain), Some(o)),
                Err(why) => (false, why, None, None),
            };
            events.emit(Record::CandidateJudged {
                step: n,
                candidate: p.candidate,
                accepted,
                reason: reason.clone(),
                geomean_gain: gain,
                gpu_seconds,
            })?;
            judged.push(Judged {
                candidate: p.candidate,
                accepted,
                reason,
                gain,
                overall,
                duels,
            });
        }
        judged.sort_by_key(|j| j.candidate);
        Ok(judged)
    }
}

/// Wait for one candidate's agent, up to `timeout`; then kill what it left running (nothing may
/// edit its worktree while it is judged). Its scratch folder lives as long as it runs.
async fn wait_for_agent(
    child: tokio::process::Child,
    k: u32,
    timeout: Duration,
    _scratch: impl Send,
    usage_file: PathBuf,
) -> AgentRun {
    let started = Instant::now();
    let group = crate::gpu::build::ProcessGroup(child.id());
    let waited = tokio::time::timeout(timeout, child.wait_with_output()).await;
    // Nothing it left running may edit its worktree while it is judged.
    drop(group);
    let (status, end, stdout, stderr) = match waited {
        Err(_) => (
            format!("killed after {} s", timeout.as_secs()),
            ProcessEnd::TimedOut,
            String::new(),
            String::new(),
        ),
        Ok(Err(e)) => (
            format!("wait failed: {e}"),
            ProcessEnd::WaitFailed,
            String::new(),
            String::new(),
        ),
        Ok(Ok(out)) => (
            out.status.to_string(),
            ProcessEnd::of(&out.status),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
    };
    AgentRun {
        candidate: k,
        seconds: started.elapsed().as_secs_f64(),
        status,
        end,
        output: format!("{stdout}{stderr}"),
        stdout,
        usage_file: std::fs::read_to_string(&usage_file).ok(),
    }
}

/// Each placeholder replaced by its value, shell-quoted.
pub(super) fn fill(template: &str, values: &BTreeMap<&str, String>) -> String {
    let mut out = template.to_owned();
    for (k, v) in values {
        out = out.replace(&format!("{{{k}}}"), &shell_quote(v));
    }
    out
}

pub(super) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,".contains(c))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The verdict, reason and report of the last step before `n` (`none` before the first), as
/// `FLASHTUNE_LAST_VERDICT`, `_LAST_REASON` and `_LAST_REPORT` give them to every proposer.
fn last_decided(
    log: &crate::log::runlog::LoadedLog,
    run_dir: &Path,
    n: u32,
) -> (String, String, PathBuf) {
    let last = log.entries.iter().rev().find_map(|(_, e)| match &e.record {
        Record::StepDecided {
            step,
            accepted,
            reason,
            ..
        } if *step < n => Some((*step, *accepted, reason.clone())),
        _ => None,
    });
    match last {
        None => ("none".into(), String::new(), PathBuf::new()),
        Some((step, accepted, reason)) => (
            if accepted { "accepted" } else { "rejected" }.into(),
            reason,
            std::path::absolute(run_dir.join(format!("step-{step}.md")))
                .unwrap_or_else(|_| run_dir.join(format!("step-{step}.md"))),
        ),
    }
}

/// What a candidate tried, in its own words: an `IDEA:` line (in its last message, else anywhere in
/// its output), else the first line of its last message, else the message of a commit it made.
fn idea_of(
    format: Option<UsageFormat>,
    run: &AgentRun,
    workdir: &Path,
    base: &str,
) -> Option<Idea> {
    let agent = |summary: String| Idea {
        summary,
        from: "agent".into(),
    };
    let message = crate::model::usage::final_message(format, &run.stdout);
    if let Some(said) = message
        .as_deref()
        .and_then(step::idea_line)
        .or_else(|| step::idea_line(&run.output))
    {
        return Some(agent(said));
    }
    if let Some(first) = message.as_deref().and_then(step::one_line) {
        return Some(agent(first));
    }
    let repo = git2::Repository::open(workdir).ok()?;
    let head = repo.head().ok()?.peel_to_commit().ok()?;
    (head.id().to_string() != base)
        .then(|| head.message().ok().and_then(step::one_line))
        .flatten()
        .map(|summary| Idea {
            summary,
            from: "commit message".into(),
        })
}
