//! The double's kernel models: which misbehaviour a cubin stands for (its `FAULT` / `CHEAT` define,
//! or a `flashtune-fake:` marker string compiled into it), the GPU state it is timed under, and the
//! fixed model of its time.
use super::{FakeGpu, FAKE_MATMUL_TFLOPS, FAKE_READ_GBPS};
use crate::gpu::trial::Buf;
use crate::model::config::{Dtype, Shape};
use crate::model::space::LaunchShape;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Model {
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
    /// Keeps the outputs of its first launch and writes them back whenever that launch's Q pointer
    /// comes again: right on the check (the same set twice) and on timed launches (other buffers),
    /// stale only when other values sit behind the checked pointers. Test-double only: what the
    /// re-check on a fresh set in the checked buffers exists to catch.
    CacheFirstPointer,
    /// Every other launch flips the lowest bit of one output: a race.
    Race,
    /// No max-subtraction: rows with a score past 88.7 overflow fp32 exp and come out NaN.
    SmallMagnitude,
    /// Ignores the keys of the last KV tile when Sk is not a tile multiple.
    SkipLastTile,
    /// Remembers its outputs by the content of what it reads (Q, K and V, at these pointers) and
    /// writes them back when the content repeats: always right, and [`MEMO_HIT`] of the time then.
    MemoOutput,
    /// Remembers softmax(Q·Kᵀ) by the content of Q and K and recomputes only P·V when they repeat:
    /// always right, and [`MEMO_SOFTMAX_HIT`] of the time then.
    MemoSoftmax,
    /// Honest on the check, fresh and stress sets; on the timed launches' buffers it does no work
    /// (O = 1, LSE = ln n), and when the same inputs come again (a re-run) it first rewrites Q to 0
    /// and V to 1, whose exact attention is that answer: a reference computed afterwards from those
    /// buffers would agree.
    RewriteOnRerun,
    /// Counts the draws it sees per timed buffer; honest in the warm-up's draw and the first
    /// [`HONEST_EARLY_ROUNDS`] rounds (the ones racing used to verify from) and in round
    /// [`HONEST_LAST_ROUND`] (the last of the shipped samples), no work in the others.
    HonestEarly,
    /// Honest when its Q is warm in L2 (touched since the last flush: inputs checksummed right
    /// before the replay), no work when cold.
    L2Probe,
    /// No work on the timed launches' buffers: zeros, tagged with the launch whose honest answer
    /// belongs there. On every later launch it finds each tagged buffer in device memory that is
    /// not one of its own outputs (a copy the harness kept of a timed round) and writes that
    /// answer over it: right wherever a copy is judged on the device after later launches.
    KeptCopyRepair,
    /// A softmax with a fixed offset in place of the running max: rows whose largest score passes
    /// [`FIXED_OFFSET_LIMIT`] come out NaN. Honest when a Q row has ‖q‖² > 4d (the old stress set's
    /// mark, N(0, 36) inputs).
    FixedOffset,
    /// Honest, and [`BURSTY_SPEEDUP`] of its build's time, except on square shapes, where it runs
    /// in bursts (`burst_factor`): a regression hidden in the spread it makes.
    Bursty,
    /// Writes zeros, and over every masked reference in device memory writes the mask of zeros:
    /// it has learnt each mask word from an honest answer and the masked reference beside it, so
    /// the forged reference unmasks to exactly what it wrote. Test-double only: what the checksum
    /// of a set's reference, taken when it was drawn and checked before a verdict, exists to catch.
    ForgeReference,
}

/// The largest score a fixed-offset softmax holds (exp overflows f16's range past about 11).
pub const FIXED_OFFSET_LIMIT: f64 = 11.0;
/// `Bursty`'s times: faster everywhere but the bursts.
pub const BURSTY_SPEEDUP: f64 = 0.8;
pub const BURST_LAUNCHES: u64 = 32;

/// The shipped `race_samples` and `samples`: the rounds `HonestEarly` expects to be verified.
pub const HONEST_EARLY_ROUNDS: u32 = 8;
pub const HONEST_LAST_ROUND: u32 = 30;

/// Time factors of the memo models: a hit (everything remembered) is fast; a miss pays for the
/// fingerprint on top of the honest work, as the real kernels of faults/cheats.cu do.
pub const MEMO_HIT: f64 = 0.3;
pub const MEMO_SOFTMAX_HIT: f64 = 0.55;
pub const MEMO_MISS: f64 = 1.05;

pub fn model_named(name: &str) -> Option<Model> {
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
        "CHEAT_CACHE_FIRST_POINTER" => Model::CacheFirstPointer,
        "CHEAT_RACE" => Model::Race,
        "CHEAT_SMALL_MAGNITUDE" => Model::SmallMagnitude,
        "CHEAT_SKIP_LAST_TILE" => Model::SkipLastTile,
        "CHEAT_MEMO_OUTPUT" => Model::MemoOutput,
        "CHEAT_MEMO_SOFTMAX" => Model::MemoSoftmax,
        "CHEAT_REWRITE_ON_RERUN" => Model::RewriteOnRerun,
        "CHEAT_HONEST_EARLY" => Model::HonestEarly,
        "CHEAT_L2_PROBE" => Model::L2Probe,
        "CHEAT_KEPT_COPY_REPAIR" => Model::KeptCopyRepair,
        "CHEAT_FIXED_OFFSET" => Model::FixedOffset,
        "CHEAT_BURSTY" => Model::Bursty,
        "CHEAT_FORGE_REFERENCE" => Model::ForgeReference,
        _ => return None,
    })
}

