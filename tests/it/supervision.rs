//! Supervision on the fake GPU: the real worker protocol and process handling, with faults injected.
use crate::common;
use common::*;
use flashtune::log::runlog::{self, Record};
use std::process::Command;
use std::time::{Duration, Instant};

use common::numbered_records as records;

/// The fault space with short limits, so each fault costs seconds.
fn fault_project(build_s: u64, worker_s: u64) -> tempfile::TempDir {
    let dir = scratch_project();
    std::fs::create_dir_all(dir.path().join("kernels/attention/faults")).unwrap();
    std::fs::copy(
        repo().join("kernels/attention/faults/faults.cu"),
        dir.path().join("kernels/attention/faults/faults.cu"),
    )
    .unwrap();
    let space = dir.path().join("variants/faults.toml");
    let s = std::fs::read_to_string(&space)
        .unwrap()
        .replace("build_s = 20", &format!("build_s = {build_s}"))
        .replace("worker_s = 20", &format!("worker_s = {worker_s}"));
    std::fs::write(&space, s).unwrap();
    // The compile that never ends waits on a pipe instead of burning a core (faults.cu), and one
    // dtype halves the builds: the faults do not depend on it.
    let fifo = std::ffi::CString::new(
        dir.path()
            .join("kernels/attention/faults/slow-compile.fifo")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    let policies = dir.path().join("policies.toml");
    let text = std::fs::read_to_string(&policies).unwrap();
    let one_dtype = text.replacen(r#"dtypes = ["f16", "bf16"]"#, r#"dtypes = ["f16"]"#, 1);
    assert_ne!(text, one_dtype, "policies.toml's dtypes moved");
    std::fs::write(&policies, one_dtype).unwrap();
    dir
}

fn count(recs: &[(usize, Record)], pred: impl Fn(&Record) -> bool) -> usize {
    recs.iter().filter(|(_, r)| pred(r)).count()
}

#[test]
fn every_fault_is_logged_under_its_own_kind_and_the_good_variants_are_measured() {
    let dir = fault_project(30, 4);
    let out = flashtune(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/faults.toml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let recs = records(&only_run(dir.path()));
    let is = |v: &str, prefix: &str| v.starts_with(prefix);
    // Builds that cannot work: too much shared memory, a syntax error, and a compile that never ends.
    for fault in ["smem-", "compile_error-"] {
        assert_eq!(
            count(
                &recs,
                |r| matches!(r, Record::BuildFailed { variant, reason, .. } if is(variant, fault) && reason.contains("nvcc failed"))
            ),
            2,
            "{fault}"
        );
    }
    assert_eq!(
        count(
            &recs,
            |r| matches!(r, Record::BuildFailed { variant, reason, .. } if is(variant, "slow_compile-") && reason.contains("timed out"))
        ),
        2
    );
    // A hang and a crash are each tried twice, then quarantined.
    assert_eq!(
        count(
            &recs,
            |r| matches!(r, Record::TimedOut { variant, .. } if is(variant, "hang-"))
        ),
        2
    );
    assert_eq!(
        count(
            &recs,
            |r| matches!(r, Record::WorkerCrashed { variant, .. } if is(variant, "illegal_address-"))
        ),
        2
    );
    assert_eq!(count(&recs, |r| matches!(r, Record::Quarantined { .. })), 2);
    // Wrong answers are final: one record per case, never retried.
    for fault in ["nan-", "wrong-"] {
        assert_eq!(
            count(
                &recs,
                |r| matches!(r, Record::CheckFailed { variant, .. } if is(variant, fault))
            ),
            2,
            "{fault}"
        );
    }
    assert!(recs
        .iter()
        .any(|(_, r)| matches!(r, Record::CheckFailed { reason, .. } if reason.contains("NaN"))));
    // The good variants: 2 variants x 2 shapes x 1 dtype, all measured.
    assert_eq!(
        count(
            &recs,
            |r| matches!(r, Record::Timed { variant, .. } if is(variant, "none-"))
        ),
        4
    );
    assert_eq!(count(&recs, |r| matches!(r, Record::Timed { .. })), 4);
    assert!(matches!(recs.last(), Some((_, Record::Finished { .. }))));
    assert_eq!(count(&recs, |r| matches!(r, Record::VariantDone { .. })), 9);
}

#[test]
fn resume_after_sigkill_redoes_at_most_the_variant_in_flight() {
    let dir = fault_project(30, 3);
    let mut child = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["tune", "--fake-gpu", "--space", "variants/faults.toml"])
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it the hard way once at least one variant is finished and before the run ends.
    let started = Instant::now();
    let run = loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no variant finished"
        );
        std::thread::sleep(Duration::from_millis(100));
        let Ok(entries) = std::fs::read_dir(dir.path().join("runs")) else {
            continue;
        };
        let Some(run) = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.join("log.jsonl").is_file())
        else {
            continue;
        };
        // Sealed, not merely written: a kill between a record and its seal leaves the record
        // unsealed, and resume rightly does it again.
        if sealed_done(&run.join("log.jsonl")).is_some_and(|done| !done.is_empty()) {
            break run;
        }
    };
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    // A crash mid-write leaves a torn line; resume must cut it, not choke on it.
    let log = run.join("log.jsonl");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(b"{\"t\":9.0,\"event\":\"timed\",\"vari");
    std::fs::write(&log, bytes).unwrap();
    let before = records(&run);
    assert!(
        !before
            .iter()
            .any(|(_, r)| matches!(r, Record::Finished { .. })),
        "the kill came too late to test anything"
    );
    // What resume may skip is what the sealed log holds finished; the writer may have appended
    // one more variant_done whose seal the kill cut off.
    let done_before = sealed_done(&log).expect("the log's seals hold");
    assert!(!done_before.is_empty());

    let out = flashtune(dir.path(), &["resume", run.to_str().unwrap(), "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    // Issue 43, item 8: resume says it dropped the torn line.
    assert!(
        text(&out).contains("was cut short") && text(&out).contains("dropped"),
        "{}",
        text(&out)
    );
    let loaded = runlog::read(&log).unwrap();
    assert!(!loaded.torn_tail);
    let after: Vec<(usize, Record)> = loaded
        .entries
        .into_iter()
        .map(|(l, e)| (l, e.record))
        .collect();
    let resumed_at = after
        .iter()
        .position(|(_, r)| matches!(r, Record::Resumed { .. }))
        .expect("a resumed record");
    let Record::Resumed {
        finished_variants,
        overridden,
        ..
    } = &after[resumed_at].1
    else {
        unreachable!()
    };
    assert_eq!(
        (*finished_variants, overridden.len()),
        (done_before.len(), 0)
    );
    // Nothing finished before the kill is planned, built or measured again.
    for (_, r) in &after[resumed_at..] {
        let v = match r {
            Record::Planned { variant, .. }
            | Record::Built { variant, .. }
            | Record::Timed { variant, .. }
            | Record::CheckFailed { variant, .. } => variant,
            _ => continue,
        };
        assert!(
            !done_before.contains(v),
            "{v} was finished before the kill but ran again"
        );
    }
    // And the run as a whole is complete: every variant is done, the good ones measured once each case.
    assert_eq!(
        count(&after, |r| matches!(r, Record::VariantDone { .. })),
        9
    );
    assert!(matches!(after.last(), Some((_, Record::Finished { .. }))));
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains("| `none-scalar-bm64-bn64-w4-ks4-s1` |"),
        "{report}"
    );
}

