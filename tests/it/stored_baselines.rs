//! The reference library's figures from the results store (issue 50): a second run on the same GPU
//! model, driver and library takes them, each citing the record it repeats, instead of timing
//! PyTorch again; `--fresh-baselines`, other versions or a store row edited by hand time it anew.
use crate::common::*;
use flashtune::log::runlog::{Citation, Record};
use std::collections::BTreeSet;
use std::path::Path;

/// An adapter that answers `--versions` with `versions.json` beside it and times every shape it is
/// asked for at 7.5 µs (and the roofs), noting each request's shapes in `requests.jsonl` and its
/// GPU, roofs and shapes in `placements.jsonl`. With `ADAPTER_WAITS_FOR_A_CASE_ON_GPU=N` it answers
/// only once the run's log holds a case timed on GPU N (and gives up after two minutes).
fn scripted_project() -> tempfile::TempDir {
    let dir = scratch_project();
    let script = dir.path().join("adapter.py");
    std::fs::write(
        &script,
        r#"import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
if sys.argv[1:] == ["--versions"]:
    print(json.dumps({"versions": json.load(open(os.path.join(here, "versions.json")))}))
    sys.exit(0)
req = json.load(sys.stdin)
# Answer only once a case of this run was timed on that GPU (the reference library held another).
wait = os.environ.get("ADAPTER_WAITS_FOR_A_CASE_ON_GPU")
if wait is not None:
    import glob, time
    deadline = time.time() + 120
    def timed_there():
        for log in glob.glob(os.path.join(here, "runs", "*", "log.jsonl")):
            for line in open(log):
                r = json.loads(line)
                if r.get("event") == "timed" and r.get("device") == int(wait):
                    return True
        return False
    while not timed_there():
        if time.time() > deadline:
            sys.exit("no case was timed on GPU " + wait + " while the reference library ran")
        time.sleep(0.1)
with open(os.path.join(here, "requests.jsonl"), "a") as f:
    f.write(json.dumps([s["name"] for s in req["shapes"]]) + "\n")
with open(os.path.join(here, "placements.jsonl"), "a") as f:
    f.write(json.dumps({"device": req.get("device"), "roofs": req.get("ceilings", True),
                        "shapes": [s["name"] for s in req["shapes"]]}) + "\n")
rows = [{"shape": s["name"], "dtype": d, "backend": b, "samples_us": [7.4, 7.5, 7.5, 7.5, 7.6],
         "launches_per_sample": 64}
        for s in req["shapes"] for d in req["dtypes"] for b in req["backends"]]
ceilings = [{"name": "matmul", "dtype": d, "value": 650.0, "unit": "TFLOP/s"} for d in req["dtypes"]]
print(json.dumps({"rows": rows, "ceilings": ceilings if req.get("ceilings", True) else []}))
"#,
    )
    .unwrap();
    set_versions(dir.path(), "2.9.0");
    replace_in(
        &dir.path().join("policies.toml"),
        r#"command = ["python3", "baselines/torch_sdpa.py"]"#,
        "command = [\"python3\", \"adapter.py\"]\non_fake_gpu = true",
    );
    dir
}

