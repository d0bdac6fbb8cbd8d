//! The tests of `src/model/config/policies.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::error::Error;
use flashtune::model::config::errors::parse_toml;
use flashtune::model::config::policies::Gates;
use std::path::Path;

#[test]
fn per_shape_dispatch_is_off_unless_set_and_only_a_bool_sets_it() {
    let path = Path::new("policies.toml");
    let gates = |text: &str| parse_toml::<Gates>(path, text);
    let absent = gates("max_spill_bytes = 0\nplausibility_margin = 0.05\n").unwrap();
    assert!(!absent.per_shape_dispatch);
    let on = "max_spill_bytes = 0\nplausibility_margin = 0.05\nper_shape_dispatch = true\n";
    assert!(gates(on).unwrap().per_shape_dispatch);
    let word = "max_spill_bytes = 0\nplausibility_margin = 0.05\nper_shape_dispatch = \"yes\"\n";
    match gates(word).unwrap_err() {
        Error::Config { key, line, .. } => {
            assert_eq!((key.as_str(), line), ("per_shape_dispatch", 3))
        }
        other => panic!("expected a config error, got {other}"),
    }
}
