//! What the reports say about a run, worked out once from its log: the best variant per shape beside PyTorch and the measured ceilings, the ablation chain with its profiles, the champions over the run clock. Markdown and HTML only lay these out.
use crate::config::{Dtype, Shape};
use crate::export::CaseRow;
use crate::profile::ProfileOutcome;
use crate::runlog::{LoadedLog, Record};
use std::collections::BTreeMap;

/// A measured roof of the GPU with the log line that holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub value: f64,
    pub line: usize,
}

/// The roofs `baselines/torch_sdpa.py` measured in this run; absent ones were not measured.
#[derive(Debug, Clone, Default)]
pub struct Ceilings {
    /// Dense matmul TFLOP/s per dtype.
    pub matmul_tflops: BTreeMap<Dtype, Measured>,
    /// Device copy, bytes read + written per second, in GB/s.
    pub copy_gbs: Option<Measured>,
    /// A read-only stream (a reduction), bytes read per second, in GB/s.
    pub read_gbs: Option<Measured>,
}

impl Ceilings {
    pub fn from_log(log: &LoadedLog) -> Ceilings {
        let mut c = Ceilings::default();
        for (line, e) in &log.entries {
            if let Record::CeilingMeasured {
                name,
                dtype,
                value,
                unit,
                ..
            } = &e.record
            {
                let m = Measured {
                    value: *value,
                    line: *line,
                };
                match (name.as_str(), dtype, unit.as_str()) {
                    ("matmul", Some(d), "TFLOP/s") => {
                        c.matmul_tflops.insert(*d, m);
                    }
                    ("copy", _, "GB/s") => c.copy_gbs = Some(m),
                    ("read", _, "GB/s") => c.read_gbs = Some(m),
                    _ => {}
                }
            }
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        self.matmul_tflops.is_empty() && self.bandwidth().is_none()
    }

    /// The bandwidth roof: the faster of the measured streams (a kernel can beat a copy's read/write mix).
    pub fn bandwidth(&self) -> Option<Measured> {
        match (self.copy_gbs, self.read_gbs) {
            (Some(c), Some(r)) => Some(if r.value > c.value { r } else { c }),
            (c, r) => c.or(r),
        }
    }
}

/// FLOP per byte of the least DRAM traffic (Q, K, V read once, O written once).
pub fn arithmetic_intensity(shape: &Shape, dtype: Dtype) -> f64 {
    shape.flops() / shape.min_dram_bytes(dtype)
}

/// GB/s a case achieved if it moved only the least DRAM traffic.
pub fn min_bandwidth_gbs(shape: &Shape, dtype: Dtype, median_us: f64) -> f64 {
    shape.min_dram_bytes(dtype) / median_us / 1e3
}

/// One (shape, dtype): the fastest correct variant beside the space's baseline, PyTorch and the ceilings.
#[derive(Debug, Clone)]
pub struct BestRow {
    pub shape: Shape,
    pub dtype: Dtype,
    /// (variant, median µs, TFLOP/s).
    pub best: Option<(String, f64, f64)>,
    /// The space's baseline variant on this shape, µs.
    pub baseline_us: Option<f64>,
    /// Per PyTorch backend (in `BestPerShape::backends` order): µs, why not, or not measured.
    pub torch: Vec<Option<Result<f64, String>>>,
    pub fastest_torch_us: Option<f64>,
    /// Achieved TFLOP/s ÷ the measured matmul ceiling of this dtype, in percent.
    pub pct_of_matmul: Option<f64>,
    /// Least-traffic bandwidth ÷ the bandwidth roof (the faster measured stream), in percent.
    pub pct_of_copy: Option<f64>,
}

pub struct BestPerShape {
    pub backends: Vec<String>,
    pub rows: Vec<BestRow>,
    /// Why PyTorch was not run at all.
    pub torch_missing: Option<String>,
    pub ceilings: Ceilings,
}

pub fn best_per_shape(log: &LoadedLog, cases: &[CaseRow]) -> BestPerShape {
    let ceilings = Ceilings::from_log(log);
    let mut backends: Vec<String> = Vec::new();
    let mut torch: BTreeMap<(String, Dtype, String), Result<f64, String>> = BTreeMap::new();
    let mut torch_missing = None;
    for (_, e) in &log.entries {
        match &e.record {
            Record::BaselineTimed {
                backend,
                shape,
                dtype,
                timing,
            } => {
                if !backends.contains(backend) {
                    backends.push(backend.clone());
                }
                torch.insert(
                    (shape.clone(), *dtype, backend.clone()),
                    Ok(timing.median_us),
                );
            }
            Record::BaselineUnavailable {
                backend: Some(backend),
                shape: Some(shape),
                dtype: Some(dtype),
                reason,
            } => {
                if !backends.contains(backend) {
                    backends.push(backend.clone());
                }
                torch.insert(
                    (shape.clone(), *dtype, backend.clone()),
                    Err(reason.clone()),
                );
            }
            Record::BaselineUnavailable { reason, .. } => torch_missing = Some(reason.clone()),
            _ => {}
        }
    }
    let Some(header) = log.header() else {
        return BestPerShape {
            backends,
            rows: Vec::new(),
            torch_missing,
            ceilings,
        };
    };
    let mut rows = Vec::new();
    for shape in &header.shapes {
        for &dtype in &header.dtypes {
            let timed = |c: &&CaseRow| c.shape == shape.name && c.dtype == dtype;
            let best = cases
                .iter()
                .filter(timed)
                .filter_map(|c| Some((c.variant.clone(), c.median_us?, c.tflops?)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let baseline_us = cases
                .iter()
                .filter(timed)
                .find(|c| c.variant == header.baseline)
                .and_then(|c| c.median_us);
            let torch: Vec<Option<Result<f64, String>>> = backends
                .iter()
                .map(|b| torch.get(&(shape.name.clone(), dtype, b.clone())).cloned())
                .collect();
            let fastest_torch_us = torch
                .iter()
                .filter_map(|t| t.as_ref()?.as_ref().ok().copied())
                .min_by(f64::total_cmp);
            let pct_of_matmul = match (&best, ceilings.matmul_tflops.get(&dtype)) {
                (Some((_, _, tf)), Some(roof)) => Some(100.0 * tf / roof.value),
                _ => None,
            };
            let pct_of_copy = match (&best, ceilings.bandwidth()) {
                (Some((_, us, _)), Some(roof)) => {
                    Some(100.0 * min_bandwidth_gbs(shape, dtype, *us) / roof.value)
                }
                _ => None,
            };
            rows.push(BestRow {
                shape: shape.clone(),
                dtype,
                best,
                baseline_us,
                torch,
                fastest_torch_us,
                pct_of_matmul,
                pct_of_copy,
            });
        }
    }
    BestPerShape {
        backends,
        rows,
        torch_missing,
        ceilings,
    }
}

/// The Nsight Compute figures the ablation table shows, from the longest profiled launch of a case.
#[derive(Debug, Clone, Default)]
pub struct NcuFigures {
    pub kernel: String,
    pub sm_pct: Option<f64>,
    pub dram_pct: Option<f64>,
    /// Achieved occupancy: warps active ÷ the SM's maximum, in percent.
    pub occupancy_pct: Option<f64>,
    pub tensor_pct: Option<f64>,
    pub waves: Option<f64>,
    pub bottlenecks: Vec<String>,
    pub line: usize,
}

fn ncu_figures(profile: &ProfileOutcome, line: usize) -> Option<NcuFigures> {
    let ProfileOutcome::Profiled {
        kernels,
        bottlenecks,
        ..
    } = profile
    else {
        return None;
    };
    // The launch that takes longest is the one whose figures explain the time.
    let k = kernels.iter().max_by(|a, b| {
        let t = |k: &crate::profile::KernelProfile| k.get("gpu__time_duration.sum").unwrap_or(0.0);
        t(a).total_cmp(&t(b))
    })?;
    Some(NcuFigures {
        kernel: k.kernel.split('(').next().unwrap_or(&k.kernel).to_owned(),
        sm_pct: k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        dram_pct: k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        occupancy_pct: k.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        tensor_pct: k.get("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
        waves: k.get("launch__waves_per_multiprocessor"),
        bottlenecks: bottlenecks.clone(),
        line,
    })
}

/// One chain step on one (shape, dtype).
#[derive(Debug, Clone)]
pub struct ChainRow {
    pub step: String,
    pub variant: String,
    /// The parameters that differ from the step before (empty for the first step).
    pub changed: String,
    pub dtype: Dtype,
    /// The case's status from `export::cases` (`timed`, `wrong`, ...), `not_run` when absent.
    pub status: String,
    pub median_us: Option<f64>,
    pub tflops: Option<f64>,
    pub vs_previous: Option<f64>,
    /// Against the space's baseline variant on the same (shape, dtype).
    pub vs_baseline: Option<f64>,
    pub max_abs: Option<f64>,
    pub registers: Option<u32>,
    pub spill_bytes: Option<u64>,
    pub ncu: Option<NcuFigures>,
}

/// The ablation table of a chain space, one block of rows per shape; `None` for a grid space.
pub fn chain(log: &LoadedLog, cases: &[CaseRow]) -> Option<Vec<(Shape, Vec<ChainRow>)>> {
    let header = log.header()?;
    let mut steps: Vec<(String, String, crate::space::Params)> = Vec::new();
    let mut resources: BTreeMap<(String, Dtype, u32), (u32, u64)> = BTreeMap::new();
    let mut profiles: BTreeMap<(String, String, Dtype), NcuFigures> = BTreeMap::new();
    for (line, e) in &log.entries {
        match &e.record {
            Record::Planned {
                variant,
                step: Some(step),
                params,
                ..
            } if !steps.iter().any(|s| &s.1 == variant) => {
                steps.push((step.clone(), variant.clone(), params.clone()))
            }
            Record::Built {
                variant,
                dtype,
                head_dim,
                entries,
                ..
            } => {
                let registers = entries.iter().map(|e| e.registers).max().unwrap_or(0);
                let spills = entries.iter().map(|e| e.spill_bytes()).max().unwrap_or(0);
                resources.insert((variant.clone(), *dtype, *head_dim), (registers, spills));
            }
            Record::Profiled {
                variant,
                shape,
                dtype,
                profile,
            } => {
                if let Some(f) = ncu_figures(profile, *line) {
                    profiles.insert((variant.clone(), shape.clone(), *dtype), f);
                }
            }
            _ => {}
        }
    }
    if steps.is_empty() {
        return None;
    }
    let mut blocks = Vec::new();
    for shape in &header.shapes {
        let mut rows = Vec::new();
        for &dtype in &header.dtypes {
            let baseline_us = cases
                .iter()
                .find(|c| c.variant == header.baseline && c.shape == shape.name && c.dtype == dtype)
                .and_then(|c| c.median_us);
            let mut previous_us: Option<f64> = None;
            for (i, (step, variant, params)) in steps.iter().enumerate() {
                let case = cases
                    .iter()
                    .find(|c| &c.variant == variant && c.shape == shape.name && c.dtype == dtype);
                let Some(case) = case else { continue };
                let changed = match i.checked_sub(1).map(|p| &steps[p].2) {
                    None => String::new(),
                    Some(before) => params
                        .iter()
                        .filter(|(k, v)| before.get(*k) != Some(*v))
                        .map(|(k, v)| {
                            let was = before.get(k).map_or("—".into(), |b| b.to_string());
                            format!("{k} {was}→{v}")
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                };
                let us = case.median_us;
                let ratio = |base: Option<f64>| Some(base? / us?);
                let (registers, spill_bytes) = resources
                    .get(&(variant.clone(), dtype, shape.d))
                    .map_or((None, None), |(r, s)| (Some(*r), Some(*s)));
                rows.push(ChainRow {
                    step: step.clone(),
                    variant: variant.clone(),
                    changed,
                    dtype,
                    status: case.status.clone(),
                    median_us: us,
                    tflops: case.tflops,
                    vs_previous: ratio(previous_us),
                    vs_baseline: ratio(baseline_us),
                    max_abs: case.max_abs,
                    registers,
                    spill_bytes,
                    ncu: profiles
                        .get(&(variant.clone(), shape.name.clone(), dtype))
                        .cloned(),
                });
                previous_us = us;
            }
        }
        if !rows.is_empty() {
            blocks.push((shape.clone(), rows));
        }
    }
    Some(blocks)
}

/// Best-so-far median µs of one (shape, dtype) at each improvement, on the run clock (seconds).
pub struct ChampionTrace {
    pub shape: String,
    pub dtype: Dtype,
    pub points: Vec<(f64, f64)>,
}

/// Every (shape, dtype)'s trace, and the clock of the last timing (after it no champion can change).
pub fn champion_traces(log: &LoadedLog) -> (Vec<ChampionTrace>, f64) {
    let Some(header) = log.header() else {
        return (Vec::new(), 0.0);
    };
    let mut last_timed = 0.0f64;
    let mut traces: BTreeMap<(usize, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for (_, e) in &log.entries {
        let Record::Timed {
            shape,
            dtype,
            timing,
            ..
        } = &e.record
        else {
            continue;
        };
        let (Some(s), Some(d)) = (
            header.shapes.iter().position(|x| &x.name == shape),
            header.dtypes.iter().position(|x| x == dtype),
        ) else {
            continue;
        };
        last_timed = last_timed.max(e.t);
        let points = traces.entry((s, d)).or_default();
        if points.last().is_none_or(|p| timing.median_us < p.1) {
            points.push((e.t, timing.median_us));
        }
    }
    let traces = traces
        .into_iter()
        .map(|((s, d), points)| ChampionTrace {
            shape: header.shapes[s].name.clone(),
            dtype: header.dtypes[d],
            points,
        })
        .collect();
    (traces, last_timed)
}
