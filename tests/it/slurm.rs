//! Workers as Slurm job steps (`--executor slurm`) on a real one-node Slurm cluster on this host,
//! set up by scripts/test.sh, or by the test itself, through scripts/slurm-localhost.sh (installed
//! with apt-get when missing). Where none can be had the test prints why it is SKIPPED, and
//! scripts/test.sh leaves it out of the run, so the summary counts it as skipped.
//!
//! One test, its stages in order: they share the cluster's CPUs, and each checks that no srun and no
//! worker step outlived the run before it.
use crate::common;

use common::*;
use flashtune::gpu::slurm::StepLoss;
use flashtune::log::runindex::RunIndex;
use flashtune::log::runlog::{self, Record};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Each timed case takes this long on the double: a worker is mid-case for 1.5 s at a time, long
/// enough to cancel its step while it works.
const PACE_MS: &str = "1500";
const SHAPES: &str = r#"["small", "ragged"]"#;

/// The cluster the test runs on: the one scripts/test.sh started (it says so with `FLASHTUNE_SLURM=1`
/// and `SLURM_CONF`), or else one started here by the same script (scripts/slurm-localhost.sh) and
/// stopped by pid when dropped. `Err` says why there is none: test.sh could not have one
/// (`FLASHTUNE_SLURM_SKIPPED`), `FLASHTUNE_SLURM=0`, or the script could not install or start it.
enum Cluster {
    Shared,
    Own(tempfile::TempDir),
}

impl Cluster {
    fn get() -> Result<Cluster, String> {
        match std::env::var("FLASHTUNE_SLURM").as_deref() {
            Ok("1") => return Ok(Cluster::Shared),
            Ok("0") => return Err("FLASHTUNE_SLURM=0".into()),
            _ => {}
        }
        if let Ok(why) = std::env::var("FLASHTUNE_SLURM_SKIPPED") {
            return Err(why);
        }
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("bash")
            .arg(repo().join("scripts/slurm-localhost.sh"))
            .arg("start")
            .arg(dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            drop(Cluster::Own(dir));
            let why = said
                .lines()
                .find_map(|l| l.strip_prefix("SKIPPED: no Slurm ("))
                .map(|l| l.trim_end_matches(')').to_owned())
                .unwrap_or_else(|| format!("scripts/slurm-localhost.sh failed: {}", said.trim()));
            return Err(why);
        }
        // Set before this test starts a thread; the binary holds no other test.
        std::env::set_var("SLURM_CONF", dir.path().join("slurm.conf"));
        Ok(Cluster::Own(dir))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Cluster::Own(dir) = self {
            let _ = Command::new("bash")
                .arg(repo().join("scripts/slurm-localhost.sh"))
                .arg("stop")
                .arg(dir.path())
                .status();
        }
    }
}

fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Job steps of flashtune workers the cluster still runs (`squeue -s`), as `JOBID.STEPID`.
fn worker_steps() -> Vec<String> {
    tool(
        "squeue",
        &["-h", "-s", "-n", "flashtune-worker", "-o", "%i"],
    )
    .lines()
    .map(|l| l.trim().to_owned())
    .filter(|l| !l.is_empty())
    .collect()
}

