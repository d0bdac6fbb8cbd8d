//! Writing a run log: each record appended, flushed and sealed before anything depends on it, a failed write undone.
use super::reader::LoadedLog;
use super::record::{Entry, Record};
use super::sealed;
use crate::error::WriteError;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct RunLog {
    file: File,
    pub path: PathBuf,
    started: std::time::Instant,
    /// Seconds already on the clock when a resumed log continues.
    offset: f64,
    /// `log.jsonl.seal`, one seal per line, written with each record; none for a reopened log that
    /// was unsealed already (it stays unsealed).
    seals: Option<sealed::SealFile>,
    /// Every record in the file, with its line: the run's own readers query this, never the file
    /// (a run reads its own log from disk only to resume it).
    kept: LoadedLog,
    /// Lines in the file, the last whole one included.
    lines: usize,
}

impl RunLog {
    /// A new log and its seal file.
    pub fn create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)
            .map_err(|e| WriteError::new("create the run log", path, e))?;
        let seals = sealed::SealFile::create(path)?;
        Ok(RunLog {
            file,
            path: path.to_path_buf(),
            started: std::time::Instant::now(),
            offset: 0.0,
            seals: Some(seals),
            kept: LoadedLog {
                entries: Vec::new(),
                torn_tail: false,
            },
            lines: 0,
        })
    }

    /// Continue an existing log: a torn last line, or whole ones whose seals were never written (the
    /// run stopped between the two), are cut off first, so every line stays whole and sealed. The
    /// file is repaired in place (cut, or one newline appended), never rewritten: on a full disk a
    /// rewrite could lose the very log it was repairing.
    pub fn reopen(path: &Path, loaded: &LoadedLog) -> Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| WriteError::new("append to", path, e))?;
        let reopened = sealed::SealFile::reopen(path, &bytes)?;
        let newlines = |b: &[u8]| b.iter().filter(|&&c| c == b'\n').count();
        let lines = if let Some(keep) = reopened.keep {
            file.set_len(keep)
                .map_err(|e| WriteError::new("cut the unsealed last lines of", path, e))?;
            newlines(&bytes[..keep as usize])
        } else if loaded.torn_tail {
            let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            file.set_len(keep as u64)
                .map_err(|e| WriteError::new("cut the torn last line of", path, e))?;
            newlines(&bytes[..keep])
        } else if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            file.write_all(b"\n")
                .map_err(|e| WriteError::new("append to", path, e))?;
            newlines(&bytes) + 1
        } else {
            newlines(&bytes)
        };
        file.sync_data()
            .map_err(|e| WriteError::new("flush", path, e))?;
        let offset = loaded.entries.last().map_or(0.0, |(_, e)| e.t);
        Ok(RunLog {
            file,
            path: path.to_path_buf(),
            started: std::time::Instant::now(),
            offset,
            seals: reopened.seals,
            // What was cut is not kept either.
            kept: LoadedLog {
                entries: (loaded.entries.iter())
                    .filter(|(line, _)| *line <= lines)
                    .cloned()
                    .collect(),
                torn_tail: false,
            },
            lines,
        })
    }

    /// Every record this log holds, with its line, as a read of the file would give them.
    pub fn records(&self) -> &LoadedLog {
        &self.kept
    }

    /// Lines in the file.
    pub fn lines(&self) -> usize {
        self.lines
    }

    fn keep(&mut self, entry: &Entry) {
        self.lines += 1;
        self.kept.entries.push((self.lines, entry.clone()));
    }

    /// Seal lines just appended; a seal that cannot be written undoes them (the log keeps only
    /// sealed lines), back to `before`.
    fn seal_appended(&mut self, bytes: &[u8], before: Option<u64>) -> Result<()> {
        let Some(seals) = &mut self.seals else {
            return Ok(());
        };
        let sealed = seals.seal(bytes);
        if sealed.is_err() {
            if let Some(len) = before {
                let _ = self.file.set_len(len);
                let _ = self.file.sync_data();
            }
        }
        sealed
    }

    /// Seconds on the run clock now.
    pub fn clock(&self) -> f64 {
        self.offset + self.started.elapsed().as_secs_f64()
    }

    /// Append one record and push it to the disk before returning. A write that fails (a full disk)
    /// is undone to the last whole line, so the log stays a sequence of whole records that `resume`
    /// continues once there is room again; the error names the file and the OS cause.
    pub fn append(&mut self, record: Record) -> Result<Entry> {
        let entry = Entry {
            t: self.offset + self.started.elapsed().as_secs_f64(),
            record,
        };
        let mut line = serde_json::to_vec(&entry)?;
        line.push(b'\n');
        let before = self.file.metadata().map(|m| m.len()).ok();
        let written = match injected_failure(&mut self.file, &line) {
            Some(e) => Err(WriteError::new("append to", &self.path, e)),
            None => self
                .file
                .write_all(&line)
                .map_err(|e| WriteError::new("append to", &self.path, e))
                .and_then(|()| {
                    self.file
                        .sync_data()
                        .map_err(|e| WriteError::new("flush", &self.path, e))
                }),
        };
        if let Err(e) = written {
            // Shrinking needs no free space: cut what part of the line reached the file.
            if let Some(len) = before {
                let _ = self.file.set_len(len);
                let _ = self.file.sync_data();
            }
            return Err(e.into());
        }
        self.seal_appended(&line, before)?;
        self.keep(&entry);
        Ok(entry)
    }

    /// Append many records with one push to the disk: a plan of tens of thousands of points would
    /// otherwise wait on as many syncs (minutes on a slow disk). All or none of them stay.
    pub fn append_all(&mut self, records: Vec<Record>) -> Result<Vec<Entry>> {
        let t = self.offset + self.started.elapsed().as_secs_f64();
        let entries: Vec<Entry> = records
            .into_iter()
            .map(|record| Entry { t, record })
            .collect();
        let mut bytes = Vec::new();
        for entry in &entries {
            serde_json::to_writer(&mut bytes, entry)?;
            bytes.push(b'\n');
        }
        let before = self.file.metadata().map(|m| m.len()).ok();
        append_whole(&mut self.file, &self.path, &bytes)?;
        self.seal_appended(&bytes, before)?;
        for entry in &entries {
            self.keep(entry);
        }
        Ok(entries)
    }
}

