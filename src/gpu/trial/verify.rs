//! What makes a timed figure count: which rounds are verified (drawn after they ran, `RoundSample`),
//! the copies kept of their outputs (`Kept`), the references computed from their inputs drawn again
//! where no kernel can reach them and the re-runs (`Verifier`), and the buffers no reference may
//! read (`Exposure`). The threat model is at the top of `trial`.
use super::checks::poison_outputs;
use super::inputs::{generate_set, geometry, kv_elements, q_elements, rows};
use super::mixture::LaunchDraw;
use super::{Buf, Comparison, Device, GraphId, Io, KernelId, MaskedReference};
use crate::gpu::check;
use crate::model::config::Shape;
use crate::model::protocol::{CaseSpec, CheckStats, Stage, StageCheck, VerifyParts};
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

/// `v` at length `n`: its own memory when it has room (pages touched already read back several
/// times faster), else fresh zeroed memory, whose pages the first read back touches on several
/// threads rather than a resize on one.
fn fit<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.capacity() >= n {
        v.resize(n, T::default());
    } else {
        *v = vec![T::default(); n];
    }
}

/// One launch's outputs as the host holds them: O's bits and the LSE.
#[derive(Clone, Default)]
pub(super) struct HostOutputs {
    pub(super) o: Vec<u16>,
    pub(super) lse: Vec<f32>,
}

impl HostOutputs {
    /// Every launch's outputs, launch i of `ios` into `held[i]`, in as few transfers as the device
    /// allows: into pageable host memory, which no kernel can map, each vector grown to the launch's
    /// sizes the first time and reused after (pages already touched read back several times faster).
    pub(super) fn read_all<D: Device>(
        dev: &mut D,
        ios: &[Io],
        held: &mut [HostOutputs],
        shape: &Shape,
    ) -> Result<()> {
        let mut reads = Vec::with_capacity(ios.len());
        for (io, h) in ios.iter().zip(held.iter_mut()) {
            fit(&mut h.o, q_elements(shape));
            fit(&mut h.lse, rows(shape));
            reads.push((io, h.o.as_mut_slice(), h.lse.as_mut_slice()));
        }
        dev.read_outputs_into(&mut reads)
    }

    fn differing_bits(&self, other: &HostOutputs) -> u64 {
        let bits = |lse: &[f32]| lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // The usual answer, by a plain comparison of the bytes; counted only when they differ.
        if crate::os::host_memory::equal(&self.o, &other.o) && bits(&self.lse) == bits(&other.lse) {
            return 0;
        }
        check::differing_bits((&self.o, &self.lse), (&other.o, &other.lse))
    }
}

/// The kept rounds of one side: for each place of the sample, the seed its inputs were drawn from
/// and every launch's outputs, read back into host memory as soon as the round was taken, before
/// any other launch. Architecture Invariant: the device is the kernel's, the harness owns only the
/// host: nothing kept for a later verdict stays where a kernel under test can write it.
#[derive(Default)]
pub(super) struct Kept {
    sample: RoundSample,
    seeds: Vec<u64>,
    /// Per place, per launch: the outputs as they were when the round ended.
    outputs: Vec<Vec<HostOutputs>>,
    /// Per place: the reference comparison of each launch.
    checked: Vec<Vec<CheckStats>>,
}

impl Kept {
    pub(super) fn new(k: usize) -> Self {
        Kept {
            sample: RoundSample::new(k),
            ..Kept::default()
        }
    }

    /// After round `round`'s replay: if the sample takes it, read its outputs back to the host now,
    /// over the place's earlier round if it had one.
    pub(super) fn offer<D: Device>(
        &mut self,
        dev: &mut D,
        round: usize,
        seed: u64,
        ios: &[Io],
        shape: &Shape,
        spare: &mut Vec<HostOutputs>,
    ) -> Result<()> {
        let Some(place) = self.sample.offer(round, &mut rand::rng()) else {
            return Ok(());
        };
        if place == self.seeds.len() {
            self.seeds.push(seed);
            let held = (0..ios.len()).map(|_| spare.pop().unwrap_or_default());
            self.outputs.push(held.collect());
        }
        self.seeds[place] = seed;
        HostOutputs::read_all(dev, ios, &mut self.outputs[place], shape)
    }

    /// How many rounds were kept.
    pub(super) fn verified(&self) -> usize {
        self.sample.rounds().len()
    }

    /// The places a round was kept in.
    fn places(&self) -> usize {
        self.seeds.len()
    }

    /// The host memory it holds, for the next case to read into.
    pub(super) fn recycle(&mut self, spare: &mut Vec<HostOutputs>) {
        spare.extend(self.outputs.drain(..).flatten());
    }
}

