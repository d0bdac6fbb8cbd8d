//! The workbench: the operations an agent calls, by the CLI's `--json` commands and the MCP server
//! alike, each answering one JSON document (`schema_version` in every one; their JSON Schema is
//! tests/fixtures/schemas/workbench-1.schema.json): judge the working tree, the history, one
//! attempt, and the refusals and errors. Names are stable.
use super::write;
use crate::error::{Error, Result};
use crate::gpu::executor::Executor;
use crate::log::runlog::{Idea, LoadedLog, Record};
use crate::model::config::ProjectPaths;
use crate::pack::{self, HistoryEntry};
use crate::run::shared::{Events, WhenBusy};
use crate::step::{self, StepOptions};
use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

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
    /// What the edit tries, in one line: its entry in the history.
    pub idea: Option<String>,
}

/// The verdict on the working tree's edit, as `flashtune judge --json` prints it and the MCP
/// `judge` tool returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JudgeVerdict {
    pub schema_version: u32,
    /// `done`: the verdict is in (the MCP tool answers `running` with a job id before that).
    pub status: String,
    /// `accepted` or `rejected`.
    pub verdict: crate::model::vocab::AttemptVerdict,
    pub accepted: bool,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    /// The commit made for an accepted edit.
    pub commit: Option<String>,
    /// On the fake GPU: the scratch reference that commit is on (never a branch).
    pub scratch_ref: Option<String>,
    /// Files put back as HEAD has them (a rejected edit, or any edit on the fake GPU).
    pub restored: Vec<String>,
    pub changed_files: Vec<String>,
    /// Per case: HEAD's and the edit's median µs, the gain and noise, or why it failed.
    pub cases: Vec<pack::DuelFigure>,
    /// This attempt's id (`flashtune show-attempt ID` gives its patch back).
    pub attempt: String,
    pub idea: Option<Idea>,
    pub diff_stat: Option<String>,
    /// The whole patch of the edit, ready for `git apply`.
    pub patch_file: Option<PathBuf>,
    pub metrics: Option<pack::MetricsMoved>,
    pub run_id: String,
    pub run_dir: PathBuf,
    /// The step's Markdown report, and its text.
    pub report: PathBuf,
    pub report_markdown: Option<String>,
    /// True on the test double: the figures are synthetic.
    pub synthetic: bool,
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
        idea: opts.idea,
        command: crate::log::runlog::RunCommand::Judge,
    })
    .await?;
    verdict_from_log(
        &outcome.run_dir,
        &outcome.log,
        Some(outcome.report_markdown),
    )
}

