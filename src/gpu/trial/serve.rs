//! Answering a worker's requests: one case checked, timed and re-checked, a duel of two kernels, a probe, roofs and the sentinel.
use super::checks::{enter, leave, recheck};
use super::inputs::{guard_inputs, Pools};
use super::rounds::{time_interleaved, Timings};
use super::self_check::self_check_comparison;
use super::{mixture, unpredictable, Device};
use crate::gpu::check;
use crate::model::protocol::{
    CaseCosts, CaseResult, CaseSpec, CheckStats, DuelPair, DuelResult, DuelSide, MeasureSpec,
    SentinelResult, Stage, WorkerMessage, WorkerRequest,
};
use anyhow::{anyhow, bail, Result};
use std::time::Instant;

/// Check, time, verify and re-check one variant on one case.
pub fn run_case<D: Device>(
    dev: &mut D,
    pools: &mut Pools,
    case: &CaseSpec,
    measure: &MeasureSpec,
) -> CaseResult {
    let mut result = CaseResult::empty(&case.shape.name, case.dtype, case.forward.launch.kv_splits);
    let mut pool_index = None;
    let outcome = (|| -> Result<()> {
        let started = Instant::now();
        let pool = pools.get(dev, case)?;
        pool_index = Some(pool);
        result.costs.inputs_s += started.elapsed().as_secs_f64();
        let started = Instant::now();
        let c = enter(dev, pools, pool, case, &mut result)?;
        result.costs.check_s += started.elapsed().as_secs_f64();
        let passed = result.check.as_ref().is_some_and(CheckStats::passed);
        let outcome = (|| -> Result<()> {
            if !passed || measure.samples == 0 {
                return Ok(());
            }
            let mut costs = std::mem::take(&mut result.costs);
            dev.gpu_state_begin();
            let Timings {
                launches,
                mut sides,
                raced,
            } = time_interleaved(
                dev,
                pools,
                pool,
                case,
                &[&c],
                unpredictable::rounds(measure.samples),
                case.race.as_ref(),
                measure,
                &mut costs,
            )?;
            result.raced = raced;
            // Right after the replays, before the checks: the state the figure was measured in.
            match dev.gpu_state() {
                Ok(state) => result.gpu_state = Some(state),
                Err(why) => result.gpu_state_missing = Some(why),
            }
            result.costs = costs;
            let (samples_us, timed) = sides.remove(0);
            let timed_ok = timed.stats.passed();
            result.stages.push(timed);
            if timed_ok {
                let started = Instant::now();
                result.stages.extend(recheck(dev, pools, pool, case, &c)?);
                result.costs.recheck_s += started.elapsed().as_secs_f64();
            }
            if result.failure().is_none() {
                result.timing = Some(check::summarize(samples_us, launches, case.shape.flops()));
            }
            Ok(())
        })();
        leave(dev, c);
        outcome
    })();
    if let Err(e) = outcome {
        result.error = Some(format!("{e:#}"));
        result.timing = None;
    }
    if let Some(pool) = pool_index {
        if let Some(why) = guard_inputs(dev, pools, pool) {
            if result.failure().is_none() {
                result.stages.push(Stage::Inputs.failed(why));
                result.timing = None;
            }
        }
    }
    result
}

/// Both sides checked as `run_case` checks one, then timed interleaved over the same sets.
pub fn duel<D: Device>(
    dev: &mut D,
    pools: &mut Pools,
    pair: &DuelPair,
    measure: &MeasureSpec,
    rounds: usize,
) -> DuelResult {
    let case = &pair.challenger;
    let mut result = DuelResult {
        shape: case.shape.name.clone(),
        dtype: case.dtype,
        champion: DuelSide::default(),
        challenger: DuelSide::default(),
        launches_per_sample: 0,
        error: None,
    };
    let mut pool_index = None;
    let outcome = (|| -> Result<()> {
        if pair.champion.shape != case.shape || pair.champion.dtype != case.dtype {
            bail!("a duel pairs two kernels on one shape and dtype");
        }
        let pool = pools.get(dev, case)?;
        pool_index = Some(pool);
        let mut scratch = CaseResult::empty(&case.shape.name, case.dtype, 0);
        let challenger = enter(dev, pools, pool, case, &mut scratch)?;
        result.challenger.check = scratch.check.take();
        let champion = match enter(dev, pools, pool, &pair.champion, &mut scratch) {
            Ok(c) => c,
            Err(e) => {
                leave(dev, challenger);
                return Err(e);
            }
        };
        result.champion.check = scratch.check.take();
        let outcome = (|| -> Result<()> {
            if result.challenger.failure().is_some() || result.champion.failure().is_some() {
                return Ok(());
            }
            let mut costs = CaseCosts::default();
            let Timings {
                launches, sides, ..
            } = time_interleaved(
                dev,
                pools,
                pool,
                case,
                &[&champion, &challenger],
                unpredictable::rounds(rounds),
                None,
                measure,
                &mut costs,
            )?;
            result.launches_per_sample = launches;
            for ((samples_us, timed), (side, contender, spec)) in sides.into_iter().zip([
                (&mut result.champion, &champion, &pair.champion),
                (&mut result.challenger, &challenger, case),
            ]) {
                let ok = timed.stats.passed();
                side.stages.push(timed);
                if ok {
                    side.stages
                        .extend(recheck(dev, pools, pool, spec, contender)?);
                }
                if side.failure().is_none() {
                    side.samples_us = samples_us;
                }
            }
            Ok(())
        })();
        leave(dev, champion);
        leave(dev, challenger);
        outcome
    })();
    if let Err(e) = outcome {
        result.error = Some(format!("{e:#}"));
    }
    if let Some(pool) = pool_index {
        if let Some(why) = guard_inputs(dev, pools, pool) {
            result.error.get_or_insert(format!(
                "one of the two kernels wrote outside its outputs: {why}"
            ));
        }
    }
    if result.error.is_some() {
        result.champion.samples_us.clear();
        result.challenger.samples_us.clear();
    }
    result
}

