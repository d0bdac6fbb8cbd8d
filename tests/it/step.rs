//! `flashtune step` on temporary git repositories with the fake GPU: edits reverted or committed, proposers kept in their scope. Builds are real nvcc builds.
use crate::common;
use common::gitstate::{dirty, file_at, head, scratch_commits};
use common::*;
use flashtune::log::runlog::Record;
use std::path::Path;
use std::process::Command;

fn decision(records: &[Record]) -> (bool, String, Vec<String>) {
    records
        .iter()
        .find_map(|r| match r {
            Record::StepDecided {
                accepted,
                reason,
                restored,
                ..
            } => Some((*accepted, reason.clone(), restored.clone())),
            _ => None,
        })
        .expect("a step_decided record")
}

#[test]
fn a_slower_edit_is_reverted_and_the_log_says_why() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    let original = mark_forward(dir.path(), "time x1.30");
    let out = fake_step(dir.path(), &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        original
    );
    assert_eq!(head(dir.path()).0, before);
    assert!(dirty(dir.path()).is_empty());
    let records = records(&only_run(dir.path()));
    let (accepted, reason, restored) = decision(&records);
    assert!(!accepted);
    assert!(
        reason.contains("slower beyond noise on small f16 -23"),
        "{reason}"
    );
    assert_eq!(restored, [FORWARD]);
    assert!(records.iter().any(|r| matches!(r,
        Record::Duel { verdict: Some(v), challenger: Some(_), champion: Some(_), .. } if v.gain < -0.2)));
    assert!(
        t.contains("## Step 1 — rejected") && t.contains("synthetic figures"),
        "{t}"
    );
}

#[test]
fn a_fake_step_refuses_to_commit_to_the_branch_and_keeps_the_edit_on_a_scratch_ref() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    let original = mark_forward(dir.path(), "time x0.80");
    let edited = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let out = fake_step(dir.path(), &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    // Synthetic figures never reach the user's branch, nor stay in the working tree.
    assert_eq!(head(dir.path()).0, before, "{t}");
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        original
    );
    let (accepted, reason, restored) = decision(&records(&only_run(dir.path())));
    assert!(accepted, "{reason}");
    assert_eq!(restored, [FORWARD]);
    // The edit is kept where it can be inspected: a scratch ref, with step's trailers.
    let scratch = scratch_commits(dir.path());
    assert_eq!(scratch.len(), 1, "{scratch:?}");
    let (name, commit, message) = &scratch[0];
    assert!(
        name.starts_with("refs/flashtune/fake/") && name.ends_with("/step-1"),
        "{name}"
    );
    for trailer in [
        "Flashtune-Step: ",
        "Flashtune-Speedup: 1.250x",
        "Flashtune-GPU: fake GPU",
        "Flashtune-Synthetic: ",
    ] {
        assert!(
            message.contains(trailer),
            "{trailer} missing in:\n{message}"
        );
    }
    assert!(
        message.starts_with("flashtune step (synthetic): "),
        "{message}"
    );
    assert_eq!(file_at(dir.path(), commit, FORWARD), edited);
    assert!(records(&only_run(dir.path())).iter().any(|r| matches!(r,
        Record::StepDecided { commit: Some(c), scratch_ref: Some(s), .. } if c == commit && s == name)));
    assert!(
        t.contains("not to your branch") && t.contains("synthetic"),
        "{t}"
    );
}

