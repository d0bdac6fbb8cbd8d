//! `RunIndex::new`: the log's records sorted once into the index.
use super::{
    account, named_case, settle, worker_fault, worker_never_started, Accounting, Baseline,
    BaselineTiming, Build, BuildOutcome, Case, Ceilings, CheckFailure, Confirmation,
    DisturbedTiming, DriftDuel, DuelRecord, Failure, Fault, FaultKind, Finished, Ledger, Measured,
    Outcome, PlannedPoint, Profile, ReusedFrom, RunIndex, SentinelPoint, Timing, WorkerRun,
};
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::CaseFault;
use crate::model::vocab::Roof;
use std::collections::BTreeMap;

impl<'a> RunIndex<'a> {
    pub fn new(log: &'a LoadedLog) -> Self {
        let header = log.header();
        let mut ix = RunIndex {
            log,
            header,
            planned: Vec::new(),
            builds: Vec::new(),
            cases: Vec::new(),
            timings: Vec::new(),
            check_failures: Vec::new(),
            profiles: Vec::new(),
            baselines: Vec::new(),
            baseline_missing: None,
            ceilings: Ceilings::default(),
            duels: Vec::new(),
            search: Vec::new(),
            incidents: Vec::new(),
            faults: Vec::new(),
            per_shape_dispatch: header.is_some_and(|h| h.per_shape_dispatch),
            sentinels: Vec::new(),
            disturbed: Vec::new(),
            drift_duels: Vec::new(),
            state_unavailable: Vec::new(),
            workers: Vec::new(),
            interrupted: None,
            dispatch_order: None,
            confirmations: Vec::new(),
            finished: None,
            wall_seconds: 0.0,
            accounting: Accounting::default(),
            by_key: BTreeMap::new(),
        };
        let shapes: &[Shape] = header.map_or(&[], |h| &h.shapes);
        let dtypes: &[Dtype] = header.map_or(&[], |h| &h.dtypes);
        let mut ledger = Ledger::default();
        let mut session = 0usize;
        let mut build_seconds: BTreeMap<(&str, Dtype, u32), f64> = BTreeMap::new();
        // The GPU each variant's last worker ran on: its cases' records follow that `worker_ran`.
        let mut device_of: BTreeMap<&str, u32> = BTreeMap::new();
        // Whether each variant's last failed worker failed by the variant's own doing.
        let mut own_worker_failure: BTreeMap<&str, bool> = BTreeMap::new();
        for (line, e) in &log.entries {
            let line = *line;
            ix.wall_seconds = ix.wall_seconds.max(e.t);
            match &e.record {
                Record::Planned {
                    variant,
                    step,
                    params,
                    head_dim,
                    invalid,
                    proposed_by,
                    ..
                } => {
                    ix.planned.push(PlannedPoint {
                        line,
                        variant,
                        step: step.as_deref(),
                        params,
                        head_dim: *head_dim,
                        invalid: invalid.as_deref(),
                        proposed_by: proposed_by.as_ref(),
                    });
                    if invalid.is_some() {
                        continue;
                    }
                    for shape in shapes.iter().filter(|s| s.d == *head_dim) {
                        for &dtype in dtypes {
                            let key = (variant.as_str(), shape.name.as_str(), dtype);
                            match ix.by_key.get(&key) {
                                // Planned again by a resumed run: the plan is refreshed, what the
                                // case already came to stands until a later record decides it anew.
                                Some(&i) => {
                                    let c = &mut ix.cases[i];
                                    c.step = step.as_deref();
                                    c.params = params;
                                    c.planned_line = line;
                                }
                                None => {
                                    ix.by_key.insert(key, ix.cases.len());
                                    ledger.decided.push(None);
                                    ix.cases.push(Case {
                                        variant,
                                        step: step.as_deref(),
                                        params,
                                        shape,
                                        dtype,
                                        planned_line: line,
                                        outcome: Outcome::NotRun,
                                        check: None,
                                        build_seconds: 0.0,
                                    });
                                }
                            }
                        }
                    }
                }
                Record::Built {
                    variant,
                    dtype,
                    head_dim,
                    cached,
                    seconds,
                    entries,
                    ..
                } => {
                    build_seconds.insert((variant, *dtype, *head_dim), *seconds);
                    ix.builds.push(Build {
                        line,
                        t: e.t,
                        variant,
                        dtype: *dtype,
                        head_dim: *head_dim,
                        outcome: BuildOutcome::Built {
                            cached: *cached,
                            seconds: *seconds,
                            entries,
                        },
                    });
                }
                Record::BuildFailed {
                    variant,
                    dtype,
                    head_dim,
                    reason,
                    ..
                }
                | Record::Rejected {
                    variant,
                    dtype,
                    head_dim,
                    reason,
                } => {
                    let outcome = if matches!(e.record, Record::Rejected { .. }) {
                        BuildOutcome::Rejected { reason }
                    } else {
                        BuildOutcome::Failed { reason }
                    };
                    ix.builds.push(Build {
                        line,
                        t: e.t,
                        variant,
                        dtype: *dtype,
                        head_dim: *head_dim,
                        outcome,
                    });
                    for shape in shapes.iter().filter(|s| s.d == *head_dim) {
                        let Some(&i) =
                            ix.by_key
                                .get(&(variant.as_str(), shape.name.as_str(), *dtype))
                        else {
                            continue;
                        };
                        let outcome = Outcome::Failed {
                            line,
                            kind: Failure::Build,
                            reason: Some(reason),
                        };
                        settle(
                            &mut ix.cases[i],
                            &mut ledger.decided[i],
                            outcome,
                            session,
                            true,
                            &mut ledger.problems,
                        );
                    }
                }
                Record::Checked {
                    variant,
                    shape,
                    dtype,
                    check,
                    ..
                } => {
                    if let Some(&i) = ix.by_key.get(&(variant.as_str(), shape.as_str(), *dtype)) {
                        ix.cases[i].check = Some(check);
                    }
                }
                Record::CheckFailed {
                    variant,
                    shape,
                    dtype,
                    check,
                    reason,
                    fault: logged_fault,
                } => {
                    ix.check_failures.push(CheckFailure {
                        line,
                        variant,
                        shape,
                        dtype: *dtype,
                        reason,
                    });
                    let fault = FaultKind::of_case_fault(
                        logged_fault.unwrap_or_else(|| CaseFault::legacy(reason)),
                    );
                    ix.faults.push(Fault {
                        line,
                        variant,
                        kind: fault,
                        case: Some((shape, *dtype)),
                        detail: reason.clone(),
                    });
                    let kind = if fault == FaultKind::Crashed {
                        Failure::Crashed
                    } else {
                        Failure::Wrong
                    };
                    let outcome = Outcome::Failed {
                        line,
                        kind,
                        reason: Some(reason),
                    };
                    if let Some(i) = ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "check_failed",
                        session,
                    ) {
                        ix.cases[i].check = check.as_ref();
                    }
                }
                Record::Timed {
                    variant,
                    shape,
                    dtype,
                    kv_splits,
                    timing,
                    gpu,
                    conditions,
                    raced,
                    placed,
                    ..
                } => {
                    let device = device_of.get(variant.as_str()).copied();
                    let sentinel_before = ix
                        .sentinels
                        .iter()
                        .rposition(|s| Some(s.device) == device || device.is_none());
                    ix.timings.push(Timing {
                        line,
                        t: e.t,
                        variant,
                        shape,
                        dtype: *dtype,
                        timing,
                        conditions,
                        device,
                        placed: placed.as_deref(),
                        gpu: gpu.as_ref(),
                        sentinel_before,
                        sentinel_after: None,
                    });
                    let outcome = Outcome::Measured {
                        line,
                        timing,
                        kv_splits: *kv_splits,
                        reused: None,
                        conditions,
                        raced: raced.as_ref(),
                    };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "timed",
                        session,
                    );
                }
                Record::Reused {
                    variant,
                    shape,
                    dtype,
                    kv_splits,
                    timing,
                    from_run,
                    from_line,
                } => {
                    let outcome = Outcome::Measured {
                        line,
                        timing,
                        kv_splits: *kv_splits,
                        reused: Some(ReusedFrom {
                            run: from_run,
                            line: *from_line,
                        }),
                        // The store keeps only figures measured clean (`store::write_record_in` skips the others).
                        conditions: &[],
                        raced: None,
                    };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "reused",
                        session,
                    );
                }
                Record::Confirming {
                    variant,
                    shape,
                    dtype,
                    stored_median_us,
                    from_run,
                    from_line,
                } => ix.confirmations.push(Confirmation {
                    line,
                    variant,
                    shape,
                    dtype: *dtype,
                    stored_median_us: *stored_median_us,
                    from_run,
                    from_line: *from_line,
                }),
                Record::DispatchOrder { order } => ix.dispatch_order = Some((line, order)),
                Record::Implausible {
                    variant,
                    shape,
                    dtype,
                    kv_splits,
                    timing,
                    reason,
                } => {
                    ix.faults.push(Fault {
                        line,
                        variant,
                        kind: FaultKind::Implausible,
                        case: Some((shape, *dtype)),
                        detail: reason.clone(),
                    });
                    let outcome = Outcome::Implausible {
                        line,
                        timing,
                        kv_splits: *kv_splits,
                        reason,
                    };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "implausible",
                        session,
                    );
                }
                Record::CaseSkipped {
                    variant,
                    shape,
                    dtype,
                    reason,
                } => {
                    let outcome = Outcome::Skipped { line, reason };
                    ledger.land(
                        &mut ix.cases,
                        &ix.by_key,
                        (variant, shape, *dtype),
                        outcome,
                        "case_skipped",
                        session,
                    );
                }
                Record::TimedOut {
                    variant,
                    cases_not_run,
                    ..
                }
                | Record::WorkerCrashed {
                    variant,
                    cases_not_run,
                    ..
                } => {
                    ix.incidents.push((line, &e.record));
                    let own = !worker_never_started(&e.record);
                    own_worker_failure.insert(variant.as_str(), own);
                    if own {
                        ix.faults.extend(worker_fault(line, &e.record, dtypes));
                    }
                    let kind = if matches!(e.record, Record::TimedOut { .. }) {
                        Failure::TimedOut
                    } else {
                        Failure::Crashed
                    };
                    // Not terminal: the scheduler retries the cases once, and only a second failure
                    // (or the end of the run) leaves them here.
                    for case in cases_not_run {
                        let Some((shape, dtype)) = named_case(case, dtypes) else {
                            continue;
                        };
                        if let Some(&i) = ix.by_key.get(&(variant.as_str(), shape, dtype)) {
                            let c = &mut ix.cases[i];
                            if matches!(c.outcome, Outcome::NotRun) {
                                c.outcome = Outcome::Failed {
                                    line,
                                    kind,
                                    reason: None,
                                };
                            }
                        }
                    }
                }
                Record::Quarantined {
                    variant,
                    reason,
                    cases_not_run,
                } => {
                    ix.incidents.push((line, &e.record));
                    // A quarantine follows its attempt's failure record: the variant's fault unless
                    // that worker never started.
                    if own_worker_failure.get(variant.as_str()) != Some(&false) {
                        ix.faults.push(Fault {
                            line,
                            variant,
                            kind: FaultKind::Quarantined,
                            case: cases_not_run.first().and_then(|c| named_case(c, dtypes)),
                            detail: reason.clone(),
                        });
                    }
                }
                // The cluster's doing: told, never a fault; its cases are run again (or stay not run).
                Record::WorkerLost { .. } => ix.incidents.push((line, &e.record)),
                Record::BudgetReached { .. } | Record::GpuUnhealthy { .. } => {
                    ix.incidents.push((line, &e.record))
                }
                Record::Profiled {
                    variant,
                    shape,
                    dtype,
                    profile,
                    ..
                } => ix.profiles.push(Profile {
                    line,
                    variant,
                    shape,
                    dtype: *dtype,
                    profile,
                }),
                Record::BaselineTimed {
                    backend,
                    shape,
                    dtype,
                    timing,
                    remeasured,
                    noisy,
                } => ix.baselines.push(Baseline {
                    line,
                    backend,
                    shape,
                    dtype: *dtype,
                    outcome: Ok(BaselineTiming {
                        timing,
                        remeasured: *remeasured,
                        noisy: *noisy,
                    }),
                }),
                Record::BaselineUnavailable {
                    backend: Some(backend),
                    shape: Some(shape),
                    dtype: Some(dtype),
                    reason,
                } => ix.baselines.push(Baseline {
                    line,
                    backend,
                    shape,
                    dtype: *dtype,
                    outcome: Err(reason),
                }),
                Record::BaselineUnavailable { reason, .. } => ix.baseline_missing = Some(reason),
                Record::RoofUnavailable {
                    name,
                    dtype,
                    reason,
                } => {
                    let what = match dtype {
                        Some(d) => format!("{name} ({d})"),
                        None => name.clone(),
                    };
                    ix.ceilings
                        .unavailable
                        .push((line, format!("{what}: {reason}")));
                }
                Record::CeilingMeasured {
                    name, dtype, value, ..
                } => {
                    let m = Measured {
                        value: *value,
                        line,
                    };
                    // The worker and the PyTorch adapter may both measure a roof: the higher one is the roof.
                    let higher = |old: Option<Measured>| match old {
                        Some(o) if o.value >= m.value => Some(o),
                        _ => Some(m),
                    };
                    let c = &mut ix.ceilings;
                    match (name, dtype) {
                        (Roof::Matmul, Some(d)) => {
                            let best = higher(c.matmul_tflops.get(d).copied());
                            c.matmul_tflops.insert(*d, best.expect("some"));
                        }
                        (Roof::Matmul, None) => {}
                        (Roof::Copy, _) => c.copy_gbs = higher(c.copy_gbs),
                        (Roof::Read, _) => c.read_gbs = higher(c.read_gbs),
                    }
                }
                Record::SearchDuel {
                    shape,
                    dtype,
                    champion,
                    challenger,
                    verdict,
                    ..
                } => {
                    ix.duels.push(DuelRecord {
                        line,
                        shape,
                        dtype: *dtype,
                        champion,
                        challenger: Some(challenger),
                        verdict: verdict.as_ref(),
                    });
                    ix.search.push((line, &e.record));
                }
                Record::Duel {
                    shape,
                    dtype,
                    variant,
                    verdict,
                    ..
                } => ix.duels.push(DuelRecord {
                    line,
                    shape,
                    dtype: *dtype,
                    champion: variant,
                    challenger: None,
                    verdict: verdict.as_ref(),
                }),
                Record::SearchRound { .. } | Record::SearchStopped { .. } => {
                    ix.search.push((line, &e.record))
                }
                Record::WorkerRan {
                    variant,
                    device,
                    started_t,
                    seconds,
                    ..
                } => {
                    device_of.insert(variant, *device);
                    ix.workers.push(WorkerRun {
                        line,
                        variant,
                        device: *device,
                        started_t: *started_t,
                        seconds: *seconds,
                    })
                }
                Record::Sentinel {
                    device,
                    when,
                    figures,
                    gpu,
                    max_drift,
                    error,
                } => {
                    let index = ix.sentinels.len();
                    for t in ix.timings.iter_mut().rev() {
                        if t.device.is_some_and(|d| d != *device) {
                            continue;
                        }
                        if t.sentinel_after.is_some() {
                            break;
                        }
                        t.sentinel_after = Some(index);
                    }
                    ix.sentinels.push(SentinelPoint {
                        line,
                        t: e.t,
                        device: *device,
                        when,
                        figures,
                        gpu: gpu.as_ref(),
                        max_drift: *max_drift,
                        error: error.as_deref(),
                    });
                }
                Record::Disturbed {
                    variant,
                    shape,
                    dtype,
                    conditions,
                    timing,
                    gpu,
                } => ix.disturbed.push(DisturbedTiming {
                    line,
                    t: e.t,
                    variant,
                    shape,
                    dtype: *dtype,
                    conditions,
                    timing,
                    gpu: gpu.as_ref(),
                }),
                Record::GpuStateUnavailable { device, reason } => {
                    ix.state_unavailable.push((line, *device, reason))
                }
                Record::DriftDuel {
                    shape,
                    dtype,
                    champion,
                    runner_up,
                    drift,
                    champion_us,
                    runner_up_us,
                    verdict,
                    failure,
                    placed,
                } => {
                    ix.duels.push(DuelRecord {
                        line,
                        shape,
                        dtype: *dtype,
                        champion,
                        challenger: Some(runner_up),
                        verdict: verdict.as_ref(),
                    });
                    ix.drift_duels.push(DriftDuel {
                        line,
                        shape,
                        dtype: *dtype,
                        champion,
                        runner_up,
                        drift: *drift,
                        champion_us: *champion_us,
                        runner_up_us: *runner_up_us,
                        verdict: verdict.as_ref(),
                        failure: failure.as_deref(),
                        placed: placed.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
                    });
                }
                Record::Interrupted { reason } => ix.interrupted = Some((line, reason)),
                Record::Finished {
                    seconds,
                    variants,
                    measured_cases,
                    failed_cases,
                } => {
                    ix.finished = Some(Finished {
                        line,
                        seconds: *seconds,
                        variants: *variants,
                        measured_cases: *measured_cases,
                        failed_cases: *failed_cases,
                    })
                }
                Record::Resumed { .. } => session += 1,
                Record::Header(_)
                | Record::VariantDone { .. }
                | Record::ChampionsCommitted { .. }
                | Record::ProposerRan { .. }
                | Record::StepStarted { .. }
                | Record::StepDecided { .. }
                | Record::AgentSession(_)
                | Record::CandidateStarted { .. }
                | Record::CandidateProposed { .. }
                | Record::CandidateJudged { .. }
                | Record::CandidateDropped { .. }
                | Record::SessionResumed { .. }
                | Record::SessionStopped { .. } => {}
            }
        }
        let d_of: BTreeMap<&str, u32> = shapes.iter().map(|s| (s.name.as_str(), s.d)).collect();
        for c in &mut ix.cases {
            c.build_seconds = build_seconds
                .get(&(c.variant, c.dtype, d_of[c.shape.name.as_str()]))
                .copied()
                .unwrap_or(0.0);
        }
        ix.accounting = account(&ix.cases, &ledger.unplanned, ledger.problems);
        ix
    }
}
