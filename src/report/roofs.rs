//! The GPU's roofs as a run measured them, and the gate that calls a figure beyond them implausible: a kernel cannot beat dense matmul at arithmetic or the memory system at moving its least traffic, so such a figure is a bug (or a cheat), never a win.
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::TimingStats;
use crate::model::vocab::Roof;
use std::collections::BTreeMap;

/// The highest figure measured for each roof in one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Roofs {
    /// Dense matmul, TFLOP/s, per dtype.
    pub matmul: BTreeMap<Dtype, f64>,
    /// The faster of device copy (bytes read + written) and a read-only stream, GB/s.
    pub bandwidth_gbps: Option<f64>,
}

impl Roofs {
    /// Add one measured ceiling (`matmul` per dtype, `copy` or `read`); the higher figure wins.
    pub fn add(&mut self, name: Roof, dtype: Option<Dtype>, value: f64) {
        if !(value.is_finite() && value > 0.0) {
            return;
        }
        match (name, dtype) {
            (Roof::Matmul, Some(d)) => {
                let e = self.matmul.entry(d).or_insert(value);
                *e = e.max(value);
            }
            (Roof::Copy | Roof::Read, _) => {
                self.bandwidth_gbps = Some(self.bandwidth_gbps.map_or(value, |b| b.max(value)));
            }
            _ => {}
        }
    }

    /// Every `ceiling_measured` record of a log.
    pub fn from_log(log: &LoadedLog) -> Roofs {
        let mut roofs = Roofs::default();
        for (_, e) in &log.entries {
            if let Record::CeilingMeasured {
                name, dtype, value, ..
            } = &e.record
            {
                roofs.add(*name, *dtype, *value);
            }
        }
        roofs
    }

    /// Why a timing is beyond a roof (by more than `margin`, a fraction), or `None` when it is not.
    /// A roof not measured gates nothing; a timing that is not a number is beyond every roof.
    pub fn beyond(
        &self,
        shape: &Shape,
        dtype: Dtype,
        timing: &TimingStats,
        margin: f64,
    ) -> Option<String> {
        let seconds = timing.median_us * 1e-6;
        if !(seconds > 0.0) {
            return Some(format!("a median of {} µs is not a time", timing.median_us));
        }
        let tflops = shape.flops() / seconds / 1e12;
        if let Some(&roof) = self.matmul.get(&dtype) {
            if !(tflops <= roof * (1.0 + margin)) {
                return Some(format!(
                    "{tflops:.1} TFLOP/s at {:.2} µs is {:.0}% of the measured {dtype} matmul roof ({roof:.0} TFLOP/s; allowed {:.0}%)",
                    timing.median_us,
                    100.0 * tflops / roof,
                    100.0 * (1.0 + margin)
                ));
            }
        }
        if let Some(roof) = self.bandwidth_gbps {
            let gbps = shape.min_dram_bytes(dtype) / seconds / 1e9;
            if !(gbps <= roof * (1.0 + margin)) {
                return Some(format!(
                    "reading Q, K, V and writing O once at {:.2} µs is {gbps:.0} GB/s, {:.0}% of the measured bandwidth roof ({roof:.0} GB/s; allowed {:.0}%)",
                    timing.median_us,
                    100.0 * gbps / roof,
                    100.0 * (1.0 + margin)
                ));
            }
        }
        None
    }
}
