//! `report.md`: the document as Markdown, every section in order.
use super::Emitter;
use crate::report::document::{Align, Block, Document, Span, Table, Text};
use std::fmt::Write;

pub struct Markdown;

impl Emitter for Markdown {
    fn emit(&self, doc: &Document) -> String {
        let mut md = format!("# {}\n", doc.title);
        for section in &doc.sections {
            if let Some(heading) = &section.heading {
                let _ = write!(md, "\n## {}\n", text(heading));
            }
            for block in &section.blocks {
                block_into(&mut md, block);
            }
        }
        md
    }
}

/// A block, after the blank line that separates it from the one before.
fn block_into(md: &mut String, block: &Block) {
    match block {
        Block::Paragraph(lines) => {
            md.push('\n');
            for line in lines {
                let _ = writeln!(md, "{}", text(line));
            }
        }
        Block::Subheading(t) => {
            let _ = write!(md, "\n### {}\n", text(t));
        }
        Block::List(items) => {
            md.push('\n');
            for item in items {
                let _ = writeln!(md, "- {}", text(&item.text));
                for under in &item.under {
                    let _ = writeln!(md, "  - {}", text(under));
                }
            }
        }
        Block::Warning { text: lead, items } => {
            let _ = writeln!(md, "\n> {}", text(lead));
            for item in items {
                let _ = writeln!(md, "> - {}", text(item));
            }
        }
        Block::Table(t) => {
            md.push('\n');
            table_into(md, t);
        }
        Block::Missing(t) => {
            let _ = write!(md, "\n{}\n", text(t));
        }
        // A plot is drawn only on the report page.
        Block::Figure(_) => {}
    }
}

fn table_into(md: &mut String, t: &Table) {
    md.push('|');
    for c in &t.columns {
        let _ = write!(md, " {} |", cell(&c.title));
    }
    md.push_str("\n|");
    for c in &t.columns {
        md.push_str(match c.align {
            Align::Left => "---|",
            Align::Right => "---:|",
        });
    }
    md.push('\n');
    for row in &t.rows {
        md.push('|');
        for c in row {
            let _ = write!(md, " {} |", cell(c));
        }
        md.push('\n');
    }
}

/// Spans as Markdown: code in backticks, strong in double asterisks.
pub(crate) fn text(t: &Text) -> String {
    t.0.iter()
        .map(|s| match s {
            Span::Plain(s) => s.clone(),
            Span::Code(s) => format!("`{s}`"),
            Span::Strong(s) => format!("**{s}**"),
        })
        .collect()
}

/// A table cell: a `|` or a line break in the run's own text (a reason, a constraint, an error)
/// would end the cell or the row, so the one is escaped (GFM's `\|`, inside code too) and the
/// other becomes a space.
fn cell(t: &Text) -> String {
    let flat = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    t.0.iter()
        .map(|s| match s {
            Span::Plain(s) => flat(s),
            Span::Code(s) => format!("`{}`", flat(s)),
            Span::Strong(s) => format!("**{}**", flat(s)),
        })
        .collect()
}
