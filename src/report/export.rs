//! Machine-readable exports of a run log: CSV (one row per variant × shape × dtype), JSON, and T4 (the auto-tuning community's results format).
use crate::log::runindex::{Case, CaseStatus, RunIndex};
use crate::log::runlog::LoadedLog;
use crate::model::config::Dtype;
use crate::model::space::Params;
use serde::Serialize;
use serde_json::{json, Value};

/// What became of one (variant, shape, dtype), with the log line of its deciding record.
#[derive(Debug, Clone, Serialize)]
pub struct CaseRow {
    pub variant: String,
    pub step: Option<String>,
    pub params: Params,
    pub shape: String,
    pub dtype: Dtype,
    /// `timed`, `wrong`, `build_failed`, `crashed`, `timed_out`, `implausible`, `skipped` or `not_run`.
    pub status: CaseStatus,
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
    /// `yes` for its (shape, dtype)'s champion (the fastest case of a variant no fault bars from
    /// the shape); `tied` for that case and its runner-up when the two are within the noise (then
    /// neither is the finding).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub champion: Option<ChampionMark>,
    /// The other variant of a tie.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tied_with: Option<String>,
    /// Taken from the results store (`--reuse`): the run and log line that measured it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_from: Option<ReusedFrom>,
}

/// How a case stands in its (shape, dtype)'s champion pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChampionMark {
    /// The champion.
    Yes,
    /// The champion or its runner-up, within the noise of each other.
    Tied,
}

impl ChampionMark {
    fn as_str(self) -> &'static str {
        match self {
            ChampionMark::Yes => "yes",
            ChampionMark::Tied => "tied",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ReusedFrom {
    pub run: String,
    pub line: usize,
}

impl CaseRow {
    fn of(c: &Case) -> CaseRow {
        let timing = c.outcome.timing();
        CaseRow {
            variant: c.variant.to_owned(),
            step: c.step.map(str::to_owned),
            params: c.params.clone(),
            shape: c.shape.name.clone(),
            dtype: c.dtype,
            status: c.outcome.status(),
            median_us: timing.map(|t| t.median_us),
            p10_us: timing.map(|t| t.p10_us),
            p90_us: timing.map(|t| t.p90_us),
            tflops: timing.map(|t| t.tflops),
            samples_us: timing.map(|t| t.samples_us.clone()).unwrap_or_default(),
            max_abs: c.check.map(|c| c.max_abs),
            rel_l2: c.check.map(|c| c.rel_l2),
            build_seconds: c.build_seconds,
            // A reused case has no failure to explain: its reason says where its figures came from.
            reason: c.outcome.reason().map(str::to_owned).or_else(|| {
                c.reused()
                    .map(|r| format!("reused from run {} line {}", r.run, r.line))
            }),
            log_line: c.log_line(),
            champion: None,
            tied_with: None,
            reused_from: c.reused().map(|r| ReusedFrom {
                run: r.run.to_owned(),
                line: r.line,
            }),
        }
    }
}

/// Every (variant, shape, dtype) the run planned as valid, in the order first planned, each as its last terminal record left it.
pub fn cases(ix: &RunIndex) -> Vec<CaseRow> {
    let mut rows: Vec<CaseRow> = ix.cases.iter().map(CaseRow::of).collect();
    let Some(header) = ix.header else {
        return rows;
    };
    let mut mark =
        |variant: &str, shape: &str, dtype: Dtype, what: ChampionMark, other: Option<&str>| {
            if let Some(r) = rows
                .iter_mut()
                .find(|r| r.variant == variant && r.shape == shape && r.dtype == dtype)
            {
                r.champion = Some(what);
                r.tied_with = other.map(str::to_owned);
            }
        };
    for shape in &header.shapes {
        for &dtype in &header.dtypes {
            let Some(pick) = ix.pick(&shape.name, dtype) else {
                continue;
            };
            match (pick.tie, pick.runner_up) {
                (Some(_), Some(r)) => {
                    let best = pick.best.variant;
                    mark(
                        best,
                        &shape.name,
                        dtype,
                        ChampionMark::Tied,
                        Some(r.variant),
                    );
                    mark(
                        r.variant,
                        &shape.name,
                        dtype,
                        ChampionMark::Tied,
                        Some(best),
                    );
                }
                _ => mark(
                    pick.best.variant,
                    &shape.name,
                    dtype,
                    ChampionMark::Yes,
                    None,
                ),
            }
        }
    }
    rows
}

pub fn csv(ix: &RunIndex) -> String {
    let rows = cases(ix);
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
            "champion",
            "tied_with",
            "fake",
        ]
        .map(String::from),
    );
    w.write_record(&header).expect("in-memory CSV");
    let opt = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
    // On every row, so a filtered or concatenated CSV still says its figures were not measured.
    let fake = ix.fake().to_string();
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
            r.status.to_string(),
            opt(r.median_us),
            opt(r.p10_us),
            opt(r.p90_us),
            opt(r.tflops),
            opt(r.max_abs),
            opt(r.rel_l2),
            r.reason.clone().unwrap_or_default(),
            r.log_line.to_string(),
            r.champion.map_or("", ChampionMark::as_str).to_owned(),
            r.tied_with.clone().unwrap_or_default(),
            fake.clone(),
        ]);
        w.write_record(&rec).expect("in-memory CSV");
    }
    String::from_utf8(w.into_inner().expect("in-memory CSV")).expect("CSV of UTF-8 fields")
}

