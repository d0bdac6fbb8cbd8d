//! The tests of `src/gpu/build/reads.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::build::reads::*;
use std::path::{Path, PathBuf};

#[test]
fn a_dependency_list_is_read_as_nvcc_writes_it() {
    let text = "k.cubin : k.cu \\\n    /usr/include/stdc-predef.h \\\n    /t/cuda/bin/..//include/cuda_runtime.h \\\n    /p/my\\ dir/x.cuh\n";
    assert_eq!(
        parse_dependencies(text),
        [
            "k.cu",
            "/usr/include/stdc-predef.h",
            "/t/cuda/bin/..//include/cuda_runtime.h",
            "/p/my dir/x.cuh"
        ]
        .map(PathBuf::from)
    );
}

/// A read kept relative to the source is judged where the cubin is served: the same include
/// stays inside a copy of the tree, and one that climbed out of the tree lands outside it again.
#[test]
fn reads_are_judged_against_the_tree_they_are_served_to() {
    let deps = [
        "/a/tree/kernels/fa/forward.cu",
        "/a/tree/kernels/fa/common.cuh",
        "/a/scratch/x.cuh",
        "/usr/include/stdio.h",
        "/t/cuda/include/cuda.h",
    ]
    .map(PathBuf::from);
    let kept = record(&deps, Path::new("/a/tree/kernels/fa"), Path::new("/t/cuda"));
    assert_eq!(kept, "forward.cu\ncommon.cuh\n../../../scratch/x.cuh\n");
    assert_eq!(
        outside(&kept, Path::new("/b/copy/kernels/fa"), Path::new("/b/copy")),
        ["/b/scratch/x.cuh"]
    );
    let clean = record(
        &deps[..2],
        Path::new("/a/tree/kernels/fa"),
        Path::new("/t/cuda"),
    );
    assert!(outside(
        &clean,
        Path::new("/b/copy/kernels/fa"),
        Path::new("/b/copy")
    )
    .is_empty());
}
