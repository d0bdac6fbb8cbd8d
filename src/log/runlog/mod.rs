//! The run log `runs/<id>/log.jsonl`: a header, then one record per event, each appended and flushed before anything depends on it.
use crate::error::WriteError;
use crate::gpu::build::Toolchain;
use crate::gpu::ptxas::EntryResources;
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::{
    CheckStats, Condition, DeviceInfo, FunctionAttributes, GpuState, SentinelFigure, TimingStats,
};
use crate::model::space::{LaunchShape, Params};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

mod sealed;
pub use sealed::{read_sealed, read_sealed_with, SealedLog, Unsealed};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub schema_version: u32,
    pub flashtune_version: String,
    pub run_id: String,
    pub started_at: String,
    pub git_head: Option<String>,
    pub device: DeviceInfo,
    pub toolchain: Toolchain,
    pub policies_hash: String,
    pub kernel_sources_hash: String,
    pub space: String,
    pub space_path: PathBuf,
    pub space_hash: String,
    pub baseline: String,
    pub dtypes: Vec<Dtype>,
    pub shapes: Vec<Shape>,
    /// How the measured points were chosen (logs before strategies existed walked the whole space).
    #[serde(default)]
    pub strategy: crate::model::plan::Strategy,
    /// Seed of this run's input sets: new every run, so no kernel meets inputs it saw before;
    /// `resume` keeps it, so a resumed run judges on the same inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_seed: Option<u64>,
    /// `[gates] per_shape_dispatch` as the run began: a fault bars a variant from its own shape only.
    /// Logged only when on, so older logs (and runs with it off) read as off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_shape_dispatch: bool,
    /// nvcc processes the run allowed at once (the build cores); absent in older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_jobs: Option<u32>,
}

