//! Input that must be refused with a message (never a panic), run logs as a contract, the GPU lock, offline arch limits and the causal geometry, through the binary as a user meets them.
use crate::common;
use common::*;
use flashtune::error::{exit_code, Error};
use flashtune::model::config::{Causal, Policies};
use flashtune::run::engine;
use flashtune::run::shared::{self, WhenBusy};
use std::path::{Path, PathBuf};

fn edit(path: &Path, from: &str, to: &str) {
    let s = std::fs::read_to_string(path).unwrap();
    assert!(s.contains(from), "`{from}` not in {}", path.display());
    std::fs::write(path, s.replacen(from, to, 1)).unwrap();
}

/// 1-based line of the first line of `path` that starts with `prefix` (after indentation).
fn line_of(path: &Path, prefix: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .position(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("`{prefix}` not in {}", path.display()))
        + 1
}

/// The smoke space cut to one variant and one shape: four builds, seconds on the fake GPU.
fn tiny_space(dir: &Path) -> &'static str {
    let space = dir.join("variants/tiny.toml");
    std::fs::copy(dir.join("variants/smoke.toml"), &space).unwrap();
    edit(&space, "name = \"smoke\"", "name = \"tiny\"");
    edit(&space, "MMA = [\"scalar\", \"wmma\"]", "MMA = [\"scalar\"]");
    edit(&space, "KV_SPLIT = [1, 4]", "KV_SPLIT = [1]");
    let s = std::fs::read_to_string(&space).unwrap();
    let shapes = s.lines().find(|l| l.starts_with("shapes = ")).unwrap();
    edit(&space, shapes, "shapes = [\"small\"]");
    "variants/tiny.toml"
}

/// A finished fake run of the tiny space in `dir`.
fn fake_run(dir: &Path) -> PathBuf {
    let space = tiny_space(dir);
    let out = flashtune(dir, &["tune", "--fake-gpu", "--space", space]);
    assert!(out.status.success(), "{}", text(&out));
    run_dir_from(&out)
}

mod policies {
    use super::*;

    /// `from` → `to` in a copy of the shipped policies, loaded: the error it must give.
    fn rejected(from: &str, to: &str) -> (Error, PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policies.toml");
        std::fs::copy(repo().join("policies.toml"), &path).unwrap();
        edit(&path, from, to);
        let e = Policies::load(&path).expect_err(&format!("`{to}` must be refused"));
        (e, path, dir)
    }

    #[test]
    fn a_nan_tolerance_exits_2_naming_file_line_and_key() {
        let dir = scratch_project();
        let policies = dir.path().join("policies.toml");
        edit(
            &policies,
            "[tolerance.bf16]\nmax_abs = 3e-2",
            "[tolerance.bf16]\nmax_abs = nan",
        );
        let line = line_of(&policies, "max_abs = nan");
        let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(
            t.contains(&format!(
                "policies.toml:{line}:1: key `tolerance.bf16.max_abs`"
            )),
            "{t}"
        );
        assert!(t.contains("finite"), "{t}");
    }

    #[test]
    fn every_tolerance_margin_measurement_and_timeout_must_be_finite_and_in_range() {
        let cases = [
            ("rel_l2 = 1.2e-3", "rel_l2 = inf", "tolerance.f16.rel_l2"),
            (
                "lse_max_abs = 1e-4",
                "lse_max_abs = -1e-4",
                "tolerance.f16.lse_max_abs",
            ),
            ("max_abs = 4e-3", "max_abs = 0.0", "tolerance.f16.max_abs"),
            ("min_gain = 0.02", "min_gain = nan", "guided.min_gain"),
            ("threshold = 0.02", "threshold = -0.01", "step.threshold"),
            ("warmup_ms = 20.0", "warmup_ms = inf", "measure.warmup_ms"),
            (
                "min_sample_us = 500.0",
                "min_sample_us = 0.0",
                "measure.min_sample_us",
            ),
            (
                "cpu_reference_max_macs = 3e8",
                "cpu_reference_max_macs = -inf",
                "measure.cpu_reference_max_macs",
            ),
            ("within_pct = 0.0", "within_pct = nan", "profile.within_pct"),
            ("worker_s = 300", "worker_s = 0", "timeouts.worker_s"),
            ("build_s = 300", "build_s = 99999999999", "timeouts.build_s"),
            ("timeout_s = 300", "timeout_s = 0", "profile.timeout_s"),
            (
                "proposer_timeout_s = 1800",
                "proposer_timeout_s = 0",
                "step.proposer_timeout_s",
            ),
        ];
        for (from, to, key) in cases {
            let (e, path, _dir) = rejected(from, to);
            let Error::Config {
                line, key: named, ..
            } = &e
            else {
                panic!("{to}: expected a config error, got {e}");
            };
            assert_eq!(named, key, "{to}: {e}");
            assert_eq!(*line, line_of(&path, to), "{to}: {e}");
            assert_eq!(e.exit_code(), exit_code::BAD_INPUT);
        }
    }

