//! What a run log holds: its header, and every record a run, step or agent session appends, with the types they carry.
use crate::gpu::build::Toolchain;
use crate::gpu::ptxas::EntryResources;
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::{
    CheckStats, Condition, DeviceInfo, FunctionAttributes, GpuState, SentinelFigure, TimingStats,
};
use crate::model::space::{LaunchShape, Params};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub const SCHEMA_VERSION: u32 = 2;

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
    /// This host's GPUs the run measured on, by ordinal, one queue each (`--gpus`, or every one it
    /// shows), all of the `device` model. Empty under Slurm, where each worker's `worker_ran`
    /// names its node and GPU, and in older logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// The command that wrote the log, which `resume` takes it up as. Absent in older logs:
    /// `legacy::upgrade_log` reads it from their records (use [`Header::command`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<RunCommand>,
}

impl Header {
    /// The command that wrote the log; a header read without `legacy::upgrade_log` and lacking the
    /// field is a tune's, as every log was before steps were logged.
    pub fn command(&self) -> RunCommand {
        self.command.unwrap_or(RunCommand::Tune)
    }
}

/// Which command a run log is the record of: what `resume` continues it as, or why it cannot.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunCommand {
    /// `tune` (and `ablate`, a tune of a named chain): resumed from its log.
    Tune,
    /// `step`: edits judged step by step, by hand or from a proposer.
    Step,
    /// `judge`: the working tree's edit judged once.
    Judge,
    /// `step --agent/--candidates`: resumed from its log, the step in flight finished.
    AgentSession,
}

impl RunCommand {
    /// The command line's own name for it.
    pub fn name(self) -> &'static str {
        match self {
            RunCommand::Tune => "tune",
            RunCommand::Step => "step",
            RunCommand::Judge => "judge",
            RunCommand::AgentSession => "step --agent",
        }
    }
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
        /// A step's build: of which tree (none in a tune; logs before it carry the role only in the
        /// variant id, filled in by `legacy::upgrade`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<crate::model::vocab::BuildRole>,
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
        /// What went wrong (logs before it have only `reason`, filled in by `legacy::upgrade`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fault: Option<crate::model::protocol::CaseFault>,
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
        /// Why, as a type (filled in from older logs' words by `legacy::upgrade`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skipped_for: Option<crate::model::vocab::SkipReason>,
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
        /// The GPU queue that timed it. A case is logged as its worker answers it, before the
        /// worker's `worker_ran`; a log written before that names no device here, and its cases
        /// follow their `worker_ran`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<u32>,
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
        /// The case it meets: the runner-up timed across a drift, or the leader of another GPU.
        runner_up: String,
        /// How far apart the sentinel stood when the two were timed (0.1 = 10%).
        drift: f64,
        champion_us: Option<f64>,
        runner_up_us: Option<f64>,
        /// The runner-up judged as the challenger (gain = champion median / runner-up median - 1).
        verdict: Option<crate::gpu::decide::Verdict>,
        failure: Option<String>,
        /// The GPUs the two were timed on (champion's, runner-up's: `node:gpuN` under Slurm, `GPU n`
        /// on this host), when they differ: a pick across chips is duelled on one GPU whatever the
        /// sentinel says.
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
        #[serde(default, skip_serializing_if = "crate::model::vocab::is_zero")]
        remeasured: u32,
        /// Still above that limit after the re-measurements: a figure not to be trusted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        noisy: bool,
        /// Taken from the results store: the earlier run's record it repeats, timed on the same GPU
        /// model and driver with the same reference library (`reference_library`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reused_from: Option<Citation>,
    },
    /// The reference library this run's baselines are timed with: its packages' versions and a
    /// fingerprint of them, the adapter and the request, which a stored baseline must share to
    /// stand for a new one.
    ReferenceLibrary {
        versions: std::collections::BTreeMap<String, String>,
        fingerprint: String,
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
        /// How it failed (filled in from older logs' words by `legacy::upgrade`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<crate::model::vocab::WorkerFailure>,
        /// Schema 1 only (read, never written): whether the worker never started.
        #[serde(default, skip_serializing)]
        not_started: Option<bool>,
    },
    TimedOut {
        variant: String,
        stage: TimedOutStage,
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
    /// A stage that held a GPU outside the variants' workers, logged when it ended: when it began
    /// and for how long (the run's timeline; logs before it have none, and the timeline falls back
    /// on the stretch between records).
    StageRan {
        stage: crate::model::vocab::Stage,
        device: u32,
        started_t: f64,
        seconds: f64,
    },
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
    /// Under a time limit: a variant a GPU took for being one parameter from the best so far of the
    /// cases named (the run climbs from its leaders between spread picks); `rank` says how far ahead.
    Climbed {
        variant: String,
        /// Its rank in `dispatch_order`.
        rank: usize,
        near: Vec<Leader>,
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
        /// Cases of the unfinished variants answered before the stop: kept, not measured again
        /// (none in a log written before cases were kept one by one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_cases: Option<usize>,
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
        name: crate::model::vocab::Roof,
        dtype: Option<Dtype>,
        value: f64,
        unit: String,
        /// Who measured it: `worker` (flashtune's own kernels and cuBLAS, before any variant) or
        /// `pytorch` (the baseline adapter). Logs before the worker measured roofs have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<crate::model::vocab::RoofSource>,
        /// A PyTorch roof taken from the results store with the baselines: the record it repeats.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reused_from: Option<Citation>,
    },
    /// A roof the worker could not measure: figures are not gated against it, and the report says so.
    RoofUnavailable {
        /// The roof's name, or `all` when the worker measured none.
        name: String,
        dtype: Option<Dtype>,
        reason: String,
    },
    /// `flashtune step --proposer`: the command that edits kernels/ before a step ended.
    ProposerRan {
        step: u32,
        command: String,
        seconds: f64,
        /// `std`'s words for how it ended, for people; `end` is what decides.
        status: String,
        timed_out: bool,
        output_tail: String,
        /// How it ended (logs before it have only `status`, filled in by `legacy::upgrade`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end: Option<crate::model::vocab::ProcessEnd>,
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
        /// `std`'s words for how it ended, for people; `end` is what decides.
        status: String,
        timed_out: bool,
        output_tail: String,
        /// How it ended (logs before it have only `status`, filled in by `legacy::upgrade`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end: Option<crate::model::vocab::ProcessEnd>,
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

/// A (shape, dtype) case and the variant with its best timing so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Leader {
    pub shape: String,
    pub dtype: Dtype,
    pub variant: String,
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
    /// The space's baseline, after everything else: compared with, not competing.
    Baseline,
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
            role: None,
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

    /// This record, a step's build of `role`'s tree (a `built` record only).
    pub fn of_role(mut self, role: crate::model::vocab::BuildRole) -> Record {
        if let Record::Built { role: r, .. } = &mut self {
            *r = Some(role);
        }
        self
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

/// What timed out, in a `timed_out` record. Only a worker has such a record: a build that times
/// out is a `build_failed` one ("nvcc timed out after N s"), and no flashtune wrote another stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimedOutStage {
    Worker,
}

impl TimedOutStage {
    /// How its limit reads: a worker's is on silence (no case finished for that long).
    pub fn limit(self, seconds: u64) -> String {
        match self {
            TimedOutStage::Worker => format!("no case finished in {seconds} s"),
        }
    }
}

impl std::fmt::Display for TimedOutStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimedOutStage::Worker => "worker",
        })
    }
}

/// A record of an earlier run's log: the run and the line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Citation {
    pub run: String,
    pub line: usize,
}
