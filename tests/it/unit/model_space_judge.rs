//! The tests of `src/model/space/judge.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::space::ParamValue;

#[test]
fn names_become_prefixed_tokens() {
    assert_eq!(ParamValue::Name("wmma".into()).define("MMA"), "MMA_WMMA");
    assert_eq!(ParamValue::Int(3).define("STAGES"), "3");
}
