//! The report's Implausible figures section: cases timed beyond a measured roof.
use super::three_digits;
use crate::log::runindex::{Outcome, RunIndex};
use std::fmt::Write;

/// Cases timed beyond a measured roof: their figures, the roofs, and by how much they passed them.
/// The section, and how many cases it lists.
pub(super) fn implausible(ix: &RunIndex) -> (String, usize) {
    let cases: Vec<_> = ix
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Implausible { .. }))
        .collect();
    if cases.is_empty() {
        return (String::new(), 0);
    }
    let listed = cases.len();
    let c = &ix.ceilings;
    let mut md = String::from("\n## Implausible figures\n\nTimed beyond a roof the run measured, by more than `[gates] plausibility_margin`: above the dtype's dense matmul TFLOP/s, or moving the least traffic (Q, K, V read once, O written once) faster than the faster of copy and read-only bandwidth. A kernel that skips work or a timing that is wrong; never a champion, never committed. µs: the median; × ceiling: the figure ÷ the highest roof this log holds (the gate held it to the roofs measured before the case).\n\n");
    md.push_str("| variant | shape | dtype | µs | TF/s | × matmul ceiling | least-traffic GB/s | × bandwidth ceiling | why | log line |\n");
    md.push_str("|---|---|---|---:|---:|---:|---:|---:|---|---:|\n");
    for case in cases {
        let Outcome::Implausible {
            line,
            timing,
            reason,
            ..
        } = &case.outcome
        else {
            continue;
        };
        let gbs =
            crate::report::findings::min_bandwidth_gbs(case.shape, case.dtype, timing.median_us);
        let times = |x: f64, roof: Option<crate::log::runindex::Measured>| {
            roof.map_or("not measured".into(), |r| format!("{:.2}×", x / r.value))
        };
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {:.2} | {} | {} | {:.0} | {} | {} | {line} |",
            case.variant,
            case.shape.label(),
            case.dtype,
            timing.median_us,
            three_digits(timing.tflops),
            times(timing.tflops, c.matmul_tflops.get(&case.dtype).copied()),
            gbs,
            times(gbs, c.bandwidth()),
            reason.replace('|', "/"),
        );
    }
    (md, listed)
}
