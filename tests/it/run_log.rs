//! The run log: records round-trip, a torn tail is recovered, a log is never overwritten.
use flashtune::log::runlog::{self, Record, RunLog};
use flashtune::model::config::Dtype;

#[test]
fn round_trip_and_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    let mut log = RunLog::create(&path).unwrap();
    let records = vec![
        Record::Interrupted {
            reason: "first".into(),
        },
        Record::Rejected {
            variant: "v".into(),
            dtype: Dtype::F16,
            head_dim: 64,
            reason: "spills".into(),
        },
        Record::Finished {
            seconds: 1.5,
            variants: 1,
            measured_cases: 0,
            failed_cases: 1,
        },
    ];
    for r in &records {
        log.append(r.clone()).unwrap();
    }
    let back = runlog::read(&path).unwrap();
    assert!(!back.torn_tail);
    assert_eq!(
        back.entries
            .iter()
            .map(|(_, e)| e.record.clone())
            .collect::<Vec<_>>(),
        records
    );
    assert_eq!(
        back.entries.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        [1, 2, 3]
    );

    // A crash mid-write leaves half a line: ignored, flagged.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"{\"t\":2.0,\"event\":\"timed\",\"varia");
    std::fs::write(&path, &bytes).unwrap();
    let back = runlog::read(&path).unwrap();
    assert!(back.torn_tail);
    assert_eq!(back.entries.len(), 3);

    // Damage anywhere else is corruption, not something to skip silently.
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    lines[1] = "not json".into();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let err = runlog::read(&path).unwrap_err();
    assert!(err.to_string().contains(":2:"), "{err}");
}

#[test]
fn log_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.jsonl");
    RunLog::create(&path).unwrap();
    assert!(RunLog::create(&path).is_err());
}

/// Two runs started in the same second sort by the order they started, not by their ids' salt
/// (the history and "the newest run" read them in this order).
#[test]
fn runs_of_one_second_sort_in_the_order_they_started() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("20261124-215150-ffff");
    let second = dir.path().join("20261124-215150-0000");
    let earlier = dir.path().join("20261124-215149-9999");
    for d in [&earlier, &first] {
        std::fs::create_dir(d).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::create_dir(&second).unwrap();
    if std::fs::metadata(&first).and_then(|m| m.created()).is_err() {
        eprintln!("this filesystem keeps no creation time: only the ids' order can be checked");
        return;
    }
    let mut runs = vec![second.clone(), first.clone(), earlier.clone()];
    runlog::sort_by_start(&mut runs);
    assert_eq!(runs, [earlier.clone(), first.clone(), second.clone()]);
    // Files inside the folders sort as their folders do.
    let mut logs: Vec<_> = [&second, &earlier, &first]
        .iter()
        .map(|d| d.join("log.jsonl"))
        .collect();
    runlog::sort_by_start(&mut logs);
    assert_eq!(
        logs,
        [&earlier, &first, &second].map(|d| d.join("log.jsonl"))
    );
}
