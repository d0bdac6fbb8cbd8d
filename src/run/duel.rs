//! Judging one interleaved duel as the worker returned it: both sides must pass their checks and the challenger's figure must be plausible before the timing decides. Shared by `flashtune step` and the guided search; and the re-duel at the end of a run of champions timed across a drift or on two GPUs of a cluster.
use crate::error::Result;
use crate::gpu::decide::{self, Duel, Verdict};
use crate::log::runlog::Record;
use crate::model::config::Shape;
use crate::model::protocol::{
    CheckStats, DeviceInfo, DuelPair, DuelRequest, DuelResult, MeasureSpec, TimingStats,
};
use crate::run::shared::{logged_case, Events, Project, TuneOptions};
use std::time::Duration;

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
    outcome: &crate::gpu::executor::WorkerOutcome,
    threshold: f64,
    shape: &Shape,
    roofs: &crate::report::roofs::Roofs,
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
        |s: &[f64]| crate::gpu::check::summarize(s.to_vec(), r.launches_per_sample, shape.flops());
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

/// Champions whose case and runner-up's were timed on different sides of a drift of the sentinel
/// (their sentinels further apart than `[sentinel] max_drift`), or on two GPUs of a cluster (whose
/// chips differ by a few percent however steady each is), are re-timed against each other,
/// interleaved in one worker on one GPU on the same inputs, before the champion table is committed:
/// the `drift_duel` record decides which of the two holds the case.
pub async fn reduel_champions(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
) -> Result<()> {
    let log = events.records();
    let ix = crate::log::runindex::RunIndex::new(log);
    let max_drift = project.policies.sentinel.max_drift;
    let mut pairs = Vec::new();
    let mut names = Vec::new();
    for shape in &project.shapes {
        for &dtype in &project.policies.dtypes {
            let Some(pick) = ix.pick(&shape.name, dtype) else {
                continue;
            };
            let Some(runner_up) = pick.runner_up else {
                continue;
            };
            let (best, runner_up) = (pick.best.variant, runner_up.variant);
            let judged = ix.drift_duels.iter().any(|d| {
                d.shape == shape.name
                    && d.dtype == dtype
                    && [d.champion, d.runner_up].contains(&best)
                    && [d.champion, d.runner_up].contains(&runner_up)
            });
            let Some((drift, placed)) = reduel_reason(&ix, &pick, max_drift).filter(|_| !judged)
            else {
                continue;
            };
            let (Some(a), Some(b)) = (
                logged_case(project, log, best, shape, dtype),
                logged_case(project, log, runner_up, shape, dtype),
            ) else {
                continue;
            };
            pairs.push(DuelPair {
                champion: a.spec,
                challenger: b.spec,
            });
            names.push((
                shape.clone(),
                dtype,
                best.to_owned(),
                runner_up.to_owned(),
                drift,
                placed,
            ));
        }
    }
    if pairs.is_empty() {
        return Ok(());
    }
    let measure = &project.policies.measure;
    let rounds = project.policies.step.rounds;
    let request = DuelRequest {
        measure: MeasureSpec {
            warmup_ms: measure.warmup_ms,
            samples: rounds,
            min_sample_us: measure.min_sample_us,
            verified_replays: measure.verified_replays,
        },
        rounds,
        pairs,
        stop_at_failure: false,
    };
    let timeout = Duration::from_secs(project.timeouts.worker_s * 2);
    let outcome = opts.executor.duel(device.ordinal, request, timeout).await;
    for (i, (shape, dtype, champion, runner_up, drift, placed)) in names.into_iter().enumerate() {
        // Which of the two is faster beyond the duel's own noise: no threshold on top.
        let judged = judge_pair(
            outcome.duels.get(i),
            &outcome,
            0.0,
            &shape,
            &opts.run.roofs,
            project.policies.gates.plausibility_margin,
        );
        events.emit(Record::DriftDuel {
            shape: shape.name.clone(),
            dtype,
            champion,
            runner_up,
            drift,
            champion_us: judged.champion.map(|t| t.median_us),
            runner_up_us: judged.challenger.map(|t| t.median_us),
            verdict: judged.verdict,
            failure: judged.failure,
            placed,
        })?;
    }
    Ok(())
}

/// Why a pick's champion and runner-up must meet again: the sentinel's drift between their timings
/// beyond `max_drift`, or their timings on two GPUs (of this host or of a cluster): two GPUs of
/// one model still differ by clocks, temperature and silicon, so a ratio across them is not a
/// ratio of kernels. Returns the drift (0 where the
/// sentinel does not say) and the two GPUs when they differ; `None` when the pick may stand as timed.
pub fn reduel_reason(
    ix: &crate::log::runindex::RunIndex,
    pick: &crate::log::runindex::Pick,
    max_drift: f64,
) -> Option<(f64, Option<(String, String)>)> {
    let runner_up = pick.runner_up?;
    let drift = ix.drift_between(pick.best, runner_up);
    let placed = match (ix.placed_of(pick.best), ix.placed_of(runner_up)) {
        (Some(a), Some(b)) if a != b => Some((a, b)),
        _ => None,
    };
    let drifted = drift.is_some_and(|d| d > max_drift);
    (drifted || placed.is_some()).then(|| (drift.unwrap_or(0.0), placed))
}
