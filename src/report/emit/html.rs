//! `report.html`: the document as one self-contained page (no network: inline CSS, inline SVG
//! plots), the answer first: best per shape and the plots above the table of every variant.
use super::Emitter;
use crate::report::document::{
    Align, Block, Document, Figure, Section, SectionId, Span, Table, Text,
};
use std::fmt::Write;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222}\
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}\
.wide{overflow-x:auto}table{border-collapse:collapse;font-size:13px;margin:8px 0}\
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#f3f3f3;position:sticky;top:0}\
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}tr:nth-child(even) td{background:#fafafa}\
code{font-size:12px}td code{white-space:nowrap}figcaption{font-size:13px;margin-left:80px}blockquote{border-left:4px solid #d62728;margin:0;padding:4px 12px;background:#fff4f4}\
td.unwrapped{white-space:nowrap;font-size:11px}figure{margin:12px 0}svg{max-width:100%;height:auto}.missing{color:#666;font-style:italic}";

pub struct Html;

/// The morning reader wants the answer first: these sections go above the table of every
/// variant, which in a big run is hundreds of rows long; the rest follow in the document's order.
const LEAD: [SectionId; 4] = [
    SectionId::Header,
    SectionId::BestPerShape,
    SectionId::Plots,
    SectionId::Variants,
];

impl Emitter for Html {
    fn emit(&self, doc: &Document) -> String {
        let mut body = format!("<h1>{}</h1>\n", escape(&doc.title));
        let lead = LEAD.iter().filter_map(|&id| doc.section(id));
        let rest = doc.sections.iter().filter(|s| !LEAD.contains(&s.id));
        for section in lead.chain(rest) {
            section_into(&mut body, section);
        }
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
            escape(&doc.title),
        )
    }
}

fn section_into(html: &mut String, section: &Section) {
    // The variants table follows the title in Markdown; on the page it comes after the plots and
    // needs a heading of its own.
    let heading = match (&section.heading, section.id) {
        (Some(h), _) => Some(text(h)),
        (None, SectionId::Variants) => Some("Every variant".into()),
        (None, _) => None,
    };
    if let Some(h) = heading {
        let _ = writeln!(html, "<h2>{h}</h2>");
    }
    for block in &section.blocks {
        block_into(html, block);
    }
}

fn block_into(html: &mut String, block: &Block) {
    match block {
        Block::Paragraph(lines) => {
            let lines: Vec<String> = lines.iter().map(text).collect();
            let _ = writeln!(html, "<p>{}</p>", lines.join("<br>\n"));
        }
        Block::Subheading(t) => {
            let _ = writeln!(html, "<h3>{}</h3>", text(t));
        }
        Block::List(items) => {
            html.push_str("<ul>\n");
            for item in items {
                let _ = write!(html, "<li>{}", text(&item.text));
                if !item.under.is_empty() {
                    html.push_str("<ul>");
                    for under in &item.under {
                        let _ = write!(html, "<li>{}</li>", text(under));
                    }
                    html.push_str("</ul>");
                }
                html.push_str("</li>\n");
            }
            html.push_str("</ul>\n");
        }
        Block::Warning { text: lead, items } => {
            let _ = write!(html, "<blockquote><p>{}</p>", text(lead));
            if !items.is_empty() {
                let items: Vec<String> = items
                    .iter()
                    .map(|i| format!("<li>{}</li>", text(i)))
                    .collect();
                let _ = write!(html, "<ul>{}</ul>", items.join(""));
            }
            html.push_str("</blockquote>\n");
        }
        Block::Table(t) => table_into(html, t),
        Block::Figure(f) => figure_into(html, f),
        Block::Missing(t) => {
            let _ = writeln!(html, "<p class=\"missing\">{}</p>", text(t));
        }
    }
}

fn table_into(html: &mut String, t: &Table) {
    html.push_str("<div class=\"wide\"><table>\n<thead><tr>");
    for c in &t.columns {
        let _ = write!(html, "<th>{}</th>", text(&c.title));
    }
    html.push_str("</tr></thead>\n<tbody>\n");
    for row in &t.rows {
        html.push_str("<tr>");
        for (j, (cell, column)) in row.iter().zip(&t.columns).enumerate() {
            let class = match (column.align, t.unwrapped == Some(j)) {
                (Align::Right, _) => " class=\"num\"",
                (Align::Left, true) => " class=\"unwrapped\"",
                (Align::Left, false) => "",
            };
            let _ = write!(html, "<td{class}>{}</td>", text(cell));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</tbody></table></div>\n");
}

fn figure_into(html: &mut String, f: &Figure) {
    let mut caption: Vec<String> = Vec::new();
    if !f.key.is_empty() {
        let key: Vec<String> = f
            .key
            .iter()
            .map(|s| {
                let (r, g, b) = s.rgb;
                format!(
                    "<span style=\"color:rgb({r},{g},{b})\">&#9632;</span> {}",
                    escape(&s.label)
                )
            })
            .collect();
        caption.push(key.join(" &nbsp; "));
    }
    if let Some(t) = &f.caption {
        caption.push(text(t));
    }
    let caption = if caption.is_empty() {
        String::new()
    } else {
        format!("<figcaption>{}</figcaption>", caption.join("; "))
    };
    let _ = writeln!(html, "<figure>{}{caption}</figure>", f.svg);
}

/// Spans as HTML: everything escaped, code and strong marked.
fn text(t: &Text) -> String {
    t.0.iter()
        .map(|s| match s {
            Span::Plain(s) => escape(s),
            Span::Code(s) => format!("<code>{}</code>", escape(s)),
            Span::Strong(s) => format!("<strong>{}</strong>", escape(s)),
        })
        .collect()
}

pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
