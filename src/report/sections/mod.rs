//! The report's sections, each built from the run index as typed blocks (`report::document`):
//! one file per section; the variants table, the guided-search and ablation sections included.
mod ablation;
mod accounting;
mod best_per_shape;
mod drift;
mod gpu_state;
mod implausible;
mod never_a_champion;
mod not_measured;
mod plots;
mod profiles;
mod proposals;
mod reused;
mod run_statistics;
mod variants;

use crate::log::runindex::RunIndex;
use crate::log::runlog::LoadedLog;
use crate::model::config::Dtype;
pub use crate::report::document::three_digits;
use crate::report::document::{Block, Document, Section, SectionId, Table as DocTable, Text};
use crate::report::emit::{Emitter, Html, Markdown, Terminal};
use ablation::ablation_chain;
use ablation::factors_section;
use accounting::accounting;
use best_per_shape::best_per_shape;
use drift::drift;
use gpu_state::gpu_state;
use implausible::implausible;
use never_a_champion::never_a_champion;
use not_measured::not_measured;
use plots::plots;
pub use profiles::profile_text;
use proposals::proposals_section;
use reused::reused;
use run_statistics::run_statistics;
use std::collections::BTreeMap;
use variants::Table;

/// What `tune` prints when it ends (the terminal emitter of the report).
pub fn summary(log: &LoadedLog) -> String {
    Terminal.emit(&document(&RunIndex::new(log)))
}

/// `report.md`.
pub fn markdown(ix: &RunIndex) -> String {
    Markdown.emit(&document(ix))
}

/// `report.html`: the report with its plots.
pub fn page(ix: &RunIndex) -> String {
    Html.emit(&with_plots(ix, document(ix)))
}

/// The document with the page's plots: only the page draws them.
pub fn with_plots(ix: &RunIndex, mut doc: Document) -> Document {
    doc.push(plots(ix));
    doc
}

/// The report of a run, section by section.
pub fn document(ix: &RunIndex) -> Document {
    let mut doc = Document::default();
    let Some(header) = ix.header else {
        doc.title = "flashtune report".into();
        let mut s = Section::new(SectionId::Header, None);
        s.push(Block::line(
            "No header record: this is not a flashtune run log.",
        ));
        doc.push(s);
        return doc;
    };
    doc.title = format!("flashtune run {}", header.run_id);
    doc.push(header_section(ix, header));
    let table = Table::of(ix, header);
    doc.push(table.section(ix, header));
    doc.push(best_per_shape(
        &crate::report::findings::best_per_shape(ix),
        is_fake(ix),
    ));
    doc.push(reused(ix));
    doc.push(not_measured(ix));
    doc.push(implausible(ix));
    doc.push(gpu_state(ix));
    doc.push(drift(ix));
    if let Some(chain) = crate::report::findings::chain(ix) {
        doc.push(ablation_chain(&chain));
    }
    if let Some(section) = factors_section(ix.log) {
        doc.push(section);
    }
    if let Some(section) = proposals_section(ix.log) {
        doc.push(section);
    }
    doc.push(profiles_section(ix));
    doc.push(table.failures());
    doc.push(never_a_champion(ix, &table.measured_variants(ix)));
    doc.push(table.not_built());
    doc.push(run_statistics(ix));
    doc.push(ending(ix));
    doc
}

/// The GPU, the fake-GPU warning and the case accounting.
fn header_section(ix: &RunIndex, header: &crate::log::runlog::Header) -> Section {
    let mut s = Section::new(SectionId::Header, None);
    let d = &header.device;
    s.push(Block::line(
        Text::new()
            .plain(format!(
                "{}: {} ({} SMs, {}, driver {}) · {} · space ",
                gpus_named(&header.gpus),
                d.name,
                d.sm_count,
                d.arch,
                d.driver_version,
                header.toolchain.version
            ))
            .code(header.space.clone())
            .plain(format!(" ({}) · baseline ", header.strategy.label()))
            .code(header.baseline.clone())
            .plain(format!(
                " · git {}",
                header.git_head.as_deref().unwrap_or("(no repository)")
            )),
    ));
    if d.fake {
        s.push(Block::Warning {
            text: Text::new().strong("Fake GPU.").plain(
                " These figures come from the test double, not from a GPU. Nothing here was measured.",
            ),
            items: Vec::new(),
        });
    }
    for block in accounting(ix) {
        s.push(block);
    }
    s
}

/// `GPU 0`, `GPUs 0, 1`; plain `GPU` where the log does not name them (older logs, Slurm).
fn gpus_named(gpus: &[u32]) -> String {
    let ordinals: Vec<String> = gpus.iter().map(u32::to_string).collect();
    match gpus.len() {
        0 => "GPU".into(),
        1 => format!("GPU {}", ordinals[0]),
        _ => format!("GPUs {}", ordinals.join(", ")),
    }
}

/// What limits each profiled case, by Nsight Compute.
fn profiles_section(ix: &RunIndex) -> Section {
    let mut profiles: BTreeMap<(&str, &str, Dtype), Text> = BTreeMap::new();
    for p in &ix.profiles {
        profiles.insert(
            (p.variant, p.shape, p.dtype),
            profile_text(p.profile, p.line),
        );
    }
    let mut t = DocTable::new()
        .text("variant")
        .text("shape")
        .text("dtype")
        .text("what limits it");
    for ((v, shape, dtype), summary) in profiles {
        t.row(vec![
            Text::new().code(v),
            shape.into(),
            dtype.to_string().into(),
            summary,
        ]);
    }
    let mut s = Section::new(SectionId::Profiles, Text::from("Profiles (Nsight Compute)"));
    s.push(Block::Table(t));
    s
}

/// How the run ended: interrupted, finished, a torn last line.
fn ending(ix: &RunIndex) -> Section {
    let mut lines: Vec<Text> = Vec::new();
    if let Some((_, reason)) = ix.interrupted {
        lines.push(format!("Run interrupted: {reason}.").into());
    }
    lines.push(match ix.finished {
        Some(f) => format!(
            "Finished in {:.1} s: {} variants, {} cases {}, {} failed.",
            f.seconds,
            f.variants,
            f.measured_cases,
            if is_fake(ix) {
                "given synthetic figures by the fake GPU (nothing measured)"
            } else {
                "measured"
            },
            f.failed_cases
        )
        .into(),
        None => Text::new()
            .plain("The run has no ")
            .code("finished")
            .plain(" record: it was interrupted or is still going."),
    });
    if ix.log.torn_tail {
        lines.push(
            "The log's last line was cut short (a crash while writing) and was ignored.".into(),
        );
    }
    let mut s = Section::new(SectionId::Ending, None);
    s.push(Block::Paragraph(lines));
    s
}

/// Whether the run's device is the test double: its figures are synthetic, and every line that
/// could be read as a measurement says so.
fn is_fake(ix: &RunIndex) -> bool {
    ix.log.header().is_some_and(|h| h.device.fake)
}
