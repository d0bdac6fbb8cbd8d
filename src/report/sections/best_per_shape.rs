//! The report's Best per shape section: each champion beside the reference library, and the measured ceilings.
use super::gpu_state::conditions_text;
use super::three_digits;
use crate::report::document::{Block, Section, SectionId, Table, Text};

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
pub(super) fn best_per_shape(found: &crate::report::findings::BestPerShape, fake: bool) -> Section {
    let backends = &found.backends;
    let mut s = Section::new(
        SectionId::BestPerShape,
        Text::from("Best per shape, beside PyTorch SDPA"),
    );
    if found.per_shape_dispatch {
        s.push(Block::Warning {
            text: Text::new()
                .strong("Per-shape dispatch is on")
                .plain(" (")
                .code("[gates] per_shape_dispatch")
                .plain(" in this run's policies): a variant that faulted on one shape may still be the best on another. Dispatch each shape's best kernel for that shape only."),
            items: Vec::new(),
        });
    }
    let mut t = Table::new()
        .text("shape")
        .text("dtype")
        .text("best variant")
        .figure("µs")
        .figure("TF/s");
    for b in backends {
        t = t.figure(format!("{} µs (spread)", backend_label(b)));
    }
    if backends.is_empty() {
        t = t.figure("PyTorch");
    }
    let fastest = if backends.iter().any(|b| b == FA4_BACKEND) {
        "fastest backend"
    } else {
        "fastest PyTorch"
    };
    t = t
        .figure(format!("best ÷ {fastest} (time)"))
        .figure("% of matmul ceiling")
        .figure("% of bandwidth ceiling");
    for row in &found.rows {
        t.row(table_row(row, backends, &found.ceilings));
    }
    s.push(Block::Table(t));
    notes(found, &mut s);
    if found
        .rows
        .iter()
        .any(|r| r.torch.iter().flatten().any(|t| t.is_ok()))
    {
        let mut spread = Text::from("PyTorch spread: (p90 − p10) ÷ median of its samples.");
        let noisy = found
            .rows
            .iter()
            .flat_map(|r| r.torch.iter().flatten().flatten())
            .filter(|t| t.noisy)
            .count();
        if noisy > 0 {
            spread = spread
                .plain(" ")
                .strong("noisy")
                .plain(format!(" ({noisy}): still above the "))
                .code("[baseline] max_spread")
                .plain(
                    " limit after re-measuring; do not trust that figure or a ratio built on it.",
                );
        }
        s.push(Block::line(spread));
    }
    for block in ceilings_note(&found.ceilings, fake) {
        s.push(block);
    }
    if let Some(why) = &found.torch_missing {
        s.push(Block::line(format!("PyTorch not measured: {why}.")));
    }
    s
}

/// One row of the table: a (shape, dtype), its champion, the reference library, the ceilings.
fn table_row(
    row: &crate::report::findings::BestRow,
    backends: &[String],
    c: &crate::report::findings::Ceilings,
) -> Vec<Text> {
    let (mut name, us, tf) = match &row.best {
        Some((n, us, tf)) => (
            Text::new().code(n.clone()),
            format!("{us:.1}"),
            three_digits(*tf),
        ),
        None => ("none passed".into(), "—".into(), "—".into()),
    };
    if let Some(t) = &row.tie {
        name = name
            .plain(" ")
            .strong("tied")
            .plain(" with ")
            .code(t.variant.clone());
    }
    if !row.under.is_empty() {
        name = name.plain(format!(
            " (measured under {}: no clean figure)",
            conditions_text(&row.under)
        ));
    }
    if let Some((run, line)) = &row.reused {
        name = name.plain(format!(" ↺ (run {run}, line {line})"));
    }
    let mut cells: Vec<Text> = vec![
        row.shape.label().into(),
        row.dtype.to_string().into(),
        name,
        us.into(),
        tf.into(),
    ];
    for cell in &row.torch {
        cells.push(match cell {
            Some(Ok(t)) if t.noisy => Text::new()
                .plain(format!("{:.1} ({:.1}%, ", t.median_us, 100.0 * t.spread))
                .strong("noisy")
                .plain(")"),
            Some(Ok(t)) => format!("{:.1} ({:.1}%)", t.median_us, 100.0 * t.spread).into(),
            Some(Err(e)) => {
                format!("unsupported ({})", e.chars().take(60).collect::<String>()).into()
            }
            None => "not measured".into(),
        });
    }
    if backends.is_empty() {
        cells.push("not measured".into());
    }
    let ratio = match (&row.best, row.fastest_torch_us) {
        (Some((_, us, _)), Some(f)) if row.fastest_torch_noisy => {
            format!("{:.2}× (noisy PyTorch figure)", us / f)
        }
        (Some((_, us, _)), Some(f)) => format!("{:.2}×", us / f),
        _ => "—".into(),
    };
    let pct = |p: Option<f64>, roof_known: bool| -> Text {
        match p {
            Some(p) => format!("{p:.1}%").into(),
            None if roof_known => "—".into(),
            None => "not measured".into(),
        }
    };
    cells.push(ratio.into());
    cells.push(pct(
        row.pct_of_matmul,
        c.matmul_tflops.contains_key(&row.dtype),
    ));
    cells.push(pct(row.pct_of_copy, c.bandwidth().is_some()));
    cells
}

