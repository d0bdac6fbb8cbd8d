//! Measuring a list of planned points: log each with the reason it was chosen, take what the results store may supply (`anytime`), and hand the rest to the scheduler.
use crate::error::Result;
use crate::log::runlog::{LoadedLog, Record};
use crate::model::plan::Proposal;
use crate::model::protocol::DeviceInfo;
use crate::model::space::PlannedPoint;
use crate::run::budget::Budget;
use crate::run::scheduler::{CaseKey, Ending, HeldGpu, Scheduler};
use crate::run::shared::{Events, Project, TuneOptions};
use std::collections::{BTreeMap, BTreeSet};

/// Log the points (with the search's reason for each), then build, check and time the valid ones
/// not yet done; `held` holds a GPU beside them until it ends (the reference library).
#[allow(clippy::too_many_arguments)]
pub async fn measure_points(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
    done: &BTreeSet<String>,
    planned: &[PlannedPoint],
    reasons: &BTreeMap<String, Proposal>,
    budget: &Budget,
    held: Option<HeldGpu<'_>>,
) -> Result<Ending> {
    events.emit_all(
        planned
            .iter()
            .filter(|p| !done.contains(&p.variant.id))
            .map(|p| Record::Planned {
                variant: p.variant.id.clone(),
                step: p.variant.step.clone(),
                params: p.variant.params.clone(),
                head_dim: p.head_dim,
                launch: p.launch.clone(),
                invalid: p.invalid.as_ref().map(|i| i.reason.clone()),
                proposed_by: reasons.get(&p.variant.id).cloned(),
            })
            .collect(),
    )?;
    let prepared =
        crate::run::anytime::prepare(project, device, opts, events, done, planned, budget)?;
    let mut settled = prepared.reused.clone();
    settled.extend(answered_before(events.records()));
    let scheduler = Scheduler {
        project,
        executor: &opts.executor,
        devices: &opts.devices,
        arch: &device.arch,
        budget,
        done,
        run_seed: opts.run.seed,
        roofs: &opts.run.roofs,
        settled: &settled,
        climb: prepared.climb,
    };
    scheduler.run(&prepared.planned, events, held).await
}

/// Every case this run's log already gives a terminal record from a worker's answer (timed,
/// implausible, or failed its check): a run killed in the middle of a variant keeps the cases that
/// variant finished, and `resume` measures only the rest.
pub fn answered_before(log: &LoadedLog) -> BTreeSet<CaseKey> {
    log.entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Timed {
                variant,
                shape,
                dtype,
                ..
            }
            | Record::Implausible {
                variant,
                shape,
                dtype,
                ..
            }
            | Record::CheckFailed {
                variant,
                shape,
                dtype,
                ..
            } => Some((variant.clone(), shape.clone(), *dtype)),
            _ => None,
        })
        .collect()
}
