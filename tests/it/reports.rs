//! The reports' reading of a run on synthetic logs: the case accounting, implausible figures, ties (and what a resumed run and a committed table make of them), fake figures labelled in every export.
use flashtune::log::runindex::RunIndex;
use flashtune::log::runlog::{self, Entry, LoadedLog, Record};
use flashtune::model::config::Dtype;
use serde_json::{json, Value};
use std::path::PathBuf;

fn repo() -> PathBuf {
    std::env::var_os("FLASHTUNE_REPO")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// A log written record by record: the header of a real run cut down to two shapes of head dim 64
/// (`small`, `seed`) and one dtype, then whatever the test appends.
struct Log {
    entries: Vec<(usize, Entry)>,
}

const F16: Dtype = Dtype::F16;

impl Log {
    fn new(fake: bool) -> Log {
        let real = runlog::read(&repo().join("tests/fixtures/runs/smoke-h200.log.jsonl")).unwrap();
        let mut header = real.header().unwrap().clone();
        header
            .shapes
            .retain(|s| s.name == "small" || s.name == "seed");
        header.dtypes = vec![F16];
        header.baseline = "v0".into();
        header.device.fake = fake;
        let mut log = Log {
            entries: Vec::new(),
        };
        log.push(Record::Header(Box::new(header)));
        log
    }

    /// Append a record given as the log's own JSON, read as `runlog::read` reads a line (older
    /// records' words upgraded to their types); returns its line.
    fn record(&mut self, record: Value) -> usize {
        let line = self.entries.len() + 1;
        let mut entry = record;
        entry["t"] = json!(line as f64);
        let mut entry: flashtune::log::runlog::Entry =
            serde_json::from_value(entry).expect("a valid record");
        flashtune::log::runlog::legacy::upgrade(&mut entry.record);
        self.entries.push((line, entry));
        line
    }

    fn push(&mut self, record: Record) -> usize {
        let line = self.entries.len() + 1;
        self.entries.push((
            line,
            Entry {
                t: line as f64,
                record,
            },
        ));
        line
    }

    fn plan(&mut self, variant: &str) -> usize {
        self.record(json!({"event": "planned", "variant": variant,
            "params": {"MMA": "mma", "BLOCK_M": 64, "VARIANT": variant},
            "head_dim": 64, "launch": null, "invalid": null}))
    }

    /// A `timed` record whose samples have exactly this median and this (p90 - p10) / median.
    fn timed(&mut self, variant: &str, shape: &str, median_us: f64, spread: f64) -> usize {
        self.record(
            json!({"event": "timed", "variant": variant, "shape": shape, "dtype": "f16",
            "kv_splits": 1, "timing": timing(median_us, spread)}),
        )
    }

    fn resumed(&mut self) -> usize {
        self.record(json!({"event": "resumed", "after_line": self.entries.len(),
            "finished_variants": 0, "overridden": []}))
    }

    fn finished(&mut self) -> usize {
        self.record(json!({"event": "finished", "seconds": 1.0, "variants": 1,
            "measured_cases": 0, "failed_cases": 0}))
    }

    fn done(&self) -> LoadedLog {
        LoadedLog {
            entries: self.entries.clone(),
            torn_tail: false,
        }
    }
}

/// Eleven evenly spaced samples: p10 and p90 are the second and the tenth, `spread × median` apart.
fn timing(median_us: f64, spread: f64) -> Value {
    let samples: Vec<f64> = (0..11)
        .map(|i| median_us * (1.0 + spread * (i as f64 - 5.0) / 8.0))
        .collect();
    // flops of `small` (1,1,128,128,64); the reports read tflops from the record as it is.
    let t = flashtune::gpu::check::summarize(samples, 1, 4.0 * 128.0 * 128.0 * 64.0);
    serde_json::to_value(t).unwrap()
}

fn accounting_line(md: &str) -> &str {
    md.lines()
        .find(|l| l.starts_with("Cases: "))
        .expect("an accounting line")
}

/// A run stopped by its budget and resumed: the report's Not measured section lists only what is
/// still missing and says how many of the left variants the resume measured; a budget is no
/// failure, so the Failures section does not list it.
#[test]
fn a_budget_line_names_only_what_a_resume_left_unmeasured() {
    let mut log = Log::new(false);
    for v in ["v0", "v1", "v2"] {
        log.plan(v);
    }
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    log.record(
        json!({"event": "budget_reached", "reason": "--time-limit 60s",
        "variants_not_measured": ["v1", "v2"]}),
    );
    for v in ["v1", "v2"] {
        for shape in ["small", "seed"] {
            log.record(
                json!({"event": "case_skipped", "variant": v, "shape": shape, "dtype": "f16",
                "reason": "budget reached", "skipped_for": "budget"}),
            );
        }
    }
    let section = |md: &str| -> String {
        let start = md
            .find("## Not measured (--time-limit 60s)")
            .unwrap_or_else(|| panic!("no Not measured section:\n{md}"));
        let rest = &md[start + 3..];
        rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
    };
    let before = flashtune::report::sections::markdown(&RunIndex::new(&log.done()));
    let listed = section(&before);
    assert!(
        listed.contains("`v1`") && listed.contains("`v2`"),
        "{listed}"
    );
    assert!(!listed.contains("after a resume"), "{listed}");
    assert!(
        !before.contains("budget reached ("),
        "a budget is listed as a failure:\n{before}"
    );
    // The resume measures v1 only.
    log.timed("v1", "small", 11.0, 0.01);
    log.timed("v1", "seed", 21.0, 0.01);
    let after = flashtune::report::sections::markdown(&RunIndex::new(&log.done()));
    let listed = section(&after);
    assert!(
        !listed.contains("`v1`") && listed.contains("`v2`"),
        "{listed}"
    );
    assert!(
        listed.contains("1 of the 2 it left were measured after a resume"),
        "{listed}"
    );
}

#[test]
fn every_planned_case_lands_in_exactly_one_bin() {
    let mut log = Log::new(false);
    for v in ["v0", "v1", "v2", "v3", "v4"] {
        log.plan(v);
    }
    // v0: measured on both shapes.
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    // v1: wrong answers on one shape, a CUDA error on the other.
    log.record(
        json!({"event": "check_failed", "variant": "v1", "shape": "small", "dtype": "f16",
        "check": null, "reason": "12 NaN outputs"}),
    );
    log.record(
        json!({"event": "check_failed", "variant": "v1", "shape": "seed", "dtype": "f16",
        "check": null, "reason": "CUDA error: illegal address"}),
    );
    // v2: its build failed (both shapes), and the run says so per case as well.
    log.record(
        json!({"event": "build_failed", "variant": "v2", "dtype": "f16", "head_dim": 64,
        "reason": "nvcc failed", "log_tail": ""}),
    );
    log.record(
        json!({"event": "case_skipped", "variant": "v2", "shape": "small", "dtype": "f16",
        "reason": "build failed"}),
    );
    // v3: beyond a roof on one shape, skipped by the budget on the other.
    log.record(
        json!({"event": "implausible", "variant": "v3", "shape": "small", "dtype": "f16",
        "kv_splits": 1, "timing": timing(0.01, 0.01), "reason": "above the bandwidth roof"}),
    );
    log.record(
        json!({"event": "case_skipped", "variant": "v3", "shape": "seed", "dtype": "f16",
        "reason": "budget reached"}),
    );
    // v4: nothing yet; the run is interrupted.
    log.record(json!({"event": "interrupted", "reason": "Ctrl-C"}));
    let log = log.done();
    let ix = RunIndex::new(&log);
    let a = &ix.accounting;
    assert_eq!(
        (
            a.planned,
            a.measured,
            a.failed,
            a.implausible,
            a.skipped,
            a.not_run
        ),
        (10, 2, 3, 1, 2, 2),
        "{a:?}"
    );
    assert!(a.holds(), "{a:?}");
    let md = flashtune::report::sections::markdown(&ix);
    assert_eq!(
        accounting_line(&md),
        "Cases: 10 planned = 2 measured + 3 failed + 1 implausible + 2 skipped + 2 not run."
    );
    assert!(!md.contains("do not add up"), "{md}");
    // The printed short form carries it too, and the JSON export.
    let summary = flashtune::report::sections::summary(&log);
    assert!(summary.contains(accounting_line(&md)), "{summary}");
    let j = flashtune::report::export::json(&ix);
    assert_eq!(j["accounting"]["planned"], 10);
    assert_eq!(j["accounting"]["holds"], true);
    let statuses: Vec<&str> = flashtune::report::export::cases(&ix)
        .iter()
        .map(|r| match r.status.as_str() {
            "timed" => "m",
            "implausible" => "i",
            "skipped" => "s",
            "not_run" => "n",
            _ => "f",
        })
        .collect();
    assert_eq!(statuses.join(""), "mmffsfisnn");
}

#[test]
fn a_finished_run_without_missing_cases_states_no_not_run_term() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    log.finished();
    let md = flashtune::report::sections::markdown(&RunIndex::new(&log.done()));
    assert_eq!(
        accounting_line(&md),
        "Cases: 2 planned = 2 measured + 0 failed + 0 implausible + 0 skipped."
    );
}