/// One line of the log. `t` is seconds since the run started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub t: f64,
    #[serde(flatten)]
    pub record: Record,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    Header(Box<Header>),
    /// A (variant, head dim) judged before compiling; `invalid` holds the reason it will not run.
    Planned {
        variant: String,
        /// The step's name when the space is a named chain (an ablation).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<String>,
        params: Params,
        head_dim: u32,
        launch: Option<LaunchShape>,
        invalid: Option<String>,
        /// The guided search's reason for trying this point.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proposed_by: Option<crate::model::plan::Proposal>,
    },
    Built {
        variant: String,
        dtype: Dtype,
        head_dim: u32,
        key: String,
        cached: bool,
        seconds: f64,
        entries: Vec<EntryResources>,
    },
    BuildFailed {
        variant: String,
        dtype: Dtype,
        head_dim: u32,
        reason: String,
        log_tail: String,
    },
    /// A built kernel that a policy gate turned away (spills, ...).
    Rejected {
        variant: String,
        dtype: Dtype,
        head_dim: u32,
        reason: String,
    },
    Checked {
        variant: String,
        shape: String,
        dtype: Dtype,
        check: CheckStats,
        function: Option<FunctionAttributes>,
    },
    CheckFailed {
        variant: String,
        shape: String,
        dtype: Dtype,
        check: Option<CheckStats>,
        reason: String,
    },
    /// A case whose timed figure is beyond a measured roof of the GPU: never a champion, never committed.
    Implausible {
        variant: String,
        shape: String,
        dtype: Dtype,
        kv_splits: u32,
        timing: TimingStats,
        /// Which roof it passed and by how much, in words.
        reason: String,
    },
    /// A planned case that will not be run, and why (its build failed, its variant was quarantined, a budget).
    CaseSkipped {
        variant: String,
        shape: String,
        dtype: Dtype,
        reason: String,
    },
    Timed {
        variant: String,
        shape: String,
        dtype: Dtype,
        /// The split launched; differs from the variant's KV_SPLIT when that is `auto`.
        kv_splits: u32,
        timing: TimingStats,
        /// The checks after timing that this figure stands on: the timed launches' own outputs, fresh
        /// inputs in the same module, the stress set.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        verified: Vec<crate::model::protocol::StageCheck>,
        /// Where the worker's time on this case went.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        costs: Option<crate::model::protocol::CaseCosts>,
        /// The GPU's state right after the timed replays: clocks, temperature, power, throttling,
        /// other processes (absent where NVML could not be read).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<GpuState>,
        /// What the figure was measured under and still was when timed again (thermal or power
        /// throttling, another process on the GPU): it never decides a champion alone.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        conditions: Vec<Condition>,
        /// Stopped by racing after a few samples (`[measure] race_samples`): its p10 lay above the
        /// best timing's p90, so it could not win or tie; the figure stands on fewer samples.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raced: Option<crate::model::protocol::RacedOut>,
        /// The Slurm node and GPU that timed it (`node:gpuN`; the node alone for the GPU-less
        /// double), when a Slurm step timed it: figures from two chips are never compared as they stand.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placed: Option<String>,
    },
    /// A timing taken under a condition (throttling, another process on the GPU): not kept; the
    /// case is timed again once, in the same worker, and its terminal record follows.
    Disturbed {
        variant: String,
        shape: String,
        dtype: Dtype,
        conditions: Vec<Condition>,
        timing: TimingStats,
        gpu: Option<GpuState>,
    },
    /// The GPU's state cannot be read on this GPU (no NVML: CI, a container without it): timings
    /// carry no state and are never re-timed for one. Logged once per GPU; never fails a run.
    GpuStateUnavailable {
        device: u32,
        reason: String,
    },
    /// The drift sentinel: the worker's fixed known-good kernels timed on one GPU at the start of
    /// the measurements, every `[sentinel] every_s`, and at the end.
    Sentinel {
        device: u32,
        /// `start`, `periodic` or `end`.
        when: String,
        figures: Vec<SentinelFigure>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<GpuState>,
        /// The policy's limit (`[sentinel] max_drift`) the figures are held to, against the run's first.
        max_drift: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A champion whose case and its runner-up's were timed on different sides of a drift of the
    /// sentinel, re-timed against each other interleaved at the end of the run, before the champion
    /// table is committed: the duel decides which of the two holds the case.
    DriftDuel {
        shape: String,
        dtype: Dtype,
        champion: String,
        runner_up: String,
        /// How far apart the sentinel stood when the two were timed (0.1 = 10%).
        drift: f64,
        champion_us: Option<f64>,
        runner_up_us: Option<f64>,
        /// The runner-up judged as the challenger (gain = champion median / runner-up median - 1).
        verdict: Option<crate::gpu::decide::Verdict>,
        failure: Option<String>,
        /// The Slurm GPUs the two were timed on (champion's, runner-up's, as `node:gpuN`), when they
        /// differ: a pick across chips is duelled on one GPU whatever the sentinel says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placed: Option<(String, String)>,
    },
    /// Nsight Compute on a champion (or near-champion): metrics per launch and the bottleneck named.
    Profiled {
        variant: String,
        shape: String,
        dtype: Dtype,
        profile: crate::gpu::profile::ProfileOutcome,
        /// `run::kernel_sources_hash` of the code profiled, where it is not the header's (a step
        /// profiles HEAD's champion, whose sources change as the session commits).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sources: Option<String>,
    },
    /// The reference library (PyTorch SDPA) on one shape, timed like the variants.
    BaselineTimed {
        backend: String,
        shape: String,
        dtype: Dtype,
        timing: TimingStats,
        /// Times it was timed again because its p10..p90 spread was above `[baseline] max_spread`.
        #[serde(default, skip_serializing_if = "is_zero")]
        remeasured: u32,
        /// Still above that limit after the re-measurements: a figure not to be trusted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        noisy: bool,
    },
    /// The reference library could not be timed: all of it (no fields set) or one backend/shape.
    BaselineUnavailable {
        backend: Option<String>,
        shape: Option<String>,
        dtype: Option<Dtype>,
        reason: String,
    },
    WorkerCrashed {
        variant: String,
        detail: String,
        cases_not_run: Vec<String>,
    },
    TimedOut {
        variant: String,
        stage: String,
        seconds: u64,
        cases_not_run: Vec<String>,
    },
    /// The cluster ended a worker's Slurm job step (cancelled, time limit, preempted, node lost): not
    /// the variant's fault. Its cases not run are run again in another step (or by `resume`).
    WorkerLost {
        variant: String,
        /// The queue whose worker it was.
        device: u32,
        /// The node and GPU of the step (`node:gpuN`), when it answered before it was lost.
        placed: Option<String>,
        loss: crate::gpu::slurm::StepLoss,
        detail: String,
        cases_not_run: Vec<String>,
    },
    /// One worker process on one GPU: when it started (run clock) and how long it held the GPU.
    WorkerRan {
        variant: String,
        device: u32,
        attempt: u32,
        started_t: f64,
        seconds: f64,
        /// The node and GPU of the Slurm step that ran it (`node:gpuN`; none for a local worker).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placed: Option<String>,
    },
    /// Every case of a variant has a final record; `resume` skips it.
    VariantDone {
        variant: String,
        measured_cases: usize,
    },
    /// A variant whose worker died twice: its remaining cases are not run.
    Quarantined {
        variant: String,
        reason: String,
        cases_not_run: Vec<String>,
    },
    /// A GPU that failed the known-good kernel after a worker failure; it takes no more work.
    GpuUnhealthy {
        device: u32,
        reason: String,
    },
    BudgetReached {
        reason: String,
        variants_not_measured: Vec<String>,
    },
    /// Under a budget: the order variants are dispatched in, likely winners first, and why each
    /// came where it did. A budget that admits k variants measures the first k.
    DispatchOrder {
        order: Vec<Ranked>,
    },
    /// `tune --reuse`: a case not measured again, because the results store holds a measurement of
    /// the same kernel build (and reference build) on the same GPU model, driver and shape. Counts
    /// as measured; the figures are the earlier run's, cited by its run id and log line.
    Reused {
        variant: String,
        shape: String,
        dtype: Dtype,
        kv_splits: u32,
        timing: TimingStats,
        from_run: String,
        from_line: usize,
    },
    /// `tune --reuse --confirm N`: a case the store could have supplied, measured again because it
    /// is among the N fastest stored for its shape; its `timed` record follows.
    Confirming {
        variant: String,
        shape: String,
        dtype: Dtype,
        stored_median_us: f64,
        from_run: String,
        from_line: usize,
    },
    /// The champion table went into git on its own branch.
    ChampionsCommitted {
        branch: String,
        commit: String,
        path: String,
    },
    /// `flashtune resume` continued this log.
    Resumed {
        after_line: usize,
        finished_variants: usize,
        /// Header differences the user overrode with --force.
        overridden: Vec<String>,
    },
    Interrupted {
        reason: String,
    },
    Finished {
        seconds: f64,
        variants: usize,
        measured_cases: usize,
        failed_cases: usize,
    },
    /// A guided-search round: the champions it started from and the points it proposed.
    SearchRound {
        round: u32,
        champions: Vec<crate::model::plan::RoundChampion>,
        proposed: Vec<String>,
    },
    /// Why the guided search ended.
    SearchStopped {
        reason: String,
    },
    /// The guided search re-timed a new champion against the one it would replace, interleaved.
    SearchDuel {
        round: u32,
        shape: String,
        dtype: Dtype,
        champion: String,
        challenger: String,
        /// Medians of the interleaved samples, when both sides ran.
        champion_us: Option<f64>,
        challenger_us: Option<f64>,
        verdict: Option<crate::gpu::decide::Verdict>,
        failure: Option<String>,
    },
    /// A roof of the GPU measured beside the reference library: dense matmul TFLOP/s per dtype, copy GB/s.
    CeilingMeasured {
        /// `matmul` (per dtype), `copy` or `read`.
        name: String,
        dtype: Option<Dtype>,
        value: f64,
        unit: String,
        /// Who measured it: `worker` (flashtune's own kernels and cuBLAS, before any variant) or
        /// `pytorch` (the baseline adapter). Logs before the worker measured roofs have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    /// A roof the worker could not measure: figures are not gated against it, and the report says so.
    RoofUnavailable {
        name: String,
        dtype: Option<Dtype>,
        reason: String,
    },
    /// `flashtune step --proposer`: the command that edits kernels/ before a step ended.
    ProposerRan {
        step: u32,
        command: String,
        seconds: f64,
        status: String,
        timed_out: bool,
        output_tail: String,
    },
    /// `flashtune step`: the uncommitted edits under kernels/ about to be judged against HEAD.
    StepStarted {
        step: u32,
        base_commit: String,
        changed_files: Vec<String>,
        /// `N files, +A -D` of the edit against the base (logs before it have none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        diff_stat: Option<String>,
        /// The edit's diff, cut to a bounded length; the whole patch is `attempts/<step>.patch`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        patch: Option<String>,
        /// What the edit tried, in one line, and where that line came from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idea: Option<Idea>,
    },
    /// HEAD's champion and the edit re-timed interleaved on one (shape, dtype), same inputs.
    Duel {
        step: u32,
        shape: String,
        dtype: Dtype,
        /// HEAD's champion variant (the edit is built with the same parameters).
        variant: String,
        seed: u64,
        champion: Option<TimingStats>,
        challenger: Option<TimingStats>,
        challenger_check: Option<CheckStats>,
        verdict: Option<crate::gpu::decide::Verdict>,
        /// Why there is no verdict: a failed check, a CUDA error, a worker that died.
        failure: Option<String>,
        /// The candidate of an agent session's step this duel judged (absent for an in-place step).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        candidate: Option<u32>,
    },
    /// The step's outcome: the edit committed, or restored to HEAD, and why.
    StepDecided {
        step: u32,
        accepted: bool,
        reason: String,
        /// Geomean over cases of champion median / challenger median - 1.
        geomean_gain: Option<f64>,
        commit: Option<String>,
        restored: Vec<String>,
        /// In an agent session: the candidate committed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        candidate: Option<u32>,
        /// On the fake GPU: the scratch reference the accepted edit was committed to (never a
        /// branch: synthetic figures are not committed where a user would build on them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scratch_ref: Option<String>,
    },
    /// `flashtune step --agent` / `--candidates`: the session's settings, so `flashtune resume` can go on.
    AgentSession(Box<AgentSettings>),
    /// A candidate's work directory (a git worktree of the step's base) made and its context pack written.
    CandidateStarted {
        step: u32,
        candidate: u32,
        workdir: PathBuf,
        base_commit: String,
        /// Bytes of AGENTS.md, PROMPT.md and context/ together.
        pack_bytes: u64,
        /// The earlier near-miss (an attempt id) whose patch the work directory started from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_from: Option<String>,
    },
    /// A candidate's agent ended: what it changed against the base, and what it cost.
    CandidateProposed {
        step: u32,
        candidate: u32,
        /// Wall-clock seconds the agent ran.
        seconds: f64,
        status: String,
        timed_out: bool,
        output_tail: String,
        /// Changed paths in the edit scope (what would be judged and committed).
        changed_files: Vec<String>,
        /// Changed paths outside the edit scope: any one rejects the candidate.
        outside_scope: Vec<String>,
        /// `N files, +A -D` over the whole diff.
        diff_stat: String,
        /// The diff of the edit scope, cut to a bounded length.
        patch: String,
        /// Tokens and dollars as the agent reported them; absent when they could not be read.
        usage: Option<crate::model::usage::Usage>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage_error: Option<String>,
        /// What the candidate tried, in one line, and where that line came from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idea: Option<Idea>,
    },
    /// One candidate judged against HEAD's champion (its commit, if it wins, is `step_decided`'s).
    CandidateJudged {
        step: u32,
        candidate: u32,
        accepted: bool,
        reason: String,
        geomean_gain: Option<f64>,
        /// Seconds its duel held the GPU.
        gpu_seconds: f64,
    },
    /// A candidate that got no verdict, and why (its session was killed while it was in flight).
    CandidateDropped {
        step: u32,
        candidate: u32,
        reason: String,
    },
    /// `flashtune resume` took up a killed agent session: what it found and put right.
    SessionResumed {
        /// The step that was in flight, if any.
        step: Option<u32>,
        /// In-scope files of the main working tree put back to HEAD (an edit applied but not committed).
        restored: Vec<String>,
        /// A commit of this session's in-flight step found at HEAD, whose decision was not logged.
        recovered_commit: Option<String>,
    },
    /// An agent session stopped before its last step, and why (a stop rule).
    SessionStopped {
        reason: String,
    },
}

/// What an attempt tried, in one line: the agent's own words (an `IDEA:` line, else its final
/// message), a commit message, what it was told to say (`judge --idea`), or failing those its diff.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Idea {
    pub summary: String,
    /// `agent`, `commit message`, `caller` or `diff`.
    pub from: String,
}

