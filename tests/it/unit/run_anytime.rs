//! The tests of `src/run/anytime.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::log::runlog::RankReason;
use flashtune::model::config::Dtype;
use flashtune::model::space::{DeviceLimits, ParamValue, Space};
use flashtune::model::space::{Params, PlannedPoint};
use flashtune::run::anytime::*;
use std::collections::BTreeSet;
use std::path::Path;

fn smoke() -> (Space, Vec<PlannedPoint>) {
    let space = Space::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("variants/smoke.toml"))
        .expect("the smoke space loads");
    let limits = DeviceLimits {
        max_threads_per_block: 1024,
        max_smem_optin_bytes: 232448,
        arch: "sm_90a".into(),
    };
    let planned = space
        .plan(&BTreeSet::from([64]), &limits)
        .expect("the smoke space plans");
    (space, planned)
}

fn params_of(planned: &[PlannedPoint], id: &str) -> Params {
    planned
        .iter()
        .find(|p| p.variant.id == id)
        .map(|p| p.variant.params.clone())
        .unwrap_or_else(|| panic!("no {id}"))
}

fn champion(from: KnownFrom, params: Params, profile: Option<&str>) -> KnownChampion {
    KnownChampion {
        from,
        params,
        shape: "small".into(),
        dtype: Dtype::F16,
        median_us: 4.5,
        profile: profile.map(|b| ("r1".to_owned(), vec![b.to_owned()])),
    }
}

#[test]
fn committed_then_earlier_then_guided_then_spread() {
    let (space, planned) = smoke();
    let rule = flashtune::model::config::GuidedRule {
        bottleneck: "grid too small (waves < 1)".into(),
        name: "waves < 1: more KV splits".into(),
        change: [("KV_SPLIT".to_owned(), ParamValue::Name("up".into()))]
            .into_iter()
            .collect(),
    };
    let known = [
        // Listed first, but an earlier run's word counts for less than the committed table's.
        champion(
            KnownFrom::Run("r1".into()),
            params_of(&planned, "scalar-bm64-bn64-w4-ks1-s1"),
            Some("grid too small (waves < 1)"),
        ),
        champion(
            KnownFrom::Committed,
            params_of(&planned, "wmma-bm64-bn64-w4-ks4-s1"),
            None,
        ),
    ];
    let order = best_first(&space, &[rule], &planned, &known);
    let got: Vec<(&str, RankReason)> = order.iter().map(|r| (r.variant.as_str(), r.why)).collect();
    assert_eq!(
        got,
        [
            ("wmma-bm64-bn64-w4-ks4-s1", RankReason::Committed),
            ("scalar-bm64-bn64-w4-ks1-s1", RankReason::EarlierChampion),
            ("scalar-bm64-bn64-w4-ks4-s1", RankReason::Guided),
            ("wmma-bm64-bn64-w4-ks1-s1", RankReason::Spread),
        ]
    );
    assert_eq!(
        order.iter().map(|r| r.rank).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(order[0].reason.contains("committed champion for small f16"));
    assert!(order[1].reason.contains("run r1"), "{}", order[1].reason);
    assert!(
        order[2]
            .reason
            .starts_with("guided: waves < 1: more KV splits"),
        "{}",
        order[2].reason
    );
}

#[test]
fn without_evidence_the_order_spreads_over_the_space_and_times_the_baseline_last() {
    let (space, planned) = smoke();
    let order = best_first(&space, &[], &planned, &[]);
    let ids: Vec<&str> = order.iter().map(|r| r.variant.as_str()).collect();
    // The first differs from the baseline in both parameters that vary, then the rest; the
    // baseline, compared with rather than competing, last.
    assert_eq!(
        ids,
        [
            "wmma-bm64-bn64-w4-ks4-s1",
            "scalar-bm64-bn64-w4-ks4-s1",
            "wmma-bm64-bn64-w4-ks1-s1",
            "scalar-bm64-bn64-w4-ks1-s1",
        ]
    );
    assert_eq!(space.baseline_id(), "scalar-bm64-bn64-w4-ks1-s1");
    assert!(order[..3].iter().all(|r| r.why == RankReason::Spread));
    assert_eq!(order[3].why, RankReason::Baseline);
}
