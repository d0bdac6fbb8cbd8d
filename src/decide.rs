//! Noise-aware acceptance: a challenger replaces the champion only when its gain beats both the policy threshold and the noise seen.
use crate::check::percentile;
use serde::{Deserialize, Serialize};

/// Interleaved samples (A B A B ...) of the champion and the challenger, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Duel {
    pub champion_us: Vec<f64>,
    pub challenger_us: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub accept: bool,
    /// champion median / challenger median - 1 (0.05 = the challenger is 5% faster).
    pub gain: f64,
    /// The larger relative p10..p90 spread of the two sample sets.
    pub noise: f64,
    pub threshold: f64,
    pub reason: String,
}

fn median_and_spread(samples: &[f64]) -> (f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let median = percentile(&s, 50.0);
    (
        median,
        (percentile(&s, 90.0) - percentile(&s, 10.0)) / median,
    )
}

/// Accept only if the gain exceeds the policy threshold and the observed spread.
pub fn judge(duel: &Duel, threshold: f64) -> Verdict {
    if duel.champion_us.len() < 3 || duel.challenger_us.len() < 3 {
        return Verdict {
            accept: false,
            gain: 0.0,
            noise: f64::INFINITY,
            threshold,
            reason: "too few samples to judge".into(),
        };
    }
    let (a, spread_a) = median_and_spread(&duel.champion_us);
    let (b, spread_b) = median_and_spread(&duel.challenger_us);
    let gain = a / b - 1.0;
    let noise = spread_a.max(spread_b);
    let (accept, reason) = if gain <= threshold {
        (
            false,
            format!(
                "gain {:+.1}% is not above the {:.1}% threshold",
                gain * 100.0,
                threshold * 100.0
            ),
        )
    } else if gain <= noise {
        (
            false,
            format!(
                "gain {:+.1}% is within the noise ({:.1}% p10..p90 spread)",
                gain * 100.0,
                noise * 100.0
            ),
        )
    } else {
        (
            true,
            format!(
                "gain {:+.1}% beats the threshold ({:.1}%) and the noise ({:.1}%)",
                gain * 100.0,
                threshold * 100.0,
                noise * 100.0
            ),
        )
    };
    Verdict {
        accept,
        gain,
        noise,
        threshold,
        reason,
    }
}

/// An edit judged over every (shape, dtype) it was timed on.
#[derive(Debug, Clone, PartialEq)]
pub struct Overall {
    pub accept: bool,
    /// exp(mean ln(champion median / challenger median)) - 1.
    pub geomean_gain: f64,
    /// The median of the per-case noise figures.
    pub noise: f64,
    pub reason: String,
}

/// Keep an edit only if its geomean gain beats both `threshold` and the median per-case noise,
/// and no case is slower by more than the larger of its own noise and `threshold`
/// (a gain on big shapes must not be paid for with a real loss on small ones).
pub fn judge_overall(cases: &[(String, Verdict)], threshold: f64) -> Overall {
    if cases.is_empty() {
        return Overall {
            accept: false,
            geomean_gain: 0.0,
            noise: f64::INFINITY,
            reason: "no case was timed".into(),
        };
    }
    let geomean_gain =
        (cases.iter().map(|(_, v)| (1.0 + v.gain).ln()).sum::<f64>() / cases.len() as f64).exp()
            - 1.0;
    let mut noises: Vec<f64> = cases.iter().map(|(_, v)| v.noise).collect();
    noises.sort_by(f64::total_cmp);
    let noise = percentile(&noises, 50.0);
    let regressions: Vec<String> = cases
        .iter()
        .filter(|(_, v)| -v.gain > v.noise.max(threshold))
        .map(|(name, v)| format!("{name} {:+.1}%", v.gain * 100.0))
        .collect();
    let (accept, reason) = if !regressions.is_empty() {
        (
            false,
            format!("slower beyond noise on {}", regressions.join(", ")),
        )
    } else if geomean_gain <= threshold {
        (
            false,
            format!(
                "geomean gain {:+.1}% is not above the {:.1}% threshold",
                geomean_gain * 100.0,
                threshold * 100.0
            ),
        )
    } else if geomean_gain <= noise {
        (
            false,
            format!(
                "geomean gain {:+.1}% is within the noise (median p10..p90 spread {:.1}%)",
                geomean_gain * 100.0,
                noise * 100.0
            ),
        )
    } else {
        (
            true,
            format!(
                "geomean gain {:+.1}% over {} cases beats the threshold ({:.1}%) and the noise ({:.1}%), no case regresses",
                geomean_gain * 100.0,
                cases.len(),
                threshold * 100.0,
                noise * 100.0
            ),
        )
    };
    Overall {
        accept,
        geomean_gain,
        noise,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        };
        ("case".into(), v)
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
}
