//! Real nvcc builds: the zero-spill gate on every space (a covering sample; the whole set behind FLASHTUNE_FULL_BUILD_GATE=1), compile errors with their log, the wgmma layout fixture.
use crate::common;
use common::*;
use flashtune::model::config::Policies;
use flashtune::model::space::Space;
use std::path::Path;

/// Every smoke variant compiles with the real nvcc, and the zero-spill gate holds.
#[test]
fn smoke_space_builds_without_spills() {
    let out = flashtune(&repo(), &["build", "--space", "variants/smoke.toml"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let table = String::from_utf8_lossy(&out.stdout);
    let forward_rows = table.lines().filter(|l| l.contains("| attn_fwd |")).count();
    let space = Space::load(&repo().join("variants/smoke.toml")).unwrap();
    let (policies, _) = Policies::load(&repo().join("policies.toml")).unwrap();
    let head_dims: std::collections::BTreeSet<u32> = space
        .select_shapes(&policies.shapes)
        .unwrap()
        .iter()
        .map(|s| s.d)
        .collect();
    assert_eq!(
        forward_rows,
        space.variants().unwrap().len() * head_dims.len() * policies.dtypes.len(),
        "{table}"
    );
    for l in table.lines().filter(|l| l.contains("| attn_")) {
        assert!(
            l.contains("| 0/0 |") && l.ends_with("| ok |"),
            "spilling or rejected: {l}"
        );
    }
}

/// Issue 51, item 1: the quick space holds Hopper points on sm_90a and they build in CI. Its
/// wgmma points alone (a copy of variants/quick.toml without the scalar and mma.sync points,
/// which the smoke and gated spaces build), for sm_90a offline, at both of its head dims in both
/// dtypes (the three-group points at d = 64 only): 28 real nvcc builds, every one with zero spills,
/// admitted by the gates.
#[test]
fn quick_space_holds_hopper_points_that_build_for_sm_90a_without_spills() {
    let dir = scratch_project();
    let quick = std::fs::read_to_string(dir.path().join("variants/quick.toml")).unwrap();
    let kept: Vec<&str> = quick
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("{ MMA = \"mma\"") && !l.starts_with("{ MMA = \"scalar\"")
        })
        .collect();
    let baseline = "baseline = { MMA = \"scalar\", BLOCK_M = 64, BLOCK_N = 64, WARPS = 4, KV_SPLIT = 1, STAGES = 1,";
    let hopper_only = kept.join("\n").replace(
        baseline,
        "baseline = { MMA = \"wgmma\", BLOCK_M = 64, BLOCK_N = 128, WARPS = 4, KV_SPLIT = \"auto\", STAGES = 2,",
    );
    assert!(
        quick.contains(baseline) && !hopper_only.contains(baseline),
        "the quick space's baseline moved"
    );
    std::fs::write(dir.path().join("variants/quick-hopper.toml"), &hopper_only).unwrap();
    let out = flashtune(
        dir.path(),
        &[
            "build",
            "--space",
            "variants/quick-hopper.toml",
            "--arch",
            "sm_90a",
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let table = String::from_utf8_lossy(&out.stdout);
    for l in table.lines().filter(|l| l.contains("| attn_")) {
        assert!(
            l.contains("| 0/0 |") && l.ends_with("| ok |"),
            "spilling or rejected: {l}"
        );
    }
    // The three-group point is d = 64 only (160 registers a consumer thread).
    for (id, dims) in [
        ("wgmma-bm64-bn128-w4-auto-s2", &[64, 128][..]),
        ("wgmma-bm64-bn128-w8-auto-s2-t1", &[64, 128]),
        ("wgmma-bm64-bn128-w8-auto-s3-t1", &[64, 128]),
        ("wgmma-bm192-bn128-w16-ks1-s3-p1-t1", &[64]),
        ("wgmma-bm64-bn128-w4-auto-s2-da1", &[64, 128]),
        ("wgmma-bm64-bn128-w8-auto-s2-t1-da1", &[64, 128]),
        ("wgmma-bm64-bn128-w8-auto-s3-t1-da1", &[64, 128]),
        ("wgmma-bm192-bn128-w16-ks1-s4-p1-t1-pc2-da2-gkt1-pm1", &[64]),
    ] {
        for dtype in ["f16", "bf16"] {
            for d in dims {
                let row = format!("| `{id}` | {dtype} | {d} | attn_fwd |");
                assert!(table.contains(&row), "{row} not built: {table}");
            }
        }
    }
    assert_eq!(
        table.lines().filter(|l| l.contains("| attn_fwd |")).count(),
        (6 * 2 + 2) * 2,
        "{table}"
    );
}

/// Every space the repository ships; the build gate covers them all.
const GATED_SPACES: [&str; 7] = [
    "variants/attention.toml",
    "variants/ablation.toml",
    "variants/hopper.toml",
    "variants/headdims.toml",
    "variants/decode.toml",
    "variants/polyexp.toml",
    "variants/merge.toml",
];
const GATE_MANIFEST: &str = "tests/fixtures/build-gate.toml";
const FULL_GATE_SWITCH: &str = "FLASHTUNE_FULL_BUILD_GATE";

/// Builds `space` (all of it, or its covering sample) and asserts every build is spill-free and admitted.
fn assert_space_builds(space: &str, covering: bool) {
    let mut args = vec!["build", "--space", space];
    if covering {
        args.push("--covering");
    }
    let out = flashtune(&repo(), &args);
    let t = text(&out);
    assert!(out.status.success(), "{space}: {t}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().any(|l| l.contains("| attn_fwd |")), "{table}");
    for l in table.lines().filter(|l| l.contains("| attn_")) {
        assert!(
            l.contains("| 0/0 |") && l.ends_with("| ok |"),
            "{space}: spilling or rejected: {l}"
        );
    }
    // Issue 43, item 12: ruled-out points are summarised a line per reason (the full attention
    // space rules out 82,783), and the output ends with the counts.
    let reasons = table.lines().filter(|l| l.starts_with("- ")).count();
    assert!(
        reasons <= 40,
        "{space}: {reasons} lines of ruled-out points"
    );
    let last = table
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        last.contains("points planned:") && last.contains("builds"),
        "{space}: no summary at the end: {last}"
    );
}

fn gate_keys(space: &str) -> Vec<String> {
    let project = flashtune::run::shared::Project::load(
        flashtune::model::config::ProjectPaths::new(repo()),
        Some(Path::new(space)),
    )
    .unwrap();
    flashtune::run::engine::gate_spec_keys(&project, None).unwrap()
}

/// CI's build gate on every commit: per space, the covering sample (per MMA path and head dim, the
/// register and shared-memory extremes, then every value of every parameter at least once)
/// compiles with zero spills.
#[test]
fn every_space_covering_sample_builds_without_spills() {
    for space in GATED_SPACES {
        assert_space_builds(space, true);
    }
}

/// The whole of every space compiles with zero spills; behind FLASHTUNE_FULL_BUILD_GATE=1 (about
/// ten minutes of nvcc on two cores), it then writes the manifest that
/// `full_build_gate_certifies_these_sources` holds the tree to.
#[test]
fn full_build_gate_writes_its_manifest() {
    if std::env::var(FULL_GATE_SWITCH).as_deref() != Ok("1") {
        eprintln!("SKIPPED: the full build gate runs with {FULL_GATE_SWITCH}=1");
        return;
    }
    let mut manifest = format!(
            "# Written by `{FULL_GATE_SWITCH}=1 cargo nextest run full_build_gate` after every build of\n\
             # every space compiled with zero spills: the spec keys (source closure, defines, flags, target)\n\
             # it certified. Do not edit: run the gate.\n\
             nvcc = {:?}\n",
            flashtune::gpu::build::find_nvcc(&repo()).unwrap().version
        );
    for space in GATED_SPACES {
        assert_space_builds(space, false);
        manifest.push_str(&format!("\n[spaces.{space:?}]\nkeys = [\n"));
        for k in gate_keys(space) {
            manifest.push_str(&format!("  {k:?},\n"));
        }
        manifest.push_str("]\n");
    }
    std::fs::write(repo().join(GATE_MANIFEST), manifest).unwrap();
}

/// The full gate's manifest covers every build the spaces ask for now: a change to a kernel, a
/// space, the build flags or the planner that the full gate has not compiled fails here.
#[test]
fn full_build_gate_certifies_these_sources() {
    if std::env::var(FULL_GATE_SWITCH).as_deref() == Ok("1") {
        eprintln!("SKIPPED: {FULL_GATE_SWITCH}=1 writes the manifest in this same run");
        return;
    }
    let text = std::fs::read_to_string(repo().join(GATE_MANIFEST)).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let spaces = manifest["spaces"].as_table().unwrap();
    for space in GATED_SPACES {
        let certified: std::collections::BTreeSet<&str> = spaces
            .get(space)
            .and_then(|t| t["keys"].as_array())
            .map(|a| a.iter().filter_map(|k| k.as_str()).collect())
            .unwrap_or_default();
        let keys = gate_keys(space);
        let missing = keys
            .iter()
            .filter(|k| !certified.contains(k.as_str()))
            .count();
        assert_eq!(
                missing,
                0,
                "{space}: {missing} of its {} builds were never compiled by the full build gate; run \
                 `{FULL_GATE_SWITCH}=1 cargo nextest run full_build_gate` and commit {GATE_MANIFEST}",
                keys.len()
            );
    }
}

/// The Hopper path's shared-memory layout and its wgmma descriptors agree: every operand
/// element of every k-step, for every tile the spaces use, is read where the loader wrote it
/// (a host program over kernels/attention/sw128.cuh, built with the C++ compiler nvcc uses).
#[test]
fn wgmma_descriptors_read_what_the_swizzled_loader_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("wgmma_layout");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = std::process::Command::new(&cxx)
        .args(["-x", "c++", "-std=c++17", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(repo().join("tests/fixtures/wgmma_layout.cu"))
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = std::process::Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && out.starts_with("ok:"), "{out}");
}

/// The gate is real: a kernel that spills under a register cap is rejected.
#[test]
fn spilling_kernel_is_rejected() {
    let dir = scratch_project();
    let k = dir.path().join("kernels/attention");
    std::fs::copy(repo().join("tests/fixtures/spill.cu"), k.join("spill.cu")).unwrap();
    replace_in(
        &dir.path().join("policies.toml"),
        "nvcc_flags = [",
        "nvcc_flags = [\"-maxrregcount=32\", ",
    );
    let space = dir.path().join("variants/spill.toml");
    let s = std::fs::read_to_string(dir.path().join("variants/smoke.toml"))
        .unwrap()
        .replace("kernels/attention/forward.cu", "kernels/attention/spill.cu")
        .replace("MMA = [\"scalar\", \"wmma\"]", "MMA = [\"scalar\"]")
        .replace("KV_SPLIT = [1, 4]", "KV_SPLIT = [1]");
    std::fs::write(&space, s).unwrap();
    let out = flashtune(dir.path(), &["build", "--space", "variants/spill.toml"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("gates: `spills` spills"), "{t}");
}

#[test]
fn compile_error_is_reported_with_the_compiler_log() {
    let dir = scratch_project();
    let fwd = dir.path().join("kernels/attention/forward.cu");
    let src = std::fs::read_to_string(&fwd).unwrap();
    std::fs::write(&fwd, format!("{src}\nthis is not CUDA;\n")).unwrap();
    let out = flashtune(dir.path(), &["build"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("nvcc failed") && t.contains("error"), "{t}");
}

/// Issue 47, item 5: nvcc runs with a cleared environment plus PATH and TMPDIR. Variables that
/// change what nvcc builds without changing the source (NVCC_APPEND_FLAGS, NVCC_PREPEND_FLAGS,
/// CPATH) never reach it: set here to a header that does not exist, they would fail the build. The
/// cache is a fresh folder, so the compile really runs (the key, blind to those variables, would
/// otherwise find the shared cache's cubin).
#[test]
fn nvcc_sees_none_of_the_ambient_environment() {
    let dir = repo_project();
    let cache = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["build", "--space", "variants/step-ci.toml"])
        .env("FLASHTUNE_CACHE_DIR", cache.path())
        .env("NVCC_APPEND_FLAGS", "-include /nonexistent/evil.h")
        .env("NVCC_PREPEND_FLAGS", "-DHEAD_DIM=7")
        .env("CPATH", "/nonexistent")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("| attn_fwd |") && !t.contains("evil.h"), "{t}");
}
