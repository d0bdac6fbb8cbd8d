//! `flashtune worker --fake ARCH`: the GPU-less test double. It implements the trial's `Device` on host memory, so CI runs the real trial (poisoning, comparison, timed-output verification, re-checks, the protocol) on real arrays.
//!
//! Kernels are models chosen by the cubin's `FAULT` / `CHEAT` defines or by marker strings compiled
//! into it (`flashtune-fake: fault FAULT_WRONG`, `flashtune-fake: cheat CHEAT_RACE`): an honest model
//! computes attention with the CPU oracle; a fault or cheat misbehaves the way its name says. Times are
//! synthetic, from a fixed model of the parameters (below) times the cubin's `flashtune-fake: time xS`
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
//! - `FLASHTUNE_FAKE_NVML=absent` makes the state unreadable, as on a machine without NVML.
//!
//! The double compares outputs on the host (`trial::compare_on_host`), the path the GPU's own
//! comparison kernel is held to. `FLASHTUNE_FAKE_COMPARE=miscount` makes its comparison miss one
//! unwritten output in every row set, as a broken comparison kernel would: the probe's self-check
//! must then refuse the device.
//!
//! The sentinel's figures are fixed: `fma` 1000 µs and `read` 400 µs (times the drift factor).
use crate::check;
use crate::config::{Dtype, Shape};
use crate::protocol::*;
use crate::space::LaunchShape;
use crate::trial::{Buf, Device, GraphId, Io, KernelId};
use anyhow::{anyhow, bail, Result};
use std::collections::HashMap;
use std::sync::Arc;

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
    }
}

/// The synthetic roofs of the double, so the plausibility gate has something to hold figures to.
pub const FAKE_MATMUL_TFLOPS: f64 = 700.0;
pub const FAKE_COPY_GBPS: f64 = 2000.0;
pub const FAKE_READ_GBPS: f64 = 2500.0;

pub fn serve(arch: &str, ordinal: u32) -> std::process::ExitCode {
    let mut reply = crate::worker::reply_channel();
    let mut gpu = FakeGpu::new(device(arch, ordinal));
    gpu.drift = std::env::var("FLASHTUNE_FAKE_DRIFT")
        .ok()
        .and_then(|spec| parse_drift(&spec));
    gpu.nvml_absent = std::env::var("FLASHTUNE_FAKE_NVML").is_ok_and(|v| v == "absent");
    gpu.miscounting_compare =
        std::env::var("FLASHTUNE_FAKE_COMPARE").is_ok_and(|v| v == "miscount");
    crate::trial::serve(gpu, std::io::stdin().lock(), &mut reply, 256 << 20)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Model {
    Honest,
    Hang,
    IllegalAddress,
    Nan,
    Wrong,
    /// Writes a line that is not protocol on the reply channel, then answers honestly.
    GarbageReply,
    /// Writes into its own input Q: outside its outputs.
    Scribble,
    /// Skips the work for a (Q, O) pair it has seen twice: a result cached per pointer.
    CacheByPointer,
    /// Writes its outputs on its first two launches only (enough to pass a two-run check).
    FirstLaunches,
    /// Copies the previous launch's output when the shape matches.
    ReadPreviousOutput,
    /// Caches its outputs per (Q pointer, sign of V's first element): right through the timed
    /// replays (both signs are cached), stale once other values sit behind the same pointers.
    /// Test-double only: what the re-check on fresh inputs exists to catch.
    CacheByPointerAndSign,
    /// Every other launch flips the lowest bit of one output: a race.
    Race,
    /// No max-subtraction: rows with a score past 88.7 overflow fp32 exp and come out NaN.
    SmallMagnitude,
    /// Ignores the keys of the last KV tile when Sk is not a tile multiple.
    SkipLastTile,
}

fn model_named(name: &str) -> Option<Model> {
    Some(match name {
        "FAULT_NONE" | "CHEAT_NONE" => Model::Honest,
        "FAULT_HANG" => Model::Hang,
        "FAULT_ILLEGAL_ADDRESS" => Model::IllegalAddress,
        "FAULT_NAN" => Model::Nan,
        "FAULT_WRONG" => Model::Wrong,
        "FAULT_GARBAGE_REPLY" => Model::GarbageReply,
        "FAULT_SCRIBBLE" | "CHEAT_WRITE_OUTSIDE" => Model::Scribble,
        "CHEAT_CACHE_BY_POINTER" => Model::CacheByPointer,
        "CHEAT_FIRST_LAUNCHES" => Model::FirstLaunches,
        "CHEAT_READ_PREVIOUS_OUTPUT" => Model::ReadPreviousOutput,
        "CHEAT_CACHE_BY_POINTER_AND_SIGN" => Model::CacheByPointerAndSign,
        "CHEAT_RACE" => Model::Race,
        "CHEAT_SMALL_MAGNITUDE" => Model::SmallMagnitude,
        "CHEAT_SKIP_LAST_TILE" => Model::SkipLastTile,
        _ => return None,
    })
}

/// `after_cases=N,factor=F`: (N, F).
fn parse_drift(spec: &str) -> Option<(u64, f64)> {
    let mut after = None;
    let mut factor = None;
    for part in spec.split(',') {
        match part.trim().split_once('=')? {
            ("after_cases", v) => after = v.parse().ok(),
            ("factor", v) => factor = v.parse().ok().filter(|f: &f64| *f > 0.0),
            _ => return None,
        }
    }
    Some((after?, factor?))
}

/// What the GPU was doing while a modelled kernel was timed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StateModel {
    Clean,
    Thermal,
    Power,
    Neighbour,
}

