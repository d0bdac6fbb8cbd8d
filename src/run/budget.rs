//! A run's limits (`--max-variants`, `--time-limit`) and the time limit's clock: when it falls,
//! and the grace what still runs is given before it is ended.
use crate::error::Result;
use std::time::{Duration, Instant};

/// Limits on one run, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Budget {
    pub max_variants: Option<usize>,
    pub time_limit: Option<Duration>,
    /// When the time limit's clock started: the command's start, then the run's log's creation
    /// (its `t` = 0), so a limit is read off the log as the user reads it off a watch.
    pub clock: Option<Instant>,
}

impl Budget {
    /// How long what is running when the time limit falls (a worker's variant, a stage) may go on
    /// before it is ended: nothing new starts after the limit, and the run ends by limit + grace.
    pub const GRACE: Duration = Duration::from_secs(10);

    /// This budget with its time limit counted from `started`.
    pub fn counted_from(self, started: Instant) -> Budget {
        Budget {
            clock: Some(started),
            ..self
        }
    }

    /// When the time limit falls, if there is one and its clock has started.
    pub fn deadline(&self) -> Option<Instant> {
        Some(self.clock? + self.time_limit?)
    }

    /// Whether the time limit has fallen: nothing may start any more.
    pub fn time_is_up(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// Why the run stopped at its time limit, with the grace what was running was given.
    pub fn time_limit_reason(&self) -> Option<String> {
        let limit = self.time_limit?;
        Some(format!(
            "--time-limit {}s: nothing started after it, and what was running was given {}s to finish",
            limit.as_secs_f64(),
            Self::GRACE.as_secs()
        ))
    }
}

/// Run `stage` unless the budget's time is up; one still running at limit + grace is abandoned
/// (its future dropped, and with it any child process it started). `None` when it did not finish.
pub async fn within_time_limit<T>(
    budget: &Budget,
    stage: impl std::future::Future<Output = Result<T>>,
) -> Result<Option<T>> {
    let Some(deadline) = budget.deadline() else {
        return stage.await.map(Some);
    };
    if budget.time_is_up() {
        return Ok(None);
    }
    tokio::select! {
        done = stage => done.map(Some),
        _ = tokio::time::sleep_until((deadline + Budget::GRACE).into()) => Ok(None),
    }
}
