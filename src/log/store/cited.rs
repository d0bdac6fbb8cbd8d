//! A stored row held against the log record it cites, for `--reuse`: a figure is taken from the
//! store only when a sealed log says the same, on the same GPU, driver, nvcc and builds. The row's
//! seal proves flashtune wrote it; this proves it still says what was measured.
use super::{geometry, LibraryKey, Stored, StoredBaseline};
use crate::log::runlog::{Record, SealedLog};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The sealed logs rows cite, each read once (or why it cannot be).
pub struct CitedLogs {
    runs_dir: PathBuf,
    logs: BTreeMap<String, Result<SealedLog, String>>,
}

impl CitedLogs {
    pub fn new(runs_dir: PathBuf) -> CitedLogs {
        CitedLogs {
            runs_dir,
            logs: BTreeMap::new(),
        }
    }

    /// The sealed log of run `run`, read once; why not where it is not one.
    fn sealed(&mut self, run: &str) -> Result<&SealedLog, String> {
        // A run id is a folder name: one that is not would reach outside runs/.
        if run.is_empty() || run.contains(['/', '\\']) || run.starts_with('.') {
            return Err(format!("it cites the run `{run}`, which is not a run id"));
        }
        let dir = self.runs_dir.join(run);
        self.logs
            .entry(run.to_owned())
            .or_insert_with(|| {
                crate::log::runlog::read_sealed(&dir.join("log.jsonl"))
                    .map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| format!("the log it cites is not sealed: {e}"))
    }

    /// `Ok` when the record a stored baseline cites is the same record (its shape by geometry, not
    /// name) in a sealed log of the same GPU model and driver that named the same reference library
    /// before it; else why not.
    pub fn check_baseline(
        &mut self,
        stored: &StoredBaseline,
        key: &LibraryKey,
    ) -> Result<(), String> {
        let origin = &stored.origin;
        let at = format!("run {} line {}", origin.run, origin.line);
        let log = self.sealed(&origin.run)?;
        let header = log
            .header()
            .ok_or_else(|| format!("{at}: the log has no header"))?;
        let device = &header.device;
        if (device.name.as_str(), device.driver_version, device.fake)
            != (key.gpu, key.driver, key.fake)
        {
            return Err(format!(
                "{at}: the log was measured on {} (driver {}), the row says {} (driver {})",
                device.name, device.driver_version, key.gpu, key.driver
            ));
        }
        let before = || {
            log.entries
                .iter()
                .take_while(|(line, _)| *line < origin.line)
        };
        let named = before().any(|(_, e)| {
            matches!(&e.record, Record::ReferenceLibrary { fingerprint, .. } if fingerprint == key.library)
        });
        if !named {
            return Err(format!("{at}: the log names another reference library"));
        }
        let Some((_, cited)) = log.entries.iter().find(|(line, _)| *line == origin.line) else {
            return Err(format!("{at}: the log has no such line"));
        };
        // The stored record as first logged: not yet citing itself, under the origin's shape name.
        let mut expected = stored.record.clone();
        match (&mut expected, &cited.record) {
            (
                Record::BaselineTimed {
                    shape, reused_from, ..
                },
                Record::BaselineTimed { shape: named, .. },
            ) => {
                *reused_from = None;
                *shape = named.clone();
            }
            (
                Record::BaselineUnavailable { shape, .. },
                Record::BaselineUnavailable { shape: named, .. },
            ) => *shape = named.clone(),
            (Record::CeilingMeasured { reused_from, .. }, _) => *reused_from = None,
            _ => {}
        }
        if expected != cited.record {
            return Err(format!("{at} is not the record the store holds"));
        }
        let cited_shape = match &cited.record {
            Record::BaselineTimed { shape, .. } => Some(shape),
            Record::BaselineUnavailable { shape, .. } => shape.as_ref(),
            _ => None,
        };
        let cited_geometry = cited_shape
            .and_then(|name| header.shapes.iter().find(|s| &s.name == name))
            .map(geometry)
            .unwrap_or_default();
        if cited_geometry != stored.geometry {
            return Err(format!("{at}: its shape is not the geometry the row says"));
        }
        Ok(())
    }

    /// `Ok` when the record the row cites is a `timed` record of the same case with the same
    /// figures, in a sealed log of the same GPU and toolchain that built the same kernels; else why not.
    pub fn check(&mut self, stored: &Stored) -> Result<(), String> {
        let row = &stored.row;
        let run = &row.origin_run;
        let log = self.sealed(run)?;
        let at = format!("run {run} line {}", row.origin_line);
        let header = log
            .header()
            .ok_or_else(|| format!("{at}: the log has no header"))?;
        let device = &header.device;
        if (
            device.name.as_str(),
            device.driver_version,
            header.toolchain.version.as_str(),
            device.fake,
        ) != (row.gpu.as_str(), row.driver, row.nvcc.as_str(), row.fake)
        {
            return Err(format!(
                "{at}: the log was measured on {} (driver {}, {}), the row says {} (driver {}, {})",
                device.name,
                device.driver_version,
                header.toolchain.version,
                row.gpu,
                row.driver,
                row.nvcc
            ));
        }
        let Some(shape) = header.shapes.iter().find(|s| s.name == row.shape) else {
            return Err(format!("{at}: the log has no shape `{}`", row.shape));
        };
        if geometry(shape) != row.geometry {
            return Err(format!(
                "{at}: shape `{}` is {} in the log, {} in the row",
                row.shape,
                geometry(shape),
                row.geometry
            ));
        }
        let record = log
            .entries
            .iter()
            .find(|(line, _)| *line == row.origin_line)
            .map(|(_, e)| &e.record);
        let Some(Record::Timed {
            variant,
            shape: timed_shape,
            dtype,
            kv_splits,
            timing,
            conditions,
            ..
        }) = record
        else {
            return Err(format!("{at} is not a timing"));
        };
        if (variant, timed_shape, dtype.name(), *kv_splits)
            != (&row.variant, &row.shape, row.dtype.as_str(), row.kv_splits)
            || !conditions.is_empty()
        {
            return Err(format!(
                "{at} times {variant} on {timed_shape} {dtype} (split {kv_splits}), the row says {} on {} {} (split {})",
                row.variant, row.shape, row.dtype, row.kv_splits
            ));
        }
        if *timing != stored.timing {
            return Err(format!(
                "{at} gives a median of {:.2} µs, the row {:.2} µs",
                timing.median_us, stored.timing.median_us
            ));
        }
        let built = |unit: &str, head_dim: u32| {
            log.entries
                .iter()
                .take_while(|(line, _)| *line < row.origin_line)
                .filter_map(|(_, e)| match &e.record {
                    Record::Built {
                        variant,
                        dtype: d,
                        head_dim: h,
                        key,
                        ..
                    } if variant == unit && d == dtype && *h == head_dim => Some(key.as_str()),
                    _ => None,
                })
                .last()
        };
        if built(variant, shape.d) != Some(row.build_key.as_str()) {
            return Err(format!(
                "{at}: the log built {variant} {dtype} as another kernel than the row's build key"
            ));
        }
        if built(crate::model::space::REFERENCE, 0) != Some(row.reference_key.as_str()) {
            return Err(format!(
                "{at}: the log built the reference {dtype} as another kernel than the row's"
            ));
        }
        Ok(())
    }
}
