//! Filling the store from a run's records: as each is logged (`Recorder`), or from a whole
//! sealed log afterwards (`backfill`).
use super::{baselines, geometry, row, LibraryKey, Row, Store};
use crate::log::runlog::{Entry, Record, SealedLog};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::TimingStats;
use crate::model::space::Params;
use crate::os::seal::SealKey;
use anyhow::{Context, Result};
use rusqlite::{params, Connection};
use std::collections::BTreeMap;
use std::path::Path;

/// What a log has said so far that a measurement row needs: the run, the parameters, the builds.
#[derive(Default)]
struct Seen {
    run: Option<RunRow>,
    shapes: Vec<Shape>,
    params: BTreeMap<String, Params>,
    /// Build key per (variant, dtype, head dim); the reference's under head dim 0.
    keys: BTreeMap<(String, Dtype, u32), String>,
    /// The run's `reference_library` fingerprint: its baselines are stored only under one.
    library: Option<String>,
}

#[derive(Clone)]
struct RunRow {
    run_id: String,
    gpu: String,
    driver: i32,
    nvcc: String,
    fake: bool,
}

impl RunRow {
    fn library_key<'a>(&'a self, library: &'a str) -> LibraryKey<'a> {
        LibraryKey {
            gpu: &self.gpu,
            driver: self.driver,
            fake: self.fake,
            library,
        }
    }
}

/// Writes a run's records into the store as they are logged; `backfill` does the same for a log after the fact.
pub struct Recorder {
    store: Store,
    ctx: Seen,
    /// The line the next record gets in the log.
    next_line: usize,
    warned: bool,
}

impl Recorder {
    /// Follow a log that holds `lines_so_far` lines; `earlier` (a resumed log, sealed: rows are
    /// written only from what flashtune wrote) goes in first, so its builds are known.
    pub fn new(mut store: Store, earlier: Option<&SealedLog>, lines_so_far: usize) -> Result<Self> {
        let mut ctx = Seen::default();
        if let Some(log) = earlier {
            write_log(&mut store, &mut ctx, log)?;
        }
        Ok(Recorder {
            store,
            ctx,
            next_line: lines_so_far + 1,
            warned: false,
        })
    }

    /// One record just appended to the log. A store that cannot be written is warned about once:
    /// the log holds the measurement, and `flashtune report` puts it in the store later.
    pub fn on_entry(&mut self, entry: &Entry) {
        let line = self.next_line;
        self.next_line += 1;
        if let Err(e) = write_record(&self.store, &mut self.ctx, line, &entry.record) {
            if !self.warned {
                self.warned = true;
                crate::tell!(
                    "warning: cannot write to the results store {}: {e:#}; the run goes on (`flashtune report <run>` fills the store from the log later)",
                    self.store.path.display()
                );
            }
        }
    }
}

/// Put every measurement and profile of a sealed log into the store; a row already there is written
/// again where its seal does not hold. Returns the number of measurement rows the store holds afterwards.
pub fn backfill(store: &mut Store, log: &SealedLog) -> Result<usize> {
    write_log(store, &mut Seen::default(), log)?;
    store.count()
}

fn write_log(store: &mut Store, ctx: &mut Seen, log: &SealedLog) -> Result<()> {
    let key = store.key.clone();
    let tx = store.conn.transaction()?;
    for (line, e) in &log.entries {
        write_record_in(&tx, &store.path, &key, ctx, *line, &e.record)?;
    }
    tx.commit()
        .with_context(|| format!("cannot write {}", store.path.display()))
}

fn write_record(store: &Store, ctx: &mut Seen, line: usize, record: &Record) -> Result<()> {
    write_record_in(&store.conn, &store.path, &store.key, ctx, line, record)
}

