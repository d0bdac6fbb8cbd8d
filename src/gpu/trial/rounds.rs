//! The timed rounds: every contender's replays interleaved, each on inputs drawn anew and outputs poisoned, then the sampled rounds verified and run again.
use super::checks::{alloc_outputs, free_outputs, poison_outputs, with_inputs, Contender};
use super::inputs::{geometry, Pools};
use super::unpredictable::{self, Layout};
use super::verify::{Kept, Side, Verifier};
use super::{Device, Io, MIN_LAUNCHES};
use crate::gpu::check;
use crate::model::protocol::{
    CaseCosts, CaseSpec, MeasureSpec, RaceBar, RacedOut, Stage, StageCheck, VerifyParts,
};
use anyhow::Result;
use std::time::Instant;

/// Warm-up replays per graph, at most.
const MAX_WARMUP_REPLAYS: usize = 256;
/// Warm-up replays per graph, at least: the first replay of a new graph uploads it and loads the
/// module's code; the second is the first in steady state.
const MIN_WARMUP_REPLAYS: usize = 2;
/// Warm-up of each case after a worker's first: the GPU has been busy since (checks, references,
/// replays), so its clocks are up; only the new graph needs its first replays.
const REWARM_MS: f64 = 1.0;

/// The timed replays of every contender, and where racing stopped them.
pub(super) struct Timings {
    pub(super) launches: u32,
    /// Per contender: the per-launch samples and the timed-output check.
    pub(super) sides: Vec<(Vec<f64>, StageCheck)>,
    pub(super) raced: Option<RacedOut>,
}

