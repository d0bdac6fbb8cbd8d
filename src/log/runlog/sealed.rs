//! A run log's seals (`log.jsonl.seal`, one per line, see `seal`): written with each record, and the
//! one reading of a log that agent-facing readers take, [`SealedLog`].
//!
//! Which reader needs seals is decided by the type it takes: the context pack, `history`, `resume`
//! and `--reuse` take a [`SealedLog`] (what an agent could have written must not reach the next
//! agent or a champion table), while reports take a plain [`LoadedLog`]: they are the user's own
//! reading, of committed measurement logs too, which carry no seals.
use super::LoadedLog;
use crate::error::WriteError;
use crate::os::seal::{self, Chain, SealKey};
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// A log whose every line the seal chain proves flashtune wrote (last lines without their seals,
/// left by a crash, are dropped and read as a torn tail).
#[derive(Debug, Clone)]
pub struct SealedLog(LoadedLog);

impl std::ops::Deref for SealedLog {
    type Target = LoadedLog;
    fn deref(&self) -> &LoadedLog {
        &self.0
    }
}

impl SealedLog {
    /// The log, for code that reads any log (reports, the store's backfill after this check).
    pub fn into_log(self) -> LoadedLog {
        self.0
    }
}

/// A log the seals do not prove: its file, the first line that fails (none when the seal file is
/// missing), and what was found.
#[derive(Debug, Clone)]
pub struct Unsealed {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub what: String,
}

impl std::fmt::Display for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(n) => write!(
                f,
                "{}: unsealed at line {n}: {}",
                self.path.display(),
                self.what
            ),
            None => write!(f, "{}: unsealed: {}", self.path.display(), self.what),
        }
    }
}

impl std::error::Error for Unsealed {}

/// The run id a log's chain starts from: its run folder's name, so a sealed log moved to another
/// run folder no longer holds.
fn run_id_of(log: &Path) -> String {
    log.parent()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Read a log and prove it by its seals with the user's key; an `Unsealed` error names the file,
/// the first line that fails and what failed there.
pub fn read_sealed(path: &Path) -> Result<SealedLog> {
    read_sealed_with(path, &SealKey::load_or_create()?)
}

pub fn read_sealed_with(path: &Path, key: &SealKey) -> Result<SealedLog> {
    // Parsed first: a log from a newer flashtune, or a corrupt one, is refused as such.
    let mut log = super::read(path)?;
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let holds = match check(path, &bytes, key)? {
        Ok(holds) => holds,
        Err(unsealed) => return Err(unsealed.into()),
    };
    if holds.unsealed_tail > 0 {
        log.entries.retain(|(line, _)| *line <= holds.sealed);
        log.torn_tail = true;
    }
    Ok(SealedLog(log))
}

/// The chain of the log `bytes` at `path` against its seal file; `Ok(Err(..))` when it does not hold.
fn check(
    path: &Path,
    bytes: &[u8],
    key: &SealKey,
) -> Result<std::result::Result<seal::ChainHolds, Unsealed>> {
    let seal_path = seal::seal_file_of(path);
    let unsealed = |line, what: String| Unsealed {
        path: path.to_path_buf(),
        line,
        what,
    };
    let text = match std::fs::read_to_string(&seal_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Err(unsealed(
                None,
                format!(
                    "it has no seal file {} (a log written by hand or by another program, or before flashtune sealed its logs)",
                    seal_path.display()
                ),
            )))
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", seal_path.display())),
    };
    // A seal cut mid-write by a crash seals nothing: its line counts as unsealed.
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    let lines = seal::lines_of(bytes);
    let seals = seal::seals_of(whole);
    Ok(seal::check_chain(key, &run_id_of(path), &lines, &seals)
        .map_err(|b| unsealed(Some(b.line), b.what)))
}

/// The seal file a log being written keeps beside it.
pub(super) struct SealFile {
    file: File,
    path: PathBuf,
    chain: Chain,
}

/// What `reopen` found of a log's seals.
pub(super) struct Reopened {
    /// The seals to go on with; none for a log that is unsealed (it stays so).
    pub seals: Option<SealFile>,
    /// The length of the sealed lines, when lines after them have no seal: cut like a torn line.
    pub keep: Option<u64>,
}

impl SealFile {
    /// A new log's seal file, created beside it.
    pub(super) fn create(log: &Path) -> Result<SealFile> {
        let key = SealKey::load_or_create().context("cannot seal the run log")?;
        let path = seal::seal_file_of(log);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| WriteError::new("create the run log's seal file", &path, e))?;
        Ok(SealFile {
            file,
            path,
            chain: Chain::start(&key, &run_id_of(log)),
        })
    }

    /// Go on sealing a log whose chain holds; a log that is unsealed is said to be, once, and stays so.
    pub(super) fn reopen(log: &Path, bytes: &[u8]) -> Result<Reopened> {
        let key = SealKey::load_or_create().context("cannot seal the run log")?;
        let holds = match check(log, bytes, &key)? {
            Ok(h) => h,
            Err(unsealed) => {
                crate::tell!(
                    "warning: {unsealed}; records appended to it stay unsealed, and the context pack, history, resume and --reuse do not read it"
                );
                return Ok(Reopened {
                    seals: None,
                    keep: None,
                });
            }
        };
        let lines = seal::lines_of(bytes);
        let mut chain = Chain::start(&key, &run_id_of(log));
        let mut seals = String::new();
        for line in &lines[..holds.sealed] {
            seals.push_str(&chain.seal(line));
            seals.push('\n');
        }
        let path = seal::seal_file_of(log);
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| WriteError::new("append to", &path, e))?;
        // Exactly the seals of the kept lines: a seal torn by the crash is cut off.
        file.set_len(seals.len() as u64)
            .and_then(|()| file.sync_data())
            .map_err(|e| WriteError::new("cut the torn last seal of", &path, e))?;
        let keep = (holds.unsealed_tail > 0).then(|| {
            lines[..holds.sealed]
                .iter()
                .map(|l| l.len() as u64 + 1)
                .sum()
        });
        Ok(Reopened {
            seals: Some(SealFile { file, path, chain }),
            keep,
        })
    }

    /// Seal the lines just written to the log (`bytes`, whole lines each ending in a newline) and
    /// push the seals to the disk. On failure the seal file is cut back and the chain left where
    /// it was, so the caller can cut the log back too.
    pub(super) fn seal(&mut self, bytes: &[u8]) -> Result<()> {
        let mut chain = self.chain.clone();
        let mut seals = String::new();
        for line in seal::lines_of(bytes) {
            seals.push_str(&chain.seal(line));
            seals.push('\n');
        }
        super::append_whole(&mut self.file, &self.path, seals.as_bytes())?;
        self.chain = chain;
        Ok(())
    }
}
