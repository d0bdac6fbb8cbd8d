//! The builds of a run: every unit started at once, at most `jobs` nvcc at a time, each result sent
//! as it finishes.
use super::BuildResult;
use crate::gpu::build::BuildSpec;
use crate::run::shared::{Project, UnitKey};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Start every build in the order given, at most `jobs` nvcc at a time; results arrive in
/// completion order.
pub fn spawn_builds(
    project: &Project,
    specs: Vec<(UnitKey, BuildSpec)>,
) -> (
    tokio::task::JoinSet<()>,
    mpsc::UnboundedReceiver<BuildResult>,
) {
    spawn_builds_with(project.builder(), project.jobs(), specs)
}

/// [`spawn_builds`] with another builder (another cache folder).
pub fn spawn_builds_with(
    builder: crate::gpu::build::Builder,
    jobs: usize,
    specs: Vec<(UnitKey, BuildSpec)>,
) -> (
    tokio::task::JoinSet<()>,
    mpsc::UnboundedReceiver<BuildResult>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let slots = Arc::new(tokio::sync::Semaphore::new(jobs.max(1)));
    let builder = Arc::new(builder);
    let mut tasks = tokio::task::JoinSet::new();
    // One feeder starts the builds in the order given (the oracle first, then the dispatch order):
    // it takes a slot before it spawns each build, so the runtime's order of first polls cannot
    // reorder them (one task each, all waiting on the semaphore, once left the bf16 oracle, which
    // every dispatch waits for, 10 s behind 300 other builds). Aborting the feeder drops its set,
    // which aborts the builds it started.
    tasks.spawn(async move {
        let mut running = tokio::task::JoinSet::new();
        for (key, spec) in specs {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (builder, tx) = (builder.clone(), tx.clone());
            running.spawn(async move {
                let result = builder.build(&spec).await;
                drop(slot);
                let _ = tx.send((key, result));
            });
        }
        while running.join_next().await.is_some() {}
    });
    (tasks, rx)
}
