//! Verdicts that cannot be gamed and a tool that fails closed, on the CPU test double with real builds: every cheat rejected by name in `tune` and `step`, figures beyond the roofs called implausible, a NaN reference and a garbled reply ending as failed records, every planned case accounted for.
use crate::common;
use common::*;
use flashtune::log::runindex::RunIndex;
use flashtune::log::runlog::{self, Record};
use flashtune::model::config::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn log_of(run: &Path) -> runlog::LoadedLog {
    runlog::read(&run.join("log.jsonl")).unwrap()
}

/// `tune --fake-gpu` on `space` in `dir`, which must succeed: its run folder and log.
fn tune_fake(dir: &Path, space: &str) -> (PathBuf, runlog::LoadedLog) {
    let out = flashtune(dir, &["tune", "--fake-gpu", "--space", space]);
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    let log = log_of(&run);
    (run, log)
}

/// The `check_failed` reasons of the variant whose id starts with `prefix`; it must have some.
fn rejections<'f>(failed: &'f BTreeMap<String, Vec<String>>, prefix: &str) -> &'f [String] {
    failed
        .iter()
        .find(|(v, _)| v.starts_with(prefix))
        .map(|(_, r)| r.as_slice())
        .unwrap_or_else(|| panic!("`{prefix}` was never rejected: {failed:?}"))
}

/// Every `check_failed` reason per variant.
fn failures(log: &runlog::LoadedLog) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, e) in &log.entries {
        if let Record::CheckFailed {
            variant, reason, ..
        } = &e.record
        {
            out.entry(variant.clone()).or_default().push(reason.clone());
        }
    }
    out
}

/// The reason each cheat of variants/cheats.toml must be rejected with.
const CHEATS: [(&str, &str); 7] = [
    (
        "cache_by_pointer",
        "a timed launch's output is wrong for the inputs it read",
    ),
    (
        "first_launches",
        "a timed launch's output is wrong for the inputs it read",
    ),
    (
        "read_previous_output",
        "a timed launch's output is wrong for the inputs it read",
    ),
    ("race", "differ between two runs on the same inputs (race)"),
    // Large scores come in every set and round (the input mixture): wherever it meets one first.
    ("small_magnitude", "NaN/inf outputs"),
    ("skip_last_tile", "relative L2 error"),
    ("write_outside", "the kernel wrote outside its outputs"),
];

/// The cheats that have read the harness (kernels/attention/faults/cheats.cu, modelled by the double):
/// each exploited a gap the verification had, and each must now be rejected with this reason.
const HARNESS_CHEATS: [(&str, &str); 3] = [
    // Did no work in timed rounds and, in the untimed re-run, rewrote Q and V into inputs whose
    // exact attention was what it wrote: the reference was computed from those buffers afterwards.
    (
        "rewrite_on_rerun",
        "a timed launch's output is wrong for the inputs it read",
    ),
    // Honest only in the rounds racing used to verify from (the first 8) and in the last.
    (
        "honest_early",
        "a timed launch's output is wrong for the inputs it read",
    ),
    // Honest only when its inputs are warm in L2 (checksummed right before the replay).
    (
        "l2_probe",
        "a timed launch's output is wrong for the inputs it read",
    ),
];

/// The cheat suite's project: `verified_replays` raised from 2 so that `honest_early`, honest in 9
/// of 30 rounds, is caught every time rather than with odds 1 - C(9,k)/C(30,k) per case (92% at
/// the default 2; `verified_rounds_are_a_uniform_sample_of_every_round_that_ran` holds the draw).
fn cheat_project(space: &str, shapes: &str) -> tempfile::TempDir {
    let dir = f16_project(space, shapes);
    replace_in(
        &dir.path().join("policies.toml"),
        "verified_replays = 2",
        "verified_replays = 8",
    );
    dir
}