/// `after_cases=N,factor=F`: (N, F).
/// GPU `ordinal`'s factor in `FLASHTUNE_FAKE_GPU_TIMES` (`1.0,0.5`: a factor per ordinal).
pub fn chip_factor(spec: &str, ordinal: u32) -> Option<f64> {
    spec.split(',')
        .nth(ordinal as usize)?
        .trim()
        .parse()
        .ok()
        .filter(|f: &f64| f.is_finite() && *f > 0.0)
}

pub fn parse_drift(spec: &str) -> Option<(u64, f64)> {
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
pub enum StateModel {
    Clean,
    Thermal,
    Power,
    Neighbour,
}

/// A state name (`thermal`, `power_once`, `FAKE_STATE_NEIGHBOUR`): the state, and whether it holds
/// for the first timing only.
pub fn state_named(name: &str) -> Option<(StateModel, bool)> {
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
pub fn cubin_marker(bytes: &[u8], what: &str) -> Option<String> {
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

/// What a memo model remembers of one launch: the outputs it wrote, for these inputs at these pointers.
pub struct Remembered {
    pub inputs: [u8; 32],
    pub o: super::memory::Narrow,
    pub lse: super::memory::Wide,
}

pub struct FakeKernel {
    pub model: Model,
    /// Multiplier on the modelled time (`flashtune-fake: time x0.5`).
    pub time_scale: f64,
    pub defines: Vec<(String, String)>,
    pub block_n: u32,
    pub launches: u64,
    pub seen: HashMap<(usize, usize), u32>,
    pub previous: Option<(Buf, Buf, Shape)>,
    /// The memo models' memory, by (Q, O) buffer.
    pub remembered: HashMap<(usize, usize), Remembered>,
    /// `CacheFirstPointer`'s memory: the first launch's Q buffer and outputs.
    pub first: Option<(usize, super::memory::Narrow, super::memory::Wide)>,
    /// The time factor of the last launch (a memo hit is cheaper).
    pub last_factor: f64,
    /// The first Q buffer this kernel was given (the check set's, where the fresh set goes too).
    pub first_q: Option<usize>,
    /// Per Q buffer: what its launch read last, and how many different draws it has read.
    pub draws: HashMap<usize, ([u8; 32], u32)>,
    /// Every output buffer (O, LSE) it has been given: `KeptCopyRepair` repairs only the others.
    pub outputs_given: std::collections::HashSet<usize>,
    /// A reference kernel that answers NaN (`flashtune-fake: reference nan`).
    pub nan_reference: bool,
    /// The GPU's state while this kernel is timed, and whether only on its first timing.
    pub state: (StateModel, bool),
    pub cubin: std::path::PathBuf,
}

impl FakeKernel {
    pub fn new(model: Model, defines: Vec<(String, String)>, cubin: std::path::PathBuf) -> Self {
        FakeKernel {
            model,
            time_scale: 1.0,
            defines,
            block_n: 1,
            launches: 0,
            seen: HashMap::new(),
            previous: None,
            remembered: HashMap::new(),
            first: None,
            last_factor: 1.0,
            first_q: None,
            draws: HashMap::new(),
            outputs_given: Default::default(),
            nan_reference: false,
            state: (StateModel::Clean, false),
            cubin,
        }
    }

    pub fn dtype(&self) -> Dtype {
        match self.defines.iter().find(|(k, _)| k == "DTYPE") {
            Some((_, v)) if v == "DTYPE_BF16" => Dtype::Bf16,
            _ => Dtype::F16,
        }
    }

    /// Microseconds the model charges for one launch: a fixed function of the parameters.
    ///
    /// time = max((4 µs + FLOPs / rate) × tile × stages × split, 90% of the roofs) × marker, where rate
    /// is 8 (scalar), 60 (wmma) or 250 (mma) TFLOP/s; BLOCK_M 128 costs 1.1× on shapes under 10 GFLOP
    /// and saves 0.85× above; each extra stage saves 5%; a KV split halves decode (Sq = 1) and costs
    /// 1.05× elsewhere. Ranking tests rely on this model; keep it monotone and documented. A memo
    /// model's last launch scales it by its hit or miss factor.
    pub fn model_us(&self, shape: &Shape, launch: &LaunchShape) -> f64 {
        let get = |name: &str| {
            self.defines
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
        let floor_us = (flops / (0.9 * FAKE_MATMUL_TFLOPS * 1e6))
            .max(shape.min_dram_bytes(self.dtype()) / (0.9 * FAKE_READ_GBPS * 1e3));
        modelled.max(floor_us) * self.time_scale * self.last_factor * self.burst_factor(shape)
    }

    /// `Bursty`'s factor on its last launch: 0.8 everywhere but square shapes (Sq = Sk; the CUDA
    /// kernel's bursts are on Sq = Sk = 512, the double's on every square shape), where blocks of
    /// [`BURST_LAUNCHES`] launches each take a factor of their own between 0.7 and 1.6 (1.15 on
    /// average): slower there, by less than the spread it makes.
    fn burst_factor(&self, shape: &Shape) -> f64 {
        if self.model != Model::Bursty {
            return 1.0;
        }
        if shape.sq != shape.sk {
            return BURSTY_SPEEDUP;
        }
        let block = self.launches / BURST_LAUNCHES;
        let u =
            (crate::gpu::check::splitmix64(block ^ 0x6275_7273) >> 11) as f64 / (1u64 << 53) as f64;
        0.7 + 0.9 * u
    }
}

impl FakeGpu {
    /// This chip's factor, times the drift factor once it has set in.
    pub(super) fn time_factor(&self) -> f64 {
        self.chip_factor
            * match self.drift {
                Some((after, factor)) if self.cases_timed >= after => factor,
                _ => 1.0,
            }
    }
}
