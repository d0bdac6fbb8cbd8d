//! Words every layer shares and that depend on nothing: a variant parameter's value and the conditions a figure may be measured under. They sit below config, space and protocol so those three need not import one another in a circle.
use serde::{Deserialize, Serialize};

/// What a figure may have been measured under, besides the kernel itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Clocks held down for heat (software or hardware thermal slowdown).
    Thermal,
    /// Clocks held down by the hardware power brake (a signal from outside the GPU: the board or
    /// the system's power supply). The software power cap is not a condition: a heavy kernel meets
    /// the board's power limit on every run, on any GPU, so its figure is the figure users get.
    Power,
    /// Another process had a compute context on the GPU.
    Neighbour,
}

impl Condition {
    pub fn describe(self) -> &'static str {
        match self {
            Condition::Thermal => "thermal throttling",
            Condition::Power => "power throttling",
            Condition::Neighbour => "another process on the GPU",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Condition::Thermal => "thermal",
            Condition::Power => "power",
            Condition::Neighbour => "neighbour",
        }
    }
}

/// A parameter value as written in a variants file: an integer or a symbolic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ParamValue {
    Int(i64),
    Name(String),
}

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Name(s) => f.write_str(s),
        }
    }
}

/// A roof of the GPU, measured beside the kernels: what a figure beyond it is judged against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Roof {
    /// Dense matmul throughput, per dtype (TFLOP/s).
    Matmul,
    /// Device copy bandwidth, bytes read + written (GB/s).
    Copy,
    /// Read-only stream bandwidth (GB/s).
    Read,
}

impl Roof {
    pub fn unit(self) -> &'static str {
        match self {
            Roof::Matmul => "TFLOP/s",
            Roof::Copy | Roof::Read => "GB/s",
        }
    }

    /// The roof an external adapter names (PyTorch's `baselines/` script); none for a name it
    /// does not know.
    pub fn named(name: &str) -> Option<Roof> {
        [Roof::Matmul, Roof::Copy, Roof::Read]
            .into_iter()
            .find(|r| serde_json::to_value(r).is_ok_and(|v| v == name))
    }
}

/// Who measured a roof.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoofSource {
    /// flashtune's worker, with its own kernels and cuBLAS, before any variant.
    Worker,
    /// The PyTorch baseline adapter.
    Pytorch,
}

/// How a child process (a proposer, an agent) ended: success is decided on this type, never on
/// the words a status prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessEnd {
    Exited {
        code: i32,
    },
    Signalled {
        signal: i32,
    },
    /// Killed by flashtune when its time limit ran out.
    TimedOut,
    /// Its end could not be waited for.
    WaitFailed,
}

impl ProcessEnd {
    pub fn of(status: &std::process::ExitStatus) -> ProcessEnd {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ProcessEnd::Exited { code },
            (None, Some(signal)) => ProcessEnd::Signalled { signal },
            (None, None) => ProcessEnd::WaitFailed,
        }
    }

    /// It ran to its end and said it succeeded.
    pub fn succeeded(self) -> bool {
        self == ProcessEnd::Exited { code: 0 }
    }

    /// The end of a process as logs before the `end` field recorded it: `std`'s words for its exit
    /// status (`exit status: 0`, `signal: 9 (SIGKILL)`) and whether flashtune's time limit killed it.
    pub fn legacy(status: &str, timed_out: bool) -> ProcessEnd {
        let number = |prefix: &str| {
            status
                .strip_prefix(prefix)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        if timed_out {
            ProcessEnd::TimedOut
        } else if let Some(code) = number("exit status: ") {
            ProcessEnd::Exited { code }
        } else if let Some(signal) = number("signal: ") {
            ProcessEnd::Signalled { signal }
        } else {
            ProcessEnd::WaitFailed
        }
    }
}

/// How a worker failed, as its `worker_crashed` record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerFailure {
    /// It died (a signal, an exit) or reported a fatal error: the variant's doing.
    Died,
    /// Its reply could not be read: the variant's doing, held against the case in flight by the
    /// `check_failed` record before this one.
    Garbled,
    /// It never started, or never got its GPU: the machine's doing, never the variant's.
    NotStarted,
}

/// A stage of a run that holds a GPU outside the variants' workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The worker's roofs (matmul, copy, read), before any variant.
    Roofs,
    /// The reference library (PyTorch SDPA, FlashAttention-4 where installed), with its roofs.
    Reference,
    /// Champions re-timed against their runners-up on one GPU (drift, two GPUs).
    Duels,
    /// Nsight Compute on the champions.
    Profiles,
}

/// Why a case was skipped, as its `case_skipped` record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A budget ran out before its variant was reached.
    Budget,
    /// Its kernel did not build, or the gates rejected the build.
    Build,
    /// Its variant's worker failed twice.
    Quarantined,
    /// The cluster ended its worker's steps more times than `[slurm] max_lost` allows.
    ClusterLost,
}

/// What became of an attempted edit, as history, the ledger, the context pack and `judge --json`
/// say it (the words are the serialised names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptVerdict {
    /// Judged better than HEAD and committed.
    Committed,
    /// Beat HEAD, but another candidate of its step was better (or, for a judge, the verdict before the commit).
    Accepted,
    Rejected,
    /// Never judged.
    Dropped,
    /// The log ends before a verdict.
    Unfinished,
}

impl AttemptVerdict {
    /// A judged edit's verdict.
    pub fn judged(accepted: bool) -> AttemptVerdict {
        match accepted {
            true => AttemptVerdict::Accepted,
            false => AttemptVerdict::Rejected,
        }
    }
}

impl std::fmt::Display for AttemptVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttemptVerdict::Committed => "committed",
            AttemptVerdict::Accepted => "accepted",
            AttemptVerdict::Rejected => "rejected",
            AttemptVerdict::Dropped => "dropped",
            AttemptVerdict::Unfinished => "unfinished",
        })
    }
}

/// Which tree a step's build was of: HEAD's, the working tree's edit (`judge`, `step`), or an agent
/// session's candidate N. Its builds' variant ids carry it as a suffix (`@head`, `@edit`, `@candN`),
/// which keeps them apart in a log; what reads the log takes the role from the `built` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildRole {
    Head,
    Edit,
    Candidate(u32),
}

impl BuildRole {
    /// The role of a build logged before `built` records carried one, from its variant id's suffix.
    pub fn legacy(variant: &str) -> Option<BuildRole> {
        match variant.rsplit_once('@')?.1 {
            "head" => Some(BuildRole::Head),
            "edit" => Some(BuildRole::Edit),
            tag => tag
                .strip_prefix("cand")
                .and_then(|k| k.parse().ok())
                .map(BuildRole::Candidate),
        }
    }
}

impl std::fmt::Display for BuildRole {
    /// The suffix its builds' variant ids carry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildRole::Head => f.write_str("head"),
            BuildRole::Edit => f.write_str("edit"),
            BuildRole::Candidate(k) => write!(f, "cand{k}"),
        }
    }
}

/// Serde's `skip_serializing_if` for a count that a record or a launch leaves out at zero.
pub fn is_zero(n: &u32) -> bool {
    *n == 0
}
