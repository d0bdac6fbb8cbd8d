//! What the reports say about a run, worked out once from its log: the best variant per shape beside PyTorch and the measured ceilings, the ablation chain with its profiles, the champions over the run clock. Markdown and HTML only lay these out.
use crate::gpu::profile::ProfileOutcome;
use crate::log::runindex::{BuildOutcome, RunIndex};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::Condition;
use std::collections::BTreeMap;

pub use crate::log::runindex::{Ceilings, Measured};

/// FLOP per byte of the least DRAM traffic (Q, K, V read once, O written once).
pub fn arithmetic_intensity(shape: &Shape, dtype: Dtype) -> f64 {
    shape.flops() / shape.min_dram_bytes(dtype)
}

/// GB/s a case achieved if it moved only the least DRAM traffic.
pub fn min_bandwidth_gbs(shape: &Shape, dtype: Dtype, median_us: f64) -> f64 {
    shape.min_dram_bytes(dtype) / median_us / 1e3
}

/// One (shape, dtype): its champion (the fastest variant no fault bars from the shape) beside the
/// space's baseline, PyTorch and the ceilings.
#[derive(Debug, Clone)]
pub struct BestRow {
    pub shape: Shape,
    pub dtype: Dtype,
    /// (variant, median µs, TFLOP/s).
    pub best: Option<(String, f64, f64)>,
    /// What the best was measured under, when no clean case of this shape was measured: it is
    /// reported, marked, but it did not win against a clean figure.
    pub under: Vec<Condition>,
    /// Faster figures passed over because they were measured under a condition while a clean case
    /// exists: (variant, median µs, conditions, log line).
    pub passed_over: Vec<(String, f64, Vec<Condition>, usize)>,
    /// Faster figures that lost their last duel with a case ranked above them: (variant, median
    /// µs, log line of its figure).
    pub outdueled: Vec<(String, f64, usize)>,
    /// The runner-up when it is within the noise of the best: the two are tied.
    pub tie: Option<TiedRow>,
    /// The best's figures came from the results store: the run and log line that measured them.
    pub reused: Option<(String, usize)>,
    /// The space's baseline variant on this shape, µs.
    pub baseline_us: Option<f64>,
    /// Per PyTorch backend (in `BestPerShape::backends` order): its figure, why not, or not measured.
    pub torch: Vec<Option<Result<TorchFigure, String>>>,
    pub fastest_torch_us: Option<f64>,
    /// The fastest PyTorch figure stayed above the spread limit: the ratio rests on a noisy figure.
    pub fastest_torch_noisy: bool,
    /// Achieved TFLOP/s ÷ the measured matmul ceiling of this dtype, in percent.
    pub pct_of_matmul: Option<f64>,
    /// Least-traffic bandwidth ÷ the bandwidth roof (the faster measured stream), in percent.
    pub pct_of_copy: Option<f64>,
}

/// The runner-up that ties a shape's best.
#[derive(Debug, Clone)]
pub struct TiedRow {
    pub variant: String,
    pub median_us: f64,
    pub closeness: crate::log::runindex::Closeness,
}

/// One PyTorch backend on one (shape, dtype).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TorchFigure {
    pub median_us: f64,
    /// (p90 - p10) / median of its samples.
    pub spread: f64,
    pub noisy: bool,
    pub remeasured: u32,
    pub line: usize,
}

pub struct BestPerShape {
    pub backends: Vec<String>,
    pub rows: Vec<BestRow>,
    /// Why PyTorch was not run at all.
    pub torch_missing: Option<String>,
    pub ceilings: Ceilings,
    /// The run's `[gates] per_shape_dispatch`: each row's best may have faulted on another shape.
    pub per_shape_dispatch: bool,
}