    /// A `[sandbox]` folder is absolute or `~/`, without `..`: named at its file, line and key.
    #[test]
    fn a_sandbox_folder_that_is_relative_or_climbs_is_refused_at_its_line() {
        let cases = [
            (
                r#"writable = ["~/.gemini""#,
                r#"writable = [".gemini""#,
                "sandbox.writable",
                "is relative",
            ),
            (
                r#"hidden = ["~/.local/state/flashtune"]"#,
                r#"hidden = ["~/.local/state/../state/flashtune"]"#,
                "sandbox.hidden",
                "holds `..`",
            ),
        ];
        for (from, to, key, why) in cases {
            let (e, path, _dir) = rejected(from, to);
            let Error::Config {
                line,
                key: named,
                message,
                ..
            } = &e
            else {
                panic!("{to}: expected a config error, got {e}");
            };
            assert_eq!(named, key, "{to}: {e}");
            assert_eq!(*line, line_of(&path, to), "{to}: {e}");
            assert!(message.contains(why), "{to}: {e}");
        }
    }

    #[test]
    fn zero_is_accepted_where_it_means_something() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policies.toml");
        std::fs::copy(repo().join("policies.toml"), &path).unwrap();
        // No warm-up, no CPU oracle, champions only, and "beating the noise is enough".
        for (from, to) in [
            ("warmup_ms = 20.0", "warmup_ms = 0.0"),
            (
                "cpu_reference_max_macs = 3e8",
                "cpu_reference_max_macs = 0.0",
            ),
            ("min_gain = 0.02", "min_gain = 0.0"),
            ("threshold = 0.02", "threshold = 0.0"),
        ] {
            edit(&path, from, to);
        }
        Policies::load(&path).unwrap();
    }

    #[test]
    fn a_shape_whose_products_overflow_exits_2_at_its_line() {
        let dir = scratch_project();
        let policies = dir.path().join("policies.toml");
        // B·H·Sq·D wraps a u32 many times over, and B·H is far past CUDA's grid limit.
        edit(
            &policies,
            "name = \"small\"\nb = 1\nh = 1",
            "name = \"small\"\nb = 4000000\nh = 4000000",
        );
        let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        let line = line_of(&policies, "name = \"small\"");
        assert!(
            t.contains(&format!("policies.toml:{line}:1: key `shapes.name`")),
            "{t}"
        );
        assert!(t.contains("shape `small`") && t.contains("65535"), "{t}");

        let (e, _, _dir) = rejected("sq = 8192\nsk = 8192", "sq = 2000000000\nsk = 8192");
        assert!(e.to_string().contains("2^30"), "{e}");
        let (e, _, _dir) = rejected(
            "name = \"decode\"\nb = 1\nh = 8\nsq = 1\nsk = 4096",
            "name = \"decode\"\nb = 1\nh = 8\nsq = 1\nsk = 1000000000",
        );
        assert!(e.to_string().contains("GiB"), "{e}");
    }

    #[test]
    fn a_causal_value_that_is_neither_bool_nor_alignment_is_refused() {
        let (e, path, _dir) = rejected(
            "d = 128\ncausal = true",
            "d = 128\ncausal = \"lower-right\"",
        );
        let Error::Config { line, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(*line, line_of(&path, "causal = \"lower-right\""), "{e}");
        assert!(e.to_string().contains("bottom-right"), "{e}");
    }

    #[test]
    fn shipped_shapes_state_both_alignments_with_sq_unlike_sk() {
        let (p, _) = Policies::load(&repo().join("policies.toml")).unwrap();
        for causal in [Causal::TopLeft, Causal::BottomRight] {
            for longer_keys in [true, false] {
                assert!(
                    p.shapes.iter().any(|s| s.causal == causal
                        && (s.sq < s.sk) == longer_keys
                        && s.sq != s.sk),
                    "no {causal:?} shape with Sq {} Sk",
                    if longer_keys { "<" } else { ">" }
                );
            }
        }
        let attention =
            flashtune::model::space::Space::load(&repo().join("variants/attention.toml")).unwrap();
        let selected = attention.select_shapes(&p.shapes).unwrap();
        assert!(selected
            .iter()
            .any(|s| s.causal == Causal::BottomRight && s.sq > s.sk));
        assert!(selected
            .iter()
            .any(|s| s.causal == Causal::BottomRight && s.sq < s.sk));
        let smoke =
            flashtune::model::space::Space::load(&repo().join("variants/smoke.toml")).unwrap();
        assert!(
            smoke
                .select_shapes(&p.shapes)
                .unwrap()
                .iter()
                .any(|s| s.causal == Causal::BottomRight && s.sq > s.sk),
            "CI builds and runs a shape with rows that see no key"
        );
    }
}