#[test]
fn a_rejected_edits_patch_comes_back_from_show_attempt_and_applies() {
    let dir = repo_project();
    let original = mark_forward(dir.path(), "time x1.30");
    let edited = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let out = fake_judge_json(dir.path(), &["--idea", "sleep longer in the main loop"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    schema::check("verdict", &v);
    assert_eq!(v["verdict"], "rejected", "{v}");
    assert_eq!(v["idea"]["summary"], "sleep longer in the main loop");
    assert_eq!(v["idea"]["from"], "caller");
    assert_eq!(v["diff_stat"], "1 file, +2 -0", "{v}");
    assert!(v["metrics"]["summary"]
        .as_str()
        .unwrap()
        .contains("geomean -2"));
    // ptxas's registers of HEAD's build and of the edit's, told apart by the roles on their records.
    let registers = v["metrics"]["registers"].as_array().expect("registers");
    assert!(
        registers.len() == 2 && registers.iter().all(|r| r.as_u64().unwrap_or(0) > 0),
        "{v}"
    );
    // Restored to HEAD, and not lost: the history has it, with its patch.
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        original
    );
    let id = v["attempt"].as_str().unwrap().to_owned();
    let history = flashtune(dir.path(), &["history", "--json"]);
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    schema::check("history", &history);
    let entry = &history["steps"][0];
    assert_eq!(entry["attempt"], id.as_str());
    assert_eq!(entry["diff_stat"], "1 file, +2 -0");
    assert_eq!(entry["verdict"], "rejected");
    let shown = flashtune(dir.path(), &["show-attempt", &id]);
    assert!(shown.status.success(), "{}", text(&shown));
    let patch = String::from_utf8(shown.stdout).unwrap();
    assert!(
        patch.contains("+__device__ char flashtune_fake_time_x1_30"),
        "{patch}"
    );
    // `git apply` takes it in a fresh clone of HEAD, and gives back the edit exactly.
    let clone = tempfile::tempdir().unwrap();
    let git = |args: &[&str], at: &Path| {
        let out = Command::new("git")
            .args(args)
            .current_dir(at)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out));
    };
    git(
        &["clone", "-q", dir.path().to_str().unwrap(), "."],
        clone.path(),
    );
    std::fs::write(clone.path().join("attempt.patch"), &patch).unwrap();
    git(&["apply", "attempt.patch"], clone.path());
    assert_eq!(
        std::fs::read_to_string(clone.path().join(FORWARD)).unwrap(),
        edited
    );
    let json = flashtune(dir.path(), &["show-attempt", &id, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    schema::check("attempt", &json);
    assert_eq!(json["patch"], patch.as_str());
    let missing = flashtune(dir.path(), &["show-attempt", "20990101-000000-abcd/1"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
}

#[test]
fn an_edit_that_does_not_compile_or_computes_wrong_is_reverted() {
    let dir = repo_project();
    let fwd = dir.path().join(FORWARD);
    let original = std::fs::read_to_string(&fwd).unwrap();
    std::fs::write(&fwd, format!("{original}\nthis is not CUDA;\n")).unwrap();
    let out = fake_step(dir.path(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&fwd).unwrap(), original);
    let (accepted, reason, _) = decision(&records(&only_run(dir.path())));
    assert!(!accepted && reason.contains("does not build"), "{reason}");

    std::fs::remove_dir_all(dir.path().join("runs")).unwrap();
    // Two shapes: the wrong edit fails on the first, and the second is never timed.
    std::fs::write(
        dir.path().join("variants/step-ci2.toml"),
        SPACE.replace(r#"shapes = ["small"]"#, r#"shapes = ["small", "ragged"]"#),
    )
    .unwrap();
    commit_all(dir.path(), "a two-shape space");
    mark_forward(dir.path(), "fault FAULT_WRONG");
    let out = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["step", "--fake-gpu", "--space", "variants/step-ci2.toml"])
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&fwd).unwrap(), original);
    let records = records(&only_run(dir.path()));
    let (accepted, reason, _) = decision(&records);
    assert!(
        !accepted && reason.contains("the edit fails its checks") && reason.contains("relative L2"),
        "{reason}"
    );
    let duels: Vec<&Record> = records
        .iter()
        .filter(|r| matches!(r, Record::Duel { .. }))
        .collect();
    assert_eq!(duels.len(), 1, "stops at the first failed case: {duels:?}");
    assert!(matches!(duels[0],
        Record::Duel { shape, challenger_check: Some(c), verdict: None, .. } if !c.passed() && shape == "small"));
    // Each case's line reached stderr as it was judged.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("step 1: small f16: the edit fails its checks"),
        "{stderr}"
    );
}

