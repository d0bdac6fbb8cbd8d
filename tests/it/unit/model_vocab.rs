//! The tests of `src/model/vocab.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::vocab::ProcessEnd;
use std::os::unix::process::ExitStatusExt;

/// The legacy reading agrees with `of` on the words `std` prints for the same status.
#[test]
fn legacy_statuses_read_as_the_typed_end_they_were() {
    for raw in [0, 1 << 8, 42 << 8, 9, 15] {
        let status = std::process::ExitStatus::from_raw(raw);
        assert_eq!(
            ProcessEnd::legacy(&status.to_string(), false),
            ProcessEnd::of(&status),
            "{status}"
        );
    }
    assert!(ProcessEnd::legacy("exit status: 0", false).succeeded());
    assert!(!ProcessEnd::legacy("exit status: 0", true).succeeded());
    assert!(!ProcessEnd::legacy("killed after 30 s", false).succeeded());
}
