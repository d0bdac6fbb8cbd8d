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
use crate::model::protocol::*;
use crate::model::space::LaunchShape;
use anyhow::{anyhow, bail, Result};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Instant;

pub mod mixture;
mod unpredictable;
mod verify;
use mixture::{Geometry, LaunchDraw};
use unpredictable::Layout;
pub use verify::{Exposure, RoundSample};
use verify::{HostOutputs, Kept, Side, Verifier};

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
/// Warm-up replays per graph, at most.
const MAX_WARMUP_REPLAYS: usize = 256;
/// Warm-up replays per graph, at least: the first replay of a new graph uploads it and loads the
/// module's code; the second is the first in steady state.
const MIN_WARMUP_REPLAYS: usize = 2;
/// Warm-up of each case after a worker's first: the GPU has been busy since (checks, references,
/// replays), so its clocks are up; only the new graph needs its first replays.
const REWARM_MS: f64 = 1.0;
/// Rows per (batch, head) the oracle recomputes on sets it does not check in full.
const SAMPLED_ROWS_PER_HEAD: usize = 2;
/// Heads of a set the CPU oracle checks the reference on (all of them for set 0 of a small shape).
const ORACLE_HEADS_PER_SET: usize = 4;

/// Tensor ids: a set with index n draws Q, K, V from 3n, 3n + 1, 3n + 2.
const CHECK_SET: u64 = 0;
const HELD_OUT_SET: u64 = 1 << 20;
const STRESS_SET: u64 = (1 << 20) + 1;

/// One set of inputs on the device, with its fp32 reference beside it, masked.
pub struct InputSet {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    index: u64,
    /// Its draw (launch `index` of the pool's seed): each head's LSE scale.
    draw: LaunchDraw,
    pub reference: MaskedReference,
    /// The reference against the oracle: (rows recomputed, rel L2 of O, largest LSE gap).
    pub ref_check: (u64, f64, f64),
    /// Q, K and V as drawn, and the masked reference as computed: checksums the host holds, so a
    /// launch that rewrote either is named before its outputs are judged.
    checksum: u64,
    reference_checksum: u64,
}

impl InputSet {
    fn buffers(&self) -> [Buf; 3] {
        [self.q, self.k, self.v]
    }
}

#[derive(Clone, PartialEq)]
struct PoolKey {
    shape: Shape,
    dtype: Dtype,
    seed: u64,
    reference: PathBuf,
}

/// The inputs of one (shape, dtype, seed): the check, held-out and stress sets with their
/// references, and the inputs of each timed launch, which need none kept: they are drawn anew
/// before every replay, and the verified replays compute theirs.
pub struct Pool {
    key: PoolKey,
    reference: KernelId,
    check: InputSet,
    held_out: InputSet,
    stress: InputSet,
    /// Q, K and V of each timed launch, grown on demand.
    slots: Vec<[Buf; 3]>,
    last_used: u64,
}

impl Pool {
    /// Q, K, V in 16 bits, and the reference's O and LSE in 32.
    fn set_bytes(shape: &Shape) -> u64 {
        Self::slot_bytes(shape) + (4 * (q_elements(shape) + rows(shape))) as u64
    }
    /// Q, K, V in 16 bits.
    fn slot_bytes(shape: &Shape) -> u64 {
        (2 * (q_elements(shape) + 2 * kv_elements(shape))) as u64
    }
    fn bytes(&self) -> u64 {
        let shape = &self.key.shape;
        3 * Self::set_bytes(shape) + self.slots.len() as u64 * Self::slot_bytes(shape)
    }
    fn sets(&self) -> [&InputSet; 3] {
        [&self.check, &self.held_out, &self.stress]
    }
    /// Every timed launch's Q, K and V, in slot order: what `Device::draw_inputs` redraws.
    fn slot_buffers(&self, launches: usize) -> Vec<Buf> {
        self.slots[..launches].iter().flatten().copied().collect()
    }
}

