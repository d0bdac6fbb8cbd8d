//! The seal on what flashtune writes for itself to trust later: a key kept outside every project,
//! and keyed BLAKE3 hashes with it, chained line to line over a run log (beside it, in
//! `log.jsonl.seal`) and taken over each results-store row.
//!
//! An agent runs as the same user as flashtune and can write `runs/`. It cannot forge a seal without
//! the key, which lives in a per-user state folder ([`key_dir`]) that the sandbox hides from agents.
//! So a line edited, inserted or removed, a log written from scratch, or a store row changed, no
//! longer matches its seal, and the readers that feed agents and `--reuse` name it and leave it out.
use anyhow::{bail, Context, Result};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Names the folder that holds the key (tests point it at a folder of their own).
pub const KEY_DIR_ENV: &str = "FLASHTUNE_SEAL_KEY_DIR";
const KEY_FILE: &str = "seal.key";
const KEY_BYTES: usize = 32;
/// Where a run log's chain starts (with its run id): no seal of one log fits another.
const LOG_DOMAIN: &[u8] = b"flashtune run log seal 1";
/// What a store row's seal is taken over first: a row seal can never pass for a log line's.
const ROW_DOMAIN: &[u8] = b"flashtune store row seal 1";

/// The folder holding the seal key, outside any project: `$FLASHTUNE_SEAL_KEY_DIR`, else
/// `$XDG_STATE_HOME/flashtune`, else `~/.local/state/flashtune`. A sandbox names it to hide it.
pub fn key_dir() -> Result<PathBuf> {
    let set = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = set(KEY_DIR_ENV) {
        return Ok(dir);
    }
    if let Some(state) = set("XDG_STATE_HOME").filter(|p| p.is_absolute()) {
        return Ok(state.join("flashtune"));
    }
    match set("HOME") {
        Some(home) => Ok(home.join(".local/state/flashtune")),
        None => bail!(
            "no folder for flashtune's seal key: HOME is not set; set {KEY_DIR_ENV} to a folder outside any project"
        ),
    }
}

/// The file of the key in `dir`.
pub fn key_path(dir: &Path) -> PathBuf {
    dir.join(KEY_FILE)
}

/// The secret every seal is keyed with. Never printed.
#[derive(Clone)]
pub struct SealKey([u8; KEY_BYTES]);

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    /// The user's key, created on first use.
    pub fn load_or_create() -> Result<SealKey> {
        Self::load_or_create_in(&key_dir()?)
    }

    /// The key in `dir`, created there (mode 0600, from the OS's generator) when there is none.
    /// Two processes creating it at once agree: the file appears whole, by a hard link, or not at all.
    pub fn load_or_create_in(dir: &Path) -> Result<SealKey> {
        let path = key_path(dir);
        if !path.exists() {
            create_key_file(dir, &path)?;
        }
        let bytes = std::fs::read(&path)
            .with_context(|| format!("cannot read the seal key {}", path.display()))?;
        let bytes: [u8; KEY_BYTES] = bytes.as_slice().try_into().map_err(|_| {
            anyhow::anyhow!(
                "{}: not a flashtune seal key ({} bytes, a key has {KEY_BYTES}); move it away and a new key is made (every log sealed with the old one then reads as unsealed)",
                path.display(),
                bytes.len()
            )
        })?;
        Ok(SealKey(bytes))
    }

    /// A key from its bytes (tests).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> SealKey {
        SealKey(bytes)
    }

    /// The keyed hash of `parts`, each length-prefixed so no two splits of the same bytes collide.
    fn hash(&self, parts: &[&[u8]]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        h.finalize()
    }

    /// The seal of one store row: over its fields in order, as text.
    pub fn row_seal(&self, fields: &[&str]) -> String {
        let mut parts: Vec<&[u8]> = vec![ROW_DOMAIN];
        parts.extend(fields.iter().map(|f| f.as_bytes()));
        self.hash(&parts).to_hex().to_string()
    }

    /// Whether `seal` is this key's seal of `fields` (compared in constant time).
    pub fn row_seal_holds(&self, fields: &[&str], seal: &str) -> bool {
        let mut parts: Vec<&[u8]> = vec![ROW_DOMAIN];
        parts.extend(fields.iter().map(|f| f.as_bytes()));
        blake3::Hash::from_hex(seal).is_ok_and(|s| s == self.hash(&parts))
    }
}

