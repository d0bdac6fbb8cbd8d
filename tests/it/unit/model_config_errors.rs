//! The tests of `src/model/config/errors.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::error::Error;
use flashtune::model::config::errors::{config_error_at_key, line_column};
use std::path::Path;

#[test]
fn keys_are_located_inside_their_table() {
    let text = "[tolerance.f16]\nmax_abs = 1\n\n[tolerance.bf16]\n  max_abs = nan\n[build.targets.sm_80]\nx = 1\n";
    let at = |key| match config_error_at_key(Path::new("p.toml"), text, key, String::new()) {
        Error::Config { line, column, .. } => (line, column),
        _ => unreachable!(),
    };
    assert_eq!(at("tolerance.bf16.max_abs"), (5, 3));
    assert_eq!(at("tolerance.f16.max_abs"), (2, 1));
    assert_eq!(at("build.targets"), (6, 1));
}

#[test]
fn line_column_counts_from_one() {
    assert_eq!(line_column("a = 1\nbc = 2\n", 6), (2, 1));
    assert_eq!(line_column("a = 1\nbc = 2\n", 11), (2, 6));
}
