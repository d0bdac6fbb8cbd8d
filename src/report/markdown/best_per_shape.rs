//! The report's Best per shape section: each champion beside the reference library, and the measured ceilings.
use super::gpu_state::conditions_text;
use super::three_digits;
use std::fmt::Write;

/// The adapter's name for FlashAttention-4's forward, timed beside PyTorch's backends where installed.
const FA4_BACKEND: &str = "fa4";

/// A reference-library column's title: PyTorch's SDPA backends by name, FA4 as itself.
fn backend_label(backend: &str) -> String {
    if backend == FA4_BACKEND {
        "FlashAttention-4".into()
    } else {
        format!("PyTorch {backend}")
    }
}

/// Per (shape, dtype): the champion beside the reference library (a time ratio) and the measured ceilings.
pub(super) fn best_per_shape(found: &crate::report::findings::BestPerShape, fake: bool) -> String {
    let backends = &found.backends;
    let mut md = String::from("\n## Best per shape, beside PyTorch SDPA\n\n");
    if found.per_shape_dispatch {
        md.push_str("> **Per-shape dispatch is on** (`[gates] per_shape_dispatch` in this run's policies): a variant that faulted on one shape may still be the best on another. Dispatch each shape's best kernel for that shape only.\n\n");
    }
    let _ = write!(md, "| shape | dtype | best variant | µs | TF/s |");
    for b in backends {
        let _ = write!(md, " {} µs (spread) |", backend_label(b));
    }
    if backends.is_empty() {
        md.push_str(" PyTorch |");
    }
    let fastest = if backends.iter().any(|b| b == FA4_BACKEND) {
        "fastest backend"
    } else {
        "fastest PyTorch"
    };
    let _ = write!(md, " best ÷ {fastest} (time) | % of matmul ceiling | % of bandwidth ceiling |\n|---|---|---|---:|---:|");
    for _ in 0..backends.len().max(1) {
        md.push_str("---:|");
    }
    md.push_str("---:|---:|---:|\n");
    for row in &found.rows {
        md.push_str(&table_row(row, backends, &found.ceilings));
    }
    notes(found, &mut md);
    if found
        .rows
        .iter()
        .any(|r| r.torch.iter().flatten().any(|t| t.is_ok()))
    {
        md.push_str("\nPyTorch spread: (p90 − p10) ÷ median of its samples.");
        let noisy = found
            .rows
            .iter()
            .flat_map(|r| r.torch.iter().flatten().flatten())
            .filter(|t| t.noisy)
            .count();
        if noisy > 0 {
            let _ = write!(md, " **noisy** ({noisy}): still above the `[baseline] max_spread` limit after re-measuring; do not trust that figure or a ratio built on it.");
        }
        md.push('\n');
    }
    md.push_str(&ceilings_note(&found.ceilings, fake));
    if let Some(why) = &found.torch_missing {
        let _ = writeln!(md, "\nPyTorch not measured: {why}.");
    }
    md
}

/// One row of the table: a (shape, dtype), its champion, the reference library, the ceilings.
fn table_row(
    row: &crate::report::findings::BestRow,
    backends: &[String],
    c: &crate::report::findings::Ceilings,
) -> String {
    let mut md = String::new();
    let (name, us, tf) = match &row.best {
        Some((n, us, tf)) => (format!("`{n}`"), format!("{us:.1}"), three_digits(*tf)),
        None => ("none passed".into(), "—".into(), "—".into()),
    };
    let name = match &row.tie {
        Some(t) => format!("{name} **tied** with `{}`", t.variant),
        None => name,
    };
    let name = if row.under.is_empty() {
        name
    } else {
        format!(
            "{name} (measured under {}: no clean figure)",
            conditions_text(&row.under)
        )
    };
    let name = match &row.reused {
        Some((run, line)) => format!("{name} ↺ (run {run}, line {line})"),
        None => name,
    };
    let _ = write!(
        md,
        "| {} | {} | {name} | {us} | {tf} |",
        row.shape.label(),
        row.dtype
    );
    for cell in &row.torch {
        let cell = match cell {
            Some(Ok(t)) if t.noisy => {
                format!("{:.1} ({:.1}%, **noisy**)", t.median_us, 100.0 * t.spread)
            }
            Some(Ok(t)) => format!("{:.1} ({:.1}%)", t.median_us, 100.0 * t.spread),
            Some(Err(e)) => {
                format!("unsupported ({})", e.chars().take(60).collect::<String>())
            }
            None => "not measured".into(),
        };
        let _ = write!(md, " {cell} |");
    }
    if backends.is_empty() {
        md.push_str(" not measured |");
    }
    let ratio = match (&row.best, row.fastest_torch_us) {
        (Some((_, us, _)), Some(f)) if row.fastest_torch_noisy => {
            format!("{:.2}× (noisy PyTorch figure)", us / f)
        }
        (Some((_, us, _)), Some(f)) => format!("{:.2}×", us / f),
        _ => "—".into(),
    };
    let pct = |p: Option<f64>, roof_known: bool| match p {
        Some(p) => format!("{p:.1}%"),
        None if roof_known => "—".into(),
        None => "not measured".into(),
    };
    let _ = writeln!(
        md,
        " {ratio} | {} | {} |",
        pct(row.pct_of_matmul, c.matmul_tflops.contains_key(&row.dtype)),
        pct(row.pct_of_copy, c.bandwidth().is_some())
    );
    md
}