/// How an agent session runs, as its log records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentSettings {
    /// `claude`, `codex`, ..., or `custom` for a `--proposer` command.
    pub agent: String,
    /// The command template, placeholders unfilled.
    pub command: String,
    pub usage: Option<crate::model::usage::UsageFormat>,
    pub candidates: u32,
    pub steps: u32,
    pub max_cost_usd: Option<f64>,
    pub stop_at_roof: Option<f64>,
    pub patience: Option<u32>,
    pub time_limit_s: Option<f64>,
    pub space: Option<PathBuf>,
    pub variant: Option<String>,
}

/// One variant's place in a budgeted run's dispatch order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Ranked {
    /// 1 for the first variant dispatched.
    pub rank: usize,
    pub variant: String,
    pub why: RankReason,
    /// In words: "committed champion for seed f16", "guided: latency bound → bigger BLOCK_M", ...
    pub reason: String,
    /// What the results store already knew of this variant on this GPU model: its best figure
    /// per (shape, dtype), for the report's list of what a budget left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<EarlierFigure>,
}

/// Why a variant came where it did, strongest evidence first.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum RankReason {
    /// Named by the champion table committed at HEAD.
    Committed,
    /// Champion of an earlier run on this GPU model (the results store).
    EarlierChampion,
    /// A neighbour the `[guided]` rules propose from an earlier profile of a champion.
    Guided,
    /// Everything else, each next one as unlike those before it as the space allows.
    Spread,
}

