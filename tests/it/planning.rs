//! Planning a space: constraints and device limits with reasons, the ablation chain, the launch kinds each point implies, the defines kernels receive.
use crate::common;
use common::*;
use flashtune::error::Error;
use flashtune::model::config::{Dtype, Policies};
use flashtune::model::space::{DeviceLimits, Space};

fn write_space(params: &str, constraints: &str) -> (tempfile::TempDir, Space) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    let original = std::fs::read_to_string(repo().join("variants/smoke.toml")).unwrap();
    let head = original.split("[params]").next().unwrap();
    let start = head.find("constraints = [").unwrap();
    let end = start + head[start..].find("\n]").unwrap() + 2;
    let head = format!("{}{constraints}{}", &head[..start], &head[end..]);
    std::fs::write(&path, format!("{head}[params]\n{params}")).unwrap();
    let space = Space::load(&path).unwrap();
    (dir, space)
}

fn h100() -> DeviceLimits {
    DeviceLimits {
        max_threads_per_block: 1024,
        max_smem_optin_bytes: 232448,
        arch: "sm_90a".into(),
    }
}

/// A shipped space's plan (`variants/NAME.toml`) for these head dims on an H100.
fn h100_plan(space: &str, head_dims: &[u32]) -> Vec<flashtune::model::space::PlannedPoint> {
    Space::load(&repo().join(space))
        .unwrap()
        .plan(&head_dims.iter().copied().collect(), &h100())
        .unwrap()
}

/// Whether a point sets the integer parameter `key` to `value`.
fn set_to(p: &flashtune::model::space::PlannedPoint, key: &str, value: i64) -> bool {
    p.variant.params[key] == flashtune::model::space::ParamValue::Int(value)
}

/// Whether a point turns the 0/1 switch `key` on.
fn switched_on(p: &flashtune::model::space::PlannedPoint, key: &str) -> bool {
    set_to(p, key, 1)
}

#[test]
fn constraints_and_device_limits_rule_points_out_with_reasons() {
    let (_d, space) = write_space(
            "MMA = [\"scalar\", \"wmma\"]\nBLOCK_M = [64, 128]\nBLOCK_N = [64, 512]\nWARPS = [4, 64]\nKV_SPLIT = [1]\nSTAGES = [1]\n",
            "constraints = ['MMA != \"wmma\" || BLOCK_M == WARPS * 16']",
        );
    let plan = space
        .plan(&[64u32, 128].into_iter().collect(), &h100())
        .unwrap();
    assert_eq!(plan.len(), 2 * 2 * 2 * 2 * 2);
    let reason = |id: &str, d: u32| {
        plan.iter()
            .find(|p| p.variant.id == id && p.head_dim == d)
            .unwrap()
            .why_invalid()
            .map(str::to_owned)
    };
    assert_eq!(reason("scalar-bm64-bn64-w4-ks1-s1", 64), None);
    assert!(reason("wmma-bm128-bn64-w4-ks1-s1", 64)
        .unwrap()
        .starts_with("constraints:"));
    assert!(reason("scalar-bm64-bn64-w64-ks1-s1", 64)
        .unwrap()
        .contains("2048 threads"));
    // 512-wide K/V tiles at d=128 need far more than 227 KB.
    assert!(reason("scalar-bm128-bn512-w4-ks1-s1", 128)
        .unwrap()
        .contains("shared memory"));
    let valid = plan.iter().find(|p| p.invalid.is_none()).unwrap();
    assert_eq!(valid.launch.as_ref().unwrap().threads, 128);
}