#[test]
fn a_resumed_run_counts_a_rerun_case_once_by_its_last_record() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.timed("v0", "small", 10.0, 0.01);
    log.resumed();
    log.plan("v0");
    let line = log.record(
        json!({"event": "check_failed", "variant": "v0", "shape": "small",
        "dtype": "f16", "check": null, "reason": "race: 3 outputs moved"}),
    );
    log.timed("v0", "seed", 20.0, 0.01);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let a = &ix.accounting;
    assert!(a.holds(), "{a:?}");
    assert_eq!((a.planned, a.measured, a.failed), (2, 1, 1));
    let small = ix.case("v0", "small", F16).unwrap();
    assert_eq!(
        (small.outcome.status().as_str(), small.log_line()),
        ("wrong", line)
    );
    // No longer measured, so it is no longer anyone's champion there.
    assert!(ix.pick("small", F16).is_none());
}

#[test]
fn two_outcomes_in_one_session_and_records_for_unplanned_cases_are_said_loudly() {
    let mut log = Log::new(false);
    log.plan("v0");
    let timed = log.timed("v0", "small", 10.0, 0.01);
    let failed = log.record(
        json!({"event": "check_failed", "variant": "v0", "shape": "small",
        "dtype": "f16", "check": null, "reason": "output of the timed launches differs"}),
    );
    log.timed("v0", "seed", 20.0, 0.01);
    let stray = log.timed("ghost", "seed", 5.0, 0.01);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let a = &ix.accounting;
    assert!(!a.holds());
    assert_eq!(a.problems.len(), 2, "{:?}", a.problems);
    assert!(
        a.problems[0].contains(&format!("timed (log line {timed})"))
            && a.problems[0].contains(&format!("wrong (log line {failed})"))
    );
    assert!(
        a.problems[1].contains("`ghost`") && a.problems[1].contains(&format!("log line {stray}"))
    );
    let md = flashtune::report::sections::markdown(&ix);
    assert_eq!(
        accounting_line(&md),
        "Cases: 2 planned ≠ 2 measured + 1 failed + 0 implausible + 0 skipped."
    );
    assert!(md.contains("> **The cases do not add up.**"), "{md}");
    assert!(flashtune::report::sections::summary(&log).contains("do not add up"));
    let page = flashtune::report::sections::page(&ix);
    assert!(
        page.contains("<blockquote><p><strong>The cases do not add up.</strong>"),
        "{page}"
    );
    // `v0` was wrong on `small`, so it is no one's champion; `ghost` was never planned, so it
    // does not take the seat either: the shape has no champion at all.
    assert!(
        ix.pick("seed", F16).is_none(),
        "{:?}",
        ix.pick("seed", F16).map(|p| p.best.variant)
    );
}

