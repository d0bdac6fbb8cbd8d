//! Where flashtune finds a project's files: `policies.toml`, `runs/` and the build cache.
use std::path::{Path, PathBuf};

/// Where flashtune finds its files: the project root holding `policies.toml`.
#[derive(Debug, Clone)]
pub struct ProjectPaths {
    pub root: PathBuf,
}

impl ProjectPaths {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
    pub fn policies(&self) -> PathBuf {
        self.root.join("policies.toml")
    }
    pub fn runs(&self) -> PathBuf {
        self.root.join("runs")
    }
    /// Content-addressed cubins; `FLASHTUNE_CACHE_DIR` moves it (tests share one across projects).
    pub fn build_cache(&self) -> PathBuf {
        match std::env::var_os("FLASHTUNE_CACHE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => self.runs().join(".build-cache"),
        }
    }
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.root.join(p)
        }
    }
}
