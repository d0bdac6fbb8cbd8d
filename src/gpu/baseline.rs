//! Runs the reference-library adapter (`baselines/torch_sdpa.py`) on the run's shapes, reads its JSON, and re-times the rows too noisy to believe.
use crate::gpu::check;
use crate::model::config::{Dtype, Policies, Shape};
use crate::model::protocol::TimingStats;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// One (backend, shape, dtype) of the reference library: timed, or why not.
#[derive(Debug, Clone)]
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
    pub name: crate::model::vocab::Roof,
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
    measure_rotating(root, policies, shapes, &BTreeMap::new(), 0, true).await
}

/// Input sets the adapter's timed calls rotate over on `shape`: enough for twice the L2 cache
/// (Q, K, V read, O written per call), at least the trial's minimum, at most its launch cap.
pub fn rotating_sets(shape: &Shape, l2_bytes: u64) -> u32 {
    let per_set = 2
        * (2 * shape.b as u64 * shape.h as u64 * (shape.sq as u64 + shape.sk as u64))
        * shape.d as u64;
    (2 * l2_bytes).div_ceil(per_set.max(1)).clamp(
        crate::gpu::trial::MIN_LAUNCHES as u64,
        crate::gpu::trial::MAX_LAUNCHES as u64,
    ) as u32
}

/// As `measure_with_ceilings`, each shape's timed calls rotating over `sets[shape name]` distinct
/// input sets (1 where absent), the way the worker times the variants, so neither side is timed
/// on inputs left in L2 by the call before. A row whose p10..p90 spread is above
/// `[baseline] max_spread` is timed again, up to `remeasure` times, and the tightest timing kept;
/// one still above the limit is marked `noisy`. Everything runs on GPU `gpu` (a CUDA ordinal, as
/// the workers count them); the roofs are measured only with `roofs`.
pub async fn measure_rotating(
    root: &Path,
    policies: &Policies,
    shapes: &[Shape],
    sets: &BTreeMap<String, u32>,
    gpu: u32,
    roofs: bool,
) -> Result<(Vec<BaselineRow>, Vec<Ceiling>), String> {
    let cfg = &policies.baseline;
    let dtypes: Vec<Dtype> = policies.dtypes.clone();
    let all: Vec<&Shape> = shapes.iter().collect();
    let reply = run_adapter(
        root,
        policies,
        request(policies, &all, &dtypes, &cfg.backends, sets, gpu, roofs),
    )
    .await?;
    let ceilings = reply
        .ceilings
        .into_iter()
        .filter_map(|c| {
            match (
                crate::model::vocab::Roof::named(&c.name),
                c.value,
                c.unit,
                c.error,
            ) {
                (Some(name), Some(value), Some(unit), None) if value.is_finite() && value > 0.0 => {
                    Some(Ceiling {
                        name,
                        dtype: c.dtype,
                        value,
                        unit,
                    })
                }
                (_, _, _, error) => {
                    tracing::warn!(ceiling = %c.name, ?error, "ceiling not measured");
                    None
                }
            }
        })
        .collect();
    let mut rows = rows_of(reply.rows, shapes);
    for _ in 0..cfg.remeasure {
        let noisy: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].spread().is_some_and(|s| s > cfg.max_spread))
            .collect();
        if noisy.is_empty() {
            break;
        }
        // One adapter call re-times the noisy rows.
        let mut again_shapes: Vec<&Shape> = Vec::new();
        let mut again_dtypes: Vec<Dtype> = Vec::new();
        let mut again_backends: Vec<String> = Vec::new();
        for &i in &noisy {
            let r = &rows[i];
            if let Some(shape) = shapes.iter().find(|s| s.name == r.shape) {
                if !again_shapes.iter().any(|s| s.name == shape.name) {
                    again_shapes.push(shape);
                }
            }
            if !again_dtypes.contains(&r.dtype) {
                again_dtypes.push(r.dtype);
            }
            if !again_backends.contains(&r.backend) {
                again_backends.push(r.backend.clone());
            }
        }
        let mut again = request(
            policies,
            &again_shapes,
            &again_dtypes,
            &again_backends,
            sets,
            gpu,
            false,
        );
        // Only the noisy rows themselves, not every row of their shapes, dtypes and backends: on the
        // attention space 11 noisy rows made 40 (an adapter that ignores "only" times them all).
        again["only"] = noisy
            .iter()
            .map(|&i| serde_json::json!([rows[i].shape, rows[i].dtype, rows[i].backend]))
            .collect();
        let again = match run_adapter(root, policies, again).await {
            Ok(reply) => rows_of(reply.rows, shapes),
            Err(why) => {
                tracing::warn!(%why, "re-measuring the noisy baseline rows failed");
                break;
            }
        };
        for i in noisy {
            let row = &mut rows[i];
            row.remeasured += 1;
            let fresh = again
                .iter()
                .find(|a| a.backend == row.backend && a.shape == row.shape && a.dtype == row.dtype);
            if let Some(fresh) = fresh {
                if fresh
                    .spread()
                    .is_some_and(|s| row.spread().is_none_or(|old| s < old))
                {
                    row.outcome = fresh.outcome.clone();
                }
            }
        }
    }
    for row in &mut rows {
        row.noisy = row.spread().is_some_and(|s| s > cfg.max_spread);
    }
    Ok((rows, ceilings))
}

