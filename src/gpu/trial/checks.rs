//! A contender's checks outside the timed rounds: loading it with its launch resolved, the check set run twice, and the fresh and stress sets after timing.
use super::inputs::{generate_set, q_elements, rows, set_checksum, InputSet, Pools};
use super::{Buf, Comparison, Device, Earlier, Io, KernelId};
use crate::gpu::check;
use crate::model::config::Shape;
use crate::model::protocol::{CaseResult, CaseSpec, CheckStats, Stage, StageCheck, WROTE_OUTSIDE};
use crate::model::space::LaunchShape;
use anyhow::Result;

/// FlashAttention-2's split heuristic: split only when the grid fills less than ~80% of one wave,
/// then take the fewest splits whose wave efficiency is within 85% of the best.
pub fn auto_kv_splits(ctas: u32, slots: u32, kv_blocks: u32) -> u32 {
    if ctas as f64 >= 0.8 * slots as f64 {
        return 1;
    }
    let max_splits = 128.min(slots).min(kv_blocks).max(1);
    let efficiency = |splits: u32| {
        let waves = (ctas * splits) as f64 / slots as f64;
        waves / waves.ceil()
    };
    // A split count that leaves the per-split block count unchanged only adds combine work.
    let useful =
        |splits: u32| splits == 1 || kv_blocks.div_ceil(splits) != kv_blocks.div_ceil(splits - 1);
    let best = (1..=max_splits)
        .filter(|&s| useful(s))
        .map(efficiency)
        .fold(0.0, f64::max);
    (1..=max_splits)
        .find(|&s| useful(s) && efficiency(s) >= 0.85 * best)
        .unwrap_or(1)
}

/// A forward kernel loaded for one case, with its launch resolved and its check buffers.
pub(super) struct Contender {
    pub(super) kernel: KernelId,
    pub(super) launch: LaunchShape,
    /// Outputs of the two check runs; the first is reused by the later checks.
    pub(super) outs: [Io; 2],
}

/// Output buffers (and split partials) for one launch; the inputs are filled in per launch.
pub(super) fn alloc_outputs<D: Device>(
    dev: &mut D,
    shape: &Shape,
    launch: &LaunchShape,
) -> Result<Io> {
    let splits = launch.kv_splits as usize;
    let (qn, rows_n) = (q_elements(shape), rows(shape));
    let placeholder = Buf(usize::MAX);
    Ok(Io {
        q: placeholder,
        k: placeholder,
        v: placeholder,
        o: dev.alloc16(qn)?,
        lse: dev.alloc32(rows_n)?,
        o_accum: if splits > 1 {
            Some(dev.alloc32(splits * qn)?)
        } else {
            None
        },
        lse_accum: if splits > 1 {
            Some(dev.alloc32(splits * rows_n)?)
        } else {
            None
        },
        counters: if launch.split_counters {
            // Every kernel that takes the parameter gets the words. Zero once: a split merge counts
            // modulo the split count and never resets its words; a persistent kernel's tile counter
            // (word 0) is set back to 0 by the launch's last draw.
            let words = launch.tiles(shape.sq, shape.b * shape.h) as usize;
            let counters = dev.alloc32(words)?;
            dev.upload32(counters, &vec![0.0; words])?;
            Some(counters)
        } else {
            None
        },
    })
}

pub(super) fn free_outputs<D: Device>(dev: &mut D, io: &Io) {
    dev.free(io.o);
    dev.free(io.lse);
    io.o_accum
        .into_iter()
        .chain(io.lse_accum)
        .chain(io.counters)
        .for_each(|b| dev.free(b));
}

pub(super) fn poison_outputs<D: Device>(dev: &mut D, io: &Io) -> Result<()> {
    dev.poison(io.o)?;
    dev.poison(io.lse)?;
    for b in io.o_accum.into_iter().chain(io.lse_accum) {
        dev.poison(b)?;
    }
    Ok(())
}

pub(super) fn with_inputs(io: &Io, set: &InputSet) -> Io {
    Io {
        q: set.q,
        k: set.k,
        v: set.v,
        ..*io
    }
}

/// Compare the outputs in `io` with `set`'s reference on the device, and with an earlier run when
/// given, and judge them. The reference lay on the device while the kernel ran: it must still be
/// what was computed (its checksum, held on the host since), or nothing is judged against it.
fn verify<D: Device>(
    dev: &mut D,
    io: &Io,
    set: &InputSet,
    earlier: Option<Earlier>,
    case: &CaseSpec,
) -> Result<CheckStats> {
    if dev.checksum_all(&[set.reference.o, set.reference.lse])? != set.reference_checksum {
        let mut stats = CheckStats::default();
        stats.failures.push(format!(
            "{WROTE_OUTSIDE}: the reference of input set {} changed while the kernel ran",
            set.index
        ));
        stats.wrote_outside = true;
        return Ok(stats);
    }
    let mut stats = dev.compare(&Comparison {
        dtype: case.dtype,
        d: case.shape.d as usize,
        o: io.o,
        lse: io.lse,
        reference: set.reference,
        earlier,
        draw: Some(set.draw),
    })?;
    let (rows, rel, lse_gap) = set.ref_check;
    stats.reference_rows_checked = Some(rows);
    stats.reference_vs_cpu_rel_l2 = Some(rel);
    stats.reference_vs_cpu_lse = Some(lse_gap);
    check::judge(&mut stats, &case.tolerance, set.draw.max_lse_scale());
    Ok(stats)
}

