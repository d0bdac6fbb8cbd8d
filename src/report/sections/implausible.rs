//! The report's Implausible figures section: cases timed beyond a measured roof.
use super::three_digits;
use crate::log::runindex::{Outcome, RunIndex};
use crate::report::document::{Block, Section, SectionId, Table, Text};

/// Cases timed beyond a measured roof: their figures, the roofs, and by how much they passed them;
/// the section counts the cases it lists.
pub(super) fn implausible(ix: &RunIndex) -> Section {
    let mut s = Section::new(SectionId::Implausible, Text::from("Implausible figures"));
    let cases: Vec<_> = ix
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Implausible { .. }))
        .collect();
    if cases.is_empty() {
        return s;
    }
    let listed = cases.len();
    let c = &ix.ceilings;
    s.push(Block::line(
        Text::new()
            .plain("Timed beyond a roof the run measured, by more than ")
            .code("[gates] plausibility_margin")
            .plain(": above the dtype's dense matmul TFLOP/s, or moving the least traffic (Q, K, V read once, O written once) faster than the faster of copy and read-only bandwidth. A kernel that skips work or a timing that is wrong; never a champion, never committed. µs: the median; × ceiling: the figure ÷ the highest roof this log holds (the gate held it to the roofs measured before the case)."),
    ));
    let mut t = Table::new()
        .text("variant")
        .text("shape")
        .text("dtype")
        .figure("µs")
        .figure("TF/s")
        .figure("× matmul ceiling")
        .figure("least-traffic GB/s")
        .figure("× bandwidth ceiling")
        .text("why")
        .figure("log line");
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
        let times = |x: f64, roof: Option<crate::log::runindex::Measured>| -> Text {
            roof.map_or("not measured".into(), |r| {
                format!("{:.2}×", x / r.value).into()
            })
        };
        t.row(vec![
            Text::new().code(case.variant),
            case.shape.label().into(),
            case.dtype.to_string().into(),
            format!("{:.2}", timing.median_us).into(),
            three_digits(timing.tflops).into(),
            times(timing.tflops, c.matmul_tflops.get(&case.dtype).copied()),
            format!("{gbs:.0}").into(),
            times(gbs, c.bandwidth()),
            reason.to_string().into(),
            line.to_string().into(),
        ]);
    }
    s.push(Block::Table(t));
    s.counting(listed)
}
