//! One case's trial on a device (a GPU, or the CPU test double): a check, timed replays on inputs drawn anew before each one, the outputs of rounds sampled after they ran read back to the host and verified there against references computed from their inputs drawn again, a re-check on fresh inputs in the same loaded module, and a third set; the duel runs two kernels through the same trial, interleaved.
//!
//! Why each step exists (assume the kernel under test is trying to fool us, has read this file, can
//! read and write every byte of device memory in its context, and keeps state across launches):
//! - the device is the kernel's, the harness owns only the host: nothing kept for a later verdict
//!   stays on the device, and device state the harness needs across a launch is checksummed into
//!   the host before it and checked after it;
//! - every input, the check, held-out and stress sets and every timed launch alike, is drawn from
//!   one mixture (`mixture`): plain, wide, aligned, spiky-channel and outlier-token heads, so no set
//!   can be told from another and a kernel wrong on one kind of input meets it in every round;
//! - every timed launch reads inputs of its own and writes outputs of its own, so nothing a launch
//!   computed can stand in for another's;
//! - before every replay, outside the timed region, the Q, K and V of every launch are drawn anew on
//!   the device from a seed the OS supplies, and the outputs are poisoned: no timed launch runs on
//!   inputs any launch has seen, so an answer remembered from earlier inputs (a memo keyed on
//!   pointers, on content, or on content up to a fixed transform) is never the right one, and
//!   skipped work leaves poison;
//! - every round is alike up to the end of its replay (draw, poison, L2 flush, replay, nothing
//!   else); only after it has run is it decided, with the OS's generator, whether its outputs are
//!   kept: a uniform sample of `verified_replays` among all the rounds that ran (`RoundSample`), so
//!   no launch can tell a verified round from a timed one, and racing never narrows the choice. A
//!   kept round's outputs are read back to pageable host memory right then, before the next launch;
//! - how many rounds a case runs, and where its buffers lie, are drawn per case (`unpredictable`);
//! - after the last timed replay of every side, each kept round's every launch is compared on the
//!   host with the reference the fp32 kernel computes from that launch's inputs drawn again from the
//!   round's seed into buffers no kernel is ever given (both devices refuse otherwise, `Exposure`),
//!   each head's LSE error scaled by how much its mixture component grows a score's rounding;
//! - each kept round then runs again, untimed, exactly as it ran: its outputs, read back, must be
//!   the host copy's bits (else a race, or a kernel that answers by round when the re-run is wrong),
//!   and its inputs as drawn afterwards;
//! - the input sets' references lie on the device XORed with mask words under keys from the OS (a
//!   kernel that finds them finds noise) and checksummed at drawing: a comparison against one that
//!   changed since is refused. Every probe holds the device's comparison to the host's on crafted
//!   outputs first (`self_check_comparison`), and the GPU's input mixture to the host's
//!   (`mixture::self_check`);
//! - after timing, a set the module never saw is written into the buffers it was checked on (a
//!   result cached per pointer is then stale), and a third set is checked; both are checksummed
//!   after their launch;
//! - the check, held-out and stress sets are checksummed after each case: a kernel that writes
//!   outside its outputs is caught and the sets are drawn again.
//!
//! The check, held-out and stress sets are drawn once per (shape, dtype, seed) and shared by every
//! variant a worker runs: their fp32 references are computed once, and checked against the CPU f64
//! oracle once (only the rows the oracle recomputes are read back). The reference kernel that is
//! held to the oracle there computes the timed launches' references too.
use crate::gpu::check;
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::{
    CheckStats, DeviceInfo, ForwardKernel, FunctionAttributes, GpuState, ReferenceKernel,
    RoofMeasured, SentinelFigure,
};
use crate::model::space::LaunchShape;
use anyhow::{anyhow, bail, Result};
use rand::Rng;

