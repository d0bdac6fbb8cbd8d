//! The tests of `src/gpu/decide.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::decide::*;
use rand::{rngs::SmallRng, Rng, SeedableRng};

fn noisy(center: f64, rel_noise: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| center * (1.0 + rel_noise * (rng.random::<f64>() - 0.5)))
        .collect()
}

#[test]
fn a_clear_win_is_accepted() {
    let v = judge(
        &Duel {
            champion_us: noisy(100.0, 0.02, 40, 1),
            challenger_us: noisy(80.0, 0.02, 40, 2),
        },
        0.02,
    );
    assert!(v.accept, "{v:?}");
    assert!((v.gain - 0.25).abs() < 0.02);
}

#[test]
fn a_gain_inside_the_noise_is_rejected() {
    // 5% faster on median, but the samples spread over ±15%.
    let spread = |center: f64| {
        (0..41)
            .map(|i| center - 15.0 + 0.75 * i as f64)
            .collect::<Vec<_>>()
    };
    let v = judge(
        &Duel {
            champion_us: spread(100.0),
            challenger_us: spread(95.0),
        },
        0.01,
    );
    assert!(!v.accept, "{v:?}");
    assert!(v.reason.contains("noise"), "{}", v.reason);
}

#[test]
fn a_gain_below_the_threshold_is_rejected() {
    let v = judge(
        &Duel {
            champion_us: noisy(100.0, 0.001, 40, 5),
            challenger_us: noisy(99.0, 0.001, 40, 6),
        },
        0.02,
    );
    assert!(!v.accept);
    assert!(v.reason.contains("threshold"), "{}", v.reason);
}

#[test]
fn a_slowdown_is_never_accepted() {
    let v = judge(
        &Duel {
            champion_us: noisy(100.0, 0.01, 40, 7),
            challenger_us: noisy(130.0, 0.01, 40, 8),
        },
        0.0,
    );
    assert!(!v.accept && v.gain < 0.0);
}

fn verdict(gain: f64, noise: f64) -> (String, Verdict) {
    let v = Verdict {
        accept: gain > noise,
        gain,
        noise,
        threshold: 0.02,
        reason: String::new(),
        challenger_noise: noise,
        unstable: false,
    };
    ("case".into(), v)
}

/// The edit of issue 46: 13% slower on one shape, in bursts that spread its own samples by
/// about 35%, and faster elsewhere. Judged with the challenger's spread as the noise it was
/// accepted; with the champion's it is refused, as unstable and as a regression.
#[test]
fn a_regression_hidden_in_its_own_bursts_is_refused() {
    let steady = noisy(100.0, 0.02, 40, 11);
    let bursty: Vec<f64> = (0..40)
        .map(|i| {
            if i % 3 == 0 {
                150.0
            } else {
                100.0 + (i % 5) as f64
            }
        })
        .collect();
    let v = judge(
        &Duel {
            champion_us: steady.clone(),
            challenger_us: bursty.clone(),
        },
        0.01,
    );
    assert!(v.unstable && !v.accept, "{v:?}");
    assert!(v.reason.starts_with("unstable"), "{}", v.reason);
    let faster = judge(
        &Duel {
            champion_us: steady.clone(),
            challenger_us: noisy(80.0, 0.02, 40, 12),
        },
        0.01,
    );
    let o = judge_overall(
        &[
            ("large-64".into(), v.clone()),
            ("seed".into(), faster.clone()),
            ("ragged".into(), faster),
        ],
        0.01,
    );
    assert!(
        !o.accept && o.reason.contains("unstable on large-64"),
        "{o:?}"
    );
    // A slowdown beyond the champion's noise is a regression however noisy the challenger is.
    let mut slow = v;
    slow.unstable = false;
    slow.gain = -0.13;
    slow.challenger_noise = 0.35;
    assert!(!judge_overall(&[("large-64".into(), slow)], 0.01).accept);
}

#[test]
fn instability_is_twice_the_champions_spread_and_five_points_above_it() {
    assert!(!unstable(0.01, 0.06));
    assert!(unstable(0.01, 0.061));
    assert!(!unstable(0.10, 0.20));
    assert!(unstable(0.10, 0.21));
    assert!(unstable(0.01, f64::NAN));
}

#[test]
fn overall_needs_a_geomean_gain_beyond_threshold_and_noise() {
    let o = judge_overall(&[verdict(0.10, 0.01), verdict(0.05, 0.01)], 0.02);
    assert!(o.accept, "{o:?}");
    assert!((o.geomean_gain - (1.10f64 * 1.05).sqrt() + 1.0).abs() < 1e-9);
    assert!(!judge_overall(&[verdict(0.01, 0.001)], 0.02).accept);
    assert!(!judge_overall(&[verdict(0.05, 0.08)], 0.02).accept);
    assert!(!judge_overall(&[], 0.02).accept);
}

#[test]
fn overall_refuses_a_gain_paid_for_by_a_regression() {
    let o = judge_overall(&[verdict(0.30, 0.01), verdict(-0.05, 0.01)], 0.02);
    assert!(!o.accept && o.reason.contains("slower"), "{o:?}");
    // A slowdown inside the threshold is tolerated.
    assert!(judge_overall(&[verdict(0.30, 0.01), verdict(-0.01, 0.005)], 0.02).accept);
}