/// A figure the results store holds for a variant, from an earlier run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EarlierFigure {
    pub shape: String,
    pub dtype: Dtype,
    pub median_us: f64,
    pub run: String,
    pub line: usize,
    /// Measured on the kernel build this run would make (same sources, defines, flags, nvcc, driver).
    pub current: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub struct RunLog {
    file: File,
    pub path: PathBuf,
    started: std::time::Instant,
    /// Seconds already on the clock when a resumed log continues.
    offset: f64,
    /// `log.jsonl.seal`, one seal per line, written with each record; none for a reopened log that
    /// was unsealed already (it stays unsealed).
    seals: Option<sealed::SealFile>,
}

impl RunLog {
    /// A new log and its seal file.
    pub fn create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)
            .map_err(|e| WriteError::new("create the run log", path, e))?;
        let seals = sealed::SealFile::create(path)?;
        Ok(RunLog {
            file,
            path: path.to_path_buf(),
            started: std::time::Instant::now(),
            offset: 0.0,
            seals: Some(seals),
        })
    }

    /// Continue an existing log: a torn last line, or a whole one whose seal was never written (the
    /// run stopped between the two), is cut off first, so every line stays whole and sealed. The
    /// file is repaired in place (cut, or one newline appended), never rewritten: on a full disk a
    /// rewrite could lose the very log it was repairing.
    pub fn reopen(path: &Path, loaded: &LoadedLog) -> Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| WriteError::new("append to", path, e))?;
        let reopened = sealed::SealFile::reopen(path, &bytes)?;
        if let Some(keep) = reopened.keep {
            file.set_len(keep)
                .map_err(|e| WriteError::new("cut the unsealed last line of", path, e))?;
        } else if loaded.torn_tail {
            let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            file.set_len(keep as u64)
                .map_err(|e| WriteError::new("cut the torn last line of", path, e))?;
        } else if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            file.write_all(b"\n")
                .map_err(|e| WriteError::new("append to", path, e))?;
        }
        file.sync_data()
            .map_err(|e| WriteError::new("flush", path, e))?;
        let offset = loaded.entries.last().map_or(0.0, |(_, e)| e.t);
        Ok(RunLog {
            file,
            path: path.to_path_buf(),
            started: std::time::Instant::now(),
            offset,
            seals: reopened.seals,
        })
    }

    /// Seal lines just appended; a seal that cannot be written undoes them (the log keeps only
    /// sealed lines), back to `before`.
    fn seal_appended(&mut self, bytes: &[u8], before: Option<u64>) -> Result<()> {
        let Some(seals) = &mut self.seals else {
            return Ok(());
        };
        let sealed = seals.seal(bytes);
        if sealed.is_err() {
            if let Some(len) = before {
                let _ = self.file.set_len(len);
                let _ = self.file.sync_data();
            }
        }
        sealed
    }

    /// Seconds on the run clock now.
    pub fn clock(&self) -> f64 {
        self.offset + self.started.elapsed().as_secs_f64()
    }

    /// Append one record and push it to the disk before returning. A write that fails (a full disk)
    /// is undone to the last whole line, so the log stays a sequence of whole records that `resume`
    /// continues once there is room again; the error names the file and the OS cause.
    pub fn append(&mut self, record: Record) -> Result<Entry> {
        let entry = Entry {
            t: self.offset + self.started.elapsed().as_secs_f64(),
            record,
        };
        let mut line = serde_json::to_vec(&entry)?;
        line.push(b'\n');
        let before = self.file.metadata().map(|m| m.len()).ok();
        let written = match injected_failure(&mut self.file, &line) {
            Some(e) => Err(WriteError::new("append to", &self.path, e)),
            None => self
                .file
                .write_all(&line)
                .map_err(|e| WriteError::new("append to", &self.path, e))
                .and_then(|()| {
                    self.file
                        .sync_data()
                        .map_err(|e| WriteError::new("flush", &self.path, e))
                }),
        };
        if let Err(e) = written {
            // Shrinking needs no free space: cut what part of the line reached the file.
            if let Some(len) = before {
                let _ = self.file.set_len(len);
                let _ = self.file.sync_data();
            }
            return Err(e.into());
        }
        self.seal_appended(&line, before)?;
        Ok(entry)
    }

    /// Append many records with one push to the disk: a plan of tens of thousands of points would
    /// otherwise wait on as many syncs (minutes on a slow disk). All or none of them stay.
    pub fn append_all(&mut self, records: Vec<Record>) -> Result<Vec<Entry>> {
        let t = self.offset + self.started.elapsed().as_secs_f64();
        let entries: Vec<Entry> = records
            .into_iter()
            .map(|record| Entry { t, record })
            .collect();
        let mut bytes = Vec::new();
        for entry in &entries {
            serde_json::to_writer(&mut bytes, entry)?;
            bytes.push(b'\n');
        }
        let before = self.file.metadata().map(|m| m.len()).ok();
        append_whole(&mut self.file, &self.path, &bytes)?;
        self.seal_appended(&bytes, before)?;
        Ok(entries)
    }
}

