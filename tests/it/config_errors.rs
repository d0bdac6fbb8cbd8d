//! Malformed policies and spaces: every error names the file, line, column and key, and the CLI exits 2.
use crate::common;
use common::*;
use flashtune::config::{Dtype, Policies};
use flashtune::error::Error;
use flashtune::space::Space;

fn load_policies_with(edit: impl Fn(&str) -> String) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policies.toml");
    let original = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    std::fs::write(&path, edit(&original)).unwrap();
    Policies::load(&path).expect_err("the edit must be rejected")
}

fn location(e: &Error) -> (usize, usize, String) {
    match e {
        Error::Config {
            line, column, key, ..
        } => (*line, *column, key.clone()),
        other => panic!("expected a config error, got {other}"),
    }
}

fn line_of(haystack: &str, needle: &str) -> usize {
    haystack
        .lines()
        .position(|l| l.starts_with(needle))
        .expect("needle in file")
        + 1
}

#[test]
fn shipped_files_load() {
    let (p, _) = Policies::load(&repo().join("policies.toml")).unwrap();
    assert!(p.dtypes.contains(&Dtype::F16) && p.dtypes.contains(&Dtype::Bf16));
    Space::load(&repo().join("variants/smoke.toml")).unwrap();
}

#[test]
fn wrong_type_names_line_column_and_key() {
    let original = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    let e = load_policies_with(|s| s.replace("samples = 30", "samples = \"thirty\""));
    assert_eq!(
        location(&e),
        (
            line_of(&original, "samples = 30"),
            11,
            "measure.samples".into()
        )
    );
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn unknown_key_is_an_error() {
    let original = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    let e = load_policies_with(|s| s.replace("warmup_ms = ", "warmup_msec = "));
    let (line, column, key) = location(&e);
    assert_eq!(
        (line, column, key.as_str()),
        (line_of(&original, "warmup_ms = "), 1, "measure.warmup_msec")
    );
    assert!(e.to_string().contains("unknown field"), "{e}");
}

#[test]
fn syntax_error_names_the_table_key() {
    let original = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    let e = load_policies_with(|s| s.replace("jobs = 0", "jobs = 0 0"));
    let (line, _, key) = location(&e);
    assert_eq!(
        (line, key.as_str()),
        (line_of(&original, "jobs = 0"), "build.jobs")
    );
}

#[test]
fn missing_tolerance_for_a_listed_dtype() {
    let e = load_policies_with(|s| s.replace("[tolerance.bf16]", "[tolerance.f16x]"));
    assert!(matches!(e, Error::Config { .. }), "{e}");
}

#[test]
fn bad_constraint_is_located_in_the_variants_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("space.toml");
    let original = std::fs::read_to_string(repo().join("variants/smoke.toml")).unwrap();
    std::fs::write(
        &path,
        original.replace("BLOCK_M == WARPS * 16", "BLOCK_M == WARPS *"),
    )
    .unwrap();
    let e = Space::load(&path).unwrap_err();
    let (line, column, key) = location(&e);
    assert_eq!(key, "constraints");
    assert_eq!(
        line,
        original
            .lines()
            .position(|l| l.contains("BLOCK_M == WARPS * 16"))
            .unwrap()
            + 1
    );
    assert_eq!(column, 4);
}

#[test]
fn shipped_bad_fixtures_name_file_line_and_key() {
    let dir = scratch_project();
    std::fs::copy(
        repo().join("tests/fixtures/bad_variants.toml"),
        dir.path().join("variants/bad.toml"),
    )
    .unwrap();
    let out = flashtune(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/bad.toml"],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("bad.toml:") && t.contains("key `baseline`") && t.contains("WARPZ"),
        "{t}"
    );

    std::fs::copy(
        repo().join("tests/fixtures/bad_policies.toml"),
        dir.path().join("policies.toml"),
    )
    .unwrap();
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    let t = text(&out);
    let line = std::fs::read_to_string(repo().join("tests/fixtures/bad_policies.toml"))
        .unwrap()
        .lines()
        .position(|l| l.starts_with("min_sample_us"))
        .unwrap()
        + 1;
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains(&format!(
            "policies.toml:{line}:17: key `measure.min_sample_us`"
        )),
        "{t}"
    );
}

#[test]
fn cli_exits_2_on_bad_policies() {
    let dir = scratch_project();
    replace_in(&dir.path().join("policies.toml"), "seed = ", "sed = ");
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("policies.toml:"), "{}", text(&out));
}