/// The verdict of a one-step run, read from its log, with the step's report as it was written.
pub fn verdict_from_log(
    run_dir: &Path,
    log: &LoadedLog,
    report_markdown: Option<String>,
) -> Result<JudgeVerdict> {
    let header = log
        .header()
        .ok_or_else(|| Error::Other(anyhow!("{} has no header", run_dir.display())))?;
    let restored = log
        .entries
        .iter()
        .rev()
        .find_map(|(_, e)| match &e.record {
            Record::StepDecided { restored, .. } => Some(restored.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let entry = pack::history_in(run_dir)
        .into_iter()
        .next_back()
        .ok_or_else(|| Error::Other(anyhow!("{} holds no step", run_dir.display())))?;
    let accepted = entry.verdict == crate::model::vocab::AttemptVerdict::Committed;
    let report = run_dir.join("step-1.md");
    Ok(JudgeVerdict {
        schema_version: pack::JSON_SCHEMA_VERSION,
        status: "done".into(),
        verdict: crate::model::vocab::AttemptVerdict::judged(accepted),
        accepted,
        reason: entry.reason,
        geomean_gain: entry.geomean_gain,
        commit: entry.commit,
        scratch_ref: entry.scratch_ref,
        restored,
        changed_files: entry.files,
        cases: entry.cases,
        attempt: entry.attempt,
        idea: entry.idea,
        diff_stat: entry.diff_stat,
        patch_file: entry.patch_file,
        metrics: entry.metrics,
        run_id: header.run_id.clone(),
        run_dir: run_dir.to_path_buf(),
        report_markdown,
        report,
        synthetic: header.device.fake,
    })
}

/// A whole `flashtune step --json` run (in place or an agent session), one document: the run, and
/// per step what it decided and the attempts it judged.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepRunDoc {
    pub schema_version: u32,
    /// `done`: the run ended (a run that fails answers the error document instead).
    pub status: String,
    pub run_id: String,
    pub run_dir: PathBuf,
    /// Steps that kept their edit (committed; on the fake GPU to a scratch reference).
    pub accepted: u32,
    pub rejected: u32,
    /// The stop rule that ended an agent session early, if one did.
    pub stopped: Option<String>,
    /// The run's Markdown report (report.md; summary.md for an agent session), where it was written.
    pub report: Option<PathBuf>,
    /// True on the test double: the figures are synthetic.
    pub synthetic: bool,
    /// In the order they ran.
    pub steps: Vec<StepVerdict>,
}

/// One step of a `step --json` run: its verdict, as `judge --json` gives it for its one step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepVerdict {
    pub step: u32,
    /// `accepted` or `rejected`.
    pub verdict: crate::model::vocab::AttemptVerdict,
    pub accepted: bool,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    /// The commit made for an accepted edit.
    pub commit: Option<String>,
    /// On the fake GPU: the scratch reference that commit is on (never a branch).
    pub scratch_ref: Option<String>,
    /// In an agent session: the candidate committed.
    pub candidate: Option<u32>,
    /// Files put back as the step's base has them.
    pub restored: Vec<String>,
    /// The files the judged edit changed (an agent session's: the committed candidate's).
    pub changed_files: Vec<String>,
    /// The step's Markdown report.
    pub report: PathBuf,
    /// What the step judged, as `history --json` lists it: the edit of an in-place step, every
    /// candidate of an agent session's (their whole patches are `patch_file`).
    pub attempts: Vec<HistoryEntry>,
}

/// The document of a finished `step` run, read from its log; `stopped`: the stop rule that ended
/// an agent session early.
pub fn step_run_from_log(
    run_dir: &Path,
    log: &LoadedLog,
    stopped: Option<String>,
) -> Result<StepRunDoc> {
    let header = log
        .header()
        .ok_or_else(|| Error::Other(anyhow!("{} has no header", run_dir.display())))?;
    let attempts = pack::history_in(run_dir);
    let mut steps: Vec<StepVerdict> = Vec::new();
    for (_, e) in &log.entries {
        let Record::StepDecided {
            step,
            accepted,
            reason,
            geomean_gain,
            commit,
            restored,
            candidate,
            scratch_ref,
        } = &e.record
        else {
            continue;
        };
        let judged: Vec<HistoryEntry> = attempts
            .iter()
            .filter(|a| a.step == *step)
            .cloned()
            .map(|mut a| {
                // The whole patch is the attempt's patch_file; the document stays bounded.
                a.patch = None;
                a
            })
            .collect();
        let changed_files = judged
            .iter()
            .find(|a| a.candidate == *candidate)
            .map(|a| a.files.clone())
            .unwrap_or_default();
        let verdict = StepVerdict {
            step: *step,
            verdict: crate::model::vocab::AttemptVerdict::judged(*accepted),
            accepted: *accepted,
            reason: reason.clone(),
            geomean_gain: *geomean_gain,
            commit: commit.clone(),
            scratch_ref: scratch_ref.clone(),
            candidate: *candidate,
            restored: restored.clone(),
            changed_files,
            report: run_dir.join(format!("step-{step}.md")),
            attempts: judged,
        };
        // A resumed session decides each step once; should a log say it twice, the last word holds.
        match steps.iter_mut().find(|s| s.step == *step) {
            Some(s) => *s = verdict,
            None => steps.push(verdict),
        }
    }
    let accepted = steps.iter().filter(|s| s.accepted).count() as u32;
    let report = ["summary.md", "report.md"]
        .iter()
        .map(|f| run_dir.join(f))
        .find(|p| p.is_file());
    Ok(StepRunDoc {
        schema_version: pack::JSON_SCHEMA_VERSION,
        status: "done".into(),
        run_id: header.run_id.clone(),
        run_dir: run_dir.to_path_buf(),
        accepted,
        rejected: steps.len() as u32 - accepted,
        stopped,
        report,
        synthetic: header.device.fake,
        steps,
    })
}

/// Every earlier step and candidate on this project, as `history --json` prints it and the MCP
/// `history` tool returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryDoc {
    pub schema_version: u32,
    /// Attempts on record, all of them (`steps` may hold only the latest).
    pub total: usize,
    /// Oldest first.
    pub steps: Vec<HistoryEntry>,
}

/// Every earlier step and candidate on this project, across sessions, oldest first; the latest
/// `last` of them when given.
pub fn step_history(paths: &ProjectPaths, last: Option<usize>) -> HistoryDoc {
    let all = pack::history(&paths.runs());
    let total = all.len();
    let skip = last.map_or(0, |l| total.saturating_sub(l));
    HistoryDoc {
        schema_version: pack::JSON_SCHEMA_VERSION,
        total,
        steps: all.into_iter().skip(skip).collect(),
    }
}

/// One earlier attempt with its whole patch, as `show-attempt --json` prints it and the MCP
/// `attempt` tool returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AttemptDoc {
    pub schema_version: u32,
    #[serde(flatten)]
    pub entry: HistoryEntry,
}