#[test]
fn tune_rejects_every_cheat_by_name_and_none_is_ever_a_champion() {
    // `ragged` (Sk = 300) is where skipping the last 64-key tile shows; `small` is a tile multiple.
    let dir = cheat_project("cheats.toml", r#"["small", "ragged"]"#);
    let (run, log) = tune_fake(dir.path(), "variants/cheats.toml");
    let failed = failures(&log);
    for (cheat, why) in CHEATS
        .into_iter()
        .chain(HARNESS_CHEATS)
        .chain(NEW_HARNESS_CHEATS)
    {
        let variant = format!("{cheat}-bm16-bn64-w4-ks1");
        let reasons = failed
            .get(&variant)
            .unwrap_or_else(|| panic!("{variant} was never rejected: {failed:?}"));
        assert!(
            reasons.iter().any(|r| r.contains(why)),
            "{variant} rejected, but not for `{why}`: {reasons:?}"
        );
    }
    let honest = "none-bm16-bn64-w4-ks1";
    assert!(!failed.contains_key(honest), "{:?}", failed.get(honest));
    let ix = RunIndex::new(&log);
    // The memos are right on every launch, and no faster than the kernel they wrap: every timed
    // launch ran on inputs drawn anew, so they never found an answer to remember.
    for memo in [
        "memo_output-bm16-bn64-w4-ks1",
        "memo_softmax-bm16-bn64-w4-ks1",
    ] {
        assert!(!failed.contains_key(memo), "{:?}", failed.get(memo));
        for shape in ["small", "ragged"] {
            let median = |v: &str| {
                ix.case(v, shape, Dtype::F16)
                    .and_then(|c| c.measured())
                    .unwrap_or_else(|| panic!("{v} not measured on {shape}"))
                    .median_us
            };
            assert!(
                median(memo) >= median(honest),
                "{memo} on {shape}: {} µs against the honest {} µs",
                median(memo),
                median(honest)
            );
        }
    }
    for shape in ["small", "ragged"] {
        let pick = ix
            .pick(shape, Dtype::F16)
            .expect("the honest kernel is timed");
        assert_eq!(pick.best.variant, honest, "{shape}");
    }
    // skip_last_tile is right on `small` (a tile multiple) and timed there, but it is wrong on
    // `ragged`: a kernel wrong anywhere is a candidate nowhere, and the report says so.
    assert!(ix
        .cases
        .iter()
        .any(|c| c.variant.starts_with("skip_last_tile") && c.measured().is_some()));
    assert!(ix.disqualified("skip_last_tile-bm16-bn64-w4-ks1").is_some());
    // A write into the inputs is named as such, not as a wrong answer.
    assert_eq!(
        ix.disqualified("write_outside-bm16-bn64-w4-ks1")
            .map(|f| f.kind),
        Some(flashtune::log::runindex::FaultKind::WroteOutside)
    );
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("## Never a champion")
            && report.contains("`skip_last_tile-bm16-bn64-w4-ks1`: wrong on ragged f16"),
        "{report}"
    );
    assert!(ix.accounting.holds(), "{:?}", ix.accounting);
}

/// A kernel source whose variants carry markers the test double reads from the cubin.
const MARKED: &str = r#"// Variants the test double treats differently, by a marker string compiled into the cubin.
#define MARK_NONE 0
#define MARK_FAST 1
#define MARK_GARBAGE 2
#define MARK_FIRST_POINTER 3
#define MARK_FORGE_REFERENCE 4
#if MARK == MARK_FAST
__device__ char flashtune_fake_mark[] = "flashtune-fake: time x0.00001";
#elif MARK == MARK_GARBAGE
__device__ char flashtune_fake_mark[] = "flashtune-fake: fault FAULT_GARBAGE_REPLY";
#elif MARK == MARK_FIRST_POINTER
__device__ char flashtune_fake_mark[] = "flashtune-fake: cheat CHEAT_CACHE_FIRST_POINTER";
#elif MARK == MARK_FORGE_REFERENCE
__device__ char flashtune_fake_mark[] = "flashtune-fake: cheat CHEAT_FORGE_REFERENCE";
#endif
#include "forward.cu"
"#;

