//! The inputs a worker keeps per (shape, dtype, seed): the check, held-out and stress sets drawn with their references held to the CPU oracle, the timed launches' slots, and their checksums.
use super::mixture::{Geometry, LaunchDraw};
use super::verify::HostOutputs;
use super::{Buf, Device, Io, KernelId, MaskedReference, MIN_LAUNCHES};
use crate::gpu::check;
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::CaseSpec;
use anyhow::Result;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

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
    pub(super) index: u64,
    /// Its draw (launch `index` of the pool's seed): each head's LSE scale.
    pub(super) draw: LaunchDraw,
    pub reference: MaskedReference,
    /// The reference against the oracle: (rows recomputed, rel L2 of O, largest LSE gap).
    pub ref_check: (u64, f64, f64),
    /// Q, K and V as drawn, and the masked reference as computed: checksums the host holds, so a
    /// launch that rewrote either is named before its outputs are judged.
    pub(super) checksum: u64,
    pub(super) reference_checksum: u64,
}

impl InputSet {
    pub(super) fn buffers(&self) -> [Buf; 3] {
        [self.q, self.k, self.v]
    }
}

#[derive(Clone, PartialEq)]
pub(super) struct PoolKey {
    pub(super) shape: Shape,
    pub(super) dtype: Dtype,
    seed: u64,
    reference: PathBuf,
}

/// The inputs of one (shape, dtype, seed): the check, held-out and stress sets with their
/// references, and the inputs of each timed launch, which need none kept: they are drawn anew
/// before every replay, and the verified replays compute theirs.
pub struct Pool {
    pub(super) key: PoolKey,
    pub(super) reference: KernelId,
    pub(super) check: InputSet,
    pub(super) held_out: InputSet,
    pub(super) stress: InputSet,
    /// Q, K and V of each timed launch, grown on demand.
    pub(super) slots: Vec<[Buf; 3]>,
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
    pub(super) fn slot_buffers(&self, launches: usize) -> Vec<Buf> {
        self.slots[..launches].iter().flatten().copied().collect()
    }
}

pub(super) fn q_elements(s: &Shape) -> usize {
    s.b as usize * s.h as usize * s.sq as usize * s.d as usize
}
pub(super) fn kv_elements(s: &Shape) -> usize {
    s.b as usize * s.h as usize * s.sk as usize * s.d as usize
}
pub(super) fn rows(s: &Shape) -> usize {
    s.b as usize * s.h as usize * s.sq as usize
}

/// Every pool a worker holds, evicted least recently used first beyond `cap_bytes` of device memory.
pub struct Pools {
    pub(super) pools: Vec<Pool>,
    pub cap_bytes: u64,
    clock: u64,
    /// The worker has timed a case: later cases need only a short warm-up ([`REWARM_MS`]).
    pub(super) warm: bool,
    /// Host memory kept rounds were read into, for the next case: pages already touched read back
    /// several times faster than new ones (a large shape's outputs are 67 MB a launch).
    pub(super) host_spare: Vec<HostOutputs>,
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
    pub(super) fn get<D: Device>(&mut self, dev: &mut D, case: &CaseSpec) -> Result<usize> {
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
    pub(super) fn ensure_slots<D: Device>(
        &mut self,
        dev: &mut D,
        index: usize,
        n: usize,
    ) -> Result<usize> {
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
pub(super) fn generate_set<D: Device>(
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

pub(super) fn set_checksum<D: Device>(dev: &mut D, bufs: [Buf; 3]) -> Result<u64> {
    let mut sum = 0u64;
    for (i, b) in bufs.into_iter().enumerate() {
        sum ^= dev.checksum(b)?.rotate_left(21 * i as u32);
    }
    Ok(sum)
}

/// The check, held-out and stress sets, and their masked references, as they were drawn? A kernel
/// that wrote outside its outputs changes one. The references count as much as the inputs: the
/// pool outlives the case, and a reference rewritten by one variant would be blamed on the next
/// variant the worker session checks against it.
fn intact<D: Device>(dev: &mut D, pools: &Pools, pool: usize) -> Result<Option<String>> {
    let p = &pools.pools[pool];
    for set in p.sets() {
        if set_checksum(dev, set.buffers())? != set.checksum {
            return Ok(Some(format!(
                "input set {} of {} changed during the case",
                set.index, p.key.shape.name
            )));
        }
        if dev.checksum_all(&[set.reference.o, set.reference.lse])? != set.reference_checksum {
            return Ok(Some(format!(
                "the reference of input set {} of {} changed during the case",
                set.index, p.key.shape.name
            )));
        }
    }
    Ok(None)
}

/// After a case: if the pool's inputs changed, say why and draw them again next time.
pub(super) fn guard_inputs<D: Device>(
    dev: &mut D,
    pools: &mut Pools,
    pool: usize,
) -> Option<String> {
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
