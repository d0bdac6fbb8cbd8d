//! `flashtune worker --fake ARCH`: the GPU-less test double. It implements the trial's `Device` on host memory, so CI runs the real trial (poisoning, comparison, timed-output verification, re-checks, the protocol) on real arrays.
//!
//! Kernels are models chosen by the cubin's `FAULT` / `CHEAT` defines or by marker strings compiled
//! into it (`flashtune-fake: fault FAULT_WRONG`, `flashtune-fake: cheat CHEAT_RACE`): an honest model
//! computes attention in f64 on the CPU; a fault or cheat misbehaves the way its name says
//! (`models`). Its inputs are drawn so that attention has a cheap exact form (`answers`), and
//! contents are made only when read (`memory`): a large shape costs milliseconds, not minutes. Times
//! are synthetic, from a fixed model of the parameters times the cubin's `flashtune-fake: time xS`
//! marker. The device says it is fake, and every report says so: nothing it reports was measured.
//!
//! The GPU's state beside each timing is modelled too, so CI exercises what a hot or shared GPU does:
//! - a kernel's state comes from a `FAKE_STATE` define (a space parameter `FAKE_STATE = ["thermal"]`
//!   becomes `-DFAKE_STATE=FAKE_STATE_THERMAL`) or a `flashtune-fake: state thermal` marker:
//!   `thermal` (hardware thermal slowdown), `power` (software power cap) or `neighbour` (another
//!   process, pid 4242 with 2 GiB, on the GPU) on every timing of the case; with `_once` (`thermal_once`)
//!   on the first timing of each (kernel, shape) only, so the re-timing comes out clean. Times are not
//!   changed by a state: a throttled kernel can be the fastest, and only its flag keeps it from
//!   deciding a champion alone. Otherwise the state is clean, and the temperature rises 0.2 °C per
//!   case timed from 40 °C;
//! - `FLASHTUNE_FAKE_DRIFT=after_cases=N,factor=F` (read by the fake worker) makes every time the
//!   worker reports, the sentinel's and the kernels', F times longer (and its SM clock F times lower)
//!   once it has timed N cases: a GPU that drifts mid-run. A new worker (a duel) starts undrifted;
//! - `FLASHTUNE_FAKE_NVML=absent` makes the state unreadable, as on a machine without NVML;
//! - `FLASHTUNE_FAKE_PACE_MS=N` makes each timed case take N ms of wall time, as a GPU's would: a
//!   run slow enough for a test to interfere with it mid-run (cancel a Slurm step, send a signal).
//!
//! The double compares outputs on the host (`trial::compare_on_host`), the path the GPU's own
//! comparison kernel is held to. `FLASHTUNE_FAKE_COMPARE=miscount` makes its comparison miss one
//! unwritten output in every row set, as a broken comparison kernel would: the probe's self-check
//! must then refuse the device.
//!
//! The sentinel's figures are fixed: `fma` 1000 µs and `read` 400 µs (times the drift factor).
mod answers;
mod cheats;
mod memory;
mod models;
mod profile;
mod trial_device;

pub use profile::profile;

use crate::gpu::check;
use crate::gpu::trial::{Buf, Io, KernelId};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::DeviceInfo;
use crate::model::space::LaunchShape;
use answers::{Answers, Input, Launch};
use anyhow::{anyhow, bail, Result};
use memory::{Buffer, Narrow, Wide};
use models::{FakeKernel, Model, Remembered};
use std::collections::HashMap;
use std::sync::Arc;

/// Defines the double reads from a kernel's build, beyond what the kernel itself reads: a space
/// parameter of this name is meaningful to `--fake-gpu` runs.
pub const DEFINES_THE_DOUBLE_READS: [&str; 1] = ["FAKE_STATE"];

