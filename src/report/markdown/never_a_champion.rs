//! The report's Never a champion section: the variants a runtime fault keeps from winning.
use crate::log::runindex::RunIndex;
use std::collections::BTreeSet;

/// The variants measured somewhere that a runtime fault keeps from being a champion, each with its
/// first fault (per shape, under per-shape dispatch).
pub(super) fn never_a_champion(ix: &RunIndex, measured_variants: &BTreeSet<&str>) -> String {
    let shapes: &[crate::model::config::Shape] = ix.header.map_or(&[], |h| &h.shapes);
    let lines: Vec<String> = measured_variants
        .iter()
        .flat_map(|&v| {
            if !ix.per_shape_dispatch {
                let fault = ix.disqualified(v);
                return fault
                    .map(|f| format!("- `{v}`: {} (log line {})", f.describe(), f.line))
                    .into_iter()
                    .collect::<Vec<_>>();
            }
            shapes
                .iter()
                .filter_map(|s| {
                    let f = ix.disqualified_on(v, &s.name)?;
                    Some(format!(
                        "- `{v}` on {}: {} (log line {})",
                        s.name,
                        f.describe(),
                        f.line
                    ))
                })
                .collect()
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let scope = if ix.per_shape_dispatch {
        "Per-shape dispatch is on: a fault keeps a variant from the shape it happened on only (from every shape when the log ties it to no case)."
    } else {
        "A kernel that faults anywhere is not a candidate anywhere, even where a retry of the case later passed."
    };
    format!(
        "\n## Never a champion\n\nThese variants were measured on some cases but faulted on another: a wrong answer, a figure beyond a roof, a crash (a CUDA error or a dead worker), a hang, a write outside its outputs, or a quarantine. {scope}\n\n{}\n",
        lines.join("\n")
    )
}