fn q_elements(s: &Shape) -> usize {
    s.b as usize * s.h as usize * s.sq as usize * s.d as usize
}
fn kv_elements(s: &Shape) -> usize {
    s.b as usize * s.h as usize * s.sk as usize * s.d as usize
}
fn rows(s: &Shape) -> usize {
    s.b as usize * s.h as usize * s.sq as usize
}

/// Every pool a worker holds, evicted least recently used first beyond `cap_bytes` of device memory.
pub struct Pools {
    pools: Vec<Pool>,
    pub cap_bytes: u64,
    clock: u64,
    /// The worker has timed a case: later cases need only a short warm-up ([`REWARM_MS`]).
    warm: bool,
    /// Host memory kept rounds were read into, for the next case: pages already touched read back
    /// several times faster than new ones (a large shape's outputs are 67 MB a launch).
    host_spare: Vec<HostOutputs>,
}

impl Pools {
    pub fn new(cap_bytes: u64) -> Self {
        Pools {
            pools: Vec::new(),
            cap_bytes,
            clock: 0,
            warm: false,
            host_spare: Vec::new(),
        }
    }

    /// The pool of this case's (shape, dtype, seed), drawn now if new. Returns its index.
    fn get<D: Device>(&mut self, dev: &mut D, case: &CaseSpec) -> Result<usize> {
        let key = PoolKey {
            shape: case.shape.clone(),
            dtype: case.dtype,
            seed: case.seed,
            reference: case.reference.cubin.clone(),
        };
        self.clock += 1;
        if let Some(i) = self.pools.iter().position(|p| p.key == key) {
            self.pools[i].last_used = self.clock;
            return Ok(i);
        }
        self.make_room(
            dev,
            3 * Pool::set_bytes(&key.shape) + MIN_LAUNCHES as u64 * Pool::slot_bytes(&key.shape),
        );
        let reference = dev.load_reference(&case.reference)?;
        let mut draw = |index: u64| draw_set(dev, reference, &key, index, case.cpu_oracle_max_macs);
        let check = draw(CHECK_SET)?;
        let held_out = draw(HELD_OUT_SET)?;
        let stress = draw(STRESS_SET)?;
        self.pools.push(Pool {
            key,
            reference,
            check,
            held_out,
            stress,
            slots: Vec::new(),
            last_used: self.clock,
        });
        Ok(self.pools.len() - 1)
    }

    /// Free least recently used pools until `more` bytes fit under the cap (the newest pool stays).
    fn make_room<D: Device>(&mut self, dev: &mut D, more: u64) {
        while self.pools.len() > 1
            && self.pools.iter().map(Pool::bytes).sum::<u64>() + more > self.cap_bytes
        {
            let oldest = (0..self.pools.len())
                .min_by_key(|&i| self.pools[i].last_used)
                .expect("non-empty");
            let pool = self.pools.remove(oldest);
            release(dev, pool);
        }
    }

    /// Make sure the pool holds `n` timed launch slots; fewer when the cap does not allow more (at
    /// least `MIN_LAUNCHES`). Their contents are drawn before each replay, not here.
    fn ensure_slots<D: Device>(&mut self, dev: &mut D, index: usize, n: usize) -> Result<usize> {
        let shape = self.pools[index].key.shape.clone();
        let others: u64 = self
            .pools
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .map(|(_, p)| p.bytes())
            .sum();
        let room = self
            .cap_bytes
            .saturating_sub(others + 3 * Pool::set_bytes(&shape));
        let affordable = (room / Pool::slot_bytes(&shape)).max(MIN_LAUNCHES as u64);
        let n = n.min(affordable as usize);
        let pool = &mut self.pools[index];
        while pool.slots.len() < n {
            let (qn, kvn) = (q_elements(&shape), kv_elements(&shape));
            pool.slots
                .push([dev.alloc16(qn)?, dev.alloc16(kvn)?, dev.alloc16(kvn)?]);
        }
        Ok(n)
    }

