//! Several GPUs of one host (issue 50), on the double: `FLASHTUNE_FAKE_GPUS=2` shows two GPUs of
//! one model, as a real host does.
use crate::common::*;
use flashtune::log::runlog::Record;
use std::collections::BTreeSet;

/// A run on two GPUs: the header names both, each measures cases, and every champion whose
/// runner-up was timed on the other GPU meets it again on one before the table stands.
#[test]
fn a_run_on_two_gpus_names_both_and_reduels_picks_that_span_them() {
    let dir = scratch_project();
    let out = flashtune_with_env(
        dir.path(),
        &[
            "tune",
            "--fake-gpu",
            "--gpus",
            "all",
            "--space",
            "variants/smoke.toml",
        ],
        &[("FLASHTUNE_FAKE_GPUS", "2")],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    let recs = records(&run);
    let Some(Record::Header(h)) = recs.first() else {
        panic!("no header")
    };
    assert_eq!(h.gpus, vec![0, 1], "the header names the GPUs the run used");
    let devices: BTreeSet<u32> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Timed { device, .. } => *device,
            _ => None,
        })
        .collect();
    assert_eq!(devices, BTreeSet::from([0, 1]), "both GPUs measured cases");
    let across: Vec<(String, String)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::DriftDuel {
                placed: Some(p), ..
            } => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert!(
        !across.is_empty(),
        "no pick spanned the two GPUs:\n{}",
        text(&out)
    );
    assert!(across
        .iter()
        .all(|(a, b)| a != b && a.starts_with("GPU ") && b.starts_with("GPU ")));
    // The stages outside the workers say when they held which GPU (the timeline reads them).
    let stages: Vec<(flashtune::model::vocab::Stage, u32)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::StageRan {
                stage,
                device,
                seconds,
                ..
            } if *seconds >= 0.0 => Some((*stage, *device)),
            _ => None,
        })
        .collect();
    use flashtune::model::vocab::Stage;
    for stage in [Stage::Roofs, Stage::Reference, Stage::Duels] {
        assert!(
            stages.contains(&(stage, 0)),
            "no {stage:?} on GPU 0: {stages:?}"
        );
    }
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("GPUs 0, 1: fake GPU"), "{report}");
    assert!(report.contains("(timed on GPU "), "{report}");
}

/// An ordinal the host does not show is a typo: bad input (exit 2), the ordinals there are, and
/// no run folder; the double refuses it as a driver does.
#[test]
fn a_gpu_the_host_does_not_show_is_refused_before_anything_runs() {
    let dir = scratch_project();
    let out = flashtune(
        dir.path(),
        &[
            "tune",
            "--fake-gpu",
            "--gpus",
            "3",
            "--space",
            "variants/smoke.toml",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--gpus 3: this host shows 1 GPU(s), ordinals 0 to 0"),
        "{}",
        text(&out)
    );
    assert!(
        !dir.path().join("runs").exists()
            || std::fs::read_dir(dir.path().join("runs"))
                .unwrap()
                .all(|e| !e.unwrap().path().join("log.jsonl").exists())
    );
    let out = flashtune(dir.path(), &["tune", "--fake-gpu", "--gpus", "zero"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("not a GPU ordinal (0, 1, ...) or `all`"),
        "{}",
        text(&out)
    );
}