/// A state name (`thermal`, `power_once`, `FAKE_STATE_NEIGHBOUR`): the state, and whether it holds
/// for the first timing only.
fn state_named(name: &str) -> Option<(StateModel, bool)> {
    let name = name.trim_start_matches("FAKE_STATE_").to_ascii_lowercase();
    let (base, once) = match name
        .strip_suffix("_once")
        .or_else(|| name.strip_suffix("-once"))
    {
        Some(b) => (b.to_owned(), true),
        None => (name, false),
    };
    let model = match base.as_str() {
        "clean" | "none" => StateModel::Clean,
        "thermal" => StateModel::Thermal,
        "power" => StateModel::Power,
        "neighbour" | "neighbor" => StateModel::Neighbour,
        _ => return None,
    };
    Some((model, once))
}

/// The word after `flashtune-fake: <what>` in the cubin's bytes (string constants survive compilation).
fn cubin_marker(bytes: &[u8], what: &str) -> Option<String> {
    let needle = format!("flashtune-fake: {what}");
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())?
        + needle.len();
    let word: String = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_graphic())
        .map(|&b| b as char)
        .collect();
    Some(word)
}

struct FakeKernel {
    model: Model,
    /// Multiplier on the modelled time (`flashtune-fake: time x0.5`).
    time_scale: f64,
    defines: Vec<(String, String)>,
    block_n: u32,
    launches: u64,
    seen: HashMap<(usize, usize), u32>,
    previous: Option<(Buf, Buf, Shape)>,
    /// Outputs cached by (Q buffer, V's first sign bit), for `CacheByPointerAndSign`.
    cached: HashMap<(usize, u16), (Vec<u16>, Vec<f32>)>,
    /// A reference kernel that answers NaN (`flashtune-fake: reference nan`).
    nan_reference: bool,
    /// The GPU's state while this kernel is timed, and whether only on its first timing.
    state: (StateModel, bool),
    cubin: std::path::PathBuf,
}

enum Memory {
    U16(Vec<u16>),
    F32(Vec<f32>),
}

/// A buffer's content hash, kept until the buffer is written: launches read far more than they write.
type HashCache = HashMap<usize, [u8; 32]>;

/// Honest attention on one input content, memoised: the double's "GPU time" is CPU time.
type Answer = Arc<(Vec<f32>, Vec<f32>)>;

pub struct FakeGpu {
    info: DeviceInfo,
    memory: Vec<Option<Memory>>,
    kernels: Vec<Option<FakeKernel>>,
    graphs: Vec<Option<(KernelId, Shape, LaunchShape, Vec<Io>)>>,
    answers: HashMap<[u8; 32], Answer>,
    hashes: HashCache,
    /// `FLASHTUNE_FAKE_DRIFT`: after this many cases timed, every time is this many times longer.
    drift: Option<(u64, f64)>,
    nvml_absent: bool,
    /// `FLASHTUNE_FAKE_COMPARE=miscount`: the comparison misses an unwritten output.
    miscounting_compare: bool,
    cases_timed: u64,
    /// The kernel and shape of the last replay: whose state the next reading reports.
    last_replayed: Option<(KernelId, String)>,
    /// Timings so far per (cubin, shape), for the states that hold on the first only.
    timings_of: HashMap<(std::path::PathBuf, String), u32>,
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

/// A buffer's whole content from the host; the lengths must agree.
fn fill_from<T: Copy>(buffer: &mut [T], data: &[T]) -> Result<()> {
    if buffer.len() != data.len() {
        bail!("upload of {} elements into {}", data.len(), buffer.len());
    }
    buffer.copy_from_slice(data);
    Ok(())
}

fn as_bytes(words: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding; viewing it as bytes is sound.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 2) }
}