/// No srun of a worker on this host, and no worker step left on the cluster.
fn assert_nothing_left(after: &str) {
    let started = Instant::now();
    loop {
        let sruns = tool("pgrep", &["-af", "srun.*flashtune worker"]);
        let steps = worker_steps();
        if sruns.trim().is_empty() && steps.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "after {after}: left behind: sruns {sruns:?}, steps {steps:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_flashtune(root: &Path, args: &[&str], pace: bool) -> Output {
    spawn(root, args, pace).wait_with_output().unwrap()
}

fn spawn(root: &Path, args: &[&str], pace: bool) -> std::process::Child {
    let env: &[(&str, &str)] = if pace {
        &[("FLASHTUNE_FAKE_PACE_MS", PACE_MS)]
    } else {
        &[]
    };
    flashtune_child(root, args, env)
}

/// `resume` of `run` through four srun workers, to its end.
fn resume(root: &Path, run: &Path) -> Output {
    let run = run.to_str().unwrap();
    let args = [
        "resume",
        run,
        "--fake-gpu",
        "--executor",
        "slurm",
        "--tasks",
        "4",
    ];
    run_flashtune(root, &args, false)
}

const SLURM_TUNE: &[&str] = &["tune", "--fake-gpu", "--executor", "slurm", "--tasks", "4"];

/// Every planned case has its one terminal record, and all of them are measured.
fn assert_all_measured(run: &Path, what: &str) {
    let log = runlog::read(&run.join("log.jsonl")).unwrap();
    let ix = RunIndex::new(&log);
    let a = &ix.accounting;
    assert!(a.planned > 0, "{what}: nothing planned");
    assert_eq!(
        (a.measured, a.failed, a.skipped, a.not_run),
        (a.planned, 0, 0, 0),
        "{what}: not every planned case measured"
    );
    let recs = records(run);
    assert!(
        matches!(recs.last(), Some(Record::Finished { .. })),
        "{what}: last record {:?}",
        recs.last()
    );
    assert!(
        !recs.iter().any(|r| matches!(r, Record::Quarantined { .. })),
        "{what}: a variant was quarantined"
    );
    // Every case says which node (and GPU) timed it.
    for r in &recs {
        if let Record::Timed { placed, .. } = r {
            assert!(
                placed.is_some(),
                "{what}: a timed case without its node: {r:?}"
            );
        }
    }
}

/// Wait until `n` worker steps run at once (the queues are all busy), then a little into their cases.
fn wait_for_busy_steps(n: usize, child: &mut std::process::Child) -> Vec<String> {
    let started = Instant::now();
    loop {
        let steps = worker_steps();
        if steps.len() >= n {
            std::thread::sleep(Duration::from_millis(500));
            return steps;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {n} worker steps ran at once");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never {n} worker steps at once: {steps:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until the new run's log holds `n` start sentinels: every queue is past its sentinel and in
/// its first job (a case takes `PACE_MS`).
fn wait_for_start_sentinels(
    root: &Path,
    before: &[PathBuf],
    n: usize,
    child: &mut std::process::Child,
) {
    let started = Instant::now();
    loop {
        let logged = runs_in(root)
            .into_iter()
            .filter(|p| !before.contains(p))
            .filter_map(|p| std::fs::read_to_string(p.join("log.jsonl")).ok())
            .map(|t| {
                t.lines()
                    .filter(|l| {
                        l.contains("\"event\":\"sentinel\"") && l.contains("\"when\":\"start\"")
                    })
                    .count()
            })
            .max()
            .unwrap_or(0);
        if logged >= n {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {n} queues timed their start sentinel");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never {n} start sentinels ({logged})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn only_new_run(root: &Path, before: &[PathBuf]) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(root.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("log.jsonl").is_file() && !before.contains(p))
        .collect();
    assert_eq!(runs.len(), 1, "one new run: {runs:?}");
    runs[0].clone()
}

fn runs_in(root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(root.join("runs"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn workers_as_slurm_steps_survive_a_lost_step_and_a_cancelled_job() {
    let _cluster = match Cluster::get() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("\n*** SKIPPED: no Slurm ({why}): tests/it/slurm.rs did not run ***\n");
            return;
        }
    };
    assert_nothing_left("nothing (a cluster with flashtune steps already running)");
    let dir = f16_project("smoke.toml", SHAPES);
    let root = dir.path();
    let t0 = Instant::now();

    // 1. A run through four srun workers accounts for every planned case.
    let out = run_flashtune(root, SLURM_TUNE, false);
    assert!(out.status.success(), "{}", text(&out));
    let plain = run_dir_from(&out);
    assert_all_measured(&plain, "a plain run");
    let devices: std::collections::BTreeSet<u32> = records(&plain)
        .iter()
        .filter_map(|r| match r {
            Record::WorkerRan { device, placed, .. } => {
                assert!(placed.is_some(), "worker_ran without its node: {r:?}");
                Some(*device)
            }
            _ => None,
        })
        .collect();
    assert!(
        devices.len() > 1,
        "the variants were spread over the workers: {devices:?}"
    );
    assert_nothing_left("a plain run");
    let t_plain = t0.elapsed();

    // 2. One worker's step is cancelled mid-case: its variant goes to another step, is not held
    //    against it, and nothing is lost.
    let t1 = Instant::now();
    let before = runs_in(root);
    let mut child = spawn(root, SLURM_TUNE, true);
    let steps = wait_for_busy_steps(4, &mut child);
    // Only once every queue has timed its start sentinel: a step cancelled during its sentinel
    // loses no case (seen once under load), and the test would prove nothing.
    wait_for_start_sentinels(root, &before, 4, &mut child);
    // The newest step: the oldest may already have finished its one job by now (the run then loses
    // nothing, and the test would prove nothing).
    let victim = steps
        .iter()
        .max_by_key(|s| {
            let (job, step) = s.split_once('.').unwrap_or((s, "0"));
            (
                job.parse::<u64>().unwrap_or(0),
                step.parse::<u64>().unwrap_or(0),
            )
        })
        .expect("four steps");
    let cancel = Command::new("scancel").arg(victim).status().unwrap();
    assert!(cancel.success(), "scancel {victim}");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    assert_all_measured(&run, "a run that lost a step");
    let recs = records(&run);
    let lost: Vec<&Record> = recs
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::WorkerLost {
                    loss: StepLoss::Cancelled,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(
        lost.len(),
        1,
        "one step lost, as cancelled: {lost:?}\n{}",
        text(&out)
    );
    let Record::WorkerLost { variant, .. } = lost[0] else {
        unreachable!()
    };
    let timed = recs
        .iter()
        .filter(|r| matches!(r, Record::Timed { variant: v, .. } if v == variant))
        .count();
    assert_eq!(
        timed, 2,
        "{variant} measured in full after its step was lost"
    );
    assert!(
        !recs
            .iter()
            .any(|r| matches!(r, Record::WorkerCrashed { .. })),
        "a lost step is not a crash of the variant's: {recs:?}"
    );
    assert_nothing_left("a run that lost a step");
    let t_lost = t1.elapsed();

    // 3. flashtune itself is killed (SIGKILL: no handler runs): its sruns still end their steps, and
    //    `resume` finishes the run from its log.
    let t3 = Instant::now();
    let before = runs_in(root);
    let mut child = spawn(root, SLURM_TUNE, true);
    wait_for_busy_steps(4, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_nothing_left("SIGKILL of flashtune");
    let killed = only_new_run(root, &before);
    let out = resume(root, &killed);
    assert!(out.status.success(), "{}", text(&out));
    assert_all_measured(&killed, "a killed run, resumed");
    assert_nothing_left("the resume of a killed run");
    let t_killed = t3.elapsed();

    // 4. The whole job of a batch run (scripts/flashtune-night.sbatch) is cancelled mid-run: the run
    //    ends as on SIGTERM, and `flashtune resume` (outside any allocation) finishes it.
    let t2 = Instant::now();
    let before = runs_in(root);
    let output = root.join("night.out");
    let sbatch = Command::new("sbatch")
        .args(["--parsable", "--export=ALL", "--ntasks=4", "-o"])
        .arg(&output)
        .arg(repo().join("scripts/flashtune-night.sbatch"))
        .arg("--fake-gpu")
        .env("FLASHTUNE", binary())
        .env("FLASHTUNE_ROOT", root)
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .env("FLASHTUNE_FAKE_PACE_MS", PACE_MS)
        .output()
        .unwrap();
    assert!(sbatch.status.success(), "{}", text(&sbatch));
    let job = String::from_utf8_lossy(&sbatch.stdout).trim().to_owned();
    let started = Instant::now();
    while worker_steps().len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the batch run never had 4 workers: {}",
            std::fs::read_to_string(&output).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(Command::new("scancel")
        .arg(&job)
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    while !tool("squeue", &["-h", "-j", &job]).trim().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "job {job} never ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let night = std::fs::read_to_string(&output).unwrap_or_default();
    let run = only_new_run(root, &before);
    let recs = records(&run);
    match recs.last() {
        Some(Record::Interrupted { reason }) => assert!(
            reason.contains("SIGTERM") || reason.contains("Slurm job"),
            "{reason}"
        ),
        other => panic!("the cancelled run's last record: {other:?}\n{night}"),
    }
    assert!(
        !recs
            .iter()
            .any(|r| matches!(r, Record::Quarantined { .. } | Record::CaseSkipped { .. })),
        "a cancelled job holds nothing against a variant: {recs:?}"
    );
    assert_nothing_left("scancel of the batch job");
    let out = resume(root, &run);
    assert!(out.status.success(), "{}", text(&out));
    assert_all_measured(&run, "the resumed batch run");
    assert_nothing_left("the resume");
    let t_job = t2.elapsed();
    println!(
        "slurm stages: plain run {:.1} s, lost step {:.1} s, killed + resume {:.1} s, cancelled job + resume {:.1} s",
        t_plain.as_secs_f64(),
        t_lost.as_secs_f64(),
        t_killed.as_secs_f64(),
        t_job.as_secs_f64()
    );
}
