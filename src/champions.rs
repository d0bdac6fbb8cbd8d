//! The champion table: per (shape, dtype) the fastest correct variant of a run, with the log line that proves it; committed with git2.
use crate::config::Dtype;
use crate::runindex::RunIndex;
use crate::runlog::LoadedLog;
use crate::space::Params;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Champion {
    pub shape: String,
    pub dtype: Dtype,
    pub variant: String,
    pub params: Params,
    pub median_us: f64,
    pub tflops: f64,
    /// Baseline median / champion median on this shape, when the baseline was measured.
    pub speedup_vs_baseline: Option<f64>,
    pub run: String,
    /// The `timed` record behind the figures.
    pub log_line: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub champion: Vec<Champion>,
}

/// The fastest timed variant per (shape, dtype), each case as its last record left it.
pub fn from_log(log: &LoadedLog) -> Vec<Champion> {
    from_index(&RunIndex::new(log))
}

pub fn from_index(ix: &RunIndex) -> Vec<Champion> {
    let Some(header) = ix.header else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for shape in &header.shapes {
        for &dtype in &header.dtypes {
            let Some(pick) = ix.pick(&shape.name, dtype) else {
                continue;
            };
            let best = pick.best;
            let timing = best.measured().expect("a pick is measured");
            let baseline = ix
                .case(&header.baseline, &shape.name, dtype)
                .and_then(|c| c.measured())
                .map(|b| b.median_us / timing.median_us);
            out.push(Champion {
                shape: shape.name.clone(),
                dtype,
                variant: best.variant.to_owned(),
                params: ix.params_of(best.variant).cloned().unwrap_or_default(),
                median_us: timing.median_us,
                tflops: timing.tflops,
                speedup_vs_baseline: baseline,
                run: header.run_id.clone(),
                log_line: best.log_line(),
            });
        }
    }
    out
}

pub fn to_toml(champions: &[Champion]) -> String {
    let body = toml::to_string(&Table {
        champion: champions.to_vec(),
    })
    .expect("champions serialize");
    format!("# Written by flashtune from a run log: per (shape, dtype) the fastest variant that passed every check.\n# Each figure names the run and the log line it came from.\n\n{body}")
}

/// Commit the table on `flashtune/<run-id>` (never the current branch) with the figures as trailers.
pub fn commit(
    root: &Path,
    table_path: &str,
    log: &LoadedLog,
    champions: &[Champion],
) -> Result<(String, String), git2::Error> {
    let header = log
        .header()
        .ok_or_else(|| git2::Error::from_str("run log has no header"))?;
    let branch = format!("flashtune/{}", header.run_id);
    let speedups: Vec<f64> = champions
        .iter()
        .filter_map(|c| c.speedup_vs_baseline)
        .collect();
    let geomean = (!speedups.is_empty())
        .then(|| (speedups.iter().map(|x| x.ln()).sum::<f64>() / speedups.len() as f64).exp());
    let mut message = format!("flashtune: champions of run {}\n\n", header.run_id);
    for c in champions {
        message.push_str(&format!(
            "{} {}: {} {:.2} µs ({:.1} TF/s)\n",
            c.shape, c.dtype, c.variant, c.median_us, c.tflops
        ));
    }
    message.push_str(&format!(
        "\nFlashtune-Run: {}\nFlashtune-GPU: {}\n",
        header.run_id, header.device.name
    ));
    if let Some(g) = geomean {
        message.push_str(&format!(
            "Flashtune-Speedup: {g:.3}x geomean vs {}\n",
            header.baseline
        ));
    }
    let toml = to_toml(champions);
    let id = crate::vcs::commit_files_to_branch(
        root,
        &branch,
        &[(table_path, toml.as_bytes())],
        &message,
    )?;
    Ok((branch, id))
}
