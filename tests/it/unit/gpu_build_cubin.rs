//! The tests of `src/gpu/build/cubin.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::build::cubin::*;

/// A whole ELF64 file is whole; cut anywhere, even by one byte, it is short of what its headers
/// declare; cut inside its header, it declares nothing. (`/bin/true` stands for a cubin: both are
/// little-endian ELF64, and this one is on every machine the tests run on.)
#[test]
fn an_elf_file_cut_anywhere_is_cut_short_and_a_whole_one_is_not() {
    let whole = std::fs::read("/bin/true").unwrap();
    assert_eq!(cut_short(&whole), None);
    for len in [whole.len() - 1, whole.len() / 2, 4096, 64] {
        let (have, declared) = cut_short(&whole[..len]).expect("cut short");
        assert_eq!(have, len);
        assert_eq!(declared, Some(whole.len() as u64), "cut at {len}");
    }
    assert_eq!(cut_short(&whole[..63]), Some((63, None)));
    assert_eq!(cut_short(&[]), Some((0, None)));
}
