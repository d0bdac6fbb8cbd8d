//! Progress on stderr that follows the run-log records: bars on a terminal, plain lines otherwise.
use crate::log::runlog::{Entry, Record};
use crate::run::shared::Reporter;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// On a pipe or a log file, how often a plain line says how far the measurement is.
const PLAIN_EVERY: Duration = Duration::from_secs(15);

pub struct ProgressReporter {
    _bars: MultiProgress,
    builds: ProgressBar,
    cases: ProgressBar,
    dtypes: u64,
    shapes_per_head_dim: std::collections::BTreeMap<u32, u64>,
    /// Fastest correct variant so far per (shape, dtype).
    champions: std::collections::BTreeMap<(String, crate::model::config::Dtype), (String, f64)>,
    /// The run is on the test double: its figures are synthetic, and its lines say so.
    fake: bool,
    /// stderr is not a terminal: indicatif draws nothing there, so events and a periodic count
    /// are written as plain lines (a run piped through `tee` or under nohup is not silent).
    plain: bool,
    last_plain: Instant,
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
            fake: false,
            plain: !std::io::stderr().is_terminal(),
            last_plain: Instant::now(),
        }
    }

    /// An event line: above the bars on a terminal, as a plain line elsewhere.
    fn say(&self, bar: &ProgressBar, line: String) {
        if self.plain {
            crate::tell!("{line}");
        } else {
            bar.println(line);
        }
    }

    /// Off a terminal, a count of builds and cases every [`PLAIN_EVERY`].
    fn plain_count(&mut self) {
        if !self.plain || self.last_plain.elapsed() < PLAIN_EVERY {
            return;
        }
        self.last_plain = Instant::now();
        crate::tell!(
            "[{:.0} s] built {}/{}, cases {}/{}: {}",
            self.cases.elapsed().as_secs_f64(),
            self.builds.position(),
            self.builds.length().unwrap_or(0),
            self.cases.position(),
            self.cases.length().unwrap_or(0),
            self.cases.message()
        );
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
                self.fake = h.device.fake;
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
                variant,
                reason,
                log_tail,
                ..
            } => {
                self.builds.inc(1);
                let said = crate::gpu::build::first_error(log_tail)
                    .map_or(String::new(), |e| format!(": {e}"));
                self.say(
                    &self.builds,
                    format!("build failed: {variant}: {reason}{said}"),
                );
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
                    self.say(
                        &self.cases,
                        // The fastest so far, not the champion: ties, a fault on another case
                        // and the re-duels decide the final table.
                        format!(
                            "fastest so far {shape}/{dtype}: {variant} {:.1} µs{}",
                            timing.median_us,
                            if self.fake {
                                " (synthetic: fake GPU)"
                            } else {
                                ""
                            }
                        ),
                    );
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
                self.say(
                    &self.cases,
                    format!("wrong: {variant} {shape} {dtype}: {reason}"),
                );
            }
            Record::WorkerCrashed {
                variant, detail, ..
            } => self.say(
                &self.cases,
                format!("worker crashed on {variant}: {detail}"),
            ),
            Record::WorkerLost { variant, loss, .. } => self.say(
                &self.cases,
                format!(
                    "worker lost on {variant}: {} (not the variant's fault)",
                    loss.describe()
                ),
            ),
            Record::TimedOut {
                variant,
                stage,
                seconds,
                ..
            } => self.say(
                &self.cases,
                format!("{stage} timed out on {variant}: {}", stage.limit(*seconds)),
            ),
            Record::BudgetReached {
                reason,
                variants_not_measured,
            } => self.say(
                &self.cases,
                format!(
                    "budget reached: {reason}; {} variant(s) not started",
                    variants_not_measured.len()
                ),
            ),
            Record::Finished { .. } => {
                self.builds.finish();
                self.cases.finish();
            }
            _ => {}
        }
        self.plain_count();
    }
}
