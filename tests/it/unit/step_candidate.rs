//! The tests of `src/step/candidate.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::step::candidate::*;
use std::path::Path;

#[test]
fn an_include_the_export_lacks_but_the_working_tree_has_is_named() {
    let work = tempfile::tempdir().unwrap();
    let export = tempfile::tempdir().unwrap();
    let forward = "#include \"common.cuh\"\n#if __has_include(\"../../scratch/x.cuh\")\n#include \"../../scratch/x.cuh\"\n#endif\n";
    for root in [work.path(), export.path()] {
        std::fs::create_dir_all(root.join("kernels/fa")).unwrap();
        std::fs::write(root.join("kernels/fa/forward.cu"), forward).unwrap();
        std::fs::write(
            root.join("kernels/fa/common.cuh"),
            "#include \"/etc/hostname\"\n",
        )
        .unwrap();
    }
    std::fs::create_dir_all(work.path().join("scratch")).unwrap();
    std::fs::write(work.path().join("scratch/x.cuh"), "").unwrap();
    let found = includes_outside(
        export.path(),
        work.path(),
        Path::new("kernels/fa/forward.cu"),
    );
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found
        .iter()
        .any(|f| f.contains("/etc/hostname") && f.contains("absolute")));
    assert!(found.iter().filter(|f| f.contains("scratch/x.cuh")).count() == 2);
    std::fs::remove_file(work.path().join("scratch/x.cuh")).unwrap();
    let found = includes_outside(
        export.path(),
        work.path(),
        Path::new("kernels/fa/forward.cu"),
    );
    assert_eq!(
        found.len(),
        1,
        "a file nobody has is nvcc's to report: {found:?}"
    );
}
