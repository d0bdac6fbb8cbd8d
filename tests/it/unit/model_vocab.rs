//! The tests of `src/model/vocab.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::vocab::{BuildRole, ProcessEnd};
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

/// A step's builds carry their role in the `built` record; a log written before that is read from
/// the variant id's suffix, which every role writes and the legacy reading gives back.
#[test]
fn a_build_role_is_read_back_from_the_suffix_it_writes() {
    for role in [BuildRole::Head, BuildRole::Edit, BuildRole::Candidate(3)] {
        assert_eq!(
            BuildRole::legacy(&format!("mma-bm64-bn64-w4-ks1-s2@{role}")),
            Some(role)
        );
    }
    for untagged in [
        "reference",
        "mma-bm64-bn64-w4-ks1-s2",
        "x@cand",
        "x@candidate2",
    ] {
        assert_eq!(BuildRole::legacy(untagged), None, "{untagged}");
    }
}
