//! What the tool runs but did not build, fingerprinted once and checked before each use: the worker binary (its bytes) and the toolchain's folders (every file's path, size, times and inode). A proposer that replaced either would be trusted with the verdict.
//!
//! A check must cost milliseconds: it runs before every worker starts and every nvcc runs. So a
//! file is first compared by its metadata, which no user can forge: its inode, size, mtime and
//! ctime (a write or a rename changes the ctime, and only the kernel sets it). The worker binary,
//! whose bytes were hashed, is hashed again only when its metadata changed (a `touch` with the same
//! bytes is not tampering).
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Identity of one file as the kernel keeps it: device, inode, size, mtime and ctime (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mode: meta.mode(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    fn read(path: &Path) -> std::io::Result<Stamp> {
        std::fs::symlink_metadata(path).map(|m| Stamp::of(&m))
    }
}

/// A trusted file or folder that changed since it was fingerprinted: what it is, the file that
/// changed and how. Its message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} changed while flashtune was running: {} {change}. Something this run started (a \
     proposer, an agent) may have replaced it, and what it measures can no longer be trusted, so \
     the run stops. Put it back ({fix}) and start again; run agents where the sandbox holds \
     (policies.toml [sandbox])",
    path.display()
)]
pub struct Tampered {
    pub what: &'static str,
    pub path: PathBuf,
    pub change: String,
    pub fix: &'static str,
}

/// A single file, by its bytes (blake3) and its stamp.
#[derive(Debug)]
pub struct TrustedFile {
    path: PathBuf,
    what: &'static str,
    fix: &'static str,
    stamp: Stamp,
    hash: blake3::Hash,
}

fn hash_file(path: &Path) -> std::io::Result<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path)?)?;
    Ok(h.finalize())
}

impl TrustedFile {
    /// Fingerprint `path` now: `what` names it in a message, `fix` says how to put it back.
    pub fn take(path: &Path, what: &'static str, fix: &'static str) -> std::io::Result<Self> {
        // The stamp first: a change between the two readings shows as a changed stamp later.
        let stamp = std::fs::metadata(path).map(|m| Stamp::of(&m))?;
        Ok(TrustedFile {
            path: path.to_path_buf(),
            what,
            fix,
            stamp,
            hash: hash_file(path)?,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file still has the bytes it had.
    pub fn check(&self) -> Result<(), Tampered> {
        let tampered = |change: String| Tampered {
            what: self.what,
            path: self.path.clone(),
            change,
            fix: self.fix,
        };
        match std::fs::metadata(&self.path) {
            Ok(m) if Stamp::of(&m) == self.stamp => Ok(()),
            Ok(_) => match hash_file(&self.path) {
                Ok(h) if h == self.hash => Ok(()),
                Ok(_) => Err(tampered("has other bytes".into())),
                Err(e) => Err(tampered(format!("cannot be read ({e})"))),
            },
            Err(e) => Err(tampered(format!("is gone ({e})"))),
        }
    }
}

/// Every file under some folders, by stamp (not by bytes: thousands of files, checked often).
#[derive(Debug, PartialEq)]
pub struct TrustedTree {
    what: &'static str,
    fix: &'static str,
    roots: Vec<PathBuf>,
    files: BTreeMap<PathBuf, Stamp>,
}

/// Every entry under `root` (not following symbolic links: a link is an entry of its own), root
/// included. Unreadable folders are skipped: what cannot be read now is compared as absent later.
fn stamps_under(root: &Path, into: &mut BTreeMap<PathBuf, Stamp>) {
    let Ok(stamp) = Stamp::read(root) else {
        return;
    };
    into.insert(root.to_path_buf(), stamp);
    let mut folders = vec![root.to_path_buf()];
    while let Some(dir) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                folders.push(path.clone());
            }
            into.insert(path, Stamp::of(&meta));
        }
    }
}

impl TrustedTree {
    /// Fingerprint every file under each of `roots` now (a root that does not exist stays absent).
    pub fn take(roots: Vec<PathBuf>, what: &'static str, fix: &'static str) -> Self {
        let mut files = BTreeMap::new();
        for root in &roots {
            stamps_under(root, &mut files);
        }
        TrustedTree {
            what,
            fix,
            roots,
            files,
        }
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// How many entries it covers.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Whether every file is as it was, none added and none removed; the first difference named.
    pub fn check(&self) -> Result<(), Tampered> {
        let mut now = BTreeMap::new();
        for root in &self.roots {
            stamps_under(root, &mut now);
        }
        if now == self.files {
            return Ok(());
        }
        let tampered = |path: &Path, change: &str| Tampered {
            what: self.what,
            path: path.to_path_buf(),
            change: change.to_owned(),
            fix: self.fix,
        };
        // Files before folders: a folder's times change with any entry, and the entry is the news.
        let is_dir = |s: &Stamp| s.mode & libc::S_IFMT == libc::S_IFDIR;
        let files = self.files.iter().filter(|(_, s)| !is_dir(s));
        let folders = self.files.iter().filter(|(_, s)| is_dir(s));
        for (path, stamp) in files {
            match now.get(path) {
                None => return Err(tampered(path, "was removed")),
                Some(s) if s.ino != stamp.ino || s.dev != stamp.dev => {
                    return Err(tampered(path, "was replaced"))
                }
                Some(s) if s != stamp => return Err(tampered(path, "was modified")),
                Some(_) => {}
            }
        }
        if let Some(added) = now.keys().find(|p| !self.files.contains_key(*p)) {
            return Err(tampered(added, "was added"));
        }
        let (path, _) = folders
            .into_iter()
            .find(|(p, s)| now.get(*p) != Some(*s))
            .expect("the trees differ");
        Err(tampered(path, "was changed"))
    }
}
