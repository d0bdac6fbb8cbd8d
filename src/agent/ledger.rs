//! The cost ledger of an agent session, read from its log: one row per candidate, the step reports and the morning summary.
use super::round::Decided;
use super::{Judged, Proposal};
use crate::log::runlog::Record;
use crate::{pack, step};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// `ledger.json`: the session's candidates and what each cost.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LedgerDoc {
    pub schema_version: u32,
    pub run_id: String,
    pub gpu: String,
    /// True on the fake GPU: every figure is synthetic, and accepted edits went to scratch
    /// references (`refs/flashtune/fake/<run>/step-<n>`), never to a branch.
    pub synthetic: bool,
    pub rows: Vec<LedgerRow>,
}

/// One candidate's line in the ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LedgerRow {
    pub step: u32,
    pub candidate: u32,
    /// Its attempt id (`flashtune show-attempt` gives its patch back).
    pub attempt: String,
    /// What it tried, in one line.
    pub idea: Option<String>,
    /// The near miss its work directory started from.
    pub start_from: Option<String>,
    pub verdict: crate::model::vocab::AttemptVerdict,
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

/// Every candidate of an agent session, from its log.
pub(super) struct Ledger {
    pub(super) run_id: String,
    pub(super) gpu: String,
    pub(super) synthetic: bool,
    pub(super) rows: Vec<LedgerRow>,
    /// Per decided step: committed, with its gain.
    pub(super) steps: Vec<(u32, bool, Option<f64>)>,
}

impl Ledger {
    pub(super) fn of(log: &crate::log::runlog::LoadedLog) -> Ledger {
        let mut rows: BTreeMap<(u32, u32), LedgerRow> = BTreeMap::new();
        let mut steps = Vec::new();
        let header = log.header();
        let run_id = header.map_or(String::new(), |h| h.run_id.clone());
        for (_, e) in &log.entries {
            match &e.record {
                Record::CandidateStarted {
                    step,
                    candidate,
                    start_from,
                    ..
                } => {
                    rows.insert(
                        (*step, *candidate),
                        LedgerRow {
                            step: *step,
                            candidate: *candidate,
                            attempt: pack::attempt_id(&run_id, *step, Some(*candidate)),
                            idea: None,
                            start_from: start_from.clone(),
                            verdict: crate::model::vocab::AttemptVerdict::Unfinished,
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
                    idea,
                    ..
                } => {
                    if let Some(r) = rows.get_mut(&(*step, *candidate)) {
                        r.idea = idea.as_ref().map(|i| i.summary.clone());
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
                        r.verdict = crate::model::vocab::AttemptVerdict::judged(*accepted);
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
                        r.verdict = crate::model::vocab::AttemptVerdict::Dropped;
                        r.reason = reason.clone();
                    }
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
                            r.verdict = crate::model::vocab::AttemptVerdict::Committed;
                        }
                    }
                }
                _ => {}
            }
        }
        Ledger {
            gpu: header.map_or(String::new(), |h| h.device.name.clone()),
            synthetic: header.is_some_and(|h| h.device.fake),
            run_id,
            rows: rows.into_values().collect(),
            steps,
        }
    }

    /// `ledger.json`'s document.
    pub(super) fn document(&self) -> LedgerDoc {
        LedgerDoc {
            schema_version: pack::JSON_SCHEMA_VERSION,
            run_id: self.run_id.clone(),
            gpu: self.gpu.clone(),
            synthetic: self.synthetic,
            rows: self.rows.clone(),
        }
    }

    pub(super) fn steps(&self) -> u32 {
        self.steps.len() as u32
    }

    pub(super) fn committed(&self) -> u32 {
        self.steps.iter().filter(|s| s.1).count() as u32
    }

    /// Dollars the agents reported (or the price table gave); unknown dollars count as none.
    pub(super) fn known_usd(&self) -> f64 {
        // Starts at +0: an empty f64 sum is -0, which prints as "-0.000".
        self.rows
            .iter()
            .filter_map(|r| r.usd)
            .fold(0.0, |a, b| a + b)
    }

    pub(super) fn unknown_usd(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.usd.is_none() && r.agent_seconds.is_some())
            .count()
    }

    pub(super) fn steps_since_commit(&self) -> u32 {
        self.steps.iter().rev().take_while(|s| !s.1).count() as u32
    }

    /// Speedup kept: the product of the committed steps' geomean gains, minus one.
    pub(super) fn speedup_kept(&self) -> f64 {
        self.steps
            .iter()
            .filter(|s| s.1)
            .map(|s| 1.0 + s.2.unwrap_or(0.0))
            .product::<f64>()
            - 1.0
    }

    /// The morning summary: what was tried, what was kept, what it cost.
    pub(super) fn summary_markdown(&self, stopped: Option<&str>) -> String {
        let mut m = String::from("## Summary\n\n");
        if self.synthetic {
            let _ = writeln!(
                m,
                "**Synthetic: the fake GPU measured nothing.** Accepted edits were committed to \
                 `refs/flashtune/fake/{}/step-<n>` only, never to a branch.\n",
                self.run_id
            );
        }
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
pub(super) fn step_markdown(
    n: u32,
    base: &str,
    device: &crate::model::protocol::DeviceInfo,
    judged: &[Judged],
    proposals: &[Proposal],
    decided: &Decided,
    ledger: &Ledger,
) -> String {
    let (accepted, reason) = (decided.accepted, &decided.reason);
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
    if let (Some(c), Some(r)) = (&decided.commit, &decided.scratch_ref) {
        let _ = writeln!(
            m,
            "- committed to `{r}` as `{}`, not to your branch: synthetic figures are never committed there",
            step::short(c)
        );
    } else if let Some(c) = &decided.commit {
        let _ = writeln!(m, "- committed: `{}`", step::short(c));
    }
    let _ = writeln!(
        m,
        "\n| cand. | idea | files | verdict | gain | agent s | GPU s | tokens in/out | $ | reason |"
    );
    let _ = writeln!(m, "|---:|---|---|---|---:|---:|---:|---:|---:|---|");
    for p in proposals {
        let row = ledger
            .rows
            .iter()
            .find(|r| r.step == n && r.candidate == p.candidate);
        let j = judged.iter().find(|j| j.candidate == p.candidate);
        let _ = writeln!(
            m,
            "| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.candidate,
            row.and_then(|r| r.idea.clone())
                .unwrap_or_else(|| "—".into())
                .replace('|', "/"),
            row.and_then(|r| r.start_from.as_ref())
                .map_or(String::new(), |s| format!(" (from near miss `{s}`)")),
            row.and_then(|r| r.diff_stat.clone()).unwrap_or_default(),
            row.map_or("—".into(), |r| r.verdict.to_string()),
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