pub fn json(ix: &RunIndex) -> Value {
    let a = &ix.accounting;
    let mut value = json!({
        "header": ix.header,
        "fake": ix.fake(),
        "accounting": {
            "planned": a.planned,
            "measured": a.measured,
            "failed": a.failed,
            "implausible": a.implausible,
            "skipped": a.skipped,
            "not_run": a.not_run,
            "holds": a.holds(),
            "problems": a.problems,
        },
        "cases": cases(ix),
        "champions": crate::report::champions::from_index(ix),
        "torn_tail": ix.log.torn_tail,
    });
    // Only where it says something, so reports of runs without the store read as before.
    if a.reused > 0 {
        value["accounting"]["reused"] = json!(a.reused);
    }
    if let Some((line, order)) = ix.dispatch_order {
        value["dispatch_order"] = json!({"line": line, "order": order});
    }
    value
}

/// T4 results (schema 1.0.0): one result per (variant, shape, dtype); times in milliseconds as Kernel Tuner writes them,
/// the `time` measurement being the median per launch and `runtimes` every sample.
/// `metadata` (T4's metadata schema) names the GPU and says whether the figures are the fake GPU's.
pub fn t4(ix: &RunIndex) -> Value {
    let started = ix.header.map(|h| h.started_at.clone()).unwrap_or_default();
    let fake = ix.fake();
    let results: Vec<Value> = cases(ix)
        .iter()
        .map(|r| {
            let mut configuration = serde_json::to_value(&r.params).unwrap_or(json!({}));
            configuration["shape"] = json!(r.shape);
            configuration["dtype"] = json!(r.dtype);
            let invalidity = match r.status {
                CaseStatus::Timed => "correct",
                // Faster than the GPU can go: what was timed is not the work that was asked for.
                CaseStatus::Wrong | CaseStatus::Implausible => "correctness",
                CaseStatus::BuildFailed => "compile",
                CaseStatus::TimedOut => "timeout",
                CaseStatus::Crashed | CaseStatus::Skipped | CaseStatus::NotRun => "runtime",
            };
            let correct = invalidity == "correct";
            let mut measurements = Vec::new();
            if let (true, Some(us), Some(tf)) = (correct, r.median_us, r.tflops) {
                measurements.push(json!({"name": "time", "value": us / 1000.0, "unit": "ms"}));
                measurements.push(json!({"name": "tflops", "value": tf, "unit": "TFLOP/s"}));
            }
            let runtimes: Vec<f64> = if correct {
                r.samples_us.iter().map(|us| us / 1000.0).collect()
            } else {
                Vec::new()
            };
            json!({
                "timestamp": started,
                "configuration": configuration,
                "objectives": ["time"],
                "times": {
                    "compilation_time": r.build_seconds * 1000.0,
                    "runtimes": runtimes,
                },
                "invalidity": invalidity,
                // No correctness claim without a kernel: the fake GPU runs none.
                "correctness": if correct && !fake { 1 } else { 0 },
                "measurements": measurements,
            })
        })
        .collect();
    json!({"schema_version": "1.0.0", "metadata": t4_metadata(ix), "results": results})
}

/// The run's environment in T4's metadata schema, plus flashtune's own block (run id, fake or measured).
fn t4_metadata(ix: &RunIndex) -> Value {
    let Some(h) = ix.header else {
        return json!({});
    };
    let d = &h.device;
    json!({
        "environment": {
            "device_query": {
                "name": d.name,
                "sm_count": d.sm_count,
                "compute_capability": format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
                "arch": d.arch,
                "driver_version": d.driver_version,
                "fake": d.fake,
            },
            "requirements": [
                format!("flashtune {}", h.flashtune_version),
                h.toolchain.version.clone(),
            ],
        },
        "flashtune": {
            "run_id": h.run_id,
            "fake": d.fake,
            "figures": if d.fake {
                "synthetic: the fake GPU (a test double) ran no kernel; no figure here was measured"
            } else {
                "measured"
            },
        },
    })
}

/// What [`write_all`] wrote for people, to print: `report.md`, and the terminal's summary.
pub struct Written {
    pub markdown: String,
    pub summary: String,
}

/// Write every format beside the log, the three people read from one document (indexed once).
pub fn write_all(run_dir: &std::path::Path, log: &LoadedLog) -> std::io::Result<Written> {
    use crate::report::emit::{Emitter, Html, Markdown, Terminal};
    let ix = RunIndex::new(log);
    let doc = crate::report::sections::document(&ix);
    let written = Written {
        markdown: Markdown.emit(&doc),
        summary: Terminal.emit(&doc),
    };
    std::fs::write(run_dir.join("report.md"), &written.markdown)?;
    std::fs::write(run_dir.join("report.csv"), csv(&ix))?;
    std::fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&json(&ix)).expect("JSON values serialize"),
    )?;
    std::fs::write(
        run_dir.join("report.t4.json"),
        serde_json::to_string_pretty(&t4(&ix)).expect("JSON values serialize"),
    )?;
    let page = crate::report::sections::with_plots(&ix, doc);
    std::fs::write(run_dir.join("report.html"), Html.emit(&page))?;
    Ok(written)
}
