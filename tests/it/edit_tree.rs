//! What step commits is what it measured (issue 47): an edit is the git tree that would be
//! committed, snapshotted when judging starts, built from an export of exactly that tree (nvcc's
//! own list of what it read checked against it), and committed byte for byte.
use crate::common;
use common::gitstate::scratch_commits;
use common::*;
use flashtune::log::runlog::Record;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every step's (step, accepted, reason, commit) in the run's log.
fn decided(run: &Path) -> Vec<(u32, bool, String, Option<String>)> {
    records(run)
        .into_iter()
        .filter_map(|r| match r {
            Record::StepDecided {
                step,
                accepted,
                reason,
                commit,
                ..
            } => Some((step, accepted, reason, commit)),
            _ => None,
        })
        .collect()
}

/// Step 1 includes a git-ignored header (in kernels/, where the sandbox lets a proposer write)
/// through `__has_include`, step 2 a file in its scratch folder by an absolute name a macro builds
/// (no text scan sees it; nvcc's dependency list does), step 3 is an honest edit: faster on the
/// double by its mark.
const PROPOSER: &str = r#"#!/bin/sh
set -e
f=kernels/attention/forward.cu
fast='__device__ char flashtune_fake_fast[] = "flashtune-fake: time x0.5";'
case "$FLASHTUNE_STEP" in
  1) mkdir -p kernels/attention/scratch
     printf '%s\n' "$fast" > kernels/attention/scratch/x.cuh
     printf '\n#if __has_include("scratch/x.cuh")\n#include "scratch/x.cuh"\n#endif\n' >> $f ;;
  2) hidden="${TMPDIR:-/tmp}/flashtune-hidden-$$.cuh"
     printf '%s\n' "$fast" > "$hidden"
     printf '\n#define FT_HIDDEN "%s"\n#include FT_HIDDEN\n' "$hidden" >> $f ;;
  3) printf '\n%s\n' "$fast" >> $f ;;
esac
"#;