fn create_key_file(dir: &Path, path: &Path) -> Result<()> {
    use rand::TryRngCore;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the seal key's folder {}", dir.display()))?;
    let mut key = [0u8; KEY_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut key)
        .context("the OS's random generator gave no seal key")?;
    let tmp = dir.join(format!("{KEY_FILE}.{}.new", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
    let linked = written.and_then(|()| match std::fs::hard_link(&tmp, path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    });
    let _ = std::fs::remove_file(&tmp);
    linked.with_context(|| format!("cannot create the seal key {}", path.display()))
}

/// The seals of a run log's lines, each over the one before and the line's bytes (without its
/// newline): seal_1 over the start (the run id), seal_n over seal_(n-1) and line n.
#[derive(Clone)]
pub struct Chain {
    key: SealKey,
    last: blake3::Hash,
}

impl Chain {
    pub fn start(key: &SealKey, run_id: &str) -> Chain {
        Chain {
            key: key.clone(),
            last: key.hash(&[LOG_DOMAIN, run_id.as_bytes()]),
        }
    }

    /// Seal the next line; the seal as it is written to the seal file (hex).
    pub fn seal(&mut self, line: &[u8]) -> String {
        self.last = self.next_for(line);
        self.last.to_hex().to_string()
    }

    fn next_for(&self, line: &[u8]) -> blake3::Hash {
        self.key.hash(&[self.last.as_bytes(), line])
    }

    fn next_is(&self, line: &[u8], seal: &str) -> bool {
        blake3::Hash::from_hex(seal.trim()).is_ok_and(|s| s == self.next_for(line))
    }
}

/// A chain that holds: how many lines it covers, and how many lines after them have no seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainHolds {
    /// Lines 1..=sealed match their seals.
    pub sealed: usize,
    /// Lines at the end with no seal yet: the process stopped between writing them and sealing
    /// them (a batch from `append_all` is several lines, sealed together), or someone else appended
    /// them. They are never trusted: readers drop them, as they drop a torn line, and a resumed
    /// run cuts them off.
    pub unsealed_tail: usize,
}

/// Where a chain breaks and what was found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// The first line (1-based) that is not proved flashtune's.
    pub line: usize,
    pub what: String,
}

/// Check `lines` (a log split at its newlines, the empty piece after the last newline left out)
/// against `seals` (the seal file's lines), in order; the first line that fails is named, with
/// what probably happened there.
pub fn check_chain(
    key: &SealKey,
    run_id: &str,
    lines: &[&[u8]],
    seals: &[&str],
) -> std::result::Result<ChainHolds, ChainBreak> {
    let mut chain = Chain::start(key, run_id);
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let Some(seal) = seals.get(i) else {
            return Ok(ChainHolds {
                sealed: i,
                unsealed_tail: lines.len() - i,
            });
        };
        if chain.next_is(line, seal) {
            chain.seal(line);
            continue;
        }
        return Err(ChainBreak {
            line: n,
            what: what_broke(&chain, lines, seals, i),
        });
    }
    if seals.len() > lines.len() {
        return Err(ChainBreak {
            line: lines.len() + 1,
            what: format!(
                "the log ends after line {} but {} lines were sealed: lines were removed from its end",
                lines.len(),
                seals.len()
            ),
        });
    }
    Ok(ChainHolds {
        sealed: lines.len(),
        unsealed_tail: 0,
    })
}

/// At line i+1 (0-based `i`) the chain broke: was a line removed before it, inserted there, or edited?
fn what_broke(chain: &Chain, lines: &[&[u8]], seals: &[&str], i: usize) -> String {
    let n = i + 1;
    // This line is the one sealed next: the line sealed here is gone.
    if let Some(next) = seals.get(i + 1) {
        if let Some(prev) = seals
            .get(i)
            .and_then(|s| blake3::Hash::from_hex(s.trim()).ok())
        {
            let after = Chain {
                key: chain.key.clone(),
                last: prev,
            };
            if after.next_is(lines[i], next) {
                return format!("a line sealed before line {n} was removed");
            }
        }
    }
    // The next line is the one sealed here: this line was put in.
    if lines.get(i + 1).is_some_and(|l| chain.next_is(l, seals[i])) {
        return format!("line {n} was inserted (it has no seal; the line after it has its seal)");
    }
    format!("line {n} does not match its seal: it was edited, or written by something other than flashtune")
}

/// The seal file beside a run log: `log.jsonl.seal`.
pub fn seal_file_of(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".seal");
    log.with_file_name(name)
}

/// A log's bytes split into its lines (newlines dropped), as the chain covers them; a last piece
/// without a newline is a line too (a torn one, or one cut before its newline).
pub fn lines_of(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// The seal file's seals, one per line.
pub fn seals_of(text: &str) -> Vec<&str> {
    text.lines().collect()
}
