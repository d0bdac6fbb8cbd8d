//! `report.html`: the Markdown report as one self-contained page (no network: inline CSS, inline SVG plots).
use crate::log::runindex::RunIndex;
use plotters::style::RGBColor;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222}\
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}\
.wide{overflow-x:auto}table{border-collapse:collapse;font-size:13px;margin:8px 0}\
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#f3f3f3;position:sticky;top:0}\
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}tr:nth-child(even) td{background:#fafafa}\
code{font-size:12px}td code{white-space:nowrap}figcaption{font-size:13px;margin-left:80px}blockquote{border-left:4px solid #d62728;margin:0;padding:4px 12px;background:#fff4f4}\
table.variants td:nth-child(2){white-space:nowrap;font-size:11px}figure{margin:12px 0}svg{max-width:100%;height:auto}.missing{color:#666;font-style:italic}";

/// The whole page: the report's sections as HTML, with the best per shape and the plots first, above
/// the table of every variant.
pub fn page(ix: &RunIndex) -> String {
    use crate::report::markdown::SectionId;
    let doc = crate::report::markdown::document(ix);
    let html_of = |id: SectionId| {
        doc.section(id)
            .map_or_else(Vec::new, |s| blocks(&s.markdown))
    };
    // The morning reader wants the answer first: best per shape and the plots go above the table
    // of every variant, which in a big run is hundreds of rows long.
    let mut lead = html_of(SectionId::BestPerShape);
    lead.push(plots(ix));
    let mut page: Vec<String> = html_of(SectionId::Header);
    let mut variants = html_of(SectionId::Variants);
    match variants
        .iter()
        .position(|b| b.starts_with("<div class=\"wide\"><table>"))
    {
        Some(t) => {
            // One line per variant: its id already names the parameters, so that cell need not wrap.
            variants[t] = variants[t].replacen("<table>", "<table class=\"variants\">", 1);
            variants.insert(t, "<h2>Every variant</h2>".into());
            variants.splice(t..t, lead);
            page.extend(variants);
        }
        None => {
            page.extend(variants);
            page.extend(lead);
        }
    }
    for s in doc.sections.iter().filter(|s| {
        !matches!(
            s.id,
            SectionId::Header | SectionId::Variants | SectionId::BestPerShape
        )
    }) {
        page.extend(blocks(&s.markdown));
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{}\n</body>\n</html>\n",
        escape(&doc.title),
        page.join("\n")
    )
}

fn plots(ix: &RunIndex) -> String {
    let found = crate::report::findings::best_per_shape(ix);
    let (traces, last_timed) = crate::report::findings::champion_traces(ix);
    let key = dtype_key(ix);
    let figures = [
        crate::report::plots::speedup(
            &found,
            "Best variant vs the fastest PyTorch SDPA backend: PyTorch's median ÷ the best's",
            |r| Some(r.fastest_torch_us? / r.best.as_ref()?.1),
        )
        .map(|f| (f, key.clone())),
        crate::report::plots::speedup(
            &found,
            "Best variant vs the space's baseline variant: the baseline's median ÷ the best's",
            |r| Some(r.baseline_us? / r.best.as_ref()?.1),
        )
        .map(|f| (f, key.clone())),
        crate::report::plots::roofline(ix, &found.ceilings).map(|f| (f, String::new())),
        crate::report::plots::champions_over_time(&traces, last_timed).map(|f| {
            (
                f,
                "<figcaption>Only figures that may decide a champion: timed on a GPU neither throttled nor shared, by variants no fault bars from the shape.</figcaption>".into(),
            )
        }),
        crate::report::plots::sentinel_over_time(&crate::report::findings::sentinel_traces(ix))
            .map(|f| (f, String::new())),
        crate::report::plots::state_over_time(&crate::report::findings::gpu_states(ix)).map(|f| (f, String::new())),
    ];
    let mut html = String::from("<h2>Plots</h2>\n");
    if figures.iter().all(Option::is_none) {
        html.push_str("<p class=\"missing\">No timed records in this log: nothing to plot.</p>\n");
        return html;
    }
    if found.rows.iter().all(|r| r.fastest_torch_us.is_none()) {
        html.push_str("<p class=\"missing\">PyTorch SDPA was not measured in this run: no speedup against it.</p>\n");
    }
    if !traces.is_empty() && traces.iter().all(|t| t.points.len() < 2) {
        html.push_str("<p class=\"missing\">No champion changed during the run (each shape's first figure that could decide it stayed the best): no plot over time.</p>\n");
    }
    if found.ceilings.is_empty() {
        html.push_str("<p class=\"missing\">Ceilings not measured in this run: the roofline has no roof.</p>\n");
    }
    for (figure, caption) in figures.into_iter().flatten() {
        match figure {
            Ok(svg) => html.push_str(&format!("<figure>{svg}{caption}</figure>\n")),
            Err(why) => html.push_str(&format!(
                "<p class=\"missing\">A plot could not be drawn: {}</p>\n",
                escape(&why)
            )),
        }
    }
    html
}

/// The dtype colours of the bar charts, as a caption (a legend inside would cover bars).
fn dtype_key(ix: &RunIndex) -> String {
    let dtypes = ix.header.map(|h| h.dtypes.clone()).unwrap_or_default();
    let items: Vec<String> = dtypes
        .iter()
        .map(|&d| {
            let RGBColor(r, g, b) = crate::report::plots::dtype_color(d);
            format!("<span style=\"color:rgb({r},{g},{b})\">&#9632;</span> {d}")
        })
        .collect();
    format!(
        "<figcaption>{}; bars start at 1.0 (as fast); the label is the ratio.</figcaption>",
        items.join(" &nbsp; ")
    )
}

/// Our Markdown subset, block by block: headings, tables, lists, quotes, paragraphs.
fn blocks(md: &str) -> Vec<String> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let run = |prefix: &str, from: usize| {
            lines[from..]
                .iter()
                .take_while(|l| l.starts_with(prefix))
                .count()
        };
        if line.trim().is_empty() {
            i += 1;
        } else if let Some((level, text)) = heading(line) {
            out.push(format!("<h{level}>{}</h{level}>", inline(text)));
            i += 1;
        } else if line.starts_with('|') {
            let n = run("|", i);
            out.push(table(&lines[i..i + n]));
            i += n;
        } else if line.starts_with("- ") {
            let n = run("- ", i);
            let items: Vec<String> = lines[i..i + n]
                .iter()
                .map(|l| format!("<li>{}</li>", inline(&l[2..])))
                .collect();
            out.push(format!("<ul>\n{}\n</ul>", items.join("\n")));
            i += n;
        } else if line.starts_with("> ") {
            let n = run("> ", i);
            let text: Vec<String> = lines[i..i + n].iter().map(|l| inline(&l[2..])).collect();
            out.push(format!("<blockquote>{}</blockquote>", text.join(" ")));
            i += n;
        } else {
            let n = lines[i..]
                .iter()
                .take_while(|l| {
                    !l.trim().is_empty()
                        && heading(l).is_none()
                        && !l.starts_with(['|', '>'])
                        && !l.starts_with("- ")
                })
                .count()
                .max(1);
            let text: Vec<String> = lines[i..i + n].iter().map(|l| inline(l)).collect();
            out.push(format!("<p>{}</p>", text.join("<br>\n")));
            i += n;
        }
    }
    out
}

fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.chars().take_while(|&c| c == '#').count();
    (1..=4)
        .contains(&level)
        .then(|| line[level..].strip_prefix(' '))
        .flatten()
        .map(|t| (level, t))
}

