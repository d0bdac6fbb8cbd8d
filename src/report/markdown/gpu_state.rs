//! The report's GPU state section: what NVML read while cases were timed.
use crate::log::runindex::{Outcome, RunIndex};
use std::fmt::Write;

/// "thermal throttling and another process on the GPU".
pub(super) fn conditions_text(conditions: &[crate::model::protocol::Condition]) -> String {
    conditions
        .iter()
        .map(|c| c.describe())
        .collect::<Vec<_>>()
        .join(" and ")
}

/// What the GPU was doing while cases were timed: the ranges NVML read, the timings taken again
/// because the GPU was throttled or shared, the figures that stayed so; or that it could not be read.
pub(super) fn gpu_state(ix: &RunIndex) -> String {
    let states = crate::report::findings::gpu_states(ix);
    if states.is_empty() && ix.disturbed.is_empty() && ix.state_unavailable.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## GPU state\n\n");
    for (line, device, why) in &ix.state_unavailable {
        let _ = writeln!(
            md,
            "GPU {device}: its state could not be read (log line {line}): {why}. Timings carry no clocks or temperature and none was timed again for them.\n"
        );
    }
    let range = |xs: Vec<f64>, unit: &str, digits: usize| -> Option<String> {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo.is_finite() && hi.is_finite()).then(|| format!("{lo:.digits$}–{hi:.digits$} {unit}"))
    };
    let figures: Vec<String> = [
        (
            "SM clock",
            range(
                states
                    .iter()
                    .filter_map(|s| s.sm_clock_mhz)
                    .map(f64::from)
                    .collect(),
                "MHz",
                0,
            ),
        ),
        (
            "memory clock",
            range(
                states
                    .iter()
                    .filter_map(|s| s.mem_clock_mhz)
                    .map(f64::from)
                    .collect(),
                "MHz",
                0,
            ),
        ),
        (
            "temperature",
            range(
                states
                    .iter()
                    .filter_map(|s| s.temperature_c)
                    .map(f64::from)
                    .collect(),
                "°C",
                0,
            ),
        ),
        (
            "power",
            range(states.iter().filter_map(|s| s.power_w).collect(), "W", 0),
        ),
    ]
    .into_iter()
    .filter_map(|(name, r)| Some(format!("{name} {}", r?)))
    .collect();
    if !figures.is_empty() {
        let _ = writeln!(
            md,
            "Read right after each case's timed replays and each sentinel ({} readings): {}.\n",
            states.len(),
            figures.join(", ")
        );
    }
    if !ix.disturbed.is_empty() {
        let _ = writeln!(
            md,
            "{} timing(s) taken on a throttled or shared GPU were taken again in the same worker:\n",
            ix.disturbed.len()
        );
        md.push_str("| variant | shape | dtype | first timing µs | under | again |\n|---|---|---|---:|---|---|\n");
        for d in &ix.disturbed {
            let again = match ix.case(d.variant, d.shape, d.dtype).map(|c| &c.outcome) {
                Some(Outcome::Measured {
                    timing,
                    conditions,
                    line,
                    ..
                }) if conditions.is_empty() => {
                    format!("{:.1} µs, clean (log line {line})", timing.median_us)
                }
                Some(Outcome::Measured {
                    timing,
                    conditions,
                    line,
                    ..
                }) => format!(
                    "{:.1} µs, **still under {}** (log line {line}): flagged",
                    timing.median_us,
                    conditions_text(conditions)
                ),
                Some(o) => o.status().replace('_', " "),
                None => "—".into(),
            };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {:.1} | {} (log line {}) | {again} |",
                d.variant,
                d.shape,
                d.dtype,
                d.timing.median_us,
                conditions_text(d.conditions),
                d.line
            );
        }
    }
    md
}
