//! The step history: every in-place step and agent candidate that any run log of the project holds,
//! with its idea, its patch (whole, in the run folder) and how the key metrics moved.
use super::HISTORY_PATCHES;
use crate::log::runlog::{self, Record};
use crate::log::runlog::{Entry, Idea, SealedLog};
use crate::model::config::Dtype;
use crate::model::vocab::BuildRole;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One earlier attempt at an edit: an in-place step, or one candidate of an agent session's step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntry {
    /// `<run id>/<step>` (an in-place step) or `<run id>/<step>.<candidate>`: what
    /// `flashtune show-attempt` and the MCP `attempt` tool take.
    pub attempt: String,
    pub run_id: String,
    pub started_at: String,
    pub step: u32,
    /// The candidate within its step (absent for an in-place `flashtune step`).
    pub candidate: Option<u32>,
    pub base_commit: String,
    pub files: Vec<String>,
    /// `N files, +A -D`, where the log holds the diff.
    pub diff_stat: Option<String>,
    /// The diff (bounded), for the latest entries; the whole one is `patch_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// The whole patch, ready for `git apply`, as the run folder keeps it.
    pub patch_file: Option<PathBuf>,
    /// What the attempt tried, in one line, and where the line came from.
    pub idea: Option<Idea>,
    /// The near-miss (an attempt id) this candidate's work directory started from.
    pub start_from: Option<String>,
    /// `committed`, `accepted` (beat HEAD but another candidate was better), `rejected`,
    /// `dropped` (never judged), or `unfinished` (the log ends before a verdict).
    pub verdict: crate::model::vocab::AttemptVerdict,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    /// The log line (record number in its run's log) of the verdict, which holds the gain.
    pub verdict_line: Option<usize>,
    pub commit: Option<String>,
    /// On the fake GPU: the scratch reference the accepted edit went to (never a branch).
    pub scratch_ref: Option<String>,
    pub cases: Vec<DuelFigure>,
    /// How the key metrics moved against HEAD's champion.
    pub metrics: Option<MetricsMoved>,
    pub cost: Cost,
    pub gpu: String,
    /// True where the figures come from the fake GPU: synthetic, nothing was measured.
    pub synthetic: bool,
}

/// One case of a duel, as the log holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DuelFigure {
    /// The `duel` record's line in its run's log.
    pub line: usize,
    pub shape: String,
    pub dtype: Dtype,
    pub champion_us: Option<f64>,
    pub challenger_us: Option<f64>,
    pub gain: Option<f64>,
    pub noise: Option<f64>,
    pub failure: Option<String>,
}

/// What an attempt cost; null where the log does not say.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Cost {
    pub agent_seconds: Option<f64>,
    pub gpu_seconds: Option<f64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub usd: Option<f64>,
}

/// How an attempt moved the key metrics against HEAD's champion: timing per case, and what ptxas
/// reported for the edit's build beside HEAD's (`[HEAD, edit]`, the largest over its kernels).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MetricsMoved {
    pub cases_timed: usize,
    pub cases_failed: usize,
    pub worst_case_gain: Option<f64>,
    pub best_case_gain: Option<f64>,
    pub registers: Option<[u64; 2]>,
    pub spill_bytes: Option<[u64; 2]>,
    pub static_smem_bytes: Option<[u64; 2]>,
    /// The same in one line, e.g. `geomean +4.1% (cases -0.8%..+9.0%); registers 96→128`.
    pub summary: String,
}

/// A run log the history reads: its id, when it started, on which GPU.
pub(super) struct LogMeta {
    pub(super) run_id: String,
    pub(super) dir: PathBuf,
    pub(super) started_at: String,
    pub(super) gpu: String,
    pub(super) fake: bool,
    pub(super) kernel_sources_hash: String,
}

/// `<run id>/<step>` or `<run id>/<step>.<candidate>`.
pub fn attempt_id(run_id: &str, step: u32, candidate: Option<u32>) -> String {
    match candidate {
        Some(k) => format!("{run_id}/{step}.{k}"),
        None => format!("{run_id}/{step}"),
    }
}