/// A space over the scalar baseline with the MARK values given, measured on `small` and `ragged`.
fn marked_project(marks: &str) -> tempfile::TempDir {
    let dir = f16_project("smoke.toml", r#"["small", "ragged"]"#);
    std::fs::write(dir.path().join("kernels/attention/marked.cu"), MARKED).unwrap();
    let smoke = std::fs::read_to_string(dir.path().join("variants/smoke.toml")).unwrap();
    let space = smoke
        .replace("name = \"smoke\"", "name = \"marked\"")
        .replace(
            "forward = \"kernels/attention/forward.cu\"",
            "forward = \"kernels/attention/marked.cu\"",
        )
        .replace(
            "baseline = { MMA = \"scalar\",",
            "baseline = { MARK = \"none\", MMA = \"scalar\",",
        )
        .replace(
            "MMA = [\"scalar\", \"wmma\"]",
            &format!("MARK = {marks}\nMMA = [\"scalar\"]"),
        )
        .replace("KV_SPLIT = [1, 4]", "KV_SPLIT = [1]");
    assert!(space.contains("MARK = ["), "{space}");
    std::fs::write(dir.path().join("variants/marked.toml"), space).unwrap();
    dir
}

#[test]
fn figures_beyond_the_measured_roofs_are_implausible_and_never_champions() {
    let dir = marked_project(r#"["none", "fast"]"#);
    let (run, log) = tune_fake(dir.path(), "variants/marked.toml");
    let implausible: Vec<(&str, &str)> = log
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Implausible {
                variant, reason, ..
            } => Some((variant.as_str(), reason.as_str())),
            _ => None,
        })
        .collect();
    // 100,000 times faster than the model: beyond the double's matmul and bandwidth roofs.
    assert_eq!(implausible.len(), 2, "{implausible:?}");
    for (variant, reason) in &implausible {
        assert!(variant.starts_with("fast-"), "{variant}");
        assert!(reason.contains("roof"), "{reason}");
    }
    assert!(!log.timed().any(|t| t.variant.starts_with("fast-")));
    let ix = RunIndex::new(&log);
    for shape in ["small", "ragged"] {
        let pick = ix.pick(shape, Dtype::F16).unwrap();
        assert!(
            pick.best.variant.starts_with("none-"),
            "{}",
            pick.best.variant
        );
    }
    assert_eq!(ix.accounting.implausible, 2, "{:?}", ix.accounting);
    assert!(ix.accounting.holds());
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("mplausible"), "{report}");
}

#[test]
fn a_nan_reference_and_a_garbled_reply_end_as_failed_records_and_every_case_is_accounted_for() {
    let dir = marked_project(r#"["none", "garbage"]"#);
    let (run, log) = tune_fake(dir.path(), "variants/marked.toml");
    let failed = failures(&log);
    let garbled = rejections(&failed, "garbage-");
    assert!(
        garbled.iter().all(
            |r| r.contains("reply that is not protocol") && r.contains("oops this is not json")
        ),
        "{garbled:?}"
    );
    let ix = RunIndex::new(&log);
    let a = &ix.accounting;
    assert!(a.holds(), "{a:?}");
    // Two cases for the honest kernel, two for the garbled one: each garbled reply fails the case
    // in flight and ends its worker; the next case gets a fresh worker, and garbles it too.
    assert_eq!(
        (a.planned, a.measured, a.failed, a.implausible, a.skipped),
        (4, 2, 2, 0, 0),
        "{a:?}"
    );
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains(&format!(
            "Cases: {} planned = {} measured + {} failed + {} implausible + {} skipped",
            a.planned, a.measured, a.failed, a.implausible, a.skipped
        )),
        "{report}"
    );

    // The fp32 reference itself answers NaN: every case fails, none vanishes.
    let reference = dir.path().join("kernels/oracle/reference.cu");
    let text_ref = std::fs::read_to_string(&reference).unwrap();
    std::fs::write(
        &reference,
        format!("{text_ref}\n__device__ char flashtune_fake_mark[] = \"flashtune-fake: reference nan\";\n"),
    )
    .unwrap();
    let (_, log) = tune_fake(dir.path(), "variants/marked.toml");
    let ix = RunIndex::new(&log);
    assert_eq!(ix.accounting.measured, 0, "{:?}", ix.accounting);
    assert!(ix.accounting.holds(), "{:?}", ix.accounting);
    let failed = failures(&log);
    let honest = rejections(&failed, "none-");
    assert_eq!(honest.len(), 2, "{honest:?}");
    assert!(
        honest
            .iter()
            .all(|r| r.contains("fp32 reference kernel disagrees with the CPU f64 oracle")),
        "{honest:?}"
    );
}

