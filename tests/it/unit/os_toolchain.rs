//! The tests of `src/os/toolchain.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::os::toolchain::*;

/// Issue 47, item 4: a compiler component swapped under `.tools/` after the toolchain was set
/// up is named before the next build, not trusted with it.
#[test]
fn a_file_changed_under_the_toolchain_is_named_by_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("cu13");
    for d in ["bin", "nvvm/bin", "include", "lib"] {
        std::fs::create_dir_all(top.join(d)).unwrap();
    }
    let file = |rel: &str| top.join(rel);
    std::fs::write(file("bin/nvcc"), "#!/bin/sh\n").unwrap();
    std::fs::write(file("bin/ptxas"), "#!/bin/sh\n").unwrap();
    std::fs::write(file("nvvm/bin/cicc"), "#!/bin/sh\n").unwrap();
    std::fs::write(file("include/cuda_fp16.h"), "#pragma once\n").unwrap();
    let tc = Toolchain::new(file("bin/nvcc"), "release 13.0".into());
    assert_eq!(tc.check_untouched(), Ok(()));
    // Outside the folders nvcc uses: not its business.
    std::fs::write(file("lib/unused.a"), "x").unwrap();
    assert_eq!(tc.check_untouched(), Ok(()));

    std::fs::OpenOptions::new()
        .append(true)
        .open(file("nvvm/bin/cicc"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"# slower for HEAD\n"))
        .unwrap();
    let e = tc.check_untouched().unwrap_err();
    let cicc = file("nvvm/bin/cicc").canonicalize().unwrap();
    assert_eq!(e.path, cicc, "{e}");
    let said = e.to_string();
    assert!(said.starts_with("the CUDA toolchain changed"), "{said}");
    assert!(said.contains(&cicc.display().to_string()), "{said}");
    assert!(said.contains("flashtune setup"), "{said}");
    // A second toolchain value for the same nvcc keeps the fingerprint taken first.
    let again = Toolchain::new(file("bin/nvcc"), "release 13.0".into());
    assert!(again.check_untouched().is_err());
}