/// Where a run keeps an attempt's whole patch.
pub fn attempt_patch_path(run_dir: &Path, step: u32, candidate: Option<u32>) -> PathBuf {
    run_dir.join("attempts").join(match candidate {
        Some(k) => format!("{step}.{k}.patch"),
        None => format!("{step}.patch"),
    })
}

/// `(run id, step, candidate)` of an attempt id; `None` when it is not one.
pub fn parse_attempt_id(id: &str) -> Option<(String, u32, Option<u32>)> {
    let (run, rest) = id.trim().trim_end_matches('/').rsplit_once('/')?;
    let run = run.rsplit('/').next()?.to_owned();
    let (step, candidate) = match rest.split_once('.') {
        Some((s, k)) => (s.parse().ok()?, Some(k.parse().ok()?)),
        None => (rest.parse().ok()?, None),
    };
    (!run.is_empty()).then_some((run, step, candidate))
}

/// Every sealed run log under `runs_dir` with step records, oldest first (by run id, which starts with the time).
pub(super) fn step_logs(runs_dir: &Path) -> Vec<(LogMeta, SealedLog)> {
    logs_where(runs_dir, |text| {
        text.contains("\"event\":\"step_started\"")
            || text.contains("\"event\":\"candidate_started\"")
    })
}

/// The run logs under `runs_dir` whose text `wanted` picks, oldest first: sealed ones only, since
/// what they hold reaches the next agent as fact; an unsealed one is skipped, and the skip said.
pub(super) fn logs_where(
    runs_dir: &Path,
    wanted: impl Fn(&str) -> bool,
) -> Vec<(LogMeta, SealedLog)> {
    let Ok(dirs) = std::fs::read_dir(runs_dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = dirs
        .filter_map(|e| e.ok().map(|e| e.path().join("log.jsonl")))
        .filter(|p| p.is_file())
        .collect();
    runlog::sort_by_start(&mut paths);
    let mut out = Vec::new();
    for path in paths {
        // A cheap look before parsing: most logs of a project are tune runs without steps.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if !wanted(&text) {
            continue;
        }
        let Some(log) = read_sealed_or_say(&path) else {
            continue;
        };
        let Some(h) = log.header() else { continue };
        let meta = LogMeta {
            run_id: h.run_id.clone(),
            dir: path.parent().unwrap_or(runs_dir).to_path_buf(),
            started_at: h.started_at.clone(),
            gpu: h.device.name.clone(),
            fake: h.device.fake,
            kernel_sources_hash: h.kernel_sources_hash.clone(),
        };
        out.push((meta, log));
    }
    out
}

/// A sealed log, or `None` with the reason said on stderr (once per log and process: a pack reads
/// the logs several times), naming the file and its first bad line.
fn read_sealed_or_say(path: &Path) -> Option<SealedLog> {
    use std::sync::Mutex;
    static SAID: Mutex<std::collections::BTreeSet<PathBuf>> =
        Mutex::new(std::collections::BTreeSet::new());
    match runlog::read_sealed(path) {
        Ok(log) => Some(log),
        Err(e) => {
            let first = SAID
                .lock()
                .map_or(true, |mut said| said.insert(path.to_path_buf()));
            if first {
                crate::tell!("warning: run log skipped: {e:#}; its records are not shown to agents or in the history");
            }
            None
        }
    }
}

/// Every step and candidate that any run log of the project holds, oldest first.
pub fn history(runs_dir: &Path) -> Vec<HistoryEntry> {
    let mut all = Vec::new();
    for (meta, log) in step_logs(runs_dir) {
        all.extend(history_of(&meta, &log));
    }
    let n = all.len();
    for (i, e) in all.iter_mut().enumerate() {
        if i + HISTORY_PATCHES < n {
            e.patch = None;
        }
    }
    all
}

/// The attempts one run's log holds (a `judge` run: its one step), oldest first.
pub fn history_in(run_dir: &Path) -> Vec<HistoryEntry> {
    let path = run_dir.join("log.jsonl");
    let Some(log) = read_sealed_or_say(&path) else {
        return Vec::new();
    };
    let Some(h) = log.header() else {
        return Vec::new();
    };
    let meta = LogMeta {
        run_id: h.run_id.clone(),
        dir: run_dir.to_path_buf(),
        started_at: h.started_at.clone(),
        gpu: h.device.name.clone(),
        fake: h.device.fake,
        kernel_sources_hash: h.kernel_sources_hash.clone(),
    };
    history_of(&meta, &log)
}

