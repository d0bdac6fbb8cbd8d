//! The report's Reused from earlier runs section (`--reuse`, `--confirm`).
use crate::log::runindex::RunIndex;
use std::collections::BTreeMap;
use std::fmt::Write;

/// What the results store supplied (`--reuse`), by the run that measured it, and what was measured
/// again to confirm it (`--confirm`), stored figure beside new.
pub fn reused(ix: &RunIndex) -> String {
    let mut from: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for c in &ix.cases {
        if let Some(r) = c.reused() {
            from.entry(r.run).or_default().push(r.line);
        }
    }
    if from.is_empty() && ix.confirmations.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Reused from earlier runs\n\n");
    if !from.is_empty() {
        md.push_str("Not measured again: the results store held a measurement of the same kernel build (sources, defines, flags, nvcc) checked against the same reference build, on the same GPU model and driver, shape and dtype. Each counts as measured; its `reused` record in this log names the run and log line of the measurement, as do the CSV's `reason` and the JSON's `reused_from`.\n\n");
        for (run, mut lines) in from {
            lines.sort_unstable();
            let _ = writeln!(
                md,
                "- {} case(s) from run {run}, its log lines {}",
                lines.len(),
                line_ranges(&lines)
            );
        }
    }
    if !ix.confirmations.is_empty() {
        md.push_str("\nMeasured again to confirm (`--confirm`): the fastest stored cases of each shape.\n\n| variant | shape | dtype | stored µs | from | now µs | change |\n|---|---|---|---:|---|---:|---:|\n");
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
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {:.2} | run {} line {} | {now_s} | {change} |",
                c.variant, c.shape, c.dtype, c.stored_median_us, c.from_run, c.from_line
            );
        }
    }
    md
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
