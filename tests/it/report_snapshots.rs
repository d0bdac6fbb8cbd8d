//! Snapshot tests of every report format (md, html, csv, json, t4.json) written from the fixed run logs in tests/fixtures/runs; a log added there gets its snapshots on the next run.
use crate::common;
use common::*;
use flashtune::log::runindex::RunIndex;
use flashtune::log::runlog::{self, Entry, LoadedLog, Record};
use flashtune::model::config::Dtype;
use flashtune::report::export;

/// Every `*.log.jsonl` under tests/fixtures/runs, by name, in name order.
fn fixture_logs() -> Vec<(String, LoadedLog)> {
    let dir = repo().join("tests/fixtures/runs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log.jsonl"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 3,
        "fixture logs missing in {}",
        dir.display()
    );
    names
        .into_iter()
        .map(|n| {
            let log = runlog::read(&dir.join(&n)).unwrap();
            (n.trim_end_matches(".log.jsonl").to_owned(), log)
        })
        .collect()
}

const FORMATS: [&str; 5] = ["md", "html", "csv", "json", "t4.json"];

#[test]
fn every_format_of_every_fixture_log_matches_its_snapshot() {
    for (name, log) in fixture_logs() {
        let dir = tempfile::tempdir().unwrap();
        let md = export::write_all(dir.path(), &log).unwrap().markdown;
        for format in FORMATS {
            let text = std::fs::read_to_string(dir.path().join(format!("report.{format}")))
                .unwrap_or_else(|e| panic!("{name}: report.{format} not written: {e}"));
            if format == "md" {
                assert_eq!(text, md, "write_all returns the Markdown it wrote");
            }
            // The snapshots keep their place and names from when this file was a test binary of
            // its own (tests/snapshots/report_snapshots__*.snap).
            let mut settings = insta::Settings::clone_current();
            settings.set_snapshot_path("../snapshots");
            settings.set_prepend_module_to_snapshot(false);
            settings.bind(|| {
                insta::assert_snapshot!(format!("report_snapshots__{name}.{format}"), text)
            });
        }
    }
}

#[test]
fn reports_are_deterministic() {
    for (name, log) in fixture_logs() {
        assert_eq!(
            flashtune::report::sections::page(&RunIndex::new(&log)),
            flashtune::report::sections::page(&RunIndex::new(&log)),
            "{name}"
        );
        assert_eq!(
            flashtune::report::sections::markdown(&RunIndex::new(&log)),
            flashtune::report::sections::markdown(&RunIndex::new(&log)),
            "{name}"
        );
    }
}

