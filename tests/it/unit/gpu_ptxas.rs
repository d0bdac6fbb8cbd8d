//! The tests of `src/gpu/ptxas.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::ptxas::*;

#[test]
fn usage_without_smem() {
    let r = parse(
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
         ptxas info    : Function properties for k\n    \
         8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
         ptxas info    : Used 200 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]\n",
    );
    assert_eq!(r.len(), 1);
    assert_eq!(
        (
            r[0].registers,
            r[0].spill_bytes(),
            r[0].static_smem_bytes,
            r[0].stack_frame_bytes
        ),
        (200, 16, 8192, 8)
    );
}
