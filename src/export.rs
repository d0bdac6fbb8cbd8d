//! Machine-readable exports of a run log: CSV (one row per variant × shape × dtype), JSON, and T4 (the auto-tuning community's results format).
use crate::config::Dtype;
use crate::runlog::{LoadedLog, Record};
use crate::space::Params;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What became of one (variant, shape, dtype), with the log line of its deciding record.
#[derive(Debug, Clone, Serialize)]
pub struct CaseRow {
    pub variant: String,
    pub step: Option<String>,
    pub params: Params,
    pub shape: String,
    pub dtype: Dtype,
    /// `timed`, `wrong`, `build_failed`, `crashed`, `timed_out` or `not_run`.
    pub status: String,
    pub median_us: Option<f64>,
    pub p10_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub tflops: Option<f64>,
    pub samples_us: Vec<f64>,
    pub max_abs: Option<f64>,
    pub rel_l2: Option<f64>,
    pub build_seconds: f64,
    pub reason: Option<String>,
    pub log_line: usize,
}

/// Every (variant, shape, dtype) the run planned as valid, in log order; later records win.
pub fn cases(log: &LoadedLog) -> Vec<CaseRow> {
    let Some(header) = log.header() else {
        return Vec::new();
    };
    let mut rows: BTreeMap<(String, String, Dtype), CaseRow> = BTreeMap::new();
    let mut order: Vec<(String, String, Dtype)> = Vec::new();
    let mut build_seconds: BTreeMap<(String, Dtype, u32), f64> = BTreeMap::new();
    for (line, e) in &log.entries {
        match &e.record {
            Record::Planned {
                variant,
                step,
                params,
                head_dim,
                invalid: None,
                ..
            } => {
                for shape in header.shapes.iter().filter(|s| s.d == *head_dim) {
                    for &dtype in &header.dtypes {
                        let key = (variant.clone(), shape.name.clone(), dtype);
                        if !rows.contains_key(&key) {
                            order.push(key.clone());
                        }
                        rows.insert(
                            key,
                            CaseRow {
                                variant: variant.clone(),
                                step: step.clone(),
                                params: params.clone(),
                                shape: shape.name.clone(),
                                dtype,
                                status: "not_run".into(),
                                median_us: None,
                                p10_us: None,
                                p90_us: None,
                                tflops: None,
                                samples_us: Vec::new(),
                                max_abs: None,
                                rel_l2: None,
                                build_seconds: 0.0,
                                reason: None,
                                log_line: *line,
                            },
                        );
                    }
                }
            }
            Record::Built {
                variant,
                dtype,
                head_dim,
                seconds,
                ..
            } => {
                build_seconds.insert((variant.clone(), *dtype, *head_dim), *seconds);
            }
            Record::BuildFailed {
                variant,
                dtype,
                head_dim,
                reason,
                ..
            }
            | Record::Rejected {
                variant,
                dtype,
                head_dim,
                reason,
            } => {
                for shape in header.shapes.iter().filter(|s| s.d == *head_dim) {
                    if let Some(r) = rows.get_mut(&(variant.clone(), shape.name.clone(), *dtype)) {
                        r.status = "build_failed".into();
                        r.reason = Some(reason.clone());
                        r.log_line = *line;
                    }
                }
            }
            Record::Checked {
                variant,
                shape,
                dtype,
                check,
                ..
            } => {
                if let Some(r) = rows.get_mut(&(variant.clone(), shape.clone(), *dtype)) {
                    r.max_abs = Some(check.max_abs);
                    r.rel_l2 = Some(check.rel_l2);
                }
            }
            Record::CheckFailed {
                variant,
                shape,
                dtype,
                check,
                reason,
            } => {
                if let Some(r) = rows.get_mut(&(variant.clone(), shape.clone(), *dtype)) {
                    r.status = if reason.starts_with("CUDA error") {
                        "crashed".into()
                    } else {
                        "wrong".into()
                    };
                    r.max_abs = check.as_ref().map(|c| c.max_abs);
                    r.rel_l2 = check.as_ref().map(|c| c.rel_l2);
                    r.reason = Some(reason.clone());
                    r.log_line = *line;
                }
            }
            Record::Timed {
                variant,
                shape,
                dtype,
                timing,
                ..
            } => {
                if let Some(r) = rows.get_mut(&(variant.clone(), shape.clone(), *dtype)) {
                    r.status = "timed".into();
                    r.median_us = Some(timing.median_us);
                    r.p10_us = Some(timing.p10_us);
                    r.p90_us = Some(timing.p90_us);
                    r.tflops = Some(timing.tflops);
                    r.samples_us = timing.samples_us.clone();
                    r.reason = None;
                    r.log_line = *line;
                }
            }
            Record::TimedOut {
                variant,
                cases_not_run,
                ..
            }
            | Record::WorkerCrashed {
                variant,
                cases_not_run,
                ..
            } => {
                let status = if matches!(e.record, Record::TimedOut { .. }) {
                    "timed_out"
                } else {
                    "crashed"
                };
                for case in cases_not_run {
                    let Some((shape, dtype)) = case.split_once('/') else {
                        continue;
                    };
                    let Ok(dtype) = serde_json::from_value::<Dtype>(json!(dtype)) else {
                        continue;
                    };
                    if let Some(r) = rows.get_mut(&(variant.clone(), shape.to_owned(), dtype)) {
                        if r.status == "not_run" {
                            r.status = status.into();
                            r.log_line = *line;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let d_of: BTreeMap<&str, u32> = header
        .shapes
        .iter()
        .map(|s| (s.name.as_str(), s.d))
        .collect();
    order
        .into_iter()
        .filter_map(|k| rows.remove(&k))
        .map(|mut r| {
            r.build_seconds = build_seconds
                .get(&(r.variant.clone(), r.dtype, d_of[r.shape.as_str()]))
                .copied()
                .unwrap_or(0.0);
            r
        })
        .collect()
}

pub fn csv(log: &LoadedLog) -> String {
    let rows = cases(log);
    let param_names: Vec<String> = rows
        .first()
        .map(|r| r.params.keys().cloned().collect())
        .unwrap_or_default();
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = vec!["variant".into(), "step".into()];
    header.extend(param_names.iter().cloned());
    header.extend(
        [
            "shape",
            "dtype",
            "status",
            "median_us",
            "p10_us",
            "p90_us",
            "tflops",
            "max_abs",
            "rel_l2",
            "reason",
            "log_line",
        ]
        .map(String::from),
    );
    w.write_record(&header).expect("in-memory CSV");
    let opt = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
    for r in &rows {
        let mut rec: Vec<String> = vec![r.variant.clone(), r.step.clone().unwrap_or_default()];
        rec.extend(
            param_names
                .iter()
                .map(|p| r.params.get(p).map(|v| v.to_string()).unwrap_or_default()),
        );
        rec.extend([
            r.shape.clone(),
            r.dtype.to_string(),
            r.status.clone(),
            opt(r.median_us),
            opt(r.p10_us),
            opt(r.p90_us),
            opt(r.tflops),
            opt(r.max_abs),
            opt(r.rel_l2),
            r.reason.clone().unwrap_or_default(),
            r.log_line.to_string(),
        ]);
        w.write_record(&rec).expect("in-memory CSV");
    }
    String::from_utf8(w.into_inner().expect("in-memory CSV")).expect("CSV of UTF-8 fields")
}

pub fn json(log: &LoadedLog) -> Value {
    json!({
        "header": log.header(),
        "cases": cases(log),
        "champions": crate::champions::from_log(log),
        "torn_tail": log.torn_tail,
    })
}

/// T4 results (schema 1.0.0): one result per (variant, shape, dtype); times in milliseconds as Kernel Tuner writes them.
pub fn t4(log: &LoadedLog) -> Value {
    let started = log
        .header()
        .map(|h| h.started_at.clone())
        .unwrap_or_default();
    let results: Vec<Value> = cases(log)
        .iter()
        .map(|r| {
            let mut configuration = serde_json::to_value(&r.params).unwrap_or(json!({}));
            configuration["shape"] = json!(r.shape);
            configuration["dtype"] = json!(r.dtype);
            let invalidity = match r.status.as_str() {
                "timed" => "correct",
                "wrong" => "correctness",
                "build_failed" => "compile",
                "timed_out" => "timeout",
                _ => "runtime",
            };
            let mut measurements = Vec::new();
            if let (Some(us), Some(tf)) = (r.median_us, r.tflops) {
                measurements.push(json!({"name": "time", "value": us / 1000.0, "unit": "ms"}));
                measurements.push(json!({"name": "tflops", "value": tf, "unit": "TFLOP/s"}));
            }
            json!({
                "timestamp": started,
                "configuration": configuration,
                "objectives": ["time"],
                "times": {
                    "compilation_time": r.build_seconds * 1000.0,
                    "runtimes": r.samples_us.iter().map(|us| us / 1000.0).collect::<Vec<_>>(),
                },
                "invalidity": invalidity,
                "correctness": if invalidity == "correct" { 1 } else { 0 },
                "measurements": measurements,
            })
        })
        .collect();
    json!({"schema_version": "1.0.0", "results": results})
}

/// Write every format beside the log; returns the Markdown.
pub fn write_all(run_dir: &std::path::Path, log: &LoadedLog) -> std::io::Result<String> {
    let md = crate::report::markdown(log);
    std::fs::write(run_dir.join("report.md"), &md)?;
    std::fs::write(run_dir.join("report.csv"), csv(log))?;
    std::fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&json(log)).expect("JSON values serialize"),
    )?;
    std::fs::write(
        run_dir.join("report.t4.json"),
        serde_json::to_string_pretty(&t4(log)).expect("JSON values serialize"),
    )?;
    std::fs::write(run_dir.join("report.html"), crate::html::page(log))?;
    Ok(md)
}
