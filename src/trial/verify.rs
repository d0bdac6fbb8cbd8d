//! What makes a timed figure count: which rounds are verified (drawn after they ran, `RoundSample`),
//! the copies kept of their outputs (`Kept`), the references computed from their inputs drawn again
//! where no kernel can reach them and the re-runs (`Verifier`), and the buffers no reference may
//! read (`Exposure`). The threat model is at the top of `trial`.
use super::{
    kv_elements, poison_outputs, q_elements, rows, Buf, CaseSpec, Comparison, Device, GraphId, Io,
    KernelId, MaskedReference,
};
use crate::check;
use crate::config::Shape;
use crate::protocol::{CheckStats, Stage, StageCheck};
use anyhow::{bail, Result};
use rand::Rng;

/// The buffers a kernel under test has been given, in a launch or a captured graph, until they are
/// freed. Architecture Invariant: the reference never reads memory the kernel under test can write;
/// both devices keep one of these and refuse a reference whose buffers are in it.
#[derive(Debug, Default)]
pub struct Exposure(std::collections::HashSet<Buf>);

impl Exposure {
    fn buffers(io: &Io) -> impl Iterator<Item = Buf> {
        [io.q, io.k, io.v, io.o, io.lse]
            .into_iter()
            .chain(io.o_accum)
            .chain(io.lse_accum)
            .chain(io.counters)
    }

    /// A kernel under test is given every buffer of `io`.
    pub fn give(&mut self, io: &Io) {
        self.0.extend(Self::buffers(io));
    }

    /// `buf` was freed: its handle may come back for other memory.
    pub fn forget(&mut self, buf: Buf) {
        self.0.remove(&buf);
    }

    /// Refuse a reference launch on `io` that would read or write a buffer a kernel was given.
    pub fn check_reference(&self, io: &Io) -> Result<()> {
        for (name, b) in [
            ("Q", io.q),
            ("K", io.k),
            ("V", io.v),
            ("O", io.o),
            ("LSE", io.lse),
        ] {
            if self.0.contains(&b) {
                bail!(
                    "the reference was given {name} in buffer {}, which a kernel under test was \
                     given: the reference never reads memory the kernel under test can write",
                    b.0
                );
            }
        }
        Ok(())
    }
}

/// What one side of the timed replays collected: samples, the first failure, the worst passing
/// launch, and the rounds kept for verification.
#[derive(Default)]
pub(super) struct Side {
    pub(super) samples: Vec<f64>,
    pub(super) failed: Option<StageCheck>,
    pub(super) worst: CheckStats,
    pub(super) kept: Kept,
}

/// Which rounds are verified: a uniform sample of `k` among every round that ran (reservoir
/// sampling), decided after each round has finished, with the OS's generator. However many rounds
/// run (racing may stop a case after a few), each is kept with the same chance, and no launch can
/// tell beforehand whether its round will be: nothing before or during a replay depends on it.
#[derive(Debug, Clone, Default)]
pub struct RoundSample {
    k: usize,
    offered: usize,
    /// The round in each place of the sample.
    rounds: Vec<usize>,
}

impl RoundSample {
    pub fn new(k: usize) -> Self {
        RoundSample {
            k,
            offered: 0,
            rounds: Vec::new(),
        }
    }

    /// Round `round` has finished: the place in the sample its outputs go to, if any (a place
    /// taken over drops the round that held it).
    pub fn offer(&mut self, round: usize, rng: &mut impl Rng) -> Option<usize> {
        self.offered += 1;
        if self.rounds.len() < self.k {
            self.rounds.push(round);
            return Some(self.rounds.len() - 1);
        }
        let j = rng.random_range(0..self.offered);
        (j < self.k).then(|| {
            self.rounds[j] = round;
            j
        })
    }

    /// The rounds kept, by place.
    pub fn rounds(&self) -> &[usize] {
        &self.rounds
    }
}

/// The kept rounds of one side: for each place of the sample, the seed its inputs were drawn from
/// and a copy of every launch's outputs (O, LSE), taken after the replay had finished.
#[derive(Default)]
pub(super) struct Kept {
    sample: RoundSample,
    seeds: Vec<u64>,
    /// Per place, per launch: where its outputs are copied (the pool's buffers).
    outputs: Vec<Vec<(Buf, Buf)>>,
    /// Per place: the reference comparison of each launch, and one checksum over the copies.
    checked: Vec<(Vec<CheckStats>, u64)>,
}

