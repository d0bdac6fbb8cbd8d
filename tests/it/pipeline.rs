//! The whole pipeline on the fake GPU, the compiler story (nvcc search order, `flashtune setup`), help texts, doctor and the no-GPU path.
use crate::common;
use common::*;
use flashtune::log::runlog::Record;
use flashtune::model::config::Policies;
use flashtune::model::space::Space;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The whole tune path without a GPU: real builds, fake worker, log and report.
#[test]
fn tune_end_to_end_on_the_fake_gpu() {
    let dir = scratch_project();
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let run = run_dir_from(&out);
    let recs = records(&run);
    let Record::Header(h) = &recs[0] else {
        panic!("first record is {:?}", recs[0])
    };
    assert!(h.device.fake);
    assert_eq!(h.baseline, "scalar-bm64-bn64-w4-ks1-s1");
    let (policies, _) = Policies::load(&dir.path().join("policies.toml")).unwrap();
    let space = Space::load(&dir.path().join("variants/smoke.toml")).unwrap();
    let shapes = space.select_shapes(&policies.shapes).unwrap();
    assert_eq!(h.shapes, shapes);
    let cases = space.variants().unwrap().len() * shapes.len() * policies.dtypes.len();
    let timed = recs
        .iter()
        .filter(|r| matches!(r, Record::Timed { .. }))
        .count();
    let checked = recs
        .iter()
        .filter(|r| matches!(r, Record::Checked { .. }))
        .count();
    assert_eq!((timed, checked), (cases, cases));
    assert!(matches!(
        recs.last(),
        Some(Record::Finished {
            failed_cases: 0,
            ..
        })
    ));
    // stderr is a pipe here, where progress bars draw nothing: the progress comes as plain
    // lines, a first fastest-so-far for every (shape, dtype) among them, each saying it is
    // synthetic (issue 43, item 10: a fake run's console never reads as measured).
    let stderr = String::from_utf8_lossy(&out.stderr);
    for shape in &shapes {
        for dtype in &policies.dtypes {
            let line = format!("fastest so far {}/{dtype}: ", shape.name);
            assert!(stderr.contains(&line), "no `{line}` in:\n{stderr}");
        }
    }
    for line in stderr.lines().filter(|l| l.contains("fastest so far")) {
        assert!(line.ends_with("(synthetic: fake GPU)"), "{line}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("given synthetic figures by the fake GPU")
            && !stdout.contains("cases measured"),
        "{stdout}"
    );
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("Fake GPU"), "{report}");
    assert!(
        report.contains("Synthetic ceilings") && !report.contains("Measured ceilings"),
        "{report}"
    );
    assert!(
        report.contains("PyTorch not measured: fake GPU"),
        "{report}"
    );
    assert!(
        report.contains("| `scalar-bm64-bn64-w4-ks1-s1` |") && report.contains("1.00×"),
        "{report}"
    );
    // `report` rebuilds the same table from the log alone.
    let again = flashtune(dir.path(), &["report", run.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(report.trim()),
        "{}",
        text(&again)
    );
}

#[test]
fn invalid_points_are_logged_not_dropped() {
    let dir = scratch_project();
    let space = dir.path().join("variants/smoke.toml");
    let s = std::fs::read_to_string(&space)
        .unwrap()
        .replace("WARPS = [4]", "WARPS = [4, 8]");
    std::fs::write(&space, s).unwrap();
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let recs = records(&run_dir_from(&out));
    let invalid: Vec<&Record> = recs
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::Planned {
                    invalid: Some(_),
                    ..
                }
            )
        })
        .collect();
    // wmma needs BLOCK_M == WARPS * 16, so wmma with 8 warps is out, for both head dims and both splits.
    assert_eq!(invalid.len(), 4, "{invalid:?}");
    assert!(!recs.iter().any(
        |r| matches!(r, Record::Built { variant, .. } if variant.starts_with("wmma-bm64-bn64-w8"))
    ));
}

