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
//! - `FLASHTUNE_FAKE_GPUS=N` makes the double show N GPUs of one model (default 1): ordinals 0 to
//!   N-1 open, any other is refused as the driver refuses it, so multi-GPU runs are tested in CI.
//!   `FLASHTUNE_FAKE_GPU_TIMES=1.0,0.5` makes GPU n's times (the sentinel's and the kernels') the
//!   n-th factor times the model's: two chips of one model that differ, or one that flatters every
//!   case it times, which only a duel on one GPU sees through.
//!
//! The double compares outputs on the host (`trial::compare_on_host`), the path the GPU's own
//! comparison kernel is held to. `FLASHTUNE_FAKE_COMPARE=miscount` makes its comparison miss one
//! unwritten output in every row set, as a broken comparison kernel would: the probe's self-check
//! must then refuse the device.
//!
//! The sentinel's figures are fixed: `fma` 1000 µs and `read` 400 µs (times the drift factor).
pub mod answers;
mod cheats;
pub mod memory;
pub mod models;
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
        visible_devices: visible_devices(),
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

/// GPUs the double shows (`FLASHTUNE_FAKE_GPUS`, default 1).
fn visible_devices() -> u32 {
    std::env::var("FLASHTUNE_FAKE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(1)
}

pub fn serve(arch: &str, ordinal: u32) -> std::process::ExitCode {
    let mut reply = crate::gpu::worker::reply_channel();
    let visible = visible_devices();
    if ordinal >= visible {
        // As the driver answers for an ordinal it does not have: a `--gpus` typo must not run.
        reply(&crate::model::protocol::WorkerMessage::Fatal {
            message: format!(
                "cannot create a CUDA context on GPU {ordinal}: the fake GPU shows {visible} (FLASHTUNE_FAKE_GPUS), ordinals 0 to {}",
                visible - 1
            ),
        });
        return std::process::ExitCode::from(1);
    }
    let mut gpu = FakeGpu::new(device(arch, ordinal));
    gpu.drift = std::env::var("FLASHTUNE_FAKE_DRIFT")
        .ok()
        .and_then(|spec| models::parse_drift(&spec));
    gpu.chip_factor = std::env::var("FLASHTUNE_FAKE_GPU_TIMES")
        .ok()
        .and_then(|spec| models::chip_factor(&spec, ordinal))
        .unwrap_or(1.0);
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
    pub memory: Vec<Option<Buffer>>,
    kernels: Vec<Option<FakeKernel>>,
    graphs: Vec<Option<(KernelId, Shape, LaunchShape, Vec<Io>)>>,
    answers: Answers,
    /// `FLASHTUNE_FAKE_DRIFT`: after this many cases timed, every time is this many times longer.
    drift: Option<(u64, f64)>,
    /// `FLASHTUNE_FAKE_GPU_TIMES`: this GPU's times against the model's (below 1 flatters).
    chip_factor: f64,
    nvml_absent: bool,
    /// `FLASHTUNE_FAKE_PACE_MS`: wall time each timed case takes.
    pace: Option<std::time::Duration>,
    /// `FLASHTUNE_FAKE_COMPARE=miscount`: the comparison misses an unwritten output.
    pub miscounting_compare: bool,
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
            chip_factor: 1.0,
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
    pub fn narrow_mut(&mut self, buf: Buf) -> Result<&mut Vec<u16>> {
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
