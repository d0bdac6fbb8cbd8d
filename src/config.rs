//! Loads `policies.toml` (and any TOML file) strictly, with errors that name file, line, column and key.
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Everything that decides what is built, how it is judged and how it is measured.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Policies {
    /// The variant space `flashtune tune` walks when no `--space` is given.
    pub default_space: PathBuf,
    /// Element types every variant is checked and timed in.
    pub dtypes: Vec<Dtype>,
    pub build: BuildPolicy,
    pub gates: Gates,
    /// Correctness limits per dtype, against the fp32 reference kernel.
    pub tolerance: BTreeMap<Dtype, Tolerance>,
    pub measure: MeasurePolicy,
    pub baseline: BaselinePolicy,
    pub profile: ProfilePolicy,
    pub guided: GuidedPolicy,
    pub timeouts: Timeouts,
    /// `flashtune step`: when a kernel edit beats HEAD's champion.
    pub step: StepPolicy,
    pub shapes: Vec<Shape>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StepPolicy {
    /// Smallest geomean gain (0.02 = 2% faster) an edit must show, beyond the noise, to be kept.
    pub threshold: f64,
    /// Interleaved samples per side (champion, challenger) per shape and dtype.
    pub rounds: usize,
    /// Seconds a `--proposer` command may run before its process group is killed.
    pub proposer_timeout_s: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BuildPolicy {
    /// The device assumed when no GPU is visible (`flashtune build` on a CPU-only machine).
    pub default_device: DefaultDevice,
    pub nvcc_flags: Vec<String>,
    /// Parallel nvcc processes; 0 means one per CPU core.
    pub jobs: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultDevice {
    pub arch: String,
    pub max_threads_per_block: u32,
    pub max_smem_optin_bytes: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Gates {
    /// Spill stores + spill loads allowed per entry function, in bytes.
    pub max_spill_bytes: u64,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Largest |O - O_ref| over all elements.
    pub max_abs: f64,
    /// ||O - O_ref||_2 / ||O_ref||_2.
    pub rel_l2: f64,
    /// Largest |LSE - LSE_ref|.
    pub lse_max_abs: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MeasurePolicy {
    /// Untimed graph replays before sampling, in milliseconds of GPU time.
    pub warmup_ms: f64,
    /// Timed samples kept per (variant, shape, dtype).
    pub samples: usize,
    /// Kernel launches per captured graph are chosen so one sample lasts at least this long.
    pub min_sample_us: f64,
    /// Shapes at most this many multiply-adds are also checked against a CPU f64 oracle.
    pub cpu_reference_max_macs: f64,
    /// Seed of the first input set; each (variant, shape, dtype) derives its own from it.
    pub seed: u64,
}

/// The reference library timed beside the variants, in the same run.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BaselinePolicy {
    /// Program and arguments, run from the project root; empty to skip.
    pub command: Vec<String>,
    pub backends: Vec<String>,
    /// A row whose (p90 - p10) / median is above this is timed again (0.05 = 5%).
    pub max_spread: f64,
    /// How many times such a row is timed again before it is reported as noisy.
    pub remeasure: u32,
}

/// The Nsight Compute pass after timing: which variants, which metrics, how to read them.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilePolicy {
    pub enabled: bool,
    /// Profile every variant within this many percent of a shape's champion (0: champions only).
    pub within_pct: f64,
    /// In a chain space, profile every step on every shape, so the ablation table explains each step.
    pub chain_steps: bool,
    /// Only these dtypes are profiled (profiling is slow and the dtypes rarely differ in kind).
    pub dtypes: Vec<Dtype>,
    /// Kernels of the variant (not the reference) by name.
    pub kernel_regex: String,
    pub metrics: Vec<String>,
    pub timeout_s: u64,
    /// The decision tree, as data: the first rules that hold name the bottleneck.
    pub bottlenecks: Vec<BottleneckRule>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BottleneckRule {
    pub name: String,
    /// An evalexpr condition over metric names, dots written as underscores.
    pub when: String,
}

/// `tune --strategy guided`: which neighbours of a champion each bottleneck suggests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GuidedPolicy {
    /// Rounds of (profile champions, propose, measure) before the search stops anyway.
    pub max_rounds: u32,
    /// A challenger becomes champion only when faster by more than this fraction and its own p10..p90 spread.
    pub min_gain: f64,
    pub rules: Vec<GuidedRule>,
}

/// One move: when a champion shows `bottleneck`, try it with `change` applied.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GuidedRule {
    /// A `[[profile.bottlenecks]]` name.
    pub bottleneck: String,
    /// What the report shows as the reason for a proposal.
    pub name: String,
    /// Parameter → `"up"` (next value in the space's list), `"down"` (previous), or a value.
    pub change: indexmap::IndexMap<String, crate::space::ParamValue>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    pub build_s: u64,
    pub worker_s: u64,
    pub baseline_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
    /// The token the kernels expect in `-DDTYPE=...`.
    pub fn define(self) -> &'static str {
        match self {
            Dtype::F16 => "DTYPE_F16",
            Dtype::Bf16 => "DTYPE_BF16",
        }
    }
    pub fn bytes(self) -> u64 {
        2
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One attention problem: Q is [b, h, sq, d], K and V are [b, h, sk, d].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    pub name: String,
    pub b: u32,
    pub h: u32,
    pub sq: u32,
    pub sk: u32,
    pub d: u32,
    #[serde(default)]
    pub causal: bool,
}

impl Shape {
    /// FlashAttention's count: 4·B·H·Sq·Sk·D, halved when causal.
    pub fn flops(&self) -> f64 {
        let full =
            4.0 * self.b as f64 * self.h as f64 * self.sq as f64 * self.sk as f64 * self.d as f64;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }
    /// The least DRAM traffic a forward pass can make: read Q, K, V once and write O once.
    pub fn min_dram_bytes(&self, dtype: Dtype) -> f64 {
        let rows = self.b as f64 * self.h as f64 * (2.0 * self.sq as f64 + 2.0 * self.sk as f64);
        rows * self.d as f64 * dtype.bytes() as f64
    }
    /// The kernels' `causal` argument: 0 no mask, 1 top-left (PyTorch `is_causal`), 2 bottom-right.
    pub fn causal_code(&self) -> i32 {
        i32::from(self.causal)
    }
    /// Multiply-adds of a naive implementation, to size the CPU oracle.
    pub fn macs(&self) -> f64 {
        2.0 * self.b as f64 * self.h as f64 * self.sq as f64 * self.sk as f64 * self.d as f64
    }
    pub fn label(&self) -> String {
        format!(
            "{} ({},{},{},{},{}{})",
            self.name,
            self.b,
            self.h,
            self.sq,
            self.sk,
            self.d,
            if self.causal { ",causal" } else { "" }
        )
    }
}

impl Policies {
    pub fn load(path: &Path) -> Result<(Self, String)> {
        let text = read_text(path)?;
        let policies: Policies = parse_toml(path, &text)?;
        policies.validate(path, &text)?;
        Ok((policies, text))
    }

    fn validate(&self, path: &Path, text: &str) -> Result<()> {
        let fail = |key: &str, message: String| Err(config_error_at_key(path, text, key, message));
        if self.dtypes.is_empty() {
            return fail("dtypes", "at least one dtype is needed".into());
        }
        for dtype in &self.dtypes {
            if !self.tolerance.contains_key(dtype) {
                return fail(
                    "tolerance",
                    format!("no [tolerance.{dtype}] table for listed dtype {dtype}"),
                );
            }
        }
        if self.shapes.is_empty() {
            return fail("shapes", "at least one [[shapes]] entry is needed".into());
        }
        for shape in &self.shapes {
            if shape.b == 0 || shape.h == 0 || shape.sq == 0 || shape.sk == 0 {
                return fail(
                    "shapes",
                    format!("shape `{}` has a zero dimension", shape.name),
                );
            }
            if shape.d != 64 && shape.d != 128 {
                return fail(
                    "d",
                    format!(
                        "shape `{}`: head dim {} is not supported (64 or 128)",
                        shape.name, shape.d
                    ),
                );
            }
        }
        if self.step.rounds < 3 {
            return fail(
                "rounds",
                "at least 3 rounds are needed for a median and percentiles".into(),
            );
        }
        for rule in &self.guided.rules {
            if !self
                .profile
                .bottlenecks
                .iter()
                .any(|b| b.name == rule.bottleneck)
            {
                return fail(
                    "bottleneck",
                    format!(
                        "guided rule `{}` names bottleneck `{}`, which no [[profile.bottlenecks]] rule defines",
                        rule.name, rule.bottleneck
                    ),
                );
            }
        }
        if self.measure.samples < 3 {
            return fail(
                "samples",
                "at least 3 samples are needed for a median and percentiles".into(),
            );
        }
        Ok(())
    }

    pub fn tolerance_for(&self, dtype: Dtype) -> Tolerance {
        self.tolerance[&dtype]
    }
}

pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::BadInput(format!("cannot read {}: {e}", path.display())))
}

