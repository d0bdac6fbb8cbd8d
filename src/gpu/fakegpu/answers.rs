//! The double's attention: what an honest kernel writes and what the reference computes, in f64 on
//! the CPU, memoised by the content of the inputs.
//!
//! The double draws its inputs periodically ([`PERIOD`] elements, a multiple of every head dim's row
//! length), so on its own draws every head's keys repeat with a short period and attention has a
//! cheap exact form: the scores of each distinct (query row, key row) pair once, then per query row
//! a weighted sum over one period of keys, counted by how often each appears among the keys the
//! mask admits. The oracle's arithmetic, without its cost: a large shape takes milliseconds instead
//! of minutes. Inputs that are not the double's own draws (a kernel wrote into them, a test uploaded
//! them) take the plain f64 computation of `check::oracle_rows`.
use crate::gpu::check;
use crate::model::config::{Dtype, Shape};
use std::collections::HashMap;
use std::sync::Arc;

/// Elements after which the double's draws repeat: 16 rows of 768, and 768 is a multiple of every
/// head dim the family takes (64, 96, 128, 256) and of 32.
pub const PERIOD: usize = 768 * 16;

/// A draw of `generate`: the input mixture's values in `dtype` (one component for the whole tensor,
/// `mixture::double_bits`), rows of `d`, that repeat every [`PERIOD`] elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub dtype: Dtype,
    pub seed: u64,
    pub tensor: u64,
    pub d: u32,
}

impl Draw {
    /// One period of the draw (or all of it, when shorter).
    pub fn period(&self, len: usize) -> Vec<u16> {
        crate::gpu::trial::mixture::double_bits(
            self.dtype,
            len.min(PERIOD),
            self.seed,
            self.tensor,
            self.d,
        )
    }

    /// Elements `start..start + len` of a draw of `total` elements.
    pub fn range(&self, total: usize, start: usize, len: usize) -> Vec<u16> {
        check::repeated(&self.period(total), start, len)
    }

    /// What identifies the draw's content, beside its length.
    pub fn identity(&self, len: usize) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"drawn");
        h.update(format!("{}|{len}|{}|{}", self.dtype, self.seed, self.tensor).as_bytes());
        h.update(&self.d.to_le_bytes());
        *h.finalize().as_bytes()
    }
}

/// One input of a launch as the launch read it.
#[derive(Clone)]
pub enum Input {
    Drawn(Draw, usize),
    Bits(Arc<Vec<u16>>),
}

impl Input {
    fn values(&self, dtype: Dtype) -> Vec<f32> {
        match self {
            Input::Drawn(d, len) => check::values(dtype, &d.range(*len, 0, *len)),
            Input::Bits(b) => check::values(dtype, b),
        }
    }
}

/// A launch whose outputs nobody has read yet: what it read and what it is asked.
pub struct Launch {
    pub key: [u8; 32],
    pub shape: Shape,
    pub dtype: Dtype,
    /// Keys kept per head (a kernel that drops the last tile), when not all.
    pub keys: Option<u32>,
    pub inputs: [Input; 3],
}

/// Attention in fp32: O [b, h, sq, d] and LSE [b, h, sq], and O rounded to each dtype once asked:
/// every buffer that holds this answer shares these arrays.
pub struct AnswerData {
    pub o: Arc<Vec<f32>>,
    pub lse: Arc<Vec<f32>>,
    rounded: [std::sync::OnceLock<Arc<Vec<u16>>>; 2],
}

impl AnswerData {
    /// O rounded to `dtype`, as a kernel writing `dtype` stores it.
    pub fn o_bits(&self, dtype: Dtype) -> Arc<Vec<u16>> {
        self.rounded[dtype as usize]
            .get_or_init(|| Arc::new(check::rounded(dtype, &self.o)))
            .clone()
    }

    fn bytes(&self) -> usize {
        4 * (self.o.len() + self.lse.len()) + 2 * self.o.len()
    }
}

pub type Answer = Arc<AnswerData>;

