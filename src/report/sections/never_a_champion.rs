//! The report's Never a champion section: the variants a runtime fault keeps from winning.
use crate::log::runindex::RunIndex;
use crate::report::document::{Block, Section, SectionId, Text};
use std::collections::BTreeSet;

/// The variants measured somewhere that a runtime fault keeps from being a champion, each with its
/// first fault (per shape, under per-shape dispatch).
pub(super) fn never_a_champion(ix: &RunIndex, measured_variants: &BTreeSet<&str>) -> Section {
    let shapes: &[crate::model::config::Shape] = ix.header.map_or(&[], |h| &h.shapes);
    let items: Vec<Text> = measured_variants
        .iter()
        .flat_map(|&v| {
            if !ix.per_shape_dispatch {
                let fault = ix.disqualified(v);
                return fault
                    .map(|f| {
                        Text::new().code(v).plain(format!(
                            ": {} (log line {})",
                            f.describe(),
                            f.line
                        ))
                    })
                    .into_iter()
                    .collect::<Vec<_>>();
            }
            shapes
                .iter()
                .filter_map(|s| {
                    let f = ix.disqualified_on(v, &s.name)?;
                    Some(Text::new().code(v).plain(format!(
                        " on {}: {} (log line {})",
                        s.name,
                        f.describe(),
                        f.line
                    )))
                })
                .collect()
        })
        .collect();
    let mut s = Section::new(SectionId::NeverAChampion, Text::from("Never a champion"));
    if items.is_empty() {
        return s;
    }
    let scope = if ix.per_shape_dispatch {
        "Per-shape dispatch is on: a fault keeps a variant from the shape it happened on only (from every shape when the log ties it to no case)."
    } else {
        "A kernel that faults anywhere is not a candidate anywhere, even where a retry of the case later passed."
    };
    s.push(Block::line(format!("These variants were measured on some cases but faulted on another: a wrong answer, a figure beyond a roof, a crash (a CUDA error or a dead worker), a hang, a write outside its outputs, or a quarantine. {scope}")));
    s.push(Block::list(items));
    s
}