/// One attempt by its id, its whole patch read from the run folder (else the log's, which may be cut).
pub fn find_attempt(runs_dir: &Path, id: &str) -> Option<HistoryEntry> {
    let (run, step, candidate) = parse_attempt_id(id)?;
    let wanted = attempt_id(&run, step, candidate);
    let (meta, log) = logs_where(runs_dir, |_| true)
        .into_iter()
        .find(|(m, _)| m.run_id == run)?;
    let mut entry = history_of(&meta, &log)
        .into_iter()
        .find(|e| e.attempt == wanted)?;
    if let Some(whole) = entry
        .patch_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        entry.patch = Some(whole);
    }
    Some(entry)
}

/// ptxas's figures for one build tag, the largest over its kernels and builds.
#[derive(Clone, Copy, Default)]
struct Resources {
    registers: u64,
    spill_bytes: u64,
    static_smem_bytes: u64,
}

impl Resources {
    fn take(&mut self, entries: &[crate::gpu::ptxas::EntryResources]) {
        for e in entries {
            self.registers = self.registers.max(u64::from(e.registers));
            self.spill_bytes = self.spill_bytes.max(e.spill_bytes());
            self.static_smem_bytes = self.static_smem_bytes.max(u64::from(e.static_smem_bytes));
        }
    }
}

fn history_of(meta: &LogMeta, log: &SealedLog) -> Vec<HistoryEntry> {
    let mut fold = AttemptFold {
        meta,
        entries: BTreeMap::new(),
        base: BTreeMap::new(),
        in_place_seconds: BTreeMap::new(),
        head: Resources::default(),
        resources: BTreeMap::new(),
        in_place_step: 0,
        agent_step: 0,
    };
    for (line, e) in &log.entries {
        fold.apply(*line, e);
    }
    let AttemptFold {
        entries, resources, ..
    } = fold;
    let mut out: Vec<HistoryEntry> = entries.into_values().collect();
    for e in &mut out {
        let file = attempt_patch_path(&meta.dir, e.step, e.candidate);
        e.patch_file = file.is_file().then_some(file);
        e.metrics = metrics_moved(e, resources.get(&(e.step, e.candidate)).copied());
    }
    out
}

/// The attempts of one log, folded record by record.
struct AttemptFold<'a> {
    meta: &'a LogMeta,
    /// Keyed by (step, candidate); an in-place step is candidate None.
    entries: BTreeMap<(u32, Option<u32>), HistoryEntry>,
    /// Each step's base commit.
    base: BTreeMap<u32, String>,
    in_place_seconds: BTreeMap<u32, f64>,
    /// ptxas's figures: HEAD's side as last built, and each attempt's edit.
    head: Resources,
    resources: BTreeMap<(u32, Option<u32>), (Resources, Resources)>,
    in_place_step: u32,
    agent_step: u32,
}

