//! The tests of `src/gpu/build/mod.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::build::*;
use std::time::Duration;

/// The key covers the whole invocation: the same source built with another environment or by
/// another compiler is a different build.
#[test]
fn quoted_includes_and_has_include_are_both_read() {
    let text = "#include \"a.cuh\"\n#  include \"b/c.cuh\"\n#if __has_include(\"../../scratch/x.cuh\")\n#include <cuda.h>\n";
    assert_eq!(
        quoted_includes(text),
        ["a.cuh", "b/c.cuh", "../../scratch/x.cuh"]
    );
}

#[test]
fn the_key_covers_the_compilers_bytes_and_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("k.cu");
    std::fs::write(&source, "__global__ void k() {}\n").unwrap();
    let spec = BuildSpec {
        source,
        defines: vec![("A".into(), "1".into())],
        flags: vec!["-O3".into()],
        arch: "sm_90a".into(),
    };
    let builder = |environment: Vec<(String, String)>, fingerprint: &str| Builder {
        toolchain: Toolchain {
            nvcc: "/usr/bin/nvcc".into(),
            version: "release 13.0".into(),
            environment,
            fingerprint: fingerprint.into(),
        },
        cache_dir: dir.path().into(),
        timeout: Duration::from_secs(1),
        confine: None,
    };
    let path = |p: &str| vec![("PATH".to_owned(), p.to_owned())];
    let key = |b: Builder| b.key(&spec).unwrap();
    let base = key(builder(path("/usr/bin"), "a"));
    assert_eq!(base, key(builder(path("/usr/bin"), "a")));
    assert_ne!(base, key(builder(path("/tmp/evil:/usr/bin"), "a")));
    assert_ne!(base, key(builder(path("/usr/bin"), "b")));
}
