//! Noise-aware acceptance: a challenger replaces the champion only when its gain beats both the policy threshold and the noise seen.
//!
//! The noise is the champion's (HEAD's) own spread, never the challenger's: a challenger that makes
//! its timing noisy (an edit that spins in bursts) must not widen the band its own regression hides
//! in. A challenger much noisier than the champion is rejected as unstable.
use crate::gpu::check::percentile;
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
    /// The champion's relative p10..p90 spread: the noise a gain or a loss must beat.
    pub noise: f64,
    pub threshold: f64,
    pub reason: String,
    /// The challenger's relative p10..p90 spread (absent from logs before it was kept).
    #[serde(default)]
    pub challenger_noise: f64,
    /// The challenger's spread is far beyond the champion's ([`unstable`]): no figure of it counts.
    #[serde(default)]
    pub unstable: bool,
}

/// Whether a challenger spread `challenger` against a champion spread `champion` is unstable:
/// more than twice the champion's, and more than 5 points above it.
pub fn unstable(champion: f64, challenger: f64) -> bool {
    !(challenger <= (2.0 * champion).max(champion + 0.05))
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
            challenger_noise: f64::INFINITY,
            unstable: false,
        };
    }
    let (a, noise) = median_and_spread(&duel.champion_us);
    let (b, challenger_noise) = median_and_spread(&duel.challenger_us);
    let gain = a / b - 1.0;
    let unstable = unstable(noise, challenger_noise);
    let (accept, reason) = if unstable {
        (
            false,
            format!(
                "unstable: its p10..p90 spread {:.1}% is far beyond the champion's {:.1}% (gain {:+.1}%)",
                challenger_noise * 100.0,
                noise * 100.0,
                gain * 100.0
            ),
        )
    } else if gain <= threshold {
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
        challenger_noise,
        unstable,
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

/// Keep an edit only if its geomean gain beats both `threshold` and the median per-case noise (the
/// champion's), no case is unstable, and no case is slower by more than the larger of the
/// champion's noise and `threshold` (a gain on big shapes must not be paid for with a real loss on
/// small ones, nor a loss hidden in the challenger's own spread).
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
    let unstable: Vec<String> = cases
        .iter()
        .filter(|(_, v)| v.unstable)
        .map(|(name, v)| {
            format!(
                "{name} (spread {:.1}% against the champion's {:.1}%)",
                v.challenger_noise * 100.0,
                v.noise * 100.0
            )
        })
        .collect();
    let (accept, reason) = if !unstable.is_empty() {
        (false, format!("unstable on {}", unstable.join(", ")))
    } else if !regressions.is_empty() {
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