/// The variants a log's sealed records hold finished; `None` while its seals are mid-write.
fn sealed_done(log: &std::path::Path) -> Option<Vec<String>> {
    let sealed = runlog::read_sealed(log).ok()?;
    Some(
        sealed
            .entries
            .iter()
            .filter_map(|(_, e)| match &e.record {
                Record::VariantDone { variant, .. } => Some(variant.clone()),
                _ => None,
            })
            .collect(),
    )
}

#[test]
fn resume_refuses_a_changed_setup_unless_forced() {
    let dir = scratch_project();
    let out = flashtune(dir.path(), &["tune", "--fake-gpu", "--max-variants", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    let recs = records(&run);
    assert!(recs
        .iter()
        .any(|(_, r)| matches!(r, Record::BudgetReached { .. })));
    assert_eq!(count(&recs, |r| matches!(r, Record::VariantDone { .. })), 1);

    replace_in(
        &dir.path().join("policies.toml"),
        "samples = 30",
        "samples = 31",
    );
    assert_resume_refused(dir.path(), &run, "policies.toml");

    let out = flashtune(
        dir.path(),
        &["resume", run.to_str().unwrap(), "--fake-gpu", "--force"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let recs = records(&run);
    assert!(recs.iter().any(|(_, r)| matches!(r, Record::Resumed { overridden, .. } if overridden.iter().any(|o| o.starts_with("policies.toml")))));
    assert_eq!(count(&recs, |r| matches!(r, Record::VariantDone { .. })), 4);
}

#[test]
fn first_ctrl_c_finishes_the_measurement_in_flight_and_exits_130() {
    let dir = fault_project(30, 3);
    let child = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args([
            "tune",
            "--fake-gpu",
            "--space",
            "variants/faults.toml",
            "--json",
        ])
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no build finished"
        );
        std::thread::sleep(Duration::from_millis(100));
        let Ok(entries) = std::fs::read_dir(dir.path().join("runs")) else {
            continue;
        };
        if entries.filter_map(|e| e.ok()).any(|e| {
            std::fs::read_to_string(e.path().join("log.jsonl"))
                .unwrap_or_default()
                .contains("\"event\":\"built\"")
        }) {
            break;
        }
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let recs = records(&only_run(dir.path()));
    assert!(
        matches!(recs.last(), Some((_, Record::Interrupted { .. }))),
        "{:?}",
        recs.last()
    );
    // --json streamed the same records that are in the log.
    let streamed = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(streamed, recs.len());
}

/// Issue 43, item 1: `kill -9` of a `step` leaves none of its proposer's processes behind, not even
/// one it started in the background: the proposer runs under `flashtune guard`, which gets a
/// death signal when its parent dies and kills the proposer's whole process group.
#[test]
fn kill_9_of_step_leaves_no_proposer_process_3_s_later() {
    let dir = repo_project();
    // In the edit scope: the proposer's sandbox lets it write nowhere else in the project.
    let pid_file = dir.path().join("kernels/proposer.pid");
    let proposer = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
    let mut child = flashtune_child(
        dir.path(),
        &[
            "step",
            "--fake-gpu",
            "--space",
            "variants/step-ci.toml",
            "--proposer",
            &proposer,
            "--steps",
            "1",
        ],
        &[],
    );
    let started = std::time::Instant::now();
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "the proposer never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let alive = |pid: i32| {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
    };
    assert!(alive(pid), "the proposer's sleep runs");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let survived = alive(pid);
    if survived {
        // SAFETY: a plain kill of a pid this test started; leave nothing behind whatever happens.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        !survived,
        "the proposer's sleep (pid {pid}) outlived a SIGKILLed step"
    );
}

/// Issue 49, item 2: each case is logged and shown the moment its worker answers it. On the paced
/// double (each case 250 ms), the console says the first variant's cases one by one while its worker
/// is still running; `kill -9` then, and `resume` measures only the cases that variant had not
/// answered: each case of the run is answered once.
#[test]
fn a_kill_in_the_middle_of_a_variant_keeps_the_cases_it_answered() {
    use std::io::BufRead;
    let dir = scratch_project();
    let mut child = flashtune_child(
        dir.path(),
        &["tune", "--fake-gpu"],
        &[("FLASHTUNE_FAKE_PACE_MS", "250")],
    );
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut per_case_lines = 0;
    let mut lines = stderr.lines();
    let run = loop {
        let line = lines
            .next()
            .expect("the run ended before it timed three cases")
            .unwrap();
        if !line.starts_with("fastest so far") {
            continue;
        }
        per_case_lines += 1;
        if per_case_lines < 3 {
            continue;
        }
        // Three cases said on the console: the log holds them, and the worker is still on them.
        let run = only_run(dir.path());
        let recs = records(&run);
        let timed = count(&recs, |r| matches!(r, Record::Timed { .. }));
        let worker_ended = count(&recs, |r| {
            matches!(r, Record::WorkerRan { .. } | Record::VariantDone { .. })
        });
        assert!(timed >= 3, "{timed} timed records for three cases shown");
        assert_eq!(
            worker_ended, 0,
            "the cases were shown only once their worker ended"
        );
        break run;
    };
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    // The sealed records, as resume reads them: a record the kill cut off from its seal is not kept.
    let before: Vec<(usize, Record)> = runlog::read_sealed(&run.join("log.jsonl"))
        .expect("the log's seals hold")
        .entries
        .iter()
        .map(|(line, e)| (*line, e.record.clone()))
        .collect();
    let answered_before: Vec<(String, String, flashtune::model::config::Dtype)> = before
        .iter()
        .filter_map(|(_, r)| match r {
            Record::Timed {
                variant,
                shape,
                dtype,
                device,
                ..
            } => {
                assert_eq!(*device, Some(0), "a streamed case names its GPU");
                Some((variant.clone(), shape.clone(), *dtype))
            }
            _ => None,
        })
        .collect();
    let in_flight = answered_before[0].0.clone();
    assert!(answered_before.iter().all(|(v, _, _)| *v == in_flight));

    let out = flashtune(dir.path(), &["resume", run.to_str().unwrap(), "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{} case(s) of the variants in flight were answered and are kept",
            answered_before.len()
        )),
        "{}",
        text(&out)
    );
    let after = records(&run);
    let resumed_at = after
        .iter()
        .position(|(_, r)| matches!(r, Record::Resumed { .. }))
        .unwrap();
    let mut answered_after: Vec<(String, String, flashtune::model::config::Dtype)> = Vec::new();
    for (_, r) in &after[resumed_at..] {
        if let Record::Timed {
            variant,
            shape,
            dtype,
            ..
        }
        | Record::CheckFailed {
            variant,
            shape,
            dtype,
            ..
        } = r
        {
            let case = (variant.clone(), shape.clone(), *dtype);
            assert!(
                !answered_before.contains(&case),
                "{case:?} was answered before the kill and measured again"
            );
            answered_after.push(case);
        }
    }
    // The variant in flight finished its other cases, and every case of the run was answered once.
    let rest_of_in_flight = answered_after
        .iter()
        .filter(|(v, _, _)| *v == in_flight)
        .count();
    assert_eq!(
        rest_of_in_flight + answered_before.len(),
        14,
        "smoke: 7 shapes x 2 dtypes"
    );
    let mut all: Vec<_> = answered_before.iter().chain(&answered_after).collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "a case was answered twice");
    assert!(matches!(after.last(), Some((_, Record::Finished { .. }))));
}