    /// Drop a pool whose inputs can no longer be trusted (a kernel wrote into them).
    fn discard<D: Device>(&mut self, dev: &mut D, index: usize) {
        let pool = self.pools.remove(index);
        release(dev, pool);
    }
}

fn release<D: Device>(dev: &mut D, pool: Pool) {
    for set in pool.sets() {
        set.buffers().into_iter().for_each(|b| dev.free(b));
        dev.free(set.reference.o);
        dev.free(set.reference.lse);
    }
    pool.slots.iter().flatten().for_each(|&b| dev.free(b));
    dev.unload(pool.reference);
}

/// Draw one input set, compute its reference, and check the reference against the CPU oracle:
/// every row of set 0 on shapes up to `cpu_oracle_max_macs`, sampled rows otherwise.
fn draw_set<D: Device>(
    dev: &mut D,
    reference: KernelId,
    key: &PoolKey,
    index: u64,
    cpu_oracle_max_macs: f64,
) -> Result<InputSet> {
    let shape = &key.shape;
    let (qn, kvn, rows_n, d) = (
        q_elements(shape),
        kv_elements(shape),
        rows(shape),
        shape.d as usize,
    );
    let q = dev.alloc16(qn)?;
    let k = dev.alloc16(kvn)?;
    let v = dev.alloc16(kvn)?;
    let draw = LaunchDraw {
        seed: key.seed,
        launch: index,
        geometry: geometry(shape),
    };
    generate_set(dev, [q, k, v], key.dtype, &draw)?;
    let (o32, lse32) = (dev.alloc32(qn)?, dev.alloc32(rows_n)?);
    dev.poison(o32)?;
    dev.poison(lse32)?;
    let io = Io {
        q,
        k,
        v,
        o: o32,
        lse: lse32,
        o_accum: None,
        lse_accum: None,
        counters: None,
    };
    let computed = dev.reference(reference, shape, key.dtype, &io);
    let judged = computed.and_then(|()| {
        let full = index == 0 && shape.macs() <= cpu_oracle_max_macs;
        let (oracle_rows, oracle_o, oracle_lse) = if full {
            let oracle_rows: Vec<usize> = (0..rows_n).collect();
            let [qv, kv, vv] =
                [q, k, v].map(|b| dev.read16(b).map(|bits| check::values(key.dtype, &bits)));
            let (o, lse) = check::oracle_rows(shape, &qv?, &kv?, &vv?, &oracle_rows);
            (oracle_rows, o, lse)
        } else {
            oracle_on_sampled_heads(dev, key, index, [q, k, v])?
        };
        // Only the rows the oracle recomputed come back to the host.
        let (mut ref_rows_o, mut ref_rows_lse) = (Vec::new(), Vec::new());
        if full {
            ref_rows_o = dev.read32(o32)?;
            ref_rows_lse = dev.read32(lse32)?;
        } else {
            for &row in &oracle_rows {
                ref_rows_o.extend(dev.read32_range(o32, row * d, d)?);
                ref_rows_lse.extend(dev.read32_range(lse32, row, 1)?);
            }
        }
        let compact: Vec<usize> = (0..oracle_rows.len()).collect();
        let (rel, lse_gap) = check::reference_vs_oracle(
            &ref_rows_o,
            &ref_rows_lse,
            &compact,
            &oracle_o,
            &oracle_lse,
            d,
        );
        let reference = MaskedReference::mask(dev, o32, lse32)?;
        Ok((reference, (oracle_rows.len() as u64, rel, lse_gap)))
    });
    let (reference, ref_check) = match judged {
        Ok(judged) => judged,
        Err(e) => {
            dev.free(o32);
            dev.free(lse32);
            return Err(e);
        }
    };
    let checksum = set_checksum(dev, [q, k, v])?;
    let reference_checksum = dev.checksum_all(&[reference.o, reference.lse])?;
    Ok(InputSet {
        q,
        k,
        v,
        index,
        draw,
        reference,
        ref_check,
        checksum,
        reference_checksum,
    })
}