/// Serve requests, one JSON line each, until stdin closes; replies go to `reply`.
pub fn serve<D: Device>(
    mut dev: D,
    requests: impl std::io::BufRead,
    reply: &mut dyn FnMut(&WorkerMessage),
    pool_cap_bytes: u64,
) -> std::process::ExitCode {
    let mut pools = Pools::new(pool_cap_bytes);
    for line in requests.lines() {
        let line = match line {
            Ok(l) if l.trim().is_empty() => continue,
            Ok(l) => l,
            Err(e) => {
                reply(&WorkerMessage::Fatal {
                    message: format!("cannot read a request: {e}"),
                });
                return std::process::ExitCode::from(2);
            }
        };
        let request: WorkerRequest = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                reply(&WorkerMessage::Fatal {
                    message: format!("bad request: {e}"),
                });
                return std::process::ExitCode::from(2);
            }
        };
        reply(&WorkerMessage::Device(dev.info().clone()));
        if let Err(fatal) = answer(&mut dev, &mut pools, request, reply) {
            reply(&WorkerMessage::Fatal {
                message: format!("{fatal:#}"),
            });
            return std::process::ExitCode::from(1);
        }
        reply(&WorkerMessage::Done);
    }
    std::process::ExitCode::SUCCESS
}

/// One request; `Err` when the worker cannot go on (a sticky CUDA error the health check confirms).
fn answer<D: Device>(
    dev: &mut D,
    pools: &mut Pools,
    request: WorkerRequest,
    reply: &mut dyn FnMut(&WorkerMessage),
) -> Result<()> {
    match request {
        WorkerRequest::Probe => {
            dev.health_check()?;
            self_check_comparison(dev)?;
            if !dev.info().fake {
                mixture::self_check(dev)?;
            }
            Ok(())
        }
        WorkerRequest::Roofs { dtypes } => {
            reply(&WorkerMessage::Roofs {
                roofs: dev.roofs(&dtypes),
            });
            Ok(())
        }
        WorkerRequest::Sentinel { reps } => {
            dev.gpu_state_begin();
            let result = match dev.sentinel(reps.max(1)) {
                Ok(figures) => SentinelResult {
                    figures,
                    gpu_state: dev.gpu_state().ok(),
                    error: None,
                },
                Err(e) => SentinelResult {
                    error: Some(format!("{e:#}")),
                    ..Default::default()
                },
            };
            reply(&WorkerMessage::Sentinel(result));
            Ok(())
        }
        WorkerRequest::Run(req) => {
            for case in &req.cases {
                let result = run_case(dev, pools, case, &req.measure);
                let failed_in_cuda = result.error.is_some();
                reply(&WorkerMessage::Case(Box::new(result)));
                if failed_in_cuda {
                    // A sticky error (illegal address, trap) poisons the context: stop unless the GPU still computes.
                    dev.health_check().map_err(|e| {
                        anyhow!("GPU failed its health check after a kernel error: {e:#}")
                    })?;
                }
            }
            Ok(())
        }
        WorkerRequest::Duel(req) => {
            for pair in &req.pairs {
                let result = duel(dev, pools, pair, &req.measure, req.rounds);
                let failed_in_cuda = result.error.is_some();
                let unjudgeable = failed_in_cuda
                    || result.challenger.failure().is_some()
                    || result.champion.failure().is_some();
                reply(&WorkerMessage::Duel(Box::new(result)));
                if failed_in_cuda {
                    dev.health_check().map_err(|e| {
                        anyhow!("GPU failed its health check after a kernel error: {e:#}")
                    })?;
                }
                if req.stop_at_failure && unjudgeable {
                    break;
                }
            }
            Ok(())
        }
    }
}
