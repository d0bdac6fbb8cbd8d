//! Issue 52, items 1 and 2: a `step`, `judge` or agent session stopped by a signal ends in an
//! `interrupted` record with its edit restored and its patch kept; `resume` takes up each run as
//! the command that wrote it, and refuses a step or a judge plainly instead of tuning into it.
use crate::common;
use common::gitstate::dirty;
use common::*;
use flashtune::log::runlog::Record;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The run folder under `root` whose log holds `needle`, waited for.
fn run_whose_log_holds(root: &Path, needle: &str) -> PathBuf {
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "no run log ever held {needle}"
        );
        let found = std::fs::read_dir(root.join("runs")).ok().and_then(|rd| {
            rd.flatten().map(|e| e.path()).find(|run| {
                std::fs::read_to_string(run.join("log.jsonl")).is_ok_and(|t| t.contains(needle))
            })
        });
        if let Some(run) = found {
            return run;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until `path` holds `needle`.
fn wait_for_text(path: &Path, needle: &str) {
    let started = Instant::now();
    while !std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "{} never held {needle}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every file under a run folder with its bytes: what `resume` must leave as it was.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(contents(&path));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
        }
    }
    out.sort();
    out
}

/// A `judge` whose edit's kernel never returns, started on the fake GPU; returns once it duels.
fn judge_mid_duel(root: &Path) -> (std::process::Child, PathBuf) {
    mark_forward(root, "fault FAULT_HANG");
    let child = flashtune_child(
        root,
        &["judge", "--fake-gpu", "--space", "variants/step-ci.toml"],
        &[],
    );
    // The edit's build is logged as `@edit`: from then on the duel is in flight.
    let run = run_whose_log_holds(root, "@edit\"");
    std::thread::sleep(Duration::from_millis(500));
    (child, run)
}

/// A `step --proposer` whose proposer edits the forward kernel and then never ends.
fn step_mid_proposer(root: &Path) -> (std::process::Child, PathBuf) {
    let proposer = "echo '// an edit in progress' >> kernels/attention/forward.cu; exec sleep 120";
    let child = flashtune_child(
        root,
        &[
            "step",
            "--fake-gpu",
            "--space",
            "variants/step-ci.toml",
            "--proposer",
            proposer,
        ],
        &[],
    );
    wait_for_text(&root.join(FORWARD), "// an edit in progress");
    let run = run_whose_log_holds(root, "\"event\":\"header\"");
    std::thread::sleep(Duration::from_millis(300));
    (child, run)
}

/// The run ended on `signal` as every stop does: exit 128 + the signal, `interrupted` last (naming
/// the signal and the file restored), no verdict, the tree back at HEAD, the edit's patch kept.
fn assert_stopped_cleanly(
    out: &std::process::Output,
    run: &Path,
    root: &Path,
    signal: (i32, &str),
    champion: &str,
    edit_marker: &str,
) {
    let t = text(out);
    assert_eq!(out.status.code(), Some(128 + signal.0), "{t}");
    let records = records(run);
    match records.last() {
        Some(Record::Interrupted { reason }) => {
            assert!(reason.contains(signal.1), "{reason}");
            assert!(reason.contains(FORWARD), "{reason}");
        }
        other => panic!("the run ends with {other:?}, not `interrupted`: {t}"),
    }
    assert!(
        !records
            .iter()
            .any(|r| matches!(r, Record::StepDecided { .. })),
        "an interrupted step decides nothing"
    );
    assert_eq!(
        std::fs::read_to_string(root.join(FORWARD)).unwrap(),
        champion
    );
    assert!(dirty(root).is_empty(), "{:?}", dirty(root));
    let patch = std::fs::read_to_string(run.join("attempts/1.patch")).expect("the patch is kept");
    assert!(patch.contains(edit_marker), "{patch}");
}

#[test]
fn sigterm_mid_duel_ends_a_judge_interrupted_with_its_edit_restored_and_its_patch_kept() {
    let dir = repo_project();
    let champion = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let (child, run) = judge_mid_duel(dir.path());
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let sigterm = (libc::SIGTERM, "SIGTERM");
    assert_stopped_cleanly(&out, &run, dir.path(), sigterm, &champion, "FAULT_HANG");
}

#[test]
fn sigint_and_sighup_mid_proposer_end_a_step_interrupted_with_its_edit_restored() {
    for signal in [(libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")] {
        let dir = repo_project();
        let champion = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
        let (child, run) = step_mid_proposer(dir.path());
        unsafe { libc::kill(child.id() as i32, signal.0) };
        let out = child.wait_with_output().unwrap();
        let marker = "an edit in progress";
        assert_stopped_cleanly(&out, &run, dir.path(), signal, &champion, marker);
    }
}

/// `resume` of a killed step or judge refuses with exit 2, says what the run was and how to run it
/// again, and leaves its folder as it was (before: it tuned the whole space into it). The user
/// put the tree back first, so nothing else stands in a tune's way.
fn assert_resume_refuses(root: &Path, run: &Path, command: &str) {
    let repo = git2::Repository::open(root).unwrap();
    let mut checkout = git2::build::CheckoutBuilder::new();
    repo.checkout_head(Some(checkout.force().remove_untracked(true)))
        .unwrap();
    assert!(dirty(root).is_empty(), "{:?}", dirty(root));
    let before = contents(run);
    let id = run.file_name().unwrap().to_str().unwrap().to_owned();
    let out = flashtune(root, &["resume", &id, "--fake-gpu"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains(&format!("is a `flashtune {command}`")), "{t}");
    assert!(t.contains("not resumed"), "{t}");
    assert!(t.contains(&format!("flashtune {command} ")), "{t}");
    assert_eq!(contents(run), before, "resume touched the run folder");
}

#[test]
fn resume_of_a_killed_step_or_judge_refuses_plainly_and_tunes_nothing() {
    let dir = repo_project();
    let (mut child, run) = step_mid_proposer(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_resume_refuses(dir.path(), &run, "step");

    let dir = repo_project();
    let (mut child, run) = judge_mid_duel(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_resume_refuses(dir.path(), &run, "judge");
}