/// With no GPU, `tune` names the cause, points to the test double (`--fake-gpu` and the space
/// that suits it) and to where real figures come from; `doctor`'s GPU line gives the same cause.
#[test]
fn tune_without_a_gpu_says_so_and_points_to_the_test_double() {
    let dir = scratch_project();
    let run = |cmd: &str| {
        Command::new(binary())
            .arg("--root")
            .arg(dir.path())
            .arg(cmd)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env(
                "FLASHTUNE_CACHE_DIR",
                repo().join("target/test-build-cache"),
            )
            .output()
            .unwrap()
    };
    let out = run("tune");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    for pointer in [
        "--fake-gpu",
        "variants/smoke.toml",
        "flashtune doctor",
        "flashtune build",
    ] {
        assert!(t.contains(pointer), "no `{pointer}` in:\n{t}");
    }
    assert!(!t.contains("panicked"), "{t}");
    let cause = t
        .lines()
        .find_map(|l| l.strip_prefix("error: no usable GPU: "))
        .unwrap_or_else(|| panic!("{t}"))
        .trim()
        .to_owned();
    assert!(
        !cause.is_empty() && !cause.ends_with("):"),
        "tune gives no cause: {cause:?}"
    );
    let doctor = text(&run("doctor"));
    let gpu_line = doctor
        .lines()
        .find(|l| l.starts_with("[FAIL] gpu"))
        .unwrap_or_else(|| panic!("{doctor}"));
    assert!(
        gpu_line.contains(&cause),
        "doctor: {gpu_line}\ntune: {cause}"
    );
    assert!(gpu_line.contains("--fake-gpu"), "{gpu_line}");
}

/// The hint every "nvcc not found" prints, `flashtune setup`, run as a new user would: in a
/// project with no compiler anywhere, from a clean virtualenv's Python. It installs the pinned
/// set from PyPI and proves it compiles a kernel that includes cuda_fp16.h (needs network).
#[test]
fn setup_hint_installs_a_compiler_that_builds() {
    let dir = scratch_project();
    let venv = tempfile::tempdir().unwrap();
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv.path())
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made));
    let no_nvcc_path = std::env::join_paths(
        std::env::split_paths(&std::env::var_os("PATH").unwrap())
            .filter(|d| !d.join("nvcc").exists()),
    )
    .unwrap();
    let mut cmd = Command::new(binary());
    cmd.arg("--root").arg(dir.path());
    cmd.env("PATH", no_nvcc_path)
        .env("PYTHON", venv.path().join("bin/python"));
    cmd.env_remove("FLASHTUNE_NVCC")
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH");
    if Path::new("/usr/local/cuda/bin/nvcc").exists() {
        eprintln!(
            "SKIPPED: /usr/local/cuda/bin/nvcc exists, so setup would find it and install nothing"
        );
        return;
    }
    let missing = cmd
        .arg("build")
        .arg("--space")
        .arg("variants/smoke.toml")
        .output()
        .unwrap();
    let hint = text(&missing);
    assert!(hint.contains("run `flashtune setup`"), "{hint}");
    let mut setup = Command::new(binary());
    setup.arg("--root").arg(dir.path()).arg("setup");
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => setup.env(k, v),
            None => setup.env_remove(k),
        };
    }
    let out = setup.output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("found by .tools/cuda") && t.contains("release 13.0"),
        "{t}"
    );
}

/// Every subcommand's help lists only the flags it honours, each with a description; a flag a
/// command cannot apply is refused by the parser, not accepted and ignored.
#[test]
fn help_lists_only_the_flags_each_command_honours_each_described() {
    let top = flashtune(&repo(), &["--help"]);
    let top = String::from_utf8_lossy(&top.stdout).to_string();
    let commands: Vec<String> = top
        .split("Commands:")
        .nth(1)
        .unwrap_or_else(|| panic!("{top}"))
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() > 10, "{commands:?}");
    for command in &commands {
        let out = flashtune(&repo(), &[command, "-h"]);
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        for line in help.lines().filter(|l| l.trim_start().starts_with('-')) {
            // `  -x, --flag <VALUE>  What it does`: the description follows two spaces.
            let spec_and_text = line.trim_start();
            let described = spec_and_text
                .split_once("  ")
                .is_some_and(|(_, text)| !text.trim().is_empty());
            assert!(described, "`flashtune {command}`: no description: {line}");
        }
    }
    let refused: &[(&[&str], &[&str])] = &[
        (
            &["profile", "runs/x", "some-variant"],
            &[
                "--commit",
                "--reuse",
                "--confirm",
                "--max-variants",
                "--time-limit",
            ],
        ),
        (&["ablate", "runs/x"], &["--reuse"]),
    ];
    for (command, flags) in refused {
        let help = flashtune(&repo(), &[command[0], "-h"]);
        let help = String::from_utf8_lossy(&help.stdout).to_string();
        for flag in *flags {
            assert!(
                !help.contains(flag),
                "`{}` lists {flag}:\n{help}",
                command[0]
            );
            let mut args = command.to_vec();
            args.push(flag);
            let out = flashtune(&repo(), &args);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
            assert!(t.contains(&format!("unexpected argument '{flag}'")), "{t}");
        }
    }
}

