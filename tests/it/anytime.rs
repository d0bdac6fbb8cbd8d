//! Anytime runs on the fake GPU: a budget measures the first variants of the best-first order, the results store reuses what still matches and retires exactly what a kernel edit touches, and `history` follows a shape's champion across runs.
use crate::common;
use common::*;
use flashtune::log::runlog::{RankReason, Ranked, Record};
use flashtune::model::config::Dtype;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The smoke space's four variants (scalar and WMMA, with and without a KV split) on the `small`
/// shape alone: a run of it on the CPU double takes seconds.
const TINY: &str = "variants/tiny.toml";

/// A scratch project with `TINY`, a scalar-only space on the same shape, and the two spaces the
/// invalidation test needs: one whose kernel is forward.cu, one whose kernel is cheats.cu. Both
/// include common.cuh; neither includes the other.
fn project() -> tempfile::TempDir {
    let dir = scratch_project();
    let smoke = std::fs::read_to_string(dir.path().join("variants/smoke.toml")).unwrap();
    let shapes = r#"shapes = ["small", "seed", "odd-causal", "decode", "ragged", "ragged-causal", "ragged-causal-br"]"#;
    assert!(smoke.contains(shapes), "smoke.toml's shapes moved");
    let tiny = smoke
        .replace(shapes, r#"shapes = ["small"]"#)
        .replace(r#"name = "smoke""#, r#"name = "tiny""#);
    std::fs::write(dir.path().join(TINY), &tiny).unwrap();
    let scalar = tiny
        .replace(r#"MMA = ["scalar", "wmma"]"#, r#"MMA = ["scalar"]"#)
        .replace("KV_SPLIT = [1, 4]", "KV_SPLIT = [1]")
        .replace(r#"name = "tiny""#, r#"name = "scalar""#);
    std::fs::write(dir.path().join("variants/scalar.toml"), scalar).unwrap();
    let cheats = std::fs::read_to_string(dir.path().join("variants/cheats.toml")).unwrap();
    // Whatever cheats the space lists, the honest form keeps only `none`.
    let cheat_line = cheats
        .lines()
        .find(|l| l.starts_with("CHEAT = ["))
        .expect("cheats.toml lists CHEAT values");
    let shapes_line = r#"shapes = ["small", "seed", "ragged", "ragged-causal", "odd-causal"]"#;
    assert!(cheats.contains(shapes_line), "cheats.toml's shapes moved");
    let honest = cheats
        .replace(shapes_line, r#"shapes = ["small"]"#)
        .replace(cheat_line, r#"CHEAT = ["none"]"#);
    std::fs::write(dir.path().join("variants/honest.toml"), honest).unwrap();
    dir
}

fn tune(root: &Path, args: &[&str]) -> PathBuf {
    let mut all = vec!["tune", "--fake-gpu"];
    all.extend_from_slice(args);
    let out = flashtune(root, &all);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    run_dir_from(&out)
}

use common::numbered_records as records;

fn run_id(run: &Path) -> String {
    run.file_name().unwrap().to_string_lossy().into_owned()
}

fn order(recs: &[(usize, Record)]) -> Vec<Ranked> {
    let orders: Vec<&Vec<Ranked>> = recs
        .iter()
        .filter_map(|(_, r)| match r {
            Record::DispatchOrder { order } => Some(order),
            _ => None,
        })
        .collect();
    assert_eq!(orders.len(), 1, "one dispatch order per budgeted run");
    orders[0].clone()
}

/// Variants with at least one `timed` record.
fn timed(recs: &[(usize, Record)]) -> BTreeSet<String> {
    recs.iter()
        .filter_map(|(_, r)| match r {
            Record::Timed { variant, .. } => Some(variant.clone()),
            _ => None,
        })
        .collect()
}

fn reused(recs: &[(usize, Record)]) -> Vec<(String, String, Dtype, String, usize)> {
    recs.iter()
        .filter_map(|(_, r)| match r {
            Record::Reused {
                variant,
                shape,
                dtype,
                from_run,
                from_line,
                ..
            } => Some((
                variant.clone(),
                shape.clone(),
                *dtype,
                from_run.clone(),
                *from_line,
            )),
            _ => None,
        })
        .collect()
}

fn report(run: &Path) -> String {
    std::fs::read_to_string(run.join("report.md")).unwrap()
}

/// The report's accounting line balances.
fn balanced(run: &Path) {
    let md = report(run);
    let line = md.lines().find(|l| l.starts_with("Cases: ")).unwrap();
    assert!(
        line.contains(" = ") && !md.contains("do not add up"),
        "{line}"
    );
}

/// A committed champion table naming `variant` (one of TINY's) for small f16.
fn commit_table(root: &Path, variant: &str) {
    let (mma, split) = match variant {
        "scalar-bm64-bn64-w4-ks1-s1" => ("scalar", 1),
        "scalar-bm64-bn64-w4-ks4-s1" => ("scalar", 4),
        "wmma-bm64-bn64-w4-ks1-s1" => ("wmma", 1),
        "wmma-bm64-bn64-w4-ks4-s1" => ("wmma", 4),
        other => panic!("not a tiny variant: {other}"),
    };
    let table = format!(
        r#"[[champion]]
shape = "small"
dtype = "f16"
variant = "{variant}"
median_us = 4.0
tflops = 1.0
run = "an-earlier-run"
log_line = 1

[champion.params]
MMA = "{mma}"
BLOCK_M = 64
BLOCK_N = 64
WARPS = 4
KV_SPLIT = {split}
STAGES = 1
"#
    );
    std::fs::write(root.join("kernels/attention/tuned.toml"), table).unwrap();
    commit_all(root, "champion table");
}

#[test]
fn a_budget_of_k_variants_measures_the_first_k_of_the_order_committed_champion_first() {
    let dir = project();
    // Without evidence the order would put this variant last: the table alone moves it first.
    commit_table(dir.path(), "wmma-bm64-bn64-w4-ks1-s1");
    for k in [1usize, 3] {
        let run = tune(
            dir.path(),
            &["--space", TINY, "--max-variants", &k.to_string()],
        );
        let recs = records(&run);
        let order = order(&recs);
        assert_eq!(order.len(), 4);
        assert_eq!(order[0].variant, "wmma-bm64-bn64-w4-ks1-s1");
        assert_eq!(order[0].why, RankReason::Committed);
        assert!(
            order[0].reason.contains("committed champion for small f16"),
            "{}",
            order[0].reason
        );
        let first_k: BTreeSet<String> = order[..k].iter().map(|r| r.variant.clone()).collect();
        assert_eq!(timed(&recs), first_k, "k = {k}");
        // The rest are skipped by the budget, each case logged, and the report lists them by rank.
        let skipped: BTreeSet<String> = recs
            .iter()
            .filter_map(|(_, r)| match r {
                Record::CaseSkipped {
                    variant, reason, ..
                } if reason.starts_with("not measured: --max-variants") => Some(variant.clone()),
                _ => None,
            })
            .collect();
        let rest: BTreeSet<String> = order[k..].iter().map(|r| r.variant.clone()).collect();
        assert_eq!(skipped, rest, "k = {k}");
        balanced(&run);
        let md = report(&run);
        assert!(
            md.contains(&format!("## Not measured (--max-variants {k})")),
            "{md}"
        );
        for r in &order[k..] {
            assert!(
                md.contains(&format!("| {} | `{}` |", r.rank, r.variant)),
                "{md}"
            );
        }
    }
}

#[test]
fn earlier_runs_champions_come_right_after_the_committed_ones() {
    let dir = project();
    commit_all(dir.path(), "project");
    // A first run measures everything; on `small` the double makes WMMA without a split fastest.
    let first = tune(dir.path(), &["--space", TINY]);
    assert!(champions(&first)
        .values()
        .all(|v| v == "wmma-bm64-bn64-w4-ks1-s1"));
    // The committed table names a slower one: it still comes first, the stored champion second.
    commit_table(dir.path(), "scalar-bm64-bn64-w4-ks4-s1");
    let run = tune(dir.path(), &["--space", TINY, "--max-variants", "2"]);
    let recs = records(&run);
    let order = order(&recs);
    let head: Vec<(&str, RankReason)> = order[..2]
        .iter()
        .map(|r| (r.variant.as_str(), r.why))
        .collect();
    assert_eq!(
        head,
        [
            ("scalar-bm64-bn64-w4-ks4-s1", RankReason::Committed),
            ("wmma-bm64-bn64-w4-ks1-s1", RankReason::EarlierChampion),
        ]
    );
    assert!(
        order[1].reason.contains(&run_id(&first)),
        "{}",
        order[1].reason
    );
    assert_eq!(
        timed(&recs),
        BTreeSet::from([
            "scalar-bm64-bn64-w4-ks4-s1".to_owned(),
            "wmma-bm64-bn64-w4-ks1-s1".to_owned()
        ])
    );
    // What was left out carries the figures the store holds for it, marked as the same build.
    let left = order.iter().find(|r| r.rank == 3).unwrap();
    assert_eq!(left.earlier.len(), 2, "{left:?}");
    assert!(left
        .earlier
        .iter()
        .all(|f| f.current && f.run == run_id(&first)));
    let md = report(&run);
    assert!(md.contains(" µs ✓ (run "), "{md}");
}

#[test]
fn reuse_takes_stored_cases_marks_them_and_names_the_same_champions() {
    let dir = project();
    let first = tune(dir.path(), &["--space", TINY]);
    let first_recs = records(&first);
    let measured = first_recs
        .iter()
        .filter(|(_, r)| matches!(r, Record::Timed { .. }))
        .count();
    assert_eq!(measured, 8, "4 variants x small x 2 dtypes");

    let second = tune(dir.path(), &["--space", TINY, "--reuse"]);
    let recs = records(&second);
    assert!(timed(&recs).is_empty(), "nothing measured again");
    assert!(
        !recs
            .iter()
            .any(|(_, r)| matches!(r, Record::WorkerRan { .. })),
        "no worker started"
    );
    let took = reused(&recs);
    assert_eq!(took.len(), 8);
    // Each reuse cites the `timed` record it stands for.
    for (variant, shape, dtype, from_run, from_line) in &took {
        assert_eq!(from_run, &run_id(&first));
        let (_, cited) = first_recs.iter().find(|(l, _)| l == from_line).unwrap();
        assert!(
            matches!(cited, Record::Timed { variant: v, shape: s, dtype: d, .. } if v == variant && s == shape && d == dtype),
            "line {from_line} of {from_run} is {cited:?}"
        );
    }
    assert_eq!(champions(&second), champions(&first));
    balanced(&second);
    let md = report(&second);
    assert!(
        md.contains("8 measured (8 of them reused from earlier runs)"),
        "{md}"
    );
    assert!(md.contains("## Reused from earlier runs"), "{md}");
    assert!(
        md.contains(&format!("↺ (run {}, line ", run_id(&first))),
        "{md}"
    );
    let csv = std::fs::read_to_string(second.join("report.csv")).unwrap();
    assert_eq!(
        csv.matches(&format!("reused from run {} line ", run_id(&first)))
            .count(),
        8,
        "{csv}"
    );

    // --confirm 1: the fastest stored case of each (shape, dtype) is measured again, the rest reused.
    let third = tune(dir.path(), &["--space", TINY, "--reuse", "--confirm", "1"]);
    let recs = records(&third);
    assert_eq!(
        timed(&recs),
        BTreeSet::from(["wmma-bm64-bn64-w4-ks1-s1".to_owned()])
    );
    assert_eq!(reused(&recs).len(), 6);
    assert_eq!(
        recs.iter()
            .filter(|(_, r)| matches!(r, Record::Confirming { .. }))
            .count(),
        2
    );
    assert_eq!(champions(&third), champions(&first));
    balanced(&third);
    assert!(report(&third).contains("Measured again to confirm"));
}

#[test]
fn reuse_with_a_budget_measures_only_what_the_store_lacks() {
    let dir = project();
    // The store knows the scalar variants; the WMMA ones are new.
    tune(dir.path(), &["--space", "variants/scalar.toml"]);
    let run = tune(
        dir.path(),
        &["--space", TINY, "--reuse", "--max-variants", "1"],
    );
    let recs = records(&run);
    assert_eq!(reused(&recs).len(), 2, "scalar ks1 on small, both dtypes");
    let order = order(&recs);
    assert_eq!(
        order.len(),
        3,
        "a variant the store supplied whole is not dispatched"
    );
    assert_eq!(timed(&recs), BTreeSet::from([order[0].variant.clone()]));
    assert!(order
        .iter()
        .all(|r| r.variant != "scalar-bm64-bn64-w4-ks1-s1"));
    balanced(&run);
}

#[test]
fn a_kernel_edit_invalidates_exactly_the_entries_that_include_it() {
    let dir = project();
    let root = dir.path();
    commit_all(root, "project");
    let forward_space = ["--space", "variants/scalar.toml"];
    let cheats_space = ["--space", "variants/honest.toml"];
    tune(root, &forward_space);
    tune(root, &cheats_space);
    let with_reuse = |space: &[&str]| {
        let mut args = space.to_vec();
        args.push("--reuse");
        records(&tune(root, &args))
    };
    // Nothing changed: both are reused whole.
    assert_eq!(reused(&with_reuse(&forward_space)).len(), 2);
    assert_eq!(reused(&with_reuse(&cheats_space)).len(), 2);

    // An edit to cheats.cu retires the cheats kernel's entries and none of forward.cu's.
    let edit = |file: &str| {
        let path = root.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("\n// an edit that changes no code, only the source's content\n");
        std::fs::write(&path, text).unwrap();
        commit_all(root, &format!("edit {file}"));
    };
    edit("kernels/attention/faults/cheats.cu");
    let recs = with_reuse(&forward_space);
    assert_eq!(reused(&recs).len(), 2);
    assert!(timed(&recs).is_empty());
    let recs = with_reuse(&cheats_space);
    assert!(
        reused(&recs).is_empty(),
        "cheats.cu changed: measured again"
    );
    assert_eq!(timed(&recs).len(), 1);

    // And an edit to forward.cu the other way round (the cheats entries are now the new build's).
    edit("kernels/attention/forward.cu");
    let recs = with_reuse(&forward_space);
    assert!(
        reused(&recs).is_empty(),
        "forward.cu changed: measured again"
    );
    assert_eq!(timed(&recs).len(), 1);
    assert_eq!(reused(&with_reuse(&cheats_space)).len(), 2);
}

#[test]
fn history_follows_a_shapes_champion_across_runs_and_commits() {
    let dir = project();
    let root = dir.path();
    commit_all(root, "scalar only");
    let first = tune(root, &["--space", "variants/scalar.toml"]);
    commit_all(root, "the WMMA variants join");
    let second = tune(root, &["--space", TINY]);
    let out = flashtune(root, &["history", "small", "--dtype", "f16"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("| 20")).collect();
    assert_eq!(rows.len(), 2, "{t}");
    assert!(
        rows[0].contains(&run_id(&first))
            && rows[0].contains("`scalar-bm64-bn64-w4-ks1-s1`")
            && rows[0].contains("first"),
        "{t}"
    );
    assert!(
        rows[1].contains(&run_id(&second))
            && rows[1].contains("`wmma-bm64-bn64-w4-ks1-s1`")
            && rows[1].contains("was `scalar-bm64-bn64-w4-ks1-s1`"),
        "{t}"
    );
    // Each row names the commit its run started from.
    let heads: Vec<String> = [&first, &second]
        .iter()
        .map(|r| {
            let recs = records(r);
            let Some((_, Record::Header(h))) = recs.first() else {
                panic!("no header")
            };
            h.git_head.clone().unwrap()
        })
        .collect();
    assert_ne!(heads[0], heads[1]);
    for (row, head) in rows.iter().zip(&heads) {
        assert!(row.contains(&head[..10]), "{row} lacks {head}");
    }

    // A shape the store never saw is an error that says where it looked.
    let out = flashtune(root, &["history", "large-128"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("results.sqlite"), "{}", text(&out));
}

#[test]
fn report_puts_a_run_from_before_the_store_into_it() {
    let dir = project();
    let run = tune(dir.path(), &["--space", "variants/scalar.toml"]);
    let store = dir.path().join("runs/results.sqlite");
    std::fs::remove_file(&store).unwrap();
    for ext in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("runs/results.sqlite{ext}")));
    }
    let out = flashtune(dir.path(), &["report", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out = flashtune(dir.path(), &["history", "small"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&run_id(&run)), "{}", text(&out));
    let again = tune(dir.path(), &["--space", "variants/scalar.toml", "--reuse"]);
    assert_eq!(reused(&records(&again)).len(), 2);
}

#[test]
fn reuse_is_refused_where_the_strategy_decides_from_its_own_measurements() {
    let dir = project();
    let out = flashtune(
        dir.path(),
        &["tune", "--fake-gpu", "--strategy", "guided", "--reuse"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--reuse works with"), "{}", text(&out));
    let out = flashtune(dir.path(), &["tune", "--fake-gpu", "--confirm", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Issue 47, item 8: `--reuse` takes a stored figure only when its row's seal holds and the sealed
/// log line it cites gives the same figure. A row edited in the store (a figure divided by 7), and
/// a row whose cited line now says otherwise, are measured afresh, and why is said once.
#[test]
fn reuse_refuses_an_edited_row_and_a_row_its_log_line_contradicts() {
    let dir = project();
    let first = tune(dir.path(), &["--space", "variants/scalar.toml"]);
    let store = dir.path().join("runs/results.sqlite");
    let conn = rusqlite::Connection::open(&store).unwrap();
    let edited = conn
        .execute(
            "UPDATE measurements SET median_us = median_us / 7,
                 timing = json_set(timing, '$.median_us', json_extract(timing, '$.median_us') / 7)
             WHERE rowid = (SELECT MIN(rowid) FROM measurements)",
            [],
        )
        .unwrap();
    assert_eq!(edited, 1);
    drop(conn);

    let reuse = |root: &Path| {
        let out = flashtune(
            root,
            &[
                "tune",
                "--fake-gpu",
                "--space",
                "variants/scalar.toml",
                "--reuse",
            ],
        );
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        (run_dir_from(&out), t)
    };
    let (second, t) = reuse(dir.path());
    assert!(
        t.contains("whose seal does not hold are not used")
            && t.contains(&format!("the first of run {}", run_id(&first))),
        "{t}"
    );
    let recs = records(&second);
    assert_eq!(reused(&recs).len(), 1, "the untouched row only");
    assert_eq!(
        timed(&recs).len(),
        1,
        "the edited row's case is measured again"
    );

    // The reused case's row is sealed, but the line it cites now gives another figure (the log
    // sealed again with the key, as only flashtune could): the store is not the record, the log is.
    let (_, _, _, from_run, from_line) = reused(&recs).remove(0);
    let log = dir.path().join("runs").join(&from_run).join("log.jsonl");
    edit_line(&log, from_line, "\"median_us\":", "\"median_us\":1");
    seal_log(&log);
    let (third, t) = reuse(dir.path());
    assert!(
        t.contains("does not match the log record it cites")
            && t.contains(&format!(
                "run {from_run} line {from_line} gives a median of"
            )),
        "{t}"
    );
    let third = records(&third);
    assert_eq!(
        reused(&third).len(),
        1,
        "the case measured afresh last time"
    );
    assert_eq!(
        timed(&third).len(),
        1,
        "the contradicted case is measured again"
    );
}

/// Under a time limit, after its first spread picks the run takes variants one parameter from the
/// cases' leaders ahead of the order, and logs each such pick with the leaders it climbs from:
/// checked against the log's own `timed` figures before the pick.
#[test]
fn under_a_time_limit_the_run_climbs_from_each_cases_leader() {
    let dir = project();
    let tiny = std::fs::read_to_string(dir.path().join(TINY)).unwrap();
    // Eight variants on one shape, f16 alone: eight builds.
    let wide = tiny
        .replace("KV_SPLIT = [1, 4]", "KV_SPLIT = [1, 2, 3, 4]")
        .replace(r#"name = "tiny""#, r#"name = "wide""#);
    assert_ne!(tiny, wide, "tiny.toml's KV_SPLIT moved");
    std::fs::write(dir.path().join("variants/wide.toml"), wide).unwrap();
    let policies = std::fs::read_to_string(dir.path().join("policies.toml")).unwrap();
    let f16 = policies.replacen(r#"dtypes = ["f16", "bf16"]"#, r#"dtypes = ["f16"]"#, 1);
    assert_ne!(policies, f16, "policies.toml's dtypes moved");
    std::fs::write(dir.path().join("policies.toml"), f16).unwrap();

    let run = tune(
        dir.path(),
        &["--space", "variants/wide.toml", "--time-limit", "30m"],
    );
    let recs = records(&run);
    assert_eq!(order(&recs).len(), 8);
    let mut params = std::collections::BTreeMap::new();
    let mut timed_so_far: Vec<(String, String, f64)> = Vec::new();
    let mut climbs = 0;
    for (_, r) in &recs {
        match r {
            Record::Planned {
                variant, params: p, ..
            } => {
                params.insert(variant.clone(), p.clone());
            }
            Record::Timed {
                variant,
                shape,
                timing,
                ..
            } => timed_so_far.push((variant.clone(), shape.clone(), timing.median_us)),
            Record::Climbed { variant, near, .. } => {
                climbs += 1;
                assert!(!near.is_empty());
                for leader in near {
                    let best = timed_so_far
                        .iter()
                        .filter(|(_, s, _)| *s == leader.shape)
                        .map(|t| t.2)
                        .fold(f64::INFINITY, f64::min);
                    let its = timed_so_far
                        .iter()
                        .find(|(v, s, _)| *v == leader.variant && *s == leader.shape)
                        .map(|t| t.2);
                    assert_eq!(its, Some(best), "{leader:?} leads {} so far", leader.shape);
                    let differ = flashtune::model::space::differing(
                        &params[variant.as_str()],
                        &params[leader.variant.as_str()],
                    );
                    assert_eq!(differ, 1, "{variant} climbs from {leader:?}");
                }
                assert!(
                    !timed_so_far.iter().any(|(v, _, _)| v == variant),
                    "{variant} was climbed to after it was timed"
                );
            }
            _ => {}
        }
    }
    assert!(climbs > 0, "no variant was taken for its leaders");
    assert_eq!(timed(&recs).len(), 8, "every variant still measured");
}
