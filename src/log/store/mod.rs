//! The results store `runs/results.sqlite`: every measurement of every run, keyed on what makes two figures comparable, for `tune --reuse`, the best-first order of budgeted runs and `history`.
//!
//! A measurement matches a later case when the GPU model, driver, nvcc banner, shape geometry and
//! dtype are the same and so are the content addresses of both builds it stood on: the forward
//! kernel that was timed and the reference kernel it was checked against. A build's address (see
//! `build::Builder::key`) hashes exactly the files its source's `#include` closure reaches, its
//! defines (the variant's parameters, dtype, head dim), flags, nvcc and target: an edit to one kernel
//! file changes the address of exactly the builds that include it, and so retires exactly their rows.
//! Rows are never deleted; a row that no longer matches is history.
//!
//! The run log stays the record. The store is filled from it, as each record is logged or afterwards
//! (`report`, `resume`), from sealed logs only, and a row names the run and log line it came from; a
//! store that cannot be opened or written costs the reuse and the ordering, never the run.
//!
//! Every row is sealed with the user's key (`row`): a row whose seal does not hold (edited in the
//! file, written by hand, or from before rows were sealed) is never read, and the first is said.

use crate::model::config::{Dtype, Shape};
use crate::model::protocol::TimingStats;
use crate::model::space::Params;
use crate::os::seal::SealKey;
use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod baselines;
mod cited;
mod row;
mod write;
pub use baselines::{LibraryKey, StoredBaseline};
pub use cited::CitedLogs;
pub use row::Row;
pub use write::{backfill, Recorder};

/// Where the store lives, beside the run folders (ignored by git with the rest of `runs/`).
pub fn path(paths: &crate::model::config::ProjectPaths) -> PathBuf {
    paths.runs().join("results.sqlite")
}

/// The schema this flashtune writes; a store written by a newer one is left alone. 2: measurement
/// rows carry a seal (a store of schema 1 gains the column; its rows, unsealed, are not read until
/// `flashtune report <run>` writes them again from a sealed log).
const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    started_at TEXT NOT NULL,
    git_head TEXT,
    gpu TEXT NOT NULL,
    driver INTEGER NOT NULL,
    nvcc TEXT NOT NULL,
    arch TEXT NOT NULL,
    fake INTEGER NOT NULL,
    space TEXT NOT NULL,
    kernel_sources_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS measurements (
    run_id TEXT NOT NULL,
    log_line INTEGER NOT NULL,
    gpu TEXT NOT NULL,
    driver INTEGER NOT NULL,
    nvcc TEXT NOT NULL,
    fake INTEGER NOT NULL,
    build_key TEXT NOT NULL,
    reference_key TEXT NOT NULL,
    variant TEXT NOT NULL,
    params TEXT NOT NULL,
    shape TEXT NOT NULL,
    geometry TEXT NOT NULL,
    dtype TEXT NOT NULL,
    kv_splits INTEGER NOT NULL,
    median_us REAL NOT NULL,
    p10_us REAL NOT NULL,
    p90_us REAL NOT NULL,
    tflops REAL NOT NULL,
    timing TEXT NOT NULL,
    origin_run TEXT NOT NULL,
    origin_line INTEGER NOT NULL,
    seal TEXT,
    PRIMARY KEY (run_id, log_line)
);
CREATE INDEX IF NOT EXISTS measurements_match
    ON measurements (build_key, reference_key, geometry, dtype, gpu, driver, nvcc, fake);
CREATE INDEX IF NOT EXISTS measurements_geometry ON measurements (geometry, dtype);
CREATE TABLE IF NOT EXISTS profiles (
    run_id TEXT NOT NULL,
    log_line INTEGER NOT NULL,
    gpu TEXT NOT NULL,
    fake INTEGER NOT NULL,
    variant TEXT NOT NULL,
    params TEXT NOT NULL,
    shape TEXT NOT NULL,
    geometry TEXT NOT NULL,
    dtype TEXT NOT NULL,
    bottlenecks TEXT NOT NULL,
    PRIMARY KEY (run_id, log_line)
);
";