impl BaselineRow {
    /// (p90 - p10) / median of a timed row.
    pub fn spread(&self) -> Option<f64> {
        let t = self.outcome.as_ref().ok()?;
        Some((t.p90_us - t.p10_us) / t.median_us)
    }
}

/// The adapter's request: each shape as the run has it, plus its input-set count where it rotates.
fn request(
    policies: &Policies,
    shapes: &[&Shape],
    dtypes: &[Dtype],
    backends: &[String],
    sets: &BTreeMap<String, u32>,
    gpu: u32,
    ceilings: bool,
) -> serde_json::Value {
    let shapes: Vec<serde_json::Value> = shapes
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).expect("shapes serialize");
            if let Some(n) = sets.get(&s.name) {
                v["sets"] = serde_json::json!(n);
            }
            v
        })
        .collect();
    serde_json::json!({
        "shapes": shapes,
        "dtypes": dtypes,
        "backends": backends,
        "warmup_ms": policies.measure.warmup_ms,
        "samples": policies.measure.samples,
        "min_sample_us": policies.measure.min_sample_us,
        "seed": policies.measure.seed,
        "ceilings": ceilings,
        "device": gpu,
    })
}

/// The adapter's command line (`[baseline] command`), run from the project root.
fn adapter_command(root: &Path, policies: &Policies) -> Result<tokio::process::Command, String> {
    let (program, args) = policies
        .baseline
        .command
        .split_first()
        .ok_or("policies.toml: baseline.command is empty")?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).current_dir(root).kill_on_drop(true);
    Ok(cmd)
}

/// Start the adapter, hand it the request, read its one JSON reply.
async fn run_adapter(
    root: &Path,
    policies: &Policies,
    request: serde_json::Value,
) -> Result<AdapterReply, String> {
    let cfg = &policies.baseline;
    let mut child = adapter_command(root, policies)?
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
            crate::gpu::build::log_tail(&String::from_utf8_lossy(&out.stderr), 3),
            out.status
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("adapter printed no valid JSON: {e}"))
}

fn rows_of(rows: Vec<AdapterRow>, shapes: &[Shape]) -> Vec<BaselineRow> {
    let flops = |name: &str| {
        shapes
            .iter()
            .find(|s| s.name == name)
            .map_or(0.0, Shape::flops)
    };
    rows.into_iter()
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
        .collect()
}

/// What a stored baseline must share with a new one to stand for it, beside the GPU model and
/// driver: the reference library's package versions, the adapter's code and the request's knobs.
#[derive(Debug, Clone)]
pub struct Library {
    pub versions: BTreeMap<String, String>,
    /// BLAKE3 over the versions, the command, each of its arguments' file contents (the adapter
    /// script) and the measurement policy the adapter is asked to time with.
    pub fingerprint: String,
}

#[derive(Deserialize)]
struct VersionsReply {
    versions: BTreeMap<String, String>,
}

/// Ask the adapter (`command --versions`) which packages its figures come from; `Err` says why
/// not (an adapter without `--versions` times as before, with nothing taken from the store).
pub async fn library(root: &Path, policies: &Policies) -> Result<Library, String> {
    let cfg = &policies.baseline;
    let asked = adapter_command(root, policies)?
        .arg("--versions")
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), asked)
        .await
        .map_err(|_| "the adapter's --versions did not answer within 60 s".to_owned())?
        .map_err(|e| format!("cannot start `{}`: {e}", cfg.command.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "the adapter's --versions failed: {} ({})",
            crate::gpu::build::log_tail(&String::from_utf8_lossy(&out.stderr), 2),
            out.status
        ));
    }
    let reply: VersionsReply = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("the adapter's --versions printed no versions: {e}"))?;
    // The adapter's own code counts as much as the packages': hash every argument that is a file.
    let files: BTreeMap<&str, String> = cfg
        .command
        .iter()
        .filter_map(|arg| {
            let bytes = std::fs::read(root.join(arg)).ok()?;
            Some((arg.as_str(), blake3::hash(&bytes).to_hex().to_string()))
        })
        .collect();
    let m = &policies.measure;
    let identity = serde_json::json!({
        "versions": reply.versions,
        "command": cfg.command,
        "files": files,
        "backends": cfg.backends,
        "max_spread": cfg.max_spread,
        "remeasure": cfg.remeasure,
        "warmup_ms": m.warmup_ms,
        "samples": m.samples,
        "min_sample_us": m.min_sample_us,
        "seed": m.seed,
    });
    Ok(Library {
        fingerprint: blake3::hash(identity.to_string().as_bytes())
            .to_hex()
            .to_string(),
        versions: reply.versions,
    })
}