/// The oracle on a few heads of a set, chosen afresh per set, reading back only those heads: a
/// long-KV set is tens of MB per tensor, and reading all of it for two rows a head made input sets
/// the largest cost of a run (19.7 s of a 91 s quick run on an H100, the decode shape alone).
/// Returns the global rows checked, their O and LSE.
fn oracle_on_sampled_heads<D: Device>(
    dev: &mut D,
    key: &PoolKey,
    index: u64,
    [q, k, v]: [Buf; 3],
) -> Result<(Vec<usize>, Vec<f64>, Vec<f64>)> {
    let shape = &key.shape;
    let (sq, sk, d) = (shape.sq as usize, shape.sk as usize, shape.d as usize);
    let heads = shape.b as usize * shape.h as usize;
    let mut rng = SmallRng::seed_from_u64(key.seed ^ index.rotate_left(17) ^ 0x0a11_5e75);
    let mut picked: Vec<usize> = (0..heads).collect();
    picked.shuffle(&mut rng);
    picked.truncate(ORACLE_HEADS_PER_SET);
    picked.sort_unstable();
    let one_head = Shape {
        b: 1,
        h: 1,
        ..shape.clone()
    };
    let (mut rows_out, mut o_out, mut lse_out) = (Vec::new(), Vec::new(), Vec::new());
    for bh in picked {
        let read = |dev: &mut D, buf: Buf, s: usize| {
            dev.read16_range(buf, bh * s * d, s * d)
                .map(|bits| check::values(key.dtype, &bits))
        };
        let (qh, kh, vh) = (read(dev, q, sq)?, read(dev, k, sk)?, read(dev, v, sk)?);
        let local = check::sample_rows(&one_head, SAMPLED_ROWS_PER_HEAD, rng.random());
        let (o, lse) = check::oracle_rows(&one_head, &qh, &kh, &vh, &local);
        rows_out.extend(local.iter().map(|r| bh * sq + r));
        o_out.extend(o);
        lse_out.extend(lse);
    }
    Ok((rows_out, o_out, lse_out))
}

/// A tensor of `shape` as the mixture sees it: batch × heads heads of rows of d.
pub fn geometry(shape: &Shape) -> Geometry {
    Geometry {
        heads: shape.b * shape.h,
        d: shape.d,
    }
}

/// Q, K and V of one launch's draw, into `bufs`.
fn generate_set<D: Device>(
    dev: &mut D,
    bufs: [Buf; 3],
    dtype: Dtype,
    draw: &LaunchDraw,
) -> Result<()> {
    for (t, buf) in bufs.into_iter().enumerate() {
        dev.generate(
            buf,
            dtype,
            draw.seed,
            3 * draw.launch + t as u64,
            draw.geometry,
        )?;
    }
    Ok(())
}

fn set_checksum<D: Device>(dev: &mut D, bufs: [Buf; 3]) -> Result<u64> {
    let mut sum = 0u64;
    for (i, b) in bufs.into_iter().enumerate() {
        sum ^= dev.checksum(b)?.rotate_left(21 * i as u32);
    }
    Ok(sum)
}

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
struct Contender {
    kernel: KernelId,
    launch: LaunchShape,
    /// Outputs of the two check runs; the first is reused by the later checks.
    outs: [Io; 2],
}

/// Output buffers (and split partials) for one launch; the inputs are filled in per launch.
fn alloc_outputs<D: Device>(dev: &mut D, shape: &Shape, launch: &LaunchShape) -> Result<Io> {
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
        counters: if splits > 1 && launch.split_counters {
            // Zero once: the kernel counts modulo the split count and never resets them.
            let words = (shape.sq.div_ceil(launch.rows_per_cta) * shape.b * shape.h) as usize;
            let counters = dev.alloc32(words)?;
            dev.upload32(counters, &vec![0.0; words])?;
            Some(counters)
        } else {
            None
        },
    })
}

