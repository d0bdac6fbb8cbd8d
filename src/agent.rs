//! Agent sessions (`flashtune step --agent/--candidates`): N coding agents per step, each in its own git worktree with a context pack, judged one at a time against HEAD's champion, the best committed, every candidate and its cost in the log; stop rules, resume, and the workbench operations (judge, context, history) that the CLI's `--json` commands and an MCP server call.
//!
//! Why worktrees: a candidate's agent gets a real checkout of HEAD (git tools work in it, Codex and
//! Claude Code find AGENTS.md at its root) that shares the repository's objects, so making one costs
//! a checkout, not a clone. The main working tree is never handed to an agent: flashtune copies the
//! winner's in-scope files into it and commits them itself, so a candidate is never half-applied.
use crate::config::{ProjectPaths, AGENT_PLACEHOLDERS};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::pack::{self, BudgetLeft, ContextPack, HistoryEntry, PackCase, PackInput};
use crate::run::{Events, WhenBusy};
use crate::runlog::{AgentSettings, Record};
use crate::step::{self, Bench, Pairing, StepOptions, EDIT_SCOPE};
use crate::usage::{Usage, UsageFormat};
use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How the candidates' agents run and when the session stops.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// `claude`, `codex`, `gemini`, `aider` (or any `[agents.NAME]`), or `custom`.
    pub name: String,
    /// The command template (policies.toml's, or `--proposer`'s).
    pub command: String,
    pub usage: Option<UsageFormat>,
    /// Candidates per step, each its own agent in its own worktree.
    pub candidates: u32,
    /// Start no step once this many dollars are spent (dollars the agents did not report count as 0).
    pub max_cost_usd: Option<f64>,
    /// Stop once every case's champion reaches this fraction of its binding measured roof.
    pub stop_at_roof: Option<f64>,
    /// Stop after this many steps in a row with nothing accepted.
    pub patience: Option<u32>,
}