/// Replays of every contender, interleaved (A B, B A, ...), each over `launches` launches with
/// inputs and outputs of their own, the inputs drawn anew before every replay, every replay alike.
/// With a `race` bar (one contender), the replays stop once the first `race.samples` put its p10
/// above the bar. Afterwards, `verified_replays` rounds per side, drawn from all that ran, are
/// verified and run again.
///
/// Over 150 lines on purpose: what makes a figure trustworthy here is the order of the steps
/// (buffers placed, graphs captured, inputs drawn, each round alike up to its replay, the keep
/// decided after it, the verification after every round, everything freed on every path), and it
/// reads as that order only in one piece.
#[allow(clippy::too_many_arguments)]
pub(super) fn time_interleaved<D: Device>(
    dev: &mut D,
    pools: &mut Pools,
    pool: usize,
    case: &CaseSpec,
    contenders: &[&Contender],
    samples: usize,
    race: Option<&RaceBar>,
    measure: &MeasureSpec,
    costs: &mut CaseCosts,
) -> Result<Timings> {
    let shape = &case.shape;
    let started = Instant::now();
    let first = contenders[0];
    let probe = with_inputs(&first.outs[0], &pools.pools[pool].check);
    let single_us = dev
        .time_forward(first.kernel, shape, &first.launch, &probe)?
        .max(0.5);
    // The same launch count on every side: each sample covers the same work.
    let wanted = ((measure.min_sample_us / single_us).ceil() as u32)
        .clamp(MIN_LAUNCHES, dev.launch_cap().max(MIN_LAUNCHES));
    let launches = pools.ensure_slots(dev, pool, wanted as usize)?;
    let warm = std::mem::replace(&mut pools.warm, true);
    let inputs = pools.pools[pool].slot_buffers(launches);
    let verified = measure.verified_replays.max(1).min(samples);
    let p = &pools.pools[pool];
    let spare = &mut pools.host_spare;
    let mut out: Vec<Side> = contenders
        .iter()
        .map(|_| Side {
            kept: Kept::new(verified),
            ..Side::default()
        })
        .collect();
    // This case's buffers in an order and with gaps of its own: where one lies relative to another
    // is nothing a kernel can learn once and count on.
    let mut layout = Layout::new();
    let mut verifier = None;
    let mut sides = Vec::new();
    let (mut replays_us, mut inputs_s) = (0.0, 0.0);
    let mut parts = VerifyParts::default();
    let mut raced = None;
    let timed = (|| -> Result<()> {
        let verifier_at = layout.place(contenders.len() + 1);
        for (at, c) in contenders.iter().enumerate() {
            if at == verifier_at {
                layout.pad(dev)?;
                verifier = Some(Verifier::new(dev, p.reference, shape)?);
            }
            let mut ios = Vec::with_capacity(launches);
            for [q, k, v] in &p.slots[..launches] {
                layout.pad(dev)?;
                let o = alloc_outputs(dev, shape, &c.launch)?;
                ios.push(Io {
                    q: *q,
                    k: *k,
                    v: *v,
                    ..o
                });
            }
            let graph = dev.capture(c.kernel, shape, &c.launch, &ios)?;
            sides.push((graph, ios));
        }
        if verifier.is_none() {
            layout.pad(dev)?;
            verifier = Some(Verifier::new(dev, p.reference, shape)?);
        }
        let verifier = verifier.as_mut().expect("allocated above");
        let drawing = Instant::now();
        dev.draw_inputs(&inputs, case.dtype, unpredictable::seed(), geometry(shape))?;
        inputs_s += drawing.elapsed().as_secs_f64();
        // The worker's first case warms the GPU up for `warmup_ms`; later ones only their graphs.
        let warmup_us = 1000.0
            * if warm {
                REWARM_MS.min(measure.warmup_ms)
            } else {
                measure.warmup_ms
            };
        for (graph, _) in &sides {
            let mut warm_us = 0.0;
            // A replay lasts at least min_sample_us, so a real GPU reaches the warm-up time long
            // before the cap; the cap keeps a device whose replays report almost no time (the
            // double) short. Nothing is verified or kept from the warm-up.
            for n in 0..MAX_WARMUP_REPLAYS {
                if n >= MIN_WARMUP_REPLAYS && warm_us >= warmup_us {
                    break;
                }
                warm_us += dev.replay(*graph)?;
            }
            replays_us += warm_us;
        }
        // Racing decides after `race.samples - 1` samples whether the next is the last. Which
        // rounds are verified is decided after each has run, over all of them: racing shortens a
        // case but never narrows the rounds that may be checked.
        let decide_at = race
            .filter(|_| contenders.len() == 1)
            .map(|bar| (bar.samples as usize).clamp(2, samples) - 1);
        let mut last = samples - 1;
        for round in 0..samples {
            if Some(round) == decide_at {
                let bar = race.expect("decide_at comes from a bar");
                let mut sofar = out[0].samples.clone();
                sofar.sort_by(f64::total_cmp);
                let p10 = check::percentile(&sofar, 10.0);
                if p10 > bar.p90_us {
                    last = round;
                    raced = Some(RacedOut {
                        samples: round as u32 + 1,
                        p10_us: p10,
                        bar: bar.clone(),
                    });
                }
            }
            if round > last {
                break;
            }
            // A B, then B A: drift falls on both sides alike.
            let order: Vec<usize> = if round % 2 == 0 {
                (0..sides.len()).collect()
            } else {
                (0..sides.len()).rev().collect()
            };
            for side in order {
                let (graph, ios) = &sides[side];
                // Every round alike, up to the end of its replay: a fresh draw, poisoned outputs,
                // a flushed L2, and nothing else the kernel could observe.
                let drawing = Instant::now();
                let seed = unpredictable::seed();
                dev.draw_inputs(&inputs, case.dtype, seed, geometry(shape))?;
                for io in ios {
                    poison_outputs(dev, io)?;
                }
                dev.flush_l2()?;
                dev.sync()?;
                inputs_s += drawing.elapsed().as_secs_f64();
                let us = dev.replay(*graph)?;
                replays_us += us;
                out[side].samples.push(us / launches as f64);
                // The kernel has finished: only now is it decided whether this round is kept.
                let keeping = Instant::now();
                out[side].kept.offer(dev, round, seed, ios, shape, spare)?;
                parts.keep_s += keeping.elapsed().as_secs_f64();
            }
        }
        for side in out.iter_mut() {
            verifier.check_kept(dev, side, samples, case)?;
        }
        let rerunning = Instant::now();
        for (side, (graph, ios)) in out.iter_mut().zip(&sides) {
            if side.failed.is_none() {
                verifier.rerun_kept(dev, side, *graph, ios, &inputs, samples, case, spare)?;
            }
        }
        parts.reruns_s += rerunning.elapsed().as_secs_f64();
        Ok(())
    })();
    if let Some(verifier) = verifier {
        let spent = verifier.free(dev);
        parts.references_s += spent.references_s;
        parts.comparisons_s += spent.comparisons_s;
    }
    let verify_s = parts.keep_s + parts.references_s + parts.comparisons_s + parts.reruns_s;
    out.iter_mut()
        .for_each(|side| side.kept.recycle(&mut pools.host_spare));
    layout.free(dev);
    for (graph, ios) in sides {
        dev.drop_graph(graph);
        ios.iter().for_each(|io| free_outputs(dev, io));
    }
    timed?;
    costs.inputs_s += inputs_s;
    costs.replays_s += replays_us / 1e6;
    costs.verify_s += verify_s;
    costs.verify_parts.add(&parts);
    costs.timing_overhead_s +=
        (started.elapsed().as_secs_f64() - replays_us / 1e6 - verify_s - inputs_s).max(0.0);
    let result = out
        .into_iter()
        .map(
            |Side {
                 samples: samples_us,
                 failed,
                 worst,
                 kept,
             }| {
                let verified = kept.verified();
                let ran = samples_us.len();
                let stage = failed.unwrap_or(StageCheck {
                    stage: Stage::Timed,
                    detail: format!(
                        "{verified} of the {ran} replays, drawn at random after they ran, all \
                         {launches} launches each, against references for their inputs drawn again \
                         into buffers no kernel was given, then run again on the same inputs; \
                         worst launch shown"
                    ),
                    stats: worst,
                });
                (samples_us, stage)
            },
        )
        .collect();
    Ok(Timings {
        launches: launches as u32,
        sides: result,
        raced,
    })
}
