//! The workbench's JSON Schema (tests/fixtures/schemas/workbench-1.schema.json): every document the
//! CLI's `--json` commands and the MCP tools answer is checked against one of its definitions.
use serde_json::{json, Value};

fn validator(def: &str) -> jsonschema::Validator {
    let mut schema: Value =
        serde_json::from_str(&super::fixture("schemas/workbench-1.schema.json")).unwrap();
    schema["$ref"] = json!(format!("#/$defs/{def}"));
    jsonschema::validator_for(&schema).unwrap()
}

/// Panic, naming each violation, unless `doc` is a valid `def` (`verdict`, `context`, ...).
pub fn check(def: &str, doc: &Value) {
    let errors: Vec<String> = validator(def)
        .iter_errors(doc)
        .map(|e| format!("{e} (at {})", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "not a valid {def}: {errors:#?}\n{doc:#}");
}

pub fn is_valid(def: &str, doc: &Value) -> bool {
    validator(def).is_valid(doc)
}