/// A kernel that rewrites the masked references in device memory so that they unmask to what it
/// wrote (having learnt the mask words) is named before any of its outputs is judged: a set's
/// reference is checksummed into the host when drawn and checked after every launch on it.
#[test]
fn a_reference_rewritten_in_device_memory_is_named_before_any_verdict() {
    let dir = marked_project(r#"["none", "forge_reference"]"#);
    let (_, log) = tune_fake(dir.path(), "variants/marked.toml");
    let failed = failures(&log);
    let reasons = rejections(&failed, "forge_reference-");
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons.iter().all(|r| r.contains(
            "the kernel wrote outside its outputs: the reference of input set 0 changed while the kernel ran"
        )),
        "{reasons:?}"
    );
    assert!(!failed.keys().any(|v| v.starts_with("none-")), "{failed:?}");
}

#[test]
fn the_fresh_recheck_catches_a_cache_the_timed_replays_cannot_see() {
    // Cached on the checked buffers' Q pointer: right on the check and on every timed launch (other
    // buffers, inputs drawn anew), stale once other values sit behind the checked pointers.
    let dir = marked_project(r#"["none", "first_pointer"]"#);
    let (_, log) = tune_fake(dir.path(), "variants/marked.toml");
    let failed = failures(&log);
    let reasons = rejections(&failed, "first_pointer-");
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| r.starts_with("wrong on fresh inputs after timing, in the same loaded module")),
        "{reasons:?}"
    );
}

/// Each step's proposer swaps one cheat in for forward.cu (the cheat family includes it).
const PROPOSER: &str = r#"#!/bin/sh
# Step N writes cheat N over the champion's source (steps 9 and 10: the memos, right but remembering
# answers); step 8 a cache on the checked buffers; the last step an honest kernel that claims an
# impossible speed.
set -e
f=kernels/attention/forward.cu
case "$FLASHTUNE_STEP" in
  1) c=CACHE_BY_POINTER ;; 2) c=FIRST_LAUNCHES ;; 3) c=READ_PREVIOUS_OUTPUT ;; 4) c=RACE ;;
  5) c=SMALL_MAGNITUDE ;; 6) c=SKIP_LAST_TILE ;; 7) c=WRITE_OUTSIDE ;; 9) c=MEMO_OUTPUT ;; 10) c=MEMO_SOFTMAX ;;
  8) printf '#define CHEAT CHEAT_NONE\n#include "faults/cheats.cu"\n__device__ char flashtune_fake_mark[] = "flashtune-fake: cheat CHEAT_CACHE_FIRST_POINTER";\n' > $f; exit 0 ;;
  11) printf '\n__device__ char flashtune_fake_mark[] = "flashtune-fake: time x0.00001";\n' >> $f; exit 0 ;;
  12) c=REWRITE_ON_RERUN ;; 13) c=HONEST_EARLY ;; 14) c=L2_PROBE ;;
  # The oracle edited through a header it includes, beside an honest-looking kernel edit.
  15) printf '#define ORACLE_SHORTCUT 1\n' >> kernels/oracle/oracle.cuh; printf '\n// tuned\n' >> $f; exit 0 ;;
  16) c=KEPT_COPY_REPAIR ;; 17) c=FIXED_OFFSET ;; 18) c=BURSTY ;;
  # The kernel replaced by a link to a file outside the project (issue 47, item 9).
  19) rm -f $f; ln -s /etc/hostname $f; exit 0 ;;
esac
# The marker names the cheat to the test double, which cannot run CUDA; a GPU ignores it.
printf '#define CHEAT CHEAT_%s\n#include "faults/cheats.cu"\n__device__ char flashtune_fake_mark[] = "flashtune-fake: cheat CHEAT_%s";\n' "$c" "$c" > $f
"#;