/// The notes under the table: champions passed over for their conditions, kept by a duel, tied.
fn notes(found: &crate::report::findings::BestPerShape, md: &mut String) {
    let ties: Vec<String> = found
        .rows
        .iter()
        .filter_map(|row| {
            let (t, (best, us, _)) = (row.tie.as_ref()?, row.best.as_ref()?);
            Some(format!(
                "- {} {}: `{best}` {us:.1} µs and `{}` {:.1} µs are {}: neither is faster beyond the noise.",
                row.shape.name,
                row.dtype,
                t.variant,
                t.median_us,
                t.closeness.describe()
            ))
        })
        .collect();
    let passed: Vec<String> = found
        .rows
        .iter()
        .flat_map(|row| {
            row.passed_over.iter().map(move |(variant, us, conditions, line)| {
                format!(
                    "- {} {}: `{variant}` {us:.1} µs was faster but measured under {} (log line {line}), still there when timed again: it does not decide the champion while a clean figure exists.",
                    row.shape.name,
                    row.dtype,
                    conditions_text(conditions)
                )
            })
        })
        .collect();
    listed(
        md,
        "Passed over: figures measured on a throttled or shared GPU.",
        &passed,
    );
    let outdueled: Vec<String> = found
        .rows
        .iter()
        .flat_map(|row| {
            let best = row.best.as_ref().map_or("", |b| b.0.as_str());
            row.outdueled.iter().map(move |(variant, us, line)| {
                format!(
                    "- {} {}: `{variant}` {us:.1} µs (log line {line}) was faster in its own timing but lost its interleaved re-timing: `{best}` stays the champion.",
                    row.shape.name, row.dtype,
                )
            })
        })
        .collect();
    listed(
        md,
        "Kept by a duel: a faster first figure that did not beat the champion when the two were timed interleaved.",
        &outdueled,
    );
    listed(
        md,
        "Tied: the runner-up is within the measured noise of the best (the larger p10..p90 spread of the two, or their interleaved duel's).",
        &ties,
    );
}

/// Where the ceilings came from, or that there are none.
fn ceilings_note(c: &crate::report::findings::Ceilings, fake: bool) -> String {
    let missing: String = c
        .unavailable
        .iter()
        .map(|(line, why)| {
            format!("\nRoof not measured (log line {line}): {why}. Figures are not held to it.\n")
        })
        .collect();
    if c.is_empty() {
        return format!("\nCeilings not measured in this run (the worker measures them before the variants, the PyTorch adapter beside SDPA).\n{missing}");
    }
    let mut parts: Vec<String> = c
        .matmul_tflops
        .iter()
        .map(|(d, m)| {
            format!(
                "{d} matmul {} TFLOP/s (log line {})",
                three_digits(m.value),
                m.line
            )
        })
        .collect();
    if let Some(m) = c.copy_gbs {
        parts.push(format!(
            "copy {:.0} GB/s read + written (log line {})",
            m.value, m.line
        ));
    }
    if let Some(m) = c.read_gbs {
        parts.push(format!(
            "read-only stream {:.0} GB/s (log line {})",
            m.value, m.line
        ));
    }
    let title = if fake {
        "Synthetic ceilings (the test double's fixed roofs, not measured)"
    } else {
        "Measured ceilings"
    };
    format!("\n{title}: {}. % of matmul ceiling: the best's TF/s ÷ its dtype's dense matmul TFLOP/s. % of bandwidth ceiling: the least traffic (Q, K, V read once, O written once) per second at the best's median ÷ the faster measured stream. Where the worker and the PyTorch adapter both measured a roof, the higher figure is the ceiling.\n{missing}", parts.join(", "))
}

/// A note under the table: its heading, then one line per item; nothing when there are none.
fn listed(md: &mut String, heading: &str, items: &[String]) {
    if !items.is_empty() {
        let _ = writeln!(md, "\n{heading}\n\n{}", items.join("\n"));
    }
}