/// Reading a committed measurement never writes into the tree: `report` on a log git tracks
/// (under docs/) writes its files under runs/reports/ and says where.
#[test]
fn report_on_a_measurement_under_docs_writes_nothing_there() {
    let dir = scratch_project();
    let kept = dir.path().join("docs/measurements/a-gpu/quick");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::copy(
        repo().join("docs/measurements/2026-11-24-h100/quick-raced/log.jsonl.gz"),
        kept.join("log.jsonl.gz"),
    )
    .unwrap();
    commit_all(dir.path(), "a committed measurement");
    let out = flashtune(dir.path(), &["report", "docs/measurements/a-gpu/quick"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let left: Vec<_> = std::fs::read_dir(&kept)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["log.jsonl.gz"], "{t}");
    let written = dir
        .path()
        .join("runs/reports/docs-measurements-a-gpu-quick/report.md");
    assert!(written.is_file(), "{t}");
    assert!(
        t.contains("runs/reports/docs-measurements-a-gpu-quick"),
        "{t}"
    );
}

/// One nvcc search order for every command: FLASHTUNE_NVCC, PATH, CUDA_HOME, then the project's
/// .tools/cuda (what `flashtune setup` installs); `doctor` says which one it took.
#[test]
fn nvcc_search_order() {
    let dir = scratch_project();
    let fakes = tempfile::tempdir().unwrap();
    let fake_nvcc = |path: &Path, name: &str| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            path,
            format!("#!/bin/sh\necho 'Cuda compilation tools, release 0.0, {name}'\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let override_nvcc = fakes.path().join("override/nvcc");
    let on_path = fakes.path().join("path");
    let home = fakes.path().join("home");
    fake_nvcc(&override_nvcc, "override");
    fake_nvcc(&on_path.join("nvcc"), "on-path");
    fake_nvcc(&home.join("bin/nvcc"), "cuda-home");
    fake_nvcc(
        &dir.path().join(".tools/cuda/nvidia/cu13/bin/nvcc"),
        "project-tools",
    );
    // The machine's own PATH, less any folder that holds an nvcc of its own.
    let system_path: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .filter(|d| !d.join("nvcc").exists())
        .collect();
    let path_with = |first: Option<&Path>| {
        std::env::join_paths(
            first
                .map(Path::to_path_buf)
                .into_iter()
                .chain(system_path.clone()),
        )
        .unwrap()
    };
    let found_from = |cwd: &Path,
                      root: &Path,
                      nvcc: Option<&Path>,
                      path_dir: Option<&Path>,
                      cuda_home: Option<&Path>| {
        let mut cmd = Command::new(binary());
        cmd.current_dir(cwd).arg("--root").arg(root).arg("doctor");
        cmd.env("CUDA_VISIBLE_DEVICES", "")
            .env("PATH", path_with(path_dir));
        cmd.env_remove("FLASHTUNE_NVCC")
            .env_remove("CUDA_HOME")
            .env_remove("CUDA_PATH");
        if let Some(n) = nvcc {
            cmd.env("FLASHTUNE_NVCC", n);
        }
        if let Some(h) = cuda_home {
            cmd.env("CUDA_HOME", h);
        }
        let out = cmd.output().unwrap();
        let t = String::from_utf8_lossy(&out.stdout).to_string();
        t.lines()
            .find(|l| l.contains("] nvcc"))
            .unwrap_or_else(|| panic!("{t}"))
            .to_owned()
    };
    let found = |nvcc: Option<&Path>, path_dir: Option<&Path>, cuda_home: Option<&Path>| {
        found_from(dir.path(), dir.path(), nvcc, path_dir, cuda_home)
    };
    let line = found(Some(&override_nvcc), Some(&on_path), Some(&home));
    assert!(
        line.contains("override") && line.contains("found by FLASHTUNE_NVCC"),
        "{line}"
    );
    // A relative FLASHTUNE_NVCC is named absolute: children that run in other folders inherit it.
    let line = found_from(
        fakes.path(),
        dir.path(),
        Some(Path::new("override/nvcc")),
        None,
        None,
    );
    assert!(
        line.contains(&override_nvcc.display().to_string()),
        "{line}"
    );
    let line = found(None, Some(&on_path), Some(&home));
    assert!(
        line.contains("on-path") && line.contains("found by PATH"),
        "{line}"
    );
    let line = found(None, None, Some(&home));
    assert!(
        line.contains("cuda-home") && line.contains("found by CUDA_HOME"),
        "{line}"
    );
    if !Path::new("/usr/local/cuda/bin/nvcc").exists() {
        let line = found(None, None, None);
        assert!(
            line.contains("project-tools") && line.contains("found by .tools/cuda"),
            "{line}"
        );
        // Found through `--root .`, the project's nvcc is still named by its absolute path (the
        // test script exports what `setup` prints; a relative one broke every child run elsewhere).
        let line = found_from(dir.path(), Path::new("."), None, None, None);
        let tools = dir.path().join(".tools/cuda/nvidia/cu13/bin/nvcc");
        assert!(line.contains(&tools.display().to_string()), "{line}");
        std::fs::remove_dir_all(dir.path().join(".tools")).unwrap();
        let line = found(None, None, None);
        assert!(
            line.starts_with("[FAIL] nvcc") && line.contains("`flashtune setup`"),
            "{line}"
        );
    }
}

#[test]
fn doctor_reports_each_check_without_a_gpu() {
    let out = Command::new(binary())
        .arg("--root")
        .arg(repo())
        .arg("doctor")
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    for name in ["config", "nvcc", "gpu", "ncu", "torch", "git", "disk"] {
        assert!(
            t.lines().any(|l| l.contains(&format!("] {name}"))),
            "no {name} line:\n{t}"
        );
    }
    assert!(
        t.lines()
            .any(|l| l.starts_with("[FAIL] gpu") && l.contains("fix:")),
        "{t}"
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(!text(&out).contains("panicked"));
}

/// Issue 43, item 11: `doctor` fails on a broken policies.toml, naming its line; and a command run
/// outside any project says to cd into one or pass --root.
#[test]
fn doctor_fails_on_broken_policies_and_a_command_outside_the_project_says_where_to_run() {
    let dir = scratch_project();
    replace_in(
        &dir.path().join("policies.toml"),
        "samples = 30",
        "samples = \"thirty\"",
    );
    let out = flashtune(dir.path(), &["doctor"]);
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let config = t
        .lines()
        .find(|l| l.starts_with("[FAIL] config"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(
        config.contains("policies.toml:") && config.contains("samples"),
        "{config}"
    );
    assert_eq!(out.status.code(), Some(1));
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(binary())
        .current_dir(elsewhere.path())
        .args(["tune", "--fake-gpu"])
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("cd into the clone") && t.contains("--root"),
        "{t}"
    );
}

/// Issue 43, item 9: without any nvcc, `tune --fake-gpu` says why the double needs one and how to
/// get it (`flashtune setup`, the README's first no-GPU line).
#[test]
fn fake_gpu_without_nvcc_names_setup_and_why_the_double_needs_it() {
    if Path::new("/usr/local/cuda/bin/nvcc").exists() {
        eprintln!("SKIPPED: /usr/local/cuda/bin/nvcc exists, so nvcc cannot be missing here");
        return;
    }
    let dir = scratch_project();
    let out = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["tune", "--fake-gpu", "--space", "variants/smoke.toml"])
        .env_remove("FLASHTUNE_NVCC")
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("flashtune setup") && t.contains("--fake-gpu` needs it too"),
        "{t}"
    );
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let no_gpu = readme.split("## No GPU here?").nth(1).expect("the section");
    let setup = no_gpu
        .find("flashtune setup")
        .expect("setup in the no-GPU steps");
    assert!(setup < no_gpu.find("flashtune tune --fake-gpu").unwrap());
}
