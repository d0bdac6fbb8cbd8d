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

/// Champions whose title rests on a ratio that is not a ratio of kernels meet their rivals again,
/// interleaved in one worker on one GPU on the same inputs, before the champion table is committed:
/// - the leader of every other GPU the (shape, dtype) was timed on (two GPUs of one model still
///   differ by clocks, temperature and silicon, and one may flatter every case it times): a drift
///   duel with `placed` set;
/// - the runner-up, timed on the same GPU across a drift of the sentinel beyond
///   `[sentinel] max_drift`.
///
/// The `drift_duel` records decide ([`RunIndex::pick`]). A champion that loses hands the title to a
/// leader that may not have met the others yet, so rounds go on until every champion has met every
/// GPU's leader: each round adds a pair that never met, so the rounds end.
///
/// Returns the GPUs that duelled, for the timeline.
///
/// [`RunIndex::pick`]: crate::log::runindex::RunIndex::pick
pub async fn reduel_champions(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
) -> Result<Vec<u32>> {
    // A bound for the case no argument foresaw; each round costs one worker per GPU.
    const MOST_ROUNDS: usize = 16;
    let mut used = Vec::new();
    for _ in 0..MOST_ROUNDS {
        let meetings = meetings_due(project, events.records());
        if meetings.is_empty() {
            break;
        }
        for gpu in reduel_round(project, device, opts, events, meetings).await? {
            if !used.contains(&gpu) {
                used.push(gpu);
            }
        }
    }
    Ok(used)
}

/// Two cases of one (shape, dtype) that must meet on one GPU, and why.
struct Meeting {
    shape: Shape,
    dtype: crate::model::config::Dtype,
    champion: String,
    rival: String,
    drift: f64,
    placed: Option<(String, String)>,
    pair: DuelPair,
}

/// The meetings the log still owes: each pick's champion against the leaders of the other GPUs it
/// has not met, else against a runner-up timed across a drift.
fn meetings_due(project: &Project, log: &crate::log::runlog::LoadedLog) -> Vec<Meeting> {
    let ix = crate::log::runindex::RunIndex::new(log);
    let max_drift = project.policies.sentinel.max_drift;
    let mut due = Vec::new();
    for shape in &project.shapes {
        for &dtype in &project.policies.dtypes {
            let Some(pick) = ix.pick(&shape.name, dtype) else {
                continue;
            };
            let best = pick.best;
            let rivals: Vec<(&crate::log::runindex::Case, f64, Option<(String, String)>)> =
                if pick.unmet_leaders.is_empty() {
                    pick.runner_up
                        .filter(|r| !ix.met(&shape.name, dtype, best.variant, r.variant))
                        .and_then(|r| Some((r, drifted_apart(&ix, best, r, max_drift)?, None)))
                        .into_iter()
                        .collect()
                } else {
                    pick.unmet_leaders
                        .iter()
                        .map(|&l| {
                            let placed = ix.placed_of(best).zip(ix.placed_of(l));
                            (l, ix.drift_between(best, l).unwrap_or(0.0), placed)
                        })
                        .collect()
                };
            // Each a scan of the log: the champion's once, not once per rival.
            let Some(a) = (!rivals.is_empty())
                .then(|| logged_case(project, log, best.variant, shape, dtype))
                .flatten()
            else {
                continue;
            };
            for (rival, drift, placed) in rivals {
                let Some(b) = logged_case(project, log, rival.variant, shape, dtype) else {
                    continue;
                };
                due.push(Meeting {
                    shape: shape.clone(),
                    dtype,
                    champion: best.variant.to_owned(),
                    rival: rival.variant.to_owned(),
                    drift,
                    placed,
                    pair: DuelPair {
                        champion: a.spec.clone(),
                        challenger: b.spec,
                    },
                });
            }
        }
    }
    due
}

/// The meetings due, spread over the run's GPUs (each meeting on one of them, both sides
/// interleaved in one worker), the GPUs side by side; a `drift_duel` record each, in order.
/// Returns the GPUs given a meeting.
async fn reduel_round(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
    meetings: Vec<Meeting>,
) -> Result<Vec<u32>> {
    let measure = &project.policies.measure;
    let rounds = project.policies.step.rounds;
    // No more GPUs than meetings: each one given a meeting starts a worker.
    let gpus: Vec<u32> = opts.gpus(device).into_iter().take(meetings.len()).collect();
    // Meeting i goes to GPU i mod n.
    let share = |gpu: usize| meetings.iter().skip(gpu).step_by(gpus.len());
    let timeout = Duration::from_secs(project.timeouts.worker_s * 2);
    let duels = gpus.iter().enumerate().map(|(i, &gpu)| {
        let request = DuelRequest {
            measure: MeasureSpec {
                warmup_ms: measure.warmup_ms,
                samples: rounds,
                min_sample_us: measure.min_sample_us,
                verified_replays: measure.verified_replays,
            },
            rounds,
            pairs: share(i).map(|m| m.pair.clone()).collect(),
            stop_at_failure: false,
        };
        opts.executor.duel(gpu, request, timeout)
    });
    let outcomes = futures_util::future::join_all(duels).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        for (k, m) in share(i).enumerate() {
            // Which of the two is faster beyond the duel's own noise: no threshold on top.
            let judged = judge_pair(
                outcome.duels.get(k),
                outcome,
                0.0,
                &m.shape,
                &opts.run.roofs,
                project.policies.gates.plausibility_margin,
            );
            events.emit(Record::DriftDuel {
                shape: m.shape.name.clone(),
                dtype: m.dtype,
                champion: m.champion.clone(),
                runner_up: m.rival.clone(),
                drift: m.drift,
                champion_us: judged.champion.map(|t| t.median_us),
                runner_up_us: judged.challenger.map(|t| t.median_us),
                verdict: judged.verdict,
                failure: judged.failure,
                placed: m.placed.clone(),
            })?;
        }
    }
    Ok(gpus)
}

/// How far the sentinel moved between the timings of two cases of one GPU, when beyond
/// `max_drift`: their ratio is then partly the GPU's. `None` when it may stand as timed (cases of
/// two GPUs meet as leaders, whatever the sentinel says).
fn drifted_apart(
    ix: &crate::log::runindex::RunIndex,
    a: &crate::log::runindex::Case,
    b: &crate::log::runindex::Case,
    max_drift: f64,
) -> Option<f64> {
    if ix.placed_of(a) != ix.placed_of(b) {
        return None;
    }
    ix.drift_between(a, b).filter(|&d| d > max_drift)
}
