//! The hostile night, on the fake GPU: signals (SIGTERM, SIGHUP, a second signal), a full disk, the
//! free-space floor, a throttled or shared GPU, a GPU that drifts, and no child process left behind.
use crate::common;

use common::*;
use flashtune::log::runindex::RunIndex;
use flashtune::log::runlog::{self, Record};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The scratch project with the smoke space cut to `shapes` and these policy edits (`from`, `to`).
fn project(shapes: &str, policy_edits: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = scratch_project();
    let space = dir.path().join("variants/smoke.toml");
    let text = std::fs::read_to_string(&space).unwrap();
    let start = text.find("\nshapes = [").unwrap() + 1;
    let end = start + text[start..].find('\n').unwrap();
    let text = format!("{}shapes = {shapes}{}", &text[..start], &text[end..]);
    std::fs::write(&space, text).unwrap();
    edit(&dir.path().join("policies.toml"), policy_edits);
    dir
}

fn edit(path: &Path, edits: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(path).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{} has no `{from}`", path.display());
        text = text.replacen(from, to, 1);
    }
    std::fs::write(path, text).unwrap();
}

/// A space of listed points on the `small` shape: `points` are TOML inline tables.
fn points_space(root: &Path, name: &str, baseline: &str, points: &[&str]) {
    let smoke = std::fs::read_to_string(root.join("variants/smoke.toml")).unwrap();
    let family = &smoke[smoke.find("[symbols]").unwrap()..smoke.find("[params]").unwrap()];
    let text = format!(
        "name = \"{name}\"\ndescription = \"night test\"\nshapes = [\"small\"]\nbaseline = {baseline}\npoints = [\n{}\n]\n\n{family}",
        points
            .iter()
            .map(|p| format!("  {p},"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    std::fs::write(root.join(format!("variants/{name}.toml")), text).unwrap();
}

/// (shape, dtype) → champion variant, as the champion table would name them.
fn champions(run: &Path) -> Vec<(String, String, String)> {
    let log = runlog::read(&run.join("log.jsonl")).unwrap();
    flashtune::report::champions::from_log(&log)
        .into_iter()
        .map(|c| (c.shape, c.dtype.to_string(), c.variant))
        .collect()
}

fn spawn(root: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    flashtune_child(root, args, env)
}

/// The run folder whose log holds `needle`, if one does yet.
fn find_log(root: &Path, needle: &str) -> Option<PathBuf> {
    std::fs::read_dir(root.join("runs"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|run| {
            std::fs::read_to_string(run.join("log.jsonl"))
                .unwrap_or_default()
                .contains(needle)
        })
}

/// Wait until the run's log holds `needle`, then return the run folder.
fn wait_for_log(root: &Path, needle: &str, limit: Duration) -> PathBuf {
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < limit, "the log never showed {needle}");
        if let Some(run) = find_log(root, needle) {
            return run;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process as /proc shows it: (pid, start time in ticks, command line).
type Proc = (u32, u64, String);

fn stat_of(pid: u32) -> Option<(u32, char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // state, ppid, ..., starttime is field 22 of the whole line: index 19 after the name.
    Some((
        f.get(1)?.parse().ok()?,
        f.first()?.chars().next()?,
        f.get(19)?.parse().ok()?,
    ))
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Every process descended from `root` now.
fn descendants(root: u32) -> Vec<Proc> {
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| stat_of(pid).map(|(ppid, _, start)| (pid, ppid, start)))
        .collect();
    let mut found: Vec<Proc> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, start) in &all {
            if ppid == parent && !found.iter().any(|f| f.0 == pid) {
                found.push((pid, start, cmdline(pid)));
                frontier.push(pid);
            }
        }
    }
    found
}

/// The same process (same pid, same start time) still running, not a zombie.
fn alive(p: &Proc) -> bool {
    stat_of(p.0).is_some_and(|(_, state, start)| start == p.1 && state != 'Z')
}

/// Nothing seen under the run is alive, and nothing alive names its project folder.
fn assert_nothing_left(seen: &BTreeSet<Proc>, root: &Path) {
    std::thread::sleep(Duration::from_millis(300));
    let left: Vec<&Proc> = seen.iter().filter(|p| alive(p)).collect();
    assert!(left.is_empty(), "outlived the run: {left:?}");
    let root = root.to_string_lossy().into_owned();
    let me = std::process::id();
    let naming: Vec<(u32, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .map(|pid| (pid, cmdline(pid)))
        .filter(|(_, c)| c.contains(&root))
        .collect();
    assert!(naming.is_empty(), "still running in {root}: {naming:?}");
}

#[test]
fn sigterm_mid_run_logs_interrupted_exits_143_and_resume_finishes_with_the_same_champions() {
    let shapes = r#"["small", "ragged"]"#;
    let clean = project(shapes, &[]);
    let out = flashtune(clean.path(), &["tune", "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let expected = champions(&only_run(clean.path()));
    assert_eq!(expected.len(), 4, "{expected:?}");

    let dir = project(shapes, &[]);
    let child = spawn(dir.path(), &["tune", "--fake-gpu"], &[]);
    let pid = child.id();
    let mut seen: BTreeSet<Proc> = BTreeSet::new();
    let started = Instant::now();
    let run = loop {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "no variant finished"
        );
        seen.extend(descendants(pid));
        std::thread::sleep(Duration::from_millis(50));
        if let Some(run) = find_log(dir.path(), "\"event\":\"variant_done\"") {
            break run;
        }
    };
    seen.extend(descendants(pid));
    assert!(
        seen.iter().any(|p| p.2.contains(" worker ")),
        "no worker seen: {seen:?}"
    );
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(143), "{t}");
    assert!(t.contains("SIGTERM"), "{t}");
    assert!(t.contains("Full report:"), "the summary is printed: {t}");
    let id = run.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        t.contains(&format!("Resume it with: flashtune resume {id}")),
        "an interrupted run says how to go on (issue 52, item 7): {t}"
    );
    let recs = records(&run);
    match recs.last() {
        Some(Record::Interrupted { reason }) => assert!(reason.contains("SIGTERM"), "{reason}"),
        other => panic!("last record {other:?}"),
    }
    assert!(!recs.iter().any(|r| matches!(r, Record::Finished { .. })));
    assert!(run.join("report.md").is_file());
    assert_nothing_left(&seen, dir.path());

    // Without --fake-gpu: a run the double timed goes on there, and says so (issue 52, item 7).
    let out = flashtune(dir.path(), &["resume", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("timed on the fake GPU"),
        "{}",
        text(&out)
    );
    assert!(matches!(
        records(&run).last(),
        Some(Record::Finished { .. })
    ));
    assert_eq!(champions(&run), expected);
}

#[test]
fn sighup_is_a_stop_request_too() {
    let dir = project(r#"["small"]"#, &[]);
    let child = spawn(dir.path(), &["tune", "--fake-gpu"], &[]);
    let run = wait_for_log(dir.path(), "\"event\":\"timed\"", Duration::from_secs(180));
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(129), "{}", text(&out));
    match records(&run).last() {
        Some(Record::Interrupted { reason }) => assert!(reason.contains("SIGHUP"), "{reason}"),
        other => panic!("last record {other:?}"),
    }
}

#[test]
fn a_second_signal_stops_at_once_and_no_worker_nvcc_or_ptxas_outlives_the_run() {
    // Fresh sources and an empty cache of its own: nvcc (and its cicc and ptxas) are running when
    // the signals land.
    let dir = project(r#"["small", "ragged"]"#, &[]);
    let source = dir.path().join("kernels/attention/forward.cu");
    let mut text_cu = std::fs::read_to_string(&source).unwrap();
    text_cu.push_str(&format!("\n// night test {}\n", std::process::id()));
    std::fs::write(&source, text_cu).unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.to_string_lossy().into_owned();
    let child = spawn(
        dir.path(),
        &["tune", "--fake-gpu"],
        &[("FLASHTUNE_CACHE_DIR", cache_s.as_str())],
    );
    let pid = child.id();
    let mut seen: BTreeSet<Proc> = BTreeSet::new();
    let started = Instant::now();
    while !seen.iter().any(|p| p.2.contains("nvcc")) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "nvcc never ran"
        );
        seen.extend(descendants(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    seen.extend(descendants(pid));
    // Back to back, and two different signals: the first alone aborts the builds and ends this run
    // within milliseconds, so a second sent later may find it gone; and two SIGTERMs sent at once
    // are one signal to the kernel (standard signals do not queue).
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    let out = child.wait_with_output().unwrap();
    let recs = records(&only_run(dir.path()));
    let reason = match recs.last() {
        Some(Record::Interrupted { reason }) => reason.clone(),
        other => panic!("last record {other:?}"),
    };
    // The second may be handled after the run has already written its record (the first alone
    // ends a run with nothing in flight within milliseconds): then the reason names one signal.
    // Either way the exit code is the first's and nothing is left running; either may be first.
    let first = if reason.starts_with("SIGTERM") {
        143
    } else {
        129
    };
    assert!(
        reason.starts_with("SIGTERM") || reason.starts_with("SIGHUP"),
        "{reason}"
    );
    assert_eq!(out.status.code(), Some(first), "{reason}\n{}", text(&out));
    assert_nothing_left(&seen, dir.path());
}

#[test]
fn a_full_disk_names_the_os_cause_exits_74_and_resume_loses_nothing() {
    let dir = project(r#"["small", "ragged"]"#, &[]);
    let child = spawn(
        dir.path(),
        &["tune", "--fake-gpu"],
        &[("FLASHTUNE_TEST_FAIL_APPEND", "timed:5")],
    );
    let out = child.wait_with_output().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(74), "{t}");
    assert!(
        t.contains("No space left on device (os error 28)") && t.contains("log.jsonl"),
        "{t}"
    );
    let run = only_run(dir.path());
    // The half-written line was taken back: every line whole, nothing torn.
    let before = runlog::read(&run.join("log.jsonl")).unwrap();
    assert!(!before.torn_tail);
    let timed_before: Vec<(usize, String)> = before
        .entries
        .iter()
        .filter(|(_, e)| matches!(e.record, Record::Timed { .. }))
        .map(|(l, e)| (*l, serde_json::to_string(&e.record).unwrap()))
        .collect();
    assert_eq!(timed_before.len(), 4);

    let out = flashtune(dir.path(), &["resume", run.to_str().unwrap(), "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let after = runlog::read(&run.join("log.jsonl")).unwrap();
    for (line, record) in &timed_before {
        let kept = after.entries.iter().find(|(l, _)| l == line).unwrap();
        assert_eq!(&serde_json::to_string(&kept.1.record).unwrap(), record);
    }
    let ix = RunIndex::new(&after);
    assert!(ix.accounting.holds(), "{:?}", ix.accounting);
    assert_eq!(ix.accounting.measured, ix.accounting.planned);
    assert!(ix.finished.is_some());
}

#[test]
fn the_free_space_floor_refuses_to_start_and_doctor_reports_it() {
    let dir = project(
        r#"["small"]"#,
        &[("min_free_gib = 2.0", "min_free_gib = 1000000000.0")],
    );
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(74), "{t}");
    assert!(
        t.contains("GiB free under") && t.contains("min_free_gib"),
        "{t}"
    );
    assert!(
        !dir.path().join("runs").exists()
            || std::fs::read_dir(dir.path().join("runs"))
                .unwrap()
                .flatten()
                .all(|e| !e.path().join("log.jsonl").exists()),
        "a run was started"
    );
    let out = flashtune(dir.path(), &["doctor"]);
    let t = text(&out);
    let disk = t.lines().find(|l| l.contains("] disk")).unwrap_or("");
    assert!(
        disk.contains("FAIL") && disk.contains("min_free_gib") && disk.contains("GiB free"),
        "{t}"
    );
}

#[test]
fn a_throttled_case_is_retimed_and_flagged_and_never_decides_a_champion_alone() {
    let dir = project(r#"["small"]"#, &[]);
    let point = |mma: &str, split: u32, state: &str| {
        format!("{{ MMA = \"{mma}\", BLOCK_M = 64, BLOCK_N = 64, WARPS = 4, KV_SPLIT = {split}, STAGES = 1, FAKE_STATE = \"{state}\" }}")
    };
    let baseline = point("scalar", 1, "clean");
    // The fastest kernel stays throttled; the runner-up is throttled on its first timing only.
    points_space(
        dir.path(),
        "throttle",
        &baseline,
        &[
            &baseline,
            &point("wmma", 1, "thermal"),
            &point("wmma", 4, "thermal_once"),
            &point("scalar", 4, "neighbour_once"),
        ],
    );
    let out = flashtune(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/throttle.toml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    let recs = records(&run);
    let hot = "wmma-bm64-bn64-w4-ks1-s1-thermal";
    let once = "wmma-bm64-bn64-w4-ks4-s1-thermal_once";
    let shared = "scalar-bm64-bn64-w4-ks4-s1-neighbour_once";
    for variant in [hot, once, shared] {
        let disturbed = recs
            .iter()
            .filter(|r| matches!(r, Record::Disturbed { variant: v, .. } if v == variant))
            .count();
        assert_eq!(disturbed, 2, "{variant}: one re-timing per dtype");
    }
    assert!(!recs.iter().any(
        |r| matches!(r, Record::Disturbed { variant, .. } if variant.starts_with("scalar-bm64-bn64-w4-ks1"))
    ));
    for r in &recs {
        if let Record::Timed {
            variant,
            conditions,
            gpu,
            ..
        } = r
        {
            assert!(gpu.is_some(), "{variant}: no GPU state");
            let expect: &[flashtune::model::protocol::Condition] = if variant == hot {
                &[flashtune::model::protocol::Condition::Thermal]
            } else {
                &[]
            };
            assert_eq!(conditions, expect, "{variant}");
        }
    }
    // The fastest figure was measured hot: the clean runner-up holds the case, and the report says why.
    for (_, _, variant) in champions(&run) {
        assert_eq!(variant, once);
    }
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("thermal throttling") && report.contains(hot),
        "{report}"
    );
}

#[test]
fn drift_mid_run_triggers_a_reduel_before_the_champions_are_decided() {
    let dir = project(
        r#"["small"]"#,
        &[
            ("every_s = 300", "every_s = 0"),
            ("max_drift = 0.03", "max_drift = 0.05"),
        ],
    );
    let point = |mma: &str| {
        format!("{{ MMA = \"{mma}\", BLOCK_M = 64, BLOCK_N = 64, WARPS = 4, KV_SPLIT = 1, STAGES = 1 }}")
    };
    let (scalar, wmma) = (point("scalar"), point("wmma"));
    points_space(dir.path(), "drift", &scalar, &[&scalar, &wmma]);
    // After the first variant's two cases, everything this worker times is 14% slower: the wmma
    // kernel (4.07 µs) then reads 4.64 µs, beyond the scalar one (4.52 µs) timed before the drift.
    let child = spawn(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/drift.toml"],
        &[("FLASHTUNE_FAKE_DRIFT", "after_cases=2,factor=1.14")],
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    let recs = records(&run);
    let sentinels = recs
        .iter()
        .filter(|r| matches!(r, Record::Sentinel { .. }))
        .count();
    assert!(
        sentinels >= 3,
        "start, between the variants, end: {sentinels}"
    );
    let duels: Vec<&Record> = recs
        .iter()
        .filter(|r| matches!(r, Record::DriftDuel { .. }))
        .collect();
    assert_eq!(duels.len(), 2, "one per dtype: {duels:?}");
    for d in &duels {
        let Record::DriftDuel { drift, verdict, .. } = d else {
            unreachable!()
        };
        assert!(*drift > 0.05, "{drift}");
        assert!(verdict.is_some(), "{d:?}");
    }
    // The duel, not the drift, decides: the wmma kernel is the faster one.
    for (_, _, variant) in champions(&run) {
        assert_eq!(variant, "wmma-bm64-bn64-w4-ks1-s1");
    }
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("## Drift sentinel"), "{report}");
    assert!(report.contains("beyond the limit"), "{report}");
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(
        html.contains("Drift sentinel over the run"),
        "no sentinel plot"
    );
    assert!(html.contains("SM clock and temperature"), "no state plot");
}

#[test]
fn without_nvml_the_run_says_so_once_and_goes_on() {
    let dir = project(r#"["small"]"#, &[]);
    let child = spawn(
        dir.path(),
        &["tune", "--fake-gpu", "--max-variants", "2"],
        &[("FLASHTUNE_FAKE_NVML", "absent")],
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let recs = records(&only_run(dir.path()));
    let unavailable = recs
        .iter()
        .filter(|r| matches!(r, Record::GpuStateUnavailable { .. }))
        .count();
    assert_eq!(unavailable, 1);
    assert!(recs
        .iter()
        .all(|r| !matches!(r, Record::Timed { gpu: Some(_), .. })));
    assert!(recs.iter().any(|r| matches!(r, Record::Timed { .. })));
}

/// Issue 43, item 3: a full disk during `judge` (writing HEAD's kernels out) and during `step`
/// (keeping the attempt's patch) exits 74 with the operating system's own words, as `tune` does.
#[test]
fn a_full_disk_in_judge_and_step_names_the_os_cause_and_exits_74() {
    for (site, args, says) in [
        (
            "head-tree",
            vec!["judge", "--fake-gpu", "--space", "variants/step-ci.toml"],
            "write HEAD's kernel source",
        ),
        (
            "attempt-patch",
            vec!["step", "--fake-gpu", "--space", "variants/step-ci.toml"],
            "write the attempt's patch",
        ),
    ] {
        let dir = repo_project();
        mark_forward(dir.path(), "time x0.80");
        let out = spawn(dir.path(), &args, &[("FLASHTUNE_TEST_FAIL_WRITE", site)])
            .wait_with_output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(74), "{site}: {t}");
        assert!(t.contains(says), "{site}: {t}");
        // Once: the write error's own words end with it (issue 52, item 5, said it twice).
        assert_eq!(
            times(&t, "No space left on device (os error 28)"),
            1,
            "{site}: {t}"
        );
    }
}

/// `tune --fake-gpu` with its build cache in `cache`.
fn fake_tune_with_cache(root: &Path, cache: &Path) -> std::process::Output {
    let cache = cache.to_string_lossy();
    spawn(
        root,
        &["tune", "--fake-gpu"],
        &[("FLASHTUNE_CACHE_DIR", &cache)],
    )
    .wait_with_output()
    .unwrap()
}

/// A tmpfs of `bytes` mounted over `dir` for as long as it lives (root only).
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, bytes: usize) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("tmpfs")
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Issue 43, item 8: on a nearly full disk the run log gets its header before the results store
/// (a cache of the logs whose write-ahead log grows) takes any byte: whatever the size, a log that
/// exists starts with its header, and the run ends with the OS cause. A tmpfs of a few sizes stands
/// for the disk (root only; skipped, said so, elsewhere).
#[test]
fn a_nearly_full_disk_leaves_a_log_with_its_header_never_an_empty_one() {
    for kib in [8usize, 16, 32, 64] {
        let dir = project(
            r#"["small"]"#,
            &[("min_free_gib = 2.0", "min_free_gib = 0.0")],
        );
        let runs = dir.path().join("runs");
        let Some(_disk) = SmallDisk::mount(&runs, kib * 1024) else {
            eprintln!("SKIPPED: cannot mount a tmpfs here (not root?)");
            return;
        };
        let cache = tempfile::tempdir().unwrap();
        let out = fake_tune_with_cache(dir.path(), cache.path());
        let t = text(&out);
        for run in std::fs::read_dir(&runs).unwrap().flatten() {
            let log = run.path().join("log.jsonl");
            if !log.exists() {
                continue;
            }
            let first = std::fs::read_to_string(&log)
                .unwrap()
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            assert!(
                first.contains("\"event\":\"header\""),
                "{kib} KiB: the log does not start with its header ({first:?}):\n{t}"
            );
        }
        if !out.status.success() {
            assert!(
                t.contains("No space left on device") || t.contains("os error 28"),
                "{kib} KiB: failed without the OS cause:\n{t}"
            );
        }
    }
}

/// Bytes `dir`'s files take on a tmpfs, which gives each file whole pages.
fn tmpfs_bytes(dir: &Path) -> usize {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        total += if path.is_dir() {
            tmpfs_bytes(&path)
        } else {
            (path.metadata().unwrap().len() as usize).div_ceil(4096) * 4096
        };
    }
    total
}

/// How often `needle` appears in `haystack`.
fn times(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// Issue 52, item 5: a disk that fills up during the edit's build is the disk's failure, never the
/// edit's. runs/ is a tmpfs with room for the run's log and the two trees a step writes out (HEAD's
/// and the edit's) but not for the edit's cubin: `judge` and `step` exit 74 with the OS cause said
/// once, the edit stays in the working tree to be judged once there is room, and no `build_failed`
/// record blames it. They exited 1 ("cannot restore … failed to write out file", although it was
/// restored), logged `build_failed` and restored the edit. Root only; skipped, said so, elsewhere.
#[test]
fn a_disk_that_fills_during_the_edits_build_exits_74_and_the_edit_stays() {
    for (command, room_kib) in [("judge", 32), ("step", 96), ("judge", 96), ("step", 32)] {
        let dir = repo_project();
        mark_forward(dir.path(), "time x0.80");
        let edited = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
        // HEAD's tree and the edit's, then room for the log and a little more: the edit's cubin
        // (140 KiB) does not fit.
        let size = 2 * tmpfs_bytes(&dir.path().join("kernels")) + room_kib * 1024;
        let Some(_disk) = SmallDisk::mount(&dir.path().join("runs"), size) else {
            eprintln!("SKIPPED: cannot mount a tmpfs here (not root?): a full disk is not tried");
            return;
        };
        let args = [command, "--fake-gpu", "--space", "variants/step-ci.toml"];
        let out = spawn(dir.path(), &args, &[]).wait_with_output().unwrap();
        let t = text(&out);
        let case = format!("{command} with {room_kib} KiB to spare");
        assert_eq!(out.status.code(), Some(74), "{case}: {t}");
        assert_eq!(times(&t, "No space left on device"), 1, "{case}: {t}");
        assert!(
            t.contains("the build of scalar-bm64-bn64-w4-ks1-s1@edit")
                && t.contains("left in the working tree"),
            "{case}: the edit's build found no room, and the error says so: {t}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
            edited,
            "{case}: the edit stays in the working tree"
        );
        let recs = records(&only_run(dir.path()));
        assert!(
            recs.iter().any(|r| matches!(r, Record::StepStarted { .. })),
            "{case}: {recs:?}"
        );
        assert!(
            !recs
                .iter()
                .any(|r| matches!(r, Record::BuildFailed { .. } | Record::StepDecided { .. })),
            "{case}: nothing is recorded against the edit: {recs:?}"
        );
    }
}

/// Issue 52, item 5, in `tune`: a build cache with no room stops the run as a write error (exit 74,
/// the OS cause once) before any variant is marked `build_failed`, and `resume`, with room, finishes
/// it. Root only; skipped, said so, elsewhere.
#[test]
fn a_full_build_cache_stops_tune_blaming_no_variant_and_resume_finishes() {
    let dir = project(
        r#"["small"]"#,
        &[("min_free_gib = 2.0", "min_free_gib = 0.0")],
    );
    let cache = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(cache.path(), 64 * 1024) else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (not root?): a full disk is not tried");
        return;
    };
    let out = fake_tune_with_cache(dir.path(), cache.path());
    drop(disk);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(74), "{t}");
    assert_eq!(times(&t, "No space left on device"), 1, "{t}");
    assert!(t.contains("flashtune resume"), "{t}");
    let run = only_run(dir.path());
    assert!(
        !records(&run)
            .iter()
            .any(|r| matches!(r, Record::BuildFailed { .. })),
        "no variant is blamed for the disk"
    );
    let out = flashtune(dir.path(), &["resume", run.to_str().unwrap(), "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let log = runlog::read(&run.join("log.jsonl")).unwrap();
    let ix = RunIndex::new(&log);
    assert!(ix.finished.is_some());
    assert_eq!(ix.accounting.measured, ix.accounting.planned);
}

/// Issue 52, item 3: a closed stdout and stderr (`tune 2>&1 | head -2`, a pager quit early) end what is printed,
/// never the run: the log ends in `finished`, the reports are written, and the exit is 0 (it was a
/// panic on the broken pipe, exit 101).
#[test]
fn a_closed_stdout_loses_nothing_of_the_run() {
    let dir = scratch_project();
    let mut child = flashtune_child(
        dir.path(),
        &["tune", "--fake-gpu", "--max-variants", "1"],
        &[],
    );
    // The reader goes away before the run prints anything (`tune 2>&1 | head -2`).
    drop(child.stdout.take());
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let run = only_run(dir.path());
    let recs = records(&run);
    assert!(
        matches!(
            recs.last(),
            Some(flashtune::log::runlog::Record::Finished { .. })
        ),
        "{:?}",
        recs.last()
    );
    assert!(run.join("report.md").is_file());
}