/// Append `bytes` and push them to the disk, all or nothing: a write that fails (a full disk) is
/// cut back to the length before it (shrinking needs no free space), and the error names the file.
pub(super) fn append_whole(file: &mut File, path: &Path, bytes: &[u8]) -> Result<()> {
    let before = file.metadata().map(|m| m.len()).ok();
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_data())
        .map_err(|e| WriteError::new("append to", path, e));
    if let Err(e) = written {
        if let Some(len) = before {
            let _ = file.set_len(len);
            let _ = file.sync_data();
        }
        return Err(e.into());
    }
    Ok(())
}

/// Debug builds only (tests): `FLASHTUNE_TEST_FAIL_APPEND=EVENT:N` makes the N-th append of an
/// `EVENT` record in this process write half its line and fail as a full disk does, so CI can show
/// what a full disk does to a run without a filesystem to fill.
#[cfg(debug_assertions)]
fn injected_failure(file: &mut File, line: &[u8]) -> Option<std::io::Error> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    let spec = std::env::var("FLASHTUNE_TEST_FAIL_APPEND").ok()?;
    let (event, n) = spec.split_once(':')?;
    let n: usize = n.parse().ok()?;
    let tag = format!("\"event\":\"{event}\"");
    if !String::from_utf8_lossy(line).contains(&tag) {
        return None;
    }
    if SEEN.fetch_add(1, Ordering::SeqCst) + 1 != n {
        return None;
    }
    let _ = file.write_all(&line[..line.len() / 2]);
    Some(std::io::Error::from_raw_os_error(libc::ENOSPC))
}

#[cfg(not(debug_assertions))]
fn injected_failure(_: &mut File, _: &[u8]) -> Option<std::io::Error> {
    None
}
