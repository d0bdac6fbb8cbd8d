//! What the sources themselves must show (issue 49): short functions, and a run log read from disk
//! only where a past run is opened. Counted from `src/` as it ships (test modules left out).
use crate::layering::{rust_files, shipped_part, src_dir};

/// The longest a function may be without its reason beside it.
const LONG: usize = 150;
/// The words that give a long function's reason, in its doc comment.
const REASON: &str = "Over 150 lines on purpose";
/// At most this many functions may be long, each with its reason.
const MOST_LONG: usize = 2;

/// Every `fn` of `text` with its first line (1-based), its length in lines from its signature to
/// the closing brace at its own indent (rustfmt's layout), and the doc comment above it.
fn functions(text: &str) -> Vec<(String, usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(name) = fn_name(trimmed) else {
            continue;
        };
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            continue; // a declaration in a trait: no body
        }
        let close = format!("{indent}}}");
        let Some(end) = (open + 1..lines.len()).find(|&j| lines[j] == close) else {
            continue;
        };
        let doc: Vec<&str> = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("///") || t.starts_with("#[")
            })
            .copied()
            .collect();
        out.push((name, i + 1, end - i + 1, doc.join("\n")));
    }
    out
}

/// The name of the function a line declares, if it declares one.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
        rest = rest.strip_prefix("async ").unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    Some(name[..end].to_owned())
}

#[test]
fn the_function_scanner_measures_from_signature_to_closing_brace() {
    let text = "/// Short.\nfn a() {\n    x();\n}\n\n    /// Over 150 lines on purpose: a test.\n    pub(super) async fn b(\n        y: u32,\n    ) -> u32 {\n        if y {\n        }\n    }\ntrait T {\n    fn c(&self);\n}\n";
    let found = functions(text);
    let got: Vec<(&str, usize, usize, bool)> = found
        .iter()
        .map(|(n, at, len, doc)| (n.as_str(), *at, *len, doc.contains(REASON)))
        .collect();
    assert_eq!(got, [("a", 2, 3, false), ("b", 7, 6, true)]);
}

/// Architecture Invariant: at most two functions are over 150 lines, each with its reason in its
/// doc comment; any other long function is split along its seams.
#[test]
fn at_most_two_functions_are_long_and_each_says_why() {
    let mut long = Vec::new();
    for (file, text) in shipped_sources() {
        for (name, at, len, doc) in functions(&text) {
            if len > LONG {
                long.push((
                    format!("{file}:{at} {name} ({len} lines)"),
                    doc.contains(REASON),
                ));
            }
        }
    }
    eprintln!("functions over {LONG} lines: {long:?}");
    let unexplained: Vec<&String> = long
        .iter()
        .filter(|(_, why)| !why)
        .map(|(f, _)| f)
        .collect();
    assert!(
        unexplained.is_empty(),
        "functions over {LONG} lines without \"{REASON}\" in their doc comment: {unexplained:?}"
    );
    assert!(
        long.len() <= MOST_LONG,
        "{} functions over {LONG} lines (at most {MOST_LONG}): {long:?}",
        long.len()
    );
}

/// The places that read a run log from disk, each to open a past run (a report, a resume, the
/// server's lookups, the context pack's and history's scans, the store's cited logs). The run
/// being written reads its records from memory (`RunLog::records`).
const PAST_RUN_OPENERS: &[&str] = &[
    "run/engine/folder.rs",
    "mcp/lookup.rs",
    "agent/context.rs",
    "pack/history.rs",
    "log/store/cited.rs",
];

/// Architecture Invariant: a run reads itself from memory; a log is read from disk at 6 places at
/// most, each opening a past run. (A guided tune reading its own log is caught at run time by
/// `search::guided_search_proposes_from_profiled_bottlenecks_and_stops`.)
#[test]
fn a_log_is_read_from_disk_only_where_a_past_run_is_opened() {
    let mut sites = Vec::new();
    for (file, text) in shipped_sources() {
        if file.starts_with("log/runlog/") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.contains("runlog::read(") || line.contains("runlog::read_sealed(") {
                sites.push((file.clone(), n + 1));
            }
        }
    }
    let elsewhere: Vec<_> = sites
        .iter()
        .filter(|(f, _)| !PAST_RUN_OPENERS.contains(&f.as_str()))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "a run log read from disk outside the places that open a past run: {elsewhere:?}"
    );
    assert!(
        sites.len() <= 6,
        "{} places read a log from disk: {sites:?}",
        sites.len()
    );
}

/// Architecture Invariant: the console may go away (`tune 2>&1 | head`): nothing in `src/` prints
/// with `println!`, `print!`, `eprintln!` or `eprint!`, which panic on a closed pipe and lose the
/// run's end; `say!`, `tell!` and `os::console` ignore it.
#[test]
fn nothing_prints_with_a_macro_that_panics_on_a_closed_pipe() {
    let mut found = Vec::new();
    for (file, text) in shipped_sources() {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for mac in ["println!(", "print!(", "eprintln!(", "eprint!("] {
                let at = code.match_indices(mac).any(|(i, _)| {
                    !code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                });
                if at {
                    found.push(format!("{file}:{} {mac}", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "printing that panics on a closed pipe: {found:?}"
    );
}

/// Architecture Invariant: the report is one typed document. Nothing in `src/` reads a report
/// it wrote back (`report.md`, `summary.md`, a step's `step-N.md`) or takes Markdown apart
/// (`"\n## "`, a `| ` row split): the page and the terminal are emitters of the document. The one
/// read left is an agent session's report after a resume, gathering the steps an earlier process
/// wrote (a past run's words, copied, not parsed).
#[test]
fn no_code_reads_a_report_back_or_takes_markdown_apart() {
    let mut found = Vec::new();
    for (file, text) in shipped_sources() {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let reads_markdown = code.contains("read_to_string") && code.contains(".md");
            let parses_markdown = code.contains(r##"split("\n## ")"##)
                || code.contains(r###"starts_with("## ")"###)
                || code.contains(r#"starts_with('|')"#);
            if reads_markdown || parses_markdown {
                found.push(format!("{file}:{}", n + 1));
            }
        }
    }
    assert!(
        found.iter().all(|f| f.starts_with("agent/mod.rs:")) && found.len() <= 1,
        "a report read back or Markdown taken apart: {found:?}"
    );
}

/// Every file of `src/` as it ships (up to its first `#[cfg(test)]`), named relative to `src/`.
fn shipped_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let rel = f.strip_prefix(src_dir()).unwrap().display().to_string();
            (rel, shipped_part(&text).to_owned())
        })
        .collect()
}
