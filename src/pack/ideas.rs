//! The memory of ideas, derived from every earlier attempt: what was tried and failed (avoid), what
//! came close (worth another try), and the near-miss archive a later candidate may start from.
use super::history::HistoryEntry;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Attempts listed as worth another try.
pub(super) const RETRY_MAX: usize = 6;
/// Attempts listed to avoid.
const AVOID_MAX: usize = 12;

/// One earlier attempt, as the pack's lists show it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IdeaNote {
    pub attempt: String,
    /// What it tried, in one line (none where the log holds no summary): the words of whoever
    /// wrote it (`idea_from`), shown to later agents only quoted as theirs.
    pub idea: Option<String>,
    /// Who wrote `idea`: `agent`, `commit message`, `caller` or `diff`.
    pub idea_from: Option<String>,
    pub verdict: crate::model::vocab::AttemptVerdict,
    /// Why it was turned away (first line).
    pub reason: String,
    pub geomean_gain: Option<f64>,
    /// The run and log line of the verdict (`run <id> line <n>`), where the log holds one.
    pub from: Option<String>,
    /// How the key metrics moved, in one line.
    pub metrics: Option<String>,
    /// The whole patch as its run folder keeps it; the pack copies it to `context/attempts/`.
    pub patch_file: Option<PathBuf>,
    pub synthetic: bool,
}

impl IdeaNote {
    pub fn of(h: &HistoryEntry) -> IdeaNote {
        IdeaNote {
            attempt: h.attempt.clone(),
            idea: h.idea.as_ref().map(|i| i.summary.clone()),
            idea_from: h.idea.as_ref().map(|i| i.from.clone()),
            verdict: h.verdict,
            reason: h.reason.lines().next().unwrap_or("").to_owned(),
            geomean_gain: h.geomean_gain,
            from: h
                .verdict_line
                .map(|line| format!("run {} line {line}", h.run_id)),
            metrics: h.metrics.as_ref().map(|m| m.summary.clone()),
            patch_file: h.patch_file.clone(),
            synthetic: h.synthetic,
        }
    }

    /// Where the pack puts this attempt's patch, relative to the work directory.
    pub fn pack_patch(&self) -> String {
        format!(
            "context/attempts/{}.patch",
            self.attempt.replace(['/', '\\'], "_")
        )
    }
}

/// A near miss: correct on every case it was timed on, and either beat HEAD but lost to another
/// candidate, or fell short of HEAD by less than the threshold. Committed attempts are HEAD's already.
pub fn is_near_miss(h: &HistoryEntry, threshold: f64) -> bool {
    if h.files.is_empty() || h.verdict == crate::model::vocab::AttemptVerdict::Committed {
        return false;
    }
    let correct = !h.cases.is_empty() && h.cases.iter().all(|c| c.failure.is_none());
    correct
        && (h.verdict == crate::model::vocab::AttemptVerdict::Accepted
            || (h.verdict == crate::model::vocab::AttemptVerdict::Rejected
                && h.geomean_gain.is_some_and(|g| g > -threshold)))
}

/// The near-miss archive, best first: across every session and step on this GPU (`gpu`, where known).
pub fn near_misses<'a>(
    history: &'a [HistoryEntry],
    threshold: f64,
    gpu: Option<&str>,
) -> Vec<&'a HistoryEntry> {
    let mut out: Vec<&HistoryEntry> = history
        .iter()
        .filter(|h| gpu.is_none_or(|g| g == h.gpu) && is_near_miss(h, threshold))
        .collect();
    out.sort_by(|a, b| {
        b.geomean_gain
            .unwrap_or(f64::MIN)
            .total_cmp(&a.geomean_gain.unwrap_or(f64::MIN))
    });
    out
}

/// Rejected edits that were not close, newest first: ideas not to repeat without a new reason.
pub(super) fn to_avoid(
    history: &[HistoryEntry],
    threshold: f64,
    gpu: Option<&str>,
) -> Vec<IdeaNote> {
    history
        .iter()
        .rev()
        .filter(|h| {
            // A refusal before any GPU work (outside the scope) holds for every GPU.
            (h.cases.is_empty() || gpu.is_none_or(|g| g == h.gpu))
                && h.verdict == crate::model::vocab::AttemptVerdict::Rejected
                && !h.files.is_empty()
                && !is_near_miss(h, threshold)
        })
        .take(AVOID_MAX)
        .map(IdeaNote::of)
        .collect()
}