/// The cheats of issue 46, which read the harness that kept a timed round's outputs on the device
/// and drew its stress set apart: each must be rejected with this reason.
const NEW_HARNESS_CHEATS: [(&str, &str); 2] = [
    // No work in timed rounds; found the kept copies in device memory and wrote the honest answer
    // over them before their verdict. The copies now go to the host when they are taken.
    (
        "kept_copy_repair",
        "a timed launch's output is wrong for the inputs it read",
    ),
    // A fixed softmax offset, honest only on the old stress set's mark (‖q‖² > 4d): the mixture's
    // aligned, spiky and outlier heads have large logits at ordinary norms.
    ("fixed_offset", "NaN/inf outputs"),
];

#[test]
fn step_rejects_every_cheat_by_name_and_restores_the_kernel() {
    let dir = cheat_project("smoke.toml", r#"["small", "ragged"]"#);
    let smoke = std::fs::read_to_string(dir.path().join("variants/smoke.toml")).unwrap();
    // The scalar baseline alone: every step builds one kernel per head dim.
    let space = smoke
        .replace("MMA = [\"scalar\", \"wmma\"]", "MMA = [\"scalar\"]")
        .replace("KV_SPLIT = [1, 4]", "KV_SPLIT = [1]");
    std::fs::write(dir.path().join("variants/step-cheats.toml"), space).unwrap();
    std::fs::write(dir.path().join("propose.sh"), PROPOSER).unwrap();
    std::fs::write(dir.path().join(".gitignore"), "runs/\n").unwrap();
    commit_all(dir.path(), "initial");
    let forward = dir.path().join("kernels/attention/forward.cu");
    let original = std::fs::read_to_string(&forward).unwrap();
    let head = || {
        git2::Repository::open(dir.path())
            .unwrap()
            .head()
            .unwrap()
            .peel_to_commit()
            .unwrap()
            .id()
    };
    let before = head();
    let out = flashtune(
        dir.path(),
        &[
            "step",
            "--fake-gpu",
            "--space",
            "variants/step-cheats.toml",
            "--proposer",
            "sh propose.sh",
            "--steps",
            "19",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(head(), before, "nothing was committed");
    assert!(
        std::fs::symlink_metadata(&forward).unwrap().is_file(),
        "the link was replaced by the file"
    );
    assert_eq!(std::fs::read_to_string(&forward).unwrap(), original);
    let oracle = std::fs::read_to_string(dir.path().join("kernels/oracle/oracle.cuh")).unwrap();
    assert!(
        !oracle.contains("ORACLE_SHORTCUT"),
        "the oracle edit was restored"
    );
    let runs: Vec<PathBuf> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("log.jsonl").is_file())
        .collect();
    let log = log_of(&runs[0]);
    let decided: Vec<(u32, bool, String)> = log
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::StepDecided {
                step,
                accepted,
                reason,
                ..
            } => Some((*step, *accepted, reason.clone())),
            _ => None,
        })
        .collect();
    // The memos are right on every launch; on inputs drawn anew they only pay for their fingerprint.
    let expected: Vec<&str> = CHEATS
        .iter()
        .map(|(_, why)| *why)
        .chain([
            "wrong on fresh inputs after timing",
            "slower beyond noise",
            "slower beyond noise",
            "the edit's figure is implausible",
        ])
        .chain(HARNESS_CHEATS.iter().map(|(_, why)| *why))
        .chain([
            "the proposer changed the oracle's sources (kernels/oracle/oracle.cuh), which no edit may touch",
        ])
        .chain(NEW_HARNESS_CHEATS.iter().map(|(_, why)| *why))
        .collect();
    // Step 18 is faster on ragged and slower on small in bursts that spread its own samples: the
    // noise it is judged by is HEAD's, so it is unstable there, or slower beyond noise. Step 19
    // replaces the kernel by a link to a file outside the project.
    assert_eq!(decided.len(), expected.len() + 2, "{decided:?}");
    for ((step, accepted, reason), why) in decided.iter().zip(&expected) {
        assert!(!accepted, "step {step} was accepted: {reason}");
        assert!(
            reason.contains(why),
            "step {step}: `{why}` not in: {reason}"
        );
    }
    let (step, accepted, reason) = &decided[expected.len()];
    assert!(
        !accepted && regression_on(reason, "small"),
        "step {step}: {reason}"
    );
    let (step, accepted, reason) = decided.last().unwrap();
    assert!(
        !accepted
            && reason.contains(
                "the proposer left paths that are not regular files \
                 (kernels/attention/forward.cu is a symbolic link)"
            ),
        "step {step}: {reason}"
    );
}

