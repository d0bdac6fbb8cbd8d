//! Issue 47, item 4 and the sandbox: a proposer cannot write what the tool trusts (Landlock confines it to kernels/ and its scratch folder), and what the tool trusts but did not build (the worker binary, the toolchain) is checked after it ran.
use crate::common;
use common::gitstate::*;
use common::*;
use flashtune::log::runlog::Record;
use std::path::Path;
use std::process::{Command, Output};

/// `flashtune step --fake-gpu` on the CI space run by `exe`, with `extra` and one more variable.
fn step_with(exe: &Path, root: &Path, extra: &[&str], (key, value): (&str, &Path)) -> Output {
    Command::new(exe)
        .arg("--root")
        .arg(root)
        .args(["step", "--fake-gpu", "--space", "variants/step-ci.toml"])
        .args(extra)
        .env(key, value)
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .output()
        .unwrap()
}

/// Each step's decision, in order.
fn decisions(records: &[Record]) -> Vec<(bool, String)> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::StepDecided {
                accepted, reason, ..
            } => Some((*accepted, reason.clone())),
            _ => None,
        })
        .collect()
}

/// Steps 1-4 edit the kernel, then write where a proposer must not (runs/, .git, the project's
/// top) or read the folder the sandbox hides; step 5 writes its scratch folder and a faster kernel.
const TRESPASSER: &str = r#"
set -e
printf '\n// tuned\n' >> kernels/attention/forward.cu
case "$FLASHTUNE_STEP" in
  1) echo '{}' > runs/forged.jsonl ;;
  2) printf '[core]\n\tfsmonitor = sh pwn.sh\n' >> .git/config ;;
  3) echo note > stray.txt ;;
  4) cat "$HOME/.local/state/flashtune/key" > kernels/attention/leak.txt ;;
  5) echo scratch > "$TMPDIR/notes.txt"; cat "$TMPDIR/notes.txt" >/dev/null; rm "$TMPDIR/notes.txt"
     printf '\n__device__ char flashtune_fake_m[] = "flashtune-fake: time x0.50";\n' >> kernels/attention/forward.cu ;;
esac
"#;

#[test]
fn a_proposer_that_writes_outside_kernels_or_reads_a_hidden_folder_fails_and_the_step_says_so() {
    let dir = repo_project();
    let root = dir.path();
    let home = tempfile::tempdir().unwrap();
    let key = home.path().join(".local/state/flashtune");
    std::fs::create_dir_all(&key).unwrap();
    std::fs::write(key.join("key"), "secret").unwrap();
    let (before, _) = head(root);
    let out = step_with(
        &binary(),
        root,
        &["--proposer", TRESPASSER, "--steps", "5"],
        ("HOME", home.path()),
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    if !flashtune::run::sandbox::available() {
        assert!(t.contains("no sandbox: this kernel has no Landlock"), "{t}");
        eprintln!("SKIPPED: this kernel has no Landlock; the step said so");
        return;
    }
    assert!(!t.contains("no sandbox"), "{t}");
    let decided = decisions(&records(&only_run(root)));
    assert_eq!(decided.len(), 5, "{t}");
    for (step, path) in [
        (0, "runs/forged.jsonl"),
        (1, ".git/config"),
        (2, "stray.txt"),
        (3, ".local/state/flashtune/key"),
    ] {
        let (accepted, reason) = &decided[step];
        assert!(!accepted, "step {}: {reason}", step + 1);
        assert!(
            reason.contains("did not finish cleanly")
                && reason.contains("the sandbox lets it write only kernels/")
                && reason.contains(path)
                && reason.contains("Permission denied"),
            "step {}: {reason}",
            step + 1
        );
    }
    assert!(!root.join("runs/forged.jsonl").exists());
    assert!(!std::fs::read_to_string(root.join(".git/config"))
        .unwrap()
        .contains("fsmonitor"));
    assert!(!root.join("stray.txt").exists());
    assert!(!root.join("kernels/attention/leak.txt").exists());
    // Inside kernels/ and its scratch folder it works as before: judged and kept.
    assert!(decided[4].0, "step 5: {}", decided[4].1);
    assert_eq!(
        head(root).0,
        before,
        "the fake GPU commits to a scratch ref"
    );
    assert_eq!(scratch_commits(root).len(), 1);
    assert!(dirty(root).is_empty(), "{:?}", dirty(root));
}

/// Issue 47, item 4: with no sandbox (switched off here, as on a kernel without Landlock), a
/// proposer swaps the binary every duel's workers start from. The step stops and names it before
/// any worker starts from it, and nothing is committed.
#[test]
fn a_proposer_that_replaces_the_worker_binary_stops_the_step_by_name() {
    let dir = repo_project_with(unconfined);
    let root = dir.path();
    // A copy of the binary, so the test never touches target/'s.
    let bin = tempfile::tempdir().unwrap();
    let exe = bin.path().join("flashtune");
    std::fs::copy(binary(), &exe).unwrap();
    let (before, _) = head(root);
    // A running binary cannot be written (ETXTBSY): it is replaced, as a real swap would be.
    let proposer = r#"printf '\n// tuned\n' >> kernels/attention/forward.cu
cp "$WORKER" "$WORKER.new" && printf 'x0.7' >> "$WORKER.new" && mv "$WORKER.new" "$WORKER""#;
    let out = step_with(&exe, root, &["--proposer", proposer], ("WORKER", &exe));
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!(
            "the worker binary changed while flashtune was running: {} has other bytes",
            exe.display()
        )),
        "{t}"
    );
    assert!(t.contains("rebuild or reinstall flashtune"), "{t}");
    assert!(
        t.contains("no sandbox: policies.toml [sandbox] enabled = false"),
        "{t}"
    );
    let run = only_run(root);
    assert!(
        !records(&run)
            .iter()
            .any(|r| matches!(r, Record::Duel { .. })),
        "no duel ran: {t}"
    );
    assert_eq!(head(root).0, before);
    assert!(scratch_commits(root).is_empty(), "{t}");
}