#[test]
fn t4_of_every_fixture_log_is_valid_against_the_schema() {
    let schema: serde_json::Value =
        serde_json::from_str(&fixture("schemas/t4-1.0.0/results-schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (name, log) in fixture_logs() {
        let t4 = export::t4(&RunIndex::new(&log));
        let errors: Vec<String> = validator.iter_errors(&t4).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
}

#[test]
fn the_html_page_is_self_contained() {
    for (name, log) in fixture_logs() {
        let page = flashtune::report::sections::page(&RunIndex::new(&log));
        assert!(page.contains("<table>") && page.contains("<svg"), "{name}");
        for outside in ["http://", "https://", "<script", "<link", "src=\""] {
            let hits: Vec<&str> = page
                .match_indices(outside)
                .map(|(i, _)| &page[i.saturating_sub(40)..(i + 60).min(page.len())])
                // The SVG namespace is a name, not a fetch.
                .filter(|ctx| !ctx.contains("xmlns"))
                .collect();
            assert!(hits.is_empty(), "{name}: {outside} in {hits:?}");
        }
    }
}

fn smoke_log() -> LoadedLog {
    runlog::read(&repo().join("tests/fixtures/runs/smoke-h200.log.jsonl")).unwrap()
}

#[test]
fn a_log_without_timings_still_renders_and_says_so() {
    let mut log = smoke_log();
    log.entries.truncate(3);
    let page = flashtune::report::sections::page(&RunIndex::new(&log));
    assert!(page.contains("No timed records in this log"), "{page}");
    assert!(!page.contains("<svg"));
}

#[test]
fn without_ceilings_the_report_says_not_measured() {
    let md = flashtune::report::sections::markdown(&RunIndex::new(&smoke_log()));
    assert!(md.contains("| % of matmul ceiling | % of bandwidth ceiling |"));
    assert!(md.contains("| not measured | not measured |"));
    assert!(md.contains("Ceilings not measured in this run"));
}

#[test]
fn ceiling_records_become_percentages_of_the_best_case() {
    let mut log = smoke_log();
    let t = log.entries.last().unwrap().1.t;
    let ceiling = |name: &str, dtype: Option<Dtype>, value: f64, unit: &str| Entry {
        t,
        record: Record::CeilingMeasured {
            name: flashtune::model::vocab::Roof::named(name).unwrap(),
            dtype,
            value,
            unit: unit.into(),
            source: None,
            reused_from: None,
        },
    };
    let n = log.entries.len();
    log.entries
        .push((n + 1, ceiling("matmul", Some(Dtype::F16), 500.0, "TFLOP/s")));
    log.entries
        .push((n + 2, ceiling("copy", None, 4000.0, "GB/s")));
    let found = flashtune::report::findings::best_per_shape(&RunIndex::new(&log));
    let seed_f16 = found
        .rows
        .iter()
        .find(|r| r.shape.name == "seed" && r.dtype == Dtype::F16)
        .unwrap();
    // The figures below were worked out by hand from the log, not with the code under test.
    // Best seed f16: `wmma-bm64-bn64-w4-ks4-s1`, 24.582856 µs, 21.839240 TF/s (its `timed` record).
    let close = |got: Option<f64>, want: f64| {
        let got = got.expect("a percentage");
        assert!((got - want).abs() < 1e-6, "got {got}, want {want}");
    };
    let (variant, us, _) = seed_f16.best.clone().unwrap();
    assert_eq!(variant, "wmma-bm64-bn64-w4-ks4-s1");
    assert!((us - 24.582856).abs() < 1e-6, "{us}");
    // 21.839240 TF/s of a 500 TF/s roof.
    close(seed_f16.pct_of_matmul, 4.367848);
    // Q, K, V, O: 4 × 8 heads × 512 rows × 64 × 2 B = 2,097,152 B in 24.582856 µs = 85.3095 GB/s,
    // 2.132738% of a 4000 GB/s copy.
    assert_eq!(seed_f16.shape.min_dram_bytes(Dtype::F16), 2_097_152.0);
    close(seed_f16.pct_of_copy, 2.132738);
    // bf16 had no matmul ceiling: its column says so instead of borrowing f16's.
    let seed_bf16 = found
        .rows
        .iter()
        .find(|r| r.shape.name == "seed" && r.dtype == Dtype::Bf16)
        .unwrap();
    assert!(seed_bf16.pct_of_matmul.is_none() && seed_bf16.pct_of_copy.is_some());
    let md = flashtune::report::sections::markdown(&RunIndex::new(&log));
    assert!(
        md.contains(&format!("f16 matmul 500 TFLOP/s (log line {})", n + 1)),
        "{md}"
    );
    // A faster read-only stream becomes the bandwidth roof; a slower one does not.
    log.entries
        .push((n + 3, ceiling("read", None, 5000.0, "GB/s")));
    let found = flashtune::report::findings::best_per_shape(&RunIndex::new(&log));
    let row = found
        .rows
        .iter()
        .find(|r| r.shape.name == "seed" && r.dtype == Dtype::F16)
        .unwrap();
    // 85.3095 GB/s of a 5000 GB/s read-only stream.
    close(row.pct_of_copy, 1.706191);
    log.entries.last_mut().unwrap().1 = ceiling("read", None, 3000.0, "GB/s");
    let found = flashtune::report::findings::best_per_shape(&RunIndex::new(&log));
    let row = found
        .rows
        .iter()
        .find(|r| r.shape.name == "seed" && r.dtype == Dtype::F16)
        .unwrap();
    // A 3000 GB/s read stream is slower than the copy: the copy stays the roof.
    close(row.pct_of_copy, 2.132738);
}

#[tokio::test]
async fn the_adapter_ceilings_are_read_and_failures_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("adapter.py");
    std::fs::write(
        &script,
        r#"import json, sys
json.load(sys.stdin)
print(json.dumps({"torch": "x", "gpu": "y", "rows": [], "ceilings": [
    {"name": "matmul", "dtype": "f16", "value": 650.5, "unit": "TFLOP/s"},
    {"name": "matmul", "dtype": "bf16", "error": "OutOfMemoryError: no"},
    {"name": "copy", "dtype": None, "value": 4100.0, "unit": "GB/s"}]}))
"#,
    )
    .unwrap();
    let (mut p, _) =
        flashtune::model::config::Policies::load(&repo().join("policies.toml")).unwrap();
    p.baseline.command = vec!["python3".into(), script.display().to_string()];
    let shapes: Vec<_> = p
        .shapes
        .iter()
        .filter(|s| s.name == "small")
        .cloned()
        .collect();
    let (rows, ceilings) = flashtune::gpu::baseline::measure_with_ceilings(&repo(), &p, &shapes)
        .await
        .unwrap();
    assert!(rows.is_empty());
    let got: Vec<(flashtune::model::vocab::Roof, Option<Dtype>, f64)> = ceilings
        .into_iter()
        .map(|c| (c.name, c.dtype, c.value))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                flashtune::model::vocab::Roof::Matmul,
                Some(Dtype::F16),
                650.5
            ),
            (flashtune::model::vocab::Roof::Copy, None, 4100.0)
        ]
    );
}