mod spaces {
    use super::*;

    #[test]
    fn head_dim_as_a_parameter_exits_2_instead_of_panicking() {
        let dir = scratch_project();
        let space = dir.path().join("variants/bad.toml");
        std::fs::copy(dir.path().join("variants/smoke.toml"), &space).unwrap();
        edit(&space, "STAGES = [1]", "STAGES = [1]\nHEAD_DIM = [\"x\"]");
        edit(&space, "STAGES = 1 }", "STAGES = 1, HEAD_DIM = \"x\" }");
        let out = flashtune(
            dir.path(),
            &["tune", "--fake-gpu", "--space", "variants/bad.toml"],
        );
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        let line = line_of(&space, "HEAD_DIM = [");
        assert!(
            t.contains(&format!("bad.toml:{line}:1: key `params.HEAD_DIM`")),
            "{t}"
        );
        assert!(t.contains("head dim"), "{t}");
    }

    #[test]
    fn a_symbolic_value_that_is_no_identifier_exits_2() {
        let dir = scratch_project();
        let space = dir.path().join("variants/bad.toml");
        std::fs::copy(dir.path().join("variants/smoke.toml"), &space).unwrap();
        edit(
            &space,
            "MMA = [\"scalar\", \"wmma\"]",
            "MMA = [\"scalar\", \"w mma\"]",
        );
        let out = flashtune(
            dir.path(),
            &["tune", "--fake-gpu", "--space", "variants/bad.toml"],
        );
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(
            t.contains("key `params.MMA`") && t.contains("\"w mma\""),
            "{t}"
        );
    }

    #[test]
    fn a_space_timeout_of_zero_exits_2() {
        let dir = scratch_project();
        let space = dir.path().join("variants/faults.toml");
        edit(&space, "worker_s = 20", "worker_s = 0");
        let out = flashtune(
            dir.path(),
            &["tune", "--fake-gpu", "--space", "variants/faults.toml"],
        );
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        let line = line_of(&space, "worker_s = 0");
        assert!(
            t.contains(&format!("faults.toml:{line}:1: key `timeouts.worker_s`")),
            "{t}"
        );
    }
}

mod run_logs {
    use super::*;