pub fn best_per_shape(ix: &RunIndex) -> BestPerShape {
    let ceilings = ix.ceilings.clone();
    let mut backends: Vec<String> = Vec::new();
    let mut torch: BTreeMap<(&str, Dtype, &str), Result<TorchFigure, String>> = BTreeMap::new();
    for b in &ix.baselines {
        if !backends.iter().any(|x| x == b.backend) {
            backends.push(b.backend.to_owned());
        }
        let cell = match &b.outcome {
            Ok(t) => Ok(TorchFigure {
                median_us: t.timing.median_us,
                spread: crate::log::runindex::spread(t.timing),
                noisy: t.noisy,
                remeasured: t.remeasured,
                line: b.line,
            }),
            Err(reason) => Err(reason.to_string()),
        };
        torch.insert((b.shape, b.dtype, b.backend), cell);
    }
    let torch_missing = ix.baseline_missing.map(str::to_owned);
    let Some(header) = ix.header else {
        return BestPerShape {
            backends,
            rows: Vec::new(),
            torch_missing,
            ceilings,
            per_shape_dispatch: ix.per_shape_dispatch,
        };
    };
    let mut rows = Vec::new();
    for shape in &header.shapes {
        for &dtype in &header.dtypes {
            let pick = ix.pick(&shape.name, dtype);
            let best = pick.as_ref().map(|p| {
                let t = p.best.measured().expect("a pick is measured");
                (p.best.variant.to_owned(), t.median_us, t.tflops)
            });
            let reused = pick
                .as_ref()
                .and_then(|p| p.best.reused())
                .map(|r| (r.run.to_owned(), r.line));
            let under = pick
                .as_ref()
                .map_or_else(Vec::new, |p| p.best.conditions().to_vec());
            let passed_over = pick.as_ref().map_or_else(Vec::new, |p| {
                p.passed_over
                    .iter()
                    .filter_map(|c| {
                        let t = c.measured()?;
                        Some((
                            c.variant.to_owned(),
                            t.median_us,
                            c.conditions().to_vec(),
                            c.log_line(),
                        ))
                    })
                    .collect()
            });
            let outdueled = pick.as_ref().map_or_else(Vec::new, |p| {
                p.outdueled
                    .iter()
                    .filter_map(|c| {
                        Some((c.variant.to_owned(), c.measured()?.median_us, c.log_line()))
                    })
                    .collect()
            });
            let tie = pick.as_ref().and_then(|p| {
                let runner_up = p.runner_up?;
                Some(TiedRow {
                    variant: runner_up.variant.to_owned(),
                    median_us: runner_up.measured()?.median_us,
                    closeness: p.tie?,
                })
            });
            let baseline_us = ix
                .case(&header.baseline, &shape.name, dtype)
                .and_then(|c| c.measured())
                .map(|t| t.median_us);
            let torch: Vec<Option<Result<TorchFigure, String>>> = backends
                .iter()
                .map(|b| {
                    torch
                        .get(&(shape.name.as_str(), dtype, b.as_str()))
                        .cloned()
                })
                .collect();
            let fastest_torch = torch
                .iter()
                .filter_map(|t| t.as_ref()?.as_ref().ok().copied())
                .min_by(|a, b| a.median_us.total_cmp(&b.median_us));
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
                under,
                passed_over,
                outdueled,
                tie,
                reused,
                baseline_us,
                torch,
                fastest_torch_us: fastest_torch.map(|t| t.median_us),
                fastest_torch_noisy: fastest_torch.is_some_and(|t| t.noisy),
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
        per_shape_dispatch: ix.per_shape_dispatch,
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
        let t =
            |k: &crate::gpu::profile::KernelProfile| k.get("gpu__time_duration.sum").unwrap_or(0.0);
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
    /// What became of the case (`NotRun` when absent).
    pub status: crate::log::runindex::CaseStatus,
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
pub fn chain(ix: &RunIndex) -> Option<Vec<(Shape, Vec<ChainRow>)>> {
    let header = ix.header?;
    let mut steps: Vec<(&str, &str, &crate::model::space::Params)> = Vec::new();
    for p in &ix.planned {
        if let Some(step) = p.step {
            if !steps.iter().any(|s| s.1 == p.variant) {
                steps.push((step, p.variant, p.params));
            }
        }
    }
    let mut resources: BTreeMap<(&str, Dtype, u32), (u32, u64)> = BTreeMap::new();
    for b in &ix.builds {
        if let BuildOutcome::Built { entries, .. } = b.outcome {
            let registers = entries.iter().map(|e| e.registers).max().unwrap_or(0);
            let spills = entries.iter().map(|e| e.spill_bytes()).max().unwrap_or(0);
            resources.insert((b.variant, b.dtype, b.head_dim), (registers, spills));
        }
    }
    let mut profiles: BTreeMap<(&str, &str, Dtype), NcuFigures> = BTreeMap::new();
    for p in &ix.profiles {
        if let Some(f) = ncu_figures(p.profile, p.line) {
            profiles.insert((p.variant, p.shape, p.dtype), f);
        }
    }
    if steps.is_empty() {
        return None;
    }
    let mut blocks = Vec::new();
    for shape in &header.shapes {
        let mut rows = Vec::new();
        for &dtype in &header.dtypes {
            let baseline_us = ix
                .case(&header.baseline, &shape.name, dtype)
                .and_then(|c| c.measured())
                .map(|t| t.median_us);
            let mut previous_us: Option<f64> = None;
            for (i, &(step, variant, params)) in steps.iter().enumerate() {
                let Some(case) = ix.case(variant, &shape.name, dtype) else {
                    continue;
                };
                let changed = match i.checked_sub(1).map(|p| steps[p].2) {
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
                let measured = case.measured();
                let us = measured.map(|t| t.median_us);
                let ratio = |base: Option<f64>| Some(base? / us?);
                let (registers, spill_bytes) = resources
                    .get(&(variant, dtype, shape.d))
                    .map_or((None, None), |(r, s)| (Some(*r), Some(*s)));
                rows.push(ChainRow {
                    step: step.to_owned(),
                    variant: variant.to_owned(),
                    changed,
                    dtype,
                    status: case.outcome.status(),
                    median_us: us,
                    tflops: measured.map(|t| t.tflops),
                    vs_previous: ratio(previous_us),
                    vs_baseline: ratio(baseline_us),
                    max_abs: case.check.map(|c| c.max_abs),
                    registers,
                    spill_bytes,
                    ncu: profiles
                        .get(&(variant, shape.name.as_str(), dtype))
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

/// Best-so-far median µs of one (shape, dtype) at each improvement, on the run clock (seconds),
/// over the figures that may decide a champion: clean ones, of variants no fault bars from the shape.
pub struct ChampionTrace {
    pub shape: String,
    pub dtype: Dtype,
    pub points: Vec<(f64, f64)>,
}

/// Every (shape, dtype)'s trace, and the clock of the last timing (after it no champion can change).
pub fn champion_traces(ix: &RunIndex) -> (Vec<ChampionTrace>, f64) {
    let Some(header) = ix.header else {
        return (Vec::new(), 0.0);
    };
    let mut last_timed = 0.0f64;
    let mut traces: BTreeMap<(usize, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for t in &ix.timings {
        let eligible = t.conditions.is_empty() && ix.disqualified_on(t.variant, t.shape).is_none();
        if !eligible {
            continue;
        }
        let (Some(s), Some(d)) = (
            header.shapes.iter().position(|x| x.name == t.shape),
            header.dtypes.iter().position(|x| *x == t.dtype),
        ) else {
            continue;
        };
        last_timed = last_timed.max(t.t);
        let points = traces.entry((s, d)).or_default();
        if points.last().is_none_or(|p| t.timing.median_us < p.1) {
            points.push((t.t, t.timing.median_us));
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

/// The GPU's state at one moment of the run: after a case's timed replays, or after a sentinel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatePoint {
    pub t: f64,
    pub device: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
}

/// Every state the log holds, in run-clock order.
pub fn gpu_states(ix: &RunIndex) -> Vec<StatePoint> {
    let point = |t: f64, device: Option<u32>, s: &crate::model::protocol::GpuState| StatePoint {
        t,
        device,
        sm_clock_mhz: s.sm_clock_mhz,
        mem_clock_mhz: s.mem_clock_mhz,
        temperature_c: s.temperature_c,
        power_w: s.power_w,
    };
    let mut out: Vec<StatePoint> = ix
        .timings
        .iter()
        .filter_map(|t| Some(point(t.t, t.device, t.gpu?)))
        .chain(
            ix.disturbed
                .iter()
                .filter_map(|d| Some(point(d.t, None, d.gpu?))),
        )
        .chain(
            ix.sentinels
                .iter()
                .filter_map(|s| Some(point(s.t, Some(s.device), s.gpu?))),
        )
        .collect();
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    out
}

/// One GPU's sentinels: each figure over the run as a multiple of its first.
#[derive(Debug, Clone)]
pub struct SentinelTrace {
    pub device: u32,
    /// The policy's limit, as the records carry it.
    pub max_drift: f64,
    /// Per figure (`fma`, `read`): its first median (µs) and (run clock, median ÷ first, log line).
    pub figures: Vec<(String, f64, Vec<(f64, f64, usize)>)>,
    /// The furthest a sentinel stood from the first: (gap, run clock, log line).
    pub worst: Option<(f64, f64, usize)>,
    /// The first sentinel beyond the limit: (gap, run clock, log line).
    pub first_beyond: Option<(f64, f64, usize)>,
    /// Sentinels that could not be timed: (log line, why).
    pub failed: Vec<(usize, String)>,
}

pub fn sentinel_traces(ix: &RunIndex) -> Vec<SentinelTrace> {
    let mut traces: BTreeMap<u32, SentinelTrace> = BTreeMap::new();
    for s in &ix.sentinels {
        let tr = traces.entry(s.device).or_insert_with(|| SentinelTrace {
            device: s.device,
            max_drift: s.max_drift,
            figures: Vec::new(),
            worst: None,
            first_beyond: None,
            failed: Vec::new(),
        });
        if let Some(why) = s.error {
            tr.failed.push((s.line, why.to_owned()));
            continue;
        }
        for f in s.figures {
            match tr.figures.iter_mut().find(|x| x.0 == f.name) {
                Some((_, first, points)) => points.push((s.t, f.median_us / *first, s.line)),
                None => tr
                    .figures
                    .push((f.name.clone(), f.median_us, vec![(s.t, 1.0, s.line)])),
            }
        }
    }
    for (s, gap) in ix.sentinel_drift() {
        let Some(tr) = traces.get_mut(&s.device) else {
            continue;
        };
        if tr.worst.is_none_or(|w| gap > w.0) {
            tr.worst = Some((gap, s.t, s.line));
        }
        if gap > s.max_drift && tr.first_beyond.is_none() {
            tr.first_beyond = Some((gap, s.t, s.line));
        }
    }
    traces.into_values().collect()
}