/// A shape by what the kernel computes, not by its name: names are the policy's and may change.
pub fn geometry(s: &Shape) -> String {
    format!(
        "b{} h{} sq{} sk{} d{} {}",
        s.b,
        s.h,
        s.sq,
        s.sk,
        s.d,
        s.causal.name()
    )
}

/// Everything a stored measurement must share with a case to stand for it.
#[derive(Debug, Clone)]
pub struct Key<'a> {
    pub gpu: &'a str,
    pub driver: i32,
    pub nvcc: &'a str,
    pub fake: bool,
    /// Content address of the forward build timed.
    pub build_key: &'a str,
    /// Content address of the reference build it was checked against.
    pub reference_key: &'a str,
    pub geometry: &'a str,
    pub dtype: Dtype,
}

/// A stored measurement that matches a case: its sealed row (whose `origin_run` and `origin_line`
/// name the measurement itself; a reused row points past itself to it) and its timing.
#[derive(Debug, Clone)]
pub struct Stored {
    pub row: Row,
    pub timing: TimingStats,
}

/// The fastest row of one earlier run on one (shape geometry, dtype).
#[derive(Debug, Clone)]
pub struct StoredChampion {
    pub run_id: String,
    pub started_at: String,
    pub geometry: String,
    pub dtype: Dtype,
    pub variant: String,
    pub params: Params,
    pub median_us: f64,
}

/// A stored row of one variant, for the best-first order's notes on what a budget left out.
#[derive(Debug, Clone)]
pub struct Figure {
    pub geometry: String,
    pub dtype: Dtype,
    pub median_us: f64,
    pub origin_run: String,
    pub origin_line: usize,
    pub build_key: String,
    pub reference_key: String,
    pub driver: i32,
    pub nvcc: String,
}

/// One run's champion on one (shape, dtype), for `history`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryRow {
    pub run_id: String,
    pub started_at: String,
    pub git_head: Option<String>,
    pub gpu: String,
    pub fake: bool,
    pub dtype: Dtype,
    pub variant: String,
    pub median_us: f64,
    pub tflops: f64,
    /// Where the figure was measured: this run, or the earlier run it was reused from.
    pub origin_run: String,
    pub origin_line: usize,
}

pub struct Store {
    conn: Connection,
    pub path: PathBuf,
    key: SealKey,
    /// Whether the rows whose seal does not hold were said already (once per store).
    unsealed_said: std::cell::Cell<bool>,
}

fn dtype_of(s: &str) -> Option<Dtype> {
    match s {
        "f16" => Some(Dtype::F16),
        "bf16" => Some(Dtype::Bf16),
        _ => None,
    }
}

