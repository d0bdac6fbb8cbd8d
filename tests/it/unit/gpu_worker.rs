//! The tests of `src/gpu/worker/mod.rs`, through the library (the library has no test target of its own: see Cargo.toml).
#[test]
fn tools_ptx_has_every_entry() {
    for entry in [
        "ft_generate",
        "ft_generate_many",
        "ft_checksum",
        "ft_checksum_many",
        "ft_read",
        "ft_fma",
        "ft_mask",
        "ft_compare",
    ] {
        assert!(
            flashtune::gpu::worker::TOOLS_PTX.contains(&format!(".entry {entry}(")),
            "{entry} missing from tools.ptx"
        );
    }
}