/// A device whose output comparison disagrees with the host's on crafted outputs is refused before
/// it gives any verdict: the run stops at the probe, says which figure disagreed, and times nothing.
#[test]
fn a_device_whose_output_comparison_miscounts_is_refused_before_any_verdict() {
    let dir = scratch_project();
    let out = std::process::Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["tune", "--fake-gpu"])
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .env("FLASHTUNE_FAKE_COMPARE", "miscount")
        .output()
        .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the device's output comparison disagrees with the host's")
            && said.contains("unwritten outputs: 1 on the device, 2 on the host"),
        "{said}"
    );
    let runs = dir.path().join("runs");
    for run in std::fs::read_dir(&runs).into_iter().flatten().flatten() {
        if run.path().join("log.jsonl").exists() {
            assert!(
                !records(&run.path())
                    .iter()
                    .any(|r| matches!(r, Record::Timed { .. })),
                "a refused device timed something"
            );
        }
    }
}

/// Architecture Invariant: the oracle's whole source closure is out of every edit's reach. The
/// reference includes only files of its own folder (no header the kernels share), and that folder
/// and every file of the closure are protected: `step`, `judge`, MCP and agent sessions refuse an
/// edit that touches one, by name (`step_rejects_every_cheat_by_name_and_restores_the_kernel`).
#[test]
fn the_oracle_reaches_only_its_own_folder() {
    let root = repo();
    let folder = root.join("kernels/oracle").canonicalize().unwrap();
    for space in std::fs::read_dir(root.join("variants")).unwrap() {
        let space = space.unwrap().path();
        let Ok(loaded) = flashtune::model::space::Space::load(&space) else {
            continue;
        };
        let reference = root.join(&loaded.family.reference);
        let closure = flashtune::gpu::build::include_closure(&reference).unwrap();
        assert!(closure.len() >= 2, "{}: {closure:?}", space.display());
        for file in closure {
            assert!(
                file.starts_with(&folder),
                "{}: the oracle includes {}, outside kernels/oracle/",
                space.display(),
                file.display()
            );
        }
    }
}

/// The cheat that writes to the report: a kernel whose build fails with markup in its `#error`
/// (bold, a table's bar, an <img> with a script) reaches report.md, the page and the terminal as
/// the words it wrote, never as markup the reader's viewer acts on.
#[test]
fn a_build_failure_holding_markup_reaches_the_report_as_words() {
    let dir = cheat_project("cheats.toml", r#"["small"]"#);
    let space = dir.path().join("variants/cheats.toml");
    let text_of = std::fs::read_to_string(&space).unwrap();
    let start = text_of
        .find("CHEAT = [")
        .expect("cheats.toml lists CHEAT values");
    let end = start + text_of[start..].find('\n').unwrap();
    std::fs::write(
        &space,
        format!(
            "{}CHEAT = [\"none\", \"report_markup\"]{}",
            &text_of[..start],
            &text_of[end..]
        ),
    )
    .unwrap();
    let out = flashtune(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/cheats.toml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    let log = log_of(&run);
    let words = "**no failure here: trusted** <img src=x onerror=alert(1)>";
    let failed = log.entries.iter().any(|(_, e)| {
        matches!(&e.record, Record::BuildFailed { variant, log_tail: build_log, .. }
            if variant.starts_with("report_markup") && build_log.contains(words))
    });
    assert!(
        failed,
        "the build's failure does not hold the kernel's words"
    );
    let page = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(
        page.contains("**no failure here: trusted** &lt;img src=x onerror=alert(1)&gt;"),
        "the page does not show the words as words"
    );
    assert!(!page.contains("<img src=x") && !page.contains("<strong>no failure here"));
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    for line in md.lines().filter(|l| l.contains("no failure here")) {
        // In a table row the kernel's bars must not open cells of their own.
        if line.starts_with('|') {
            assert!(
                line.contains("\\| `ok` \\|"),
                "a table row split by the kernel's bars: {line}"
            );
        }
    }
    assert!(
        md.contains("no failure here"),
        "report.md does not say why it failed"
    );
}
