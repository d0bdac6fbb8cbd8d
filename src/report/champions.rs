//! The champion table: per (shape, dtype) the fastest correct variant of a run, with the log line that proves it; committed with git2.
use crate::log::runindex::RunIndex;
use crate::log::runlog::LoadedLog;
use crate::model::config::Dtype;
use crate::model::space::Params;
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
    /// A variant within the noise of this one on this case: the two are tied, and which of them
    /// holds the case is not a finding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_with: Option<Tie>,
    /// "tied, kept": the committed table already named this variant and it ties with the run's
    /// fastest (`tied_with`), so the table does not change hands on noise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
}

/// The other side of a tie, and how close the two are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tie {
    pub variant: String,
    pub median_us: f64,
    /// slower median / faster median - 1 (from a duel: the duel's |gain|).
    pub gap: f64,
    /// The larger relative p10..p90 spread of the two, or the interleaved duel's noise.
    pub noise: f64,
    /// The interleaved duel that judged the two, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duel_line: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub champion: Vec<Champion>,
}

/// The fastest timed variant per (shape, dtype), each case as its last record left it, with its
/// runner-up named where the two are tied.
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
                tied_with: pick.tie.zip(pick.runner_up).and_then(|(c, r)| {
                    Some(Tie {
                        variant: r.variant.to_owned(),
                        median_us: r.measured()?.median_us,
                        gap: c.gap,
                        noise: c.noise,
                        duel_line: c.duel_line,
                    })
                }),
                kept: false,
            });
        }
    }
    out
}

/// Where the committed table already names a variant that ties with this run's fastest, keep it:
/// a tie is not a change of champion. Its figures are this run's (the variant must have been
/// measured here to tie), marked `kept`, with the run's fastest as `tied_with`.
pub fn keep_committed_ties(
    ix: &RunIndex,
    champions: &[Champion],
    committed: &[Champion],
) -> Vec<Champion> {
    let header = ix.header;
    champions
        .iter()
        .map(|c| {
            // A committed variant that faulted in this run is not kept, tie or no tie.
            let held = committed
                .iter()
                .find(|h| h.shape == c.shape && h.dtype == c.dtype && h.variant != c.variant)
                .filter(|h| ix.disqualified_on(&h.variant, &c.shape).is_none());
            let kept = held.and_then(|h| {
                let theirs = ix.case(&h.variant, &c.shape, c.dtype)?;
                let ours = ix.case(&c.variant, &c.shape, c.dtype)?;
                let close = ix.closeness(ours, theirs).filter(|x| x.tied())?;
                let timing = theirs.measured()?;
                Some(Champion {
                    variant: h.variant.clone(),
                    params: ix.params_of(&h.variant).cloned().unwrap_or_default(),
                    median_us: timing.median_us,
                    tflops: timing.tflops,
                    speedup_vs_baseline: header
                        .and_then(|hd| ix.case(&hd.baseline, &c.shape, c.dtype))
                        .and_then(|b| b.measured())
                        .map(|b| b.median_us / timing.median_us),
                    log_line: theirs.log_line(),
                    tied_with: Some(Tie {
                        variant: c.variant.clone(),
                        median_us: c.median_us,
                        gap: close.gap,
                        noise: close.noise,
                        duel_line: close.duel_line,
                    }),
                    kept: true,
                    ..c.clone()
                })
            });
            kept.unwrap_or_else(|| c.clone())
        })
        .collect()
}

/// The champion table as HEAD has it at `table_path`; empty when there is none (or it does not parse).
pub fn committed(root: &Path, table_path: &str) -> Vec<Champion> {
    let read = || -> Option<Vec<Champion>> {
        let repo = git2::Repository::discover(root).ok()?;
        let tree = repo.head().ok()?.peel_to_tree().ok()?;
        let entry = tree.get_path(Path::new(table_path)).ok()?;
        let blob = repo.find_blob(entry.id()).ok()?;
        let table: Table = toml::from_str(std::str::from_utf8(blob.content()).ok()?).ok()?;
        Some(table.champion)
    };
    read().unwrap_or_default()
}

pub fn to_toml(champions: &[Champion]) -> String {
    let body = toml::to_string(&Table {
        champion: champions.to_vec(),
    })
    .expect("champions serialize");
    format!("# Written by flashtune from a run log: per (shape, dtype) the fastest variant with no runtime fault\n# (wrong answer, crash, hang, write outside its outputs, quarantine, figure beyond a roof) on any case\n# of the run (on its own shape under per-shape dispatch), or the one committed before where the two tie.\n# Each figure names the run and the log line it came from.\n\n{body}")
}

/// Commit the table on `flashtune/<run-id>` (never the current branch) with the figures as trailers.
/// A champion that ties with the variant HEAD's table names is not a change: that one is kept.
pub fn commit(
    root: &Path,
    table_path: &str,
    log: &LoadedLog,
    champions: &[Champion],
) -> Result<(String, String), git2::Error> {
    let header = log
        .header()
        .ok_or_else(|| git2::Error::from_str("run log has no header"))?;
    let champions =
        &keep_committed_ties(&RunIndex::new(log), champions, &committed(root, table_path));
    let branch = format!("flashtune/{}", header.run_id);
    let speedups: Vec<f64> = champions
        .iter()
        .filter_map(|c| c.speedup_vs_baseline)
        .collect();
    let geomean = (!speedups.is_empty())
        .then(|| (speedups.iter().map(|x| x.ln()).sum::<f64>() / speedups.len() as f64).exp());
    let mut message = format!("flashtune: champions of run {}\n\n", header.run_id);
    for c in champions {
        let tie = match (&c.tied_with, c.kept) {
            (Some(t), true) => format!(" (tied with {} at {:.2} µs, kept)", t.variant, t.median_us),
            (Some(t), false) => format!(" (tied with {} at {:.2} µs)", t.variant, t.median_us),
            (None, _) => String::new(),
        };
        message.push_str(&format!(
            "{} {}: {} {:.2} µs ({:.1} TF/s){tie}\n",
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
    let id = crate::os::vcs::commit_files_to_branch(
        root,
        &branch,
        &[(table_path, toml.as_bytes())],
        &message,
    )?;
    Ok((branch, id))
}