#[test]
fn the_ablation_chain_is_thirteen_named_steps_in_order() {
    let space = Space::load(&repo().join("variants/ablation.toml")).unwrap();
    let steps: Vec<String> = space
        .variants()
        .unwrap()
        .into_iter()
        .map(|v| v.step.unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "baseline",
            "+kv-split",
            "+wmma",
            "+mma-ldmatrix",
            "+stages",
            "+tiles",
            "+warps",
            "+wgmma",
            "+warp-spec",
            "+wide-tiles",
            "+ping-pong",
            "+stages-3",
            "+tma"
        ]
    );
    let v = space.variants().unwrap();
    assert_eq!(v[0].id, space.baseline_id());
    // Each step changes exactly one parameter.
    for pair in v.windows(2) {
        let changed = pair[0]
            .params
            .iter()
            .filter(|(k, val)| pair[1].params[*k] != **val)
            .count();
        assert_eq!(changed, 1, "{} -> {}", pair[0].id, pair[1].id);
    }
}

/// TMA points are launched with tensor maps (forward.cu's launch contract) and no other point
/// is; TMA and TWO_CTAS points exist only where hopper.cuh can build them (TMA with a producer
/// warp group or in the all-consumer form), and the shared memory of two CTAs per SM fits one SM.
#[test]
fn tma_points_launch_with_tensor_maps_and_no_other_point_does() {
    let plan = h100_plan("variants/hopper.toml", &[64, 128]);
    let valid: Vec<_> = plan.iter().filter(|p| p.invalid.is_none()).collect();
    assert!(valid.iter().filter(|p| switched_on(p, "TMA")).count() >= 8);
    assert!(valid.iter().filter(|p| switched_on(p, "TWO_CTAS")).count() >= 4);
    for p in &valid {
        let launch = p.launch.as_ref().unwrap();
        assert_eq!(
            launch.tensor_maps,
            switched_on(p, "TMA"),
            "{} d={}",
            p.variant.id,
            p.head_dim
        );
        if switched_on(p, "TMA") {
            assert!(p.variant.id.starts_with("wgmma-") && p.variant.id.contains("-t1"));
            // One producer warp group beside the consumers, or none (thread 0 of the consumers
            // loads), boxes of at most 256 rows.
            let consumers = 32 * (launch.rows_per_cta / 16);
            assert!(
                launch.threads == consumers + 128 || launch.threads == consumers,
                "{}: {} threads",
                p.variant.id,
                launch.threads
            );
            assert!(launch.rows_per_cta <= 256 && launch.kv_rows_per_block <= 256);
        }
        if switched_on(p, "TWO_CTAS") {
            assert!(
                2 * (launch.smem_bytes + 1024) <= 228 * 1024,
                "{} d={}",
                p.variant.id,
                p.head_dim
            );
        }
    }
    // The 128-key two-CTA points cannot fit two CTAs at d = 128: ruled out by name.
    let tc_128 = plan
        .iter()
        .find(|p| p.variant.id == "wgmma-bm64-bn128-w8-auto-s2-t1-tc1" && p.head_dim == 128)
        .unwrap();
    assert!(tc_128.why_invalid().unwrap().contains("TWO_CTAS"));
    // A space without the key never passes tensor maps (the quick space holds TMA points since
    // issue 51; the smoke space has no TMA key).
    for p in h100_plan("variants/smoke.toml", &[64, 128]) {
        assert!(p.launch.map_or(true, |l| !l.tensor_maps));
    }
}

/// Persistent CTAs that draw their tiles from a counter (PERSISTENT_CTAS = 2) get the counter word
/// (the kernel's `split_counters` parameter, forward.cu's launch contract), launch as persistent
/// grids and take one split (the kernel traps on more); the static schedule (1) and one CTA a tile
/// get no counter. Every shipped space that holds such a point says so.
#[test]
fn drawn_tile_points_get_their_counter_and_one_split() {
    for space in [
        "variants/hopper.toml",
        "variants/quick.toml",
        "variants/dynamic-tiles.toml",
    ] {
        let plan = h100_plan(space, &[64, 128]);
        let drawn = |p: &flashtune::model::space::PlannedPoint| set_to(p, "PERSISTENT_CTAS", 2);
        assert!(
            plan.iter().any(|p| drawn(p) && p.invalid.is_none()),
            "{space}"
        );
        for p in plan.iter().filter(|p| p.invalid.is_none()) {
            let launch = p.launch.as_ref().unwrap();
            assert_eq!(launch.split_counters, drawn(p), "{space}: {}", p.variant.id);
            if drawn(p) {
                assert!(launch.persistent, "{space}: {}", p.variant.id);
                assert_eq!(launch.kv_splits, 1, "{space}: {}", p.variant.id);
            }
            if switched_on(p, "PERSISTENT_CTAS") {
                assert!(
                    launch.persistent && !launch.split_counters,
                    "{space}: {}",
                    p.variant.id
                );
            }
        }
    }
}