#[test]
fn an_edit_reaching_past_its_tree_is_refused_by_name_and_a_commit_builds_the_cubins_judged() {
    let dir = repo_project();
    std::fs::write(
        dir.path().join(".gitignore"),
        "runs/\nkernels/attention/scratch/\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("propose.sh"), PROPOSER).unwrap();
    commit_all(dir.path(), "ignore kernels/attention/scratch/");
    let out = fake_step(dir.path(), &["--proposer", "sh propose.sh", "--steps", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    let steps = decided(&run);
    assert_eq!(steps.len(), 3, "{steps:?}");
    let (_, accepted, reason, _) = &steps[0];
    assert!(
        !accepted
            && reason.contains("the edit includes files outside its tree")
            && reason.contains("\"scratch/x.cuh\""),
        "step 1: {reason}"
    );
    let (_, accepted, reason, _) = &steps[1];
    assert!(
        !accepted
            && reason.contains("reads files outside the tree it is built from")
            && reason.contains("flashtune-hidden-"),
        "step 2: {reason}"
    );
    let (_, accepted, reason, commit) = &steps[2];
    assert!(*accepted, "step 3: {reason}");
    let commit = commit.clone().expect("an accepted step has a commit");

    // `git archive` of the commit, unpacked where the step's export was (nvcc writes the folder it
    // compiled in into the cubin's line table) and built afresh into a cache of its own: every
    // cubin the step judged comes out byte for byte.
    let archive = run.join("step-3/edit");
    std::fs::remove_dir_all(&archive).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    let tar = Command::new("git")
        .current_dir(dir.path())
        .args(["archive", "--format=tar", &commit])
        .output()
        .unwrap();
    assert!(tar.status.success(), "{}", text(&tar));
    let mut untar = Command::new("tar")
        .current_dir(&archive)
        .arg("-xf")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    untar.stdin.take().unwrap().write_all(&tar.stdout).unwrap();
    assert!(untar.wait().unwrap().success());
    // nvcc writes each source's modification time into the line table; the step's export pins
    // them to the epoch, and so does this copy.
    let touched = Command::new("find")
        .arg(&archive)
        .args(["-type", "f", "-exec", "touch", "-d", "@0", "{}", "+"])
        .status()
        .unwrap();
    assert!(touched.success());
    let cache = tempfile::tempdir().unwrap();
    let built = Command::new(binary())
        .arg("--root")
        .arg(&archive)
        .args(["build", "--space", "variants/step-ci.toml"])
        .env("FLASHTUNE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built));
    let judged: Vec<PathBuf> = std::fs::read_dir(run.join("step-3/build"))
        .unwrap()
        .map(|e| e.unwrap().path().join("kernel.cubin"))
        .filter(|p| p.is_file())
        .collect();
    assert!(!judged.is_empty(), "the step kept its cubins");
    for cubin in judged {
        let key = cubin.parent().unwrap().file_name().unwrap();
        let again = cache.path().join(key).join("kernel.cubin");
        assert!(
            again.is_file(),
            "the archive's build has no cubin keyed {key:?}"
        );
        assert!(
            std::fs::read(&cubin).unwrap() == std::fs::read(&again).unwrap(),
            "the cubin keyed {key:?} differs"
        );
    }
}

/// The working tree changes while `judge` runs (an MCP agent keeps working): what is committed is
/// the tree read when judging started, not the file as it is at commit time.
#[test]
fn a_swap_after_the_snapshot_never_reaches_the_commit() {
    let dir = repo_project();
    let forward = dir.path().join(FORWARD);
    let original = mark_forward(dir.path(), "time x0.5");
    let measured = std::fs::read_to_string(&forward).unwrap();
    let judge = flashtune_child(
        dir.path(),
        &["judge", "--fake-gpu", "--space", "variants/step-ci.toml"],
        &[],
    );
    // The swap lands once the step has started: its edit is snapshotted by then.
    let started = std::time::Instant::now();
    loop {
        let run = std::fs::read_dir(dir.path().join("runs"))
            .ok()
            .and_then(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .find(|p| p.join("log.jsonl").is_file())
            });
        let begun = run.is_some_and(|run| {
            std::fs::read_to_string(run.join("log.jsonl"))
                .is_ok_and(|t| t.contains("\"step_started\""))
        });
        if begun {
            break;
        }
        assert!(started.elapsed().as_secs() < 120, "the step never started");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let swapped = format!(
        "{original}\n__device__ char flashtune_fake_slow[] = \"flashtune-fake: time x3\";\n"
    );
    std::fs::write(&forward, &swapped).unwrap();
    let out = judge.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let steps = decided(&only_run(dir.path()));
    let (_, accepted, reason, commit) = &steps[0];
    assert!(*accepted, "the measured edit is faster: {reason}");
    let repo = git2::Repository::open(dir.path()).unwrap();
    let commit = repo
        .find_commit(git2::Oid::from_str(commit.as_deref().unwrap()).unwrap())
        .unwrap();
    let blob = commit
        .tree()
        .unwrap()
        .get_path(Path::new(FORWARD))
        .unwrap()
        .to_object(&repo)
        .unwrap()
        .peel_to_blob()
        .unwrap();
    assert_eq!(
        std::str::from_utf8(blob.content()).unwrap(),
        measured,
        "the commit holds the measured edit, not the swap"
    );
}

/// The space that judges an edit is HEAD's: one written under runs/ (where an MCP agent can write
/// and the dirty-tree checks never looked), limited to where the edit wins, is refused by name
/// before anything runs.
#[test]
fn a_space_head_does_not_hold_never_judges_an_edit() {
    let dir = repo_project();
    mark_forward(dir.path(), "time x0.5");
    std::fs::create_dir_all(dir.path().join("runs")).unwrap();
    let space = std::fs::read_to_string(dir.path().join("variants/step-ci.toml")).unwrap();
    std::fs::write(dir.path().join("runs/mine.toml"), &space).unwrap();
    let out = flashtune(
        dir.path(),
        &["judge", "--fake-gpu", "--space", "runs/mine.toml"],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the space runs/mine.toml lies under runs/, which git does not hold"),
        "{}",
        text(&out)
    );
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("log.jsonl").exists())
        .collect();
    assert!(runs.is_empty(), "no run was started: {runs:?}");
}

/// A space that takes its family from another (`family_from`) judges an edit only while both files
/// are HEAD's. The family's file edited in the working tree (here, a wider tile claimed for the
/// launch) is refused by name, though the space's own file is untouched; so is a family file git
/// ignores, which no dirty-tree check sees.
#[test]
fn a_space_whose_taken_family_head_does_not_hold_never_judges_an_edit() {
    let dir = repo_project();
    let taker_of = |family: &str| {
        let taker = common::SPACE.replace(
            "name = \"step-ci\"",
            &format!("name = \"step-ci-taker\"\nfamily_from = \"{family}\""),
        );
        let tables = taker.find("\n[symbols]\n").unwrap()..taker.find("\n[params]\n").unwrap();
        format!("{}{}", &taker[..tables.start], &taker[tables.end..])
    };
    std::fs::write(
        dir.path().join("variants/step-ci-taker.toml"),
        taker_of("step-ci.toml"),
    )
    .unwrap();
    // The same taker on a family file git ignores: only its name is committed.
    std::fs::write(
        dir.path().join("variants/step-ci-ignored.toml"),
        taker_of("local.toml").replace("step-ci-taker", "step-ci-ignored"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".gitignore"),
        "runs/\nvariants/local.toml\n",
    )
    .unwrap();
    commit_all(dir.path(), "spaces taking step-ci's family");
    std::fs::copy(
        dir.path().join("variants/step-ci.toml"),
        dir.path().join("variants/local.toml"),
    )
    .unwrap();
    mark_forward(dir.path(), "time x0.5");
    let judge = |space: &str| flashtune(dir.path(), &["judge", "--fake-gpu", "--space", space]);
    let out = judge("variants/step-ci-ignored.toml");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out)
            .contains("the space its family comes from variants/local.toml is not in HEAD's tree"),
        "{}",
        text(&out)
    );

    let family = dir.path().join("variants/step-ci.toml");
    let at_head = std::fs::read_to_string(&family).unwrap();
    replace_in(
        &family,
        "kv_rows_per_block = \"BLOCK_N\"",
        "kv_rows_per_block = \"2 * BLOCK_N\"",
    );
    let out = judge("variants/step-ci-taker.toml");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("variants/step-ci.toml"),
        "{}",
        text(&out)
    );

    // And with HEAD's family file back, the same edit is judged on the same space.
    std::fs::write(&family, at_head).unwrap();
    let out = judge("variants/step-ci-taker.toml");
    assert!(out.status.success(), "HEAD's files judge: {}", text(&out));
}