/// Append `bytes` and push them to the disk, all or nothing: a write that fails (a full disk) is
/// cut back to the length before it (shrinking needs no free space), and the error names the file.
fn append_whole(file: &mut File, path: &Path, bytes: &[u8]) -> Result<()> {
    let before = file.metadata().map(|m| m.len()).ok();
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_data())
        .map_err(|e| WriteError::new("append to", path, e));
    if let Err(e) = written {
        if let Some(len) = before {
            let _ = file.set_len(len);
            let _ = file.sync_data();
        }
        return Err(e.into());
    }
    Ok(())
}

/// Debug builds only (tests): `FLASHTUNE_TEST_FAIL_APPEND=EVENT:N` makes the N-th append of an
/// `EVENT` record in this process write half its line and fail as a full disk does, so CI can show
/// what a full disk does to a run without a filesystem to fill.
#[cfg(debug_assertions)]
fn injected_failure(file: &mut File, line: &[u8]) -> Option<std::io::Error> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    let spec = std::env::var("FLASHTUNE_TEST_FAIL_APPEND").ok()?;
    let (event, n) = spec.split_once(':')?;
    let n: usize = n.parse().ok()?;
    let tag = format!("\"event\":\"{event}\"");
    if !String::from_utf8_lossy(line).contains(&tag) {
        return None;
    }
    if SEEN.fetch_add(1, Ordering::SeqCst) + 1 != n {
        return None;
    }
    let _ = file.write_all(&line[..line.len() / 2]);
    Some(std::io::Error::from_raw_os_error(libc::ENOSPC))
}

