//! The report's GPU state section: what NVML read while cases were timed.
use crate::log::runindex::{Outcome, RunIndex};
use crate::report::document::{Block, Section, SectionId, Table, Text};

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
pub(super) fn gpu_state(ix: &RunIndex) -> Section {
    let states = crate::report::findings::gpu_states(ix);
    let mut s = Section::new(SectionId::GpuState, Text::from("GPU state"));
    for (line, device, why) in &ix.state_unavailable {
        s.push(Block::line(format!(
            "GPU {device}: its state could not be read (log line {line}): {why}. Timings carry no clocks or temperature and none was timed again for them."
        )));
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
        s.push(Block::line(format!(
            "Read right after each case's timed replays and each sentinel ({} readings): {}.",
            states.len(),
            figures.join(", ")
        )));
    }
    if !ix.disturbed.is_empty() {
        s.push(Block::line(format!(
            "{} timing(s) taken on a throttled or shared GPU were taken again in the same worker:",
            ix.disturbed.len()
        )));
        let mut t = Table::new()
            .text("variant")
            .text("shape")
            .text("dtype")
            .figure("first timing µs")
            .text("under")
            .text("again");
        for d in &ix.disturbed {
            let again = match ix.case(d.variant, d.shape, d.dtype).map(|c| &c.outcome) {
                Some(Outcome::Measured {
                    timing,
                    conditions,
                    line,
                    ..
                }) if conditions.is_empty() => {
                    format!("{:.1} µs, clean (log line {line})", timing.median_us).into()
                }
                Some(Outcome::Measured {
                    timing,
                    conditions,
                    line,
                    ..
                }) => Text::new()
                    .plain(format!("{:.1} µs, ", timing.median_us))
                    .strong(format!("still under {}", conditions_text(conditions)))
                    .plain(format!(" (log line {line}): flagged")),
                Some(o) => o.status().words().into(),
                None => "—".into(),
            };
            t.row(vec![
                Text::new().code(d.variant),
                d.shape.to_string().into(),
                d.dtype.to_string().into(),
                format!("{:.1}", d.timing.median_us).into(),
                format!("{} (log line {})", conditions_text(d.conditions), d.line).into(),
                again,
            ]);
        }
        s.push(Block::Table(t));
    }
    s
}