/// Where no sandbox stops the writes (here switched off; sandbox.rs shows them refused), the edit
/// outside kernels/ is found, undone and named.
#[test]
fn a_proposer_that_edits_outside_kernels_is_rejected_and_undone() {
    let dir = repo_project_with(unconfined);
    let policies = std::fs::read_to_string(dir.path().join("policies.toml")).unwrap();
    let fwd_original = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let proposer = "sed -i 's/threshold = 0.02/threshold = -1.0/' policies.toml && echo '// faster?' >> kernels/attention/forward.cu && echo note > stray.txt";
    let out = fake_step(dir.path(), &["--proposer", proposer]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("policies.toml")).unwrap(),
        policies
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        fwd_original
    );
    assert!(!dir.path().join("stray.txt").exists());
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    let records = records(&only_run(dir.path()));
    let (accepted, reason, _) = decision(&records);
    assert!(!accepted);
    assert!(
        reason.contains("policies.toml") && reason.contains("stray.txt"),
        "{reason}"
    );
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::ProposerRan { status, .. } if status.contains('0'))));
    assert!(
        !records.iter().any(|r| matches!(r, Record::Duel { .. })),
        "nothing is timed"
    );
}

/// Where no sandbox keeps it out of .git (here switched off), a commit is undone.
#[test]
fn a_proposer_that_commits_is_refused_and_head_put_back() {
    let dir = repo_project_with(unconfined);
    let (before, _) = head(dir.path());
    let proposer = "echo '// mine' >> kernels/attention/forward.cu && git -c user.name=agent -c user.email=agent@localhost commit -qam 'agent commit'";
    let out = fake_step(dir.path(), &["--proposer", proposer]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("moved HEAD"), "{t}");
    assert_eq!(head(dir.path()).0, before, "HEAD must be put back");
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    let (accepted, reason, _) = decision(&records(&only_run(dir.path())));
    assert!(!accepted && reason.contains("moved HEAD"), "{reason}");
}

/// Where no sandbox keeps it out of runs/ (here switched off), an edited run log stops the run.
#[test]
fn a_proposer_that_touches_the_run_folder_stops_the_run() {
    let dir = repo_project_with(unconfined);
    let out = fake_step(
        dir.path(),
        &[
            "--proposer",
            "echo '{}' >> \"$FLASHTUNE_RUN_DIR/log.jsonl\"",
        ],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("modified flashtune's run files"), "{t}");
}