/// Candidate 1 edits a comment and ends; candidate 2 then writes a speed-up into candidate 1's
/// worktree. Candidate 1 is judged and would be committed as the tree read when its agent ended:
/// the comment alone, which gains nothing.
const SIBLING_WRITER: &str = r#"
echo "{\"model\": \"scripted\", \"input_tokens\": 1000, \"output_tokens\": 100, \"usd\": 0.25}" > "$FLASHTUNE_USAGE_FILE"
case "$FLASHTUNE_CANDIDATE" in
  1) printf '\n// a comment\n' >> kernels/attention/forward.cu ;;
  2) sibling="${FLASHTUNE_WORKDIR%cand-2}cand-1"
     for _ in $(seq 1 1200); do
       grep -q '"event":"candidate_proposed"' "$FLASHTUNE_RUN_DIR/log.jsonl" && break
       sleep 0.05
     done
     printf '\n__device__ char flashtune_fake_s[] = "flashtune-fake: time x0.5";\n' >> "$sibling/kernels/attention/forward.cu" || true ;;
esac
"#;

#[test]
fn a_sibling_writing_into_a_finished_candidate_changes_nothing_judged() {
    // Unconfined, as where the kernel offers no sandbox: the sandbox alone refuses the sibling's
    // write; the snapshot must hold without it.
    let dir = repo_project_with(unconfined);
    let out = fake_step(
        dir.path(),
        &[
            "--candidates",
            "2",
            "--proposer",
            SIBLING_WRITER,
            "--steps",
            "1",
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        scratch_commits(dir.path()).is_empty(),
        "nothing committed: {t}"
    );
    let judged: Vec<(u32, bool, String)> = records(&only_run(dir.path()))
        .into_iter()
        .filter_map(|r| match r {
            Record::CandidateJudged {
                candidate,
                accepted,
                reason,
                ..
            } => Some((candidate, accepted, reason)),
            _ => None,
        })
        .collect();
    let first = judged
        .iter()
        .find(|(k, _, _)| *k == 1)
        .expect("candidate 1 was judged");
    let second = judged
        .iter()
        .find(|(k, _, _)| *k == 2)
        .expect("candidate 2 was judged");
    assert!(
        second.2.contains("no edits under kernels/"),
        "candidate 2 wrote only its sibling's: {}",
        second.2
    );
    assert!(
        !first.1,
        "candidate 1 was judged from its sibling's write: {}",
        first.2
    );
    let patch = std::fs::read_to_string(only_run(dir.path()).join("attempts/1.1.patch"))
        .unwrap_or_default();
    assert!(!patch.contains("time x0.5"), "{patch}");
}