#[test]
fn implausible_figures_are_listed_and_never_champions() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("cheat");
    log.record(
        json!({"event": "ceiling_measured", "name": "matmul", "dtype": "f16",
        "value": 800.0, "unit": "TFLOP/s"}),
    );
    log.record(
        json!({"event": "ceiling_measured", "name": "read", "dtype": null,
        "value": 4000.0, "unit": "GB/s"}),
    );
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    // `small` moves 4 × 128 × 64 × 2 B = 65,536 B: in 0.0065536 µs that is 10,000 GB/s, 2.5× the roof.
    let line = log.record(
        json!({"event": "implausible", "variant": "cheat", "shape": "small",
        "dtype": "f16", "kv_splits": 1, "timing": timing(0.0065536, 0.01),
        "reason": "least traffic 10000 GB/s is above the 4000 GB/s read roof"}),
    );
    log.timed("cheat", "seed", 19.9, 0.001);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let md = flashtune::report::sections::markdown(&ix);
    let section = md
        .split("\n## Implausible figures")
        .nth(1)
        .expect("an implausible section");
    let row = section
        .lines()
        .find(|l| l.starts_with("| `cheat`"))
        .expect("the cheat listed");
    assert!(
        row.contains("| 0.01 |")
            && row.contains("| 10000 | 2.50× |")
            && row.contains("above the 4000 GB/s read roof")
            && row.ends_with(&format!("| {line} |")),
        "{row}"
    );
    let best = flashtune::report::findings::best_per_shape(&ix);
    let small = best.rows.iter().find(|r| r.shape.name == "small").unwrap();
    assert_eq!(small.best.as_ref().unwrap().0, "v0");
    let champions = flashtune::report::champions::from_index(&ix);
    assert!(champions
        .iter()
        .all(|c| c.variant != "cheat" || c.shape != "small"));
    let csv = flashtune::report::export::csv(&ix);
    let cheat_small = csv
        .lines()
        .find(|l| l.starts_with("cheat,") && l.contains(",small,"))
        .unwrap();
    assert!(cheat_small.contains(",implausible,"), "{cheat_small}");
    assert!(!cheat_small.contains(",yes,") && !cheat_small.contains(",tied,"));
    // The summary points to the section.
    assert!(flashtune::report::sections::summary(&log).contains("1 implausible figure(s)"));
    // The T4 export makes no correctness claim for it.
    let t4 = flashtune::report::export::t4(&ix);
    let r = t4["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["configuration"]["VARIANT"] == "cheat" && r["configuration"]["shape"] == "small"
        })
        .unwrap();
    assert_eq!(
        (&r["invalidity"], &r["correctness"]),
        (&json!("correctness"), &json!(0))
    );
}

/// (best, the variant tied with it) per shape, ties aside: the pair as a set.
fn champions_ties_aside(log: &LoadedLog) -> Vec<(String, Vec<String>)> {
    let ix = RunIndex::new(log);
    flashtune::report::champions::from_index(&ix)
        .into_iter()
        .map(|c| {
            let mut names = vec![c.variant.clone()];
            names.extend(c.tied_with.map(|t| t.variant));
            names.sort();
            (c.shape, names)
        })
        .collect()
}

#[test]
fn a_runner_up_within_the_noise_is_a_tie_and_both_are_named() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("v1");
    // small: 1% apart, spreads 2% and 3%: tied. seed: 10% apart, spreads 2%: not tied.
    log.timed("v0", "small", 10.0, 0.02);
    log.timed("v1", "small", 10.1, 0.03);
    log.timed("v0", "seed", 20.0, 0.02);
    log.timed("v1", "seed", 22.0, 0.02);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let pick = ix.pick("small", F16).unwrap();
    let tie = pick.tie.expect("tied");
    assert!(
        (tie.gap - 0.01).abs() < 1e-9 && (tie.noise - 0.03).abs() < 1e-9,
        "{tie:?}"
    );
    assert!(ix.pick("seed", F16).unwrap().tie.is_none());
    let md = flashtune::report::sections::markdown(&ix);
    assert!(md.contains("`v0` **tied** with `v1`"), "{md}");
    assert!(
        md.contains("- small f16: `v0` 10.0 µs and `v1` 10.1 µs are 1.0% apart, within the 3.0% p10..p90 spread"),
        "{md}"
    );
    assert!(flashtune::report::sections::page(&ix)
        .contains("<strong>tied</strong> with <code>v1</code>"));
    let csv = flashtune::report::export::csv(&ix);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    assert_eq!(
        header[header.len() - 3..],
        ["champion", "tied_with", "fake"]
    );
    assert!(csv
        .lines()
        .any(|l| l.starts_with("v0,") && l.contains(",small,") && l.ends_with(",tied,v1,false")));
    assert!(csv
        .lines()
        .any(|l| l.starts_with("v1,") && l.contains(",small,") && l.ends_with(",tied,v0,false")));
    assert!(csv
        .lines()
        .any(|l| l.starts_with("v0,") && l.contains(",seed,") && l.ends_with(",yes,,false")));
    let champions = flashtune::report::champions::from_index(&ix);
    assert_eq!(champions[0].tied_with.as_ref().unwrap().variant, "v1");
    assert!(champions[1].tied_with.is_none());
    let j = flashtune::report::export::json(&ix);
    assert_eq!(j["champions"][0]["tied_with"]["variant"], "v1");
}

#[test]
fn an_interleaved_duel_decides_a_tie_over_the_spreads() {
    let duel = |log: &mut Log, gain: f64, noise: f64| {
        log.record(
            json!({"event": "search_duel", "round": 1, "shape": "small", "dtype": "f16",
            "champion": "v1", "challenger": "v0", "champion_us": 10.1, "challenger_us": 10.0,
            "verdict": {"accept": false, "gain": gain, "noise": noise, "threshold": 0.02,
                        "reason": "synthetic"}, "failure": null}),
        )
    };
    // Spreads of 3% would call 1% a tie; the duel measured them apart beyond its 0.5% noise.
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("v1");
    log.timed("v0", "small", 10.0, 0.03);
    log.timed("v1", "small", 10.1, 0.03);
    duel(&mut log, 0.015, 0.005);
    let ix_log = log.done();
    let ix = RunIndex::new(&ix_log);
    let pick = ix.pick("small", F16).unwrap();
    assert!(pick.tie.is_none());
    let close = ix.closeness(pick.best, pick.runner_up.unwrap()).unwrap();
    assert_eq!(close.duel_line, Some(ix_log.entries.len()));
    // Tight spreads would call 1% a win; the duel found it inside its 2% noise.
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("v1");
    log.timed("v0", "small", 10.0, 0.001);
    log.timed("v1", "small", 10.1, 0.001);
    let line = duel(&mut log, 0.01, 0.02);
    let ix_log = log.done();
    let ix = RunIndex::new(&ix_log);
    let tie = ix
        .pick("small", F16)
        .unwrap()
        .tie
        .expect("tied by the duel");
    assert_eq!(tie.duel_line, Some(line));
    assert!(flashtune::report::sections::markdown(&ix).contains(&format!("(log line {line})")));
}