/// A run on a space that takes its family from another (`family_from`) resumes only while that
/// family's file is as it was: the header's space hash covers both files.
#[test]
fn resume_refuses_a_run_whose_taken_family_changed() {
    let dir = scratch_project();
    let smoke = std::fs::read_to_string(dir.path().join("variants/smoke.toml")).unwrap();
    let tables = smoke.find("\n[symbols]\n").unwrap()..smoke.find("\n[params]\n").unwrap();
    let taker = format!(
        "{}\nfamily_from = \"smoke.toml\"\n{}",
        &smoke[..tables.start],
        &smoke[tables.end..]
    )
    .replace("name = \"smoke\"", "name = \"smoke-taker\"");
    std::fs::write(dir.path().join("variants/smoke-taker.toml"), taker).unwrap();
    let out = flashtune(
        dir.path(),
        &[
            "tune",
            "--fake-gpu",
            "--space",
            "variants/smoke-taker.toml",
            "--max-variants",
            "1",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = only_run(dir.path());
    // The same launch contract, written otherwise: the family's file changed, not the space's.
    replace_in(
        &dir.path().join("variants/smoke.toml"),
        "threads = \"WARPS * 32\"",
        "threads = \"32 * WARPS\"",
    );
    assert_resume_refused(dir.path(), &run, "variant space");
}

/// `resume` of `run` refuses with exit code 2, saying what changed (`what: was ...`) and that
/// `--force` resumes anyway.
fn assert_resume_refused(root: &std::path::Path, run: &std::path::Path, what: &str) {
    let out = flashtune(root, &["resume", run.to_str().unwrap(), "--fake-gpu"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains(&format!("{what}: was")) && t.contains("--force"),
        "{t}"
    );
}