/// What verification needs beside the sides' own launches: the reference kernel, Q, K and V of one
/// launch that no kernel under test is ever given, and scratch for one launch's reference.
pub(super) struct Verifier {
    reference_kernel: KernelId,
    /// The oracle's inputs: a kept launch's Q, K and V regenerated from its seed, here and only here.
    private: [Buf; 3],
    reference: Io,
    /// Where the host's copy of a launch's outputs goes for its comparison, right before it: no
    /// kernel is ever given these, and none runs between the upload and the verdict.
    judged: (Buf, Buf),
    /// The time `check_kept` spent on references and on comparisons (a re-run's are the re-run's).
    spent: VerifyParts,
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
            judged: (dev.alloc16(q_elements(shape))?, dev.alloc32(rows(shape))?),
            spent: VerifyParts::default(),
        })
    }

    /// Frees its buffers; returns the time `check_kept` spent, by part.
    pub(super) fn free<D: Device>(self, dev: &mut D) -> VerifyParts {
        self.private.into_iter().for_each(|b| dev.free(b));
        dev.free(self.reference.o);
        dev.free(self.reference.lse);
        dev.free(self.judged.0);
        dev.free(self.judged.1);
        self.spent
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
        generate_set(
            dev,
            self.private,
            case.dtype,
            &launch_draw(case, seed, launch),
        )?;
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

    /// The kept rounds' outputs, as the host holds them, against references for their inputs
    /// regenerated from their seeds, read back beside them. The first failure ends the side.
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
                let seed = kept.seeds[place];
                let computing = std::time::Instant::now();
                let reference = self.reference_for(dev, seed, launch, case)?;
                let draw = launch_draw(case, seed, launch);
                let held = &kept.outputs[place][launch];
                // The upload would wait for the oracle anyway; waiting here times each apart.
                dev.sync()?;
                let comparing = std::time::Instant::now();
                let mut stats = self.compare_held(dev, case, held, &reference, &draw)?;
                self.spent.references_s += (comparing - computing).as_secs_f64();
                self.spent.comparisons_s += comparing.elapsed().as_secs_f64();
                check::judge(&mut stats, &case.tolerance, draw.max_lse_scale());
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
            kept.checked.push(checked);
        }
        Ok(())
    }

    /// Each kept round run again, untimed, exactly as it ran timed (inputs drawn from its seed,
    /// outputs poisoned, L2 flushed): its outputs, read back, must match the host's copy bit for bit
    /// (else a race, or a kernel that answers by round when the re-run is wrong), and its inputs must
    /// be as drawn afterwards.
    /// The re-runs' outputs go into host memory from `spare`, given back when they all matched.
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
        spare: &mut Vec<HostOutputs>,
    ) -> Result<()> {
        let mut again: Vec<HostOutputs> = (0..ios.len())
            .map(|_| spare.pop().unwrap_or_default())
            .collect();
        let kept = &side.kept;
        for place in 0..kept.checked.len() {
            let replay = format!(
                "replay {} of {samples} run again on the same inputs",
                kept.sample.rounds()[place] + 1
            );
            let seed = kept.seeds[place];
            dev.draw_inputs(inputs, case.dtype, seed, geometry(&case.shape))?;
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
            HostOutputs::read_all(dev, ios, &mut again, &case.shape)?;
            for (launch, held) in kept.outputs[place].iter().enumerate() {
                let differing = again[launch].differing_bits(held);
                if differing == 0 {
                    continue;
                }
                // Bits moved: tell a race (both runs right) from a kernel that answers by round (the
                // re-run wrong). A failure path: its cost does not matter.
                let reference = self.reference_for(dev, seed, launch, case)?;
                let draw = launch_draw(case, seed, launch);
                let mut rerun_stats =
                    self.compare_held(dev, case, &again[launch], &reference, &draw)?;
                let lse_scale = draw.max_lse_scale();
                check::judge(&mut rerun_stats, &case.tolerance, lse_scale);
                let (detail, stats) = if rerun_stats.passed() {
                    let mut stats = kept.checked[place][launch].clone();
                    stats.nondeterministic_count = differing;
                    check::judge(&mut stats, &case.tolerance, lse_scale);
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
        spare.extend(again);
        Ok(())
    }
}

impl Verifier {
    /// The host's copy of a launch's outputs against a reference computed on the device just now:
    /// the copy is uploaded into buffers no kernel is given and compared there by the device's
    /// comparison (the one every probe holds to the host's, `self_check_comparison`), with no launch
    /// of a kernel under test between the upload and the verdict. What is judged is what the host
    /// kept; uploading half the bytes beats reading the fp32 reference back.
    fn compare_held<D: Device>(
        &mut self,
        dev: &mut D,
        case: &CaseSpec,
        held: &HostOutputs,
        reference: &MaskedReference,
        draw: &LaunchDraw,
    ) -> Result<CheckStats> {
        let (o, lse) = self.judged;
        dev.upload16(o, &held.o)?;
        dev.upload32(lse, &held.lse)?;
        dev.compare(&Comparison {
            dtype: case.dtype,
            d: case.shape.d as usize,
            o,
            lse,
            reference: *reference,
            earlier: None,
            draw: Some(*draw),
        })
    }
}

/// Launch `launch` of a timed round drawn from `seed`: buffer 3 launch + t is tensor 3 launch + t.
fn launch_draw(case: &CaseSpec, seed: u64, launch: usize) -> LaunchDraw {
    LaunchDraw {
        seed,
        launch: launch as u64,
        geometry: geometry(&case.shape),
    }
}