#[test]
fn a_killed_and_resumed_run_names_the_same_champions_as_an_uninterrupted_one_ties_aside() {
    let plan = |log: &mut Log| {
        for v in ["v0", "v1", "v2"] {
            log.plan(v);
        }
    };
    let mut straight = Log::new(false);
    plan(&mut straight);
    straight.timed("v0", "small", 30.0, 0.01);
    straight.timed("v1", "small", 10.00, 0.02);
    straight.timed("v2", "small", 10.08, 0.02);
    straight.timed("v0", "seed", 60.0, 0.01);
    straight.timed("v1", "seed", 20.0, 0.01);
    straight.timed("v2", "seed", 25.0, 0.01);
    straight.finished();
    // Killed after v1's first shape; resumed, v1 re-run: the noise lands the other way round.
    let mut resumed = Log::new(false);
    plan(&mut resumed);
    resumed.timed("v0", "small", 30.1, 0.01);
    resumed.timed("v1", "small", 10.05, 0.02);
    resumed.resumed();
    resumed.plan("v1");
    resumed.plan("v2");
    resumed.timed("v1", "small", 10.09, 0.02);
    resumed.timed("v2", "small", 10.02, 0.02);
    resumed.timed("v0", "seed", 60.3, 0.01);
    resumed.timed("v1", "seed", 20.1, 0.01);
    resumed.timed("v2", "seed", 24.9, 0.01);
    resumed.finished();
    let (a, b) = (straight.done(), resumed.done());
    let (ia, ib) = (RunIndex::new(&a), RunIndex::new(&b));
    // The fastest differs on `small`...
    assert_eq!(ia.pick("small", F16).unwrap().best.variant, "v1");
    assert_eq!(ib.pick("small", F16).unwrap().best.variant, "v2");
    // ...but both runs name the same pair, tied, and the same sole champion on `seed`.
    assert_eq!(champions_ties_aside(&a), champions_ties_aside(&b));
    assert_eq!(
        champions_ties_aside(&b),
        vec![
            ("small".to_owned(), vec!["v1".to_owned(), "v2".to_owned()]),
            ("seed".to_owned(), vec!["v1".to_owned()])
        ]
    );
    // The resumed run's printed summary does not announce `v2` alone.
    let summary = flashtune::report::sections::summary(&b);
    assert!(summary.contains("v2 tied with v1"), "{summary}");
    assert!(ib.accounting.holds(), "{:?}", ib.accounting);
}

#[test]
fn the_committed_champion_is_kept_where_it_ties_with_the_run_s_fastest() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("v1");
    log.plan("v2");
    log.timed("v0", "small", 30.0, 0.01);
    log.timed("v1", "small", 10.00, 0.02);
    let v2_small = log.timed("v2", "small", 10.08, 0.02);
    log.timed("v0", "seed", 60.0, 0.01);
    log.timed("v1", "seed", 20.0, 0.01);
    log.timed("v2", "seed", 25.0, 0.01);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let mine = flashtune::report::champions::from_index(&ix);
    // HEAD's table names v2 on both shapes: it ties on `small` and is kept there; on `seed` it is
    // 25% slower, a real change of champion.
    let committed: Vec<_> = mine
        .iter()
        .map(|c| flashtune::report::champions::Champion {
            variant: "v2".into(),
            run: "an-earlier-run".into(),
            tied_with: None,
            ..c.clone()
        })
        .collect();
    let table = flashtune::report::champions::keep_committed_ties(&ix, &mine, &committed);
    assert_eq!(
        (table[0].variant.as_str(), table[0].kept, table[0].log_line),
        ("v2", true, v2_small)
    );
    assert!((table[0].median_us - 10.08).abs() < 1e-9);
    assert_eq!(table[0].tied_with.as_ref().unwrap().variant, "v1");
    assert_eq!((table[1].variant.as_str(), table[1].kept), ("v1", false));

    // And `commit` reads HEAD's table itself.
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    let path = "kernels/attention/tuned.toml";
    std::fs::create_dir_all(dir.path().join("kernels/attention")).unwrap();
    std::fs::write(
        dir.path().join(path),
        flashtune::report::champions::to_toml(&committed),
    )
    .unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(std::path::Path::new(path)).unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("test", "test@localhost").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "table", &tree, &[])
        .unwrap();
    let (branch, _) = flashtune::report::champions::commit(dir.path(), path, &log, &mine).unwrap();
    let commit = repo
        .revparse_single(&branch)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let message = commit.message().unwrap();
    assert!(
        message.contains("small f16: v2 10.08 µs")
            && message.contains("(tied with v1 at 10.00 µs, kept)"),
        "{message}"
    );
    let blob = commit
        .tree()
        .unwrap()
        .get_path(std::path::Path::new(path))
        .unwrap()
        .to_object(&repo)
        .unwrap()
        .peel_to_blob()
        .unwrap();
    let table: flashtune::report::champions::Table =
        toml::from_str(std::str::from_utf8(blob.content()).unwrap()).unwrap();
    assert_eq!(table.champion[0].variant, "v2");
    assert!(table.champion[0].kept);
    assert_eq!(table.champion[1].variant, "v1");
}

