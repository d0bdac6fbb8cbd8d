//! `flashtune step`: judge the uncommitted edits under `kernels/` against HEAD's champion, commit them or restore HEAD; optionally let a proposer command make the edits, step after step.
//!
//! Trust boundary: the proposer may only change the edit scope (files under `kernels/`, except the
//! champion table and the reference kernel, which is the oracle). HEAD's kernels are built from a
//! copy of HEAD's tree, the edit from the working tree into a cache of its own; both are checked
//! against HEAD's reference on fresh inputs before the interleaved re-timing decides.
use crate::gpu::executor::Executor;
use crate::model::config::{Dtype, ProjectPaths, Shape};
use crate::model::protocol::DeviceInfo;
use crate::model::space::PlannedPoint;
use crate::run::shared::{self, Project};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod attempt;
mod bench;
pub mod candidate;
mod champions;
mod interrupt;
mod judge;
mod profile;
mod proposer;
mod report;
mod rules;
mod scope;
mod steps;
mod tree;
mod unresumed;

pub(crate) use attempt::{diff_against, diff_candidate, idea_line, keep_patch, one_line};
pub(crate) use bench::Bench;
pub(crate) use candidate::Candidate;
pub(crate) use champions::champions_for;
pub(crate) use interrupt::unless_stopped;
pub(crate) use judge::collect_builds;
pub(crate) use report::{step_markdown, DuelRow, Outcome, StepSummary};
pub(crate) use scope::{
    changes, in_scope, irregular, irregular_reason, is_protected, outside_scope_reason, protected,
};
pub use steps::step;
pub(crate) use tree::{
    extract_tree, file_hash, fingerprint, fingerprint_changes, head_of, put_head_back, restore,
    short,
};
pub use unresumed::refuse_resume;

/// Edits are judged only under this folder (repository-relative).
pub const EDIT_SCOPE: &str = "kernels/";

pub struct StepOptions {
    pub paths: ProjectPaths,
    pub space: Option<PathBuf>,
    /// The champion where HEAD's champion table names none.
    pub variant: Option<String>,
    /// A shell command that edits kernels/ before each step.
    pub proposer: Option<String>,
    pub steps: u32,
    pub time_limit: Option<Duration>,
    pub device: u32,
    pub executor: Executor,
    /// Queue behind another flashtune run that holds the GPU, or refuse at once.
    pub when_busy: shared::WhenBusy,
    /// Print nothing on stdout (the caller prints the verdict itself, e.g. as JSON).
    pub quiet: bool,
    /// What the edit tries, in one line (`judge --idea`, the MCP judge's `idea`): the history's entry.
    pub idea: Option<String>,
    /// The command the run log's header names, which `resume` takes the run up as.
    pub command: crate::log::runlog::RunCommand,
}

pub struct StepOutcome {
    pub run_dir: PathBuf,
    /// The run's records, as its log holds them: what its verdict is read from.
    pub log: crate::log::runlog::LoadedLog,
    pub report_markdown: String,
    pub accepted: u32,
    pub rejected: u32,
}

/// What the proposer of an in-place step left: whether it finished, and what it said (the tail).
struct Proposed {
    finished: bool,
    output: String,
}

/// Where the fake GPU commits an accepted edit of step `n`: a scratch reference, never a branch.
/// Synthetic figures must not land where a user would build on them; the commit stays inspectable
/// (`git show refs/flashtune/fake/<run>/step-<n>`) and a session's later steps build on it.
pub fn scratch_ref(run_id: &str, n: u32) -> String {
    format!("refs/flashtune/fake/{run_id}/step-{n}")
}

/// What a step decided, as the next proposer sees it.
#[derive(Debug, Clone)]
struct Decided {
    accepted: bool,
    reason: String,
    report: PathBuf,
}

pub(crate) struct Session<'a> {
    pub(crate) project: &'a Project,
    pub(crate) root: &'a Path,
    pub(crate) device: &'a DeviceInfo,
    pub(crate) opts: &'a StepOptions,
    pub(crate) run_dir: &'a Path,
    pub(crate) run_id: &'a str,
    /// The step run's input seed; each step draws its own sets from it.
    pub(crate) seed: u64,
    /// Roofs measured at the start of the step run: an edit whose figure passes one is rejected.
    pub(crate) roofs: crate::report::roofs::Roofs,
}

/// HEAD's champion for one (shape, dtype), built from HEAD's sources.
pub(crate) struct Pairing {
    pub(crate) shape: Shape,
    pub(crate) dtype: Dtype,
    pub(crate) point: PlannedPoint,
}

/// Files a proposer must leave alone, with what they looked like before it ran.
pub(crate) type Fingerprint = BTreeMap<PathBuf, (u64, i64, i64, i64)>;