fn set_versions(root: &Path, torch: &str) {
    std::fs::write(
        root.join("versions.json"),
        format!(r#"{{"python": "3.11.7", "torch": "{torch}"}}"#),
    )
    .unwrap();
}

/// The shapes the adapter was asked to time, one list per timing request so far.
fn requests(root: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(root.join("requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn tune(root: &Path, extra: &[&str]) -> std::path::PathBuf {
    let mut args = vec!["tune", "--fake-gpu", "--space", "variants/smoke.toml"];
    args.extend_from_slice(extra);
    let out = flashtune(root, &args);
    assert!(out.status.success(), "{}", text(&out));
    run_dir_from(&out)
}

/// `tune` of the smoke space on the double showing two GPUs, on the GPUs `gpus` names.
fn tune_on_a_host_of_two(root: &Path, gpus: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut env = env.to_vec();
    env.push(("FLASHTUNE_FAKE_GPUS", "2"));
    let args = [
        "tune",
        "--fake-gpu",
        "--gpus",
        gpus,
        "--space",
        "variants/smoke.toml",
    ];
    flashtune_with_env(root, &args, &env)
}

/// (shape, dtype, backend) → (median, where it was measured) of a run's baseline records.
fn baselines(run: &Path) -> Vec<(String, String, String, f64, Option<Citation>)> {
    records(run)
        .into_iter()
        .filter_map(|r| match r {
            Record::BaselineTimed {
                backend,
                shape,
                dtype,
                timing,
                reused_from,
                ..
            } => Some((
                shape,
                dtype.to_string(),
                backend,
                timing.median_us,
                reused_from,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_second_run_takes_the_reference_library_from_the_store_citing_each_record() {
    let dir = scripted_project();
    let root = dir.path();
    let first = tune(root, &[]);
    assert_eq!(requests(root).len(), 1, "the first run times the library");
    let measured = baselines(&first);
    assert!(!measured.is_empty());
    assert!(measured.iter().all(|b| b.4.is_none()));

    // The same GPU, driver and library: nothing is timed, every row cites the first run's record.
    let second = tune(root, &[]);
    assert_eq!(requests(root).len(), 1, "{:?}", requests(root));
    let taken = baselines(&second);
    assert_eq!(taken.len(), measured.len());
    let first_records = numbered_records(&first);
    let first_id = first.file_name().unwrap().to_string_lossy().into_owned();
    for (shape, dtype, backend, median, cited) in &taken {
        let cited = cited.as_ref().expect("a taken row cites its record");
        assert_eq!(cited.run, first_id);
        let (_, record) = first_records
            .iter()
            .find(|(line, _)| *line == cited.line)
            .expect("the cited line exists");
        assert!(
            matches!(record, Record::BaselineTimed { shape: s, backend: b, timing, .. }
                if s == shape && b == backend && timing.median_us == *median),
            "{shape} {dtype} {backend}: line {} is {record:?}",
            cited.line
        );
    }
    let report = std::fs::read_to_string(second.join("report.md")).unwrap();
    assert!(
        report.contains("Reference library not timed again") && report.contains(&first_id),
        "{report}"
    );

    // A third run takes them again and still cites the first run, where they were measured.
    let third = tune(root, &[]);
    assert!(baselines(&third)
        .iter()
        .all(|b| b.4.as_ref().is_some_and(|c| c.run == first_id)));

    // --fresh-baselines times them.
    tune(root, &["--fresh-baselines"]);
    assert_eq!(requests(root).len(), 2);

    // Another PyTorch: its figures are its own.
    set_versions(root, "2.10.0");
    let other = tune(root, &[]);
    assert_eq!(requests(root).len(), 3);
    assert!(baselines(&other).iter().all(|b| b.4.is_none()));
}

/// The cheat: an agent that reaches the results store writes PyTorch's figures slower, so that
/// every kernel beats it. The row's seal no longer holds: it is never taken, and PyTorch is timed.
#[test]
fn a_stored_baseline_edited_in_the_store_is_never_taken() {
    let dir = scripted_project();
    let root = dir.path();
    tune(root, &[]);
    let store = rusqlite::Connection::open(root.join("runs/results.sqlite")).unwrap();
    let edited = store
        .execute(
            "UPDATE reference_library SET record = replace(record, '\"median_us\":7.5', '\"median_us\":75.0')",
            [],
        )
        .unwrap();
    assert!(edited > 0, "no stored baseline to edit");
    drop(store);
    let second = tune(root, &[]);
    assert_eq!(requests(root).len(), 2, "the edited rows were taken");
    assert!(baselines(&second)
        .iter()
        .all(|b| b.4.is_none() && (b.3 - 7.5).abs() < 1e-9));
}

/// The store is not the record, the log is: a sealed row whose cited line now says another figure
/// (the log sealed again with the key, as only flashtune could) is not taken either.
#[test]
fn a_stored_baseline_its_log_line_contradicts_is_never_taken() {
    let dir = scripted_project();
    let root = dir.path();
    let first = tune(root, &[]);
    let (line, _) = numbered_records(&first)
        .into_iter()
        .find(|(_, r)| matches!(r, Record::BaselineTimed { .. }))
        .expect("a baseline record");
    let log = first.join("log.jsonl");
    edit_line(&log, line, "\"median_us\":7.5", "\"median_us\":75.0");
    seal_log(&log);
    let out = flashtune(
        root,
        &["tune", "--fake-gpu", "--space", "variants/smoke.toml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("is not the record the store holds"),
        "{}",
        text(&out)
    );
    assert_eq!(
        requests(root).len(),
        2,
        "the contradicted shape was not timed again"
    );
    let second = run_dir_from(&out);
    let timed_again: Vec<_> = baselines(&second)
        .into_iter()
        .filter(|b| b.4.is_none())
        .collect();
    assert!(!timed_again.is_empty());
}

/// A run times the reference library on its own GPU: `--gpus 1` on a host of two asks the adapter
/// for GPU 1 (it timed PyTorch on GPU 0, beside another run's work, before), once, roofs included.
#[test]
fn a_run_times_the_reference_library_on_its_own_gpu() {
    let dir = scripted_project();
    let out = tune_on_a_host_of_two(dir.path(), "1", &[]);
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    let placements: Vec<serde_json::Value> =
        std::fs::read_to_string(dir.path().join("placements.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(placements.len(), 1, "{placements:?}");
    assert_eq!(placements[0]["device"], 1, "{placements:?}");
    assert_eq!(placements[0]["roofs"], true, "{placements:?}");
    // Every shape asked for, in every dtype, answered.
    let asked: BTreeSet<String> = placements[0]["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let answered: BTreeSet<(String, String)> = baselines(&run)
        .into_iter()
        .map(|(shape, dtype, ..)| (shape, dtype))
        .collect();
    assert!(asked.len() >= 2, "{asked:?}");
    assert_eq!(answered.len(), asked.len() * 2, "{answered:?}");
}

/// The reference library holds one GPU, not the run: on two GPUs the cases are timed on GPU 1
/// while PyTorch is timed on GPU 0 (the adapter answers only once a case was timed on GPU 1), and
/// GPU 0 takes no case before it ends (one GPU, one job).
#[test]
fn the_reference_library_is_timed_on_one_gpu_while_the_other_times_cases() {
    let dir = scripted_project();
    let out = tune_on_a_host_of_two(
        dir.path(),
        "0,1",
        &[("ADAPTER_WAITS_FOR_A_CASE_ON_GPU", "1")],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    let (reference, workers) = reference_and_workers(&run);
    assert_eq!(reference.0, 0, "PyTorch is timed on the run's first GPU");
    assert!(
        !baselines(&run).is_empty(),
        "the adapter answered (it waits for a case on GPU 1): {}",
        text(&out)
    );
    assert!(
        workers.iter().any(|&(d, t, _)| d == 1 && t < reference.2),
        "a worker ran on GPU 1 while the reference library held GPU 0: {workers:?}, {reference:?}"
    );
    assert!(
        workers
            .iter()
            .filter(|&&(d, _, _)| d == 0)
            .all(|&(_, t, _)| t >= reference.2),
        "GPU 0 took a case while it timed the reference library: {workers:?}, {reference:?}"
    );
}

/// The span of the run's reference stage, (GPU, start, end), and each worker's (GPU, start, end).
fn reference_and_workers(run: &Path) -> ((u32, f64, f64), Vec<(u32, f64, f64)>) {
    let records = records(run);
    let reference = records
        .iter()
        .find_map(|r| match r {
            Record::StageRan {
                stage: flashtune::model::vocab::Stage::Reference,
                device,
                started_t,
                seconds,
            } => Some((*device, *started_t, started_t + seconds)),
            _ => None,
        })
        .expect("the reference stage's span is logged");
    let workers = records
        .iter()
        .filter_map(|r| match r {
            Record::WorkerRan {
                device,
                started_t,
                seconds,
                ..
            } => Some((*device, *started_t, started_t + seconds)),
            _ => None,
        })
        .collect();
    (reference, workers)
}

/// On a run's only GPU the kernels being tuned come first: the reference library is timed after
/// the last case's worker has ended, and its figures are in the run.
#[test]
fn on_one_gpu_the_reference_library_is_timed_after_the_last_case() {
    let dir = scripted_project();
    let out = flashtune_with_env(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/smoke.toml"],
        &[("FLASHTUNE_FAKE_PACE_MS", "100")],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    let (reference, workers) = reference_and_workers(&run);
    assert!(!workers.is_empty());
    assert!(
        workers.iter().all(|&(_, _, end)| end <= reference.1),
        "a worker ran after the reference library started: {workers:?}, {reference:?}"
    );
    assert!(!baselines(&run).is_empty(), "{}", text(&out));
}

/// Under a time limit the reference library, timed last, still gets its turn: cases stop early by
/// the time kept for it (half the limit at most), the log says so, and PyTorch is timed before the
/// limit's grace ends.
#[test]
fn under_a_time_limit_cases_stop_early_enough_for_the_reference_library_timed_last() {
    let dir = scripted_project();
    let out = flashtune_with_env(
        dir.path(),
        &[
            "tune",
            "--fake-gpu",
            "--space",
            "variants/smoke.toml",
            // 20 s: cases stop at 10 s, and the worker then in flight (14 cases of 0.3 s) ends
            // seconds before the limit even on a loaded two-core machine (at 12 s it once did not).
            "--time-limit",
            "20s",
        ],
        &[("FLASHTUNE_FAKE_PACE_MS", "300")],
    );
    assert!(out.status.success(), "{}", text(&out));
    let run = run_dir_from(&out);
    let reason = records(&run)
        .into_iter()
        .find_map(|r| match r {
            Record::BudgetReached { reason, .. } => Some(reason),
            _ => None,
        })
        .expect("the cases ran past the time kept for the reference library");
    assert!(
        reason.contains("cases stopped 10s before it") && reason.contains("reference library"),
        "{reason}"
    );
    let (reference, workers) = reference_and_workers(&run);
    assert!(workers.iter().all(|&(_, _, end)| end <= reference.1));
    assert!(
        reference.2 <= 20.0 + 10.0,
        "the reference library ended after the limit's grace: {reference:?}"
    );
    assert!(!baselines(&run).is_empty(), "{}", text(&out));
}