fn free_outputs<D: Device>(dev: &mut D, io: &Io) {
    dev.free(io.o);
    dev.free(io.lse);
    io.o_accum
        .into_iter()
        .chain(io.lse_accum)
        .chain(io.counters)
        .for_each(|b| dev.free(b));
}

fn poison_outputs<D: Device>(dev: &mut D, io: &Io) -> Result<()> {
    dev.poison(io.o)?;
    dev.poison(io.lse)?;
    for b in io.o_accum.into_iter().chain(io.lse_accum) {
        dev.poison(b)?;
    }
    Ok(())
}

fn with_inputs(io: &Io, set: &InputSet) -> Io {
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
fn enter<D: Device>(
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
        let ctas = shape.sq.div_ceil(launch.rows_per_cta) * shape.b * shape.h;
        launch.kv_splits = auto_kv_splits(
            ctas,
            dev.info().sm_count * ctas_per_sm.max(1),
            shape.sk.div_ceil(launch.kv_rows_per_block),
        );
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
    }
    // Named first when it happens: a kernel that writes into its inputs also changes what its
    // second run reads, and would otherwise pass for a race.
    if set_checksum(dev, set0.buffers())? != set0.checksum {
        stats.failures.insert(
            0,
            format!("{WROTE_OUTSIDE}: input set 0 changed during the check"),
        );
    }
    result.check = Some(stats);
    Ok(Contender {
        kernel,
        launch,
        outs,
    })
}

fn leave<D: Device>(dev: &mut D, c: Contender) {
    c.outs.iter().for_each(|io| free_outputs(dev, io));
    dev.unload(c.kernel);
}

/// The timed replays of every contender, and where racing stopped them.
struct Timings {
    launches: u32,
    /// Per contender: the per-launch samples and the timed-output check.
    sides: Vec<(Vec<f64>, StageCheck)>,
    raced: Option<RacedOut>,
}

/// Replays of every contender, interleaved (A B, B A, ...), each over `launches` launches with
/// inputs and outputs of their own, the inputs drawn anew before every replay, every replay alike.
/// With a `race` bar (one contender), the replays stop once the first `race.samples` put its p10
/// above the bar. Afterwards, `verified_replays` rounds per side, drawn from all that ran, are
/// verified and run again.
#[allow(clippy::too_many_arguments)]
fn time_interleaved<D: Device>(
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
    let (mut replays_us, mut inputs_s, mut verify_s) = (0.0, 0.0, 0.0);
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
                verify_s += keeping.elapsed().as_secs_f64();
            }
        }
        let verifying = Instant::now();
        for side in out.iter_mut() {
            verifier.check_kept(dev, side, samples, case)?;
        }
        for (side, (graph, ios)) in out.iter_mut().zip(&sides) {
            if side.failed.is_none() {
                verifier.rerun_kept(dev, side, *graph, ios, &inputs, samples, case)?;
            }
        }
        verify_s += verifying.elapsed().as_secs_f64();
        Ok(())
    })();
    if let Some(verifier) = verifier {
        verifier.free(dev);
    }
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

