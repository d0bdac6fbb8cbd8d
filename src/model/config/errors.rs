//! Strict TOML reading, with every error placed at its file, line, column and key.
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use std::path::Path;

pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::BadInput(format!("cannot read {}: {e}", path.display())))
}

/// Deserialize strictly; a failure becomes an [`Error::Config`] pointing at the offending key.
pub fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|err| toml_error(path, text, err))
}

fn toml_error(path: &Path, text: &str, err: toml::de::Error) -> Error {
    let (line, column) = err
        .span()
        .map(|span| line_column(text, span.start))
        .unwrap_or((1, 1));
    // toml only prints the key path when it has no source to show, so ask for that rendering.
    let mut keyless = err.clone();
    keyless.set_input(None);
    let rendered = keyless.to_string();
    let mut key = rendered
        .lines()
        .find_map(|l| l.strip_prefix("in `").and_then(|k| k.strip_suffix('`')))
        .map(str::to_owned)
        .unwrap_or_default();
    let message = err.message().trim().to_owned();
    if let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    {
        key = if key.is_empty() {
            field.to_owned()
        } else {
            format!("{key}.{field}")
        };
    }
    let mut message = message;
    if key.is_empty() {
        // Inside an array or inline table the line holds no key of its own (or another key's,
        // when the value was never closed): name the value's key, and where it opened.
        let offset = err.span().map_or(0, |span| span.start);
        match open_value_at(text, offset) {
            Some((open_key, open_line)) => {
                key = open_key;
                if open_line < line {
                    message =
                        format!("{message} (in the value of `{key}` opened at line {open_line})");
                }
            }
            None => key = key_on_line(text, line).unwrap_or_else(|| "?".into()),
        }
    }
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key,
        message,
    }
}

/// The key whose array or inline-table value is still open at byte `offset`, with its table, and
/// the line its value opened on; `None` at the top level.
fn open_value_at(text: &str, offset: usize) -> Option<(String, usize)> {
    let mut table = String::new();
    let mut open: Option<(String, usize)> = None;
    let mut depth = 0usize;
    let mut consumed = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if consumed > offset {
            break;
        }
        let code = without_comment(line);
        let trimmed = code.trim();
        if depth == 0 {
            if let Some(name) = table_header(trimmed).filter(|_| !trimmed.contains('=')) {
                table = name.to_owned();
            }
        }
        let mut in_string: Option<char> = None;
        let mut after_equals = false;
        for (j, c) in code.char_indices() {
            if consumed + j >= offset {
                break;
            }
            match (in_string, c) {
                (Some(q), c) if c == q => in_string = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => in_string = Some(c),
                (None, '=') if depth == 0 => after_equals = true,
                (None, '[' | '{') if depth > 0 || after_equals => {
                    if depth == 0 {
                        let key = code[..code.find('=').unwrap_or(0)].trim();
                        let key = if table.is_empty() {
                            key.to_owned()
                        } else {
                            format!("{table}.{key}")
                        };
                        open = Some((key, i + 1));
                    }
                    depth += 1;
                }
                (None, ']' | '}') if depth > 0 => {
                    depth -= 1;
                    if depth == 0 {
                        open = None;
                    }
                }
                _ => {}
            }
        }
        consumed += line.len();
    }
    open.filter(|_| depth > 0)
}

