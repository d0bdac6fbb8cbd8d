//! Reading a run log back: finding it in a run folder, parsing it with a torn tail forgiven, and walking its records.
use super::record::{Entry, Header, Record, SCHEMA_VERSION};
use crate::model::config::Dtype;
use crate::model::protocol::TimingStats;
use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// A log read back: the entries in order with their 1-based line numbers.
#[derive(Debug, Clone)]
pub struct LoadedLog {
    pub entries: Vec<(usize, Entry)>,
    /// A last line cut short by a crash, ignored.
    pub torn_tail: bool,
}

/// One `timed` record with its line, as the log's readers want it.
pub struct TimedCase<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub timing: &'a TimingStats,
}

impl LoadedLog {
    /// Every `timed` record, in log order.
    pub fn timed(&self) -> impl Iterator<Item = TimedCase<'_>> {
        self.entries.iter().filter_map(|(line, e)| match &e.record {
            Record::Timed {
                variant,
                shape,
                dtype,
                timing,
                ..
            } => Some(TimedCase {
                line: *line,
                variant,
                shape,
                dtype: *dtype,
                timing,
            }),
            _ => None,
        })
    }

    pub fn header(&self) -> Option<&Header> {
        self.entries.iter().find_map(|(_, e)| match &e.record {
            Record::Header(h) => Some(h.as_ref()),
            _ => None,
        })
    }
}

/// Run folders (or files inside them) oldest first. A run id names its start to the second and then
/// a random salt, so two runs started in the same second (two quick judges) sort by the salt; the
/// folder's creation time, where the filesystem keeps one, puts them in the order they started.
pub fn sort_by_start(paths: &mut [PathBuf]) {
    let created = |p: &Path| {
        let dir = if p.is_dir() {
            p
        } else {
            p.parent().unwrap_or(p)
        };
        std::fs::metadata(dir).and_then(|m| m.created()).ok()
    };
    let run_id = |p: &Path| {
        let dir = if p.is_dir() {
            p
        } else {
            p.parent().unwrap_or(p)
        };
        dir.file_name()
            .map(|n| n.to_string_lossy().get(..15).unwrap_or_default().to_owned())
    };
    // The id's second first (a copied folder gets a new creation time), then creation, then name.
    paths.sort_by_cached_key(|p| (run_id(p), created(p), p.clone()));
}

/// The log of a run folder: `log.jsonl`, else a committed measurement's `log.jsonl.gz`.
pub fn path_in(run_dir: &Path) -> PathBuf {
    let plain = run_dir.join("log.jsonl");
    let packed = run_dir.join("log.jsonl.gz");
    if !plain.exists() && packed.exists() {
        packed
    } else {
        plain
    }
}

/// Read a log (gzip-compressed when its name ends in `.gz`), tolerating a torn last line; a bad
/// line elsewhere is corruption and an error.
pub fn read(path: &Path) -> Result<LoadedLog> {
    // Said at debug level so a test can count how often a command reads logs back from disk.
    tracing::debug!(target: "flashtune::log_read", path = %path.display(), "reading a run log from disk");
    let file =
        File::open(path).with_context(|| format!("cannot open run log {}", path.display()))?;
    let reader: Box<dyn std::io::Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let lines: Vec<String> = BufReader::new(reader)
        .lines()
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read run log {}", path.display()))?;
    if let Some(first) = lines.iter().find(|l| !l.trim().is_empty()) {
        refuse_newer_schema(path, first)?;
    }
    let mut entries = Vec::new();
    let mut torn_tail = false;
    let last_nonempty = lines.iter().rposition(|l| !l.trim().is_empty());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Entry>(line) {
            Ok(mut e) => {
                super::legacy::upgrade(&mut e.record);
                entries.push((i + 1, e))
            }
            Err(_) if Some(i) == last_nonempty => torn_tail = true,
            Err(e) => anyhow::bail!("{}:{}: corrupt run log record: {e}", path.display(), i + 1),
        }
    }
    let mut log = LoadedLog { entries, torn_tail };
    super::legacy::upgrade_log(&mut log);
    Ok(log)
}

/// A newer flashtune may have changed what records mean: reading its log as ours would be a guess.
/// Checked on the raw header line, before its records are parsed (they may not parse at all).
fn refuse_newer_schema(path: &Path, first_line: &str) -> Result<()> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(first_line) else {
        return Ok(());
    };
    let version = value
        .get("schema_version")
        .filter(|_| value.get("event").and_then(|e| e.as_str()) == Some("header"))
        .and_then(|v| v.as_u64());
    match version {
        Some(v) if v > u64::from(SCHEMA_VERSION) => anyhow::bail!(
            "{}: written by a newer flashtune (log schema {v}; this flashtune {} reads schema {SCHEMA_VERSION} and older); use a newer flashtune",
            path.display(),
            env!("CARGO_PKG_VERSION")
        ),
        _ => Ok(()),
    }
}
