//! Work that holds one of the run's GPUs beside the case queues (the reference library): that
//! GPU's queue starts when it ends, and the records it returns are logged then. On a run's only GPU
//! it comes after the cases instead.
use crate::log::runlog::Record;
use crate::model::vocab::Stage;
use crate::run::budget::Budget;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub struct HeldGpu<'a> {
    /// The GPU it holds: no case is timed there until it ends (one GPU, one job).
    pub gpu: u32,
    /// The stage it is, for its `stage_ran` span.
    pub stage: Stage,
    /// Its records, logged when it ends; dropping it abandons the work (and the process group of
    /// any tool it started).
    pub work: Pin<Box<dyn Future<Output = Vec<Record>> + 'a>>,
}

/// The records of the held GPU's work once it ends; never, when no GPU is held.
pub(super) async fn ended(held: &mut Option<HeldGpu<'_>>) -> Vec<Record> {
    match held {
        Some(h) => h.work.as_mut().await,
        None => std::future::pending().await,
    }
}

/// When held work takes its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// Before that GPU's queue starts, while the run's other GPUs time cases: nothing waits for it.
    First,
    /// After the last case, on the run's only GPU: the kernels being tuned are what its user waits
    /// for, so they are timed first (on the attention space the reference library took 46-59 s
    /// before any case); under a time limit, cases stop early by [`reserve`].
    Last,
    /// No held work on this host.
    None,
}

impl Turn {
    pub(super) fn of(held_here: Option<u32>, devices: &[u32]) -> Turn {
        match held_here {
            None => Turn::None,
            Some(gpu) if devices.iter().all(|&d| d == gpu) => Turn::Last,
            Some(_) => Turn::First,
        }
    }
}

/// Time kept before a time limit for held work that comes last: the reference library's adapter
/// start (about 6 s with PyTorch), about 2 s per (shape, dtype) over its backends, and a re-timing
/// of noisy rows (46-59 s for 26 on an H200); at most half the limit. Too little, and the work is
/// ended at the limit's grace, its figures missing from the report, as any stage then.
pub(super) fn reserve(shapes_by_dtypes: usize, budget: &Budget) -> Duration {
    let wanted = Duration::from_secs(20 + 2 * shapes_by_dtypes as u64);
    budget
        .time_limit
        .map_or(Duration::ZERO, |limit| wanted.min(limit / 2))
}

/// Why cases stopped at the time limit, with the time kept for the held work when there is one.
pub(super) fn time_limit_reason(budget: &Budget, reserve: Duration) -> Option<String> {
    let reason = budget.time_limit_reason()?;
    Some(if reserve.is_zero() {
        reason
    } else {
        format!(
            "{reason}; cases stopped {}s before it, kept for the reference library, timed last on the run's one GPU",
            reserve.as_secs()
        )
    })
}