/// Deserialize strictly; a failure becomes an [`Error::Config`] pointing at the offending key.
pub fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|err| toml_error(path, text, err))
}

fn toml_error(path: &Path, text: &str, err: toml::de::Error) -> Error {
    let (line, column) = err
        .span()
        .map(|span| line_column(text, span.start))
        .unwrap_or((1, 1));
    // toml only prints the key path when it has no source to show, so ask for that rendering.
    let mut keyless = err.clone();
    keyless.set_input(None);
    let rendered = keyless.to_string();
    let mut key = rendered
        .lines()
        .find_map(|l| l.strip_prefix("in `").and_then(|k| k.strip_suffix('`')))
        .map(str::to_owned)
        .unwrap_or_default();
    let message = err.message().trim().to_owned();
    if let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    {
        key = if key.is_empty() {
            field.to_owned()
        } else {
            format!("{key}.{field}")
        };
    }
    if key.is_empty() {
        key = key_on_line(text, line).unwrap_or_else(|| "?".into());
    }
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key,
        message,
    }
}

/// A semantic error about `key`: located at the first line that assigns it, else line 1.
pub fn config_error_at_key(path: &Path, text: &str, key: &str, message: String) -> Error {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let (line, column) = text
        .lines()
        .enumerate()
        .find_map(|(i, l)| {
            let trimmed = l.trim_start();
            let indent = l.len() - trimmed.len();
            let is_assignment = trimmed
                .strip_prefix(leaf)
                .is_some_and(|rest| rest.trim_start().starts_with('='));
            let is_table = trimmed.trim_start_matches('[').starts_with(leaf);
            (is_assignment || is_table).then_some((i + 1, indent + 1))
        })
        .unwrap_or((1, 1));
    Error::Config {
        file: path.to_path_buf(),
        line,
        column,
        key: key.to_owned(),
        message,
    }
}