#[test]
fn fake_figures_are_labelled_in_every_export() {
    let mut log = Log::new(true);
    log.plan("v0");
    log.timed("v0", "small", 10.0, 0.01);
    log.finished();
    let ix_log = log.done();
    let ix = RunIndex::new(&ix_log);
    let csv = flashtune::report::export::csv(&ix);
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.ends_with(",true")), "{csv}");
    assert_eq!(flashtune::report::export::json(&ix)["fake"], true);
    let t4 = flashtune::report::export::t4(&ix);
    assert_eq!(t4["metadata"]["flashtune"]["fake"], true);
    assert_eq!(t4["metadata"]["environment"]["device_query"]["fake"], true);
    // No kernel ran: no correctness claim, even for the case the fake "timed".
    assert!(t4["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["correctness"] == 0));
    assert!(flashtune::report::sections::markdown(&ix).contains("**Fake GPU.**"));
    // The metadata block is T4 metadata.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            repo().join("tests/fixtures/schemas/t4-1.0.0/metadata-schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let doc = json!({"schema_version": "1.0.0", "metadata": t4["metadata"]});
    assert!(validator.is_valid(&doc));
    // A real run says so, and a timed case claims correctness.
    let mut real = Log::new(false);
    real.plan("v0");
    real.timed("v0", "small", 10.0, 0.01);
    let real = real.done();
    let ix = RunIndex::new(&real);
    assert!(flashtune::report::export::csv(&ix)
        .lines()
        .skip(1)
        .all(|r| r.ends_with(",false")));
    let t4 = flashtune::report::export::t4(&ix);
    assert_eq!(t4["metadata"]["flashtune"]["fake"], false);
    assert_eq!(t4["results"][0]["correctness"], 1);
}

#[test]
fn pytorch_figures_show_their_spread_and_a_noisy_one_is_marked() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    log.record(
        json!({"event": "baseline_timed", "backend": "flash", "shape": "small",
        "dtype": "f16", "timing": timing(5.0, 0.02)}),
    );
    log.record(
        json!({"event": "baseline_timed", "backend": "flash", "shape": "seed",
        "dtype": "f16", "timing": timing(40.0, 0.6), "remeasured": 2, "noisy": true}),
    );
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let md = flashtune::report::sections::markdown(&ix);
    assert!(md.contains("| PyTorch flash µs (spread) |"), "{md}");
    assert!(md.contains("| 5.0 (2.0%) | 2.00× |"), "{md}");
    assert!(
        md.contains("| 40.0 (60.0%, **noisy**) | 0.50× (noisy PyTorch figure) |"),
        "{md}"
    );
    assert!(md.contains("**noisy** (1): still above the `[baseline] max_spread` limit"));
    let b = &ix.baselines[1];
    let t = b.outcome.as_ref().unwrap();
    assert_eq!((t.remeasured, t.noisy), (2, true));
    // Written back, the record keeps both fields; a record without them reads as clean.
    let Record::BaselineTimed {
        remeasured, noisy, ..
    } = &log.entries[log.entries.len() - 3].1.record
    else {
        panic!("a baseline record");
    };
    assert_eq!((*remeasured, *noisy), (0, false));
    let again: Entry = serde_json::from_str(
        &serde_json::to_string(&log.entries[log.entries.len() - 2].1).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        again.record,
        Record::BaselineTimed {
            remeasured: 2,
            noisy: true,
            ..
        }
    ));
}

/// `hung` is the fastest on `small` but hung on `seed` twice and was quarantined; `crashed` is the
/// fastest on both, but its worker died on `seed` before a retry timed it there. `v0` never faulted.
/// Returns the log and the lines of the two first faults.
fn faults_on_seed(per_shape_dispatch: bool) -> (LoadedLog, usize, usize) {
    let mut log = Log::new(false);
    if per_shape_dispatch {
        let Record::Header(header) = &mut log.entries[0].1.record else {
            panic!("the first record is the header");
        };
        header.per_shape_dispatch = true;
    }
    for v in ["v0", "hung", "crashed"] {
        log.plan(v);
    }
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    log.timed("hung", "small", 5.0, 0.01);
    let hung = log.record(
        json!({"event": "timed_out", "variant": "hung", "stage": "worker", "seconds": 60,
        "cases_not_run": ["seed/f16"]}),
    );
    log.record(
        json!({"event": "timed_out", "variant": "hung", "stage": "worker", "seconds": 60,
        "cases_not_run": ["seed/f16"]}),
    );
    log.record(json!({"event": "quarantined", "variant": "hung",
        "reason": "failed twice: worker timed out: no case finished in 60 s",
        "cases_not_run": ["seed/f16"]}));
    log.record(
        json!({"event": "case_skipped", "variant": "hung", "shape": "seed", "dtype": "f16",
        "reason": "quarantined: failed twice: worker timed out: no case finished in 60 s"}),
    );
    log.timed("crashed", "small", 4.0, 0.01);
    let crashed = log.record(
        json!({"event": "worker_crashed", "variant": "crashed",
        "detail": "signal: 11 (SIGSEGV): an illegal memory access", "cases_not_run": ["seed/f16"]}),
    );
    // The retry times the case fine: the crash still stands.
    log.timed("crashed", "seed", 15.0, 0.01);
    log.finished();
    (log.done(), hung, crashed)
}

fn never_a_champion(md: &str) -> &str {
    md.split("\n## Never a champion")
        .nth(1)
        .expect("a Never a champion section")
        .split("\n## ")
        .next()
        .unwrap()
}

#[test]
fn a_variant_that_hung_or_crashed_on_one_shape_is_no_champion_on_any() {
    let (log, hung, crashed) = faults_on_seed(false);
    let ix = RunIndex::new(&log);
    assert!(ix.accounting.holds(), "{:?}", ix.accounting);
    for shape in ["small", "seed"] {
        assert_eq!(ix.pick(shape, F16).unwrap().best.variant, "v0", "{shape}");
    }
    let champions = flashtune::report::champions::from_index(&ix);
    assert!(champions.iter().all(|c| c.variant == "v0"), "{champions:?}");
    use flashtune::log::runindex::FaultKind;
    assert_eq!(
        ix.disqualified("hung").map(|f| f.kind),
        Some(FaultKind::TimedOut)
    );
    assert_eq!(
        ix.disqualified("crashed").map(|f| f.kind),
        Some(FaultKind::Crashed)
    );
    let md = flashtune::report::sections::markdown(&ix);
    assert!(!md.contains("Per-shape dispatch is on"), "{md}");
    let section = never_a_champion(&md);
    assert!(
        section.contains(&format!(
            "- `hung`: timed out on seed f16: no case finished in 60 s (log line {hung})"
        )),
        "{section}"
    );
    assert!(
        section.contains(&format!(
            "- `crashed`: crashed on seed f16: its worker died: signal: 11 (SIGSEGV): an illegal memory access (log line {crashed})"
        )),
        "{section}"
    );
    assert!(!section.contains("`v0`"), "{section}");
    // The champion over the run follows only figures that could decide it: not the barred ones.
    let (traces, _) = flashtune::report::findings::champion_traces(&ix);
    let small = traces.iter().find(|t| t.shape == "small").unwrap();
    let medians: Vec<f64> = small.points.iter().map(|p| p.1).collect();
    assert_eq!(medians, [10.0]);
}

