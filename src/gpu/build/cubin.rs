//! Whether a cubin nvcc wrote is whole. ptxas exits 0 when a full disk let it write only part of
//! the cubin (12 KiB of 39 KiB on a 24 KiB tmpfs, nvcc 13.0), and a cut cubin fails to load in the
//! worker, where the kernel would be blamed for it.

/// Where an ELF64 file (a cubin) is cut short: the bytes it has, and those its headers declare
/// (`None`: not even its header is there); `None` when it holds every byte they declare.
pub fn cut_short(bytes: &[u8]) -> Option<(usize, Option<u64>)> {
    let have = bytes.len();
    let header_whole = have >= 64 && bytes.starts_with(b"\x7fELF") && bytes[4] == 2;
    if !header_whole {
        return Some((have, None));
    }
    let need = declared_len(bytes);
    (need > have as u64).then_some((have, Some(need)))
}

/// The bytes an ELF64 file declares: its header, its program and section header tables, and every
/// segment and section they point at (little-endian, as every cubin is).
fn declared_len(bytes: &[u8]) -> u64 {
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map_or(0, |b| u64::from(u16::from_le_bytes([b[0], b[1]])))
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let table = |offset: u64, entry: u64, count: u64| {
        (0..count).map(move |i| offset.saturating_add(i.saturating_mul(entry)))
    };
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3A), u16_at(0x3C));
    let mut need = 64u64
        .max(phoff.saturating_add(phentsize * phnum))
        .max(shoff.saturating_add(shentsize * shnum));
    // A header entry past the end reads as zeros: the tables' own ends above already say it is cut.
    for at in table(phoff, phentsize, phnum) {
        let at = at as usize;
        need = need.max(u64_at(at + 0x08).saturating_add(u64_at(at + 0x20)));
    }
    const SHT_NOBITS: u32 = 8;
    for at in table(shoff, shentsize, shnum) {
        let at = at as usize;
        if u32_at(at + 0x04) != SHT_NOBITS {
            need = need.max(u64_at(at + 0x18).saturating_add(u64_at(at + 0x20)));
        }
    }
    need
}
