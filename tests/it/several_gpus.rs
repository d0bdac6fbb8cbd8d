//! Several GPUs of one host (issue 50), on the double: `FLASHTUNE_FAKE_GPUS=2` shows two GPUs of
//! one model, as a real host does.
use crate::common::*;
use flashtune::log::runlog::Record;
use std::collections::BTreeSet;

/// `tune --fake-gpu --gpus GPUS` on the smoke space in a fresh project: its run folder, and the
/// project to keep it alive.
fn tune_smoke(gpus: &str, env: &[(&str, &str)]) -> (std::path::PathBuf, tempfile::TempDir) {
    let dir = scratch_project();
    let out = flashtune_with_env(
        dir.path(),
        &[
            "tune",
            "--fake-gpu",
            "--gpus",
            gpus,
            "--space",
            "variants/smoke.toml",
        ],
        env,
    );
    assert!(out.status.success(), "{}", text(&out));
    (only_run(dir.path()), dir)
}

/// A run on two GPUs: the header names both, each measures cases, and every champion whose
/// runner-up was timed on the other GPU meets it again on one before the table stands.
#[test]
fn a_run_on_two_gpus_names_both_and_reduels_picks_that_span_them() {
    let (run, _project) = tune_smoke("all", &[("FLASHTUNE_FAKE_GPUS", "2")]);
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
        std::fs::read_to_string(run.join("report.md")).unwrap()
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
    // The meetings are spread over the GPUs, side by side.
    if across.len() >= 2 {
        assert!(
            stages.contains(&(Stage::Duels, 1)),
            "{} meetings, none on GPU 1: {stages:?}",
            across.len()
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

/// The medians a run's log gives each (variant, shape, dtype) it timed (its last timing).
fn medians(run: &std::path::Path) -> std::collections::BTreeMap<(String, String, String), f64> {
    records(run)
        .into_iter()
        .filter_map(|r| match r {
            Record::Timed {
                variant,
                shape,
                dtype,
                timing,
                ..
            } => Some(((variant, shape, dtype.to_string()), timing.median_us)),
            _ => None,
        })
        .collect()
}

/// The cheat: a GPU that flatters every case it times (here GPU 1 reports 0.9 of every time: too
/// little for the roofs to see, which catch 0.8 on the decode shape). Its cases top the rankings,
/// champion and runner-up alike, so comparing the champion with its runner-up alone never sees it.
/// Each GPU's leader must meet the champion on one GPU, and the run on two GPUs must name
/// champions as fast, on one chip, as the run on GPU 0 alone.
#[test]
fn a_gpu_that_flatters_every_case_it_times_does_not_choose_the_champions() {
    let env = [
        ("FLASHTUNE_FAKE_GPUS", "2"),
        ("FLASHTUNE_FAKE_GPU_TIMES", "1.0,0.9"),
    ];
    let (alone, _keep_alone) = tune_smoke("0", &env);
    let (both, _keep_both) = tune_smoke("0,1", &env);
    let on_one_chip = medians(&alone);
    let fair = champions(&alone);
    let named = champions(&both);
    assert_eq!(
        named.keys().collect::<Vec<_>>(),
        fair.keys().collect::<Vec<_>>()
    );
    let flattered: Vec<_> = records(&both)
        .into_iter()
        .filter(|r| {
            matches!(
                r,
                Record::Timed {
                    device: Some(1),
                    ..
                }
            )
        })
        .collect();
    assert!(!flattered.is_empty(), "GPU 1 timed nothing");
    let both_records = records(&both);
    assert!(
        !both_records
            .iter()
            .any(|r| matches!(r, Record::Implausible { .. })),
        "the roofs caught the flattering GPU: this test is for what they cannot see"
    );
    for ((shape, dtype), variant) in &named {
        let fair_variant = &fair[&(shape.clone(), dtype.clone())];
        let time = |v: &str| on_one_chip[&(v.to_owned(), shape.clone(), dtype.clone())];
        assert!(
            time(variant) <= time(fair_variant) * (1.0 + 1e-9),
            "{shape} {dtype}: the two-GPU run named {variant} ({:.2} µs on GPU 0), GPU 0 alone \
             named {fair_variant} ({:.2} µs)",
            time(variant),
            time(fair_variant)
        );
    }
    assert!(
        both_records.iter().any(|r| matches!(
            r,
            Record::DriftDuel {
                placed: Some(_),
                ..
            }
        )),
        "no leader of one GPU met a champion of the other"
    );
}

/// The profiles are one queue over the GPUs: with two GPUs each profiles some of the cases, every
/// f16 champion (and its exact ties, `within_pct = 0`) is profiled once, and the stage's span is
/// logged on both.
#[test]
fn the_profiles_are_spread_over_the_gpus_each_champion_once() {
    let dir = scratch_project();
    replace_in(
        &dir.path().join("policies.toml"),
        "[profile]\nenabled = true",
        "[profile]\nenabled = true\non_fake_gpu = true",
    );
    let out = flashtune_with_env(
        dir.path(),
        &[
            "tune",
            "--fake-gpu",
            "--gpus",
            "0,1",
            "--space",
            "variants/smoke.toml",
        ],
        &[("FLASHTUNE_FAKE_GPUS", "2")],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    let recs = records(&run);
    let mut profiled: Vec<(String, String)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Profiled {
                variant,
                shape,
                dtype,
                ..
            } => Some((format!("{shape} {dtype}"), variant.clone())),
            _ => None,
        })
        .collect();
    let champions = champions(&run);
    let expected: Vec<(String, String)> = champions
        .iter()
        .filter(|((_, dtype), _)| dtype == "f16")
        .map(|((shape, dtype), variant)| (format!("{shape} {dtype}"), variant.clone()))
        .collect();
    profiled.sort();
    let once: BTreeSet<&(String, String)> = profiled.iter().collect();
    assert_eq!(
        once.len(),
        profiled.len(),
        "a case profiled twice: {profiled:?}"
    );
    for champion in &expected {
        assert!(
            profiled.contains(champion),
            "{champion:?} not profiled: {profiled:?}"
        );
    }
    let on: BTreeSet<u32> = recs
        .iter()
        .filter_map(|r| match r {
            Record::StageRan {
                stage: flashtune::model::vocab::Stage::Profiles,
                device,
                ..
            } => Some(*device),
            _ => None,
        })
        .collect();
    assert_eq!(on, BTreeSet::from([0, 1]), "profiles ran on both GPUs");
}
