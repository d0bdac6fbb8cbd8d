//! What `tune` prints when it ends: the run line, the best per shape (and an ablation's factor
//! ranking), the GPU's state and drift, where the time went, failures counted in one line, and
//! how the run ended. Tables are aligned in columns; the whole report is in the run folder.
use super::Emitter;
use crate::report::document::{Align, Block, Document, Section, SectionId, Table, Text};
use std::fmt::Write;

pub struct Terminal;

/// Sections shown whole.
const SHOWN: [SectionId; 7] = [
    SectionId::Header,
    SectionId::BestPerShape,
    SectionId::Factors,
    SectionId::GpuState,
    SectionId::Drift,
    SectionId::RunStatistics,
    SectionId::Ending,
];

impl Emitter for Terminal {
    fn emit(&self, doc: &Document) -> String {
        let mut out = format!("{}\n", doc.title);
        for section in &doc.sections {
            if SHOWN.contains(&section.id) {
                section_into(&mut out, section);
            } else if let Some(line) = counted(section) {
                let _ = writeln!(out, "\n{line}");
            }
        }
        out
    }
}

/// A section too long for a terminal, as how many items it lists and where to read them.
fn counted(section: &Section) -> Option<String> {
    let n = section.items;
    Some(match section.id {
        SectionId::Implausible => format!(
            "{n} implausible figure(s), beyond a measured roof: see the Implausible figures section of report.md."
        ),
        SectionId::NotMeasured => format!(
            "{n} variant(s) not reached under the budget: see the Not measured section of report.md."
        ),
        SectionId::Failures => {
            format!("{n} failure(s): see the Failures section of report.md.")
        }
        _ => return None,
    })
}

fn section_into(out: &mut String, section: &Section) {
    if let Some(heading) = &section.heading {
        let words = heading.words();
        let _ = write!(out, "\n{words}\n{}\n", "-".repeat(words.chars().count()));
    }
    for block in &section.blocks {
        match block {
            Block::Paragraph(lines) => {
                out.push('\n');
                for line in lines {
                    let _ = writeln!(out, "{}", line.words());
                }
            }
            Block::Subheading(t) | Block::Missing(t) => {
                let _ = write!(out, "\n{}\n", t.words());
            }
            Block::List(items) => {
                out.push('\n');
                for item in items {
                    let _ = writeln!(out, "- {}", item.text.words());
                    for under in &item.under {
                        let _ = writeln!(out, "  - {}", under.words());
                    }
                }
            }
            Block::Warning { text, items } => {
                let _ = writeln!(out, "\n! {}", text.words());
                for item in items {
                    let _ = writeln!(out, "!   - {}", item.words());
                }
            }
            Block::Table(t) => {
                out.push('\n');
                table_into(out, t);
            }
            Block::Figure(_) => {}
        }
    }
}

/// Columns padded to their widest cell, figures right-aligned.
fn table_into(out: &mut String, t: &Table) {
    let cells = |row: &[Text]| -> Vec<String> {
        row.iter().map(|c| c.words().replace('\n', " ")).collect()
    };
    let titles: Vec<String> = t.columns.iter().map(|c| c.title.words()).collect();
    let rows: Vec<Vec<String>> = t.rows.iter().map(|r| cells(r)).collect();
    let width = |j: usize| {
        rows.iter()
            .map(|r| r.get(j).map_or(0, |c| c.chars().count()))
            .chain([titles[j].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..t.columns.len()).map(width).collect();
    let line = |out: &mut String, row: &[String]| {
        let padded: Vec<String> = row
            .iter()
            .zip(&t.columns)
            .zip(&widths)
            .map(|((c, col), &w)| {
                let pad = " ".repeat(w.saturating_sub(c.chars().count()));
                match col.align {
                    Align::Left => format!("{c}{pad}"),
                    Align::Right => format!("{pad}{c}"),
                }
            })
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(out, &titles);
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    line(out, &rule);
    for row in &rows {
        line(out, row);
    }
}
