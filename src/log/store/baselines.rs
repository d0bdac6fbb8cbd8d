//! The reference library's figures in the store: each `baseline_timed`, per-shape
//! `baseline_unavailable` and PyTorch `ceiling_measured` record of a run that named its
//! `reference_library`, keyed on the GPU model, driver and library fingerprint, so a later run on
//! the same three takes them instead of timing PyTorch again (`--fresh-baselines` times it anyway).
//! A row holds the record as logged and is sealed like a measurement row.
use super::Store;
use crate::log::runlog::{Citation, Record};
use crate::os::seal::SealKey;
use anyhow::{Context, Result};
use rusqlite::{params, Connection};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS reference_library (
    run_id TEXT NOT NULL,
    log_line INTEGER NOT NULL,
    gpu TEXT NOT NULL,
    driver INTEGER NOT NULL,
    fake INTEGER NOT NULL,
    library TEXT NOT NULL,
    geometry TEXT NOT NULL,
    record TEXT NOT NULL,
    origin_run TEXT NOT NULL,
    origin_line INTEGER NOT NULL,
    seal TEXT,
    PRIMARY KEY (run_id, log_line)
);
CREATE INDEX IF NOT EXISTS reference_library_match ON reference_library (gpu, driver, fake, library);
";

/// What a stored reference-library row must share with a run to stand for its figures.
#[derive(Debug, Clone, Copy)]
pub struct LibraryKey<'a> {
    pub gpu: &'a str,
    pub driver: i32,
    pub fake: bool,
    /// `gpu::baseline::Library::fingerprint`.
    pub library: &'a str,
}

/// One stored record of an earlier run's reference library, sealed and read back.
#[derive(Debug, Clone)]
pub struct StoredBaseline {
    pub run_id: String,
    /// The run's start, for the newest run first.
    pub started_at: String,
    /// The shape's geometry (`store::geometry`); empty for a roof.
    pub geometry: String,
    /// The record as logged, its `reused_from` naming where it was measured.
    pub record: Record,
    /// Where the figure was measured: the row's own run and line, or the record it repeated.
    pub origin: Citation,
}

/// One row as written and sealed.
struct ReferenceRow<'a> {
    run_id: &'a str,
    log_line: usize,
    key: LibraryKey<'a>,
    geometry: &'a str,
    record: String,
    origin: Citation,
}

impl ReferenceRow<'_> {
    fn fields(&self) -> Vec<String> {
        vec![
            self.run_id.to_owned(),
            self.log_line.to_string(),
            self.key.gpu.to_owned(),
            self.key.driver.to_string(),
            self.key.fake.to_string(),
            self.key.library.to_owned(),
            self.geometry.to_owned(),
            self.record.clone(),
            self.origin.run.clone(),
            self.origin.line.to_string(),
        ]
    }

    fn seal(&self, key: &SealKey) -> String {
        let fields = self.fields();
        key.row_seal(&fields.iter().map(String::as_str).collect::<Vec<_>>())
    }
}

/// Whether a record is one of the reference library's figures the store keeps, and where it
/// says it was measured (its `reused_from`, else itself).
pub(super) fn kept(record: &Record) -> Option<Option<&Citation>> {
    match record {
        Record::BaselineTimed { reused_from, .. } => Some(reused_from.as_ref()),
        Record::BaselineUnavailable { shape: Some(_), .. } => Some(None),
        Record::CeilingMeasured {
            source: Some(crate::model::vocab::RoofSource::Pytorch),
            reused_from,
            ..
        } => Some(reused_from.as_ref()),
        _ => None,
    }
}

/// Write one of the reference library's records of run `run_id` at `line`.
pub(super) fn insert(
    conn: &Connection,
    seal_key: &SealKey,
    run_id: &str,
    line: usize,
    key: LibraryKey,
    geometry: &str,
    record: &Record,
) -> Result<()> {
    let Some(origin) = kept(record) else {
        return Ok(());
    };
    let origin = origin.cloned().unwrap_or(Citation {
        run: run_id.to_owned(),
        line,
    });
    let row = ReferenceRow {
        run_id,
        log_line: line,
        key,
        geometry,
        record: serde_json::to_string(record)?,
        origin,
    };
    conn.execute(
        "INSERT INTO reference_library (run_id, log_line, gpu, driver, fake, library, geometry, record, origin_run, origin_line, seal)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (run_id, log_line) DO UPDATE SET
             gpu = excluded.gpu, driver = excluded.driver, fake = excluded.fake,
             library = excluded.library, geometry = excluded.geometry, record = excluded.record,
             origin_run = excluded.origin_run, origin_line = excluded.origin_line, seal = excluded.seal",
        params![
            row.run_id,
            row.log_line as i64,
            row.key.gpu,
            row.key.driver,
            row.key.fake,
            row.key.library,
            row.geometry,
            row.record,
            row.origin.run,
            row.origin.line as i64,
            row.seal(seal_key)
        ],
    )?;
    Ok(())
}

impl Store {
    /// The reference library's stored records under `key` whose seal holds, newest run first (in
    /// log order within a run); a row whose seal fails is never read.
    pub fn baselines(&self, key: &LibraryKey) -> Result<Vec<StoredBaseline>> {
        let runs = self.runs()?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT run_id, log_line, geometry, record, origin_run, origin_line, seal
                 FROM reference_library WHERE gpu = ?1 AND driver = ?2 AND fake = ?3 AND library = ?4
                 ORDER BY rowid",
            )
            .with_context(|| format!("cannot read {}", self.path.display()))?;
        let rows = stmt.query_map(params![key.gpu, key.driver, key.fake, key.library], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)? as usize,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, i64>(5)? as usize,
                r.get::<_, Option<String>>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (run_id, log_line, geometry, record, origin_run, origin_line, seal) = r?;
            let origin = Citation {
                run: origin_run,
                line: origin_line,
            };
            let row = ReferenceRow {
                run_id: &run_id,
                log_line,
                key: LibraryKey { ..*key },
                geometry: &geometry,
                record: record.clone(),
                origin: origin.clone(),
            };
            let fields = row.fields();
            let holds = seal.is_some_and(|s| {
                self.key
                    .row_seal_holds(&fields.iter().map(String::as_str).collect::<Vec<_>>(), &s)
            });
            let (Some((started_at, _, _)), true) = (runs.get(&run_id), holds) else {
                continue;
            };
            let Ok(record) = serde_json::from_str(&record) else {
                continue;
            };
            out.push(StoredBaseline {
                started_at: started_at.clone(),
                run_id,
                geometry,
                record,
                origin,
            });
        }
        out.sort_by(|a, b| b.started_at.cmp(&a.started_at));
        Ok(out)
    }
}
