//! Agent sessions (`flashtune step --agent/--candidates`): N coding agents per step, each in its own git worktree with a context pack, judged one at a time against HEAD's champion, the best committed, every candidate and its cost in the log; stop rules, resume, and the workbench operations (judge, context, history) that the CLI's `--json` commands and an MCP server call.
//!
//! Why worktrees: a candidate's agent gets a real checkout of HEAD (git tools work in it, Codex and
//! Claude Code find AGENTS.md at its root) that shares the repository's objects, so making one costs
//! a checkout, not a clone. The main working tree is never handed to an agent: flashtune copies the
//! winner's in-scope files into it and commits them itself, so a candidate is never half-applied.
use crate::error::{Error, Result};
use crate::gpu::executor::Executor;
use crate::log::runlog::{AgentSettings, Record, RunCommand};
use crate::model::config::{ProjectPaths, AGENT_PLACEHOLDERS};
use crate::model::usage::UsageFormat;
use crate::run::shared::{Events, WhenBusy};
use crate::step::{self, Bench, StepOptions};
use anyhow::{anyhow, Context};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod candidates;
mod context;
mod ledger;
pub mod preflight;
mod recover;
mod round;
mod workbench;
mod worktree;

pub use context::{context_pack, write_context_pack, ContextOptions};
use ledger::Ledger;
pub use ledger::{LedgerDoc, LedgerRow};
pub use preflight::preflight;
pub use workbench::{
    attempt, error_code, error_document, judge_working_tree, log_refusal, step_history,
    step_run_from_log, verdict_from_log, AttemptDoc, HistoryDoc, JudgeOptions, JudgeVerdict,
    Refusal, StepRunDoc, StepVerdict,
};

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
    /// Variables carrying the agent's credentials (`[agents.NAME] auth_env`): checked before step 1.
    pub auth_env: Vec<String>,
}