impl Kept {
    /// `outputs` holds `k` places of a round's launches each.
    pub(super) fn new(k: usize, outputs: Vec<Vec<(Buf, Buf)>>) -> Self {
        Kept {
            sample: RoundSample::new(k),
            outputs,
            ..Kept::default()
        }
    }

    /// After round `round`'s replay: keep its outputs if the sample takes it.
    pub(super) fn offer<D: Device>(
        &mut self,
        dev: &mut D,
        round: usize,
        seed: u64,
        ios: &[Io],
    ) -> Result<()> {
        let Some(place) = self.sample.offer(round, &mut rand::rng()) else {
            return Ok(());
        };
        if place == self.seeds.len() {
            self.seeds.push(seed);
        }
        self.seeds[place] = seed;
        for (io, &(o, lse)) in ios.iter().zip(&self.outputs[place]) {
            dev.copy(io.o, o)?;
            dev.copy(io.lse, lse)?;
        }
        Ok(())
    }

    /// How many rounds were kept.
    pub(super) fn verified(&self) -> usize {
        self.sample.rounds().len()
    }

    /// The places a round was kept in.
    fn places(&self) -> usize {
        self.seeds.len()
    }
}

/// Every launch's O and LSE, in launch order: one checksum over all of them moves when any bit does.
fn output_list(pairs: impl IntoIterator<Item = (Buf, Buf)>) -> Vec<Buf> {
    pairs.into_iter().flat_map(|(o, lse)| [o, lse]).collect()
}

/// What verification needs beside the sides' own launches: the reference kernel, Q, K and V of one
/// launch that no kernel under test is ever given, and scratch for one launch's reference.
pub(super) struct Verifier {
    reference_kernel: KernelId,
    /// The oracle's inputs: a kept launch's Q, K and V regenerated from its seed, here and only here.
    private: [Buf; 3],
    reference: Io,
}

impl Verifier {
    pub(super) fn new<D: Device>(
        dev: &mut D,
        reference_kernel: KernelId,
        shape: &Shape,
    ) -> Result<Self> {
        let placeholder = Buf(usize::MAX);
        let private = [
            dev.alloc16(q_elements(shape))?,
            dev.alloc16(kv_elements(shape))?,
            dev.alloc16(kv_elements(shape))?,
        ];
        Ok(Verifier {
            reference_kernel,
            private,
            reference: Io {
                q: placeholder,
                k: placeholder,
                v: placeholder,
                o: dev.alloc32(q_elements(shape))?,
                lse: dev.alloc32(rows(shape))?,
                o_accum: None,
                lse_accum: None,
                counters: None,
            },
        })
    }

    pub(super) fn free<D: Device>(self, dev: &mut D) {
        self.private.into_iter().for_each(|b| dev.free(b));
        dev.free(self.reference.o);
        dev.free(self.reference.lse);
    }

    /// The reference for launch `launch` of a round drawn from `seed`: its Q, K and V drawn again
    /// from the seed (as `Device::draw_inputs` drew them: buffer 3 launch + t is tensor 3 launch + t)
    /// into the private buffers, computed now and masked under fresh keys.
    fn reference_for<D: Device>(
        &mut self,
        dev: &mut D,
        seed: u64,
        launch: usize,
        case: &CaseSpec,
    ) -> Result<MaskedReference> {
        for (t, &buf) in self.private.iter().enumerate() {
            dev.generate(buf, case.dtype, seed, (3 * launch + t) as u64, 1.0)?;
        }
        let [q, k, v] = self.private;
        let scratch = Io {
            q,
            k,
            v,
            ..self.reference
        };
        dev.poison(scratch.o)?;
        dev.poison(scratch.lse)?;
        dev.reference(self.reference_kernel, &case.shape, case.dtype, &scratch)?;
        MaskedReference::mask(dev, scratch.o, scratch.lse)
    }