impl AttemptFold<'_> {
    fn apply(&mut self, line: usize, e: &Entry) {
        match &e.record {
            Record::ProposerRan { step, seconds, .. } => {
                self.in_place_seconds.insert(*step, *seconds);
            }
            Record::Built { .. } => self.built(e),
            Record::CandidateStarted { .. } => self.candidate_started(e),
            Record::StepStarted { .. } => self.step_started(e),
            Record::CandidateProposed { .. } => self.candidate_proposed(e),
            Record::Duel { .. } => self.duel(line, e),
            Record::CandidateJudged { .. } => self.candidate_judged(line, e),
            Record::CandidateDropped { .. } => self.candidate_dropped(e),
            Record::StepDecided { .. } => self.step_decided(line, e),
            _ => {}
        }
    }

    fn built(&mut self, e: &Entry) {
        let Record::Built { entries, role, .. } = &e.record else {
            unreachable!("apply dispatches by kind")
        };
        let key = match *role {
            None => return,
            Some(BuildRole::Head) => {
                self.head.take(entries);
                return;
            }
            Some(BuildRole::Edit) => (self.in_place_step, None),
            Some(BuildRole::Candidate(k)) => (self.agent_step, Some(k)),
        };
        let r = self
            .resources
            .entry(key)
            .or_insert((self.head, Resources::default()));
        r.1.take(entries);
    }

    fn candidate_started(&mut self, e: &Entry) {
        let Record::CandidateStarted {
            step,
            candidate,
            base_commit,
            start_from,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        let meta = self.meta;

        self.agent_step = *step;
        self.base.insert(*step, base_commit.clone());
        let mut entry = blank(meta, *step, Some(*candidate), base_commit);
        entry.start_from = start_from.clone();
        self.entries.insert((*step, Some(*candidate)), entry);
    }

    fn step_started(&mut self, e: &Entry) {
        let Record::StepStarted {
            step,
            base_commit,
            changed_files,
            diff_stat,
            patch,
            idea,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        let meta = self.meta;

        self.in_place_step = *step;
        self.base.insert(*step, base_commit.clone());
        let mut entry = blank(meta, *step, None, base_commit);
        entry.files = changed_files.clone();
        entry.diff_stat = diff_stat.clone();
        entry.patch = patch.clone().filter(|p| !p.is_empty());
        entry.idea = idea.clone();
        entry.cost.agent_seconds = self.in_place_seconds.get(step).copied();
        self.entries.insert((*step, None), entry);
    }

    fn candidate_proposed(&mut self, e: &Entry) {
        let Record::CandidateProposed {
            step,
            candidate,
            seconds,
            changed_files,
            outside_scope,
            diff_stat,
            patch,
            usage,
            idea,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        let meta = self.meta;

        let b = self.base.get(step).cloned().unwrap_or_default();
        let entry = self
            .entries
            .entry((*step, Some(*candidate)))
            .or_insert_with(|| blank(meta, *step, Some(*candidate), &b));
        entry.files = changed_files.iter().chain(outside_scope).cloned().collect();
        entry.diff_stat = Some(diff_stat.clone());
        entry.patch = (!patch.is_empty()).then(|| patch.clone());
        entry.idea = idea.clone();
        entry.cost.agent_seconds = Some(*seconds);
        if let Some(u) = usage {
            entry.cost.input_tokens = Some(u.input_tokens + u.cached_input_tokens);
            entry.cost.output_tokens = Some(u.output_tokens);
            entry.cost.usd = u.usd;
        }
    }

    fn duel(&mut self, line: usize, e: &Entry) {
        let Record::Duel {
            step,
            shape,
            dtype,
            champion,
            challenger,
            verdict,
            failure,
            candidate,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        if let Some(entry) = self.entries.get_mut(&(*step, *candidate)) {
            entry.cases.push(DuelFigure {
                line,
                shape: shape.clone(),
                dtype: *dtype,
                champion_us: champion.as_ref().map(|t| t.median_us),
                challenger_us: challenger.as_ref().map(|t| t.median_us),
                gain: verdict.as_ref().map(|v| v.gain),
                noise: verdict.as_ref().map(|v| v.noise),
                failure: failure.clone(),
            });
        }
    }

    fn candidate_judged(&mut self, line: usize, e: &Entry) {
        let Record::CandidateJudged {
            step,
            candidate,
            accepted,
            reason,
            geomean_gain,
            gpu_seconds,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        if let Some(entry) = self.entries.get_mut(&(*step, Some(*candidate))) {
            entry.verdict = crate::model::vocab::AttemptVerdict::judged(*accepted);
            entry.reason = reason.clone();
            entry.geomean_gain = *geomean_gain;
            entry.verdict_line = Some(line);
            entry.cost.gpu_seconds = Some(*gpu_seconds);
        }
    }

    fn candidate_dropped(&mut self, e: &Entry) {
        let Record::CandidateDropped {
            step,
            candidate,
            reason,
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        if let Some(entry) = self.entries.get_mut(&(*step, Some(*candidate))) {
            entry.verdict = crate::model::vocab::AttemptVerdict::Dropped;
            entry.reason = reason.clone();
        }
    }

    fn step_decided(&mut self, line: usize, e: &Entry) {
        let Record::StepDecided {
            step,
            accepted,
            reason,
            geomean_gain,
            commit,
            candidate,
            scratch_ref,
            ..
        } = &e.record
        else {
            unreachable!("apply dispatches by kind")
        };
        if let Some(entry) = self.entries.get_mut(&(*step, None)) {
            entry.verdict = match *accepted {
                true => crate::model::vocab::AttemptVerdict::Committed,
                false => crate::model::vocab::AttemptVerdict::Rejected,
            };
            entry.reason = reason.clone();
            entry.geomean_gain = *geomean_gain;
            entry.verdict_line = Some(line);
            entry.commit = commit.clone();
            entry.scratch_ref = scratch_ref.clone();
        }
        if let (Some(k), true) = (candidate, *accepted) {
            if let Some(entry) = self.entries.get_mut(&(*step, Some(*k))) {
                entry.verdict = crate::model::vocab::AttemptVerdict::Committed;
                entry.commit = commit.clone();
                entry.scratch_ref = scratch_ref.clone();
            }
        }
    }
}

/// An attempt as its first record shows it, before the log says more.
fn blank(meta: &LogMeta, step: u32, candidate: Option<u32>, base: &str) -> HistoryEntry {
    HistoryEntry {
        attempt: attempt_id(&meta.run_id, step, candidate),
        run_id: meta.run_id.clone(),
        started_at: meta.started_at.clone(),
        step,
        candidate,
        base_commit: base.to_owned(),
        files: Vec::new(),
        diff_stat: None,
        patch: None,
        patch_file: None,
        idea: None,
        start_from: None,
        verdict: crate::model::vocab::AttemptVerdict::Unfinished,
        reason: "the log ends before a verdict".into(),
        geomean_gain: None,
        verdict_line: None,
        commit: None,
        scratch_ref: None,
        cases: Vec::new(),
        metrics: None,
        cost: Cost::default(),
        gpu: meta.gpu.clone(),
        synthetic: meta.fake,
    }
}

/// How an attempt moved the metrics; none for an attempt that was never built or timed.
fn metrics_moved(e: &HistoryEntry, built: Option<(Resources, Resources)>) -> Option<MetricsMoved> {
    if e.cases.is_empty() && built.is_none() {
        return None;
    }
    let gains: Vec<f64> = e.cases.iter().filter_map(|c| c.gain).collect();
    let pair = |f: fn(&Resources) -> u64| built.map(|(h, x)| [f(&h), f(&x)]);
    let mut m = MetricsMoved {
        cases_timed: gains.len(),
        cases_failed: e.cases.iter().filter(|c| c.failure.is_some()).count(),
        worst_case_gain: gains.iter().copied().reduce(f64::min),
        best_case_gain: gains.iter().copied().reduce(f64::max),
        registers: pair(|r| r.registers),
        spill_bytes: pair(|r| r.spill_bytes),
        static_smem_bytes: pair(|r| r.static_smem_bytes),
        summary: String::new(),
    };
    let mut parts = Vec::new();
    match (e.geomean_gain, m.worst_case_gain, m.best_case_gain) {
        (Some(g), Some(lo), Some(hi)) => parts.push(format!(
            "geomean {:+.1}% (cases {:+.1}%..{:+.1}%)",
            g * 100.0,
            lo * 100.0,
            hi * 100.0
        )),
        (None, Some(lo), Some(hi)) => {
            parts.push(format!("cases {:+.1}%..{:+.1}%", lo * 100.0, hi * 100.0))
        }
        _ => {}
    }
    if m.cases_failed > 0 {
        parts.push(format!("{} case(s) failed", m.cases_failed));
    }
    for (name, v) in [
        ("registers", m.registers),
        ("spill B", m.spill_bytes),
        ("static smem B", m.static_smem_bytes),
    ] {
        if let Some([h, x]) = v {
            if h != x {
                parts.push(format!("{name} {h}→{x}"));
            }
        }
    }
    m.summary = if parts.is_empty() {
        "built; nothing timed".into()
    } else {
        parts.join("; ")
    };
    Some(m)
}