/// After timing, in the same module: a set it never saw written into the buffers it was checked
/// on, then the stress set (a third draw of the mixture). The check set is drawn again afterwards, as
/// it was.
fn recheck<D: Device>(
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

/// The check, held-out and stress sets as they were drawn? A kernel that wrote outside its outputs
/// changes one.
fn intact<D: Device>(dev: &mut D, pools: &Pools, pool: usize) -> Result<Option<String>> {
    let p = &pools.pools[pool];
    for set in p.sets() {
        if set_checksum(dev, set.buffers())? != set.checksum {
            return Ok(Some(format!(
                "input set {} of {} changed during the case",
                set.index, p.key.shape.name
            )));
        }
    }
    Ok(None)
}

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

/// After a case: if the pool's inputs changed, say why and draw them again next time.
fn guard_inputs<D: Device>(dev: &mut D, pools: &mut Pools, pool: usize) -> Option<String> {
    match intact(dev, pools, pool) {
        Ok(None) => None,
        Ok(Some(why)) => {
            pools.discard(dev, pool);
            Some(why)
        }
        Err(e) => {
            pools.discard(dev, pool);
            Some(format!("the input sets could not be checksummed: {e:#}"))
        }
    }
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

/// How a failed comparison self-check begins, so the run can say what it means.
pub const COMPARISON_DISAGREES: &str = "the device's output comparison disagrees with the host's";

/// Hold the device's output comparison to the host's ([`compare_on_host`]) on crafted outputs,
/// before a device is trusted with any verdict: both dtypes, both head dims, an odd row count and
/// one past the comparison kernel's grid (its grid-stride loop), poisoned, NaN, infinite and badly
/// wrong outputs, a row that sees no key, a zero reference row, a NaN in the reference, and an
/// earlier run that differs bit for bit (including -0 against +0). The reference is masked by the device and unmasked by the host, so the two mask functions are held
/// to each other too. Counts must agree exactly; sums to 1e-9 relative (their order differs).
pub fn self_check_comparison<D: Device>(dev: &mut D) -> Result<()> {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for (rows, d) in [(37usize, 128usize), (9001, 64)] {
            for nan_reference in [false, true] {
                let crafted = CraftedOutputs::new(dtype, rows, d, nan_reference);
                let bufs = crafted.upload(dev)?;
                let checked = (|| -> Result<()> {
                    // Heads of their own LSE scales on the second: both sides divide alike.
                    let jobs = [
                        (None, false, "no earlier run"),
                        (
                            Some(bufs.earlier),
                            true,
                            "an earlier run, LSE scaled per head",
                        ),
                    ];
                    for (earlier, scaled, what) in jobs {
                        let job = Comparison {
                            dtype,
                            d,
                            o: bufs.o,
                            lse: bufs.lse,
                            reference: bufs.reference,
                            earlier: earlier.map(|(o, lse)| Earlier { o, lse }),
                            draw: scaled.then_some(LaunchDraw {
                                seed: 11,
                                launch: 0,
                                geometry: Geometry {
                                    heads: 9,
                                    d: d as u32,
                                },
                            }),
                        };
                        let (device, host) = (dev.compare(&job)?, compare_on_host(dev, &job)?);
                        if let Some(field) = first_disagreement(&device, &host) {
                            bail!(
                                "{COMPARISON_DISAGREES} on crafted outputs ({dtype}, {rows} rows of {d}, {}reference, {what}): {field}",
                                if nan_reference { "NaN in the " } else { "" }
                            );
                        }
                    }
                    Ok(())
                })();
                bufs.free(dev);
                checked?;
            }
        }
    }
    Ok(())
}

/// The first figure two comparisons disagree on, named with both values.
fn first_disagreement(device: &CheckStats, host: &CheckStats) -> Option<String> {
    let close = |a: f64, b: f64| {
        (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
    };
    let counts = [
        ("elements", device.elements, host.elements),
        ("NaN/inf outputs", device.nan_count, host.nan_count),
        (
            "unwritten outputs",
            device.unwritten_count,
            host.unwritten_count,
        ),
        (
            "differing outputs",
            device.nondeterministic_count,
            host.nondeterministic_count,
        ),
        ("worst row", device.worst_row, host.worst_row),
    ];
    let figures = [
        ("max abs error", device.max_abs, host.max_abs),
        ("relative L2", device.rel_l2, host.rel_l2),
        (
            "worst row's relative L2",
            device.row_rel_l2_max,
            host.row_rel_l2_max,
        ),
        ("LSE max abs error", device.lse_max_abs, host.lse_max_abs),
    ];
    counts
        .iter()
        .find(|(_, a, b)| a != b)
        .map(|(name, a, b)| format!("{name}: {a} on the device, {b} on the host"))
        .or_else(|| {
            figures
                .iter()
                .find(|(_, a, b)| !close(*a, *b))
                .map(|(name, a, b)| format!("{name}: {a:e} on the device, {b:e} on the host"))
        })
}

/// Outputs with one of everything a comparison must count, against a reference of N(0, 1) values.
struct CraftedOutputs {
    o: Vec<u16>,
    lse: Vec<f32>,
    ref_o: Vec<f32>,
    ref_lse: Vec<f32>,
    earlier: (Vec<u16>, Vec<f32>),
}

struct CraftedBuffers {
    o: Buf,
    lse: Buf,
    reference: MaskedReference,
    earlier: (Buf, Buf),
}

impl CraftedBuffers {
    fn free<D: Device>(&self, dev: &mut D) {
        for b in [
            self.o,
            self.lse,
            self.reference.o,
            self.reference.lse,
            self.earlier.0,
            self.earlier.1,
        ] {
            dev.free(b);
        }
    }
}

impl CraftedOutputs {
    fn new(dtype: Dtype, rows: usize, d: usize, nan_reference: bool) -> Self {
        let mut rng = SmallRng::seed_from_u64(0x5e1f_c4ec ^ (rows * d) as u64);
        let mut normal = || -> f32 { rng.sample(rand_distr::StandardNormal) };
        let ref_o: Vec<f32> = (0..rows * d).map(|_| normal()).collect();
        let ref_lse: Vec<f32> = (0..rows).map(|_| 3.0 * normal()).collect();
        let mut c = CraftedOutputs {
            o: ref_o
                .iter()
                .map(|&r| check::to_bits(dtype, r + 1e-3 * normal()))
                .collect(),
            lse: ref_lse.iter().map(|&l| l + 1e-4 * normal()).collect(),
            ref_o,
            ref_lse,
            earlier: (Vec::new(), Vec::new()),
        };
        let at = |row: usize, col: usize| row * d + col;
        // A row that sees no key: O = 0 and LSE = -inf on both sides.
        c.ref_o[at(3, 0)..at(4, 0)].fill(0.0);
        c.o[at(3, 0)..at(4, 0)].fill(0);
        c.ref_lse[3] = f32::NEG_INFINITY;
        c.lse[3] = f32::NEG_INFINITY;
        // A zero reference row with a written error: the row's error is absolute.
        c.ref_o[at(5, 0)..at(6, 0)].fill(0.0);
        c.o[at(7, 1)] = check::POISON_16;
        c.o[at(8, 2)] = check::to_bits(dtype, f32::NAN);
        c.o[at(9, 3)] = check::to_bits(dtype, f32::INFINITY);
        c.lse[10] = f32::from_bits(check::POISON_F32_BITS);
        c.lse[11] = f32::NAN;
        c.lse[12] = f32::NEG_INFINITY;
        // The one badly wrong row: the worst row is unique.
        for col in 0..d {
            c.o[at(13, col)] = check::to_bits(dtype, c.ref_o[at(13, col)] + 0.5);
        }
        if nan_reference {
            c.ref_o[at(rows - 1, d - 1)] = f32::NAN;
        }
        let mut earlier = (c.o.clone(), c.lse.clone());
        earlier.0[at(0, 0)] ^= 1;
        earlier.0[at(rows - 1, 5)] ^= 0x8000;
        earlier.1[rows / 2] = f32::from_bits(earlier.1[rows / 2].to_bits() ^ 1);
        // -0 against +0 is a difference in bits.
        c.o[at(4, 7)] = 0x0000;
        earlier.0[at(4, 7)] = 0x8000;
        c.earlier = earlier;
        c
    }

    fn upload<D: Device>(&self, dev: &mut D) -> Result<CraftedBuffers> {
        let mut pair = |o: &[u16], lse: &[f32]| -> Result<(Buf, Buf)> {
            let (ob, lb) = (dev.alloc16(o.len())?, dev.alloc32(lse.len())?);
            dev.upload16(ob, o)?;
            dev.upload32(lb, lse)?;
            Ok((ob, lb))
        };
        let (o, lse) = pair(&self.o, &self.lse)?;
        let earlier = pair(&self.earlier.0, &self.earlier.1)?;
        let (ref_o, ref_lse) = (
            dev.alloc32(self.ref_o.len())?,
            dev.alloc32(self.ref_lse.len())?,
        );
        dev.upload32(ref_o, &self.ref_o)?;
        dev.upload32(ref_lse, &self.ref_lse)?;
        let reference = MaskedReference::mask(dev, ref_o, ref_lse)?;
        Ok(CraftedBuffers {
            o,
            lse,
            reference,
            earlier,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::{auto_kv_splits, Buf, Exposure, Io, RoundSample};
    use rand::{rngs::SmallRng, SeedableRng};

    /// How often each of `rounds` rounds ends up kept when `k` are sampled, over `trials` cases.
    fn kept_frequencies(k: usize, rounds: usize, trials: usize) -> Vec<f64> {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = vec![0usize; rounds];
        for _ in 0..trials {
            let mut sample = RoundSample::new(k);
            for round in 0..rounds {
                sample.offer(round, &mut rng);
            }
            assert_eq!(sample.rounds().len(), k.min(rounds));
            for &r in sample.rounds() {
                counts[r] += 1;
            }
        }
        counts.iter().map(|&c| c as f64 / trials as f64).collect()
    }

    /// Architecture Invariant: a verified round is drawn from all the rounds that ran, each with the
    /// same chance, however many ran (racing may stop a case after 8 of 30): the first rounds, the
    /// last, or any other are not favoured, so a kernel honest in some rounds only cannot pick them.
    #[test]
    fn verified_rounds_are_a_uniform_sample_of_every_round_that_ran() {
        for (k, rounds) in [(2, 30), (2, 8), (8, 30), (1, 15)] {
            let expected = k as f64 / rounds as f64;
            for (round, f) in kept_frequencies(k, rounds, 40_000).into_iter().enumerate() {
                assert!(
                    (f - expected).abs() < 0.1 * expected,
                    "k={k} of {rounds}: round {round} kept {f:.4} of the time, not {expected:.4}"
                );
            }
        }
        // Fewer rounds than places: every round is kept.
        assert_eq!(kept_frequencies(8, 5, 10), vec![1.0; 5]);
    }

    fn io(first: usize) -> Io {
        Io {
            q: Buf(first),
            k: Buf(first + 1),
            v: Buf(first + 2),
            o: Buf(first + 3),
            lse: Buf(first + 4),
            o_accum: None,
            lse_accum: None,
            counters: None,
        }
    }

    /// Architecture Invariant: the reference never reads memory the kernel under test can write.
    /// Both devices refuse a reference launch on any buffer a kernel was given, until it is freed.
    #[test]
    fn a_reference_on_buffers_a_kernel_was_given_is_refused() {
        let mut exposure = Exposure::default();
        let (timed, private) = (io(0), io(10));
        exposure.give(&timed);
        exposure.check_reference(&private).expect("never given");
        for shared in [
            Io {
                q: timed.q,
                ..private
            },
            Io {
                v: timed.v,
                ..private
            },
            Io {
                o: timed.o,
                ..private
            },
        ] {
            let why = exposure.check_reference(&shared).unwrap_err().to_string();
            assert!(
                why.contains("never reads memory the kernel under test can write"),
                "{why}"
            );
        }
        for b in [timed.q, timed.k, timed.v, timed.o, timed.lse] {
            exposure.forget(b);
        }
        exposure
            .check_reference(&timed)
            .expect("freed, so the handle is new memory");
    }

    #[test]
    fn full_grids_are_not_split() {
        assert_eq!(auto_kv_splits(264, 264, 64), 1);
    }

    #[test]
    fn small_grids_are_split_to_fill_the_gpu() {
        // Decode (1,8,1,4096): 8 CTAs of one query block, 132 SMs x 2 CTAs, 64 key blocks.
        let s = auto_kv_splits(8, 264, 64);
        assert!(s > 1 && 8 * s <= 264 + 8, "{s}");
        // Never more splits than key blocks.
        assert_eq!(auto_kv_splits(1, 264, 3), 3);
    }
}
