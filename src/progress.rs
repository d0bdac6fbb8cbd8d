//! Progress bars on stderr that follow the run-log records.
use crate::run::Reporter;
use crate::runlog::{Entry, Record};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

pub struct ProgressReporter {
    _bars: MultiProgress,
    builds: ProgressBar,
    cases: ProgressBar,
    dtypes: u64,
    shapes_per_head_dim: std::collections::BTreeMap<u32, u64>,
    /// Fastest correct variant so far per (shape, dtype).
    champions: std::collections::BTreeMap<(String, crate::config::Dtype), (String, f64)>,
}

impl ProgressReporter {
    pub fn new() -> Self {
        let bars = MultiProgress::new();
        let style = ProgressStyle::with_template(
            "{prefix:>8} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta} {wide_msg}",
        )
        .expect("valid template")
        .progress_chars("=> ");
        let builds = bars.add(
            ProgressBar::new(0)
                .with_style(style.clone())
                .with_prefix("build"),
        );
        let cases = bars.add(ProgressBar::new(0).with_style(style).with_prefix("measure"));
        Self {
            _bars: bars,
            builds,
            cases,
            dtypes: 0,
            shapes_per_head_dim: Default::default(),
            champions: Default::default(),
        }
    }
}

impl Default for ProgressReporter {
    fn default() -> Self {
        Self::new()
    }
}

impl Reporter for ProgressReporter {
    fn on_entry(&mut self, entry: &Entry) {
        match &entry.record {
            Record::Header(h) => {
                self.dtypes = h.dtypes.len() as u64;
                for s in &h.shapes {
                    *self.shapes_per_head_dim.entry(s.d).or_default() += 1;
                }
                // The fp32 reference is built once per dtype.
                self.builds.set_length(self.dtypes);
                self.builds.set_message(format!("on {}", h.device.name));
            }
            Record::Planned {
                invalid: None,
                head_dim,
                ..
            } => {
                self.builds.inc_length(self.dtypes);
                self.cases.inc_length(
                    self.dtypes * self.shapes_per_head_dim.get(head_dim).copied().unwrap_or(0),
                );
            }
            Record::Built {
                variant,
                dtype,
                head_dim,
                cached,
                ..
            } => {
                self.builds.inc(1);
                self.builds.set_message(format!(
                    "{variant} {dtype} d{head_dim}{}",
                    if *cached { " (cached)" } else { "" }
                ));
            }
            Record::BuildFailed {
                variant, reason, ..
            } => {
                self.builds.inc(1);
                self.builds
                    .println(format!("build failed: {variant}: {reason}"));
            }
            Record::Timed {
                variant,
                shape,
                dtype,
                timing,
                ..
            } => {
                self.cases.inc(1);
                self.cases.set_message(format!(
                    "{variant} {shape} {dtype}: {:.1} µs",
                    timing.median_us
                ));
                let key = (shape.clone(), *dtype);
                if self
                    .champions
                    .get(&key)
                    .is_none_or(|(_, best)| timing.median_us < *best)
                {
                    self.champions
                        .insert(key, (variant.clone(), timing.median_us));
                    self.cases.println(format!(
                        "champion {shape}/{dtype}: {variant} {:.1} µs",
                        timing.median_us
                    ));
                }
            }
            Record::Reused { .. } => self.cases.inc(1),
            Record::CheckFailed {
                variant,
                shape,
                dtype,
                reason,
                ..
            } => {
                self.cases.inc(1);
                self.cases
                    .println(format!("wrong: {variant} {shape} {dtype}: {reason}"));
            }
            Record::WorkerCrashed {
                variant, detail, ..
            } => self
                .cases
                .println(format!("worker crashed on {variant}: {detail}")),
            Record::TimedOut {
                variant, seconds, ..
            } => self.cases.println(format!(
                "worker timed out on {variant}: no case finished in {seconds} s"
            )),
            Record::Finished { .. } => {
                self.builds.finish();
                self.cases.finish();
            }
            _ => {}
        }
    }
}
