//! Malformed policies and spaces: every error names the file, line, column and key, and the CLI exits 2.
use crate::common;
use common::*;
use flashtune::error::Error;
use flashtune::model::config::{Dtype, Policies};
use flashtune::model::space::Space;

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
        t.contains("bad.toml:") && t.contains("key `params.WARPZ`"),
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

/// A zero dimension points at its own line and names its key (issue 43, item 8), not the shape's name line.
#[test]
fn a_zero_dimension_names_its_key_and_line() {
    let original = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    let seed = original
        .find("name = \"seed\"\nb = 1")
        .expect("the seed shape");
    let edited = format!(
        "{}{}",
        &original[..seed],
        original[seed..].replacen("b = 1", "b = 0", 1)
    );
    let e = load_policies_with(|_| edited.clone());
    let (line, _, key) = location(&e);
    assert_eq!(key, "shapes.b", "{e}");
    let b_line = original[..seed].matches('\n').count() + 2;
    assert_eq!(line, b_line, "{e}");
    assert!(e.to_string().contains("b = 0"), "{e}");
}

/// A parameter no kernel source reads and no launch expression names would build identical
/// variants: refused with the space file, its line and key (issue 43, item 7). Every shipped space
/// reads all of its parameters.
#[test]
fn a_parameter_no_kernel_reads_is_refused_and_every_shipped_space_reads_its_own() {
    for space in std::fs::read_dir(repo().join("variants")).unwrap() {
        let space = space.unwrap().path();
        if Space::load(&space).is_err() {
            continue; // Not a space (the ablation chains' helpers) or a fixture of its own.
        }
        flashtune::run::shared::Project::load(
            flashtune::model::config::ProjectPaths::new(repo()),
            Some(&space),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", space.display()));
    }
    let dir = scratch_project();
    let smoke = dir.path().join("variants/smoke.toml");
    let edited = std::fs::read_to_string(&smoke)
        .unwrap()
        .replace("baseline = { ", "baseline = { FOO = 1, ")
        .replace("[params]\n", "[params]\nFOO = [1, 2]\n");
    std::fs::write(&smoke, &edited).unwrap();
    let e = flashtune::run::shared::Project::load(
        flashtune::model::config::ProjectPaths::new(dir.path().to_path_buf()),
        Some(std::path::Path::new("variants/smoke.toml")),
    )
    .err()
    .expect("FOO is read by nothing");
    let (line, _, key) = location(&e);
    assert_eq!(key, "params.FOO", "{e}");
    assert_eq!(line, line_of(&edited, "FOO = [1, 2]"), "{e}");
    assert!(e.to_string().contains("smoke.toml"), "{e}");
    let out = flashtune(dir.path(), &["build", "--space", "variants/smoke.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Issue 47, item 6: a space names its kernels inside the project and its oracle under
/// kernels/oracle/; an absolute path, one that climbs out, or an oracle elsewhere (the agent's own
/// file as the reference every edit is judged by) is refused at its line.
#[test]
fn a_space_names_its_kernels_inside_the_project_and_its_oracle_under_kernels_oracle() {
    let original = std::fs::read_to_string(repo().join("variants/smoke.toml")).unwrap();
    let line = line_of(&original, "reference = ");
    for (from, to, key, says) in [
        (
            "reference = \"kernels/oracle/reference.cu\"",
            "reference = \"/tmp/agent/reference.cu\"",
            "family.reference",
            "must be a path inside the project",
        ),
        (
            "reference = \"kernels/oracle/reference.cu\"",
            "reference = \"kernels/oracle/../attention/forward.cu\"",
            "family.reference",
            "with no `..`",
        ),
        (
            "reference = \"kernels/oracle/reference.cu\"",
            "reference = \"runs/agent/reference.cu\"",
            "family.reference",
            "must lie under kernels/oracle/",
        ),
        (
            "forward = \"kernels/attention/forward.cu\"",
            "forward = \"../elsewhere/forward.cu\"",
            "family.forward",
            "must be a path inside the project",
        ),
    ] {
        assert!(original.contains(from), "{from}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("space.toml");
        std::fs::write(&path, original.replace(from, to)).unwrap();
        let e = Space::load(&path).unwrap_err();
        let (at, _, named) = location(&e);
        assert_eq!(named, key, "{e}");
        assert!(e.to_string().contains(says), "{e}");
        if key == "family.reference" {
            assert_eq!(at, line, "{e}");
        }
    }
}

/// Issue 52, item 7: a flag that selects nothing is refused by name (exit 2) before anything runs;
/// `--max-variants 0` and `--sample 0` used to run nothing and say nothing.
#[test]
fn flags_that_select_nothing_are_refused() {
    let dir = scratch_project();
    for args in [
        &["tune", "--fake-gpu", "--max-variants", "0"][..],
        &[
            "tune",
            "--fake-gpu",
            "--strategy",
            "random",
            "--sample",
            "0",
        ][..],
    ] {
        let out = flashtune(dir.path(), args);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
        assert!(
            t.contains(args[args.len() - 2]) && t.contains("selects nothing"),
            "{t}"
        );
        assert!(!dir.path().join("runs").exists(), "{args:?} started a run");
    }
}

/// Issue 52, item 7: `history` outside a project said "None yet." with exit 0, as if the project
/// had no attempts; it names what is missing and exits 2, as JSON too.
#[test]
fn history_outside_a_project_says_so() {
    let empty = tempfile::tempdir().unwrap();
    let out = flashtune(empty.path(), &["history"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("not a flashtune project"),
        "{}",
        text(&out)
    );
    let out = flashtune(empty.path(), &["history", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("not a flashtune project"),
        "{doc}"
    );
}

fn load_space_with(edit: impl Fn(&str) -> String) -> (Error, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("space.toml");
    let original = std::fs::read_to_string(repo().join("variants/smoke.toml")).unwrap();
    let edited = edit(&original);
    std::fs::write(&path, &edited).unwrap();
    (Space::load(&path).unwrap_err(), edited)
}

/// Issue 52: a syntax error inside a multi-line array names the array's key (it named `'MMA`, the
/// text before an `=` inside an element), and an array never closed is blamed on its own key and
/// the line it opened on (it named the next key, `params.WARPS`).
#[test]
fn a_syntax_error_inside_an_array_names_the_array_and_where_it_opened() {
    let (e, edited) = load_space_with(|s| s.replacen("STAGES == 1',\n", "STAGES == 1'\n", 1));
    let (line, _, key) = location(&e);
    assert_eq!(key, "constraints", "{e}");
    assert_eq!(line, line_of(&edited, "  'MMA == \"scalar\""), "{e}");
    assert!(
        e.to_string().contains(&format!(
            "opened at line {}",
            line_of(&edited, "constraints = [")
        )),
        "{e}"
    );

    let (e, edited) = load_space_with(|s| s.replace("BLOCK_N = [64]", "BLOCK_N = [64,"));
    let (_, _, key) = location(&e);
    assert_eq!(key, "params.BLOCK_N", "{e}");
    assert!(
        e.to_string().contains(&format!(
            "opened at line {}",
            line_of(&edited, "BLOCK_N = [64,")
        )),
        "{e}"
    );
}

/// Issue 52: a parameter the baseline does not set is placed at the parameter's own line (it was
/// blamed on `baseline`), and the message says both ways out.
#[test]
fn a_parameter_the_baseline_does_not_set_is_placed_at_its_own_line() {
    let (e, edited) =
        load_space_with(|s| s.replace("STAGES = [1]\n", "STAGES = [1]\nFOO = [1, 2]\n"));
    let (line, _, key) = location(&e);
    assert_eq!(
        (line, key.as_str()),
        (line_of(&edited, "FOO = [1, 2]"), "params.FOO"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("add `FOO = <one of its values>` to the baseline"),
        "{e}"
    );
}

/// A space beside a copy of the Hopper space, written from `separate-kv.toml` (which takes the
/// Hopper family with `family_from`) by `edit`; the error loading it, and its text.
fn load_family_from_with(edit: impl Fn(&str) -> String) -> (Error, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo().join("variants/hopper.toml"),
        dir.path().join("hopper.toml"),
    )
    .unwrap();
    let path = dir.path().join("space.toml");
    let original = std::fs::read_to_string(repo().join("variants/separate-kv.toml")).unwrap();
    assert!(original.contains("\nfamily_from = \"hopper.toml\"\n"));
    let edited = edit(&original);
    std::fs::write(&path, &edited).unwrap();
    let e = Space::load(&path).unwrap_err();
    // The folder lives as long as the caller reads the error's paths.
    (e, edited, dir)
}

/// `family_from` takes the named space's family, symbols and timeouts, and the space's own
/// [timeouts] still win; every shipped space that takes one takes exactly the named space's.
#[test]
fn family_from_takes_the_named_spaces_family_and_its_own_timeouts_win() {
    let mut takers = 0;
    for entry in std::fs::read_dir(repo().join("variants")).unwrap() {
        let path = entry.unwrap().path();
        let space = Space::load(&path).unwrap();
        let Some(source) = &space.family_source else {
            continue;
        };
        takers += 1;
        let named = Space::load(&source.path).unwrap();
        assert_eq!(
            space.family.launch_expressions(),
            named.family.launch_expressions(),
            "{}",
            path.display()
        );
        assert_eq!(
            (&space.family.forward, &space.family.reference),
            (&named.family.forward, &named.family.reference)
        );
        assert_eq!(
            format!("{:?}", space.timeouts),
            format!("{:?}", named.timeouts)
        );
        // The run header's space hash covers both files: a changed family is a changed space.
        assert!(space.identity_text().contains(&source.text));
        assert_eq!(space.sources().len(), 2);
    }
    assert!(takers >= 7, "the experiment spaces take the Hopper family");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo().join("variants/hopper.toml"),
        dir.path().join("hopper.toml"),
    )
    .unwrap();
    let own = std::fs::read_to_string(repo().join("variants/separate-kv.toml")).unwrap()
        + "\n[timeouts]\nbuild_s = 7\nworker_s = 8\nbaseline_s = 9\n";
    std::fs::write(dir.path().join("own.toml"), own).unwrap();
    let space = Space::load(&dir.path().join("own.toml")).unwrap();
    let t = space.timeouts.expect("its own timeouts");
    assert_eq!((t.build_s, t.worker_s, t.baseline_s), (7, 8, 9));
}

/// Each way `family_from` can be wrong names the file, the line and the key, and says what to do.
#[test]
fn a_wrong_family_from_names_its_line_and_what_to_do() {
    let family_line = "family_from = \"hopper.toml\"";
    let cases: [(&str, Box<dyn Fn(&str) -> String>, &str, &str); 5] = [
        (
            "outside",
            Box::new(|s: &str| s.replace(family_line, "family_from = \"../hopper.toml\"")),
            "family_from",
            "with no `..`",
        ),
        (
            "missing",
            Box::new(|s: &str| s.replace(family_line, "family_from = \"hoper.toml\"")),
            "family_from",
            "cannot read",
        ),
        (
            "itself",
            Box::new(|s: &str| s.replace(family_line, "family_from = \"space.toml\"")),
            "family_from",
            "takes its family with family_from too",
        ),
        (
            "both",
            Box::new(|s: &str| {
                let hopper = std::fs::read_to_string(repo().join("variants/hopper.toml")).unwrap();
                s.to_owned() + &hopper[hopper.find("\n[family]\n").unwrap()..]
            }),
            "family_from",
            "not both",
        ),
        (
            "symbols",
            Box::new(|s: &str| s.to_owned() + "\n[symbols]\nauto = 0\n"),
            "symbols",
            "come with the family",
        ),
    ];
    for (what, edit, key, says) in cases {
        let (e, edited, dir) = load_family_from_with(edit);
        let (line, _, at) = location(&e);
        assert_eq!(at, key, "{what}: {e}");
        let needle = if key == "symbols" {
            "[symbols]"
        } else {
            "family_from"
        };
        assert_eq!(line, line_of(&edited, needle), "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert!(
            e.to_string()
                .contains(&dir.path().join("space.toml").display().to_string()),
            "{what}: {e}"
        );
    }
    // Neither a family nor family_from.
    let (e, _, _dir) = load_family_from_with(|s| s.replace(family_line, ""));
    assert!(
        e.to_string().contains("a space needs a [family] table"),
        "{e}"
    );
}

/// A family expression that fails on the taking space's baseline (a parameter the family names
/// and the space lacks) is placed in the family's own file, at its line, naming the space that took it.
#[test]
fn a_taken_family_that_fails_on_the_baseline_is_placed_in_its_own_file() {
    let (e, _, dir) = load_family_from_with(|s| {
        s.replace(", PERSISTENT_CTAS = 0", "")
            .replace(", PERSISTENT_CTAS = 1", "")
    });
    let hopper = dir.path().join("hopper.toml");
    let hopper_text = std::fs::read_to_string(&hopper).unwrap();
    match &e {
        Error::Config {
            file, line, key, ..
        } => {
            assert_eq!(file, &hopper, "{e}");
            assert_eq!(key, "family.split_counters", "{e}");
            assert_eq!(*line, line_of(&hopper_text, "split_counters = "), "{e}");
        }
        other => panic!("expected a config error, got {other}"),
    }
    assert!(
        e.to_string().contains(&format!(
            "the family {} takes with family_from",
            dir.path().join("space.toml").display()
        )),
        "{e}"
    );
}

/// Only a grid is expanded as the product of its parameters' values, and only a grid is bounded by
/// it: a points list is exactly its points (the product of the values the Hopper space's points,
/// 66 then, take passed a million once GROUP_KEY_TILES joined them, and the space would not plan).
#[test]
fn the_grid_bound_is_a_grids_and_not_a_points_lists() {
    let hopper_path = repo().join("variants/hopper.toml");
    let hopper = Space::load(&hopper_path).unwrap();
    let listed: toml::Value =
        toml::from_str(&std::fs::read_to_string(&hopper_path).unwrap()).unwrap();
    let listed = listed["points"].as_array().unwrap().len();
    assert!(listed > 70, "{listed}");
    assert_eq!(hopper.variants().unwrap().len(), listed);

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo().join("variants/hopper.toml"),
        dir.path().join("hopper.toml"),
    )
    .unwrap();
    let eight = "[1, 2, 3, 4, 5, 6, 7, 8]";
    let grid = format!(
        "name = \"big\"\ndescription = \"a grid past the bound\"\nfamily_from = \"hopper.toml\"\n\
         baseline = {{ MMA = \"wgmma\", BLOCK_M = 1, BLOCK_N = 1, WARPS = 1, KV_SPLIT = 1, STAGES = 1, PINGPONG = 1, TMA = 1, PERSISTENT_CTAS = 0 }}\n\n\
         [params]\nMMA = [\"wgmma\"]\nBLOCK_M = {eight}\nBLOCK_N = {eight}\nWARPS = {eight}\nKV_SPLIT = {eight}\n\
         STAGES = {eight}\nPINGPONG = {eight}\nTMA = {eight}\nPERSISTENT_CTAS = [0, 1]\n"
    );
    let path = dir.path().join("big.toml");
    std::fs::write(&path, grid).unwrap();
    // 8^7 x 2 points: not expanded.
    let e = match Space::load(&path).unwrap().variants() {
        Ok(points) => panic!("{} grid points expanded", points.len()),
        Err(e) => e,
    };
    assert!(
        e.to_string()
            .contains("the grid has more than 1000000 points"),
        "{e}"
    );
}
