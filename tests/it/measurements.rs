//! Committed measurements can be checked: each docs/measurements/<date>-<gpu>/<name>/ holds the run's log (log.jsonl.gz) and its report.md, and `flashtune report` on that log alone rebuilds the report byte for byte.
//!
//! After a deliberate change to the reports, rebuild them with
//! `FLASHTUNE_BLESS_MEASUREMENTS=1 cargo test --test it measurements::` and commit what changed.
use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every measurement folder: two levels under docs/measurements with a log.jsonl.gz, in name order.
fn measurements() -> Vec<PathBuf> {
    let root = repo().join("docs/measurements");
    let mut found = Vec::new();
    for session in std::fs::read_dir(&root).unwrap() {
        let session = session.unwrap().path();
        if !session.is_dir() {
            continue;
        }
        for run in std::fs::read_dir(&session).unwrap() {
            let run = run.unwrap().path();
            if run.join("log.jsonl.gz").is_file() {
                found.push(run);
            }
        }
    }
    found.sort();
    found
}

/// `flashtune report` on a folder that holds nothing but a copy of the compressed log.
fn rebuilt(measurement: &Path) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        measurement.join("log.jsonl.gz"),
        dir.path().join("log.jsonl.gz"),
    )
    .unwrap();
    let out = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .arg("report")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}{}",
        measurement.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(dir.path().join("report.md")).unwrap()
}

/// Where two reports part, for the failure message; `None` when they are the same bytes.
fn first_difference(committed: &str, rebuilt: &str) -> Option<String> {
    if committed == rebuilt {
        return None;
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (committed.lines().collect(), rebuilt.lines().collect());
    let at = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap_or(a.len().min(b.len()));
    Some(format!(
        "line {}:\n  committed: {}\n  rebuilt:   {}",
        at + 1,
        a.get(at)
            .unwrap_or(&"(end of file, or a difference in line endings)"),
        b.get(at)
            .unwrap_or(&"(end of file, or a difference in line endings)")
    ))
}

#[test]
fn every_committed_report_is_rebuilt_from_its_log_byte_for_byte() {
    let found = measurements();
    assert!(
        !found.is_empty(),
        "no docs/measurements/<date>-<gpu>/<name>/log.jsonl.gz: nothing is checked"
    );
    let bless = std::env::var_os("FLASHTUNE_BLESS_MEASUREMENTS").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for m in &found {
        let report = m.join("report.md");
        let fresh = rebuilt(m);
        if bless {
            std::fs::write(&report, &fresh).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&report)
            .unwrap_or_else(|e| panic!("{}: {e}", report.display()));
        if let Some(diff) = first_difference(&committed, &fresh) {
            failures.push(format!("{}: {diff}", report.display()));
        }
        // The log is the evidence: it is committed compressed and only compressed.
        assert!(!m.join("log.jsonl").exists(), "{}", m.display());
    }
    assert!(
        failures.is_empty(),
        "a committed report is not what its log gives (edited by hand, or the reports changed: \
         FLASHTUNE_BLESS_MEASUREMENTS=1 cargo test --test it measurements:: rebuilds them):\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_hand_edit_is_caught() {
    let committed = rebuilt(&measurements()[0]);
    // One figure nudged, and one trailing newline dropped: both are differences.
    let nudged = committed.replacen("µs", "us", 1);
    assert!(first_difference(&nudged, &committed).is_some());
    let trimmed = committed.trim_end().to_owned();
    assert!(first_difference(&trimmed, &committed).is_some());
    assert!(first_difference(&committed, &committed).is_none());
}

#[test]
fn the_compressed_log_reads_as_the_plain_one() {
    let m = &measurements()[0];
    let packed = flashtune::log::runlog::read(&m.join("log.jsonl.gz")).unwrap();
    assert!(!packed.entries.is_empty() && packed.header().is_some());
    assert_eq!(
        flashtune::log::runlog::path_in(m),
        m.join("log.jsonl.gz"),
        "a folder without log.jsonl reads its log.jsonl.gz"
    );
    // Written out plain, it is the same log.
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for (_, e) in &packed.entries {
        text.push_str(&serde_json::to_string(e).unwrap());
        text.push('\n');
    }
    std::fs::write(dir.path().join("log.jsonl"), text).unwrap();
    let plain = flashtune::log::runlog::read(&flashtune::log::runlog::path_in(dir.path())).unwrap();
    assert_eq!(plain.entries, packed.entries);
}
