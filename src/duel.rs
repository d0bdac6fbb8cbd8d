//! Judging one interleaved duel as the worker returned it: both sides must pass their checks and the challenger's figure must be plausible before the timing decides. Shared by `flashtune step` and the guided search.
use crate::config::Shape;
use crate::decide::{self, Duel, Verdict};
use crate::protocol::{CheckStats, DuelResult, TimingStats};

/// One pair's figures, or why it could not be judged.
#[derive(Default)]
pub struct PairOutcome {
    pub champion: Option<TimingStats>,
    pub challenger: Option<TimingStats>,
    pub challenger_check: Option<CheckStats>,
    pub verdict: Option<Verdict>,
    pub failure: Option<String>,
}

/// One duel judged: both sides must pass every check, the challenger's figure must be plausible,
/// and only then does the interleaved timing decide.
pub fn judge_pair(
    result: Option<&DuelResult>,
    outcome: &crate::executor::WorkerOutcome,
    threshold: f64,
    shape: &Shape,
    roofs: &crate::roofs::Roofs,
    margin: f64,
) -> PairOutcome {
    let Some(r) = result else {
        let why = outcome
            .trouble()
            .unwrap_or_else(|| "the worker did not answer for this case".to_owned());
        return PairOutcome {
            failure: Some(why),
            ..Default::default()
        };
    };
    let stats =
        |s: &[f64]| crate::check::summarize(s.to_vec(), r.launches_per_sample, shape.flops());
    // The edit's own failure first: it is the one being judged, and the clearest reason.
    let failure = if let Some(why) = r.challenger.failure() {
        Some(format!("the edit fails its checks: {why}"))
    } else if let Some(why) = r.champion.failure() {
        Some(format!(
            "HEAD's champion failed its check on these inputs: {why}"
        ))
    } else if let Some(e) = &r.error {
        Some(format!("the duel did not finish: {e}"))
    } else if r.champion.samples_us.is_empty() || r.challenger.samples_us.is_empty() {
        Some("no samples came back".into())
    } else {
        roofs
            .beyond(shape, r.dtype, &stats(&r.challenger.samples_us), margin)
            .map(|why| format!("the edit's figure is implausible: {why}"))
    };
    if failure.is_some() {
        return PairOutcome {
            challenger_check: r.challenger.check.clone(),
            failure,
            ..Default::default()
        };
    }
    let duel = Duel {
        champion_us: r.champion.samples_us.clone(),
        challenger_us: r.challenger.samples_us.clone(),
    };
    PairOutcome {
        champion: Some(stats(&r.champion.samples_us)),
        challenger: Some(stats(&r.challenger.samples_us)),
        challenger_check: r.challenger.check.clone(),
        verdict: Some(decide::judge(&duel, threshold)),
        failure: None,
    }
}