#[test]
fn under_per_shape_dispatch_a_fault_bars_a_variant_from_its_own_shape_only() {
    let (log, hung, crashed) = faults_on_seed(true);
    let ix = RunIndex::new(&log);
    // `crashed` is the fastest on `small` and never faulted there; on `seed` its crash bars it.
    let small = ix.pick("small", F16).unwrap();
    assert_eq!(small.best.variant, "crashed");
    assert_eq!(small.runner_up.map(|r| r.variant), Some("hung"));
    assert_eq!(ix.pick("seed", F16).unwrap().best.variant, "v0");
    let md = flashtune::report::sections::markdown(&ix);
    let best = md
        .split("\n## Best per shape")
        .nth(1)
        .expect("a best-per-shape section");
    assert!(
        best.lines()
            .take(4)
            .any(|l| l.starts_with("> **Per-shape dispatch is on**")),
        "{best}"
    );
    let section = never_a_champion(&md);
    assert!(
        section.contains(&format!(
            "- `hung` on seed: timed out on seed f16: no case finished in 60 s (log line {hung})"
        )) && section.contains("- `crashed` on seed: crashed on seed f16:")
            && section.contains(&format!("(log line {crashed})")),
        "{section}"
    );
    assert!(!section.contains("on small"), "{section}");
    // The header keeps the setting through a write and a read of the log.
    let header = serde_json::to_string(&log.entries[0].1).unwrap();
    assert!(header.contains("\"per_shape_dispatch\":true"), "{header}");
}

/// A worker that never started is the machine's failure: the retry that measured the variant stands.
#[test]
fn a_worker_that_never_started_is_not_the_variants_fault() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("late");
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    log.record(json!({"event": "worker_crashed", "variant": "late",
        "detail": "not started: Resource temporarily unavailable (os error 11)",
        "cases_not_run": ["small/f16", "seed/f16"]}));
    log.timed("late", "small", 5.0, 0.01);
    log.timed("late", "seed", 15.0, 0.01);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    assert!(ix.disqualified("late").is_none());
    assert_eq!(ix.pick("seed", F16).unwrap().best.variant, "late");
}

/// Whether a worker started is the record's own field: a detail that merely begins with the old
/// words is a crash like any other, and a worker the field says never started is no fault whatever
/// its detail says.
#[test]
fn a_worker_not_started_is_read_from_its_field_not_its_words() {
    for (not_started, detail, fault) in [
        (
            true,
            "Resource temporarily unavailable (os error 11)",
            false,
        ),
        (false, "not started: words a crashing worker printed", true),
    ] {
        let mut log = Log::new(false);
        log.plan("v0");
        log.plan("late");
        log.timed("v0", "small", 10.0, 0.01);
        log.timed("v0", "seed", 20.0, 0.01);
        log.record(
            json!({"event": "worker_crashed", "variant": "late", "detail": detail,
            "cases_not_run": ["small/f16", "seed/f16"], "not_started": not_started}),
        );
        log.timed("late", "small", 5.0, 0.01);
        log.timed("late", "seed", 15.0, 0.01);
        log.finished();
        let log = log.done();
        let ix = RunIndex::new(&log);
        assert_eq!(ix.disqualified("late").is_some(), fault, "{detail}");
    }
}

/// A garbled reply fails the case it answered (`check_failed`); the `worker_crashed` after it names
/// the cases still to run, which the retry measures: under per-shape dispatch only the garbled
/// case's shape is barred.
#[test]
fn a_garbled_reply_bars_the_shape_it_answered_not_the_next() {
    let mut log = Log::new(false);
    let Record::Header(header) = &mut log.entries[0].1.record else {
        panic!("the first record is the header");
    };
    header.per_shape_dispatch = true;
    log.plan("v0");
    log.plan("garbler");
    log.timed("v0", "small", 10.0, 0.01);
    log.timed("v0", "seed", 20.0, 0.01);
    let garbled = "the worker sent a reply that is not protocol: `oops`";
    let line = log.record(
        json!({"event": "check_failed", "variant": "garbler", "shape": "seed", "dtype": "f16",
        "check": null, "reason": garbled}),
    );
    log.record(
        json!({"event": "worker_crashed", "variant": "garbler", "detail": garbled,
        "cases_not_run": ["small/f16"]}),
    );
    log.timed("garbler", "small", 5.0, 0.01);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    assert_eq!(ix.pick("small", F16).unwrap().best.variant, "garbler");
    assert_eq!(ix.pick("seed", F16).unwrap().best.variant, "v0");
    let fault = ix.disqualified("garbler").expect("a fault");
    assert_eq!(
        (fault.kind, fault.case, fault.line),
        (
            flashtune::log::runindex::FaultKind::Crashed,
            Some(("seed", F16)),
            line
        )
    );
    assert_eq!(ix.faults.len(), 1, "{:?}", ix.faults);
}

/// HEAD's table names `v1`, which ties with this run's fastest on `small` but crashed on `seed`:
/// a faulty kernel is not kept on a tie.
#[test]
fn a_committed_champion_that_faulted_in_this_run_is_not_kept_on_a_tie() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("v1");
    log.timed("v0", "small", 10.0, 0.02);
    log.timed("v1", "small", 10.05, 0.02);
    log.timed("v0", "seed", 20.0, 0.01);
    log.record(json!({"event": "worker_crashed", "variant": "v1",
        "detail": "signal: 6 (SIGABRT): misaligned address", "cases_not_run": ["seed/f16"]}));
    log.timed("v1", "seed", 25.0, 0.01);
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let mine = flashtune::report::champions::from_index(&ix);
    assert!(mine.iter().all(|c| c.variant == "v0"), "{mine:?}");
    let committed: Vec<_> = mine
        .iter()
        .map(|c| flashtune::report::champions::Champion {
            variant: "v1".into(),
            run: "an-earlier-run".into(),
            ..c.clone()
        })
        .collect();
    let table = flashtune::report::champions::keep_committed_ties(&ix, &mine, &committed);
    assert!(
        table.iter().all(|c| c.variant == "v0" && !c.kept),
        "{table:?}"
    );
}