/// A pipe table: header row, alignment row (`---:` is right-aligned), body rows.
fn table(rows: &[&str]) -> String {
    let cells: Vec<Vec<String>> = rows.iter().map(|r| split_row(r)).collect();
    let right: Vec<bool> = cells
        .get(1)
        .map(|a| a.iter().map(|c| c.trim_end().ends_with(':')).collect())
        .unwrap_or_default();
    let mut html = String::from("<div class=\"wide\"><table>\n<thead><tr>");
    for c in cells.first().into_iter().flatten() {
        html.push_str(&format!("<th>{}</th>", inline(c)));
    }
    html.push_str("</tr></thead>\n<tbody>\n");
    for row in cells.iter().skip(2) {
        html.push_str("<tr>");
        for (j, c) in row.iter().enumerate() {
            let class = if right.get(j).copied().unwrap_or(false) {
                " class=\"num\""
            } else {
                ""
            };
            html.push_str(&format!("<td{class}>{}</td>", inline(c)));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</tbody></table></div>");
    html
}

/// Cells of `| a | b |`; a `|` inside backticks belongs to the cell (constraint expressions hold `||`).
fn split_row(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = vec![String::new()];
    let mut in_code = false;
    for ch in inner.chars() {
        match ch {
            '`' => {
                in_code = !in_code;
                cells.last_mut().expect("one cell").push(ch);
            }
            '|' if !in_code => cells.push(String::new()),
            _ => cells.last_mut().expect("one cell").push(ch),
        }
    }
    cells.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// `code` and **bold**, everything else escaped.
fn inline(text: &str) -> String {
    let mut html = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            html.push_str(&format!("<code>{}</code>", escape(part)));
            continue;
        }
        for (j, piece) in escape(part).split("**").enumerate() {
            if j % 2 == 1 {
                html.push_str(&format!("<strong>{piece}</strong>"));
            } else {
                html.push_str(piece);
            }
        }
    }
    html
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
