//! The worker protocol: one JSON request on stdin, JSON lines back on stdout (one per finished case, so a crash loses only the case in flight).
use crate::config::{Dtype, Shape, Tolerance};
use crate::space::LaunchShape;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum WorkerRequest {
    /// Describe the GPU and run a known-good kernel on it.
    Probe { device: u32 },
    /// Check and time every case of one variant.
    Run(RunRequest),
    /// Re-time a champion and a challenger interleaved, after checking both on fresh inputs.
    Duel(DuelRequest),
}

/// Per pair (one shape and dtype): both kernels loaded in one process, on the same inputs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DuelRequest {
    pub device: u32,
    pub measure: MeasureSpec,
    /// Samples per side, taken alternately: champion, challenger, champion, ...
    pub rounds: usize,
    pub pairs: Vec<DuelPair>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DuelPair {
    pub champion: CaseSpec,
    pub challenger: CaseSpec,
}

/// One pair's answer. Samples are empty when either side failed its check or CUDA failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DuelResult {
    pub shape: String,
    pub dtype: Dtype,
    pub champion_check: Option<CheckStats>,
    pub challenger_check: Option<CheckStats>,
    /// Per-launch microseconds, in the order taken (sample i of each side belongs to round i).
    pub champion_us: Vec<f64>,
    pub challenger_us: Vec<f64>,
    pub launches_per_sample: u32,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRequest {
    pub device: u32,
    pub measure: MeasureSpec,
    pub cases: Vec<CaseSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasureSpec {
    pub warmup_ms: f64,
    pub samples: usize,
    pub min_sample_us: f64,
}

/// One (shape, dtype) of one variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseSpec {
    pub shape: Shape,
    pub dtype: Dtype,
    pub seed: u64,
    pub tolerance: Tolerance,
    /// Also check the fp32 reference kernel against a CPU f64 oracle.
    pub cpu_oracle: bool,
    pub forward: ForwardKernel,
    pub reference: ReferenceKernel,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardKernel {
    pub cubin: PathBuf,
    pub entry: String,
    pub combine_entry: String,
    pub launch: LaunchShape,
    /// The -D definitions the cubin was built with (the fake worker reads FAULT from them).
    pub defines: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceKernel {
    pub cubin: PathBuf,
    pub entry: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum WorkerMessage {
    Device(DeviceInfo),
    Case(Box<CaseResult>),
    Duel(Box<DuelResult>),
    /// The worker cannot go on (no GPU, a sticky CUDA error); remaining cases were not run.
    Fatal {
        message: String,
    },
    Done,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    pub sm_count: u32,
    pub compute_capability: (i32, i32),
    /// The nvcc target for this GPU (`sm_90a` on Hopper, so wgmma stays available).
    pub arch: String,
    pub max_threads_per_block: u32,
    pub max_smem_optin_bytes: u32,
    pub driver_version: i32,
    pub total_memory_bytes: u64,
    /// GPUs the driver shows this process (the default set for `--gpus`).
    #[serde(default)]
    pub visible_devices: u32,
    /// True for the test double: nothing it reports was measured.
    #[serde(default)]
    pub fake: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    pub shape: String,
    pub dtype: Dtype,
    pub check: Option<CheckStats>,
    pub timing: Option<TimingStats>,
    pub function: Option<FunctionAttributes>,
    /// The KV split actually launched (the worker resolves `auto` per shape).
    pub kv_splits: u32,
    /// A CUDA error or a launch that could not be made.
    pub error: Option<String>,
}

/// How the forward kernel's output compares with the reference on one fresh input set.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckStats {
    pub elements: u64,
    pub max_abs: f64,
    pub rel_l2: f64,
    pub lse_max_abs: f64,
    /// NaN or infinite outputs that were written by the kernel.
    pub nan_count: u64,
    /// Outputs still holding the poison pattern: never written.
    pub unwritten_count: u64,
    /// Elements whose bits differ between two runs on the same inputs: a race.
    pub nondeterministic_count: u64,
    /// fp32 reference kernel against the CPU f64 oracle, where the shape is small enough.
    pub reference_vs_cpu_rel_l2: Option<f64>,
    pub failures: Vec<String>,
}

impl CheckStats {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TimingStats {
    /// Per-launch time of every sample, in microseconds.
    pub samples_us: Vec<f64>,
    pub launches_per_sample: u32,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub tflops: f64,
}

/// What the driver says the loaded forward kernel uses, to cross-check ptxas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionAttributes {
    pub registers: i32,
    pub local_bytes: i32,
    pub max_active_ctas_per_sm: u32,
}