/// Champions timed on two GPUs of a cluster meet again on one before either is named, however
/// steady the sentinel: the other GPU's leader is one the champion has not met. On one GPU (or
/// locally, where the log names none) the pick stands as timed.
#[test]
fn a_pick_timed_on_two_cluster_gpus_is_reduelled_and_one_on_one_gpu_is_not() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.plan("v1");
    let placed = |log: &mut Log, v: &str, shape: &str, us: f64, at: Option<&str>| {
        let mut r = json!({"event": "timed", "variant": v, "shape": shape, "dtype": "f16",
            "kv_splits": 1, "timing": timing(us, 0.01)});
        if let Some(at) = at {
            r["placed"] = json!(at);
        }
        log.record(r);
    };
    placed(&mut log, "v0", "small", 10.0, Some("gpu-a:gpu0"));
    placed(&mut log, "v1", "small", 10.3, Some("gpu-b:gpu3"));
    placed(&mut log, "v0", "seed", 20.0, Some("gpu-a:gpu0"));
    placed(&mut log, "v1", "seed", 20.6, Some("gpu-a:gpu0"));
    let log = log.done();
    let ix = RunIndex::new(&log);
    let unmet = |ix: &RunIndex, shape: &str| -> Vec<(String, Option<String>, Option<String>)> {
        let pick = ix.pick(shape, F16).expect("a pick");
        pick.unmet_leaders
            .iter()
            .map(|l| {
                (
                    l.variant.to_owned(),
                    ix.placed_of(pick.best),
                    ix.placed_of(l),
                )
            })
            .collect()
    };
    assert_eq!(
        unmet(&ix, "small"),
        [(
            "v1".to_owned(),
            Some("gpu-a:gpu0".to_owned()),
            Some("gpu-b:gpu3".to_owned())
        )]
    );
    assert!(unmet(&ix, "seed").is_empty());

    let mut local = Log::new(false);
    local.plan("v0");
    local.plan("v1");
    local.timed("v0", "small", 10.0, 0.01);
    local.timed("v1", "small", 10.3, 0.01);
    let local = local.done();
    let ix = RunIndex::new(&local);
    assert!(unmet(&ix, "small").is_empty());

    // Two GPUs of this host (issue 50): the same rule, the GPUs named by ordinal.
    let on = |log: &mut Log, v: &str, shape: &str, us: f64, device: u32| {
        log.record(
            json!({"event": "timed", "variant": v, "shape": shape, "dtype": "f16",
            "kv_splits": 1, "timing": timing(us, 0.01), "device": device}),
        );
    };
    let mut host = Log::new(false);
    host.plan("v0");
    host.plan("v1");
    on(&mut host, "v0", "small", 10.0, 0);
    on(&mut host, "v1", "small", 10.3, 1);
    on(&mut host, "v0", "seed", 20.0, 1);
    on(&mut host, "v1", "seed", 20.6, 1);
    let host = host.done();
    let ix = RunIndex::new(&host);
    assert_eq!(
        unmet(&ix, "small"),
        [(
            "v1".to_owned(),
            Some("GPU 0".to_owned()),
            Some("GPU 1".to_owned())
        )]
    );
    assert!(unmet(&ix, "seed").is_empty());
}

/// Issue 49, item 3: one champion rule. On this log the four rules the code once had each named
/// another champion of `small`: the report's pick (drift duels only) v2, the guided search's
/// (first measured, replaced by a gain beyond `min_gain`, conditions ignored) v3, the profile
/// stage's (fastest timed, faults and conditions ignored) v4, and the ablation's (best geometric
/// mean over the variants timed on every case) v1. Now every reader asks `RunIndex::pick`: v2 lost
/// its search duel to v1, v3 was measured under thermal throttling while clean cases exist, and
/// v4 computed wrong answers on `seed`; so v1 is the champion everywhere.
#[test]
fn one_champion_rule_on_a_log_where_the_four_old_rules_disagreed() {
    let mut log = Log::new(false);
    for v in ["v1", "v2", "v3", "v4"] {
        log.plan(v);
    }
    log.timed("v1", "small", 10.0, 0.01);
    log.timed("v1", "seed", 5.0, 0.01);
    log.timed("v2", "small", 9.8, 0.01);
    log.timed("v2", "seed", 12.0, 0.01);
    log.record(
        json!({"event": "search_duel", "round": 1, "shape": "small", "dtype": "f16",
        "champion": "v1", "challenger": "v2", "champion_us": 10.0, "challenger_us": 9.9,
        "verdict": {"accept": false, "gain": 0.01, "noise": 0.01, "threshold": 0.05,
                    "reason": "gain below min_gain"},
        "failure": null}),
    );
    log.record(
        json!({"event": "timed", "variant": "v3", "shape": "small", "dtype": "f16",
        "kv_splits": 1, "timing": timing(8.0, 0.01), "conditions": ["thermal"]}),
    );
    log.record(
        json!({"event": "timed", "variant": "v3", "shape": "seed", "dtype": "f16",
        "kv_splits": 1, "timing": timing(30.0, 0.01), "conditions": ["thermal"]}),
    );
    log.timed("v4", "small", 7.0, 0.01);
    log.record(
        json!({"event": "check_failed", "variant": "v4", "shape": "seed", "dtype": "f16",
        "check": null, "reason": "relative L2 error 3.1e-1 > 2.0e-2"}),
    );
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    for shape in ["small", "seed"] {
        assert_eq!(
            ix.pick(shape, F16).map(|p| p.best.variant),
            Some("v1"),
            "{shape}"
        );
    }
    assert!(ix.champions().values().all(|c| c.variant == "v1"));
    assert_eq!(ix.run_champion(), Some("v1"));
    let (ablated, _) = flashtune::run::ablate::choose_champion(&log, None).unwrap();
    assert_eq!(ablated, "v1");
    let table = flashtune::report::findings::best_per_shape(&ix);
    for row in &table.rows {
        assert_eq!(
            row.best.as_ref().map(|b| b.0.as_str()),
            Some("v1"),
            "{}",
            row.shape.name
        );
    }
    // The throttled figure is named as passed over, not silently dropped.
    let small = table.rows.iter().find(|r| r.shape.name == "small").unwrap();
    assert!(small.passed_over.iter().any(|p| p.0 == "v3"));
}