mod checks;
mod inputs;
pub mod mixture;
mod rounds;
mod self_check;
mod serve;
pub mod unpredictable;
mod verify;
pub use checks::auto_kv_splits;
pub use inputs::{geometry, InputSet, Pool, Pools};
use mixture::{Geometry, LaunchDraw};
pub use self_check::{self_check_comparison, COMPARISON_DISAGREES};
pub use serve::{duel, run_case, serve};
pub use verify::{Exposure, RoundSample};

/// A device buffer, by handle; the device owns the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buf(pub usize);

/// A loaded kernel (forward with its combine, or the reference), by handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub usize);

/// A captured sequence of launches, by handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphId(pub usize);

/// What one forward launch reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct Io {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub o: Buf,
    pub lse: Buf,
    /// Split-KV partials, when the launch splits.
    pub o_accum: Option<Buf>,
    pub lse_accum: Option<Buf>,
    /// One zeroed word per (query block, batch x head) for a launch that merges its splits in
    /// the split that finishes last (`LaunchShape::split_counters`); never poisoned.
    pub counters: Option<Buf>,
}

/// A set's fp32 reference as it lies on the device: XORed with mask words under keys only the
/// comparison is given (`check::mask_word`), so no kernel under test can copy the answer from it.
#[derive(Clone, Copy, Debug)]
pub struct MaskedReference {
    pub o: Buf,
    pub lse: Buf,
    pub o_key: u64,
    pub lse_key: u64,
}

impl MaskedReference {
    /// Mask a plain reference in place under fresh keys from the OS, never from the run's seed:
    /// nothing a kernel can know undoes the mask.
    pub fn mask<D: Device + ?Sized>(dev: &mut D, o: Buf, lse: Buf) -> Result<Self> {
        let reference = MaskedReference {
            o,
            lse,
            o_key: rand::rng().random(),
            lse_key: rand::rng().random(),
        };
        dev.mask(o, reference.o_key)?;
        dev.mask(lse, reference.lse_key)?;
        Ok(reference)
    }
}

/// An earlier run of the same launch on the same inputs: its outputs must match these bit for bit.
#[derive(Clone, Copy, Debug)]
pub struct Earlier {
    pub o: Buf,
    pub lse: Buf,
}

/// One forward output to compare with its reference and maybe an earlier run.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    pub dtype: Dtype,
    pub d: usize,
    pub o: Buf,
    pub lse: Buf,
    pub reference: MaskedReference,
    pub earlier: Option<Earlier>,
    /// The inputs' draw, whose heads' LSE scales the comparison divides each row's LSE error by;
    /// none: 1.
    pub draw: Option<LaunchDraw>,
}

impl Comparison {
    pub fn lse_scales(&self) -> Vec<f64> {
        self.draw.map(|d| d.lse_scales()).unwrap_or_default()
    }
}

/// The comparison on the host: read back, unmask, `check::compare`; the earlier run by
/// `check::differing_bits`. The fake GPU's comparison, and what the GPU's own is held to at every
/// probe ([`self_check_comparison`]).
pub fn compare_on_host<D: Device + ?Sized>(dev: &mut D, job: &Comparison) -> Result<CheckStats> {
    let (o, lse) = (dev.read16(job.o)?, dev.read32(job.lse)?);
    let (mut ref_o, mut ref_lse) = (dev.read32(job.reference.o)?, dev.read32(job.reference.lse)?);
    check::apply_mask(&mut ref_o, job.reference.o_key, 0);
    check::apply_mask(&mut ref_lse, job.reference.lse_key, 0);
    if job.d == 0
        || o.len() != lse.len() * job.d
        || ref_o.len() != o.len()
        || ref_lse.len() != lse.len()
    {
        bail!(
            "compare: {} outputs and {} LSE rows against {} and {} of the reference, rows of {}",
            o.len(),
            lse.len(),
            ref_o.len(),
            ref_lse.len(),
            job.d
        );
    }
    let scales = job.lse_scales();
    let mut stats = check::compare(job.dtype, job.d, &o, &lse, &ref_o, &ref_lse, &scales);
    if let Some(e) = job.earlier {
        let (eo, el) = (dev.read16(e.o)?, dev.read32(e.lse)?);
        if eo.len() != o.len() || el.len() != lse.len() {
            bail!("compare: the earlier run's buffers differ in size");
        }
        stats.nondeterministic_count = check::differing_bits((&o, &lse), (&eo, &el));
    }
    Ok(stats)
}