fn write_record_in(
    conn: &Connection,
    path: &Path,
    key: &SealKey,
    ctx: &mut Seen,
    line: usize,
    record: &Record,
) -> Result<()> {
    let at = || format!("cannot write {}", path.display());
    match record {
        Record::Header(h) => {
            let run = RunRow {
                run_id: h.run_id.clone(),
                gpu: h.device.name.clone(),
                driver: h.device.driver_version,
                nvcc: h.toolchain.version.clone(),
                fake: h.device.fake,
            };
            conn.execute(
                "INSERT OR IGNORE INTO runs (run_id, started_at, git_head, gpu, driver, nvcc, arch, fake, space, kernel_sources_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    h.run_id,
                    h.started_at,
                    h.git_head,
                    run.gpu,
                    run.driver,
                    run.nvcc,
                    h.device.arch,
                    run.fake,
                    h.space,
                    h.kernel_sources_hash
                ],
            )
            .with_context(at)?;
            ctx.shapes = h.shapes.clone();
            ctx.run = Some(run);
        }
        Record::Planned {
            variant, params, ..
        } => {
            ctx.params.insert(variant.clone(), params.clone());
        }
        Record::Built {
            variant,
            dtype,
            head_dim,
            key,
            ..
        } => {
            ctx.keys
                .insert((variant.clone(), *dtype, *head_dim), key.clone());
        }
        // A figure measured under throttling or beside another process is not one to reuse.
        Record::Timed {
            variant,
            shape,
            dtype,
            kv_splits,
            timing,
            conditions,
            ..
        } if conditions.is_empty() => insert_measurement(
            conn, key, ctx, line, variant, shape, *dtype, *kv_splits, timing, None,
        )
        .with_context(at)?,
        Record::Reused {
            variant,
            shape,
            dtype,
            kv_splits,
            timing,
            from_run,
            from_line,
        } => insert_measurement(
            conn,
            key,
            ctx,
            line,
            variant,
            shape,
            *dtype,
            *kv_splits,
            timing,
            Some((from_run, *from_line)),
        )
        .with_context(at)?,
        Record::ReferenceLibrary { fingerprint, .. } => ctx.library = Some(fingerprint.clone()),
        Record::BaselineTimed { shape, .. }
        | Record::BaselineUnavailable {
            shape: Some(shape), ..
        } => {
            if let (Some(run), Some(library), Some(s)) = (
                &ctx.run,
                &ctx.library,
                ctx.shapes.iter().find(|s| &s.name == shape),
            ) {
                let matched = run.library_key(library);
                baselines::insert(conn, key, &run.run_id, line, matched, &geometry(s), record)
                    .with_context(at)?;
            }
        }
        Record::CeilingMeasured { .. } => {
            if let (Some(run), Some(library)) = (&ctx.run, &ctx.library) {
                let matched = run.library_key(library);
                baselines::insert(conn, key, &run.run_id, line, matched, "", record)
                    .with_context(at)?;
            }
        }
        Record::Profiled {
            variant,
            shape,
            dtype,
            profile: crate::gpu::profile::ProfileOutcome::Profiled { bottlenecks, .. },
            ..
        } => {
            let (Some(run), Some(s), Some(params)) = (
                &ctx.run,
                ctx.shapes.iter().find(|s| &s.name == shape),
                ctx.params.get(variant),
            ) else {
                return Ok(());
            };
            conn.execute(
                "INSERT OR IGNORE INTO profiles (run_id, log_line, gpu, fake, variant, params, shape, geometry, dtype, bottlenecks)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    run.run_id,
                    line as i64,
                    run.gpu,
                    run.fake,
                    variant,
                    serde_json::to_string(params)?,
                    shape,
                    geometry(s),
                    dtype.name(),
                    serde_json::to_string(bottlenecks)?
                ],
            )
            .with_context(at)?;
        }
        _ => {}
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn insert_measurement(
    conn: &Connection,
    key: &SealKey,
    ctx: &Seen,
    line: usize,
    variant: &str,
    shape: &str,
    dtype: Dtype,
    kv_splits: u32,
    timing: &TimingStats,
    reused_from: Option<(&String, usize)>,
) -> Result<()> {
    // Without its run, shape, parameters and both builds a row could match the wrong case: skip it.
    let Some(run) = &ctx.run else {
        return Ok(());
    };
    let Some(s) = ctx.shapes.iter().find(|s| s.name == shape) else {
        return Ok(());
    };
    let build = ctx.keys.get(&(variant.to_owned(), dtype, s.d));
    let reference = ctx
        .keys
        .get(&(crate::model::space::REFERENCE.to_owned(), dtype, 0));
    let (Some(build), Some(reference), Some(params)) = (build, reference, ctx.params.get(variant))
    else {
        return Ok(());
    };
    if !timing.median_us.is_finite() {
        return Ok(());
    }
    let (origin_run, origin_line) = match reused_from {
        Some((run, line)) => (run.clone(), line),
        None => (run.run_id.clone(), line),
    };
    let row = Row {
        run_id: run.run_id.clone(),
        log_line: line,
        gpu: run.gpu.clone(),
        driver: run.driver,
        nvcc: run.nvcc.clone(),
        fake: run.fake,
        build_key: build.clone(),
        reference_key: reference.clone(),
        variant: variant.to_owned(),
        params: serde_json::to_string(params)?,
        shape: shape.to_owned(),
        geometry: geometry(s),
        dtype: dtype.name().to_owned(),
        kv_splits,
        median_us: timing.median_us,
        p10_us: timing.p10_us,
        p90_us: timing.p90_us,
        tflops: timing.tflops,
        timing: serde_json::to_string(timing)?,
        origin_run,
        origin_line,
    };
    // The sealed log's record is the truth: a row already there is written again with it (the same
    // bytes for a row that was left alone; a row edited in the file, or from before rows were
    // sealed, is repaired).
    conn.execute(
        &format!(
            "INSERT INTO measurements ({}, seal)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)
             ON CONFLICT (run_id, log_line) DO UPDATE SET
                 gpu = excluded.gpu, driver = excluded.driver, nvcc = excluded.nvcc, fake = excluded.fake,
                 build_key = excluded.build_key, reference_key = excluded.reference_key,
                 variant = excluded.variant, params = excluded.params, shape = excluded.shape,
                 geometry = excluded.geometry, dtype = excluded.dtype, kv_splits = excluded.kv_splits,
                 median_us = excluded.median_us, p10_us = excluded.p10_us, p90_us = excluded.p90_us,
                 tflops = excluded.tflops, timing = excluded.timing, origin_run = excluded.origin_run,
                 origin_line = excluded.origin_line, seal = excluded.seal",
            row::COLUMNS
        ),
        params![
            row.run_id,
            row.log_line as i64,
            row.gpu,
            row.driver,
            row.nvcc,
            row.fake,
            row.build_key,
            row.reference_key,
            row.variant,
            row.params,
            row.shape,
            row.geometry,
            row.dtype,
            row.kv_splits,
            row.median_us,
            row.p10_us,
            row.p90_us,
            row.tflops,
            row.timing,
            row.origin_run,
            row.origin_line as i64,
            row.seal(key)
        ],
    )?;
    Ok(())
}