/// A semantic error about a value: located where `needle` first appears in the file.
pub fn config_error_at_text(
    path: &Path,
    text: &str,
    needle: &str,
    key: &str,
    message: String,
) -> Error {
    match text.find(needle) {
        Some(offset) => {
            let (line, column) = line_column(text, offset);
            Error::Config {
                file: path.to_path_buf(),
                line,
                column,
                key: key.to_owned(),
                message,
            }
        }
        None => config_error_at_key(path, text, key, message),
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The dotted key assigned on `line`, qualified by the table header above it.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let l = lines.get(line.checked_sub(1)?)?;
    let (key, _) = l.split_once('=')?;
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{}", key.trim()),
        _ => key.trim().to_owned(),
    })
}

/// Where flashtune finds its files: the project root holding `policies.toml`.
#[derive(Debug, Clone)]
pub struct ProjectPaths {
    pub root: PathBuf,
}

impl ProjectPaths {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
    pub fn policies(&self) -> PathBuf {
        self.root.join("policies.toml")
    }
    pub fn runs(&self) -> PathBuf {
        self.root.join("runs")
    }
    /// Content-addressed cubins; `FLASHTUNE_CACHE_DIR` moves it (tests share one across projects).
    pub fn build_cache(&self) -> PathBuf {
        match std::env::var_os("FLASHTUNE_CACHE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => self.runs().join(".build-cache"),
        }
    }
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.root.join(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("a = 1\nbc = 2\n", 6), (2, 1));
        assert_eq!(line_column("a = 1\nbc = 2\n", 11), (2, 6));
    }
}