/// A failure's words come from the kernel's side (its compiler output, its own assert message), so
/// they must reach the page as words: the page is the document's HTML, never Markdown rendered
/// again, where `**…**`, backticks or a `|` in a reason would turn into markup or break a table.
/// Before the typed document, this reason became `<strong>trusted</strong>` and `<code>ok</code>`.
#[test]
fn a_reason_holding_markup_reaches_every_format_as_words() {
    let mut log = Log::new(false);
    log.plan("v0");
    log.timed("v0", "small", 10.0, 0.01);
    let reason = "**trusted** `ok` | <b>fine</b>";
    log.record(
        json!({"event": "check_failed", "variant": "v0", "shape": "seed",
        "dtype": "f16", "check": null, "reason": reason}),
    );
    log.finished();
    let log = log.done();
    let ix = RunIndex::new(&log);
    let page = flashtune::report::sections::page(&ix);
    assert!(
        page.contains("**trusted** `ok` | &lt;b&gt;fine&lt;/b&gt;"),
        "the reason is not shown as words on the page:\n{page}"
    );
    assert!(!page.contains("<strong>trusted</strong>") && !page.contains("<code>ok</code>"));
    let md = flashtune::report::sections::markdown(&ix);
    assert!(md.contains(reason), "{md}");
    let summary = flashtune::report::sections::summary(&log);
    assert!(
        summary.contains("1 failure(s): see the Failures section"),
        "{summary}"
    );
}

/// The three formats are emitters of one document: every section with a heading is in report.md
/// and on the page, the terminal shows what it shows by section, and no format is parsed back.
#[test]
fn the_three_formats_are_emitters_of_one_document() {
    use flashtune::report::document::SectionId;
    use flashtune::report::emit::{Emitter, Html, Markdown, Terminal};
    let log = runlog::read(&repo().join("tests/fixtures/runs/smoke-h200.log.jsonl")).unwrap();
    let ix = RunIndex::new(&log);
    let doc = flashtune::report::sections::document(&ix);
    let (md, page, terminal) = (Markdown.emit(&doc), Html.emit(&doc), Terminal.emit(&doc));
    assert_eq!(md, flashtune::report::sections::markdown(&ix));
    for s in &doc.sections {
        let Some(h) = &s.heading else { continue };
        let words = h.words();
        assert!(
            md.contains(&format!("\n## {words}\n")),
            "{words} not in report.md"
        );
        assert!(
            page.contains(&format!("<h2>{words}</h2>")),
            "{words} not on the page"
        );
    }
    let best = doc
        .section(SectionId::BestPerShape)
        .expect("a best-per-shape section");
    assert!(terminal.contains(&best.heading.as_ref().unwrap().words()));
    // The terminal aligns tables in columns: no Markdown pipes or marks reach it.
    assert!(
        !terminal.contains("| ") && !terminal.contains("**") && !terminal.contains('`'),
        "{terminal}"
    );
}

/// Issue 50: where each second went. Workers' spans come from their records; a stage's (roofs,
/// profiles, the reference library) from the record before its first to its last, on the run's
/// first GPU; each GPU's held time merges its spans. (A record's `t` here is its line number.)
#[test]
fn the_timeline_puts_each_stage_on_its_gpu_and_counts_what_each_gpu_held() {
    use flashtune::report::timeline::{busy_seconds, spans, Lane, SpanKind};
    let mut log = Log::new(false);
    log.record(
        json!({"event": "ceiling_measured", "name": "copy", "dtype": null,
        "value": 4000.0, "unit": "GB/s", "source": "worker"}),
    );
    log.record(
        json!({"event": "ceiling_measured", "name": "read", "dtype": null,
        "value": 4500.0, "unit": "GB/s", "source": "worker"}),
    );
    log.record(
        json!({"event": "worker_ran", "variant": "v0", "device": 0, "attempt": 1,
        "started_t": 3.0, "seconds": 2.0}),
    );
    log.record(
        json!({"event": "worker_ran", "variant": "v1", "device": 1, "attempt": 1,
        "started_t": 3.0, "seconds": 1.0}),
    );
    for _ in 0..2 {
        log.record(
            json!({"event": "profiled", "variant": "v0", "shape": "small",
            "dtype": "f16", "profile": {"outcome": "ncu_missing"}}),
        );
    }
    log.record(
        json!({"event": "baseline_timed", "backend": "cudnn", "shape": "small",
        "dtype": "f16", "timing": timing(10.0, 0.01)}),
    );
    let log = log.done();
    let ix = RunIndex::new(&log);
    let (all, wall) = spans(&ix);
    assert_eq!(wall, 8.0);
    let span = |kind: SpanKind, lane: Lane| {
        all.iter()
            .find(|s| s.kind == kind && s.lane == lane)
            .map(|s| (s.start, s.end))
    };
    assert_eq!(span(SpanKind::Roofs, Lane::Gpu(0)), Some((1.0, 3.0)));
    assert_eq!(span(SpanKind::Worker, Lane::Gpu(0)), Some((3.0, 5.0)));
    assert_eq!(span(SpanKind::Worker, Lane::Gpu(1)), Some((3.0, 4.0)));
    assert_eq!(span(SpanKind::Profiles, Lane::Gpu(0)), Some((5.0, 7.0)));
    assert_eq!(span(SpanKind::Reference, Lane::Gpu(0)), Some((7.0, 8.0)));
    assert_eq!(busy_seconds(&all), vec![(0, 7.0), (1, 1.0)]);
    let md = flashtune::report::sections::markdown(&ix);
    assert!(md.contains("GPU 0 7.0 s (88%), GPU 1 1.0 s (12%)"), "{md}");
    let page = flashtune::report::sections::page(&ix);
    assert!(
        page.contains("Timeline: what held each GPU"),
        "no timeline on the page"
    );

    // A log whose stages say when they ran is read as it says, not from the stretch between records.
    let mut log = Log::new(false);
    log.record(
        json!({"event": "ceiling_measured", "name": "copy", "dtype": null,
        "value": 4000.0, "unit": "GB/s", "source": "worker"}),
    );
    log.record(json!({"event": "stage_ran", "stage": "roofs", "device": 1,
        "started_t": 1.5, "seconds": 0.25}));
    let log = log.done();
    let (all, _) = spans(&RunIndex::new(&log));
    assert_eq!(
        all.iter()
            .map(|s| (s.kind, s.lane.clone(), s.start, s.end))
            .collect::<Vec<_>>(),
        vec![(SpanKind::Roofs, Lane::Gpu(1), 1.5, 1.75)]
    );
}
