//! The report's Drift sentinel section.
use crate::log::runindex::RunIndex;
use crate::report::document::{Block, Section, SectionId, Table, Text};

/// The drift sentinel over the run: each GPU's spread, whether it passed the policy's limit, and
/// the champions re-timed because their decision spanned the drift.
pub(super) fn drift(ix: &RunIndex) -> Section {
    let traces = crate::report::findings::sentinel_traces(ix);
    let mut s = Section::new(SectionId::Drift, Text::from("Drift sentinel"));
    for tr in &traces {
        let mut lines: Vec<Text> = Vec::new();
        let spread: Vec<String> = tr
            .figures
            .iter()
            .map(|(name, first, points)| {
                let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
                let hi = points.iter().map(|p| p.1).fold(0.0, f64::max);
                format!(
                    "{name} {first:.1} µs at first, then {:.3}–{:.3}× of it over {} sentinels (spread {:.1}%)",
                    lo,
                    hi,
                    points.len(),
                    100.0 * (hi / lo - 1.0)
                )
            })
            .collect();
        lines.push(format!("GPU {}: {}.", tr.device, spread.join("; ")).into());
        match (tr.first_beyond, tr.worst) {
            (Some((gap, t, line)), Some((worst, _, worst_line))) => {
                lines.push(
                    Text::new()
                        .strong("Drifted beyond the limit")
                        .plain(format!(
                            ": {:.1}% from the first sentinel at {t:.0} s (log line {line}), at most {:.1}% (log line {worst_line}); the policy's limit is {:.1}% (",
                            100.0 * gap,
                            100.0 * worst,
                            100.0 * tr.max_drift
                        ))
                        .code("[sentinel] max_drift")
                        .plain("). Figures timed on either side of it are not comparable as they stand."),
                );
            }
            (None, Some((worst, _, line))) => {
                lines.push(format!(
                    "Within the limit: at most {:.1}% from the first sentinel (log line {line}); the policy's limit is {:.1}%.",
                    100.0 * worst,
                    100.0 * tr.max_drift
                ).into());
            }
            _ => {}
        }
        for (line, why) in &tr.failed {
            lines.push(format!("A sentinel could not be timed (log line {line}): {why}.").into());
        }
        s.push(Block::Paragraph(lines));
    }
    if !ix.drift_duels.is_empty() {
        let across = ix.drift_duels.iter().any(|d| d.placed.is_some());
        s.push(Block::line(if across {
            "Champions re-timed at the end of the run, interleaved on one GPU, against the leader of each other GPU (a ratio across two chips is not a ratio of kernels) or against a runner-up timed across a drift:"
        } else {
            "Champions whose case and runner-up's were timed on either side of a drift, re-timed against each other interleaved at the end of the run:"
        }));
        let mut t = Table::new()
            .text("shape")
            .text("dtype")
            .text("champion by its figure")
            .text(if across { "rival" } else { "runner-up" })
            .figure("sentinel apart")
            .figure("champion µs")
            .figure(if across { "rival µs" } else { "runner-up µs" })
            .text("verdict")
            .figure("log line");
        for d in &ix.drift_duels {
            let us = |x: Option<f64>| x.map_or("—".into(), |v| format!("{v:.1}"));
            let verdict = match (d.verdict, d.failure) {
                (_, Some(why)) => format!("not judged: {why}").into(),
                (Some(v), None) if v.accept => Text::new()
                    .code(d.runner_up)
                    .plain(format!(" is faster: {}", v.reason)),
                (Some(v), None) if v.gain < 0.0 && -v.gain > v.noise => Text::new()
                    .code(d.champion)
                    .plain(format!(" holds: {}", v.reason)),
                (Some(v), None) => format!("tied: {}", v.reason).into(),
                (None, None) => "—".into(),
            };
            t.row(vec![
                d.shape.to_string().into(),
                d.dtype.to_string().into(),
                Text::new().code(d.champion),
                Text::new().code(d.runner_up),
                format!(
                    "{:.1}%{}",
                    100.0 * d.drift,
                    d.placed
                        .map_or(String::new(), |(a, b)| format!(" (timed on {a} / {b})"))
                )
                .into(),
                us(d.champion_us).into(),
                us(d.runner_up_us).into(),
                verdict,
                d.line.to_string().into(),
            ]);
        }
        s.push(Block::Table(t));
    }
    s
}
