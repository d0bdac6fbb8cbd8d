//! `--time-limit` means what it says: nothing starts after it (no build, no worker, no stage), what
//! runs is ended within the stated grace, and the log and the console say so.
use crate::common;
use common::*;
use flashtune::log::runlog::Record;
use flashtune::run::budget::Budget;
use std::time::Instant;

/// Seconds of the limit the test sets.
const LIMIT_S: f64 = 4.0;
/// Slack for a loaded two-core machine: a record's write after its moment, the process's start.
const SLACK_S: f64 = 6.0;

/// Each fake case takes 1.5 s, so one variant (14 cases) outlasts the limit and its grace: it is
/// ended, not waited for. Asserted on the log's times, with slack, not on tight wall times.
#[test]
fn a_time_limit_starts_nothing_after_it_and_ends_what_runs_within_its_grace() {
    let dir = scratch_project();
    let started = Instant::now();
    let out = flashtune_with_env(
        dir.path(),
        &["tune", "--fake-gpu", "--time-limit", "4s"],
        &[("FLASHTUNE_FAKE_PACE_MS", "1500")],
    );
    let wall = started.elapsed().as_secs_f64();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let run_dir = run_dir_from(&out);
    let entries = flashtune::log::runlog::read(&run_dir.join("log.jsonl"))
        .unwrap()
        .entries;
    let grace = Budget::GRACE.as_secs_f64();
    let at = |pick: fn(&Record) -> bool| -> Vec<f64> {
        entries
            .iter()
            .filter(|(_, e)| pick(&e.record))
            .map(|(_, e)| e.t)
            .collect()
    };
    let reached = at(|r| matches!(r, Record::BudgetReached { .. }));
    assert_eq!(reached.len(), 1, "one budget_reached record\n{t}");
    assert!(
        reached[0] <= LIMIT_S + SLACK_S,
        "the limit is logged when it falls, not at the next dispatch: t = {}",
        reached[0]
    );
    let reason = entries
        .iter()
        .find_map(|(_, e)| match &e.record {
            Record::BudgetReached { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        reason.contains("--time-limit 4s") && reason.contains(&format!("{}s", grace as u64)),
        "the record states the limit and its grace: {reason}"
    );
    assert!(t.contains(&reason), "the console says it too:\n{t}");
    for (what, times) in [
        ("built", at(|r| matches!(r, Record::Built { .. }))),
        ("worker_ran", at(|r| matches!(r, Record::WorkerRan { .. }))),
    ] {
        let late: Vec<&f64> = times
            .iter()
            .filter(|&&t| t > LIMIT_S + grace + SLACK_S)
            .collect();
        assert!(
            late.is_empty(),
            "{what} records after limit + grace: {late:?}"
        );
    }
    let finished = at(|r| matches!(r, Record::Finished { .. }));
    assert_eq!(finished.len(), 1, "{t}");
    assert!(
        finished[0] <= LIMIT_S + grace + SLACK_S,
        "the run ends within limit + grace: finished at t = {}",
        finished[0]
    );
    // The whole command, reports included, from a cold process: generous, never tight.
    assert!(
        wall <= LIMIT_S + grace + 30.0,
        "tune --time-limit 4s took {wall:.1} s"
    );
}
