//! Work that holds one of the run's GPUs beside the case queues (the reference library): that
//! GPU's queue starts when it ends, and the records it returns are logged then.
use crate::log::runlog::Record;
use crate::model::vocab::Stage;
use std::future::Future;
use std::pin::Pin;

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