impl AgentOptions {
    /// The agent named in policies.toml's `[agents]`, or a custom command; one candidate per step
    /// and no stop rule until the caller sets them.
    pub fn named(
        policies: &crate::model::config::Policies,
        name: Option<&str>,
        custom: Option<&str>,
    ) -> Result<AgentOptions> {
        let plain = |name: &str, command: &str, usage, auth_env| AgentOptions {
            name: name.to_owned(),
            command: command.to_owned(),
            usage,
            candidates: 1,
            max_cost_usd: None,
            stop_at_roof: None,
            patience: None,
            auth_env,
        };
        match (name, custom) {
            (Some(_), Some(_)) => Err(Error::BadInput(
                "give --agent NAME or --proposer CMD, not both".into(),
            )),
            (None, Some(cmd)) => {
                let unknown = crate::model::config::unknown_placeholders(cmd);
                if !unknown.is_empty() {
                    return Err(Error::BadInput(format!(
                        "--proposer names {{{}}}, which flashtune does not fill (it fills {{{}}})",
                        unknown.join("}, {"),
                        AGENT_PLACEHOLDERS.join("}, {")
                    )));
                }
                Ok(plain("custom", cmd, None, Vec::new()))
            }
            (Some(name), None) => {
                let t = policies.agents.get(name).ok_or_else(|| {
                    Error::BadInput(format!(
                        "no agent `{name}` in policies.toml (its [agents.*]: {}); add [agents.{name}] with a command, or pass --proposer CMD",
                        policies.agents.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?;
                Ok(plain(name, &t.command, t.usage, t.auth_env.clone()))
            }
            (None, None) => Err(Error::BadInput(
                "an agent session needs --agent NAME or --proposer CMD".into(),
            )),
        }
    }
}

/// The rule that ends an agent session early: decided on by type, written as its sentence.
#[derive(Debug, Clone, PartialEq)]
pub enum StopRule {
    /// `--time-limit` reached.
    TimeLimit { limit: std::time::Duration },
    /// `--max-cost-usd` spent.
    CostLimit { spent_usd: f64, max_usd: f64 },
    /// `--patience` steps in a row with nothing accepted.
    Patience { dry_steps: u32, patience: u32 },
    /// `--stop-at-roof`: every case's champion at this fraction of its binding roof or more.
    Roof { lowest: f64, fraction: f64 },
}

impl std::fmt::Display for StopRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopRule::TimeLimit { limit } => {
                write!(f, "time limit: {} reached", humantime::format_duration(*limit))
            }
            StopRule::CostLimit { spent_usd, max_usd } => write!(
                f,
                "cost limit: ${spent_usd:.2} spent of --max-cost-usd {max_usd:.2}"
            ),
            StopRule::Patience {
                dry_steps,
                patience,
            } => write!(
                f,
                "patience: {dry_steps} steps in a row with nothing accepted (--patience {patience})"
            ),
            StopRule::Roof { lowest, fraction } => write!(
                f,
                "roof: every case's champion is at {:.1}% or more of its binding measured roof (--stop-at-roof {fraction} = {:.1}%)",
                lowest * 100.0,
                fraction * 100.0
            ),
        }
    }
}

/// How an agent session ended.
pub struct SessionOutcome {
    pub run_dir: PathBuf,
    /// The run's records, as its log holds them.
    pub log: crate::log::runlog::LoadedLog,
    pub steps: u32,
    pub committed: u32,
    /// The stop rule that ended it early, if one did.
    pub stopped: Option<StopRule>,
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
    for warning in preflight(&agent)? {
        crate::tell!("warning: {warning}");
    }
    let opts = StepOptions {
        command: RunCommand::AgentSession,
        ..opts
    };
    // Bench::open refuses a tree holding the user's uncommitted work before any run starts.
    let (bench, mut events) = Bench::open(&opts, true, None).await?;
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

/// Take up a killed agent session from its log: the step in flight is finished (candidates whose
/// agent had finished are judged again, the others dropped with a record, an edit applied but not
/// committed is restored, a commit made but not logged is recorded), then the steps left run.
pub async fn resume(ro: ResumeOptions, run_dir: &Path) -> Result<SessionOutcome> {
    let (loaded, _) = crate::run::engine::read_sealed_run(run_dir)?;
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
        idea: None,
        command: RunCommand::AgentSession,
    };
    let agent = AgentOptions {
        name: settings.agent.clone(),
        command: settings.command.clone(),
        usage: settings.usage,
        candidates: settings.candidates,
        max_cost_usd: settings.max_cost_usd,
        stop_at_roof: settings.stop_at_roof,
        patience: settings.patience,
        auth_env: Vec::new(),
    };
    preflight(&agent)?;
    let (bench, mut events) = Bench::open(&opts, true, Some((run_dir, &loaded))).await?;
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
        if step::unless_stopped(runner.recover(n, &loaded, &mut events))
            .await
            .transpose()?
            .is_none()
        {
            return Err(runner.session().interrupted(n, &mut events));
        }
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
    /// `std`'s words for how it ended, for people.
    status: String,
    end: crate::model::vocab::ProcessEnd,
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
    /// Its edit, snapshotted when its agent ended: what is built, judged and committed.
    snapshot: Option<step::Candidate>,
}

/// One judged candidate.
struct Judged {
    candidate: u32,
    accepted: bool,
    reason: String,
    gain: Option<f64>,
    overall: Option<crate::gpu::decide::Overall>,
    duels: Vec<step::DuelRow>,
}

impl Runner<'_> {
    fn session(&self) -> step::Session<'_> {
        self.bench.session(self.opts)
    }

    pub(super) async fn run_from(&self, first: u32, events: &mut Events) -> Result<SessionOutcome> {
        let run_dir = self.bench.run_dir.clone();
        let mut stopped = None;
        let mut written: std::collections::BTreeMap<u32, String> =
            std::collections::BTreeMap::new();
        for n in first..=self.opts.steps {
            if let Some(why) = self.stop_rule(events)? {
                events.emit(Record::SessionStopped {
                    reason: why.to_string(),
                })?;
                stopped = Some(why);
                break;
            }
            let Some(stepped) = step::unless_stopped(self.one_step(n, None, events)).await else {
                return Err(self.session().interrupted(n, events));
            };
            let markdown = stepped?;
            if !self.opts.quiet {
                crate::say!("{markdown}");
            }
            written.insert(n, markdown);
        }
        if stopped.is_none() {
            // A rule may end the session after its last step too: say so, for the summary.
            // The time limit is no news after the last step: the session ran its steps.
            if let Some(why) = self.stop_rule(events)? {
                if !matches!(why, StopRule::TimeLimit { .. }) {
                    stopped = Some(why);
                }
            }
        }
        let ledger = Ledger::of(events.records());
        let summary = ledger.summary_markdown(stopped.as_ref().map(|r| r.to_string()).as_deref());
        write(&run_dir.join("summary.md"), summary.as_bytes())?;
        write(
            &run_dir.join("ledger.json"),
            &serde_json::to_vec_pretty(&ledger.document()).map_err(|e| Error::Other(e.into()))?,
        )?;
        // This process's steps from memory; a step done before a resume, from what that process wrote.
        let report: String = (1..=self.opts.steps)
            .filter_map(|n| match written.remove(&n) {
                Some(markdown) => Some(markdown),
                None if n < first => {
                    std::fs::read_to_string(run_dir.join(format!("step-{n}.md"))).ok()
                }
                None => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        write(
            &run_dir.join("report.md"),
            format!("{report}\n{summary}").as_bytes(),
        )?;
        Ok(SessionOutcome {
            run_dir,
            log: events.records().clone(),
            steps: ledger.steps(),
            committed: ledger.committed(),
            stopped,
            summary,
        })
    }

    /// Why the session must not start another step, if it must not.
    fn stop_rule(&self, events: &Events) -> Result<Option<StopRule>> {
        let ledger = Ledger::of(events.records());
        if let Some(limit) = self.opts.time_limit {
            if self.started.elapsed() >= limit {
                return Ok(Some(StopRule::TimeLimit { limit }));
            }
        }
        if let Some(max) = self.agent.max_cost_usd {
            let spent = ledger.known_usd();
            if spent >= max {
                return Ok(Some(StopRule::CostLimit {
                    spent_usd: spent,
                    max_usd: max,
                }));
            }
        }
        if let Some(k) = self.agent.patience {
            let dry = ledger.steps_since_commit();
            if k > 0 && dry >= k {
                return Ok(Some(StopRule::Patience {
                    dry_steps: dry,
                    patience: k,
                }));
            }
        }
        if let Some(f) = self.agent.stop_at_roof {
            if let Some(lowest) = self.lowest_roof_fraction(events.records())? {
                if lowest >= f {
                    return Ok(Some(StopRule::Roof {
                        lowest,
                        fraction: f,
                    }));
                }
            }
        }
        Ok(None)
    }

    /// The lowest binding-roof fraction over the cases of the base the next step would build on,
    /// from the best figures any log holds for it (a `tune`, a duel of this or an earlier session);
    /// none while a case has no figure.
    fn lowest_roof_fraction(&self, log: &crate::log::runlog::LoadedLog) -> Result<Option<f64>> {
        let repo = git2::Repository::open(&self.bench.root).map_err(git)?;
        let (head, _) = step::head_of(&repo)?;
        let base = self.base_commit(&head);
        let pairings = self.session().champions(&repo)?;
        let pack = self.pack(1, &base, &pairings, &repo, log)?;
        let fractions: Option<Vec<f64>> = pack.cases.iter().map(|c| c.roof_fraction()).collect();
        Ok(fractions.and_then(|f| f.into_iter().reduce(f64::min)))
    }
}

fn git(e: git2::Error) -> Error {
    Error::Other(anyhow!("git: {}", e.message()))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .with_context(|| format!("cannot write {}", path.display()))
        .map_err(Error::Other)
}
