//! Nsight Compute: run a variant under `ncu` (report, then CSV import), parse metrics by header name, and name the bottleneck.
use crate::model::config::ProfilePolicy;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// One metric value with its unit, as the raw page gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub value: f64,
    pub unit: String,
}

/// One profiled kernel launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelProfile {
    pub id: u32,
    pub kernel: String,
    pub block_size: String,
    pub grid_size: String,
    pub metrics: BTreeMap<String, Metric>,
}

impl KernelProfile {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).map(|m| m.value)
    }
}

/// What came of a profiling attempt; every outcome is a record, none is an error of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ProfileOutcome {
    Profiled {
        kernels: Vec<KernelProfile>,
        bottlenecks: Vec<String>,
        report: PathBuf,
    },
    NoPermission {
        detail: String,
    },
    NoKernelsProfiled,
    TimedOut {
        seconds: u64,
    },
    NcuMissing,
    Failed {
        detail: String,
    },
}

/// Parse ncu's raw page (`--csv --page raw --print-units base`): header row, units row, one row per
/// launch. Anything before the header (program output, `==PROF==` lines) is skipped.
pub fn parse_raw_csv(text: &str) -> Result<Vec<KernelProfile>> {
    let start = text
        .lines()
        .position(|l| l.starts_with("\"ID\","))
        .ok_or_else(|| anyhow!("no CSV header (\"ID\", ...) in ncu output"))?;
    let csv: String = text
        .lines()
        .skip(start)
        .filter(|l| l.starts_with('"'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(csv.as_bytes());
    let mut rows = reader.records();
    let header = rows.next().ok_or_else(|| anyhow!("empty CSV"))??;
    let units = rows.next().ok_or_else(|| anyhow!("no units row"))??;
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| anyhow!("no `{name}` column"))
    };
    let (id, kernel, block, grid) = (
        col("ID")?,
        col("Kernel Name")?,
        col("Block Size")?,
        col("Grid Size")?,
    );
    // Metric columns are the ones named like `unit__counter...`; the rest describe the launch.
    let metric_cols: Vec<usize> = header
        .iter()
        .enumerate()
        .filter(|(_, h)| h.contains("__"))
        .map(|(i, _)| i)
        .collect();
    let mut out = Vec::new();
    for row in rows {
        let row = row?;
        let mut metrics = BTreeMap::new();
        for &i in &metric_cols {
            if let Some(value) = row.get(i).and_then(parse_number) {
                metrics.insert(
                    header[i].to_owned(),
                    Metric {
                        value,
                        unit: units.get(i).unwrap_or("").to_owned(),
                    },
                );
            }
        }
        out.push(KernelProfile {
            id: row.get(id).and_then(|s| s.parse().ok()).unwrap_or(0),
            kernel: row.get(kernel).unwrap_or("").to_owned(),
            block_size: row.get(block).unwrap_or("").to_owned(),
            grid_size: row.get(grid).unwrap_or("").to_owned(),
            metrics,
        });
    }
    Ok(out)
}

/// "65,920" → 65920; "n/a" and text → None.
fn parse_number(s: &str) -> Option<f64> {
    let cleaned: String = s.chars().filter(|&c| c != ',').collect();
    cleaned.trim().parse().ok()
}

pub fn no_kernels_profiled(output: &str) -> bool {
    output.contains("No kernels were profiled")
}

/// The policy's bottleneck rules that hold for one launch, in policy order.
pub fn classify(
    kernel: &KernelProfile,
    rules: &[crate::model::config::BottleneckRule],
) -> Vec<String> {
    use evalexpr::{ContextWithMutableVariables, HashMapContext, Value};
    let mut ctx = HashMapContext::new();
    for (name, m) in &kernel.metrics {
        // evalexpr names cannot hold dots.
        let _ = ctx.set_value(name.replace('.', "_"), Value::Float(m.value));
    }
    rules
        .iter()
        .filter(|r| evalexpr::eval_boolean_with_context(&r.when, &ctx).unwrap_or(false))
        .map(|r| r.name.clone())
        .collect()
}