/// Points that merge their splits in the forward kernel launch no combine kernel (forward.cu's
/// launch contract), and only they; the last-CTA merge, and only it, gets split counters. A
/// cluster over the worker's "auto" split, whose size a cluster cannot follow, is ruled out by
/// name; the last-CTA merge takes "auto". The wgmma path takes the head dims 96 and 256, and
/// a tile that does not fit at 256 is ruled out by its shared memory, by name.
#[test]
fn merged_points_launch_no_combine_and_no_other_point_does() {
    let plan = h100_plan("variants/merge.toml", &[64, 128]);
    assert!(plan.iter().all(|p| p.invalid.is_none()), "{plan:?}");
    assert!(
        plan.iter()
            .filter(|p| switched_on(p, "CLUSTER_COMBINE"))
            .count()
            >= 10
    );
    assert!(
        plan.iter()
            .filter(|p| switched_on(p, "LAST_CTA_COMBINE"))
            .count()
            >= 10
    );
    for p in &plan {
        let launch = p.launch.as_ref().unwrap();
        let (cluster, last) = (
            switched_on(p, "CLUSTER_COMBINE"),
            switched_on(p, "LAST_CTA_COMBINE"),
        );
        assert_eq!(
            launch.combine_in_forward,
            cluster || last,
            "{}",
            p.variant.id
        );
        assert_eq!(launch.split_counters, last, "{}", p.variant.id);
        if cluster {
            assert!(p.variant.id.ends_with("-cc1"), "{}", p.variant.id);
            assert!((2..=8).contains(&launch.kv_splits), "{}", p.variant.id);
        }
        if last {
            assert!(p.variant.id.ends_with("-lcc1"), "{}", p.variant.id);
        }
    }
    assert!(plan
        .iter()
        .any(|p| switched_on(p, "LAST_CTA_COMBINE") && p.launch.as_ref().unwrap().kv_splits == 0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auto-cluster.toml");
    let text = std::fs::read_to_string(repo().join("variants/merge.toml"))
        .unwrap()
        .replace(
            "KV_SPLIT = 4, STAGES = 2, CLUSTER_COMBINE = 1",
            "KV_SPLIT = \"auto\", STAGES = 2, CLUSTER_COMBINE = 1",
        )
        .replace("'CLUSTER_COMBINE == 0 || (", "'CLUSTER_COMBINE <= 1 || (");
    std::fs::write(&path, text).unwrap();
    let auto = Space::load(&path).unwrap();
    let plan = auto.plan(&[128u32].into_iter().collect(), &h100()).unwrap();
    let why: Vec<&str> = plan.iter().filter_map(|p| p.why_invalid()).collect();
    assert_eq!(why.len(), 2, "{plan:?}");
    assert!(
        why.iter()
            .all(|w| w.contains("combine_in_forward needs a fixed split count")),
        "{why:?}"
    );
    // Head dims 96 and 256 on wgmma: admitted, but a 128-key tile at 256 is out by its smem.
    let plan = h100_plan("variants/headdims.toml", &[96, 256]);
    let wgmma = |d: u32| {
        plan.iter()
            .filter(|p| {
                p.head_dim == d && p.variant.id.starts_with("wgmma-") && p.invalid.is_none()
            })
            .count()
    };
    assert!(wgmma(96) >= 7 && wgmma(256) >= 4, "{plan:?}");
    let big = plan
        .iter()
        .find(|p| p.variant.id == "wgmma-bm128-bn128-w12-ks1-s3-p1-t1" && p.head_dim == 256)
        .unwrap();
    assert!(big.why_invalid().unwrap().contains("<= 232448"), "{big:?}");
}

#[test]
fn unknown_shape_names_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    let original = std::fs::read_to_string(repo().join("variants/smoke.toml")).unwrap();
    std::fs::write(&path, original.replace("\"ragged\",", "\"raged\",")).unwrap();
    let space = Space::load(&path).unwrap();
    let (policies, _) = Policies::load(&repo().join("policies.toml")).unwrap();
    let e = space.select_shapes(&policies.shapes).unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, .. } if key == "shapes"),
        "{e}"
    );
    assert!(e.to_string().contains("no shape `raged`"), "{e}");
}