#[cfg(not(debug_assertions))]
fn injected_failure(_: &mut File, _: &[u8]) -> Option<std::io::Error> {
    None
}

/// A log read back: the entries in order with their 1-based line numbers.
#[derive(Debug, Clone)]
pub struct LoadedLog {
    pub entries: Vec<(usize, Entry)>,
    /// A last line cut short by a crash, ignored.
    pub torn_tail: bool,
}

impl Record {
    /// The `built` record of one finished build.
    pub fn built(
        variant: &str,
        dtype: Dtype,
        head_dim: u32,
        out: &crate::gpu::build::BuildOutput,
    ) -> Record {
        Record::Built {
            variant: variant.to_owned(),
            dtype,
            head_dim,
            key: out.key.clone(),
            cached: out.cached,
            seconds: out.seconds,
            entries: out.entries.clone(),
        }
    }

    /// The `build_failed` record of one failed build, with the last 30 lines of the compiler's log.
    pub fn build_failed(
        variant: &str,
        dtype: Dtype,
        head_dim: u32,
        failure: &crate::gpu::build::BuildFailure,
    ) -> Record {
        Record::BuildFailed {
            variant: variant.to_owned(),
            dtype,
            head_dim,
            reason: failure.to_string(),
            log_tail: crate::gpu::build::log_tail(failure.log(), 30),
        }
    }

