//! The exporters (CSV, JSON, T4) on fixed run logs: valid against their schema, each row traced to the log, a torn log still reported.
use crate::common;
use common::*;
use flashtune::log::runlog::{self, Record};
use flashtune::report::export;

fn fixture_log(name: &str) -> runlog::LoadedLog {
    runlog::read(&repo().join("tests/fixtures/runs").join(name)).unwrap()
}

fn t4_schema() -> serde_json::Value {
    serde_json::from_str(&fixture("schemas/t4-1.0.0/results-schema.json")).unwrap()
}

#[test]
fn t4_export_is_valid_against_the_schema() {
    let schema = t4_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for name in ["smoke-h200.log.jsonl", "smoke-killed-torn.log.jsonl"] {
        let t4 = export::t4(&flashtune::log::runindex::RunIndex::new(&fixture_log(name)));
        let errors: Vec<String> = validator.iter_errors(&t4).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
        assert!(!t4["results"].as_array().unwrap().is_empty());
    }
    // The validator is real: a result without its required fields is refused.
    let broken = serde_json::json!({"schema_version": "1.0.0", "results": [{"configuration": {}}]});
    assert!(!validator.is_valid(&broken));
}

#[test]
fn csv_has_one_row_per_case_and_traces_each_to_the_log() {
    let log = fixture_log("smoke-h200.log.jsonl");
    let text = export::csv(&flashtune::log::runindex::RunIndex::new(&log));
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 4 * 6 * 2, "4 variants x 6 shapes x 2 dtypes");
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    for r in &rows {
        assert_eq!(&r[col("status")], "timed");
        let line: usize = r[col("log_line")].parse().unwrap();
        assert!(matches!(
            log.entries
                .iter()
                .find(|(l, _)| *l == line)
                .map(|(_, e)| &e.record),
            Some(Record::Timed { .. })
        ));
    }
}

#[test]
fn a_killed_run_with_a_torn_line_still_reports() {
    let log = fixture_log("smoke-killed-torn.log.jsonl");
    assert!(log.torn_tail);
    let ix = flashtune::log::runindex::RunIndex::new(&log);
    let md = flashtune::report::sections::markdown(&ix);
    assert!(
        md.contains("no `finished` record") && md.contains("cut short"),
        "{md}"
    );
    let rows = export::cases(&ix);
    assert!(
        rows.iter().any(|r| r.status.as_str() == "timed")
            && rows.iter().any(|r| r.status.as_str() == "not_run")
    );
    let json = export::json(&ix);
    assert!(json["torn_tail"].as_bool().unwrap());
    assert!(!json["champions"].as_array().unwrap().is_empty());
}