/// `got` into `out`, which must be as long.
fn copy_whole<T: Copy>(got: Vec<T>, out: &mut [T]) -> Result<()> {
    if got.len() != out.len() {
        bail!("read of {} elements into {}", got.len(), out.len());
    }
    out.copy_from_slice(&got);
    Ok(())
}

/// What a trial needs from a device. The GPU worker implements it with CUDA; the test double with
/// host memory and kernel models, so CI runs the very same trial on real arrays.
pub trait Device {
    fn info(&self) -> &DeviceInfo;
    /// 16-bit elements (inputs, O).
    fn alloc16(&mut self, len: usize) -> Result<Buf>;
    /// 32-bit float elements (LSE, partials, reference outputs).
    fn alloc32(&mut self, len: usize) -> Result<Buf>;
    fn free(&mut self, buf: Buf);
    /// A draw of the input mixture (`mixture`) rounded to `dtype`, the tensor as heads of rows of
    /// `geometry.d`: a pure function of (seed, tensor, element index).
    fn generate(
        &mut self,
        buf: Buf,
        dtype: Dtype,
        seed: u64,
        tensor: u64,
        geometry: Geometry,
    ) -> Result<()>;
    fn poison(&mut self, buf: Buf) -> Result<()>;
    /// Every buffer of `bufs` (16-bit) drawn anew from `seed`, buffer i as tensor i, as `generate`
    /// draws one: the timed launches' inputs, before each replay. The GPU draws them all in one
    /// launch.
    fn draw_inputs(
        &mut self,
        bufs: &[Buf],
        dtype: Dtype,
        seed: u64,
        geometry: Geometry,
    ) -> Result<()> {
        for (i, &b) in bufs.iter().enumerate() {
            self.generate(b, dtype, seed, i as u64, geometry)?;
        }
        Ok(())
    }
    fn copy(&mut self, src: Buf, dst: Buf) -> Result<()>;
    /// Wait for the device's queued work (a draw before a replay), so its time is counted where it
    /// was spent and not in the replay's wait.
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
    /// Push what the last writes left in the L2 cache out of it: a replay must not start on inputs
    /// the draw just wrote into L2, which the reference library's rotating calls never get.
    fn flush_l2(&mut self) -> Result<()> {
        Ok(())
    }
    /// Changes when any word of the buffer changes.
    fn checksum(&mut self, buf: Buf) -> Result<u64>;
    /// One figure over every buffer of `bufs` that changes when any word of any of them changes;
    /// only ever compared with itself over the same list.
    fn checksum_all(&mut self, bufs: &[Buf]) -> Result<u64> {
        let mut sum = 0u64;
        for (i, &b) in bufs.iter().enumerate() {
            sum ^= self.checksum(b)?.rotate_left((21 * i % 64) as u32);
        }
        Ok(sum)
    }
    fn read16(&mut self, buf: Buf) -> Result<Vec<u16>>;
    /// `len` elements of a 16-bit buffer from `start`: the oracle reads a few heads, not a tensor.
    fn read16_range(&mut self, buf: Buf, start: usize, len: usize) -> Result<Vec<u16>> {
        let all = self.read16(buf)?;
        all.get(start..start + len)
            .map(<[u16]>::to_vec)
            .ok_or_else(|| anyhow!("read of {len} elements at {start} is past buffer {}", buf.0))
    }
    fn read32(&mut self, buf: Buf) -> Result<Vec<f32>>;
    /// The whole of a 16-bit buffer into `out`, which must be its length: host memory the caller
    /// keeps and reuses (pages already touched read back several times faster than a new vector).
    fn read16_into(&mut self, buf: Buf, out: &mut [u16]) -> Result<()> {
        copy_whole(self.read16(buf)?, out)
    }
    /// As [`Device::read16_into`], for a 32-bit buffer.
    fn read32_into(&mut self, buf: Buf, out: &mut [f32]) -> Result<()> {
        copy_whole(self.read32(buf)?, out)
    }
    /// Several launches' outputs at once, each O and LSE into host memory of its length, as
    /// [`Device::read16_into`] and [`Device::read32_into`] would; the GPU moves as many as its
    /// staging buffer holds in one transfer (a kept round of a small shape is tens of launches).
    fn read_outputs_into(&mut self, reads: &mut [(&Io, &mut [u16], &mut [f32])]) -> Result<()> {
        for (io, o, lse) in reads.iter_mut() {
            self.read16_into(io.o, o)?;
            self.read32_into(io.lse, lse)?;
        }
        Ok(())
    }
    fn read32_range(&mut self, buf: Buf, start: usize, len: usize) -> Result<Vec<f32>> {
        let all = self.read32(buf)?;
        all.get(start..start + len)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| anyhow!("read of {len} floats at {start} is past the buffer"))
    }
    fn upload16(&mut self, buf: Buf, data: &[u16]) -> Result<()>;
    fn upload32(&mut self, buf: Buf, data: &[f32]) -> Result<()>;
    /// XOR every element of a 32-bit buffer with its `check::mask_word` under `key`.
    fn mask(&mut self, buf: Buf, key: u64) -> Result<()>;
    /// The unjudged figures of `job`. This default reads everything back and compares on the host;
    /// the GPU worker compares in a kernel of its own and reads back only the figures.
    fn compare(&mut self, job: &Comparison) -> Result<CheckStats> {
        compare_on_host(self, job)
    }
    fn load_forward(&mut self, kernel: &ForwardKernel) -> Result<KernelId>;
    fn load_reference(&mut self, kernel: &ReferenceKernel) -> Result<KernelId>;
    fn unload(&mut self, kernel: KernelId);
    /// CTAs of the forward kernel that fit on one SM at this launch shape.
    fn occupancy(&mut self, kernel: KernelId, launch: &LaunchShape) -> Result<u32>;
    fn attributes(&mut self, kernel: KernelId) -> Result<Option<FunctionAttributes>>;
    /// The fp32 reference: O and LSE as f32, for the set in `io` (its `o`/`lse` are 32-bit buffers).
    fn reference(&mut self, kernel: KernelId, shape: &Shape, dtype: Dtype, io: &Io) -> Result<()>;
    /// One forward launch, and its combine when the launch splits.
    fn forward(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<()>;
    /// One forward launch (and combine) timed with device events, in microseconds.
    fn time_forward(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<f64>;
    /// The launches of `ios`, in order, captured for replay.
    fn capture(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        ios: &[Io],
    ) -> Result<GraphId>;
    /// One replay timed with device events, in microseconds.
    fn replay(&mut self, graph: GraphId) -> Result<f64>;
    fn drop_graph(&mut self, graph: GraphId);
    fn roofs(&mut self, dtypes: &[Dtype]) -> Vec<RoofMeasured>;
    /// A known-good kernel still computes the right answer.
    fn health_check(&mut self) -> Result<()>;
    /// The drift sentinel: the device's own fixed kernels on fixed buffers, each timed `reps` times.
    fn sentinel(&mut self, reps: usize) -> Result<Vec<SentinelFigure>>;
    /// The timed replays of a case start now: throttling is counted from here.
    fn gpu_state_begin(&mut self) {}
    /// The GPU's clocks, temperature, power, throttling since `gpu_state_begin` and other processes;
    /// `Err` says why they cannot be read (no NVML). Never fails the case.
    fn gpu_state(&mut self) -> std::result::Result<GpuState, String> {
        Err("this device reports no state".into())
    }
    /// Most launches one timed replay may hold.
    fn launch_cap(&self) -> u32 {
        MAX_LAUNCHES
    }
}

/// Launches per timed replay, at least (every replay then covers two input sets) and at most.
pub const MIN_LAUNCHES: u32 = 2;
pub const MAX_LAUNCHES: u32 = 1000;