    /// The record of one finished build, whichever way it ended.
    pub fn build_outcome(
        variant: &str,
        dtype: Dtype,
        head_dim: u32,
        result: &std::result::Result<
            crate::gpu::build::BuildOutput,
            crate::gpu::build::BuildFailure,
        >,
    ) -> Record {
        match result {
            Ok(out) => Record::built(variant, dtype, head_dim, out),
            Err(failure) => Record::build_failed(variant, dtype, head_dim, failure),
        }
    }
}

/// One `timed` record with its line, as the log's readers want it.
pub struct TimedCase<'a> {
    pub line: usize,
    pub variant: &'a str,
    pub shape: &'a str,
    pub dtype: Dtype,
    pub timing: &'a TimingStats,
}

impl LoadedLog {
    /// Every `timed` record, in log order.
    pub fn timed(&self) -> impl Iterator<Item = TimedCase<'_>> {
        self.entries.iter().filter_map(|(line, e)| match &e.record {
            Record::Timed {
                variant,
                shape,
                dtype,
                timing,
                ..
            } => Some(TimedCase {
                line: *line,
                variant,
                shape,
                dtype: *dtype,
                timing,
            }),
            _ => None,
        })
    }

    pub fn header(&self) -> Option<&Header> {
        self.entries.iter().find_map(|(_, e)| match &e.record {
            Record::Header(h) => Some(h.as_ref()),
            _ => None,
        })
    }
}

