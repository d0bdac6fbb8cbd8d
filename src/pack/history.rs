//! The step history: every in-place step and agent candidate that any run log of the project holds.
use super::*;

/// One earlier attempt at an edit: an in-place step, or one candidate of an agent session's step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntry {
    pub run_id: String,
    pub started_at: String,
    pub step: u32,
    /// The candidate within its step (absent for an in-place `flashtune step`).
    pub candidate: Option<u32>,
    pub base_commit: String,
    pub files: Vec<String>,
    /// `N files, +A -D`, where the log holds the diff.
    pub diff_stat: Option<String>,
    /// The diff of the edit scope (bounded), for the latest entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `committed`, `accepted` (beat HEAD but another candidate was better), `rejected`,
    /// `dropped` (never judged), or `unfinished` (the log ends before a verdict).
    pub verdict: String,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    pub commit: Option<String>,
    pub figures: Vec<DuelFigure>,
    pub cost: Cost,
    pub gpu: String,
    pub fake_gpu: bool,
}

/// One case of a duel, as the log holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DuelFigure {
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

/// A run log the history reads: its id, when it started, on which GPU.
pub(super) struct LogMeta {
    pub(super) run_id: String,
    pub(super) started_at: String,
    pub(super) gpu: String,
    pub(super) fake: bool,
    pub(super) kernel_sources_hash: String,
}

/// Every run log under `runs_dir` with step records, oldest first (by run id, which starts with the time).
pub(super) fn step_logs(runs_dir: &Path) -> Vec<(LogMeta, runlog::LoadedLog)> {
    logs_where(runs_dir, |text| {
        text.contains("\"event\":\"step_started\"")
            || text.contains("\"event\":\"candidate_started\"")
    })
}

pub(super) fn logs_where(
    runs_dir: &Path,
    wanted: impl Fn(&str) -> bool,
) -> Vec<(LogMeta, runlog::LoadedLog)> {
    let Ok(dirs) = std::fs::read_dir(runs_dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = dirs
        .filter_map(|e| e.ok().map(|e| e.path().join("log.jsonl")))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        // A cheap look before parsing: most logs of a project are tune runs without steps.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if !wanted(&text) {
            continue;
        }
        let Ok(log) = runlog::read(&path) else {
            continue;
        };
        let Some(h) = log.header() else { continue };
        let meta = LogMeta {
            run_id: h.run_id.clone(),
            started_at: h.started_at.clone(),
            gpu: h.device.name.clone(),
            fake: h.device.fake,
            kernel_sources_hash: h.kernel_sources_hash.clone(),
        };
        out.push((meta, log));
    }
    out
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

pub(super) fn history_of(meta: &LogMeta, log: &runlog::LoadedLog) -> Vec<HistoryEntry> {
    // Keyed by (step, candidate); an in-place step is candidate None.
    let mut entries: BTreeMap<(u32, Option<u32>), HistoryEntry> = BTreeMap::new();
    let mut base: BTreeMap<u32, String> = BTreeMap::new();
    let blank = |step: u32, candidate: Option<u32>, base: &str| HistoryEntry {
        run_id: meta.run_id.clone(),
        started_at: meta.started_at.clone(),
        step,
        candidate,
        base_commit: base.to_owned(),
        files: Vec::new(),
        diff_stat: None,
        patch: None,
        verdict: "unfinished".into(),
        reason: "the log ends before a verdict".into(),
        geomean_gain: None,
        commit: None,
        figures: Vec::new(),
        cost: Cost::default(),
        gpu: meta.gpu.clone(),
        fake_gpu: meta.fake,
    };
    let mut in_place_seconds: BTreeMap<u32, f64> = BTreeMap::new();
    for (_, e) in &log.entries {
        match &e.record {
            Record::ProposerRan { step, seconds, .. } => {
                in_place_seconds.insert(*step, *seconds);
            }
            Record::CandidateStarted {
                step,
                candidate,
                base_commit,
                ..
            } => {
                base.insert(*step, base_commit.clone());
                entries.insert(
                    (*step, Some(*candidate)),
                    blank(*step, Some(*candidate), base_commit),
                );
            }
            Record::StepStarted {
                step,
                base_commit,
                changed_files,
            } => {
                base.insert(*step, base_commit.clone());
                let mut entry = blank(*step, None, base_commit);
                entry.files = changed_files.clone();
                entry.cost.agent_seconds = in_place_seconds.get(step).copied();
                entries.insert((*step, None), entry);
            }
            Record::CandidateProposed {
                step,
                candidate,
                seconds,
                changed_files,
                outside_scope,
                diff_stat,
                patch,
                usage,
                ..
            } => {
                let b = base.get(step).cloned().unwrap_or_default();
                let entry = entries
                    .entry((*step, Some(*candidate)))
                    .or_insert_with(|| blank(*step, Some(*candidate), &b));
                entry.files = changed_files.iter().chain(outside_scope).cloned().collect();
                entry.diff_stat = Some(diff_stat.clone());
                entry.patch = (!patch.is_empty()).then(|| patch.clone());
                entry.cost.agent_seconds = Some(*seconds);
                if let Some(u) = usage {
                    entry.cost.input_tokens = Some(u.input_tokens + u.cached_input_tokens);
                    entry.cost.output_tokens = Some(u.output_tokens);
                    entry.cost.usd = u.usd;
                }
            }
            Record::Duel {
                step,
                shape,
                dtype,
                champion,
                challenger,
                verdict,
                failure,
                candidate,
                ..
            } => {
                if let Some(entry) = entries.get_mut(&(*step, *candidate)) {
                    entry.figures.push(DuelFigure {
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
            Record::CandidateJudged {
                step,
                candidate,
                accepted,
                reason,
                geomean_gain,
                gpu_seconds,
            } => {
                if let Some(entry) = entries.get_mut(&(*step, Some(*candidate))) {
                    entry.verdict = if *accepted { "accepted" } else { "rejected" }.into();
                    entry.reason = reason.clone();
                    entry.geomean_gain = *geomean_gain;
                    entry.cost.gpu_seconds = Some(*gpu_seconds);
                }
            }
            Record::CandidateDropped {
                step,
                candidate,
                reason,
            } => {
                if let Some(entry) = entries.get_mut(&(*step, Some(*candidate))) {
                    entry.verdict = "dropped".into();
                    entry.reason = reason.clone();
                }
            }
            Record::StepDecided {
                step,
                accepted,
                reason,
                geomean_gain,
                commit,
                candidate,
                ..
            } => {
                if let Some(entry) = entries.get_mut(&(*step, None)) {
                    entry.verdict = if *accepted { "committed" } else { "rejected" }.into();
                    entry.reason = reason.clone();
                    entry.geomean_gain = *geomean_gain;
                    entry.commit = commit.clone();
                }
                if let (Some(k), true) = (candidate, *accepted) {
                    if let Some(entry) = entries.get_mut(&(*step, Some(*k))) {
                        entry.verdict = "committed".into();
                        entry.commit = commit.clone();
                    }
                }
            }
            _ => {}
        }
    }
    entries.into_values().collect()
}
