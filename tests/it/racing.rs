//! Racing (`[measure] race_samples`): a case whose first samples put it clearly behind the best so
//! far stops there, its outputs verified all the same, and the champions and their ties come out as
//! they do with every case timed in full.
use crate::common;
use common::*;
use flashtune::log::runindex::RunIndex;
use flashtune::log::runlog::{self, Record};
use flashtune::model::config::Dtype;
use std::path::Path;

/// `tune --fake-gpu` on the smoke space's small and seed shapes with `race_samples` as given.
fn tune(race_samples: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = f16_project("smoke.toml", r#"["small", "seed", "ragged"]"#);
    replace_in(
        &dir.path().join("policies.toml"),
        "race_samples = 8",
        &format!("race_samples = {race_samples}"),
    );
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    (dir, run)
}

fn log_of(run: &Path) -> runlog::LoadedLog {
    runlog::read(&run.join("log.jsonl")).unwrap()
}

#[test]
fn racing_stops_only_cases_that_cannot_win_and_the_champions_are_those_of_full_timing() {
    let (_full_dir, full) = tune(0);
    let (_raced_dir, raced) = tune(4);
    let (full_log, raced_log) = (log_of(&full), log_of(&raced));
    let (full_ix, raced_ix) = (RunIndex::new(&full_log), RunIndex::new(&raced_log));
    for shape in ["small", "seed", "ragged"] {
        let (a, b) = (
            full_ix.pick(shape, Dtype::F16).expect("measured"),
            raced_ix.pick(shape, Dtype::F16).expect("measured"),
        );
        assert_eq!(
            a.best.variant, b.best.variant,
            "{shape}: the champion moved"
        );
        assert_eq!(
            a.tie.is_some(),
            b.tie.is_some(),
            "{shape}: a tie came or went"
        );
    }
    // Every stop is logged with its figures, below the samples a full timing takes, verified, and
    // only where the case was behind the bar.
    let mut stopped = 0;
    for (_, e) in &raced_log.entries {
        if let Record::Timed {
            variant,
            timing,
            raced: Some(r),
            verified,
            ..
        } = &e.record
        {
            stopped += 1;
            assert_eq!(timing.samples_us.len(), r.samples as usize, "{variant}");
            assert_eq!(r.samples, 4, "{variant}");
            assert!(r.p10_us > r.bar.p90_us, "{variant}: {r:?}");
            assert!(
                verified.iter().all(|s| s.stats.passed()) && !verified.is_empty(),
                "{variant}: its outputs were not verified"
            );
            assert_ne!(&r.bar.best, variant);
        }
    }
    assert!(stopped > 0, "racing stopped nothing");
    assert!(!full_log
        .entries
        .iter()
        .any(|(_, e)| matches!(&e.record, Record::Timed { raced: Some(_), .. })));
    let report = std::fs::read_to_string(raced.join("report.md")).unwrap();
    assert!(
        report.contains("⏹") && report.contains("- racing: "),
        "{report}"
    );
}