/// How a `timed_out` record's limit reads: a worker's is on silence (no case finished for that
/// long), a build's on the whole nvcc run.
pub fn timed_out_limit(stage: &str, seconds: u64) -> String {
    if stage == "worker" {
        format!("no case finished in {seconds} s")
    } else {
        format!("after {seconds} s")
    }
}

/// Run folders (or files inside them) oldest first. A run id names its start to the second and then
/// a random salt, so two runs started in the same second (two quick judges) sort by the salt; the
/// folder's creation time, where the filesystem keeps one, puts them in the order they started.
pub fn sort_by_start(paths: &mut [PathBuf]) {
    let created = |p: &Path| {
        let dir = if p.is_dir() {
            p
        } else {
            p.parent().unwrap_or(p)
        };
        std::fs::metadata(dir).and_then(|m| m.created()).ok()
    };
    let run_id = |p: &Path| {
        let dir = if p.is_dir() {
            p
        } else {
            p.parent().unwrap_or(p)
        };
        dir.file_name()
            .map(|n| n.to_string_lossy().get(..15).unwrap_or_default().to_owned())
    };
    // The id's second first (a copied folder gets a new creation time), then creation, then name.
    paths.sort_by_cached_key(|p| (run_id(p), created(p), p.clone()));
}

/// The log of a run folder: `log.jsonl`, else a committed measurement's `log.jsonl.gz`.
pub fn path_in(run_dir: &Path) -> PathBuf {
    let plain = run_dir.join("log.jsonl");
    let packed = run_dir.join("log.jsonl.gz");
    if !plain.exists() && packed.exists() {
        packed
    } else {
        plain
    }
}

/// Read a log (gzip-compressed when its name ends in `.gz`), tolerating a torn last line; a bad
/// line elsewhere is corruption and an error.
pub fn read(path: &Path) -> Result<LoadedLog> {
    let file =
        File::open(path).with_context(|| format!("cannot open run log {}", path.display()))?;
    let reader: Box<dyn std::io::Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let lines: Vec<String> = BufReader::new(reader)
        .lines()
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read run log {}", path.display()))?;
    if let Some(first) = lines.iter().find(|l| !l.trim().is_empty()) {
        refuse_newer_schema(path, first)?;
    }
    let mut entries = Vec::new();
    let mut torn_tail = false;
    let last_nonempty = lines.iter().rposition(|l| !l.trim().is_empty());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Entry>(line) {
            Ok(e) => entries.push((i + 1, e)),
            Err(_) if Some(i) == last_nonempty => torn_tail = true,
            Err(e) => anyhow::bail!("{}:{}: corrupt run log record: {e}", path.display(), i + 1),
        }
    }
    Ok(LoadedLog { entries, torn_tail })
}

/// A newer flashtune may have changed what records mean: reading its log as ours would be a guess.
/// Checked on the raw header line, before its records are parsed (they may not parse at all).
fn refuse_newer_schema(path: &Path, first_line: &str) -> Result<()> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(first_line) else {
        return Ok(());
    };
    let version = value
        .get("schema_version")
        .filter(|_| value.get("event").and_then(|e| e.as_str()) == Some("header"))
        .and_then(|v| v.as_u64());
    match version {
        Some(v) if v > u64::from(SCHEMA_VERSION) => anyhow::bail!(
            "{}: written by a newer flashtune (log schema {v}; this flashtune {} reads schema {SCHEMA_VERSION} and older); use a newer flashtune",
            path.display(),
            env!("CARGO_PKG_VERSION")
        ),
        _ => Ok(()),
    }
}