impl AgentOptions {
    /// The agent named in policies.toml's `[agents]`, or a custom command.
    pub fn named(
        policies: &crate::config::Policies,
        name: Option<&str>,
        custom: Option<&str>,
    ) -> Result<(String, String, Option<UsageFormat>)> {
        match (name, custom) {
            (Some(_), Some(_)) => Err(Error::BadInput(
                "give --agent NAME or --proposer CMD, not both".into(),
            )),
            (None, Some(cmd)) => {
                let unknown = crate::config::unknown_placeholders(cmd);
                if !unknown.is_empty() {
                    return Err(Error::BadInput(format!(
                        "--proposer names {{{}}}, which flashtune does not fill (it fills {{{}}})",
                        unknown.join("}, {"),
                        AGENT_PLACEHOLDERS.join("}, {")
                    )));
                }
                Ok(("custom".into(), cmd.to_owned(), None))
            }
            (Some(name), None) => {
                let t = policies.agents.get(name).ok_or_else(|| {
                    Error::BadInput(format!(
                        "no agent `{name}` in policies.toml (its [agents.*]: {}); add [agents.{name}] with a command, or pass --proposer CMD",
                        policies.agents.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?;
                Ok((name.to_owned(), t.command.clone(), t.usage))
            }
            (None, None) => Err(Error::BadInput(
                "an agent session needs --agent NAME or --proposer CMD".into(),
            )),
        }
    }
}

/// How an agent session ended.
pub struct SessionOutcome {
    pub run_dir: PathBuf,
    pub steps: u32,
    pub committed: u32,
    /// The stop rule that ended it early, if one did.
    pub stopped: Option<String>,
    /// The morning summary (also `summary.md` in the run folder).
    pub summary: String,
}

/// Run an agent session of `opts.steps` steps.
pub async fn session(opts: StepOptions, agent: AgentOptions) -> Result<SessionOutcome> {
    if agent.candidates == 0 {
        return Err(Error::BadInput("--candidates must be at least 1".into()));
    }
    if let Some(f) = agent.stop_at_roof {
        if !(f > 0.0 && f <= 1.0) {
            return Err(Error::BadInput(format!(
                "--stop-at-roof is a fraction of the measured roof in (0, 1], not {f}"
            )));
        }
    }
    let (bench, mut events) = Bench::open(&opts, true, None).await?;
    refuse_dirty_scope(&bench)?;
    events.emit(Record::AgentSession(Box::new(AgentSettings {
        agent: agent.name.clone(),
        command: agent.command.clone(),
        usage: agent.usage,
        candidates: agent.candidates,
        steps: opts.steps,
        max_cost_usd: agent.max_cost_usd,
        stop_at_roof: agent.stop_at_roof,
        patience: agent.patience,
        time_limit_s: opts.time_limit.map(|t| t.as_secs_f64()),
        space: opts.space.clone(),
        variant: opts.variant.clone(),
    })))?;
    let runner = Runner {
        bench: &bench,
        opts: &opts,
        agent: &agent,
        started: Instant::now(),
    };
    runner.run_from(1, &mut events).await
}

/// Settings from the command line that a resumed session takes (the rest come from its log).
pub struct ResumeOptions {
    pub paths: ProjectPaths,
    pub device: u32,
    pub executor: Executor,
    pub when_busy: WhenBusy,
}

/// Whether a run folder holds an agent session (so `flashtune resume` hands it here).
pub fn is_agent_session(run_dir: &Path) -> bool {
    std::fs::read_to_string(run_dir.join("log.jsonl"))
        .is_ok_and(|t| t.contains("\"event\":\"agent_session\""))
}

/// Take up a killed agent session from its log: the step in flight is finished (candidates whose
/// agent had finished are judged again, the others dropped with a record, an edit applied but not
/// committed is restored, a commit made but not logged is recorded), then the steps left run.
pub async fn resume(ro: ResumeOptions, run_dir: &Path) -> Result<SessionOutcome> {
    let loaded = crate::runlog::read(&run_dir.join("log.jsonl"))?;
    let settings = loaded
        .entries
        .iter()
        .find_map(|(_, e)| match &e.record {
            Record::AgentSession(s) => Some((**s).clone()),
            _ => None,
        })
        .ok_or_else(|| Error::BadInput(format!("{} holds no agent session", run_dir.display())))?;
    let opts = StepOptions {
        paths: ro.paths,
        space: settings.space.clone(),
        variant: settings.variant.clone(),
        proposer: Some(settings.command.clone()),
        steps: settings.steps,
        time_limit: settings.time_limit_s.map(Duration::from_secs_f64),
        device: ro.device,
        executor: ro.executor,
        when_busy: ro.when_busy,
        quiet: false,
    };
    let agent = AgentOptions {
        name: settings.agent.clone(),
        command: settings.command.clone(),
        usage: settings.usage,
        candidates: settings.candidates,
        max_cost_usd: settings.max_cost_usd,
        stop_at_roof: settings.stop_at_roof,
        patience: settings.patience,
    };
    let (bench, mut events) = Bench::open(&opts, true, Some(run_dir)).await?;
    let decided: Vec<u32> = loaded
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::StepDecided { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    let started: Vec<u32> = loaded
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::CandidateStarted { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    let stopped = loaded
        .entries
        .iter()
        .any(|(_, e)| matches!(e.record, Record::SessionStopped { .. }));
    let in_flight = started
        .iter()
        .copied()
        .filter(|s| !decided.contains(s))
        .max();
    let runner = Runner {
        bench: &bench,
        opts: &opts,
        agent: &agent,
        started: Instant::now(),
    };
    let mut next = decided.iter().copied().max().unwrap_or(0) + 1;
    if let Some(n) = in_flight {
        runner.recover(n, &loaded, &mut events).await?;
        next = n + 1;
    } else {
        // Nothing in flight: whatever the main tree holds in the scope was never judged.
        let restored = runner.restore_scope()?;
        events.emit(Record::SessionResumed {
            step: None,
            restored,
            recovered_commit: None,
        })?;
    }
    if stopped {
        next = opts.steps + 1;
    }
    runner.run_from(next, &mut events).await
}

/// The session's loop and its steps.
struct Runner<'a> {
    bench: &'a Bench,
    opts: &'a StepOptions,
    agent: &'a AgentOptions,
    started: Instant,
}

/// One candidate's agent as it ended.
struct AgentRun {
    candidate: u32,
    seconds: f64,
    status: String,
    timed_out: bool,
    stdout: String,
    output: String,
    usage_file: Option<String>,
}

/// A candidate's edit, read from its worktree.
#[derive(Debug, Clone)]
struct Proposal {
    candidate: u32,
    workdir: PathBuf,
    changed: Vec<String>,
    /// Why it is not judged (agent failed, outside the scope, nothing changed).
    unjudged: Option<String>,
}

/// One judged candidate.
struct Judged {
    candidate: u32,
    accepted: bool,
    reason: String,
    gain: Option<f64>,
    overall: Option<crate::decide::Overall>,
    duels: Vec<step::DuelRow>,
}

impl Runner<'_> {
    fn session(&self) -> step::Session<'_> {
        self.bench.session(self.opts)
    }

    async fn run_from(&self, first: u32, events: &mut Events) -> Result<SessionOutcome> {
        let run_dir = self.bench.run_dir.clone();
        let mut stopped = None;
        for n in first..=self.opts.steps {
            if let Some(why) = self.stop_rule(events)? {
                events.emit(Record::SessionStopped {
                    reason: why.clone(),
                })?;
                stopped = Some(why);
                break;
            }
            let markdown = self.one_step(n, None, events).await?;
            println!("{markdown}");
        }
        if stopped.is_none() {
            // A rule may end the session after its last step too: say so, for the summary.
            if let Some(why) = self.stop_rule(events)? {
                if !why.starts_with("time limit") {
                    stopped = Some(why);
                }
            }
        }
        let ledger = Ledger::read(&run_dir)?;
        let summary = ledger.summary_markdown(stopped.as_deref());
        write(&run_dir.join("summary.md"), summary.as_bytes())?;
        write(
            &run_dir.join("ledger.json"),
            &serde_json::to_vec_pretty(&ledger.rows).map_err(|e| Error::Other(e.into()))?,
        )?;
        let report: String = (1..=self.opts.steps)
            .filter_map(|n| std::fs::read_to_string(run_dir.join(format!("step-{n}.md"))).ok())
            .collect::<Vec<_>>()
            .join("\n");
        write(
            &run_dir.join("report.md"),
            format!("{report}\n{summary}").as_bytes(),
        )?;
        Ok(SessionOutcome {
            run_dir,
            steps: ledger.steps(),
            committed: ledger.committed(),
            stopped,
            summary,
        })
    }

    /// Why the session must not start another step, if it must not.
    fn stop_rule(&self, events: &Events) -> Result<Option<String>> {
        let ledger = Ledger::read(&self.bench.run_dir)?;
        let _ = events;
        if let Some(limit) = self.opts.time_limit {
            if self.started.elapsed() >= limit {
                return Ok(Some(format!(
                    "time limit: {} reached",
                    humantime::format_duration(limit)
                )));
            }
        }
        if let Some(max) = self.agent.max_cost_usd {
            let spent = ledger.known_usd();
            if spent >= max {
                return Ok(Some(format!(
                    "cost limit: ${spent:.2} spent of --max-cost-usd {max:.2}"
                )));
            }
        }
        if let Some(k) = self.agent.patience {
            let dry = ledger.steps_since_commit();
            if k > 0 && dry >= k {
                return Ok(Some(format!(
                    "patience: {dry} steps in a row with nothing accepted (--patience {k})"
                )));
            }
        }
        if let Some(f) = self.agent.stop_at_roof {
            if let Some(lowest) =
                ledger.lowest_roof_fraction(&self.bench.project, &self.bench.roofs)
            {
                if lowest >= f {
                    return Ok(Some(format!(
                        "roof: every case's champion is at {:.0}% or more of its measured roof (--stop-at-roof {f})",
                        lowest * 100.0
                    )));
                }
            }
        }
        Ok(None)
    }

    /// One step: make the worktrees and packs, run the agents side by side, judge, commit the best.
    /// With `recovered`, the agents already ran (a resumed step): those proposals are judged.
    async fn one_step(
        &self,
        n: u32,
        recovered: Option<Vec<Proposal>>,
        events: &mut Events,
    ) -> Result<String> {
        let bench = self.bench;
        let session = self.session();
        let root = &bench.root;
        // Absolute: agents run in their worktrees, and paths handed to them must not depend on the cwd.
        let step_dir = std::path::absolute(bench.run_dir.join(format!("step-{n}")))
            .with_context(|| format!("cannot resolve {}", bench.run_dir.display()))?;
        let repo = git2::Repository::open(root).map_err(git)?;
        let (base, base_ref) = step::head_of(&repo)?;
        let pairings = session.champions(&repo)?;
        let head_tree = step_dir.join("head");
        if !head_tree.exists() {
            step::extract_tree(&repo, &base, EDIT_SCOPE, &head_tree)?;
        }
        let head_cubins = session.build_head(&pairings, &head_tree, events).await?;
        let proposals = match recovered {
            Some(p) => p,
            None => {
                let pack = self.pack(n, &base, &pairings, &repo, Some(&bench.device))?;
                let sources = sources_at(&repo, &base, &pack.sources)?;
                pack::write(&pack, &sources, &step_dir.join("pack"))
                    .map_err(|e| Error::Other(e.context("cannot write the context pack")))?;
                let mut workdirs = Vec::new();
                for k in 1..=self.agent.candidates {
                    let workdir = step_dir.join(format!("cand-{k}"));
                    make_worktree(&repo, &worktree_name(&bench.run_id, n, k), &base, &workdir)?;
                    let bytes = pack::write(&pack, &sources, &workdir)
                        .map_err(|e| Error::Other(e.context("cannot write the context pack")))?;
                    events.emit(Record::CandidateStarted {
                        step: n,
                        candidate: k,
                        workdir: workdir.clone(),
                        base_commit: base.clone(),
                        pack_bytes: bytes,
                    })?;
                    workdirs.push((k, workdir));
                }
                self.run_agents(n, &workdirs, &base, &base_ref, &repo, events)
                    .await?
            }
        };
        let judged = self
            .judge_all(n, &proposals, &pairings, &head_cubins, &step_dir, events)
            .await?;
        let winner = judged
            .iter()
            .filter(|j| j.accepted)
            .max_by(|a, b| a.gain.unwrap_or(0.0).total_cmp(&b.gain.unwrap_or(0.0)));
        let (accepted, reason, gain, commit, candidate) = match winner {
            Some(w) => {
                let p = proposals
                    .iter()
                    .find(|p| p.candidate == w.candidate)
                    .expect("a judged candidate has a proposal");
                let overall = w
                    .overall
                    .as_ref()
                    .expect("an accepted candidate has a verdict");
                let mut message = session.commit_message(n, &p.changed, overall, &w.duels);
                let _ = writeln!(
                    message,
                    "Flashtune-Candidate: {} of {} ({})",
                    w.candidate, self.agent.candidates, self.agent.name
                );
                apply(&p.workdir, root, &p.changed)?;
                let commit = crate::vcs::commit_paths(root, &p.changed, &message).map_err(|e| {
                    Error::Other(anyhow!("cannot commit the edit: {}", e.message()))
                })?;
                (
                    true,
                    format!("candidate {}: {}", w.candidate, w.reason),
                    w.gain,
                    Some(commit),
                    Some(w.candidate),
                )
            }
            None => (
                false,
                if judged.is_empty() {
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
                },
                None,
                None,
                None,
            ),
        };
        events.emit(Record::StepDecided {
            step: n,
            accepted,
            reason: reason.clone(),
            geomean_gain: gain,
            commit: commit.clone(),
            restored: Vec::new(),
            candidate,
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
            accepted,
            &reason,
            commit.as_deref(),
            &Ledger::read(&bench.run_dir)?,
        );
        write(
            &bench.run_dir.join(format!("step-{n}.md")),
            markdown.as_bytes(),
        )?;
        Ok(markdown)
    }

    /// The pack for step `n` from the logs and HEAD's tree.
    fn pack(
        &self,
        n: u32,
        base: &str,
        pairings: &[Pairing],
        repo: &git2::Repository,
        device: Option<&crate::protocol::DeviceInfo>,
    ) -> Result<ContextPack> {
        let ledger = Ledger::read(&self.bench.run_dir)?;
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
        build_pack(
            &self.bench.project,
            repo,
            base,
            pairings,
            device,
            &self.bench.roofs,
            n,
            budget,
        )
    }

    /// Run every candidate's agent at once; as each ends, read its edit and usage into the log.
    async fn run_agents(
        &self,
        n: u32,
        workdirs: &[(u32, PathBuf)],
        base: &str,
        base_ref: &str,
        repo: &git2::Repository,
        events: &mut Events,
    ) -> Result<Vec<Proposal>> {
        let bench = self.bench;
        let project = &bench.project;
        let timeout = Duration::from_secs(project.policies.step.proposer_timeout_s);
        let budget = self.agent.max_cost_usd.map_or(1_000_000.0, |max| {
            let spent = Ledger::read(&bench.run_dir).map_or(0.0, |l| l.known_usd());
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
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg(&command)
                .current_dir(workdir)
                .env("FLASHTUNE_STEP", n.to_string())
                .env("FLASHTUNE_STEPS", self.opts.steps.to_string())
                .env("FLASHTUNE_CANDIDATE", k.to_string())
                .env("FLASHTUNE_CANDIDATES", self.agent.candidates.to_string())
                .env("FLASHTUNE_WORKDIR", workdir)
                .env("FLASHTUNE_PROMPT_FILE", workdir.join("PROMPT.md"))
                .env("FLASHTUNE_CONTEXT_DIR", workdir.join("context"))
                .env("FLASHTUNE_USAGE_FILE", &usage_file)
                .env("FLASHTUNE_BUDGET_USD", format!("{budget:.2}"))
                .env("FLASHTUNE_EDIT_SCOPE", EDIT_SCOPE)
                .env("FLASHTUNE_PROTECTED", step::protected(project).join(" "))
                .env(
                    "FLASHTUNE_THRESHOLD",
                    project.policies.step.threshold.to_string(),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            crate::build::die_with_parent(&mut cmd);
            let k = *k;
            let child = cmd
                .spawn()
                .with_context(|| format!("cannot start the agent `{command}`"))?;
            set.spawn(async move {
                let started = Instant::now();
                let group = crate::build::ProcessGroup(child.id());
                let waited = tokio::time::timeout(timeout, child.wait_with_output()).await;
                // Nothing it left running may edit its worktree while it is judged.
                drop(group);
                let (status, timed_out, stdout, stderr) = match waited {
                    Err(_) => (
                        format!("killed after {} s", timeout.as_secs()),
                        true,
                        String::new(),
                        String::new(),
                    ),
                    Ok(Err(e)) => (
                        format!("wait failed: {e}"),
                        false,
                        String::new(),
                        String::new(),
                    ),
                    Ok(Ok(out)) => (
                        out.status.to_string(),
                        false,
                        String::from_utf8_lossy(&out.stdout).into_owned(),
                        String::from_utf8_lossy(&out.stderr).into_owned(),
                    ),
                };
                AgentRun {
                    candidate: k,
                    seconds: started.elapsed().as_secs_f64(),
                    status,
                    timed_out,
                    output: format!("{stdout}{stderr}"),
                    stdout,
                    usage_file: std::fs::read_to_string(&usage_file).ok(),
                }
            });
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
            let proposal = self.read_proposal(n, &run, &workdir, base, events)?;
            log_hash = step::file_hash(&events.log.path);
            proposals.push(proposal);
        }
        proposals.sort_by_key(|p| p.candidate);
        // An agent that reached outside its worktree: the main tree or HEAD changed under the step.
        let (now, now_ref) = step::head_of(repo)?;
        let moved = now != base || now_ref != base_ref;
        if moved {
            step::put_head_back(repo, base_ref, base)?;
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
            for p in &mut proposals {
                events.emit(Record::CandidateDropped {
                    step: n,
                    candidate: p.candidate,
                    reason: reason.clone(),
                })?;
                p.unjudged = Some(reason.clone());
            }
        }
        Ok(proposals)
    }

    /// What a candidate changed in its worktree, and what it cost, into the log.
    fn read_proposal(
        &self,
        n: u32,
        run: &AgentRun,
        workdir: &Path,
        base: &str,
        events: &mut Events,
    ) -> Result<Proposal> {
        let project = &self.bench.project;
        let diff = worktree_diff(workdir, base, |p| step::in_scope(project, p))?;
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
                Some(f) => match crate::usage::read(
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
        let finished = !run.timed_out && run.status == "exit status: 0";
        let unjudged = if !finished {
            Some(format!(
                "the agent did not finish cleanly ({}); its edit is not judged",
                run.status
            ))
        } else if !diff.outside.is_empty() {
            Some(format!(
                "the agent changed files outside the edit scope: {}",
                diff.outside.join(", ")
            ))
        } else if diff.inside.is_empty() {
            Some("no edits under kernels/ to judge".into())
        } else {
            None
        };
        events.emit(Record::CandidateProposed {
            step: n,
            candidate: run.candidate,
            seconds: run.seconds,
            status: run.status.clone(),
            timed_out: run.timed_out,
            output_tail: crate::build::log_tail(&run.output, 40),
            changed_files: diff.inside.clone(),
            outside_scope: diff.outside.clone(),
            diff_stat: diff.stat.clone(),
            patch: diff.patch,
            usage,
            usage_error,
        })?;
        Ok(Proposal {
            candidate: run.candidate,
            workdir: workdir.to_path_buf(),
            changed: diff.inside,
            unjudged,
        })
    }

    /// Build every judgeable candidate at once, then duel each against HEAD's champion in turn.
    async fn judge_all(
        &self,
        n: u32,
        proposals: &[Proposal],
        pairings: &[Pairing],
        head_cubins: &BTreeMap<crate::run::UnitKey, PathBuf>,
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
        // Builds run side by side, each into a cache of its own (no candidate's cubin serves another).
        let pending: Vec<_> = ready
            .iter()
            .map(|p| {
                session.spawn_edit_build(
                    pairings,
                    &p.workdir,
                    &format!("cand{}", p.candidate),
                    step_dir.join(format!("cand-{}.build", p.candidate)),
                    jobs,
                )
            })
            .collect();
        let mut built = Vec::new();
        for (p, pending) in ready.iter().zip(pending) {
            built.push((p, step::collect_builds(pending, project, events).await?));
        }
        // The GPU judges one candidate at a time (the session holds its lock).
        for (p, cubins) in built {
            let tag = format!("cand{}", p.candidate);
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
                            &tag,
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

    /// In-scope files of the main working tree back to HEAD (an edit applied but never committed).
    fn restore_scope(&self) -> Result<Vec<String>> {
        let (inside, _) = step::changes(&self.bench.project, &self.bench.root)?;
        if !inside.is_empty() {
            step::restore(&self.bench.root, &inside)?;
        }
        Ok(inside)
    }

    /// Finish step `n`, which a killed session left in flight.
    async fn recover(
        &self,
        n: u32,
        loaded: &crate::runlog::LoadedLog,
        events: &mut Events,
    ) -> Result<()> {
        let bench = self.bench;
        let repo = git2::Repository::open(&bench.root).map_err(git)?;
        let head = repo.head().and_then(|h| h.peel_to_commit()).map_err(git)?;
        let trailer = format!("Flashtune-Step: {}/{n}\n", bench.run_id);
        let committed = head.message().is_ok_and(|m| m.contains(&trailer));
        let restored = self.restore_scope()?;
        let recovered_commit = committed.then(|| head.id().to_string());
        events.emit(Record::SessionResumed {
            step: Some(n),
            restored,
            recovered_commit: recovered_commit.clone(),
        })?;
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
                    status,
                    timed_out,
                    ..
                } if *step == n => {
                    let ok = !timed_out && status == "exit status: 0" && outside_scope.is_empty();
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
                reason: "committed before the session was killed; recovered from HEAD's trailer"
                    .into(),
                geomean_gain: None,
                commit: Some(commit),
                restored: Vec::new(),
                candidate: None,
            })?;
            return Ok(());
        }
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
                    proposals.push(Proposal {
                        candidate: k,
                        workdir: workdir.clone(),
                        changed: changed.clone(),
                        unjudged,
                    });
                }
                _ => {
                    events.emit(Record::CandidateDropped {
                        step: n,
                        candidate: k,
                        reason: "the session was killed while this candidate's agent ran; dropped unjudged".into(),
                    })?;
                    remove_worktree(&repo, &worktree_name(&bench.run_id, n, k), workdir);
                }
            }
        }
        let markdown = self.one_step(n, Some(proposals), events).await?;
        println!("{markdown}");
        Ok(())
    }
}

/// Refuse to start with uncommitted edits in the scope: the winner's files are copied over them.
fn refuse_dirty_scope(bench: &Bench) -> Result<()> {
    let (inside, _) = step::changes(&bench.project, &bench.root)?;
    if inside.is_empty() {
        return Ok(());
    }
    Err(Error::BadInput(format!(
        "uncommitted edits under kernels/ ({}): an agent session commits its candidates' edits over them; commit or revert them first (or judge them with `flashtune step`)",
        inside.join(", ")
    )))
}

/// Each placeholder replaced by its value, shell-quoted.
fn fill(template: &str, values: &BTreeMap<&str, String>) -> String {
    let mut out = template.to_owned();
    for (k, v) in values {
        out = out.replace(&format!("{{{k}}}"), &shell_quote(v));
    }
    out
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,".contains(c))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn worktree_name(run_id: &str, n: u32, k: u32) -> String {
    format!("flashtune-{run_id}-s{n}-c{k}")
}

fn git(e: git2::Error) -> Error {
    Error::Other(anyhow!("git: {}", e.message()))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .with_context(|| format!("cannot write {}", path.display()))
        .map_err(Error::Other)
}

/// A linked worktree of `repo` at `path`, its HEAD detached at `commit`.
fn make_worktree(repo: &git2::Repository, name: &str, commit: &str, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // libgit2 makes a branch for a new worktree; the worktree is then detached and the branch deleted.
    let wt = repo.worktree(name, path, None).map_err(|e| {
        Error::Other(anyhow!(
            "cannot make the worktree {}: {}",
            path.display(),
            e.message()
        ))
    })?;
    let wrepo = git2::Repository::open_from_worktree(&wt).map_err(git)?;
    let id = git2::Oid::from_str(commit).map_err(git)?;
    wrepo.set_head_detached(id).map_err(git)?;
    let object = wrepo.find_object(id, None).map_err(git)?;
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    wrepo
        .reset(&object, git2::ResetType::Hard, Some(&mut checkout))
        .map_err(git)?;
    if let Ok(mut branch) = repo.find_branch(name, git2::BranchType::Local) {
        let _ = branch.delete();
    }
    Ok(())
}

/// Remove a candidate's worktree and its record in the repository; what cannot be removed stays (harmless).
fn remove_worktree(repo: &git2::Repository, name: &str, path: &Path) {
    let _ = std::fs::remove_dir_all(path);
    if let Ok(wt) = repo.find_worktree(name) {
        let mut opts = git2::WorktreePruneOptions::new();
        opts.valid(true).working_tree(true);
        let _ = wt.prune(Some(&mut opts));
    }
    if let Ok(mut branch) = repo.find_branch(name, git2::BranchType::Local) {
        let _ = branch.delete();
    }
}

/// A worktree's changes against the base commit.
struct WorktreeDiff {
    inside: Vec<String>,
    outside: Vec<String>,
    stat: String,
    patch: String,
}

/// Compare a worktree's files (whatever its HEAD) with the base commit's tree; the pack's files are not the edit.
fn worktree_diff(
    workdir: &Path,
    base: &str,
    in_scope: impl Fn(&str) -> bool,
) -> Result<WorktreeDiff> {
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
    let mut inside = Vec::new();
    let mut outside = Vec::new();
    for d in diff.deltas() {
        let path = d
            .new_file()
            .path()
            .or_else(|| d.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if pack::is_pack_path(&path) || path.is_empty() {
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
    let mut cut = false;
    diff.print(git2::DiffFormat::Patch, |delta, _hunk, line| {
        let path = delta
            .new_file()
            .path()
            .or_else(|| delta.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if pack::is_pack_path(&path) {
            return true;
        }
        match line.origin() {
            '+' => plus += 1,
            '-' => minus += 1,
            _ => {}
        }
        if !in_scope(&path) {
            return true;
        }
        if patch.len() < pack::PATCH_MAX_BYTES {
            if matches!(line.origin(), '+' | '-' | ' ') {
                patch.push(line.origin());
            }
            patch.push_str(&String::from_utf8_lossy(line.content()));
        } else {
            cut = true;
        }
        true
    })
    .map_err(git)?;
    if cut {
        patch.push_str("\n[cut: the patch is longer than the log keeps]\n");
    }
    let files = inside.len() + outside.len();
    Ok(WorktreeDiff {
        stat: format!(
            "{files} file{}, +{plus} -{minus}",
            if files == 1 { "" } else { "s" }
        ),
        inside,
        outside,
        patch,
    })
}

/// Copy a candidate's in-scope files (or their removal) from its worktree into the main tree.
fn apply(workdir: &Path, root: &Path, files: &[String]) -> Result<()> {
    for f in files {
        let (from, to) = (workdir.join(f), root.join(f));
        if from.exists() {
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            std::fs::copy(&from, &to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
        } else if to.exists() {
            std::fs::remove_file(&to).with_context(|| format!("cannot remove {}", to.display()))?;
        }
    }
    Ok(())
}

/// The champion's sources at `base`: every file of the edit scope except the protected ones.
fn sources_at(
    repo: &git2::Repository,
    base: &str,
    paths: &[String],
) -> Result<Vec<(String, Vec<u8>)>> {
    let id = git2::Oid::from_str(base).map_err(git)?;
    let tree = repo.find_commit(id).and_then(|c| c.tree()).map_err(git)?;
    let mut out = Vec::new();
    for p in paths {
        let entry = tree.get_path(Path::new(p)).map_err(git)?;
        let blob = repo.find_blob(entry.id()).map_err(git)?;
        out.push((p.clone(), blob.content().to_vec()));
    }
    Ok(out)
}

/// Files of the edit scope at `base` that the champion is built from (the space's family folder).
fn champion_sources(
    project: &crate::run::Project,
    repo: &git2::Repository,
    base: &str,
) -> Result<Vec<String>> {
    let id = git2::Oid::from_str(base).map_err(git)?;
    let tree = repo.find_commit(id).and_then(|c| c.tree()).map_err(git)?;
    let forward = project.space.family.forward.to_string_lossy().into_owned();
    let folder = forward.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
    let protected = step::protected(project);
    let mut out = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        let path = format!("{dir}{}", entry.name().unwrap_or(""));
        if entry.kind() == Some(git2::ObjectType::Blob)
            && dir.trim_end_matches('/') == folder
            && !protected.contains(&path)
        {
            out.push(path);
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(git)?;
    Ok(out)
}

/// Gather a pack for HEAD's champions.
#[allow(clippy::too_many_arguments)]
fn build_pack(
    project: &crate::run::Project,
    repo: &git2::Repository,
    base: &str,
    pairings: &[Pairing],
    device: Option<&crate::protocol::DeviceInfo>,
    roofs: &crate::roofs::Roofs,
    n: u32,
    budget: BudgetLeft,
) -> Result<ContextPack> {
    let head_tree = tempfile_dir(&project.paths.runs())?;
    step::extract_tree(repo, base, EDIT_SCOPE, head_tree.path())?;
    let hash = crate::run::sources_hash(&head_tree.path().join(EDIT_SCOPE));
    let cases = pairings
        .iter()
        .map(|p| PackCase {
            shape: p.shape.clone(),
            dtype: p.dtype,
            variant: p.point.variant.id.clone(),
            params: p
                .point
                .variant
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
        })
        .collect();
    Ok(pack::gather(PackInput {
        policies: &project.policies,
        runs_dir: &project.paths.runs(),
        step: n,
        base_commit: base,
        kernel_sources_hash: &hash,
        edit_scope: EDIT_SCOPE,
        protected: step::protected(project),
        device,
        roofs,
        cases,
        sources: champion_sources(project, repo, base)?,
        budget,
    }))
}

/// A scratch folder removed when dropped (under runs/, which is flashtune's own).
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir(runs: &Path) -> Result<ScratchDir> {
    let dir = runs.join(format!(
        ".scratch-{}-{}",
        std::process::id(),
        crate::run::new_run_id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(ScratchDir(dir))
}

/// One candidate's line in the ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LedgerRow {
    pub step: u32,
    pub candidate: u32,
    /// `committed`, `accepted`, `rejected`, `dropped` or `unfinished`.
    pub verdict: String,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    pub agent_seconds: Option<f64>,
    pub gpu_seconds: Option<f64>,
    pub input_tokens: Option<u64>,
    pub cached_input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Null where neither the agent nor the price table gives dollars.
    pub usd: Option<f64>,
    pub usd_from: Option<String>,
    pub files: Vec<String>,
    pub diff_stat: Option<String>,
}

/// One case of a candidate's duel: shape, dtype, HEAD's median and the candidate's (µs).
type DuelMedians = (String, crate::config::Dtype, Option<f64>, Option<f64>);

/// Every candidate of an agent session, from its log.
struct Ledger {
    rows: Vec<LedgerRow>,
    /// Per decided step: committed, with its gain.
    steps: Vec<(u32, bool, Option<f64>)>,
    /// Per (step, shape, dtype): the champion's time after the step (µs), from its duels.
    champion_after: BTreeMap<(u32, String, crate::config::Dtype), f64>,
}

impl Ledger {
    fn read(run_dir: &Path) -> Result<Ledger> {
        let log = crate::runlog::read(&run_dir.join("log.jsonl"))?;
        let mut rows: BTreeMap<(u32, u32), LedgerRow> = BTreeMap::new();
        let mut steps = Vec::new();
        let mut duels: BTreeMap<(u32, u32), Vec<DuelMedians>> = BTreeMap::new();
        for (_, e) in &log.entries {
            match &e.record {
                Record::CandidateStarted {
                    step, candidate, ..
                } => {
                    rows.insert(
                        (*step, *candidate),
                        LedgerRow {
                            step: *step,
                            candidate: *candidate,
                            verdict: "unfinished".into(),
                            reason: String::new(),
                            geomean_gain: None,
                            agent_seconds: None,
                            gpu_seconds: None,
                            input_tokens: None,
                            cached_input_tokens: None,
                            output_tokens: None,
                            usd: None,
                            usd_from: None,
                            files: Vec::new(),
                            diff_stat: None,
                        },
                    );
                }
                Record::CandidateProposed {
                    step,
                    candidate,
                    seconds,
                    changed_files,
                    outside_scope,
                    diff_stat,
                    usage,
                    ..
                } => {
                    if let Some(r) = rows.get_mut(&(*step, *candidate)) {
                        r.agent_seconds = Some(*seconds);
                        r.files = changed_files.iter().chain(outside_scope).cloned().collect();
                        r.diff_stat = Some(diff_stat.clone());
                        if let Some(u) = usage {
                            r.input_tokens = Some(u.input_tokens);
                            r.cached_input_tokens = Some(u.cached_input_tokens);
                            r.output_tokens = Some(u.output_tokens);
                            r.usd = u.usd;
                            r.usd_from = u.usd_from.clone();
                        }
                    }
                }
                Record::CandidateJudged {
                    step,
                    candidate,
                    accepted,
                    reason,
                    geomean_gain,
                    gpu_seconds,
                } => {
                    if let Some(r) = rows.get_mut(&(*step, *candidate)) {
                        r.verdict = if *accepted { "accepted" } else { "rejected" }.into();
                        r.reason = reason.clone();
                        r.geomean_gain = *geomean_gain;
                        r.gpu_seconds = Some(*gpu_seconds);
                    }
                }
                Record::CandidateDropped {
                    step,
                    candidate,
                    reason,
                } => {
                    if let Some(r) = rows.get_mut(&(*step, *candidate)) {
                        r.verdict = "dropped".into();
                        r.reason = reason.clone();
                    }
                }
                Record::Duel {
                    step,
                    shape,
                    dtype,
                    champion,
                    challenger,
                    candidate: Some(k),
                    ..
                } => {
                    duels.entry((*step, *k)).or_default().push((
                        shape.clone(),
                        *dtype,
                        champion.as_ref().map(|t| t.median_us),
                        challenger.as_ref().map(|t| t.median_us),
                    ));
                }
                Record::StepDecided {
                    step,
                    accepted,
                    geomean_gain,
                    candidate,
                    ..
                } => {
                    steps.push((*step, *accepted, *geomean_gain));
                    if let (true, Some(k)) = (*accepted, candidate) {
                        if let Some(r) = rows.get_mut(&(*step, *k)) {
                            r.verdict = "committed".into();
                        }
                    }
                }
                _ => {}
            }
        }
        // The champion after each step: the winner's time where one was committed, else HEAD's as measured.
        let mut champion_after = BTreeMap::new();
        for &(n, accepted, _) in &steps {
            let winner = rows
                .values()
                .find(|r| r.step == n && r.verdict == "committed")
                .map(|r| r.candidate);
            for ((s, k), cases) in &duels {
                if *s != n {
                    continue;
                }
                for (shape, dtype, champ, chall) in cases {
                    let value = if accepted && winner == Some(*k) {
                        *chall
                    } else if !accepted {
                        *champ
                    } else {
                        None
                    };
                    if let Some(v) = value {
                        champion_after.insert((n, shape.clone(), *dtype), v);
                    }
                }
            }
        }
        Ok(Ledger {
            rows: rows.into_values().collect(),
            steps,
            champion_after,
        })
    }

    fn steps(&self) -> u32 {
        self.steps.len() as u32
    }

    fn committed(&self) -> u32 {
        self.steps.iter().filter(|s| s.1).count() as u32
    }

    /// Dollars the agents reported (or the price table gave); unknown dollars count as none.
    fn known_usd(&self) -> f64 {
        // Starts at +0: an empty f64 sum is -0, which prints as "-0.000".
        self.rows
            .iter()
            .filter_map(|r| r.usd)
            .fold(0.0, |a, b| a + b)
    }

    fn unknown_usd(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.usd.is_none() && r.agent_seconds.is_some())
            .count()
    }

    fn steps_since_commit(&self) -> u32 {
        self.steps.iter().rev().take_while(|s| !s.1).count() as u32
    }

    /// Speedup kept: the product of the committed steps' geomean gains, minus one.
    fn speedup_kept(&self) -> f64 {
        self.steps
            .iter()
            .filter(|s| s.1)
            .map(|s| 1.0 + s.2.unwrap_or(0.0))
            .product::<f64>()
            - 1.0
    }

    /// The lowest binding-roof fraction over the cases, after the last decided step.
    fn lowest_roof_fraction(
        &self,
        project: &crate::run::Project,
        roofs: &crate::roofs::Roofs,
    ) -> Option<f64> {
        let last = self.steps.last()?.0;
        let mut lowest: Option<f64> = None;
        for shape in &project.shapes {
            for &dtype in &project.policies.dtypes {
                let us = *self
                    .champion_after
                    .get(&(last, shape.name.clone(), dtype))?;
                let f = pack::roof_fraction(shape, dtype, us, roofs)?;
                lowest = Some(lowest.map_or(f, |l: f64| l.min(f)));
            }
        }
        lowest
    }

    /// The morning summary: what was tried, what was kept, what it cost.
    fn summary_markdown(&self, stopped: Option<&str>) -> String {
        let mut m = String::from("## Summary\n\n");
        let candidates = self.rows.len();
        let committed = self.committed();
        let kept = self.speedup_kept();
        let usd = self.known_usd();
        let unknown = self.unknown_usd();
        let gpu: f64 = self
            .rows
            .iter()
            .filter_map(|r| r.gpu_seconds)
            .fold(0.0, |a, b| a + b);
        let agent: f64 = self
            .rows
            .iter()
            .filter_map(|r| r.agent_seconds)
            .fold(0.0, |a, b| a + b);
        let _ = writeln!(
            m,
            "- steps: {}, candidates: {candidates}, committed: {committed}",
            self.steps()
        );
        let _ = writeln!(
            m,
            "- speedup kept: {:+.2}% (product of the committed steps' geomean gains)",
            kept * 100.0
        );
        let dollars = |x: f64| {
            if unknown > 0 {
                format!("≥ ${x:.3}")
            } else {
                format!("${x:.3}")
            }
        };
        let _ = writeln!(
            m,
            "- cost: {}{}; agent time {agent:.1} s; GPU time {gpu:.1} s",
            dollars(usd),
            if unknown > 0 {
                format!(" ({unknown} candidates' dollars unknown)")
            } else {
                String::new()
            }
        );
        let per = |d: f64| {
            if d > 0.0 {
                dollars(usd / d)
            } else {
                "—".into()
            }
        };
        let _ = writeln!(
            m,
            "- per step: {}; per accepted change: {}; per percent of speedup kept: {}",
            per(f64::from(self.steps())),
            per(f64::from(committed)),
            per(kept * 100.0)
        );
        if let Some(why) = stopped {
            let _ = writeln!(m, "- stopped: {why}");
        }
        let _ = writeln!(
            m,
            "\n| step | cand. | verdict | gain | agent s | GPU s | tokens in (cached)/out | $ | diff | reason |"
        );
        let _ = writeln!(m, "|---:|---:|---|---:|---:|---:|---:|---:|---|---|");
        for r in &self.rows {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.step,
                r.candidate,
                r.verdict,
                r.geomean_gain
                    .map_or("—".into(), |g| format!("{:+.1}%", g * 100.0)),
                r.agent_seconds.map_or("—".into(), |s| format!("{s:.1}")),
                r.gpu_seconds.map_or("—".into(), |s| format!("{s:.1}")),
                match (r.input_tokens, r.cached_input_tokens, r.output_tokens) {
                    (Some(i), Some(c), Some(o)) => format!("{i} ({c})/{o}"),
                    _ => "—".into(),
                },
                r.usd.map_or("null".into(), |u| format!("{u:.4}")),
                r.diff_stat.clone().unwrap_or_default(),
                r.reason.lines().next().unwrap_or("").replace('|', "/")
            );
        }
        m
    }
}

/// An agent step's Markdown section: the outcome, then one row per candidate with its cost.
#[allow(clippy::too_many_arguments)]
fn step_markdown(
    n: u32,
    base: &str,
    device: &crate::protocol::DeviceInfo,
    judged: &[Judged],
    proposals: &[Proposal],
    accepted: bool,
    reason: &str,
    commit: Option<&str>,
    ledger: &Ledger,
) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "## Step {n} — {}\n",
        if accepted { "accepted" } else { "rejected" }
    );
    let _ = writeln!(m, "- base: `{}`", step::short(base));
    let _ = writeln!(
        m,
        "- GPU: {}{}",
        device.name,
        if device.fake {
            " — synthetic figures, nothing here was measured"
        } else {
            ""
        }
    );
    let _ = writeln!(m, "- why: {reason}");
    if let Some(c) = commit {
        let _ = writeln!(m, "- committed: `{}`", step::short(c));
    }
    let _ = writeln!(
        m,
        "\n| cand. | files | verdict | gain | agent s | GPU s | tokens in/out | $ | reason |"
    );
    let _ = writeln!(m, "|---:|---|---|---:|---:|---:|---:|---:|---|");
    for p in proposals {
        let row = ledger
            .rows
            .iter()
            .find(|r| r.step == n && r.candidate == p.candidate);
        let j = judged.iter().find(|j| j.candidate == p.candidate);
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.candidate,
            row.and_then(|r| r.diff_stat.clone()).unwrap_or_default(),
            row.map_or("—".into(), |r| r.verdict.clone()),
            j.and_then(|j| j.gain)
                .map_or("—".into(), |g| format!("{:+.1}%", g * 100.0)),
            row.and_then(|r| r.agent_seconds)
                .map_or("—".into(), |s| format!("{s:.1}")),
            row.and_then(|r| r.gpu_seconds)
                .map_or("—".into(), |s| format!("{s:.1}")),
            row.and_then(|r| r.input_tokens.zip(r.output_tokens))
                .map_or("—".into(), |(i, o)| format!("{i}/{o}")),
            row.and_then(|r| r.usd)
                .map_or("null".into(), |u| format!("{u:.4}")),
            j.map_or(String::new(), |j| j
                .reason
                .lines()
                .next()
                .unwrap_or("")
                .replace('|', "/"))
        );
    }
    for j in judged.iter().filter(|j| !j.duels.is_empty()) {
        let _ = writeln!(m, "\nCandidate {} against HEAD:\n", j.candidate);
        let _ = writeln!(m, "| shape | dtype | HEAD µs | edit µs | gain | noise |");
        let _ = writeln!(m, "|---|---|---:|---:|---:|---:|");
        for d in &j.duels {
            let us = |x: Option<f64>| x.map_or("—".into(), |x| format!("{x:.2}"));
            let (gain, noise) = d.verdict.as_ref().map_or(("—".into(), "—".into()), |v| {
                (
                    format!("{:+.1}%", v.gain * 100.0),
                    format!("{:.1}%", v.noise * 100.0),
                )
            });
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {gain} | {noise} |",
                d.shape,
                d.dtype,
                us(d.champion_us),
                us(d.challenger_us)
            );
        }
    }
    m
}

// ---- The workbench: the operations an agent calls (CLI `--json`, MCP). Names are stable. ----

/// Where and how to judge: the project, and the GPU (or the test double).
pub struct JudgeOptions {
    pub paths: ProjectPaths,
    /// Variant space whose shapes are the cases judged (default: policies.toml's).
    pub space: Option<PathBuf>,
    /// The champion where HEAD's champion table names none.
    pub variant: Option<String>,
    pub device: u32,
    pub executor: Executor,
    pub when_busy: WhenBusy,
}

/// The verdict on the working tree's edit, as `flashtune judge --json` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JudgeVerdict {
    pub run_id: String,
    pub run_dir: PathBuf,
    pub accepted: bool,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    /// The commit made for an accepted edit.
    pub commit: Option<String>,
    /// Files put back as HEAD has them (a rejected edit).
    pub restored: Vec<String>,
    pub changed_files: Vec<String>,
    pub duels: Vec<pack::DuelFigure>,
    /// The step's Markdown report.
    pub report: PathBuf,
    /// True on the test double: the figures are synthetic.
    pub fake_gpu: bool,
}

/// Judge the uncommitted edit under kernels/ as `flashtune step` does (build, check, interleaved
/// duel against HEAD's champion; commit or restore) and return the verdict from the run's log.
pub async fn judge_working_tree(opts: JudgeOptions) -> Result<JudgeVerdict> {
    let outcome = step::step(StepOptions {
        paths: opts.paths,
        space: opts.space,
        variant: opts.variant,
        proposer: None,
        steps: 1,
        time_limit: None,
        device: opts.device,
        executor: opts.executor,
        when_busy: opts.when_busy,
        quiet: true,
    })
    .await?;
    verdict_from_log(&outcome.run_dir)
}

/// The verdict of a one-step run, read from its log.
pub fn verdict_from_log(run_dir: &Path) -> Result<JudgeVerdict> {
    let log = crate::runlog::read(&run_dir.join("log.jsonl"))?;
    let header = log
        .header()
        .ok_or_else(|| Error::Other(anyhow!("{} has no header", run_dir.display())))?;
    let mut v = JudgeVerdict {
        run_id: header.run_id.clone(),
        run_dir: run_dir.to_path_buf(),
        accepted: false,
        reason: "the log holds no decision".into(),
        geomean_gain: None,
        commit: None,
        restored: Vec::new(),
        changed_files: Vec::new(),
        duels: Vec::new(),
        report: run_dir.join("step-1.md"),
        fake_gpu: header.device.fake,
    };
    for (_, e) in &log.entries {
        match &e.record {
            Record::StepStarted { changed_files, .. } => v.changed_files = changed_files.clone(),
            Record::Duel {
                shape,
                dtype,
                champion,
                challenger,
                verdict,
                failure,
                ..
            } => v.duels.push(pack::DuelFigure {
                shape: shape.clone(),
                dtype: *dtype,
                champion_us: champion.as_ref().map(|t| t.median_us),
                challenger_us: challenger.as_ref().map(|t| t.median_us),
                gain: verdict.as_ref().map(|x| x.gain),
                noise: verdict.as_ref().map(|x| x.noise),
                failure: failure.clone(),
            }),
            Record::StepDecided {
                accepted,
                reason,
                geomean_gain,
                commit,
                restored,
                ..
            } => {
                v.accepted = *accepted;
                v.reason = reason.clone();
                v.geomean_gain = *geomean_gain;
                v.commit = commit.clone();
                v.restored = restored.clone();
            }
            _ => {}
        }
    }
    Ok(v)
}

/// Every earlier step and candidate on this project, across sessions, oldest first.
pub fn step_history(paths: &ProjectPaths) -> Result<Vec<HistoryEntry>> {
    Ok(pack::history(&paths.runs()))
}

/// What `context_pack` needs: the project, and the space and champion as `step` would take them.
pub struct ContextOptions {
    pub paths: ProjectPaths,
    pub space: Option<PathBuf>,
    pub variant: Option<String>,
}

/// The context pack for the next step at HEAD, without a GPU: limits from policies.toml's
/// `[build.targets]` for the default arch, GPU facts and roofs from the newest run log that measured them.
pub fn context_pack(opts: &ContextOptions) -> Result<ContextPack> {
    let project = crate::run::Project::load(opts.paths.clone(), opts.space.as_deref())?;
    let repo = git2::Repository::open(&project.paths.root).map_err(|e| {
        Error::BadInput(format!(
            "{} is not a git repository's top: {}",
            project.paths.root.display(),
            e.message()
        ))
    })?;
    let (base, _) = step::head_of(&repo)?;
    let newest = newest_device_log(&project.paths.runs());
    let (device, roofs) = match &newest {
        Some(log) => (
            log.header().map(|h| h.device.clone()),
            crate::roofs::Roofs::from_log(log),
        ),
        None => (None, crate::roofs::Roofs::default()),
    };
    let arch = &project.policies.build.default_arch;
    let limits = match &device {
        Some(d) => crate::space::DeviceLimits {
            max_threads_per_block: d.max_threads_per_block,
            max_smem_optin_bytes: d.max_smem_optin_bytes,
            arch: d.arch.clone(),
        },
        None => {
            let t = project.policies.build.targets.get(arch).ok_or_else(|| {
                Error::BadInput(format!(
                    "policies.toml has no [build.targets.{arch}] for the default arch"
                ))
            })?;
            crate::space::DeviceLimits {
                max_threads_per_block: t.max_threads_per_block,
                max_smem_optin_bytes: t.max_smem_optin_bytes,
                arch: arch.clone(),
            }
        }
    };
    let pairings = step::champions_for(&project, &limits, opts.variant.as_deref(), &repo)?;
    let history = pack::history(&project.paths.runs());
    let step = history
        .iter()
        .filter(|h| h.candidate.is_none() || h.candidate == Some(1))
        .count() as u32
        + 1;
    build_pack(
        &project,
        &repo,
        &base,
        &pairings,
        device.as_ref(),
        &roofs,
        step,
        BudgetLeft::default(),
    )
}

/// The newest run log that measured the GPU's roofs.
fn newest_device_log(runs: &Path) -> Option<crate::runlog::LoadedLog> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("log.jsonl").is_file())
        .collect();
    dirs.sort();
    dirs.iter().rev().find_map(|d| {
        let text = std::fs::read_to_string(d.join("log.jsonl")).ok()?;
        if !text.contains("\"event\":\"ceiling_measured\"") {
            return None;
        }
        crate::runlog::read(&d.join("log.jsonl")).ok()
    })
}

/// Write a pack into `dir` (AGENTS.md, PROMPT.md, context/); the bytes written.
pub fn write_context_pack(pack: &ContextPack, paths: &ProjectPaths, dir: &Path) -> Result<u64> {
    let repo = git2::Repository::open(&paths.root).map_err(git)?;
    let sources = sources_at(&repo, &pack.base_commit, &pack.sources)?;
    pack::write(pack, &sources, dir)
        .map_err(|e| Error::Other(e.context("cannot write the context pack")))
}