impl Store {
    /// Open the store, creating it (and its tables) when it is not there yet.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let conn = Connection::open(path)
            .with_context(|| format!("cannot open the results store {}", path.display()))?;
        Self::prepare(conn, path)
    }

    /// Open the store only if it exists (readers: `history`, the best-first order without --reuse).
    pub fn open_existing(path: &Path) -> Result<Option<Store>> {
        if !path.is_file() {
            return Ok(None);
        }
        Self::open(path).map(Some)
    }

    fn prepare(conn: Connection, path: &Path) -> Result<Store> {
        let at = || format!("results store {}", path.display());
        // Two runs on two GPUs may write at once: WAL lets readers go on, the timeout queues writers.
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .with_context(at)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .with_context(at)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .with_context(at)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .with_context(at)?;
        if version > SCHEMA_VERSION {
            anyhow::bail!(
                "{}: written by a newer flashtune (store schema {version}; this one writes {SCHEMA_VERSION}); use a newer flashtune, or move the file away to start a new store",
                path.display()
            );
        }
        let key = SealKey::load_or_create().context("cannot check the results store's seals")?;
        if version == 1 {
            conn.execute_batch("ALTER TABLE measurements ADD COLUMN seal TEXT")
                .with_context(at)?;
        }
        conn.execute_batch(SCHEMA).with_context(at)?;
        conn.execute_batch(baselines::SCHEMA).with_context(at)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .with_context(at)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
            key,
            unsealed_said: std::cell::Cell::new(false),
        })
    }

    /// The measurement rows `filter` (an SQL condition over `params`) picks whose seal holds, in
    /// the order they were written; the rest are left out and, the first time, said.
    fn sealed_rows(&self, filter: &str, params: &[&dyn rusqlite::ToSql]) -> Result<Vec<Row>> {
        let sql = format!(
            "SELECT {}, seal FROM measurements WHERE {filter} ORDER BY rowid",
            row::COLUMNS
        );
        let mut stmt = self
            .conn
            .prepare(&sql)
            .with_context(|| format!("cannot read {}", self.path.display()))?;
        let rows = stmt.query_map(params, Row::read)?;
        let (mut sealed, mut broken) = (Vec::new(), Vec::new());
        for r in rows {
            let (row, seal) = r?;
            if row.seal_holds(&self.key, seal.as_deref()) {
                sealed.push(row);
            } else {
                broken.push(row);
            }
        }
        if let Some(first) = broken.first() {
            if !self.unsealed_said.replace(true) {
                crate::tell!(
                    "warning: {}: {} measurement row(s) whose seal does not hold are not used (edited in the file, or written before rows were sealed), the first of run {} line {}; `flashtune report <run>` writes a sealed run's rows again",
                    self.path.display(),
                    broken.len(),
                    first.run_id,
                    first.log_line
                );
            }
        }
        Ok(sealed)
    }

    /// The newest sealed measurement that matches `key`, if any.
    pub fn lookup(&self, key: &Key) -> Result<Option<Stored>> {
        let rows = self.sealed_rows(
            "build_key = ?1 AND reference_key = ?2 AND geometry = ?3 AND dtype = ?4
             AND gpu = ?5 AND driver = ?6 AND nvcc = ?7 AND fake = ?8",
            params![
                key.build_key,
                key.reference_key,
                key.geometry,
                key.dtype.name(),
                key.gpu,
                key.driver,
                key.nvcc,
                key.fake
            ],
        )?;
        let Some(row) = rows.into_iter().next_back() else {
            return Ok(None);
        };
        let timing: TimingStats = serde_json::from_str(&row.timing).with_context(|| {
            format!(
                "{}: unreadable timing of run {} line {}",
                self.path.display(),
                row.origin_run,
                row.origin_line
            )
        })?;
        Ok(Some(Stored { row, timing }))
    }

    /// When each run started, its commit, and the order runs were added in.
    fn runs(&self) -> Result<BTreeMap<String, (String, Option<String>, i64)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT run_id, started_at, git_head, rowid FROM runs")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Each earlier run's fastest variant per (shape geometry, dtype) on this GPU model, newest run first.
    pub fn champions(&self, gpu: &str, fake: bool) -> Result<Vec<StoredChampion>> {
        let runs = self.runs()?;
        let mut fastest: BTreeMap<(String, String, String), Row> = BTreeMap::new();
        for row in self.sealed_rows("gpu = ?1 AND fake = ?2", params![gpu, fake])? {
            if !runs.contains_key(&row.run_id) {
                continue;
            }
            let group = (row.run_id.clone(), row.geometry.clone(), row.dtype.clone());
            keep_fastest(&mut fastest, group, row);
        }
        let mut out: Vec<StoredChampion> = fastest
            .into_values()
            .filter_map(|row| {
                Some(StoredChampion {
                    started_at: runs[&row.run_id].0.clone(),
                    dtype: dtype_of(&row.dtype)?,
                    params: serde_json::from_str(&row.params).ok()?,
                    run_id: row.run_id,
                    geometry: row.geometry,
                    variant: row.variant,
                    median_us: row.median_us,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (&b.started_at, &b.run_id)
                .cmp(&(&a.started_at, &a.run_id))
                .then((&a.geometry, a.dtype.name()).cmp(&(&b.geometry, b.dtype.name())))
        });
        Ok(out)
    }

    /// The bottlenecks of the newest profile of a variant on one (shape geometry, dtype) on this GPU model.
    pub fn bottlenecks(
        &self,
        gpu: &str,
        fake: bool,
        params: &Params,
        geometry: &str,
        dtype: Dtype,
    ) -> Result<Option<(String, Vec<String>)>> {
        let params = serde_json::to_string(params)?;
        let row = self
            .conn
            .query_row(
                "SELECT run_id, bottlenecks FROM profiles
                 WHERE gpu = ?1 AND fake = ?2 AND params = ?3 AND geometry = ?4 AND dtype = ?5
                 ORDER BY rowid DESC LIMIT 1",
                params![gpu, fake, params, geometry, dtype.name()],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
            )
            .optional()?;
        Ok(row.and_then(|(run, b)| Some((run, serde_json::from_str(&b).ok()?))))
    }

    /// Every original measurement (not a reuse) of a variant on this GPU model.
    pub fn figures(&self, gpu: &str, fake: bool, params: &Params) -> Result<Vec<Figure>> {
        let params = serde_json::to_string(params)?;
        let rows = self.sealed_rows(
            "gpu = ?1 AND fake = ?2 AND params = ?3 AND run_id = origin_run AND log_line = origin_line",
            params![gpu, fake, params],
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                Some(Figure {
                    dtype: dtype_of(&row.dtype)?,
                    geometry: row.geometry,
                    median_us: row.median_us,
                    origin_run: row.origin_run,
                    origin_line: row.origin_line,
                    build_key: row.build_key,
                    reference_key: row.reference_key,
                    driver: row.driver,
                    nvcc: row.nvcc,
                })
            })
            .collect())
    }

    /// Per run (oldest first) and dtype: its fastest row on `shape`, matched by geometry when the
    /// shape is known (else by name), for `history`.
    pub fn history(&self, shape: &str, geometry: Option<&str>) -> Result<Vec<HistoryRow>> {
        let rows = match geometry {
            Some(g) => self.sealed_rows("geometry = ?1", params![g])?,
            None => self.sealed_rows("shape = ?1", params![shape])?,
        };
        let runs = self.runs()?;
        let mut fastest: BTreeMap<(String, String), Row> = BTreeMap::new();
        for row in rows.into_iter().filter(|r| runs.contains_key(&r.run_id)) {
            keep_fastest(&mut fastest, (row.run_id.clone(), row.dtype.clone()), row);
        }
        let mut out: Vec<(i64, HistoryRow)> = fastest
            .into_values()
            .filter_map(|row| {
                let (started_at, git_head, order) = runs[&row.run_id].clone();
                Some((
                    order,
                    HistoryRow {
                        dtype: dtype_of(&row.dtype)?,
                        run_id: row.run_id,
                        started_at,
                        git_head,
                        gpu: row.gpu,
                        fake: row.fake,
                        variant: row.variant,
                        median_us: row.median_us,
                        tflops: row.tflops,
                        origin_run: row.origin_run,
                        origin_line: row.origin_line,
                    },
                ))
            })
            .collect();
        out.sort_by(|(ao, a), (bo, b)| {
            (&a.gpu, a.fake, a.dtype.name(), &a.started_at, ao).cmp(&(
                &b.gpu,
                b.fake,
                b.dtype.name(),
                &b.started_at,
                bo,
            ))
        });
        Ok(out.into_iter().map(|(_, h)| h).collect())
    }

    /// Measurements held, all runs together.
    pub fn count(&self) -> Result<usize> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM measurements", [], |r| {
                r.get::<_, i64>(0)
            })? as usize)
    }
}

/// Keep the faster of a group's rows (the first written, on a tie, as SQLite's MIN did).
fn keep_fastest<K: Ord>(fastest: &mut BTreeMap<K, Row>, group: K, row: Row) {
    match fastest.get(&group) {
        Some(kept) if kept.median_us <= row.median_us => {}
        _ => {
            fastest.insert(group, row);
        }
    }
}