    /// The kept rounds' outputs against references for their inputs, regenerated from their seeds.
    /// Runs after every timed replay of every side and before any re-run: no launch of a kernel
    /// under test comes between a kept copy and its verdict. The first failure ends the side.
    pub(super) fn check_kept<D: Device>(
        &mut self,
        dev: &mut D,
        side: &mut Side,
        samples: usize,
        case: &CaseSpec,
    ) -> Result<()> {
        let kept = &mut side.kept;
        for place in 0..kept.places() {
            let launches = kept.outputs[place].len();
            let mut checked = Vec::with_capacity(launches);
            for launch in 0..launches {
                let reference = self.reference_for(dev, kept.seeds[place], launch, case)?;
                let (o, lse) = kept.outputs[place][launch];
                let mut stats = dev.compare(&Comparison {
                    dtype: case.dtype,
                    d: case.shape.d as usize,
                    o,
                    lse,
                    reference,
                    earlier: None,
                })?;
                check::judge(&mut stats, &case.tolerance, 1.0);
                if !stats.passed() {
                    side.failed = Some(StageCheck {
                        stage: Stage::Timed,
                        detail: format!(
                            "replay {} of {samples}, launch {} of {launches}",
                            kept.sample.rounds()[place] + 1,
                            launch + 1
                        ),
                        stats,
                    });
                    return Ok(());
                }
                if side.worst.elements == 0
                    || stats
                        .row_rel_l2_max
                        .total_cmp(&side.worst.row_rel_l2_max)
                        .is_gt()
                {
                    side.worst = stats.clone();
                }
                checked.push(stats);
            }
            let sum = dev.checksum_all(&output_list(kept.outputs[place].iter().copied()))?;
            kept.checked.push((checked, sum));
        }
        Ok(())
    }

    /// Each kept round run again, untimed, exactly as it ran timed (inputs drawn from its seed,
    /// outputs poisoned, L2 flushed): its outputs must match the kept copy bit for bit (a race), its
    /// inputs must be as drawn afterwards, and no kept copy may have changed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rerun_kept<D: Device>(
        &mut self,
        dev: &mut D,
        side: &mut Side,
        graph: GraphId,
        ios: &[Io],
        inputs: &[Buf],
        samples: usize,
        case: &CaseSpec,
    ) -> Result<()> {
        let kept = &side.kept;
        let rerun = output_list(ios.iter().map(|io| (io.o, io.lse)));
        for place in 0..kept.checked.len() {
            let replay = format!(
                "replay {} of {samples} run again on the same inputs",
                kept.sample.rounds()[place] + 1
            );
            dev.draw_inputs(inputs, case.dtype, kept.seeds[place])?;
            let drawn = dev.checksum_all(inputs)?;
            for io in ios {
                poison_outputs(dev, io)?;
            }
            dev.flush_l2()?;
            dev.sync()?;
            dev.replay(graph)?;
            if dev.checksum_all(inputs)? != drawn {
                side.failed = Some(Stage::Inputs.failed(format!(
                    "the inputs of the timed launches changed during the {replay}"
                )));
                return Ok(());
            }
            let (stats, sum) = &kept.checked[place];
            if dev.checksum_all(&rerun)? == *sum {
                continue;
            }
            // Bits moved: find the launch and count them, then tell a race (both runs right) from a
            // kernel that answers by round (the re-run wrong). A failure path: its cost does not matter.
            let seed = kept.seeds[place];
            for (launch, (io, &(o, lse))) in ios.iter().zip(&kept.outputs[place]).enumerate() {
                let (ro, rl) = (dev.read16(io.o)?, dev.read32(io.lse)?);
                let (ko, kl) = (dev.read16(o)?, dev.read32(lse)?);
                let differing = check::differing_bits((&ro, &rl), (&ko, &kl));
                if differing == 0 {
                    continue;
                }
                let reference = self.reference_for(dev, seed, launch, case)?;
                let mut rerun_stats = dev.compare(&Comparison {
                    dtype: case.dtype,
                    d: case.shape.d as usize,
                    o: io.o,
                    lse: io.lse,
                    reference,
                    earlier: None,
                })?;
                check::judge(&mut rerun_stats, &case.tolerance, 1.0);
                let (detail, stats) = if rerun_stats.passed() {
                    let mut stats = stats[launch].clone();
                    stats.nondeterministic_count = differing;
                    check::judge(&mut stats, &case.tolerance, 1.0);
                    (
                        format!("{replay}, launch {} of {}", launch + 1, ios.len()),
                        stats,
                    )
                } else {
                    (
                        format!(
                            "{replay}, launch {} of {}: right when timed, wrong when run again on \
                             the same inputs (a kernel that answers by round)",
                            launch + 1,
                            ios.len()
                        ),
                        rerun_stats,
                    )
                };
                side.failed = Some(StageCheck {
                    stage: Stage::Timed,
                    detail,
                    stats,
                });
                return Ok(());
            }
        }
        for (place, (_, sum)) in kept.checked.iter().enumerate() {
            if dev.checksum_all(&output_list(kept.outputs[place].iter().copied()))? != *sum {
                side.failed = Some(Stage::Inputs.failed(format!(
                    "the copy of replay {}'s outputs changed while the kept replays ran again",
                    kept.sample.rounds()[place] + 1
                )));
                return Ok(());
            }
        }
        Ok(())
    }
}
