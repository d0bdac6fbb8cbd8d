//! What a step says: its Markdown section and the commit message of an accepted edit.
use super::tree::short;
use super::Session;
use crate::gpu::decide::{self, Verdict};
use crate::model::config::Dtype;
use crate::model::protocol::DeviceInfo;
use std::fmt::Write as _;

impl Session<'_> {
    pub(crate) fn commit_message(
        &self,
        n: u32,
        files: &[String],
        overall: &decide::Overall,
        duels: &[DuelRow],
    ) -> String {
        let names: Vec<&str> = files
            .iter()
            .map(|f| f.rsplit('/').next().unwrap_or(f))
            .collect();
        let mut m = format!(
            "flashtune step{}: {} {:+.1}% geomean over {} cases\n\n",
            if self.device.fake { " (synthetic)" } else { "" },
            names.join(", "),
            overall.geomean_gain * 100.0,
            duels.len()
        );
        for d in duels {
            if let (Some(a), Some(b), Some(v)) = (d.champion_us, d.challenger_us, &d.verdict) {
                let _ = writeln!(
                    m,
                    "{} {} ({}): {a:.2} -> {b:.2} µs ({:+.1}%, noise {:.1}%)",
                    d.shape,
                    d.dtype,
                    d.variant,
                    v.gain * 100.0,
                    v.noise * 100.0
                );
            }
        }
        let _ = write!(
            m,
            "\nFlashtune-Step: {}/{n}\nFlashtune-Speedup: {:.3}x geomean vs HEAD's champion, interleaved re-timing\nFlashtune-GPU: {}\n",
            self.run_id,
            1.0 + overall.geomean_gain,
            self.device.name,
        );
        if self.device.fake {
            let _ = writeln!(
                m,
                "Flashtune-Synthetic: fake GPU figures, nothing measured; committed to {} only",
                super::scratch_ref(self.run_id, n)
            );
        }
        m
    }
}

/// A duel as the step report shows it.
#[derive(Debug, Clone)]
pub(crate) struct DuelRow {
    pub(crate) shape: String,
    pub(crate) dtype: Dtype,
    pub(crate) variant: String,
    pub(crate) champion_us: Option<f64>,
    pub(crate) challenger_us: Option<f64>,
    pub(crate) verdict: Option<Verdict>,
    pub(crate) failure: Option<String>,
}

/// How a step ended.
pub(crate) struct Outcome {
    pub(crate) accepted: bool,
    pub(crate) reason: String,
    pub(crate) geomean_gain: Option<f64>,
    pub(crate) commit: Option<String>,
    /// Files put back as HEAD has them.
    pub(crate) restored: Vec<String>,
    /// On the fake GPU: the scratch reference the accepted edit was committed to.
    pub(crate) scratch_ref: Option<String>,
}

impl Outcome {
    pub(crate) fn rejected(
        reason: String,
        geomean_gain: Option<f64>,
        restored: Vec<String>,
    ) -> Self {
        Outcome {
            accepted: false,
            reason,
            geomean_gain,
            commit: None,
            restored,
            scratch_ref: None,
        }
    }
}

pub(crate) struct StepSummary<'a> {
    pub(crate) step: u32,
    pub(crate) base: &'a str,
    pub(crate) device: &'a DeviceInfo,
    pub(crate) files: &'a [String],
    pub(crate) outcome: &'a Outcome,
    pub(crate) duels: &'a [DuelRow],
}

/// The step's Markdown section: outcome first, then one row per (shape, dtype).
pub(crate) fn step_markdown(s: &StepSummary) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "## Step {} — {}\n",
        s.step,
        if s.outcome.accepted {
            "accepted"
        } else {
            "rejected"
        }
    );
    let _ = writeln!(m, "- base: `{}`", short(s.base));
    let _ = writeln!(
        m,
        "- GPU: {}{}",
        s.device.name,
        if s.device.fake {
            " — synthetic figures, nothing here was measured"
        } else {
            ""
        }
    );
    if !s.files.is_empty() {
        let _ = writeln!(m, "- edit: {}", s.files.join(", "));
    }
    let _ = writeln!(m, "- why: {}", s.outcome.reason);
    if let Some(g) = s.outcome.geomean_gain {
        let _ = writeln!(m, "- geomean gain: {:+.2}%", g * 100.0);
    }
    match (&s.outcome.commit, &s.outcome.scratch_ref) {
        (Some(c), Some(r)) => {
            let _ = writeln!(
                m,
                "- committed to `{r}` as `{}`, not to your branch: synthetic figures are never committed there (the working tree is back at HEAD)",
                short(c)
            );
        }
        (Some(c), None) => {
            let _ = writeln!(m, "- committed: `{}`", short(c));
        }
        (None, _) if !s.outcome.restored.is_empty() => {
            let _ = writeln!(m, "- restored to HEAD: {}", s.outcome.restored.join(", "));
        }
        (None, _) => {}
    }
    if !s.duels.is_empty() {
        let _ = writeln!(
            m,
            "\n| shape | dtype | champion | HEAD µs | edit µs | gain | noise | verdict |"
        );
        let _ = writeln!(m, "|---|---|---|---:|---:|---:|---:|---|");
        let us = |x: Option<f64>| x.map_or("—".into(), |x| format!("{x:.2}"));
        for d in s.duels {
            let (gain, noise) = d.verdict.as_ref().map_or(("—".into(), "—".into()), |v| {
                (
                    format!("{:+.1}%", v.gain * 100.0),
                    format!("{:.1}%", v.noise * 100.0),
                )
            });
            let verdict = match (&d.verdict, &d.failure) {
                (_, Some(f)) => format!("**{f}**"),
                (Some(v), None) => v.reason.clone(),
                (None, None) => String::new(),
            };
            let _ = writeln!(
                m,
                "| {} | {} | `{}` | {} | {} | {gain} | {noise} | {verdict} |",
                d.shape,
                d.dtype,
                d.variant,
                us(d.champion_us),
                us(d.challenger_us)
            );
        }
    }
    m
}