/// Answers by launch key, the least recently used dropped beyond a byte budget.
pub struct Answers {
    map: HashMap<[u8; 32], (Answer, u64)>,
    clock: u64,
    bytes: usize,
    budget: usize,
}

impl Answers {
    pub fn new(budget: usize) -> Self {
        Answers {
            map: HashMap::new(),
            clock: 0,
            bytes: 0,
            budget,
        }
    }

    pub fn get(&mut self, launch: &Launch) -> Answer {
        self.clock += 1;
        if let Some((a, used)) = self.map.get_mut(&launch.key) {
            *used = self.clock;
            return a.clone();
        }
        let (o, lse) = compute(launch);
        let answer: Answer = Arc::new(AnswerData {
            o: Arc::new(o),
            lse: Arc::new(lse),
            rounded: Default::default(),
        });
        let size = answer.bytes();
        while self.bytes + size > self.budget && !self.map.is_empty() {
            let oldest = *self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k)
                .expect("non-empty");
            let (gone, _) = self.map.remove(&oldest).expect("present");
            self.bytes -= gone.bytes();
        }
        self.bytes += size;
        self.map.insert(launch.key, (answer.clone(), self.clock));
        answer
    }
}

/// The key of a launch: its shape, dtype, kept keys and the identities of what it read.
pub fn launch_key(
    shape: &Shape,
    dtype: Dtype,
    keys: Option<u32>,
    identities: [[u8; 32]; 3],
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(format!("{shape:?}|{dtype}|{keys:?}").as_bytes());
    for id in identities {
        h.update(&id);
    }
    *h.finalize().as_bytes()
}

/// O and LSE in fp32 (computed in f64).
fn compute(launch: &Launch) -> (Vec<f32>, Vec<f32>) {
    match &launch.inputs {
        [Input::Drawn(q, _), Input::Drawn(k, _), Input::Drawn(v, _)]
            if PERIOD.is_multiple_of(launch.shape.d as usize) =>
        {
            periodic(&launch.shape, launch.dtype, [q, k, v], launch.keys)
        }
        inputs => {
            let (o, lse) = plain(&launch.shape, launch.dtype, inputs, launch.keys);
            (
                o.iter().map(|&x| x as f32).collect(),
                lse.iter().map(|&x| x as f32).collect(),
            )
        }
    }
}

/// The f64 oracle on every row, each head keeping its first `keys` keys when given.
pub fn plain(
    shape: &Shape,
    dtype: Dtype,
    inputs: &[Input; 3],
    keys: Option<u32>,
) -> (Vec<f64>, Vec<f64>) {
    let [q, k, v] = [0, 1, 2].map(|t| inputs[t].values(dtype));
    let rows: Vec<usize> = (0..q.len() / shape.d as usize).collect();
    check::oracle_rows_keeping(shape, &q, &k, &v, &rows, keys.unwrap_or(shape.sk))
}

/// Attention on periodic draws (see the module's header), computed in f64 and stored in fp32, by
/// `flashtune_numerics::periodic`.
pub fn periodic(
    shape: &Shape,
    dtype: Dtype,
    [q, k, v]: [&Draw; 3],
    keys: Option<u32>,
) -> (Vec<f32>, Vec<f32>) {
    let (sq, sk, d) = (shape.sq as usize, shape.sk as usize, shape.d as usize);
    let heads = shape.b as usize * shape.h as usize;
    let rows_of = |draw: &Draw, total_rows: usize| -> Vec<f64> {
        check::values(dtype, &draw.period(total_rows * d))
            .into_iter()
            .map(f64::from)
            .collect()
    };
    let (qp, kp, vp) = (
        rows_of(q, heads * sq),
        rows_of(k, heads * sk),
        rows_of(v, heads * sk),
    );
    flashtune_numerics::periodic::periodic_attention(
        check::geometry(shape),
        heads,
        PERIOD,
        [&qp, &kp, &vp],
        keys.map_or(sk, |k| k as usize),
    )
}
