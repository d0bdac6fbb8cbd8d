//! The report's Reused from earlier runs section (`--reuse`, `--confirm`).
use crate::log::runindex::RunIndex;
use crate::report::document::{Block, Section, SectionId, Table, Text};
use std::collections::BTreeMap;

/// What the results store supplied (`--reuse`), by the run that measured it, and what was measured
/// again to confirm it (`--confirm`), stored figure beside new.
pub(super) fn reused(ix: &RunIndex) -> Section {
    let mut s = Section::new(SectionId::Reused, Text::from("Reused from earlier runs"));
    let mut from: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for c in &ix.cases {
        if let Some(r) = c.reused() {
            from.entry(r.run).or_default().push(r.line);
        }
    }
    if !from.is_empty() {
        s.push(Block::line(
            Text::new()
                .plain("Not measured again: the results store held a measurement of the same kernel build (sources, defines, flags, nvcc) checked against the same reference build, on the same GPU model and driver, shape and dtype. Each counts as measured; its ")
                .code("reused")
                .plain(" record in this log names the run and log line of the measurement, as do the CSV's ")
                .code("reason")
                .plain(" and the JSON's ")
                .code("reused_from")
                .plain("."),
        ));
        s.push(Block::list(from.into_iter().map(|(run, mut lines)| {
            lines.sort_unstable();
            Text::from(format!(
                "{} case(s) from run {run}, its log lines {}",
                lines.len(),
                line_ranges(&lines)
            ))
        })));
    }
    let mut baselines_from: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for b in &ix.baselines {
        if let Ok(t) = &b.outcome {
            if let Some(c) = t.reused_from {
                baselines_from.entry(&c.run).or_default().push(c.line);
            }
        }
    }
    if !baselines_from.is_empty() {
        let versions = ix.reference_library.map_or(String::new(), |v| {
            let named: Vec<String> = v.iter().map(|(p, v)| format!("{p} {v}")).collect();
            format!(" ({})", named.join(", "))
        });
        s.push(Block::line(
            Text::new()
                .plain(format!("Reference library not timed again: the results store held its figures from an earlier run on the same GPU model and driver, with the same library{versions}, adapter and measurement policy. Each "))
                .code("baseline_timed")
                .plain(" record here names the run and log line it repeats in ")
                .code("reused_from")
                .plain("; ")
                .code("--fresh-baselines")
                .plain(" times them again."),
        ));
        s.push(Block::list(baselines_from.into_iter().map(
            |(run, mut lines)| {
                lines.sort_unstable();
                Text::from(format!(
                    "{} PyTorch row(s) from run {run}, its log lines {}",
                    lines.len(),
                    line_ranges(&lines)
                ))
            },
        )));
    }
    if !ix.confirmations.is_empty() {
        s.push(Block::line(
            Text::new()
                .plain("Measured again to confirm (")
                .code("--confirm")
                .plain("): the fastest stored cases of each shape."),
        ));
        let mut t = Table::new()
            .text("variant")
            .text("shape")
            .text("dtype")
            .figure("stored µs")
            .text("from")
            .figure("now µs")
            .figure("change");
        for c in &ix.confirmations {
            let now = ix
                .case(c.variant, c.shape, c.dtype)
                .and_then(|case| Some((case.measured()?, case.log_line())));
            let (now_s, change) = match now {
                Some((t, line)) => (
                    format!("{:.2} (line {line})", t.median_us),
                    format!("{:+.1}%", 100.0 * (t.median_us / c.stored_median_us - 1.0)),
                ),
                None => ("not measured".into(), "—".into()),
            };
            t.row(vec![
                Text::new().code(c.variant),
                c.shape.to_string().into(),
                c.dtype.to_string().into(),
                format!("{:.2}", c.stored_median_us).into(),
                format!("run {} line {}", c.from_run, c.from_line).into(),
                now_s.into(),
                change.into(),
            ]);
        }
        s.push(Block::Table(t));
    }
    s
}

/// `3-5, 9, 12-13` for sorted line numbers; `33 to 91` when that would be a long list.
fn line_ranges(lines: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut j = i;
        while j + 1 < lines.len() && lines[j + 1] == lines[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            lines[i].to_string()
        } else {
            format!("{}-{}", lines[i], lines[j])
        });
        i = j + 1;
    }
    match (parts.len(), lines.first(), lines.last()) {
        (n, Some(first), Some(last)) if n > 4 => format!("{first} to {last}"),
        _ => parts.join(", "),
    }
}
