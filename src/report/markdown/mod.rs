//! Turns a run log into the Markdown table people read: one row per (variant, dtype), every figure from a log record. The guided-search and ablation sections are rendered here too, from the records alone.
mod ablation;
mod accounting;
mod best_per_shape;
mod document;
mod drift;
mod gpu_state;
mod implausible;
mod never_a_champion;
mod not_measured;
mod profiles;
mod proposals;
mod reused;
mod run_statistics;
mod variants;

use crate::log::runindex::RunIndex;
use crate::log::runlog::LoadedLog;
use crate::model::config::Dtype;
use ablation::ablation_chain;
pub use ablation::factors_section;
use accounting::accounting;
use best_per_shape::best_per_shape;
pub use document::{Document, Section, SectionId};
use drift::drift;
use gpu_state::gpu_state;
use implausible::implausible;
use never_a_champion::never_a_champion;
use not_measured::not_measured;
pub use profiles::profile_summary;
pub use proposals::proposals_section;
pub use reused::reused;
use run_statistics::run_statistics;
use std::collections::BTreeMap;
use std::fmt::Write;
use variants::Table;

/// What `tune` prints when it ends: the run line, the best per shape (and an ablation's factor ranking), failures
/// in one line, and how the run ended. The whole report is in the run folder.
pub fn summary(log: &LoadedLog) -> String {
    let doc = document(&RunIndex::new(log));
    let mut out = String::new();
    for s in &doc.sections {
        match s.id {
            SectionId::Header => out.push_str(&s.markdown),
            SectionId::BestPerShape
            | SectionId::Factors
            | SectionId::GpuState
            | SectionId::Drift => {
                let _ = writeln!(out, "{}", s.markdown.trim_end());
            }
            SectionId::RunStatistics => {
                let ending = doc.section(SectionId::Ending).map_or("", |e| &e.markdown);
                let _ = writeln!(out, "{}", format!("{}{ending}", s.markdown).trim_end());
            }
            SectionId::Implausible => {
                let _ = writeln!(
                    out,
                    "\n{} implausible figure(s), beyond a measured roof: see the Implausible figures section of report.md.",
                    s.items
                );
            }
            SectionId::NotMeasured => {
                let _ = writeln!(
                    out,
                    "\n{} variant(s) not reached under the budget: see the Not measured section of report.md.",
                    s.items
                );
            }
            SectionId::Failures => {
                let _ = writeln!(
                    out,
                    "\n{} failure(s): see the Failures section of report.md.",
                    s.items
                );
            }
            _ => {}
        }
    }
    out
}

/// `report.md`.
pub fn markdown(ix: &RunIndex) -> String {
    document(ix).markdown()
}

/// The report of a run, section by section.
pub fn document(ix: &RunIndex) -> Document {
    let mut doc = Document::default();
    let Some(header) = ix.header else {
        doc.title = "flashtune report".into();
        doc.push(
            SectionId::Header,
            "No header record: this is not a flashtune run log.\n".into(),
            0,
        );
        return doc;
    };
    doc.title = format!("flashtune run {}", header.run_id);
    doc.push(SectionId::Header, header_section(ix, header, &doc.title), 0);
    let table = Table::of(ix, header);
    doc.push(SectionId::Variants, table.section(ix, header), 0);
    doc.push(
        SectionId::BestPerShape,
        best_per_shape(&crate::report::findings::best_per_shape(ix), is_fake(ix)),
        0,
    );
    doc.push(SectionId::Reused, reused(ix), 0);
    let (text, left) = not_measured(ix);
    doc.push(SectionId::NotMeasured, text, left);
    let (text, count) = implausible(ix);
    doc.push(SectionId::Implausible, text, count);
    doc.push(SectionId::GpuState, gpu_state(ix), 0);
    doc.push(SectionId::Drift, drift(ix), 0);
    if let Some(chain) = crate::report::findings::chain(ix) {
        doc.push(SectionId::AblationChain, ablation_chain(&chain), 0);
    }
    if let Some(section) = factors_section(ix.log) {
        doc.push(SectionId::Factors, format!("\n{section}"), 0);
    }
    if let Some(section) = proposals_section(ix.log) {
        doc.push(SectionId::Proposals, format!("\n{section}"), 0);
    }
    doc.push(SectionId::Profiles, profiles_section(ix), 0);
    let problems = table.failures();
    if !problems.is_empty() {
        doc.push(
            SectionId::Failures,
            format!("\n## Failures\n\n{}\n", problems.join("\n")),
            problems.len(),
        );
    }
    doc.push(
        SectionId::NeverAChampion,
        never_a_champion(ix, &table.measured_variants(ix)),
        0,
    );
    doc.push(SectionId::NotBuilt, table.not_built(), 0);
    doc.push(SectionId::RunStatistics, run_statistics(ix), 0);
    doc.push(SectionId::Ending, ending(ix), 0);
    doc
}

/// The run line, the GPU, the fake-GPU warning and the case accounting.
fn header_section(ix: &RunIndex, header: &crate::log::runlog::Header, title: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# {title}\n");
    let d = &header.device;
    let _ = writeln!(
        md,
        "GPU: {} ({} SMs, {}, driver {}) · {} · space `{}` ({}) · baseline `{}` · git {}\n",
        d.name,
        d.sm_count,
        d.arch,
        d.driver_version,
        header.toolchain.version,
        header.space,
        header.strategy.label(),
        header.baseline,
        header.git_head.as_deref().unwrap_or("(no repository)")
    );
    if d.fake {
        md.push_str("> **Fake GPU.** These figures come from the test double, not from a GPU. Nothing here was measured.\n\n");
    }
    md.push_str(&accounting(ix));
    md
}

/// What limits each profiled case, by Nsight Compute.
fn profiles_section(ix: &RunIndex) -> String {
    let mut profiles: BTreeMap<(&str, &str, Dtype), String> = BTreeMap::new();
    for p in &ix.profiles {
        profiles.insert(
            (p.variant, p.shape, p.dtype),
            profile_summary(p.profile, p.line),
        );
    }
    let mut md = String::new();
    if !profiles.is_empty() {
        md.push_str("\n## Profiles (Nsight Compute)\n\n| variant | shape | dtype | what limits it |\n|---|---|---|---|\n");
        for ((v, shape, dtype), summary) in &profiles {
            let _ = writeln!(md, "| `{v}` | {shape} | {dtype} | {summary} |");
        }
    }
    md
}

/// How the run ended: interrupted, finished, a torn last line.
fn ending(ix: &RunIndex) -> String {
    let mut md = String::from("\n");
    if let Some((_, reason)) = ix.interrupted {
        let _ = writeln!(md, "Run interrupted: {reason}.");
    }
    match ix.finished {
        Some(f) => {
            let _ = writeln!(
                md,
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
            );
        }
        None => {
            md.push_str("The run has no `finished` record: it was interrupted or is still going.\n")
        }
    }
    if ix.log.torn_tail {
        md.push_str("The log's last line was cut short (a crash while writing) and was ignored.\n");
    }
    md
}

/// Three significant digits at most, so tiny decode figures do not print as 0.0.
pub fn three_digits(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Whether the run's device is the test double: its figures are synthetic, and every line that
/// could be read as a measurement says so.
fn is_fake(ix: &RunIndex) -> bool {
    ix.log.header().is_some_and(|h| h.device.fake)
}
