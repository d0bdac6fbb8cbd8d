//! The figures a pack gives for each of HEAD's cases, read from every run log: HEAD's time (a duel's
//! interleaved figure, else the latest timing of the same kernel sources), PyTorch's, the roofs, and
//! the champion's Nsight Compute profile: its speed of light and the bottleneck with its evidence.
use super::history::{logs_where, HistoryEntry, LogMeta};
use super::{Bottleneck, CaseContext, PackCase, PackInput, Sourced};
use crate::log::runlog::{self, Record};
use crate::model::config::Dtype;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Nsight Compute's speed-of-light figures for the champion's main kernel (% of peak).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SpeedOfLight {
    /// `sm__throughput.avg.pct_of_peak_sustained_elapsed`.
    pub sm_pct: Option<f64>,
    /// `dram__throughput.avg.pct_of_peak_sustained_elapsed`.
    pub dram_pct: Option<f64>,
    /// `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`.
    pub memory_pct: Option<f64>,
    /// `sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active`.
    pub tensor_pipe_pct: Option<f64>,
    /// `sm__warps_active.avg.pct_of_peak_sustained_active`: achieved occupancy.
    pub warps_active_pct: Option<f64>,
}

impl SpeedOfLight {
    pub fn of(k: &crate::gpu::profile::KernelProfile) -> SpeedOfLight {
        SpeedOfLight {
            sm_pct: k.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            dram_pct: k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            memory_pct: k.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
            tensor_pipe_pct: k
                .get("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
            warps_active_pct: k.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        }
    }

    /// `SM 55%, DRAM 20%, tensor pipe 45%, warps active 50%`, the figures known.
    pub fn line(&self) -> String {
        [
            ("SM", self.sm_pct),
            ("DRAM", self.dram_pct),
            ("memory", self.memory_pct),
            ("tensor pipe", self.tensor_pipe_pct),
            ("warps active", self.warps_active_pct),
        ]
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} {v:.0}%")))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// Whether some run log holds a profile of `variant` on (shape, dtype) taken of the kernel sources
/// `sources` on the GPU `gpu`: a session reuses it rather than profiling the champion again.
pub fn has_profile(
    runs_dir: &Path,
    gpu: &str,
    sources: &str,
    variant: &str,
    shape: &str,
    dtype: Dtype,
) -> bool {
    logs_where(runs_dir, |t| t.contains("\"event\":\"profiled\""))
        .iter()
        .filter(|(m, _)| m.gpu == gpu)
        .any(|(m, log)| {
            log.entries.iter().any(|(_, e)| {
                matches!(&e.record, Record::Profiled {
                    variant: v, shape: s, dtype: d, sources: src,
                    profile: crate::gpu::profile::ProfileOutcome::Profiled { .. },
                } if v == variant && s == shape && *d == dtype
                    && src.as_deref().unwrap_or(&m.kernel_sources_hash) == sources)
            })
        })
}

/// HEAD's own figure for a case, from the history: a duel whose champion side was the base commit,
/// or whose edit became it (the latest such duel on this GPU).
fn head_figure(input: &PackInput, c: &PackCase, history: &[HistoryEntry]) -> Option<Sourced> {
    let gpu = input.device.map(|d| d.name.as_str());
    let mut champion_us: Option<Sourced> = None;
    for h in history.iter().filter(|h| h.gpu == gpu.unwrap_or(&h.gpu)) {
        for f in h
            .cases
            .iter()
            .filter(|f| f.shape == c.shape.name && f.dtype == c.dtype)
        {
            let value = if h.commit.as_deref() == Some(input.base_commit) {
                f.challenger_us
            } else if h.base_commit == input.base_commit {
                f.champion_us
            } else {
                None
            };
            if let Some(v) = value {
                champion_us = Some(Sourced {
                    value: v,
                    from: format!("run {} line {} (step {} duel)", h.run_id, f.line, h.step),
                });
            }
        }
    }
    champion_us
}

pub(super) fn case_context(
    input: &PackInput,
    c: &PackCase,
    history: &[HistoryEntry],
    logs: &[(LogMeta, runlog::SealedLog)],
) -> CaseContext {
    let gpu = input.device.map(|d| d.name.as_str());
    let same_gpu = |m: &LogMeta| gpu.is_none_or(|g| g == m.gpu);
    let champion_us = head_figure(input, c, history);
    let mut timed_us: Option<Sourced> = None;
    let mut pytorch_us = None;
    let mut bottleneck: Option<Bottleneck> = None;
    for (meta, log) in logs.iter().filter(|(m, _)| same_gpu(m)) {
        let same_log_sources = meta.kernel_sources_hash == input.kernel_sources_hash;
        for (line, e) in &log.entries {
            let from = || format!("run {} line {line}", meta.run_id);
            match &e.record {
                Record::Timed {
                    variant,
                    shape,
                    dtype,
                    timing,
                    ..
                } if same_log_sources
                    && *variant == c.variant
                    && *shape == c.shape.name
                    && *dtype == c.dtype =>
                {
                    // The latest timing of HEAD's sources; a duel's interleaved figure beats it.
                    timed_us = Some(Sourced {
                        value: timing.median_us,
                        from: from(),
                    });
                }
                Record::BaselineTimed {
                    shape,
                    dtype,
                    timing,
                    noisy: false,
                    ..
                } if *shape == c.shape.name && *dtype == c.dtype => {
                    pytorch_us = Some(Sourced {
                        value: timing.median_us,
                        from: from(),
                    });
                }
                Record::Profiled {
                    variant,
                    shape,
                    dtype,
                    profile:
                        crate::gpu::profile::ProfileOutcome::Profiled {
                            kernels,
                            bottlenecks,
                            ..
                        },
                    sources,
                } if *variant == c.variant && *shape == c.shape.name && *dtype == c.dtype => {
                    let same_sources = sources
                        .as_deref()
                        .map_or(same_log_sources, |s| s == input.kernel_sources_hash);
                    // A profile of the champion's current sources beats an older one.
                    if bottleneck
                        .as_ref()
                        .is_some_and(|b| b.same_sources && !same_sources)
                    {
                        continue;
                    }
                    let rules = &input.policies.profile.bottlenecks;
                    let mut metrics = BTreeMap::new();
                    for k in kernels.iter().take(1) {
                        for (name, m) in &k.metrics {
                            let underscored = name.replace('.', "_");
                            let read = rules.iter().any(|r| {
                                bottlenecks.contains(&r.name) && r.when.contains(&underscored)
                            });
                            if read {
                                metrics.insert(name.clone(), m.value);
                            }
                        }
                    }
                    bottleneck = Some(Bottleneck {
                        names: bottlenecks.clone(),
                        metrics,
                        speed_of_light: kernels.first().map(SpeedOfLight::of).unwrap_or_default(),
                        from: from(),
                        same_sources,
                    });
                }
                _ => {}
            }
        }
    }
    let champion_us = champion_us.or(timed_us);
    let guided = bottleneck
        .as_ref()
        .map(|b| {
            input
                .policies
                .guided
                .rules
                .iter()
                .filter(|r| b.names.contains(&r.bottleneck))
                .map(|r| {
                    let change: Vec<String> =
                        r.change.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    format!("{} ({})", r.name, change.join(", "))
                })
                .collect()
        })
        .unwrap_or_default();
    let tflops = champion_us
        .as_ref()
        .map(|t| c.shape.flops() / (t.value * 1e-6) / 1e12);
    let matmul_roof_fraction = tflops
        .zip(input.roofs.matmul.get(&c.dtype))
        .map(|(t, r)| t / r);
    let bandwidth_roof_fraction = champion_us
        .as_ref()
        .zip(input.roofs.bandwidth_gbps)
        .map(|(t, r)| c.shape.min_dram_bytes(c.dtype) / (t.value * 1e-6) / 1e9 / r);
    CaseContext {
        shape: c.shape.clone(),
        dtype: c.dtype,
        variant: c.variant.clone(),
        params: c.params.clone(),
        champion_us,
        tflops,
        matmul_roof_fraction,
        bandwidth_roof_fraction,
        pytorch_us,
        bottleneck,
        guided,
    }
}