    /// A project with one run folder holding `log` and a report that must survive.
    fn project_with_log(log: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = scratch_project();
        let run = dir.path().join("runs/20261122-031500-ab12");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("log.jsonl"), log).unwrap();
        std::fs::write(run.join("report.md"), "the good report\n").unwrap();
        (dir, run)
    }

    fn fixture_log() -> String {
        std::fs::read_to_string(repo().join("tests/fixtures/runs/smoke-h200.log.jsonl")).unwrap()
    }

    #[test]
    fn a_log_without_a_header_is_refused_and_overwrites_nothing() {
        let headerless: String = fixture_log()
            .lines()
            .skip(1)
            .map(|l| format!("{l}\n"))
            .collect();
        // Issue 43, item 8: a header cut mid-line is named as such, not as an empty log.
        let cut = fixture_log().lines().next().unwrap()[..40].to_owned();
        for (log, says) in [
            ("", "is empty"),
            (headerless.as_str(), "no header"),
            (cut.as_str(), "header cut mid-line"),
        ] {
            let (dir, run) = project_with_log(log);
            let out = flashtune(dir.path(), &["report", run.to_str().unwrap()]);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{t}");
            assert!(t.contains(says) && t.contains("log.jsonl"), "{t}");
            assert_eq!(
                std::fs::read_to_string(run.join("report.md")).unwrap(),
                "the good report\n"
            );
            assert!(!run.join("report.html").exists());
        }
    }

    #[test]
    fn a_log_from_a_newer_flashtune_is_refused_by_every_reader() {
        let newer = fixture_log().replacen("\"schema_version\":1,", "\"schema_version\":99,", 1);
        let (dir, run) = project_with_log(&newer);
        let run = run.to_str().unwrap();
        for args in [
            vec!["report", run],
            vec!["resume", run, "--fake-gpu"],
            vec!["ablate", run, "--fake-gpu"],
            vec!["profile", run, "scalar-bm64-bn64-w4-ks1-s1", "--fake-gpu"],
        ] {
            let out = flashtune(dir.path(), &args);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
            assert!(t.contains("written by a newer flashtune"), "{args:?}: {t}");
        }
        assert_eq!(
            std::fs::read_to_string(Path::new(run).join("report.md")).unwrap(),
            "the good report\n"
        );
    }

    #[test]
    fn runs_are_found_by_their_bare_id() {
        let (dir, run) = project_with_log(&fixture_log());
        let out = flashtune(dir.path(), &["report", "20261122-031500-ab12"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(run.join("report.html").is_file());

        for command in ["report", "resume", "ablate"] {
            let out = flashtune(dir.path(), &[command, "20261122-000000-none"]);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{command}: {t}");
            assert!(
                t.contains("no run `20261122-000000-none`")
                    && t.contains("runs/20261122-000000-none/log.jsonl"),
                "{command}: {t}"
            );
        }
    }

    #[test]
    fn profile_of_a_dtype_without_tolerances_exits_2_and_resume_takes_the_id() {
        let dir = scratch_project();
        let run = fake_run(dir.path());
        let id = run.file_name().unwrap().to_str().unwrap().to_owned();
        let out = flashtune(dir.path(), &["resume", &id, "--fake-gpu"]);
        assert!(out.status.success(), "{}", text(&out));

        let policies = dir.path().join("policies.toml");
        edit(
            &policies,
            "dtypes = [\"f16\", \"bf16\"]",
            "dtypes = [\"f16\"]",
        );
        edit(
            &policies,
            "[tolerance.bf16]\nmax_abs = 3e-2\nrel_l2 = 1e-2\nrow_rel_l2 = 1.5e-2\nlse_max_abs = 1e-4\n",
            "",
        );
        let out = flashtune(
            dir.path(),
            &[
                "profile",
                &id,
                "scalar-bm64-bn64-w4-ks1-s1",
                "--dtype",
                "bf16",
                "--fake-gpu",
            ],
        );
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(t.contains("[tolerance.bf16]"), "{t}");
    }
}

mod commit_and_lock {
    use super::*;

    #[test]
    fn commit_is_refused_with_the_fake_gpu() {
        let dir = scratch_project();
        let run = dir.path().join("runs/20261122-031500-ab12");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::copy(
            repo().join("tests/fixtures/runs/smoke-h200.log.jsonl"),
            run.join("log.jsonl"),
        )
        .unwrap();
        for args in [
            vec!["tune", "--fake-gpu", "--commit"],
            vec!["resume", "20261122-031500-ab12", "--fake-gpu", "--commit"],
            vec!["ablate", "20261122-031500-ab12", "--fake-gpu", "--commit"],
        ] {
            let out = flashtune(dir.path(), &args);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
            assert!(
                t.contains("synthetic") && t.contains("never committed"),
                "{args:?}: {t}"
            );
        }
        assert_eq!(
            std::fs::read_dir(dir.path().join("runs")).unwrap().count(),
            1,
            "no run was started"
        );
    }

    /// A GPU ordinal no real run uses, so the test never meets a real lock.
    fn unused_gpu() -> u32 {
        90_000 + std::process::id() % 10_000
    }

    #[test]
    fn a_busy_gpu_has_its_own_exit_code_and_wait_queues_behind_it() {
        let gpu = unused_gpu();
        let held = shared::lock_gpus(&[gpu], false, WhenBusy::Refuse).unwrap();
        let e = shared::lock_gpus(&[gpu], false, WhenBusy::Refuse).unwrap_err();
        assert_eq!(e.exit_code(), exit_code::GPU_BUSY);
        assert_ne!(exit_code::GPU_BUSY, exit_code::BAD_INPUT);
        assert!(
            e.to_string()
                .contains(&format!("pid {}", std::process::id()))
                && e.to_string().contains("--wait"),
            "{e}"
        );

        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let locks = shared::lock_gpus(&[gpu], false, WhenBusy::Wait);
            tx.send(()).unwrap();
            locks
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "--wait must not take a held GPU");
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("--wait takes the GPU once it is free");
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn wait_is_offered_by_every_command_that_takes_a_gpu() {
        for command in ["tune", "resume", "ablate", "step", "profile"] {
            let out = flashtune(Path::new("."), &[command, "--help"]);
            assert!(text(&out).contains("--wait"), "{command}: {}", text(&out));
        }
        let out = flashtune(Path::new("."), &["tune", "--help"]);
        let t = text(&out);
        assert!(
            t.contains("top-left")
                && t.contains("bottom-right")
                && t.contains("causal_lower_right"),
            "{t}"
        );
    }
}

mod offline_targets {
    use super::*;
    use flashtune::model::config::ProjectPaths;
    use flashtune::run::shared::Project;

    /// One WMMA point, d = 128, BLOCK_N = 128: 138 496 bytes of shared memory, more than an L4's
    /// 99 KiB and less than Hopper's 227 KiB.
    fn wide_space(dir: &Path) -> &'static str {
        let space = dir.join("variants/wide.toml");
        std::fs::copy(dir.join("variants/smoke.toml"), &space).unwrap();
        edit(&space, "MMA = [\"scalar\", \"wmma\"]", "MMA = [\"wmma\"]");
        edit(&space, "BLOCK_N = [64]", "BLOCK_N = [128]");
        edit(&space, "KV_SPLIT = [1, 4]", "KV_SPLIT = [1]");
        edit(
            &space,
            "baseline = { MMA = \"scalar\", BLOCK_M = 64, BLOCK_N = 64,",
            "baseline = { MMA = \"wmma\", BLOCK_M = 64, BLOCK_N = 128,",
        );
        let s = std::fs::read_to_string(&space).unwrap();
        let shapes = s.lines().find(|l| l.starts_with("shapes = ")).unwrap();
        edit(&space, shapes, "shapes = [\"odd-causal\"]");
        "variants/wide.toml"
    }

    #[test]
    fn build_for_sm_89_rules_out_what_only_hopper_can_run() {
        let dir = scratch_project();
        let space = wide_space(dir.path());
        let project = Project::load(
            ProjectPaths::new(dir.path().to_path_buf()),
            Some(Path::new(space)),
        )
        .unwrap();
        let plan = |arch: &str| {
            let limits = engine::offline_limits(&project, arch).unwrap();
            project.space.plan(&project.head_dims(), &limits).unwrap()
        };
        let hopper = plan("sm_90a");
        assert_eq!(hopper.len(), 1);
        assert_eq!(hopper[0].invalid, None, "{hopper:?}");
        let l4 = plan("sm_89");
        let why = l4[0].why_invalid().expect("ruled out on sm_89");
        assert!(why.contains("opt-in limit 101376"), "{why}");

        // Through the CLI: only the reference is compiled, and the table says why.
        let out = flashtune(dir.path(), &["build", "--space", space, "--arch", "sm_89"]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(
            t.contains("1 points ruled out") && t.contains("opt-in limit 101376"),
            "{t}"
        );
    }

    /// The build gate's covering sample (`plan::covering_sample`): only valid points, and per MMA
    /// path and head dim every value each parameter takes among the valid points, plus the points
    /// with the most and the least shared memory; on the large spaces far fewer builds than the plan.
    #[test]
    fn covering_sample_holds_every_parameter_value_and_the_extremes() {
        use std::collections::BTreeSet;
        for space in [
            "variants/attention.toml",
            "variants/hopper.toml",
            "variants/merge.toml",
        ] {
            let project = Project::load(ProjectPaths::new(repo()), Some(Path::new(space))).unwrap();
            let limits = engine::offline_limits(&project, "sm_90a").unwrap();
            let planned = project.space.plan(&project.head_dims(), &limits).unwrap();
            let sample: Vec<_> = flashtune::model::plan::covering_sample(&planned)
                .into_iter()
                .map(|c| c.point)
                .collect();
            let valid: Vec<_> = planned.iter().filter(|p| p.invalid.is_none()).collect();
            assert!(sample.iter().all(|p| p.invalid.is_none()), "{space}");
            assert!(
                sample.len() * 2 < valid.len(),
                "{space}: {} of {}",
                sample.len(),
                valid.len()
            );
            let group = |p: &flashtune::model::space::PlannedPoint| {
                (
                    p.variant.params.get("MMA").map(|v| v.to_string()),
                    p.head_dim,
                )
            };
            let pairs =
                |points: &mut dyn Iterator<Item = &flashtune::model::space::PlannedPoint>| {
                    points
                        .flat_map(|p| {
                            p.variant
                                .params
                                .iter()
                                .map(move |(k, v)| (group(p), k.clone(), v.to_string()))
                        })
                        .collect::<BTreeSet<_>>()
                };
            let missing: Vec<_> = pairs(&mut valid.iter().copied())
                .difference(&pairs(&mut sample.iter()))
                .cloned()
                .collect();
            assert!(missing.is_empty(), "{space}: never compiled: {missing:?}");
            let smem =
                |p: &flashtune::model::space::PlannedPoint| p.launch.as_ref().unwrap().smem_bytes;
            for g in valid.iter().map(|p| group(p)).collect::<BTreeSet<_>>() {
                let in_group: Vec<_> = valid.iter().filter(|p| group(p) == g).collect();
                let sampled: Vec<_> = sample.iter().filter(|p| group(p) == g).collect();
                let most = in_group.iter().map(|p| smem(p)).max();
                let least = in_group.iter().map(|p| smem(p)).min();
                assert_eq!(sampled.iter().map(|p| smem(p)).max(), most, "{space} {g:?}");
                assert_eq!(
                    sampled.iter().map(|p| smem(p)).min(),
                    least,
                    "{space} {g:?}"
                );
            }
        }
    }

    /// The Hopper path is sm_90a only: on an L4 (sm_89) or an A100 (sm_80) every wgmma point of
    /// the spaces that hold it is ruled out before compiling, with the path and the arch named,
    /// while the other paths stay; on sm_90a the same points are valid.
    #[test]
    fn the_wgmma_path_is_ruled_out_off_sm_90a_with_a_reason() {
        for space in [
            "variants/hopper.toml",
            "variants/attention.toml",
            "variants/quick.toml",
        ] {
            let project = Project::load(ProjectPaths::new(repo()), Some(Path::new(space))).unwrap();
            let plan = |arch: &str| {
                let limits = engine::offline_limits(&project, arch).unwrap();
                project.space.plan(&project.head_dims(), &limits).unwrap()
            };
            let is_wgmma =
                |p: &flashtune::model::space::PlannedPoint| p.variant.id.starts_with("wgmma-");
            let hopper = plan("sm_90a");
            assert!(
                hopper.iter().any(|p| is_wgmma(p) && p.invalid.is_none()),
                "{space}: no valid wgmma point on sm_90a"
            );
            // A set, not a scan per point: attention.toml plans 82,944 points.
            let valid_on_hopper: std::collections::HashSet<(&str, u32)> = hopper
                .iter()
                .filter(|h| h.invalid.is_none())
                .map(|h| (h.variant.id.as_str(), h.head_dim))
                .collect();
            for arch in ["sm_89", "sm_80"] {
                let planned = plan(arch);
                let wgmma: Vec<_> = planned.iter().filter(|p| is_wgmma(p)).collect();
                assert!(!wgmma.is_empty(), "{space}");
                for p in wgmma {
                    let why = p.why_invalid().unwrap_or("valid");
                    // A point a constraint already rules out keeps that reason; every other one
                    // is ruled out by the arch, not by a build failure.
                    if valid_on_hopper.contains(&(p.variant.id.as_str(), p.head_dim)) {
                        assert!(
                            why.contains("the wgmma path")
                                && why.contains("needs sm_90a")
                                && why.contains(&format!("the target is {arch}")),
                            "{space} {arch} {}: {why}",
                            p.variant.id
                        );
                    }
                }
                assert!(
                    planned.iter().any(|p| !is_wgmma(p) && p.invalid.is_none()),
                    "{space} {arch}: the other paths must stay"
                );
            }
        }

        // Through the CLI, as a user meets it: nothing of the wgmma path is compiled for sm_89.
        let dir = scratch_project();
        let space = dir.path().join("variants/wg.toml");
        std::fs::copy(dir.path().join("variants/hopper.toml"), &space).unwrap();
        let s = std::fs::read_to_string(&space).unwrap();
        let kept: Vec<&str> = s
            .lines()
            .filter(|l| !l.trim_start().starts_with("{ MMA = \"mma\""))
            .collect();
        std::fs::write(&space, kept.join("\n")).unwrap();
        edit(
            &space,
            "baseline = { MMA = \"mma\", BLOCK_M = 128, BLOCK_N = 64, WARPS = 4,",
            "baseline = { MMA = \"wgmma\", BLOCK_M = 128, BLOCK_N = 128, WARPS = 8,",
        );
        let out = flashtune(
            dir.path(),
            &["build", "--space", "variants/wg.toml", "--arch", "sm_89"],
        );
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(
            !t.contains("| `wgmma-"),
            "a wgmma point was compiled for sm_89: {t}"
        );
        assert!(
            t.contains("points ruled out before compiling") && t.contains("the wgmma path (wgmma.mma_async, setmaxnreg) needs sm_90a; the target is sm_89"),
            "{t}"
        );
    }

    /// Issue 51, item 1: the quick space (the default first run) fits the GPU it runs on. On
    /// sm_90a it holds the Hopper path's champion of every quick shape (the H200 runs of
    /// 2026-11-28 to 2026-11-30, "Best per shape"; the `…-da1` ones from
    /// docs/measurements/2026-11-30-h200-descriptors/quick-fa4-stages) and 14 variants, 104 cases; on an L4 (sm_89) or
    /// an A100 (sm_80) the plan rules every wgmma point out by the arch, before compiling, and keeps the scalar
    /// baseline and the mma.sync points, whose counts are the quick space's before issue 51.
    #[test]
    fn the_quick_space_holds_hopper_points_on_sm_90a_and_mma_points_elsewhere() {
        use flashtune::model::space::PlannedPoint;
        let project = Project::load(
            ProjectPaths::new(repo()),
            Some(Path::new("variants/quick.toml")),
        )
        .unwrap();
        let plan = |arch: &str| {
            let limits = engine::offline_limits(&project, arch).unwrap();
            project.space.plan(&project.head_dims(), &limits).unwrap()
        };
        let is_wgmma = |p: &PlannedPoint| p.variant.id.starts_with("wgmma-");
        let dtypes = project.policies.dtypes.len();
        // What `tune` measures: each valid point on every shape of its head dim, in every dtype.
        let counts = |planned: &[PlannedPoint]| {
            let valid: Vec<_> = planned.iter().filter(|p| p.invalid.is_none()).collect();
            let variants: std::collections::BTreeSet<_> =
                valid.iter().map(|p| p.variant.id.clone()).collect();
            let cases: usize = valid
                .iter()
                .map(|p| project.shapes.iter().filter(|s| s.d == p.head_dim).count() * dtypes)
                .sum();
            (variants.len(), cases)
        };
        let mut names: Vec<&str> = project.shapes.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["decode-128", "large-64", "odd-causal", "seed"]);

        let hopper = plan("sm_90a");
        // Only the three-group points at d = 128: 160 registers a consumer thread are too few for a
        // d = 128 O beside S.
        let three_groups = "wgmma-bm192-bn128-w16-ks1-s3-p1-t1";
        let three_groups_da = "wgmma-bm192-bn128-w16-ks1-s4-p1-t1-pc2-da2-gkt1-pm1";
        for p in &hopper {
            assert_eq!(
                p.invalid.is_some(),
                (p.variant.id == three_groups || p.variant.id == three_groups_da)
                    && p.head_dim == 128,
                "{} d={}: {:?}",
                p.variant.id,
                p.head_dim,
                p.why_invalid()
            );
        }
        // The champion of each shape on an H200, valid at that shape's head dim.
        for (shape, champion) in [
            ("seed", "wgmma-bm64-bn128-w8-auto-s2-t1-da1"),
            ("large-64", three_groups_da),
            ("decode-128", "wgmma-bm64-bn128-w4-auto-s2-da1"),
            ("odd-causal", "wgmma-bm64-bn128-w8-auto-s3-t1-da1"),
        ] {
            let d = project.shapes.iter().find(|s| s.name == shape).unwrap().d;
            assert!(
                hopper
                    .iter()
                    .any(|p| p.variant.id == champion && p.head_dim == d && p.invalid.is_none()),
                "{shape}: {champion} is not a valid sm_90a point at d = {d}"
            );
        }
        let wgmma_ids: std::collections::BTreeSet<_> = hopper
            .iter()
            .filter(|p| is_wgmma(p))
            .map(|p| p.variant.id.as_str())
            .collect();
        assert_eq!(
            wgmma_ids.into_iter().collect::<Vec<_>>(),
            [
                three_groups,
                three_groups_da,
                "wgmma-bm64-bn128-w4-auto-s2",
                "wgmma-bm64-bn128-w4-auto-s2-da1",
                "wgmma-bm64-bn128-w8-auto-s2-t1",
                "wgmma-bm64-bn128-w8-auto-s2-t1-da1",
                "wgmma-bm64-bn128-w8-auto-s3-t1",
                "wgmma-bm64-bn128-w8-auto-s3-t1-da1",
            ]
        );
        // The TMA points, and only they, are launched with tensor maps (the family's tensor_maps);
        // the one drawing its tiles from a counter, and only it, is persistent and gets the counter
        // (the family's persistent and split_counters).
        for p in hopper.iter().filter(|p| p.invalid.is_none()) {
            let launch = p.launch.as_ref().unwrap();
            assert_eq!(
                launch.tensor_maps,
                p.variant.id.contains("-t1"),
                "{}",
                p.variant.id
            );
            let drawn = p.variant.id.contains("-pc2-");
            assert_eq!(launch.persistent, drawn, "{}", p.variant.id);
            assert_eq!(launch.split_counters, drawn, "{}", p.variant.id);
        }
        assert_eq!(counts(&hopper), (14, 104), "sm_90a");

        // On an L4, mma-bm128-bn64-w4-ks1-s2 at d = 128 needs 104,448 bytes of shared memory,
        // more than its 101,376: 4 of the 48 cases go, as before issue 51.
        for (arch, expected) in [("sm_89", (6, 44)), ("sm_80", (6, 48))] {
            let planned = plan(arch);
            for p in planned.iter().filter(|p| is_wgmma(p)) {
                let why = p.why_invalid().unwrap_or("valid");
                // The constraints rule the three-group points out at d = 128 first, on every arch.
                let by_constraint = (p.variant.id == three_groups
                    || p.variant.id == three_groups_da)
                    && p.head_dim == 128;
                assert!(
                    by_constraint && why.starts_with("constraints:")
                        || why
                            .contains("the wgmma path (wgmma.mma_async, setmaxnreg) needs sm_90a")
                            && why.contains(&format!("the target is {arch}")),
                    "{arch} {} d={}: {why}",
                    p.variant.id,
                    p.head_dim
                );
            }
            assert_eq!(planned.iter().filter(|p| is_wgmma(p)).count(), 8 * 2);
            for p in planned.iter().filter(|p| !is_wgmma(p)) {
                let why = p.why_invalid().unwrap_or("");
                assert!(!why.contains("wgmma"), "{arch} {}: {why}", p.variant.id);
            }
            assert_eq!(counts(&planned), expected, "{arch}");
        }
    }

    /// "Tensor pipe idle" and "register-limited" propose the Hopper path from the mma.sync
    /// champion of the large shapes: a whole point (MMA, tile, producer warp group), valid on
    /// sm_90a and ruled out by name elsewhere.
    #[test]
    fn the_guided_rules_propose_the_hopper_path() {
        let project = Project::load(
            ProjectPaths::new(repo()),
            Some(Path::new("variants/guided.toml")),
        )
        .unwrap();
        let champion = project
            .space
            .variants()
            .unwrap()
            .into_iter()
            .find(|v| v.id == "mma-bm128-bn64-w4-ks1-s2")
            .expect("the large-shape champion is in the guided grid");
        for bottleneck in [
            "tensor pipe idle while compute bound",
            "occupancy limited by registers",
        ] {
            let proposals: Vec<_> = project
                .policies
                .guided
                .rules
                .iter()
                .filter(|r| r.bottleneck == bottleneck)
                .filter_map(|r| project.space.neighbour(&champion.params, &r.change))
                .collect();
            let hopper = proposals
                .iter()
                .find(|v| v.id == "wgmma-bm128-bn128-w12-ks1-s2")
                .unwrap_or_else(|| panic!("{bottleneck}: {proposals:?}"));
            let plan = |arch: &str| {
                let limits = engine::offline_limits(&project, arch).unwrap();
                project
                    .space
                    .plan_points(std::slice::from_ref(hopper), &project.head_dims(), &limits)
                    .unwrap()
            };
            assert!(
                plan("sm_90a").iter().all(|p| p.invalid.is_none()),
                "{:?}",
                plan("sm_90a")
            );
            for p in plan("sm_89") {
                assert!(
                    p.why_invalid().unwrap_or("").contains("needs sm_90a"),
                    "{p:?}"
                );
            }
        }
    }

    #[test]
    fn an_arch_missing_from_the_table_is_an_error_naming_it() {
        let dir = scratch_project();
        let out = flashtune(dir.path(), &["build", "--arch", "sm_75"]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(
            t.contains("[build.targets.sm_75]") && t.contains("key `build.targets`"),
            "{t}"
        );

        let policies = dir.path().join("policies.toml");
        edit(
            &policies,
            "default_arch = \"sm_90a\"",
            "default_arch = \"sm_100a\"",
        );
        let out = flashtune(dir.path(), &["build"]);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(
            t.contains("key `build.default_arch`") && t.contains("[build.targets.sm_100a]"),
            "{t}"
        );
    }
}

mod geometry {
    use flashtune::gpu::check;
    use flashtune::model::config::{Causal, Dtype};

    #[test]
    fn a_row_that_sees_no_key_matches_only_when_both_sides_say_so() {
        let out: Vec<u16> = [0.0f32, 0.0, 1.0, 2.0]
            .iter()
            .map(|&x| check::to_bits(Dtype::F16, x))
            .collect();
        let ref_out = [0.0f32, 0.0, 1.0, 2.0];
        let hidden = f32::NEG_INFINITY;
        let s = check::compare(
            Dtype::F16,
            2,
            &out,
            &[hidden, 0.5],
            &ref_out,
            &[hidden, 0.5],
            &[],
        );
        assert_eq!((s.nan_count, s.lse_max_abs), (0, 0.0));
        // A kernel that hides a row the reference says is visible is still caught.
        let s = check::compare(
            Dtype::F16,
            2,
            &out,
            &[hidden, 0.5],
            &ref_out,
            &[0.25, 0.5],
            &[],
        );
        assert_eq!(s.nan_count, 1);
    }

    #[test]
    fn the_oracle_and_the_flop_count_agree_on_what_each_alignment_admits() {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            for (sq, sk) in [(5, 9), (9, 5), (6, 6)] {
                let shape = crate::common::shape(1, 1, sq, sk, 64, causal);
                let visible: u64 = (0..sq).map(|i| u64::from(shape.visible_keys(i))).sum();
                assert_eq!(visible, shape.pairs_per_head(), "{causal:?} {sq}x{sk}");
                assert_eq!(shape.flops(), 4.0 * 64.0 * visible as f64);
                // The oracle hides exactly the rows with no visible key.
                let n = |len: u64, t| {
                    check::values(
                        Dtype::F16,
                        &check::random_bits(Dtype::F16, len as usize, 3, t, 1.0),
                    )
                };
                let (q, k, v) = (
                    n(shape.q_elements(), 0),
                    n(shape.kv_elements(), 1),
                    n(shape.kv_elements(), 2),
                );
                let (_, lse) = check::cpu_attention(&shape, &q, &k, &v);
                for i in 0..sq {
                    assert_eq!(
                        lse[i as usize] == f64::NEG_INFINITY,
                        shape.visible_keys(i) == 0,
                        "{causal:?} {sq}x{sk} row {i}"
                    );
                }
            }
        }
    }
}