/// An attempt by its id (`<run id>/<step>` or `<run id>/<step>.<candidate>`).
pub fn attempt(paths: &ProjectPaths, id: &str) -> Result<AttemptDoc> {
    if pack::parse_attempt_id(id).is_none() {
        return Err(Error::BadInput(format!(
            "`{id}` is not an attempt id: <run id>/<step> or <run id>/<step>.<candidate>, as `history` lists them"
        )));
    }
    let entry = pack::find_attempt(&paths.runs(), id).ok_or_else(|| {
        Error::BadInput(format!(
            "no attempt `{id}` under {}: `flashtune history` lists them",
            paths.runs().display()
        ))
    })?;
    Ok(AttemptDoc {
        schema_version: pack::JSON_SCHEMA_VERSION,
        entry,
    })
}

/// An edit turned away before any build (changes outside the edit scope, seen by the MCP server):
/// logged as a run of its own, so the history and its patch keep it like any judged edit.
pub struct Refusal {
    pub paths: ProjectPaths,
    pub space: Option<PathBuf>,
    /// The server judges on the fake GPU.
    pub fake: bool,
    pub base: String,
    pub files: Vec<String>,
    pub diff_stat: String,
    pub patch: String,
    pub reason: String,
    pub idea: Option<String>,
}

/// Log a refusal (header, `step_started`, `step_decided`, the patch under attempts/) and return
/// its verdict, the same document a judged edit gets.
pub fn log_refusal(r: Refusal) -> Result<JudgeVerdict> {
    let project = crate::run::shared::Project::load(r.paths.clone(), r.space.as_deref())?;
    let run_id = crate::run::shared::new_run_id();
    let run_dir = r.paths.runs().join(&run_id);
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("cannot create {}", run_dir.display()))?;
    let device = crate::model::protocol::DeviceInfo {
        ordinal: 0,
        name: "no GPU: refused before any build".into(),
        sm_count: 0,
        compute_capability: (0, 0),
        arch: project.policies.build.default_arch.clone(),
        max_threads_per_block: 0,
        max_smem_optin_bytes: 0,
        driver_version: 0,
        total_memory_bytes: 0,
        visible_devices: 0,
        l2_bytes: 0,
        fake: r.fake,
        placement: None,
    };
    let header = crate::run::shared::header(
        &project,
        &device,
        &run_id,
        &crate::model::plan::Strategy::default(),
        crate::log::runlog::RunCommand::Judge,
    );
    let log = crate::log::runlog::RunLog::create(&run_dir.join("log.jsonl"))?;
    let mut events = Events::new(log, Vec::new());
    events.emit(Record::Header(Box::new(header)))?;
    step::keep_patch(&run_dir, 1, None, &r.patch)?;
    let idea = r
        .idea
        .as_deref()
        .and_then(step::one_line)
        .map(|summary| Idea {
            summary,
            from: "caller".into(),
        });
    events.emit(Record::StepStarted {
        step: 1,
        base_commit: r.base.clone(),
        changed_files: r.files.clone(),
        diff_stat: Some(r.diff_stat.clone()),
        patch: Some(r.patch.clone()),
        idea,
    })?;
    events.emit(Record::StepDecided {
        step: 1,
        accepted: false,
        reason: r.reason.clone(),
        geomean_gain: None,
        commit: None,
        restored: r.files.clone(),
        candidate: None,
        scratch_ref: None,
    })?;
    let markdown = format!(
        "## Step 1 — rejected\n\n- base: `{}`\n- edit: {}\n- why: {}\n",
        step::short(&r.base),
        r.files.join(", "),
        r.reason
    );
    write(&run_dir.join("step-1.md"), markdown.as_bytes())?;
    verdict_from_log(&run_dir, events.records(), Some(markdown))
}

/// The workbench's error document: `{"schema_version", "error": {"code", "message", ...}}`, what
/// `judge --json` prints on a refusal and the MCP tools return with `isError`.
pub fn error_document(code: &str, message: &str, extra: Value) -> Value {
    let mut error = json!({ "code": code, "message": message });
    if let (Some(e), Value::Object(extra)) = (error.as_object_mut(), extra) {
        e.extend(extra);
    }
    json!({ "schema_version": pack::JSON_SCHEMA_VERSION, "error": error })
}

/// The error document's code for an error that reached the user.
pub fn error_code(e: &Error) -> &'static str {
    match e {
        Error::Config { .. } | Error::BadInput(_) => "bad_input",
        Error::UnknownVariant(_) => "unknown_variant",
        Error::NoGpu(_) => "no_gpu",
        Error::GpuBusy(_) => "gpu_busy",
        Error::ToolMissing { .. } => "tool_missing",
        Error::DiskFull(_) => "disk_full",
        Error::Interrupted { .. } => "interrupted",
        // A full disk, a quota, a read-only filesystem: the write's, never the edit's.
        Error::Other(_) if e.exit_code() == crate::error::exit_code::IO => "write_failed",
        Error::Other(_) => "failed",
    }
}