#[test]
fn proposer_steps_see_the_last_verdict_and_uncommitted_policies_are_refused() {
    let dir = repo_project();
    // Step 1 writes a faster edit; step 2 writes down what it was told, inside its scope.
    let proposer = r#"if [ "$FLASHTUNE_STEP" = 1 ]; then printf '\n__device__ char flashtune_fake_m[] = "flashtune-fake: time x0.50";\n' >> kernels/attention/forward.cu; else echo "// $FLASHTUNE_LAST_VERDICT $(test -f "$FLASHTUNE_LAST_REPORT" && echo report)" > kernels/attention/seen.txt; fi"#;
    let out = fake_step(dir.path(), &["--proposer", proposer, "--steps", "2"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("1 accepted, 1 rejected"), "{t}");
    let records = records(&only_run(dir.path()));
    let seen = records.iter().find_map(|r| match r {
        Record::StepStarted {
            step: 2,
            changed_files,
            ..
        } => Some(changed_files.clone()),
        _ => None,
    });
    assert_eq!(seen, Some(vec!["kernels/attention/seen.txt".to_owned()]));
    assert!(
        !dir.path().join("kernels/attention/seen.txt").exists(),
        "an edit with no effect is not kept"
    );

    std::fs::write(
        dir.path().join("variants/step-ci.toml"),
        format!("{SPACE}\n# edited\n"),
    )
    .unwrap();
    let out = fake_step(dir.path(), &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("variants/step-ci.toml"), "{t}");
}

#[test]
fn a_proposer_that_fails_or_times_out_has_its_edit_restored_unjudged() {
    let dir =
        repo_project_with(|p| p.replace("proposer_timeout_s = 1800", "proposer_timeout_s = 2"));
    let original = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let proposer = r#"echo '// half an edit' >> kernels/attention/forward.cu; if [ "$FLASHTUNE_STEP" = 1 ]; then exit 3; else sleep 30; fi"#;
    let started = std::time::Instant::now();
    let out = fake_step(dir.path(), &["--proposer", proposer, "--steps", "2"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        started.elapsed().as_secs() < 25,
        "the timeout must kill the proposer"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        original
    );
    let records = records(&only_run(dir.path()));
    let ran: Vec<(String, bool)> = records
        .iter()
        .filter_map(|r| match r {
            Record::ProposerRan {
                status, timed_out, ..
            } => Some((status.clone(), *timed_out)),
            _ => None,
        })
        .collect();
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(ran[0].0.contains('3') && !ran[0].1 && ran[1].1, "{ran:?}");
    let reasons: Vec<&str> = records
        .iter()
        .filter_map(|r| match r {
            Record::StepDecided {
                reason,
                accepted: false,
                ..
            } => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 2);
    assert!(
        reasons.iter().all(|r| r.contains("did not finish")),
        "{reasons:?}"
    );
}

/// The real worker's duel: `FLASHTUNE_GPU_TESTS=1 scripts/test.sh` on a GPU machine.
#[test]
#[ignore = "needs an NVIDIA GPU: FLASHTUNE_GPU_TESTS=1 scripts/test.sh"]
fn gpu_a_slower_edit_is_rejected_and_a_faster_one_committed() {
    let run = |dir: &Path| {
        Command::new(binary())
            .arg("--root")
            .arg(dir)
            .args(["step", "--space", "variants/step-ci.toml"])
            .env(
                "FLASHTUNE_CACHE_DIR",
                repo().join("target/test-build-cache"),
            )
            .output()
            .expect("flashtune runs")
    };
    let anchor = "        path.step(cur, ctx, blk * kBlockN);";
    let sleepy =
        |src: &str| src.replacen(anchor, &format!("        __nanosleep(4000);\n{anchor}"), 1);
    let dir = repo_project();
    let fwd = dir.path().join(FORWARD);
    let original = std::fs::read_to_string(&fwd).unwrap();
    assert!(original.contains(anchor));
    std::fs::write(&fwd, sleepy(&original)).unwrap();
    let out = run(dir.path());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&fwd).unwrap(),
        original,
        "{}",
        text(&out)
    );
    let (accepted, reason, _) = decision(&records(&only_run(dir.path())));
    assert!(!accepted, "{reason}");
    assert!(records(&only_run(dir.path()))
        .iter()
        .any(|r| matches!(r, Record::Duel { verdict: Some(v), .. } if v.gain < 0.0)));

    // A deliberately pessimized HEAD, and the edit that takes the pessimization out again.
    let slow_head = repo_project();
    let fwd = slow_head.path().join(FORWARD);
    std::fs::write(&fwd, sleepy(&original)).unwrap();
    Command::new("git")
        .current_dir(slow_head.path())
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "commit",
            "-qam",
            "pessimized",
        ])
        .status()
        .unwrap();
    std::fs::write(&fwd, &original).unwrap();
    let out = run(slow_head.path());
    assert!(out.status.success(), "{}", text(&out));
    let (accepted, reason, _) = decision(&records(&only_run(slow_head.path())));
    assert!(accepted, "{reason}\n{}", text(&out));
    assert!(head(slow_head.path()).1.contains("Flashtune-Speedup: "));
}
