//! A stored row held against the log record it cites, for `--reuse`: a figure is taken from the
//! store only when a sealed log says the same, on the same GPU, driver, nvcc and builds. The row's
//! seal proves flashtune wrote it; this proves it still says what was measured.
use super::{geometry, Stored};
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

    /// `Ok` when the record the row cites is a `timed` record of the same case with the same
    /// figures, in a sealed log of the same GPU and toolchain that built the same kernels; else why not.
    pub fn check(&mut self, stored: &Stored) -> Result<(), String> {
        let row = &stored.row;
        let run = &row.origin_run;
        // A run id is a folder name: one that is not would reach outside runs/.
        if run.is_empty() || run.contains(['/', '\\']) || run.starts_with('.') {
            return Err(format!("it cites the run `{run}`, which is not a run id"));
        }
        let dir = self.runs_dir.join(run);
        let log = self.logs.entry(run.clone()).or_insert_with(|| {
            crate::log::runlog::read_sealed(&dir.join("log.jsonl")).map_err(|e| format!("{e:#}"))
        });
        let log = log
            .as_ref()
            .map_err(|e| format!("the log it cites is not sealed: {e}"))?;
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
