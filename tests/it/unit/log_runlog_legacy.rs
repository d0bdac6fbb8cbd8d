//! The tests of `src/log/runlog/legacy.rs`: an older log's words become the types a record carries now.
use flashtune::log::runlog::{legacy::upgrade, Record};
use flashtune::model::protocol::CaseFault;
use flashtune::model::vocab::{ProcessEnd, SkipReason, WorkerFailure};
use serde_json::json;

fn old(record: serde_json::Value) -> Record {
    let mut record: Record = serde_json::from_value(record).expect("a valid record");
    upgrade(&mut record);
    record
}

fn skipped_for(reason: &str) -> Option<SkipReason> {
    match old(
        json!({"event": "case_skipped", "variant": "v", "shape": "small", "dtype": "f16", "reason": reason}),
    ) {
        Record::CaseSkipped { skipped_for, .. } => skipped_for,
        r => panic!("{r:?}"),
    }
}

fn failure(detail: &str, not_started: Option<bool>) -> Option<WorkerFailure> {
    let mut r =
        json!({"event": "worker_crashed", "variant": "v", "detail": detail, "cases_not_run": []});
    if let Some(n) = not_started {
        r["not_started"] = json!(n);
    }
    match old(r) {
        Record::WorkerCrashed { failure, .. } => failure,
        r => panic!("{r:?}"),
    }
}

#[test]
fn an_older_records_words_become_its_types() {
    assert_eq!(
        skipped_for("not measured: --max-variants 2"),
        Some(SkipReason::Budget)
    );
    assert_eq!(
        skipped_for("not measured: the cluster ended its worker 3 times ([slurm] max_lost = 2), last: the node failed"),
        Some(SkipReason::ClusterLost)
    );
    assert_eq!(
        skipped_for("quarantined: failed twice: x"),
        Some(SkipReason::Quarantined)
    );
    assert_eq!(
        skipped_for("build failed: nvcc exited 1"),
        Some(SkipReason::Build)
    );

    assert_eq!(
        failure("not started: no GPU", None),
        Some(WorkerFailure::NotStarted)
    );
    assert_eq!(
        failure("anything", Some(true)),
        Some(WorkerFailure::NotStarted)
    );
    assert_eq!(
        failure("not started: its own words", Some(false)),
        Some(WorkerFailure::Died)
    );
    assert_eq!(
        failure("the worker sent a reply that is not protocol: `x`", None),
        Some(WorkerFailure::Garbled)
    );
    assert_eq!(
        failure("signal: 11 (SIGSEGV)", None),
        Some(WorkerFailure::Died)
    );

    match old(
        json!({"event": "check_failed", "variant": "v", "shape": "small", "dtype": "f16",
        "check": null, "reason": "the worker sent a reply that is not protocol: `x`"}),
    ) {
        Record::CheckFailed { fault, .. } => assert_eq!(fault, Some(CaseFault::Crashed)),
        r => panic!("{r:?}"),
    }
    match old(
        json!({"event": "proposer_ran", "step": 1, "command": "c", "seconds": 1.0,
        "status": "exit status: 0", "timed_out": false, "output_tail": ""}),
    ) {
        Record::ProposerRan { end, .. } => assert_eq!(end, Some(ProcessEnd::Exited { code: 0 })),
        r => panic!("{r:?}"),
    }
}

/// A record that carries its type keeps it, whatever its words say.
#[test]
fn a_typed_field_is_never_overwritten_by_words() {
    let r = old(
        json!({"event": "case_skipped", "variant": "v", "shape": "small", "dtype": "f16",
        "reason": "not measured: --max-variants 2", "skipped_for": "build"}),
    );
    assert!(matches!(
        r,
        Record::CaseSkipped {
            skipped_for: Some(SkipReason::Build),
            ..
        }
    ));
    let r = old(
        json!({"event": "worker_crashed", "variant": "v", "detail": "not started: x",
        "cases_not_run": [], "failure": "died"}),
    );
    assert!(matches!(
        r,
        Record::WorkerCrashed {
            failure: Some(WorkerFailure::Died),
            ..
        }
    ));
}

/// Issue 52, item 1: an older log's header names no command; its records say which wrote it, so
/// `resume` takes an older step for a step, never for a tune.
#[test]
fn an_older_logs_command_is_read_from_the_records_only_it_writes() {
    use flashtune::log::runlog::{legacy::upgrade_log, Entry, LoadedLog, RunCommand};
    let committed = flashtune::log::runlog::read(
        &crate::common::repo().join("docs/measurements/2026-11-29-h200/first-run/log.jsonl.gz"),
    )
    .unwrap();
    // A log written before the field, read through `read`: a tune, as it was.
    assert_eq!(committed.header().unwrap().command, Some(RunCommand::Tune));
    let (line, first) = committed.entries[0].clone();
    let mut header = first.clone();
    let Record::Header(h) = &mut header.record else {
        panic!("{first:?}")
    };
    h.command = None;
    let command_of = |later: serde_json::Value| {
        let mut later: Entry = serde_json::from_value(later).unwrap();
        // As `read` does: each record upgraded, then the log.
        upgrade(&mut later.record);
        let mut log = LoadedLog {
            entries: vec![(line, header.clone()), (line + 1, later)],
            torn_tail: false,
        };
        upgrade_log(&mut log);
        log.header().unwrap().command
    };
    let agent = json!({"t": 1.0, "event": "agent_session", "agent": "custom", "command": "x",
        "usage": null, "candidates": 2, "steps": 1, "max_cost_usd": null, "stop_at_roof": null,
        "patience": null, "time_limit_s": null, "space": null, "variant": null});
    assert_eq!(command_of(agent), Some(RunCommand::AgentSession));
    let step = json!({"t": 1.0, "event": "step_started", "step": 1, "base_commit": "abc",
        "changed_files": ["kernels/attention/forward.cu"]});
    assert_eq!(command_of(step), Some(RunCommand::Step));
    let head_build = json!({"t": 1.0, "event": "built", "variant": "v@head", "dtype": "f16",
        "head_dim": 64, "key": "k", "cached": false, "seconds": 1.0, "entries": []});
    assert_eq!(command_of(head_build), Some(RunCommand::Step));
    let no_step_yet = json!({"t": 1.0, "event": "interrupted", "reason": "SIGTERM"});
    assert_eq!(command_of(no_step_yet), Some(RunCommand::Tune));
}