/// A memo key: the shape, the inputs' content hashes and what is asked of them.
fn hash_parts(shape: &Shape, parts: &[&[u8; 32]], tag: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(format!("{shape:?}|{tag}").as_bytes());
    for p in parts {
        h.update(&p[..]);
    }
    *h.finalize().as_bytes()
}

impl FakeGpu {
    pub fn new(info: DeviceInfo) -> Self {
        FakeGpu {
            info,
            memory: Vec::new(),
            kernels: Vec::new(),
            graphs: Vec::new(),
            answers: HashMap::new(),
            hashes: HashMap::new(),
            drift: None,
            nvml_absent: false,
            miscounting_compare: false,
            cases_timed: 0,
            last_replayed: None,
            timings_of: HashMap::new(),
        }
    }

    /// How much longer every time is now: the drift factor once it has set in, else 1.
    fn drift_factor(&self) -> f64 {
        match self.drift {
            Some((after, factor)) if self.cases_timed >= after => factor,
            _ => 1.0,
        }
    }

    /// The hash of a 16-bit buffer's bytes, computed once per content.
    fn content(&mut self, buf: Buf) -> Result<[u8; 32]> {
        if let Some(h) = self.hashes.get(&buf.0) {
            return Ok(*h);
        }
        let words = self.u16s(buf)?;
        // SAFETY: u16 has no padding; viewing it as bytes is sound.
        let bytes =
            unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 2) };
        let h = *blake3::hash(bytes).as_bytes();
        self.hashes.insert(buf.0, h);
        Ok(h)
    }

    fn u16s(&self, buf: Buf) -> Result<&Vec<u16>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(v)) => Ok(v),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn u16s_mut(&mut self, buf: Buf) -> Result<&mut Vec<u16>> {
        self.hashes.remove(&buf.0);
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Memory::U16(v)) => Ok(v),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn f32s_mut(&mut self, buf: Buf) -> Result<&mut Vec<f32>> {
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Memory::F32(v)) => Ok(v),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    /// Attention on the inputs of `io` (keys limited to `keys` per head when given), as fp32.
    fn answer(
        &mut self,
        dtype: Dtype,
        shape: &Shape,
        io: &Io,
        keys: Option<u32>,
    ) -> Result<Answer> {
        let (hq, hk, hv) = (
            self.content(io.q)?,
            self.content(io.k)?,
            self.content(io.v)?,
        );
        let tag = format!("{dtype}|{keys:?}");
        let key = hash_parts(shape, &[&hq, &hk, &hv], &tag);
        if let Some(a) = self.answers.get(&key) {
            return Ok(a.clone());
        }
        let (q, k, v) = (self.u16s(io.q)?, self.u16s(io.k)?, self.u16s(io.v)?);
        let (qv, mut kv, mut vv) = (
            check::values(dtype, q),
            check::values(dtype, k),
            check::values(dtype, v),
        );
        let mut s = shape.clone();
        if let Some(keep) = keys {
            // Every head keeps its first `keep` keys: the rest of K and V is dropped.
            let (sk, d) = (shape.sk as usize, shape.d as usize);
            let heads = (shape.b * shape.h) as usize;
            let take = |x: &[f32]| -> Vec<f32> {
                (0..heads)
                    .flat_map(|h| x[h * sk * d..][..keep as usize * d].to_vec())
                    .collect()
            };
            kv = take(&kv);
            vv = take(&vv);
            s.sk = keep;
        }
        let (o, lse) = check::cpu_attention(&s, &qv, &kv, &vv);
        let answer: Answer = Arc::new((
            o.iter().map(|&x| x as f32).collect(),
            lse.iter().map(|&x| x as f32).collect(),
        ));
        // O is linear in V: the answer for -V (the trial negates V between replays) is -O, same LSE.
        let negated_v: Vec<u16> = self.u16s(io.v)?.iter().map(|b| b ^ 0x8000).collect();
        let negated_hash = *blake3::hash(as_bytes(&negated_v)).as_bytes();
        let mirror = hash_parts(shape, &[&hq, &hk, &negated_hash], &tag);
        self.answers.insert(
            mirror,
            Arc::new((answer.0.iter().map(|x| -x).collect(), answer.1.clone())),
        );
        self.answers.insert(key, answer.clone());
        Ok(answer)
    }

    /// The largest score of each query row (for the model that skips max-subtraction), memoised.
    fn max_scores(&mut self, dtype: Dtype, shape: &Shape, io: &Io) -> Result<Vec<f64>> {
        let (hq, hk) = (self.content(io.q)?, self.content(io.k)?);
        let key = hash_parts(shape, &[&hq, &hk], &format!("{dtype}|max"));
        if let Some(a) = self.answers.get(&key) {
            return Ok(a.1.iter().map(|&x| x as f64).collect());
        }
        let (q, k) = (
            check::values(dtype, self.u16s(io.q)?),
            check::values(dtype, self.u16s(io.k)?),
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
            .collect::<Vec<f64>>())
        .map(|maxes| {
            let as_f32 = maxes.iter().map(|&m| m as f32).collect();
            self.answers.insert(key, Arc::new((Vec::new(), as_f32)));
            maxes
        })
    }

    fn write_answer(&mut self, dtype: Dtype, io: &Io, a: &Answer) -> Result<()> {
        let o: Vec<u16> = a.0.iter().map(|&x| check::to_bits(dtype, x)).collect();
        *self.u16s_mut(io.o)? = o;
        *self.f32s_mut(io.lse)? = a.1.clone();
        Ok(())
    }

    fn dtype_of(defines: &[(String, String)]) -> Dtype {
        match defines.iter().find(|(k, _)| k == "DTYPE") {
            Some((_, v)) if v == "DTYPE_BF16" => Dtype::Bf16,
            _ => Dtype::F16,
        }
    }

    fn run_model(&mut self, kernel: KernelId, shape: &Shape, io: &Io) -> Result<()> {
        let k = self.kernels[kernel.0]
            .as_mut()
            .ok_or_else(|| anyhow!("no kernel {}", kernel.0))?;
        k.launches += 1;
        let launch_no = k.launches;
        let (model, dtype, block_n) = (k.model, Self::dtype_of(&k.defines), k.block_n);
        let pair = (io.q.0, io.o.0);
        let seen = {
            let n = k.seen.entry(pair).or_insert(0);
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
                    let (o, lse) = (self.u16s(o)?.clone(), self.read32(lse)?);
                    *self.u16s_mut(io.o)? = o;
                    *self.f32s_mut(io.lse)? = lse;
                    return Ok(());
                }
            }
            _ => {}
        }
        if model == Model::CacheByPointerAndSign {
            let sign = self.u16s(io.v)?[0] & 0x8000;
            let k = self.kernels[kernel.0].as_mut().expect("loaded above");
            if let Some((o, lse)) = k.cached.get(&(io.q.0, sign)).cloned() {
                *self.u16s_mut(io.o)? = o;
                *self.f32s_mut(io.lse)? = lse;
                return Ok(());
            }
            let answer = self.answer(dtype, shape, io, None)?;
            self.write_answer(dtype, io, &answer)?;
            let kept = (self.u16s(io.o)?.clone(), self.read32(io.lse)?);
            let k = self.kernels[kernel.0].as_mut().expect("loaded above");
            k.cached.insert((io.q.0, sign), kept);
            return Ok(());
        }
        let keys = (model == Model::SkipLastTile && shape.sk % block_n != 0)
            .then(|| shape.sk / block_n * block_n)
            .filter(|&keep| keep > 0);
        let answer = self.answer(dtype, shape, io, keys)?;
        self.write_answer(dtype, io, &answer)?;
        match model {
            Model::Nan => {
                self.u16s_mut(io.o)?.fill(check::to_bits(dtype, f32::NAN));
                self.f32s_mut(io.lse)?.fill(f32::NAN);
            }
            Model::Wrong => self.u16s_mut(io.o)?.fill(check::to_bits(dtype, 0.0)),
            Model::Race if launch_no % 2 == 0 => self.u16s_mut(io.o)?[0] ^= 1,
            Model::Scribble => {
                let q = self.u16s_mut(io.q)?;
                q[0] = q[0].wrapping_add(1);
            }
            Model::GarbageReply => garbage_reply(),
            Model::SmallMagnitude => {
                let d = shape.d as usize;
                let maxes = self.max_scores(dtype, shape, io)?;
                let nan = check::to_bits(dtype, f32::NAN);
                let o = self.u16s_mut(io.o)?;
                for (row, m) in maxes.iter().enumerate() {
                    if *m > 88.7 {
                        o[row * d..][..d].fill(nan);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Microseconds the model charges for one launch: a fixed function of the parameters.
    ///
    /// time = max((4 µs + FLOPs / rate) × tile × stages × split, 90% of the roofs) × marker, where rate
    /// is 8 (scalar), 60 (wmma) or 250 (mma) TFLOP/s; BLOCK_M 128 costs 1.1× on shapes under 10 GFLOP
    /// and saves 0.85× above; each extra stage saves 5%; a KV split halves decode (Sq = 1) and costs
    /// 1.05× elsewhere. Ranking tests rely on this model; keep it monotone and documented.
    fn model_us(k: &FakeKernel, shape: &Shape, launch: &LaunchShape) -> f64 {
        let get = |name: &str| {
            k.defines
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let rate = match get("MMA") {
            Some("MMA_SCALAR") => 8.0,
            Some("MMA_WMMA") => 60.0,
            _ => 250.0,
        };
        let flops = shape.flops();
        let tile = match get("BLOCK_M").and_then(|v| v.parse::<u32>().ok()) {
            Some(m) if m >= 128 && flops < 1e10 => 1.1,
            Some(m) if m >= 128 => 0.85,
            _ => 1.0,
        };
        let stages = get("STAGES")
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(1.0, |s| 1.0 - 0.05 * (s.saturating_sub(1)) as f64);
        let split = if launch.kv_splits > 1 {
            if shape.sq == 1 {
                0.5
            } else {
                1.05
            }
        } else {
            1.0
        };
        let modelled = (4.0 + flops / (rate * 1e6)) * tile * stages * split;
        // No honest model beats 90% of the double's own roofs: only a time marker can.
        let floor_us = (flops / (0.9 * FAKE_MATMUL_TFLOPS * 1e6)).max(
            shape.min_dram_bytes(FakeGpu::dtype_of(&k.defines)) / (0.9 * FAKE_READ_GBPS * 1e3),
        );
        modelled.max(floor_us) * k.time_scale
    }
}

/// A line on the reply channel that is not protocol: the supervisor must fail the case in flight.
fn garbage_reply() {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    if let Some(fd) = std::env::var(REPLY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    {
        // SAFETY: the reply descriptor stays open; ManuallyDrop keeps this handle from closing it.
        let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let _ = f.write_all(b"{\"reply\": \"case\", \"shape\": oops this is not json\n");
        let _ = f.flush();
    }
}

impl Device for FakeGpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc16(&mut self, len: usize) -> Result<Buf> {
        Ok(Buf(slot(&mut self.memory, Memory::U16(vec![0; len]))))
    }

    fn alloc32(&mut self, len: usize) -> Result<Buf> {
        Ok(Buf(slot(&mut self.memory, Memory::F32(vec![0.0; len]))))
    }

    fn free(&mut self, buf: Buf) {
        self.hashes.remove(&buf.0);
        if let Some(s) = self.memory.get_mut(buf.0) {
            *s = None;
        }
    }

    fn generate(
        &mut self,
        buf: Buf,
        dtype: Dtype,
        seed: u64,
        tensor: u64,
        sigma: f32,
    ) -> Result<()> {
        let len = self.u16s(buf)?.len();
        *self.u16s_mut(buf)? = check::random_bits(dtype, len, seed, tensor, sigma);
        Ok(())
    }

    fn poison(&mut self, buf: Buf) -> Result<()> {
        self.hashes.remove(&buf.0);
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Memory::U16(v)) => v.fill(check::POISON_16),
            Some(Memory::F32(v)) => v.fill(f32::from_bits(check::POISON_F32_BITS)),
            None => bail!("no buffer {}", buf.0),
        }
        Ok(())
    }

    fn negate(&mut self, buf: Buf) -> Result<()> {
        self.u16s_mut(buf)?.iter_mut().for_each(|b| *b ^= 0x8000);
        Ok(())
    }

    fn copy(&mut self, src: Buf, dst: Buf) -> Result<()> {
        fn replace<T>(dst: &mut Vec<T>, data: Vec<T>, unit: &str) -> Result<()> {
            if dst.len() != data.len() {
                bail!(
                    "copy between buffers of {} and {} {unit}",
                    data.len(),
                    dst.len()
                );
            }
            *dst = data;
            Ok(())
        }
        if let Some(Memory::F32(data)) = self.memory.get(src.0).and_then(Option::as_ref) {
            let data = data.clone();
            return replace(self.f32s_mut(dst)?, data, "floats");
        }
        let data = self.u16s(src)?.clone();
        replace(self.u16s_mut(dst)?, data, "elements")
    }

    fn checksum(&mut self, buf: Buf) -> Result<u64> {
        let words = self.u16s(buf)?;
        // SAFETY: u16 has no padding; viewing it as bytes is sound.
        let bytes =
            unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 2) };
        let h = blake3::hash(bytes);
        Ok(u64::from_le_bytes(
            h.as_bytes()[..8].try_into().expect("8 bytes"),
        ))
    }

    fn read16(&mut self, buf: Buf) -> Result<Vec<u16>> {
        self.u16s(buf).cloned()
    }

    fn read32(&mut self, buf: Buf) -> Result<Vec<f32>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(v)) => Ok(v.clone()),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn upload16(&mut self, buf: Buf, data: &[u16]) -> Result<()> {
        fill_from(self.u16s_mut(buf)?, data)
    }

    fn upload32(&mut self, buf: Buf, data: &[f32]) -> Result<()> {
        fill_from(self.f32s_mut(buf)?, data)
    }

    fn mask(&mut self, buf: Buf, key: u64) -> Result<()> {
        check::apply_mask(self.f32s_mut(buf)?, key, 0);
        Ok(())
    }

    fn compare(&mut self, job: &crate::trial::Comparison) -> Result<CheckStats> {
        let mut stats = crate::trial::compare_on_host(self, job)?;
        if self.miscounting_compare && stats.unwritten_count > 0 {
            stats.unwritten_count -= 1;
        }
        Ok(stats)
    }

    fn load_forward(&mut self, kernel: &ForwardKernel) -> Result<KernelId> {
        let bytes = std::fs::read(&kernel.cubin)
            .map_err(|e| anyhow!("cannot load {}: {e}", kernel.cubin.display()))?;
        let named = |key: &str| {
            kernel
                .defines
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let name = named("FAULT")
            .filter(|v| v != "FAULT_NONE")
            .or_else(|| named("CHEAT").filter(|v| v != "CHEAT_NONE"))
            .or_else(|| cubin_marker(&bytes, "fault "))
            .or_else(|| cubin_marker(&bytes, "cheat "))
            .unwrap_or_else(|| "FAULT_NONE".into());
        let model =
            model_named(&name).ok_or_else(|| anyhow!("the test double has no model for {name}"))?;
        let time_scale = cubin_marker(&bytes, "time x")
            .and_then(|w| w.parse::<f64>().ok())
            .filter(|x| *x > 0.0)
            .unwrap_or(1.0);
        let block_n = kernel.launch.kv_rows_per_block.max(1);
        let state_name = named("FAKE_STATE").or_else(|| cubin_marker(&bytes, "state "));
        let state = match state_name {
            None => (StateModel::Clean, false),
            Some(name) => state_named(&name)
                .ok_or_else(|| anyhow!("the test double has no state model `{name}`"))?,
        };
        Ok(KernelId(slot(
            &mut self.kernels,
            FakeKernel {
                model,
                time_scale,
                defines: kernel.defines.clone(),
                block_n,
                launches: 0,
                seen: HashMap::new(),
                previous: None,
                cached: HashMap::new(),
                nan_reference: false,
                state,
                cubin: kernel.cubin.clone(),
            },
        )))
    }

    fn load_reference(&mut self, kernel: &ReferenceKernel) -> Result<KernelId> {
        let bytes = std::fs::read(&kernel.cubin)
            .map_err(|e| anyhow!("cannot load {}: {e}", kernel.cubin.display()))?;
        let nan_reference = cubin_marker(&bytes, "reference ").is_some_and(|w| w == "nan");
        Ok(KernelId(slot(
            &mut self.kernels,
            FakeKernel {
                model: Model::Honest,
                time_scale: 1.0,
                defines: Vec::new(),
                block_n: 1,
                launches: 0,
                seen: HashMap::new(),
                previous: None,
                cached: HashMap::new(),
                nan_reference,
                state: (StateModel::Clean, false),
                cubin: kernel.cubin.clone(),
            },
        )))
    }

    fn unload(&mut self, kernel: KernelId) {
        if let Some(s) = self.kernels.get_mut(kernel.0) {
            *s = None;
        }
    }

    fn occupancy(&mut self, _kernel: KernelId, _launch: &LaunchShape) -> Result<u32> {
        Ok(2)
    }

    fn attributes(&mut self, _kernel: KernelId) -> Result<Option<FunctionAttributes>> {
        Ok(None)
    }

    fn reference(&mut self, kernel: KernelId, shape: &Shape, dtype: Dtype, io: &Io) -> Result<()> {
        let nan = self.kernels[kernel.0]
            .as_ref()
            .is_some_and(|k| k.nan_reference);
        let answer = self.answer(dtype, shape, io, None)?;
        *self.f32s_mut(io.o)? = if nan {
            vec![f32::NAN; answer.0.len()]
        } else {
            answer.0.clone()
        };
        *self.f32s_mut(io.lse)? = answer.1.clone();
        Ok(())
    }

    fn forward(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        _launch: &LaunchShape,
        io: &Io,
    ) -> Result<()> {
        self.run_model(kernel, shape, io)
    }

    fn time_forward(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<f64> {
        self.run_model(kernel, shape, io)?;
        let k = self.kernels[kernel.0]
            .as_ref()
            .ok_or_else(|| anyhow!("unloaded"))?;
        Ok(Self::model_us(k, shape, launch) * self.drift_factor())
    }

    fn capture(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        ios: &[Io],
    ) -> Result<GraphId> {
        Ok(GraphId(slot(
            &mut self.graphs,
            (kernel, shape.clone(), launch.clone(), ios.to_vec()),
        )))
    }

    fn replay(&mut self, graph: GraphId) -> Result<f64> {
        let (kernel, shape, launch, ios) = self.graphs[graph.0]
            .clone()
            .ok_or_else(|| anyhow!("no graph {}", graph.0))?;
        self.last_replayed = Some((kernel, shape.name.clone()));
        let mut us = 0.0;
        for io in &ios {
            us += self.time_forward(kernel, &shape, &launch, io)?;
        }
        Ok(us)
    }

    fn drop_graph(&mut self, graph: GraphId) {
        if let Some(s) = self.graphs.get_mut(graph.0) {
            *s = None;
        }
    }

    fn roofs(&mut self, dtypes: &[Dtype]) -> Vec<RoofMeasured> {
        let roof = |name: &str, dtype, value, unit: &str| RoofMeasured {
            name: name.into(),
            dtype,
            value: Some(value),
            unit: unit.into(),
            error: None,
        };
        let mut r = vec![
            roof("copy", None, FAKE_COPY_GBPS, "GB/s"),
            roof("read", None, FAKE_READ_GBPS, "GB/s"),
        ];
        r.extend(
            dtypes
                .iter()
                .map(|&d| roof("matmul", Some(d), FAKE_MATMUL_TFLOPS, "TFLOP/s")),
        );
        r
    }

    fn health_check(&mut self) -> Result<()> {
        Ok(())
    }

    fn sentinel(&mut self, _reps: usize) -> Result<Vec<SentinelFigure>> {
        let factor = self.drift_factor();
        Ok([("fma", 1000.0), ("read", 400.0)]
            .into_iter()
            .map(|(name, us)| SentinelFigure {
                name: name.into(),
                median_us: us * factor,
                p10_us: us * factor,
                p90_us: us * factor,
            })
            .collect())
    }

    fn gpu_state_begin(&mut self) {
        self.last_replayed = None;
    }

    fn gpu_state(&mut self) -> std::result::Result<GpuState, String> {
        let factor = self.drift_factor();
        // A reading right after a case's replays: that case is timed.
        let replayed = self.last_replayed.take();
        let mut model = StateModel::Clean;
        if let Some((kernel, shape)) = replayed {
            self.cases_timed += 1;
            if let Some(k) = self.kernels.get(kernel.0).and_then(Option::as_ref) {
                let (state, once) = k.state;
                let n = self.timings_of.entry((k.cubin.clone(), shape)).or_insert(0);
                *n += 1;
                if !once || *n == 1 {
                    model = state;
                }
            }
        }
        if self.nvml_absent {
            return Err("NVML cannot be loaded (fake GPU: FLASHTUNE_FAKE_NVML=absent)".into());
        }
        let mut state = GpuState {
            sm_clock_mhz: Some((1980.0 / factor).round() as u32),
            mem_clock_mhz: Some(2619),
            temperature_c: Some(40 + (self.cases_timed / 5).min(35) as u32),
            power_w: Some(350.0),
            power_violation_ms: Some(0.0),
            thermal_violation_ms: Some(0.0),
            ..Default::default()
        };
        match model {
            StateModel::Clean => {}
            StateModel::Thermal => {
                state.sm_clock_mhz = Some(1410);
                state.temperature_c = Some(88);
                state.throttle_reasons = vec!["hw_thermal_slowdown".into()];
                state.thermal_violation_ms = Some(12.0);
            }
            StateModel::Power => {
                state.power_w = Some(700.0);
                state.throttle_reasons = vec!["hw_power_brake_slowdown".into()];
                state.power_violation_ms = Some(30.0);
            }
            StateModel::Neighbour => {
                state.other_processes = vec![GpuProcess {
                    pid: 4242,
                    used_bytes: Some(2 << 30),
                }];
            }
        }
        Ok(state)
    }

    fn launch_cap(&self) -> u32 {
        // Host arrays: every input set costs a CPU oracle, so replays stay at the minimum.
        crate::trial::MIN_LAUNCHES
    }
}

/// A synthetic profile for the test double, so CI can drive the guided search: waves come from the
/// launch geometry as ncu computes them; the other figures follow the MMA path and tile size. The
/// real bottleneck rules from the policy classify them. Nothing here was measured.
pub fn profile(
    policy: &crate::config::ProfilePolicy,
    params: &crate::space::Params,
    launch: &crate::space::LaunchShape,
    shape: &crate::config::Shape,
    device: &DeviceInfo,
) -> crate::profile::ProfileOutcome {
    use crate::profile::{KernelProfile, Metric};
    use crate::space::ParamValue;
    let ctas = shape.b as f64
        * shape.h as f64
        * (shape.sq as f64 / launch.rows_per_cta as f64).ceil()
        * launch.kv_splits.max(1) as f64;
    let waves = ctas / device.sm_count.max(1) as f64;
    let mma = params.get("MMA").cloned();
    let tensor_path = matches!(&mma, Some(ParamValue::Name(m)) if m == "mma" || m == "wgmma");
    let big_tile = matches!(params.get("BLOCK_M"), Some(ParamValue::Int(m)) if *m >= 128);
    let (sm, tensor) = if tensor_path {
        (55.0, 45.0)
    } else {
        (70.0, 10.0)
    };
    let (limit_regs, warps_active) = if big_tile { (1.0, 12.0) } else { (4.0, 50.0) };
    let metrics: std::collections::BTreeMap<String, Metric> = [
        ("launch__waves_per_multiprocessor", waves),
        (
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            if waves < 1.0 { 15.0 } else { sm },
        ),
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 20.0),
        (
            "sm__warps_active.avg.pct_of_peak_sustained_active",
            warps_active,
        ),
        ("launch__occupancy_limit_registers", limit_regs),
        ("launch__occupancy_limit_shared_mem", 4.0),
        ("launch__occupancy_limit_warps", 8.0),
        (
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
            tensor,
        ),
    ]
    .into_iter()
    .map(|(k, v)| {
        (
            k.to_owned(),
            Metric {
                value: v,
                unit: String::new(),
            },
        )
    })
    .collect();
    let kernel = KernelProfile {
        id: 0,
        kernel: "attn_fwd (fake GPU: synthetic metrics)".into(),
        block_size: format!("({}, 1, 1)", launch.threads),
        grid_size: format!("({ctas}, 1, 1)"),
        metrics,
    };
    let bottlenecks = crate::profile::classify(&kernel, &policy.bottlenecks);
    crate::profile::ProfileOutcome::Profiled {
        kernels: vec![kernel],
        bottlenecks,
        report: "fake GPU: no ncu report".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comparison_self_check_passes_the_host_path_and_refuses_a_miscount() {
        let mut honest = FakeGpu::new(device("sm_90a", 0));
        crate::trial::self_check_comparison(&mut honest).expect("the host path agrees with itself");

        let mut broken = FakeGpu::new(device("sm_90a", 0));
        broken.miscounting_compare = true;
        let why = crate::trial::self_check_comparison(&mut broken)
            .expect_err("a comparison that misses an unwritten output must be refused")
            .to_string();
        assert!(
            why.contains("unwritten outputs: 1 on the device, 2 on the host"),
            "{why}"
        );
        // Every buffer the check drew was given back.
        assert!(broken.memory.iter().all(Option::is_none), "buffers leaked");
    }
}
