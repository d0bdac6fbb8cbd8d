//! The report's Drift sentinel section.
use crate::log::runindex::RunIndex;
use std::fmt::Write;

/// The drift sentinel over the run: each GPU's spread, whether it passed the policy's limit, and
/// the champions re-timed because their decision spanned the drift.
pub(super) fn drift(ix: &RunIndex) -> String {
    let traces = crate::report::findings::sentinel_traces(ix);
    if traces.is_empty() && ix.drift_duels.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Drift sentinel\n\n");
    for tr in &traces {
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
        let _ = writeln!(md, "GPU {}: {}.", tr.device, spread.join("; "));
        match (tr.first_beyond, tr.worst) {
            (Some((gap, t, line)), Some((worst, _, worst_line))) => {
                let _ = writeln!(
                    md,
                    "**Drifted beyond the limit**: {:.1}% from the first sentinel at {t:.0} s (log line {line}), at most {:.1}% (log line {worst_line}); the policy's limit is {:.1}% (`[sentinel] max_drift`). Figures timed on either side of it are not comparable as they stand.",
                    100.0 * gap,
                    100.0 * worst,
                    100.0 * tr.max_drift
                );
            }
            (None, Some((worst, _, line))) => {
                let _ = writeln!(
                    md,
                    "Within the limit: at most {:.1}% from the first sentinel (log line {line}); the policy's limit is {:.1}%.",
                    100.0 * worst,
                    100.0 * tr.max_drift
                );
            }
            _ => {}
        }
        for (line, why) in &tr.failed {
            let _ = writeln!(
                md,
                "A sentinel could not be timed (log line {line}): {why}."
            );
        }
        md.push('\n');
    }
    if !ix.drift_duels.is_empty() {
        let across = ix.drift_duels.iter().any(|d| d.placed.is_some());
        md.push_str(if across {
            "Champions whose case and runner-up's were timed on either side of a drift, or on different GPUs of a cluster, re-timed against each other interleaved on one GPU at the end of the run:\n\n"
        } else {
            "Champions whose case and runner-up's were timed on either side of a drift, re-timed against each other interleaved at the end of the run:\n\n"
        });
        md.push_str("| shape | dtype | champion by its figure | runner-up | sentinel apart | champion µs | runner-up µs | verdict | log line |\n|---|---|---|---|---:|---:|---:|---|---:|\n");
        for d in &ix.drift_duels {
            let us = |x: Option<f64>| x.map_or("—".into(), |v| format!("{v:.1}"));
            let verdict = match (d.verdict, d.failure) {
                (_, Some(why)) => format!("not judged: {}", why.replace('|', "/")),
                (Some(v), None) if v.accept => format!("`{}` is faster: {}", d.runner_up, v.reason),
                (Some(v), None) if v.gain < 0.0 && -v.gain > v.noise => {
                    format!("`{}` holds: {}", d.champion, v.reason)
                }
                (Some(v), None) => format!("tied: {}", v.reason),
                (None, None) => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | `{}` | `{}` | {:.1}%{} | {} | {} | {verdict} | {} |",
                d.shape,
                d.dtype,
                d.champion,
                d.runner_up,
                100.0 * d.drift,
                d.placed
                    .map_or(String::new(), |(a, b)| format!(" (timed on {a} / {b})")),
                us(d.champion_us),
                us(d.runner_up_us),
                d.line
            );
        }
    }
    md
}
