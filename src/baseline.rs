//! Runs the reference-library adapter (`baselines/torch_sdpa.py`) on the run's shapes and reads its JSON.
use crate::check;
use crate::config::{Dtype, Policies, Shape};
use crate::protocol::TimingStats;
use serde::Deserialize;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// One (backend, shape, dtype) of the reference library: timed, or why not.
pub struct BaselineRow {
    pub backend: String,
    pub shape: String,
    pub dtype: Dtype,
    pub outcome: Result<TimingStats, String>,
    /// Times it was timed again because its p10..p90 spread was above `[baseline] max_spread`.
    pub remeasured: u32,
    /// Its spread stayed above the limit: the figure is reported, marked as not to be trusted.
    pub noisy: bool,
}

/// A roof of the GPU the adapter measured in the same session (dense matmul, device copy).
pub struct Ceiling {
    pub name: String,
    pub dtype: Option<Dtype>,
    pub value: f64,
    pub unit: String,
}

#[derive(Deserialize)]
struct AdapterReply {
    rows: Vec<AdapterRow>,
    /// Absent from adapters that measure no ceilings.
    #[serde(default)]
    ceilings: Vec<AdapterCeiling>,
}

#[derive(Deserialize)]
struct AdapterCeiling {
    name: String,
    dtype: Option<Dtype>,
    value: Option<f64>,
    unit: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct AdapterRow {
    shape: String,
    dtype: Dtype,
    backend: String,
    samples_us: Option<Vec<f64>>,
    launches_per_sample: Option<u32>,
    error: Option<String>,
}

/// Run the adapter; `Err` when it cannot run at all (no PyTorch, no GPU, a crash, a timeout).
pub async fn measure(
    root: &Path,
    policies: &Policies,
    shapes: &[Shape],
) -> Result<Vec<BaselineRow>, String> {
    measure_with_ceilings(root, policies, shapes)
        .await
        .map(|(rows, _)| rows)
}

/// As `measure`, plus the ceilings the adapter measured; a ceiling it could not measure is left out.
pub async fn measure_with_ceilings(
    root: &Path,
    policies: &Policies,
    shapes: &[Shape],
) -> Result<(Vec<BaselineRow>, Vec<Ceiling>), String> {
    let cfg = &policies.baseline;
    let (program, args) = cfg
        .command
        .split_first()
        .ok_or("policies.toml: baseline.command is empty")?;
    let request = serde_json::json!({
        "shapes": shapes,
        "dtypes": policies.dtypes,
        "backends": cfg.backends,
        "warmup_ms": policies.measure.warmup_ms,
        "samples": policies.measure.samples,
        "min_sample_us": policies.measure.min_sample_us,
        "seed": policies.measure.seed,
    });
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", cfg.command.join(" ")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(request.to_string().as_bytes()).await;
    }
    let timeout = Duration::from_secs(policies.timeouts.baseline_s);
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| {
            format!(
                "`{}` did not finish within {} s",
                cfg.command.join(" "),
                timeout.as_secs()
            )
        })?
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{} ({})",
            crate::build::log_tail(&String::from_utf8_lossy(&out.stderr), 3),
            out.status
        ));
    }
    let reply: AdapterReply = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("adapter printed no valid JSON: {e}"))?;
    let flops = |name: &str| {
        shapes
            .iter()
            .find(|s| s.name == name)
            .map_or(0.0, Shape::flops)
    };
    let ceilings = reply
        .ceilings
        .into_iter()
        .filter_map(|c| match (c.value, c.unit, c.error) {
            (Some(value), Some(unit), None) if value.is_finite() && value > 0.0 => Some(Ceiling {
                name: c.name,
                dtype: c.dtype,
                value,
                unit,
            }),
            (_, _, error) => {
                tracing::warn!(ceiling = %c.name, ?error, "ceiling not measured");
                None
            }
        })
        .collect();
    let rows = reply
        .rows
        .into_iter()
        .map(|r| {
            let outcome = match (r.samples_us, r.error) {
                (Some(samples), None) if samples.len() >= 3 => Ok(check::summarize(
                    samples,
                    r.launches_per_sample.unwrap_or(1),
                    flops(&r.shape),
                )),
                (_, Some(e)) => Err(e),
                _ => Err("adapter returned too few samples".into()),
            };
            BaselineRow {
                backend: r.backend,
                shape: r.shape,
                dtype: r.dtype,
                outcome,
                remeasured: 0,
                noisy: false,
            }
        })
        .collect();
    Ok((rows, ceilings))
}
