//! The best clean timing so far per (shape, dtype) of a run: the bars racing holds later cases to,
//! and the leaders a run under a time limit climbs from.
use crate::log::runlog::Leader;
use crate::model::config::Dtype;
use crate::model::protocol::{CaseResult, CaseSpec, RaceBar, TimingStats};
use std::collections::BTreeMap;

/// The best clean timing so far per (shape, dtype) in this run: the bars racing holds later cases to.
#[derive(Default)]
pub(in crate::run) struct Bests(pub(super) BTreeMap<(String, Dtype), (f64, RaceBar)>);

impl Bests {
    /// A timing a case may set the bar with: clean (no throttling, no other process) and in full.
    pub(super) fn offer(
        &mut self,
        variant: &str,
        case: &CaseResult,
        timing: &TimingStats,
        clean: bool,
    ) {
        if !clean || case.raced.is_some() {
            return;
        }
        let key = (case.shape.clone(), case.dtype);
        if self
            .0
            .get(&key)
            .is_some_and(|(median, _)| *median <= timing.median_us)
        {
            return;
        }
        let bar = RaceBar {
            samples: 0,
            p90_us: timing.p90_us,
            best: variant.to_owned(),
        };
        self.0.insert(key, (timing.median_us, bar));
    }

    /// Every case's leader: the variant with its best clean timing.
    pub(super) fn leaders(&self) -> Vec<Leader> {
        self.0
            .iter()
            .map(|((shape, dtype), (_, bar))| Leader {
                shape: shape.clone(),
                dtype: *dtype,
                variant: bar.best.clone(),
            })
            .collect()
    }

    /// The bar for a case, with `samples` before the decision (0: no racing).
    pub(super) fn bar(&self, case: &CaseSpec, samples: u32) -> Option<RaceBar> {
        let (_, bar) = self.0.get(&(case.shape.name.clone(), case.dtype))?;
        (samples > 0).then(|| RaceBar {
            samples,
            ..bar.clone()
        })
    }
}