/// Profile one worker request under ncu: `ncu ... -o report flashtune worker`, then import the raw page.
pub async fn profile(
    policy: &ProfilePolicy,
    device: u32,
    request_json: &[u8],
    report_base: &Path,
    launches: u32,
    timeout: Duration,
) -> ProfileOutcome {
    let Some(ncu) = find_ncu() else {
        return ProfileOutcome::NcuMissing;
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return ProfileOutcome::Failed {
                detail: e.to_string(),
            }
        }
    };
    let report = report_base.with_extension("ncu-rep");
    let mut cmd = tokio::process::Command::new(&ncu);
    cmd.args(["--clock-control", "none", "--target-processes", "all", "-f"])
        .args(["-k", &format!("regex:{}", policy.kernel_regex)])
        .args(["--launch-count", &launches.to_string()])
        .args(["--metrics", &policy.metrics.join(",")])
        .arg("-o")
        .arg(report_base)
        .arg(&exe)
        .arg("worker")
        .arg("--device")
        .arg(device.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::gpu::build::die_with_parent(&mut cmd);
    let run = async {
        let mut child = cmd.spawn().context("cannot start ncu")?;
        let _group = crate::gpu::build::ProcessGroup(child.id());
        if let Some(mut stdin) = child.stdin.take() {
            use tokio::io::AsyncWriteExt;
            stdin.write_all(request_json).await?;
            // One request per line: the newline ends it, closing stdin ends the worker.
            stdin.write_all(b"\n").await?;
        }
        let out = child.wait_with_output().await?;
        Ok::<_, anyhow::Error>(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    let output = match tokio::time::timeout(timeout, run).await {
        Err(_) => {
            return ProfileOutcome::TimedOut {
                seconds: timeout.as_secs(),
            }
        }
        Ok(Err(e)) => {
            return ProfileOutcome::Failed {
                detail: format!("{e:#}"),
            }
        }
        Ok(Ok(o)) => o,
    };
    if output.contains("ERR_NVGPUCTRPERM") {
        return ProfileOutcome::NoPermission {
            detail: crate::gpu::build::log_tail(&output, 3),
        };
    }
    if no_kernels_profiled(&output) || !report.is_file() {
        return if no_kernels_profiled(&output) {
            ProfileOutcome::NoKernelsProfiled
        } else {
            ProfileOutcome::Failed {
                detail: crate::gpu::build::log_tail(&output, 5),
            }
        };
    }
    match import(&ncu, &report).await {
        Ok(kernels) if kernels.is_empty() => ProfileOutcome::NoKernelsProfiled,
        Ok(kernels) => {
            let mut bottlenecks: Vec<String> = Vec::new();
            for name in kernels
                .iter()
                .flat_map(|k| classify(k, &policy.bottlenecks))
            {
                if !bottlenecks.contains(&name) {
                    bottlenecks.push(name);
                }
            }
            ProfileOutcome::Profiled {
                kernels,
                bottlenecks,
                report,
            }
        }
        Err(e) => ProfileOutcome::Failed {
            detail: format!("{e:#}"),
        },
    }
}

async fn import(ncu: &Path, report: &Path) -> Result<Vec<KernelProfile>> {
    let out = tokio::process::Command::new(ncu)
        .arg("-i")
        .arg(report)
        .args(["--csv", "--page", "raw", "--print-units", "base"])
        .output()
        .await
        .context("ncu -i")?;
    if !out.status.success() {
        bail!(
            "ncu -i {} failed: {}",
            report.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_raw_csv(&String::from_utf8_lossy(&out.stdout))
}

pub fn find_ncu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLASHTUNE_NCU") {
        return Some(p.into());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/local/cuda/bin".into());
    dirs.into_iter()
        .map(|d| d.join("ncu"))
        .find(|p| p.is_file())
}
