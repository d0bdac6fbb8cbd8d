//! The masks that keep references unreadable in device memory.
use crate::parallel::parallel_chunks;

/// The word that masks 32-bit element `index` of a reference buffer under `key`. The worker keeps
/// every reference on the GPU XORed with such words under a key drawn per set from the OS, so a
/// kernel under test that finds the reference in device memory finds noise; only the comparison
/// (`ft_compare`, or the host path) is given the key. Same function as `ft_mask` in tools.cu.
pub fn mask_word(key: u64, index: u64) -> u32 {
    splitmix64(key ^ splitmix64(index)) as u32
}

/// XOR every element of a reference buffer with its mask word: masks plain values, unmasks masked
/// ones. On every core: a large shape's reference is tens of millions of elements.
pub fn apply_mask(values: &mut [f32], key: u64, first_index: u64) {
    const CHUNK: usize = 1 << 18;
    let chunks: Vec<(usize, &mut [f32])> = values.chunks_mut(CHUNK).enumerate().collect();
    parallel_chunks(chunks, |(c, chunk)| {
        let first = first_index + (c * CHUNK) as u64;
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = f32::from_bits(v.to_bits() ^ mask_word(key, first + i as u64));
        }
    });
}

/// SplitMix64's finaliser, as in tools.cu.
pub fn splitmix64(x: u64) -> u64 {
    let mut x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