#[test]
fn baseline_must_be_a_point_of_the_space() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    let original = std::fs::read_to_string(repo().join("variants/smoke.toml")).unwrap();
    std::fs::write(
        &path,
        original.replace("KV_SPLIT = [1, 4]", "KV_SPLIT = [2, 4]"),
    )
    .unwrap();
    let e = Space::load(&path).unwrap_err();
    assert!(e.to_string().contains("baseline"), "{e}");
}

#[test]
fn defines_follow_the_kernel_convention() {
    let space = Space::load(&repo().join("variants/smoke.toml")).unwrap();
    let v = space
        .variants()
        .unwrap()
        .into_iter()
        .find(|v| v.id == space.baseline_id())
        .unwrap();
    let defines = space.forward_defines(&v, Dtype::Bf16, 128);
    assert!(defines.contains(&("DTYPE".into(), "DTYPE_BF16".into())));
    assert!(defines.contains(&("HEAD_DIM".into(), "128".into())));
    assert!(defines.contains(&("MMA".into(), "MMA_SCALAR".into())));
}

#[test]
fn persistent_points_launch_no_more_ctas_than_the_gpu_holds_and_every_other_point_one_a_tile() {
    let plan = h100_plan("variants/hopper.toml", &[64, 128]);
    let persistent_point =
        |p: &flashtune::model::space::PlannedPoint| !set_to(p, "PERSISTENT_CTAS", 0);
    let persistent: Vec<_> = plan
        .iter()
        .filter(|p| p.invalid.is_none() && persistent_point(p))
        .collect();
    assert!(persistent.len() >= 8, "{plan:?}");
    for p in &plan {
        let Some(launch) = p.launch.as_ref() else {
            continue;
        };
        assert_eq!(launch.persistent, persistent_point(p), "{}", p.variant.id);
        assert_eq!(
            launch.resident_ctas, 0,
            "a plan leaves the resident CTAs to the trial"
        );
        if launch.persistent {
            assert!(
                ["-pc1", "-pc2"].iter().any(
                    |pc| p.variant.id.ends_with(pc) || p.variant.id.contains(&format!("{pc}-"))
                ),
                "{}",
                p.variant.id
            );
        }
    }
    // The grid: large-128 (2 x 16 heads, 64 query blocks of 128) on 132 SMs holding one CTA each.
    let mut launch = persistent
        .iter()
        .find(|p| p.head_dim == 128 && p.variant.id.starts_with("wgmma-bm128"))
        .and_then(|p| p.launch.clone())
        .unwrap();
    launch.kv_splits = 1;
    launch.resident_ctas = 132;
    assert_eq!(launch.forward_grid(8192, 32), (132, 1, 1));
    // A split shares the resident CTAs; fewer tiles than CTAs take one CTA a tile.
    launch.kv_splits = 4;
    assert_eq!(launch.forward_grid(8192, 32), (33, 1, 4));
    assert_eq!(launch.forward_grid(1, 8), (8, 1, 4));
    // Unresolved (a plan's 0) still launches: one CTA.
    launch.resident_ctas = 0;
    assert_eq!(launch.forward_grid(8192, 32), (1, 1, 4));
    launch.persistent = false;
    assert_eq!(launch.forward_grid(8192, 32), (64, 32, 4));
}