/// Load the kernel, resolve `auto` splits, and run the first check: the check set twice, bit for
/// bit the same.
pub(super) fn enter<D: Device>(
    dev: &mut D,
    pools: &Pools,
    pool: usize,
    case: &CaseSpec,
    result: &mut CaseResult,
) -> Result<Contender> {
    let kernel = dev.load_forward(&case.forward)?;
    let shape = &case.shape;
    let mut launch = case.forward.launch.clone();
    if launch.kv_splits == 0 {
        let ctas_per_sm = dev.occupancy(kernel, &launch)?;
        let ctas = launch.tiles(shape.sq, shape.b * shape.h);
        launch.kv_splits = auto_kv_splits(
            ctas,
            dev.info().sm_count * ctas_per_sm.max(1),
            shape.sk.div_ceil(launch.kv_rows_per_block),
        );
    }
    if launch.persistent {
        launch.resident_ctas = dev.info().sm_count * dev.occupancy(kernel, &launch)?.max(1);
    }
    result.kv_splits = launch.kv_splits;
    result.function = dev.attributes(kernel)?;
    let outs = [
        alloc_outputs(dev, shape, &launch)?,
        alloc_outputs(dev, shape, &launch)?,
    ];
    let set0 = &pools.pools[pool].check;
    let first_outputs = [outs[0].o, outs[0].lse];
    let mut first_run = None;
    for out in &outs {
        poison_outputs(dev, out)?;
        dev.forward(kernel, shape, &launch, &with_inputs(out, set0))?;
        // The first run's outputs lie on the device through the second: checksummed into the host
        // before it, checked after it.
        first_run.get_or_insert(dev.checksum_all(&first_outputs)?);
    }
    let second_run = Earlier {
        o: outs[1].o,
        lse: outs[1].lse,
    };
    let mut stats = verify(dev, &outs[0], set0, Some(second_run), case)?;
    if Some(dev.checksum_all(&first_outputs)?) != first_run {
        stats.failures.insert(
            0,
            format!("{WROTE_OUTSIDE}: the first check run's outputs changed while the second ran"),
        );
        stats.wrote_outside = true;
    }
    // Named first when it happens: a kernel that writes into its inputs also changes what its
    // second run reads, and would otherwise pass for a race.
    if set_checksum(dev, set0.buffers())? != set0.checksum {
        stats.failures.insert(
            0,
            format!("{WROTE_OUTSIDE}: input set 0 changed during the check"),
        );
        stats.wrote_outside = true;
    }
    result.check = Some(stats);
    Ok(Contender {
        kernel,
        launch,
        outs,
    })
}

pub(super) fn leave<D: Device>(dev: &mut D, c: Contender) {
    c.outs.iter().for_each(|io| free_outputs(dev, io));
    dev.unload(c.kernel);
}

/// After timing, in the same module: a set it never saw written into the buffers it was checked
/// on, then the stress set (a third draw of the mixture). The check set is drawn again afterwards, as
/// it was.
pub(super) fn recheck<D: Device>(
    dev: &mut D,
    pools: &Pools,
    pool: usize,
    case: &CaseSpec,
    c: &Contender,
) -> Result<Vec<StageCheck>> {
    let shape = &case.shape;
    let p = &pools.pools[pool];
    let (set0, held_out, stress) = (&p.check, &p.held_out, &p.stress);
    for (from, to) in held_out.buffers().into_iter().zip(set0.buffers()) {
        dev.copy(from, to)?;
    }
    let io = with_inputs(&c.outs[0], set0);
    let fresh = (|| {
        poison_outputs(dev, &io)?;
        dev.forward(c.kernel, shape, &c.launch, &io)?;
        let mut stats = verify(dev, &io, held_out, None, case)?;
        // The buffers hold the held-out set: afterwards they must still (checksummed as it was drawn).
        if set_checksum(dev, set0.buffers())? != held_out.checksum {
            stats.failures.insert(
                0,
                format!("{WROTE_OUTSIDE}: the fresh set changed while it ran"),
            );
            stats.wrote_outside = true;
        }
        Ok::<_, anyhow::Error>(stats)
    })();
    // The check set as it was drawn, whatever the launch did: later variants are judged on it.
    generate_set(dev, set0.buffers(), p.key.dtype, &set0.draw)?;
    let fresh = fresh?;
    let io = with_inputs(&c.outs[0], stress);
    poison_outputs(dev, &io)?;
    dev.forward(c.kernel, shape, &c.launch, &io)?;
    let mut stressed = verify(dev, &io, stress, None, case)?;
    if set_checksum(dev, stress.buffers())? != stress.checksum {
        stressed.failures.insert(
            0,
            format!("{WROTE_OUTSIDE}: the stress set changed while it ran"),
        );
        stressed.wrote_outside = true;
    }
    Ok(vec![
        StageCheck {
            stage: Stage::Fresh,
            detail: "a set it never saw, in the buffers it was checked on".into(),
            stats: fresh,
        },
        StageCheck {
            stage: Stage::Stress,
            detail: "a third set from the one mixture every input is drawn from (its wide, \
                     aligned, spiky and outlier heads reach scores past exp's range)"
                .into(),
            stats: stressed,
        },
    ])
}
