//! The double's device memory: a buffer's content stays a description (a draw, a fill, a launch's
//! answer) until something reads it. The trial draws every timed launch's inputs anew before each
//! replay and reads the outputs of two replays per case: made eagerly on the CPU, the rest would
//! cost minutes on the large shapes. A read makes the content once and keeps it beside the
//! description, so what identifies a buffer (its checksum) does not change by being read.
use super::answers::{Answers, Draw, Launch};
use crate::gpu::check;
use std::sync::Arc;

/// The content of a 16-bit buffer (inputs, O).
#[derive(Clone)]
pub enum Narrow {
    Bits(Arc<Vec<u16>>),
    Fill(u16),
    Drawn(Draw),
    /// O of a launch, rounded to its dtype.
    Output(Arc<Launch>),
    /// Zeros that carry a tag: the launch whose answer `KeptCopyRepair` writes over them wherever
    /// it finds them (a device copy keeps the tag).
    Tagged(Arc<Launch>),
}

/// The content of a 32-bit float buffer (LSE, the reference's O, split partials).
#[derive(Clone)]
pub enum Wide {
    Floats(Arc<Vec<f32>>),
    /// Every element these bits.
    Fill(u32),
    Lse(Arc<Launch>),
    /// The fp32 O of the reference kernel.
    ReferenceO(Arc<Launch>),
    /// Another content XORed with the mask words of a key (a masked reference).
    Masked(Box<Wide>, u64),
    /// Zeros tagged with a launch, as [`Narrow::Tagged`].
    Tagged(Arc<Launch>),
}

pub enum Buffer {
    Narrow {
        len: usize,
        content: Narrow,
        made: Option<Arc<Vec<u16>>>,
        identity: Option<[u8; 32]>,
    },
    Wide {
        len: usize,
        content: Wide,
        made: Option<Arc<Vec<f32>>>,
    },
}

impl Buffer {
    pub fn narrow(len: usize, content: Narrow) -> Self {
        Buffer::Narrow {
            len,
            content,
            made: None,
            identity: None,
        }
    }

    pub fn wide(len: usize, content: Wide) -> Self {
        Buffer::Wide {
            len,
            content,
            made: None,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buffer::Narrow { len, .. } | Buffer::Wide { len, .. } => *len,
        }
    }
}

/// The elements a 16-bit content stands for.
pub fn make_narrow(content: &Narrow, len: usize, answers: &mut Answers) -> Arc<Vec<u16>> {
    match content {
        Narrow::Bits(b) => b.clone(),
        Narrow::Fill(v) => Arc::new(vec![*v; len]),
        Narrow::Drawn(d) => Arc::new(d.range(len, 0, len)),
        Narrow::Output(launch) => answers.get(launch).o_bits(launch.dtype),
        Narrow::Tagged(_) => Arc::new(vec![0; len]),
    }
}

/// The elements a 32-bit content stands for.
pub fn make_wide(content: &Wide, len: usize, answers: &mut Answers) -> Arc<Vec<f32>> {
    match content {
        Wide::Floats(f) => f.clone(),
        Wide::Fill(bits) => Arc::new(vec![f32::from_bits(*bits); len]),
        Wide::Lse(launch) => answers.get(launch).lse.clone(),
        Wide::ReferenceO(launch) => answers.get(launch).o.clone(),
        Wide::Tagged(_) => Arc::new(vec![0.0; len]),
        Wide::Masked(inner, key) => {
            let mut values = make_wide(inner, len, answers).to_vec();
            check::apply_mask(&mut values, *key, 0);
            Arc::new(values)
        }
    }
}

/// What identifies a 16-bit content without making it, where that is possible.
pub fn described_identity(content: &Narrow, len: usize) -> Option<[u8; 32]> {
    match content {
        Narrow::Drawn(d) => Some(d.identity(len)),
        Narrow::Fill(v) => {
            let mut h = blake3::Hasher::new();
            h.update(format!("fill|{v}|{len}").as_bytes());
            Some(*h.finalize().as_bytes())
        }
        Narrow::Bits(_) | Narrow::Output(_) | Narrow::Tagged(_) => None,
    }
}

/// The identity of made elements: a hash of their bytes.
pub fn bits_identity(bits: &[u16]) -> [u8; 32] {
    // SAFETY: u16 has no padding; viewing it as bytes is sound.
    let bytes = unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const u8, bits.len() * 2) };
    *blake3::hash(bytes).as_bytes()
}