/// A line without its `#` comment (a `#` inside a string is kept).
fn without_comment(line: &str) -> &str {
    let mut in_string: Option<char> = None;
    for (i, c) in line.char_indices() {
        match (in_string, c) {
            (Some(q), c) if c == q => in_string = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => in_string = Some(c),
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// A semantic error about `key` (dotted, e.g. `tolerance.bf16.max_abs`): located at the line that
/// assigns it inside its table, else the first line assigning its last part, else line 1.
pub fn config_error_at_key(path: &Path, text: &str, key: &str, message: String) -> Error {
    let (line, column) = key_in_table(text, key)
        .or_else(|| leaf_anywhere(text, key))
        .unwrap_or((1, 1));
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key: key.to_owned(),
        message,
    }
}

/// A semantic error about `field` of the `[[shapes]]` entry named `shape`: located at that field
/// in that entry (its name line when the field is not written out).
pub fn config_error_in_shape(
    path: &Path,
    text: &str,
    shape: &str,
    field: &str,
    message: String,
) -> Error {
    let lines: Vec<&str> = text.lines().collect();
    let names_it = |l: &&str| {
        l.split_once('=').is_some_and(|(k, v)| {
            k.trim() == "name" && v.trim().trim_matches(|c| c == '"' || c == '\'') == shape
        })
    };
    let location = lines.iter().position(names_it).map(|at| {
        let start = lines[..at]
            .iter()
            .rposition(|l| table_header(l).is_some())
            .map_or(0, |h| h + 1);
        let end = lines[at + 1..]
            .iter()
            .position(|l| table_header(l).is_some())
            .map_or(lines.len(), |n| at + 1 + n);
        (start..end)
            .find(|&i| assigns(lines[i], field))
            .unwrap_or(at)
    });
    let (line, column) = location.map_or((1, 1), |i| (i + 1, indent(lines[i]) + 1));
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key: format!("shapes.{field}"),
        message,
    }
}

/// `[table]` or `[[table]]` → `table`.
fn table_header(line: &str) -> Option<&str> {
    let t = line.trim();
    let inner = t.strip_prefix('[')?.trim_start_matches('[');
    let end = inner.find(']')?;
    Some(inner[..end].trim())
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Whether `line` is `key = ...`.
fn assigns(line: &str, key: &str) -> bool {
    line.trim_start()
        .strip_prefix(key)
        .is_some_and(|rest| rest.trim_start().starts_with('='))
}

/// The table header named `key` (or one under it), or `rest = ` under the longest table prefix of `key`.
fn key_in_table(text: &str, key: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let under = format!("{key}.");
    if let Some(i) = lines
        .iter()
        .position(|l| table_header(l).is_some_and(|t| t == key || t.starts_with(&under)))
    {
        return Some((i + 1, indent(lines[i]) + 1));
    }
    let parts: Vec<&str> = key.split('.').collect();
    for split in (1..parts.len()).rev() {
        let (table, rest) = (parts[..split].join("."), parts[split..].join("."));
        let Some(h) = lines
            .iter()
            .position(|l| table_header(l) == Some(table.as_str()))
        else {
            continue;
        };
        for (i, l) in lines.iter().enumerate().skip(h + 1) {
            if table_header(l).is_some() {
                break;
            }
            if assigns(l, &rest) {
                return Some((i + 1, indent(l) + 1));
            }
        }
    }
    None
}

/// The first line assigning the key's last part, or a table whose name starts with it.
fn leaf_anywhere(text: &str, key: &str) -> Option<(usize, usize)> {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    text.lines().enumerate().find_map(|(i, l)| {
        let trimmed = l.trim_start();
        let is_table = trimmed.trim_start_matches('[').starts_with(leaf);
        (assigns(l, leaf) || is_table).then_some((i + 1, indent(l) + 1))
    })
}

/// A semantic error about a value: located where `needle` first appears in the file.
pub fn config_error_at_text(
    path: &Path,
    text: &str,
    needle: &str,
    key: &str,
    message: String,
) -> Error {
    match text.find(needle) {
        Some(offset) => {
            let (line, column) = line_column(text, offset);
            Error::Config {
                file: path.to_path_buf(),
                line,
                column,
                key: key.to_owned(),
                message,
            }
        }
        None => config_error_at_key(path, text, key, message),
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The dotted key assigned on `line`, qualified by the table header above it.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let index = line.checked_sub(1)?;
    let l = lines.get(index)?;
    let (key, _) = l.split_once('=')?;
    let table = lines[..index]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{}", key.trim()),
        _ => key.trim().to_owned(),
    })
}