/// The notes under the table: champions passed over for their conditions, kept by a duel, tied.
fn notes(found: &crate::report::findings::BestPerShape, s: &mut Section) {
    let ties: Vec<Text> = found
        .rows
        .iter()
        .filter_map(|row| {
            let (t, (best, us, _)) = (row.tie.as_ref()?, row.best.as_ref()?);
            Some(
                Text::new()
                    .plain(format!("{} {}: ", row.shape.name, row.dtype))
                    .code(best.clone())
                    .plain(format!(" {us:.1} µs and "))
                    .code(t.variant.clone())
                    .plain(format!(
                        " {:.1} µs are {}: neither is faster beyond the noise.",
                        t.median_us,
                        t.closeness.describe()
                    )),
            )
        })
        .collect();
    let passed: Vec<Text> = found
        .rows
        .iter()
        .flat_map(|row| {
            row.passed_over.iter().map(move |(variant, us, conditions, line)| {
                Text::new()
                    .plain(format!("{} {}: ", row.shape.name, row.dtype))
                    .code(variant.clone())
                    .plain(format!(
                        " {us:.1} µs was faster but measured under {} (log line {line}), still there when timed again: it does not decide the champion while a clean figure exists.",
                        conditions_text(conditions)
                    ))
            })
        })
        .collect();
    listed(
        s,
        "Passed over: figures measured on a throttled or shared GPU.",
        passed,
    );
    let outdueled: Vec<Text> = found
        .rows
        .iter()
        .flat_map(|row| {
            let best = row.best.as_ref().map_or("", |b| b.0.as_str());
            row.outdueled.iter().map(move |(variant, us, line)| {
                Text::new()
                    .plain(format!("{} {}: ", row.shape.name, row.dtype))
                    .code(variant.clone())
                    .plain(format!(" {us:.1} µs (log line {line}) was faster in its own timing but lost its interleaved re-timing: "))
                    .code(best)
                    .plain(" stays the champion.")
            })
        })
        .collect();
    listed(
        s,
        "Kept by a duel: a faster first figure that did not beat the champion when the two were timed interleaved.",
        outdueled,
    );
    listed(
        s,
        "Tied: the runner-up is within the measured noise of the best (the larger p10..p90 spread of the two, or their interleaved duel's).",
        ties,
    );
}

/// Where the ceilings came from, or that there are none.
fn ceilings_note(c: &crate::report::findings::Ceilings, fake: bool) -> Vec<Block> {
    let missing = c.unavailable.iter().map(|(line, why)| {
        Block::line(format!(
            "Roof not measured (log line {line}): {why}. Figures are not held to it."
        ))
    });
    if c.is_empty() {
        return std::iter::once(Block::line("Ceilings not measured in this run (the worker measures them before the variants, the PyTorch adapter beside SDPA)."))
            .chain(missing)
            .collect();
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
    std::iter::once(Block::line(format!("{title}: {}. % of matmul ceiling: the best's TF/s ÷ its dtype's dense matmul TFLOP/s. % of bandwidth ceiling: the least traffic (Q, K, V read once, O written once) per second at the best's median ÷ the faster measured stream. Where the worker and the PyTorch adapter both measured a roof, the higher figure is the ceiling.", parts.join(", "))))
        .chain(missing)
        .collect()
}

/// A note under the table: its heading, then one item each; nothing when there are none.
fn listed(s: &mut Section, heading: &str, items: Vec<Text>) {
    if !items.is_empty() {
        s.push(Block::line(heading));
        s.push(Block::list(items));
    }
}