pub fn device(arch: &str, ordinal: u32) -> DeviceInfo {
    DeviceInfo {
        ordinal,
        name: "fake GPU (flashtune test double; no figure from it is a measurement)".into(),
        sm_count: 132,
        compute_capability: (9, 0),
        arch: arch.into(),
        max_threads_per_block: 1024,
        max_smem_optin_bytes: 232_448,
        driver_version: 0,
        total_memory_bytes: 0,
        visible_devices: 1,
        l2_bytes: 1 << 20,
        fake: true,
        placement: crate::gpu::slurm::placement_here(),
    }
}

/// The synthetic roofs of the double, so the plausibility gate has something to hold figures to.
pub const FAKE_MATMUL_TFLOPS: f64 = 700.0;
pub const FAKE_COPY_GBPS: f64 = 2000.0;
pub const FAKE_READ_GBPS: f64 = 2500.0;

/// Bytes of answers the double keeps for reuse (the check set's, the references' of a verified replay).
const ANSWER_BUDGET_BYTES: usize = 1 << 30;

pub fn serve(arch: &str, ordinal: u32) -> std::process::ExitCode {
    let mut reply = crate::gpu::worker::reply_channel();
    let mut gpu = FakeGpu::new(device(arch, ordinal));
    gpu.drift = std::env::var("FLASHTUNE_FAKE_DRIFT")
        .ok()
        .and_then(|spec| models::parse_drift(&spec));
    gpu.nvml_absent = std::env::var("FLASHTUNE_FAKE_NVML").is_ok_and(|v| v == "absent");
    gpu.pace = std::env::var("FLASHTUNE_FAKE_PACE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    gpu.miscounting_compare =
        std::env::var("FLASHTUNE_FAKE_COMPARE").is_ok_and(|v| v == "miscount");
    crate::gpu::trial::serve(gpu, std::io::stdin().lock(), &mut reply, 256 << 20)
}

pub struct FakeGpu {
    info: DeviceInfo,
    memory: Vec<Option<Buffer>>,
    kernels: Vec<Option<FakeKernel>>,
    graphs: Vec<Option<(KernelId, Shape, LaunchShape, Vec<Io>)>>,
    answers: Answers,
    /// `FLASHTUNE_FAKE_DRIFT`: after this many cases timed, every time is this many times longer.
    drift: Option<(u64, f64)>,
    nvml_absent: bool,
    /// `FLASHTUNE_FAKE_PACE_MS`: wall time each timed case takes.
    pace: Option<std::time::Duration>,
    /// `FLASHTUNE_FAKE_COMPARE=miscount`: the comparison misses an unwritten output.
    miscounting_compare: bool,
    cases_timed: u64,
    /// The kernel and shape of the last replay: whose state the next reading reports.
    last_replayed: Option<(KernelId, String)>,
    /// Timings so far per (cubin, shape), for the states that hold on the first only.
    timings_of: HashMap<(std::path::PathBuf, String), u32>,
    /// Buffers a kernel under test was given: never a reference's.
    exposure: crate::gpu::trial::Exposure,
    /// Buffers touched since the L2 was last flushed (their lines would still be in it).
    warm: std::collections::HashSet<usize>,
}

fn slot<T>(slab: &mut Vec<Option<T>>, item: T) -> usize {
    match slab.iter().position(Option::is_none) {
        Some(i) => {
            slab[i] = Some(item);
            i
        }
        None => {
            slab.push(Some(item));
            slab.len() - 1
        }
    }
}

impl FakeGpu {
    pub fn new(info: DeviceInfo) -> Self {
        FakeGpu {
            info,
            memory: Vec::new(),
            kernels: Vec::new(),
            graphs: Vec::new(),
            answers: Answers::new(ANSWER_BUDGET_BYTES),
            drift: None,
            nvml_absent: false,
            pace: None,
            miscounting_compare: false,
            cases_timed: 0,
            last_replayed: None,
            timings_of: HashMap::new(),
            exposure: crate::gpu::trial::Exposure::default(),
            warm: std::collections::HashSet::new(),
        }
    }

    fn buffer(&mut self, buf: Buf) -> Result<&mut Buffer> {
        self.memory
            .get_mut(buf.0)
            .and_then(Option::as_mut)
            .ok_or_else(|| anyhow!("no buffer {}", buf.0))
    }

    /// The elements of a 16-bit buffer, made now if they were a description.
    fn narrow(&mut self, buf: Buf) -> Result<Arc<Vec<u16>>> {
        let answers = &mut self.answers;
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Buffer::Narrow {
                len, content, made, ..
            }) => Ok(made
                .get_or_insert_with(|| memory::make_narrow(content, *len, answers))
                .clone()),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    /// The elements of a 32-bit buffer, made now if they were a description.
    fn wide(&mut self, buf: Buf) -> Result<Arc<Vec<f32>>> {
        let answers = &mut self.answers;
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Buffer::Wide { len, content, made }) => Ok(made
                .get_or_insert_with(|| memory::make_wide(content, *len, answers))
                .clone()),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn set_narrow(&mut self, buf: Buf, content: Narrow) -> Result<()> {
        let len = match self.buffer(buf)? {
            b @ Buffer::Narrow { .. } => b.len(),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        };
        *self.buffer(buf)? = Buffer::narrow(len, content);
        Ok(())
    }

    fn set_wide(&mut self, buf: Buf, content: Wide) -> Result<()> {
        let len = match self.buffer(buf)? {
            b @ Buffer::Wide { .. } => b.len(),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        };
        *self.buffer(buf)? = Buffer::wide(len, content);
        Ok(())
    }

    /// The elements of a 16-bit buffer to write into: the buffer holds plain bits from now on.
    fn narrow_mut(&mut self, buf: Buf) -> Result<&mut Vec<u16>> {
        let bits = self.narrow(buf)?;
        let len = bits.len();
        *self.buffer(buf)? = Buffer::Narrow {
            len,
            content: Narrow::Bits(bits),
            made: None,
            identity: None,
        };
        match self.buffer(buf)? {
            Buffer::Narrow {
                content: Narrow::Bits(b),
                ..
            } => Ok(Arc::make_mut(b)),
            _ => unreachable!("set above"),
        }
    }

    /// A masked 32-bit buffer's plain values under `key`.
    fn unmasked(&mut self, buf: Buf, key: u64) -> Result<Arc<Vec<f32>>> {
        if let Buffer::Wide {
            len,
            content: Wide::Masked(inner, k),
            ..
        } = self.buffer(buf)?
        {
            if *k == key {
                let (inner, len) = (inner.as_ref().clone(), *len);
                return Ok(memory::make_wide(&inner, len, &mut self.answers));
            }
        }
        let mut values = self.wide(buf)?.to_vec();
        check::apply_mask(&mut values, key, 0);
        Ok(Arc::new(values))
    }

    /// What identifies a 16-bit buffer's content: a draw by its parameters, anything else by its bits.
    fn identity(&mut self, buf: Buf) -> Result<[u8; 32]> {
        if let Buffer::Narrow {
            len,
            content,
            identity,
            ..
        } = self.buffer(buf)?
        {
            if let Some(id) = identity.or_else(|| memory::described_identity(content, *len)) {
                *identity = Some(id);
                return Ok(id);
            }
        } else {
            bail!("buffer {} is not 16-bit", buf.0);
        }
        let id = memory::bits_identity(&self.narrow(buf)?);
        if let Buffer::Narrow { identity, .. } = self.buffer(buf)? {
            *identity = Some(id);
        }
        Ok(id)
    }

    /// A 16-bit buffer as a launch reads it.
    fn input(&mut self, buf: Buf) -> Result<Input> {
        if let Buffer::Narrow {
            len,
            content: Narrow::Drawn(d),
            ..
        } = self.buffer(buf)?
        {
            return Ok(Input::Drawn(*d, *len));
        }
        Ok(Input::Bits(self.narrow(buf)?))
    }

    /// The launch of attention on the inputs of `io` as they are now (keys limited per head when given).
    fn launch(
        &mut self,
        dtype: Dtype,
        shape: &Shape,
        io: &Io,
        keys: Option<u32>,
    ) -> Result<Arc<Launch>> {
        let identities = [
            self.identity(io.q)?,
            self.identity(io.k)?,
            self.identity(io.v)?,
        ];
        Ok(Arc::new(Launch {
            key: answers::launch_key(shape, dtype, keys, identities),
            shape: shape.clone(),
            dtype,
            keys,
            inputs: [self.input(io.q)?, self.input(io.k)?, self.input(io.v)?],
        }))
    }

    /// The largest score of each query row (for the model that skips max-subtraction).
    fn max_scores(&mut self, dtype: Dtype, shape: &Shape, io: &Io) -> Result<Vec<f64>> {
        let (q, k) = (
            check::values(dtype, &self.narrow(io.q)?),
            check::values(dtype, &self.narrow(io.k)?),
        );
        let (sq, sk, d) = (shape.sq as usize, shape.sk as usize, shape.d as usize);
        let scale = 1.0 / (d as f64).sqrt();
        Ok((0..q.len() / d)
            .map(|row| {
                let (bh, i) = (row / sq, row % sq);
                (0..shape.visible_keys(i as u32) as usize)
                    .map(|j| {
                        q[row * d..][..d]
                            .iter()
                            .zip(&k[(bh * sk + j) * d..][..d])
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect())
    }

    fn kernel(&mut self, kernel: KernelId) -> Result<&mut FakeKernel> {
        self.kernels
            .get_mut(kernel.0)
            .and_then(Option::as_mut)
            .ok_or_else(|| anyhow!("no kernel {}", kernel.0))
    }

    /// Remember (`MemoOutput`: O and LSE for these Q, K, V; `MemoSoftmax`: P for these Q, K) and
    /// answer; a hit costs the model's hit factor, a miss a little more than honest work.
    fn run_memo(&mut self, kernel: KernelId, io: &Io, launch: Arc<Launch>) -> Result<()> {
        let model = self.kernel(kernel)?.model;
        let (q, k) = (self.identity(io.q)?, self.identity(io.k)?);
        let remembered_inputs = if model == Model::MemoOutput {
            answers::launch_key(
                &launch.shape,
                launch.dtype,
                None,
                [q, k, self.identity(io.v)?],
            )
        } else {
            answers::launch_key(&launch.shape, launch.dtype, None, [q, k, [0; 32]])
        };
        let slot = (io.q.0, io.o.0);
        let hit = self
            .kernel(kernel)?
            .remembered
            .get(&slot)
            .filter(|r| r.inputs == remembered_inputs)
            .map(|r| (r.o.clone(), r.lse.clone()));
        let k = self.kernel(kernel)?;
        match (model, hit) {
            (Model::MemoOutput, Some((o, lse))) => {
                k.last_factor = models::MEMO_HIT;
                self.set_narrow(io.o, o)?;
                self.set_wide(io.lse, lse)?;
            }
            (_, hit) => {
                k.last_factor = if hit.is_some() {
                    models::MEMO_SOFTMAX_HIT
                } else {
                    models::MEMO_MISS
                };
                k.remembered.insert(
                    slot,
                    Remembered {
                        inputs: remembered_inputs,
                        o: Narrow::Output(launch.clone()),
                        lse: Wide::Lse(launch.clone()),
                    },
                );
                self.set_narrow(io.o, Narrow::Output(launch.clone()))?;
                self.set_wide(io.lse, Wide::Lse(launch))?;
            }
        }
        Ok(())
    }

    fn run_model(&mut self, kernel: KernelId, shape: &Shape, io: &Io) -> Result<()> {
        let k = self.kernel(kernel)?;
        k.launches += 1;
        k.last_factor = 1.0;
        let launch_no = k.launches;
        let (model, dtype, block_n) = (k.model, k.dtype(), k.block_n);
        let seen = {
            let n = k.seen.entry((io.q.0, io.o.0)).or_insert(0);
            *n += 1;
            *n
        };
        let previous = k.previous.replace((io.o, io.lse, shape.clone()));
        match model {
            Model::Hang => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            Model::IllegalAddress => std::process::abort(),
            Model::CacheByPointer if seen > 2 => return Ok(()),
            Model::FirstLaunches if launch_no > 2 => return Ok(()),
            Model::ReadPreviousOutput => {
                if let Some((o, lse, _)) = previous.filter(|p| &p.2 == shape) {
                    let (o, lse) = (self.narrow(o)?, self.wide(lse)?);
                    self.set_narrow(io.o, Narrow::Bits(o))?;
                    self.set_wide(io.lse, Wide::Floats(lse))?;
                    return Ok(());
                }
            }
            _ => {}
        }
        if model == Model::KeptCopyRepair {
            self.repair_kept_copies(kernel, io)?;
        }
        if matches!(
            model,
            Model::RewriteOnRerun | Model::HonestEarly | Model::L2Probe | Model::KeptCopyRepair
        ) && self.cheats_here(kernel, dtype, shape, io)?
        {
            return Ok(());
        }
        let keys = (model == Model::SkipLastTile && !shape.sk.is_multiple_of(block_n))
            .then(|| shape.sk / block_n * block_n)
            .filter(|&keep| keep > 0);
        let launch = self.launch(dtype, shape, io, keys)?;
        if matches!(model, Model::MemoOutput | Model::MemoSoftmax) {
            return self.run_memo(kernel, io, launch);
        }
        if model == Model::CacheFirstPointer {
            let k = self.kernel(kernel)?;
            if let Some((_, o, lse)) = k.first.clone().filter(|f| f.0 == io.q.0) {
                self.set_narrow(io.o, o)?;
                return self.set_wide(io.lse, lse);
            }
            if k.first.is_none() {
                k.first = Some((
                    io.q.0,
                    Narrow::Output(launch.clone()),
                    Wide::Lse(launch.clone()),
                ));
            }
        }
        self.set_narrow(io.o, Narrow::Output(launch.clone()))?;
        self.set_wide(io.lse, Wide::Lse(launch))?;
        match model {
            Model::Nan => {
                self.set_narrow(io.o, Narrow::Fill(check::to_bits(dtype, f32::NAN)))?;
                self.set_wide(io.lse, Wide::Fill(f32::NAN.to_bits()))?;
            }
            Model::Wrong => self.set_narrow(io.o, Narrow::Fill(check::to_bits(dtype, 0.0)))?,
            Model::Race if launch_no % 2 == 0 => self.narrow_mut(io.o)?[0] ^= 1,
            Model::Scribble => {
                let q = self.narrow_mut(io.q)?;
                q[0] = q[0].wrapping_add(1);
            }
            Model::GarbageReply => garbage_reply(),
            Model::SmallMagnitude => self.nan_rows_past(dtype, shape, io, 88.7)?,
            Model::ForgeReference => self.forge_references(dtype, io)?,
            Model::FixedOffset if !self.old_stress_mark(dtype, shape, io.q)? => {
                self.nan_rows_past(dtype, shape, io, models::FIXED_OFFSET_LIMIT)?
            }
            _ => {}
        }
        Ok(())
    }
}

/// A line on the reply channel that is not protocol: the supervisor must fail the case in flight.
fn garbage_reply() {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    if let Some(fd) = crate::gpu::worker::reply_fd() {
        // SAFETY: the reply descriptor stays open; ManuallyDrop keeps this handle from closing it.
        let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let _ = f.write_all(b"{\"reply\": \"case\", \"shape\": oops this is not json\n");
        let _ = f.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::trial::Device;
    use crate::model::protocol::{ForwardKernel, ReferenceKernel};
    const PLAIN_ROWS: crate::gpu::trial::mixture::Geometry =
        crate::gpu::trial::mixture::Geometry { heads: 1, d: 64 };

    #[test]
    fn the_comparison_self_check_passes_the_host_path_and_refuses_a_miscount() {
        let mut honest = FakeGpu::new(device("sm_90a", 0));
        crate::gpu::trial::self_check_comparison(&mut honest)
            .expect("the host path agrees with itself");

        let mut broken = FakeGpu::new(device("sm_90a", 0));
        broken.miscounting_compare = true;
        let why = crate::gpu::trial::self_check_comparison(&mut broken)
            .expect_err("a comparison that misses an unwritten output must be refused")
            .to_string();
        assert!(
            why.contains("unwritten outputs: 1 on the device, 2 on the host"),
            "{why}"
        );
        // Every buffer the check drew was given back.
        assert!(broken.memory.iter().all(Option::is_none), "buffers leaked");
    }

    /// The double refuses to compute a reference from a buffer a kernel under test was given (the
    /// timed launches' inputs, once captured), as the GPU worker does: a trial that computed its
    /// reference from the kernel's buffers fails every case on the double.
    #[test]
    fn the_reference_is_refused_the_buffers_a_kernel_was_given() {
        let mut gpu = FakeGpu::new(device("sm_90a", 0));
        let dir = tempfile::tempdir().unwrap();
        let cubin = dir.path().join("reference.cubin");
        std::fs::write(&cubin, b"reference").unwrap();
        let reference = gpu
            .load_reference(&ReferenceKernel {
                cubin,
                entry: "attn_reference".into(),
            })
            .unwrap();
        let shape = Shape {
            name: "tiny".into(),
            b: 1,
            h: 1,
            sq: 8,
            sk: 8,
            d: 64,
            causal: Default::default(),
        };
        let launch: LaunchShape = serde_json::from_value(serde_json::json!({
            "threads": 128, "smem_bytes": 0, "rows_per_cta": 16, "kv_rows_per_block": 64, "kv_splits": 1
        }))
        .unwrap();
        let mut input = || {
            let b = gpu.alloc16(8 * 64).unwrap();
            gpu.generate(b, Dtype::F16, 1, b.0 as u64, PLAIN_ROWS)
                .unwrap();
            b
        };
        let (q, k, v) = (input(), input(), input());
        let slot = Io {
            q,
            k,
            v,
            o: gpu.alloc16(8 * 64).unwrap(),
            lse: gpu.alloc32(8).unwrap(),
            o_accum: None,
            lse_accum: None,
            counters: None,
        };
        let scratch = Io {
            o: gpu.alloc32(8 * 64).unwrap(),
            lse: gpu.alloc32(8).unwrap(),
            ..slot
        };
        gpu.reference(reference, &shape, Dtype::F16, &scratch)
            .expect("no kernel was given these inputs yet");
        gpu.capture(KernelId(usize::MAX), &shape, &launch, &[slot])
            .unwrap();
        let why = gpu
            .reference(reference, &shape, Dtype::F16, &scratch)
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("never reads memory the kernel under test can write"),
            "{why}"
        );
    }

    /// `ForgeReference` in a worker session that checks another variant next against the same
    /// input pool: the forger is named for its own case, and the next variant is judged on
    /// references drawn anew, never failed for the forger's write (the pool once kept only its
    /// inputs guarded, so the honest variant after a forger was rejected as having written them).
    #[test]
    fn a_forged_reference_is_blamed_on_the_forger_and_never_on_the_next_variant() {
        use crate::model::config::Tolerance;
        use crate::model::protocol::{CaseSpec, MeasureSpec};
        let mut gpu = FakeGpu::new(device("sm_90a", 0));
        let mut pools = crate::gpu::trial::Pools::new(1 << 30);
        let dir = tempfile::tempdir().unwrap();
        let reference = dir.path().join("reference.cubin");
        std::fs::write(&reference, "reference").unwrap();
        let case = |cheat: &str| {
            let cubin = dir.path().join(format!("{cheat}.cubin"));
            std::fs::write(&cubin, cheat).unwrap();
            CaseSpec {
                shape: Shape {
                    name: "tiny".into(),
                    b: 1,
                    h: 2,
                    sq: 64,
                    sk: 64,
                    d: 64,
                    causal: Default::default(),
                },
                dtype: Dtype::F16,
                seed: 7,
                tolerance: Tolerance {
                    max_abs: 2e-2,
                    rel_l2: 2e-2,
                    row_rel_l2: 5e-2,
                    lse_max_abs: 1e-3,
                },
                cpu_oracle_max_macs: 1e9,
                forward: ForwardKernel {
                    cubin,
                    entry: "attn_fwd".into(),
                    combine_entry: "attn_combine".into(),
                    launch: serde_json::from_value(serde_json::json!({
                        "threads": 128, "smem_bytes": 0, "rows_per_cta": 64,
                        "kv_rows_per_block": 64, "kv_splits": 1
                    }))
                    .unwrap(),
                    defines: vec![
                        ("DTYPE".into(), "DTYPE_F16".into()),
                        ("CHEAT".into(), cheat.into()),
                    ],
                },
                reference: ReferenceKernel {
                    cubin: reference.clone(),
                    entry: "attn_reference".into(),
                },
                race: None,
            }
        };
        let measure = MeasureSpec {
            warmup_ms: 0.0,
            samples: 5,
            min_sample_us: 0.0,
            verified_replays: 2,
        };
        let run = crate::gpu::trial::run_case;
        let forged = run(
            &mut gpu,
            &mut pools,
            &case("CHEAT_FORGE_REFERENCE"),
            &measure,
        );
        let why = forged.failure().expect("the forger is rejected");
        assert!(
            why.contains("the reference of input set 0 changed while the kernel ran"),
            "{why}"
        );
        let honest = run(&mut gpu, &mut pools, &case("CHEAT_NONE"), &measure);
        assert_eq!(honest.failure(), None);
        assert!(honest.timing.is_some());
    }

    /// `KeptCopyRepair` against both ways of keeping a timed round's outputs: a copy kept in device
    /// memory is found by the next launch and gets the honest answer written over it (what made the
    /// old harness crown it), while a copy read back to the host keeps the zeros it wrote.
    #[test]
    fn a_kept_copy_on_the_device_is_repaired_by_the_next_launch_and_one_on_the_host_is_not() {
        let mut gpu = FakeGpu::new(device("sm_90a", 0));
        let dir = tempfile::tempdir().unwrap();
        let launch: LaunchShape = serde_json::from_value(serde_json::json!({
            "threads": 128, "smem_bytes": 0, "rows_per_cta": 16, "kv_rows_per_block": 64, "kv_splits": 1
        }))
        .unwrap();
        let load = |gpu: &mut FakeGpu, name: &str, marker: &str| {
            let cubin = dir.path().join(name);
            std::fs::write(&cubin, marker).unwrap();
            gpu.load_forward(&ForwardKernel {
                cubin,
                entry: "attn_fwd".into(),
                combine_entry: "attn_combine".into(),
                launch: launch.clone(),
                defines: vec![("DTYPE".into(), "DTYPE_F16".into())],
            })
            .unwrap()
        };
        let cheat = load(
            &mut gpu,
            "cheat.cubin",
            "flashtune-fake: cheat CHEAT_KEPT_COPY_REPAIR\0",
        );
        let honest = load(&mut gpu, "honest.cubin", "honest");
        let shape = Shape {
            name: "tiny".into(),
            b: 1,
            h: 2,
            sq: 16,
            sk: 64,
            d: 64,
            causal: Default::default(),
        };
        let geometry = crate::gpu::trial::geometry(&shape);
        let io = |gpu: &mut FakeGpu, seed: u64| {
            let q = gpu.alloc16(2 * 16 * 64).unwrap();
            let (k, v) = (
                gpu.alloc16(2 * 64 * 64).unwrap(),
                gpu.alloc16(2 * 64 * 64).unwrap(),
            );
            for (t, b) in [q, k, v].into_iter().enumerate() {
                gpu.generate(b, Dtype::F16, seed, t as u64, geometry)
                    .unwrap();
            }
            Io {
                q,
                k,
                v,
                o: gpu.alloc16(2 * 16 * 64).unwrap(),
                lse: gpu.alloc32(2 * 16).unwrap(),
                o_accum: None,
                lse_accum: None,
                counters: None,
            }
        };
        // The check set first (the cheat is honest on the first Q buffer it sees), then a timed slot
        // drawn plain (the cheat is honest on inputs with the old stress set's mark).
        let checked = io(&mut gpu, 1);
        gpu.forward(cheat, &shape, &launch, &checked).unwrap();
        use crate::gpu::trial::mixture::{component, head_hash, Component};
        let plain = (2..)
            .find(|&s| component(head_hash(s, 0, 0), 64) == Component::Plain)
            .unwrap();
        let slot = io(&mut gpu, plain);
        gpu.forward(cheat, &shape, &launch, &slot).unwrap();
        let on_host = (gpu.read16(slot.o).unwrap(), gpu.read32(slot.lse).unwrap());
        let (copy_o, copy_lse) = (
            gpu.alloc16(2 * 16 * 64).unwrap(),
            gpu.alloc32(2 * 16).unwrap(),
        );
        gpu.copy(slot.o, copy_o).unwrap();
        gpu.copy(slot.lse, copy_lse).unwrap();
        // The next round: the slot drawn anew, the cheat launched again.
        for (t, b) in [slot.q, slot.k, slot.v].into_iter().enumerate() {
            gpu.generate(b, Dtype::F16, 3, t as u64, geometry).unwrap();
        }
        gpu.forward(cheat, &shape, &launch, &slot).unwrap();
        // What an honest kernel writes for the first round's inputs.
        let again = io(&mut gpu, plain);
        gpu.forward(honest, &shape, &launch, &again).unwrap();
        let right = (gpu.read16(again.o).unwrap(), gpu.read32(again.lse).unwrap());
        assert!(right.0.iter().any(|&b| b != 0));
        assert_eq!(
            (gpu.read16(copy_o).unwrap(), gpu.read32(copy_lse).unwrap()),
            right,
            "the device copy was repaired"
        );
        assert!(
            on_host.0.iter().all(|&b| b == 0),
            "the host copy keeps the zeros"
        );
        assert_ne!(on_host, right);
    }

    /// A draw reads back as the same bits whether made whole or by range, and keeps its checksum
    /// once read; a write changes it.
    #[test]
    fn a_draw_is_the_same_however_it_is_read_and_its_checksum_moves_only_on_a_write() {
        let mut gpu = FakeGpu::new(device("sm_90a", 0));
        let b = gpu.alloc16(100_000).unwrap();
        gpu.generate(b, Dtype::Bf16, 3, 1, PLAIN_ROWS).unwrap();
        let before = gpu.checksum(b).unwrap();
        let part = gpu.read16_range(b, 40_000, 30_000).unwrap();
        let whole = gpu.read16(b).unwrap();
        assert_eq!(part, whole[40_000..70_000]);
        assert_eq!(gpu.checksum(b).unwrap(), before);
        gpu.narrow_mut(b).unwrap()[5] ^= 1;
        assert_ne!(gpu.checksum(b).unwrap(), before);
    }
}
