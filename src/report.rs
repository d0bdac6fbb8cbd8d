//! Turns a run log into the Markdown table people read: one row per (variant, dtype), every figure from a log record. The guided-search and ablation sections are rendered here too, from the records alone.
use crate::config::Dtype;
use crate::plan::{Proposal, Strategy, CHAMPION_STEP};
use crate::runindex::{BuildOutcome, Outcome, RunIndex};
use crate::runlog::{LoadedLog, Record};
use crate::space::REFERENCE;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

#[derive(Debug, Clone)]
enum Cell {
    Timed {
        median_us: f64,
        tflops: f64,
        /// Taken from the results store, not measured in this run.
        reused: bool,
        /// Stopped by racing after this many samples.
        raced: Option<u32>,
    },
    Failed(String),
}

#[derive(Default)]
struct Row {
    params: String,
    cells: BTreeMap<String, Cell>,
    max_abs: f64,
    max_rel_l2: f64,
    /// Whether any case passed its check (otherwise the error columns have nothing to show).
    checked: bool,
    registers: u32,
    spills: u64,
    problems: Vec<String>,
}

/// What `tune` prints when it ends: the run line, the best per shape (and an ablation's factor ranking), failures
/// in one line, and how the run ended. The whole report is in the run folder.
pub fn summary(log: &LoadedLog) -> String {
    let md = markdown(&RunIndex::new(log));
    let mut parts = md.split("\n## ");
    let preamble = parts.next().unwrap_or("");
    let mut out: String = preamble
        .lines()
        .take_while(|l| !l.starts_with('|'))
        .map(|l| format!("{l}\n"))
        .collect();
    for section in parts {
        let title = section.lines().next().unwrap_or("");
        let keep = [
            "Best per shape",
            "Factor ablation",
            "GPU state",
            "Drift sentinel",
            "Run statistics",
        ];
        if keep.iter().any(|k| title.starts_with(k)) {
            out.push_str("\n## ");
            out.push_str(section.trim_end());
            out.push('\n');
        } else if title.starts_with("Implausible") {
            let count = section.lines().filter(|l| l.starts_with("| `")).count();
            let _ = writeln!(
                out,
                "\n{count} implausible figure(s), beyond a measured roof: see the Implausible figures section of report.md."
            );
        } else if title.starts_with("Not measured") {
            let count = section
                .lines()
                .filter(|l| l.starts_with("| "))
                .count()
                .saturating_sub(1);
            let _ = writeln!(
                out,
                "\n{count} variant(s) not reached under the budget: see the Not measured section of report.md."
            );
        } else if title.starts_with("Failures") {
            let count = section.lines().filter(|l| l.starts_with("- ")).count();
            let _ = writeln!(
                out,
                "\n{count} failure(s): see the Failures section of report.md."
            );
        }
    }
    out
}

pub fn markdown(ix: &RunIndex) -> String {
    let mut md = String::new();
    let Some(header) = ix.header else {
        return "No header record: this is not a flashtune run log.\n".into();
    };
    let _ = writeln!(md, "# flashtune run {}\n", header.run_id);
    let d = &header.device;
    let _ = writeln!(
        md,
        "GPU: {} ({} SMs, {}, driver {}) · {} · space `{}` ({}) · baseline `{}` · git {}\n",
        d.name,
        d.sm_count,
        d.arch,
        d.driver_version,
        header.toolchain.version,
        header.space,
        header.strategy.label(),
        header.baseline,
        header.git_head.as_deref().unwrap_or("(no repository)")
    );
    if d.fake {
        md.push_str("> **Fake GPU.** These figures come from the test double, not from a GPU. Nothing here was measured.\n\n");
    }
    md.push_str(&accounting(ix));

    let mut rows: BTreeMap<(String, Dtype), Row> = BTreeMap::new();
    let mut order: Vec<(String, Dtype)> = Vec::new();
    // Reason → (count, first few examples): a big space rules out thousands of points for a handful of reasons.
    let mut invalid: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut worker_problems: Vec<(usize, String)> = Vec::new();
    let mut row =
        |rows: &mut BTreeMap<(String, Dtype), Row>, v: &str, dt: Dtype| -> (String, Dtype) {
            let key = (v.to_owned(), dt);
            if !rows.contains_key(&key) {
                order.push(key.clone());
                rows.insert(key.clone(), Row::default());
            }
            key
        };
    let mut params_of: BTreeMap<String, String> = BTreeMap::new();
    for p in &ix.planned {
        let described = p
            .params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let described = match p.step {
            Some(step) => format!("**{step}**: {described}"),
            None => described,
        };
        params_of.insert(p.variant.to_owned(), described);
        if let Some(why) = p.invalid {
            let entry = invalid.entry(why.to_owned()).or_default();
            entry.0 += 1;
            if entry.1.len() < 3 {
                entry.1.push(format!(
                    "`{}` d={} (log line {})",
                    p.variant, p.head_dim, p.line
                ));
            }
        }
    }
    // Rows are made in log order: builds and failed checks as they happened.
    enum Seen<'a> {
        Resources(&'a [crate::ptxas::EntryResources]),
        Problem(String),
    }
    let mut seen: Vec<(usize, &str, Dtype, Seen)> = Vec::new();
    for b in &ix.builds {
        let line = b.line;
        match b.outcome {
            BuildOutcome::Built { .. } if b.variant == REFERENCE => {}
            BuildOutcome::Built { entries, .. } => {
                seen.push((line, b.variant, b.dtype, Seen::Resources(entries)))
            }
            BuildOutcome::Failed { reason } | BuildOutcome::Rejected { reason } => {
                if b.variant == REFERENCE {
                    let text =
                        format!("reference kernel ({}): {reason} (log line {line})", b.dtype);
                    worker_problems.push((line, text));
                    continue;
                }
                let text = format!("d={}: {reason} (log line {line})", b.head_dim);
                seen.push((line, b.variant, b.dtype, Seen::Problem(text)));
            }
        }
    }
    for f in &ix.check_failures {
        let text = format!("{}: {} (log line {})", f.shape, f.reason, f.line);
        seen.push((f.line, f.variant, f.dtype, Seen::Problem(text)));
    }
    seen.sort_by_key(|s| s.0);
    for (_, variant, dtype, what) in seen {
        let k = row(&mut rows, variant, dtype);
        let r = rows.get_mut(&k).expect("row exists");
        match what {
            Seen::Resources(entries) => {
                for e in entries {
                    r.registers = r.registers.max(e.registers);
                    r.spills = r.spills.max(e.spill_bytes());
                }
            }
            Seen::Problem(text) => r.problems.push(text),
        }
    }
    for &(line, record) in &ix.incidents {
        let text = match record {
            Record::WorkerCrashed {
                variant,
                detail,
                cases_not_run,
            } => format!(
                "`{variant}`: worker crashed: {detail}; not run: {} (log line {line})",
                cases_not_run.join(", ")
            ),
            Record::TimedOut {
                variant,
                stage,
                seconds,
                cases_not_run,
            } => format!(
                "`{variant}`: {stage} timed out, {}; not run: {} (log line {line})",
                crate::runlog::timed_out_limit(stage, *seconds),
                cases_not_run.join(", ")
            ),
            Record::BudgetReached { reason, variants_not_measured } => {
                // A resume may have measured what the budget left: name only what is still missing.
                let ran: std::collections::BTreeSet<&str> = ix
                    .cases
                    .iter()
                    .filter(|c| matches!(c.outcome, Outcome::Measured { .. } | Outcome::Failed { .. } | Outcome::Implausible { .. }))
                    .map(|c| c.variant)
                    .collect();
                let missing: Vec<&str> = variants_not_measured.iter().map(String::as_str).filter(|v| !ran.contains(v)).collect();
                let later = variants_not_measured.len() - missing.len();
                let resumed = if later > 0 { format!("; {later} of the {} it left were measured after a resume", variants_not_measured.len()) } else { String::new() };
                if missing.is_empty() {
                    format!("budget reached ({reason}) (log line {line}){resumed}")
                } else {
                    format!("budget reached ({reason}): not measured: {} (log line {line}){resumed}", missing.join(", "))
                }
            }
            Record::Quarantined { variant, reason, .. } => format!("`{variant}` quarantined: {reason} (log line {line})"),
            Record::WorkerLost { variant, placed, loss, cases_not_run, .. } => format!(
                "`{variant}`: worker lost to the cluster{}: {} (not the variant's fault: its cases are run again); not run then: {} (log line {line})",
                placed.as_ref().map_or(String::new(), |n| format!(" on {n}")),
                loss.describe(),
                cases_not_run.join(", ")
            ),
            Record::GpuUnhealthy { device, reason } => format!("GPU {device} failed its health check and took no more work: {reason} (log line {line})"),
            _ => continue,
        };
        worker_problems.push((line, text));
    }
    worker_problems.sort_by_key(|p| p.0);
    let mut profiles: BTreeMap<(&str, &str, Dtype), String> = BTreeMap::new();
    for p in &ix.profiles {
        profiles.insert(
            (p.variant, p.shape, p.dtype),
            profile_summary(p.profile, p.line),
        );
    }
    // Each case's outcome is decided once, in the run index; the table only lays it out.
    for case in &ix.cases {
        let k = row(&mut rows, case.variant, case.dtype);
        let r = rows.get_mut(&k).expect("row exists");
        let cell = match &case.outcome {
            Outcome::Measured { timing, .. } => {
                r.checked = true;
                r.max_abs = r.max_abs.max(case.check.map_or(0.0, |c| c.max_abs));
                r.max_rel_l2 = r.max_rel_l2.max(case.check.map_or(0.0, |c| c.rel_l2));
                Cell::Timed {
                    median_us: timing.median_us,
                    tflops: timing.tflops,
                    reused: case.reused().is_some(),
                    raced: case.raced().map(|r| r.samples),
                }
            }
            Outcome::NotRun => continue,
            outcome => Cell::Failed(match outcome.status() {
                "build_failed" => "build".into(),
                "timed_out" => "timed out".into(),
                status => status.into(),
            }),
        };
        r.cells.insert(case.shape.name.clone(), cell);
    }
    for ((variant, _), r) in rows.iter_mut() {
        r.params = params_of.get(variant).cloned().unwrap_or_default();
    }
    // Rows follow the space's order (baseline family first as written), then the policy's dtype order.
    let planned_order: Vec<&str> = ix.planned.iter().map(|p| p.variant).collect();
    order.sort_by_key(|(v, d)| {
        (
            planned_order
                .iter()
                .position(|p| p == v)
                .unwrap_or(usize::MAX),
            header
                .dtypes
                .iter()
                .position(|x| x == d)
                .unwrap_or(usize::MAX),
        )
    });

    let _ = write!(md, "| variant | parameters | dtype |");
    for s in &header.shapes {
        let _ = write!(md, " {} µs (TF/s) |", s.label());
    }
    let _ = writeln!(
        md,
        " speedup vs baseline | max abs err | max rel L2 | regs | spill B |"
    );
    let _ = write!(md, "|---|---|---|");
    for _ in &header.shapes {
        md.push_str("---:|");
    }
    md.push_str("---:|---:|---:|---:|---:|\n");
    for key in &order {
        let r = &rows[key];
        let baseline = rows.get(&(header.baseline.clone(), key.1));
        let _ = write!(md, "| `{}` | {} | {} |", key.0, r.params, key.1);
        for s in &header.shapes {
            let text = match r.cells.get(&s.name) {
                Some(Cell::Timed {
                    median_us,
                    tflops,
                    reused,
                    raced,
                }) => format!(
                    "{median_us:.1} ({}){}{}",
                    three_digits(*tflops),
                    if *reused { " ↺" } else { "" },
                    if raced.is_some() { " ⏹" } else { "" }
                ),
                Some(Cell::Failed(what)) => format!("**{what}**"),
                None => "—".into(),
            };
            let _ = write!(md, " {text} |");
        }
        let speedup = baseline
            .and_then(|b| geomean_speedup(b, r, header.shapes.iter().map(|s| s.name.as_str())));
        let speedup = speedup.map_or("—".into(), |x| format!("{x:.2}×"));
        let (abs, rel) = if r.checked {
            (
                format!("{:.2e}", r.max_abs),
                format!("{:.2e}", r.max_rel_l2),
            )
        } else {
            ("—".into(), "—".into())
        };
        let _ = writeln!(
            md,
            " {speedup} | {abs} | {rel} | {} | {} |",
            r.registers, r.spills
        );
    }
    let _ = writeln!(
        md,
        "\nµs: median per launch (forward + combine) over CUDA-graph replays. TF/s: 4·D FLOPs (the two matmuls) per (query, key) pair the mask admits, over every batch and head, ÷ that median; unmasked that is 4·B·H·Sq·Sk·D, causal it counts only the visible pairs (about half when Sq = Sk). Speedup vs baseline: the baseline variant `{}`'s median ÷ this row's, per shape in the same dtype, geometric mean over the shapes both rows measured.",
        header.baseline
    );
    if ix.accounting.reused > 0 {
        md.push_str("↺: taken from the results store (`--reuse`), measured by an earlier run; see Reused from earlier runs.\n");
    }
    let raced: Vec<_> = ix.cases.iter().filter_map(|c| c.raced()).collect();
    if let Some(first) = raced.first() {
        let _ = writeln!(
            md,
            "⏹: raced out ({} cases): stopped after {} of its samples because their p10 lay above the p90 of the best timing of its shape and dtype so far (`[measure] race_samples`), so it could neither win nor tie; its median stands on those samples, its outputs were verified as every case's are. Each case's figures and bar are in its `timed` record.",
            raced.len(),
            first.samples
        );
    }
    md.push_str(&best_per_shape(
        &crate::findings::best_per_shape(ix),
        is_fake(ix),
    ));
    md.push_str(&reused(ix));
    md.push_str(&not_measured(ix));
    md.push_str(&implausible(ix));
    md.push_str(&gpu_state(ix));
    md.push_str(&drift(ix));
    if let Some(chain) = crate::findings::chain(ix) {
        md.push_str(&ablation_chain(&chain));
    }
    for section in [factors_section(ix.log), proposals_section(ix.log)]
        .into_iter()
        .flatten()
    {
        md.push('\n');
        md.push_str(&section);
    }
    if !profiles.is_empty() {
        md.push_str("\n## Profiles (Nsight Compute)\n\n| variant | shape | dtype | what limits it |\n|---|---|---|---|\n");
        for ((v, shape, dtype), summary) in &profiles {
            let _ = writeln!(md, "| `{v}` | {shape} | {dtype} | {summary} |");
        }
    }
    let problems: Vec<String> = order
        .iter()
        .flat_map(|k| {
            rows[k]
                .problems
                .iter()
                .map(move |p| format!("- `{}` {}: {p}", k.0, k.1))
        })
        .chain(worker_problems.iter().map(|p| format!("- {}", p.1)))
        .collect();
    if !problems.is_empty() {
        md.push_str("\n## Failures\n\n");
        md.push_str(&problems.join("\n"));
        md.push('\n');
    }
    let measured_variants: BTreeSet<&str> = order
        .iter()
        .map(|k| k.0.as_str())
        .filter(|v| {
            ix.cases
                .iter()
                .any(|c| c.variant == *v && c.measured().is_some())
        })
        .collect();
    md.push_str(&never_a_champion(ix, &measured_variants));
    if !invalid.is_empty() {
        let total: usize = invalid.values().map(|v| v.0).sum();
        let _ = writeln!(
            md,
            "\n## Not built ({total} points ruled out before compiling)\n"
        );
        for (why, (count, examples)) in &invalid {
            let _ = writeln!(md, "- {count} × {why}; e.g. {}", examples.join(", "));
        }
    }
    md.push_str(&run_statistics(ix));
    md.push('\n');
    if let Some((_, reason)) = ix.interrupted {
        let _ = writeln!(md, "Run interrupted: {reason}.");
    }
    match ix.finished {
        Some(f) => {
            let _ = writeln!(
                md,
                "Finished in {:.1} s: {} variants, {} cases {}, {} failed.",
                f.seconds,
                f.variants,
                f.measured_cases,
                if is_fake(ix) {
                    "given synthetic figures by the fake GPU (nothing measured)"
                } else {
                    "measured"
                },
                f.failed_cases
            );
        }
        None => {
            md.push_str("The run has no `finished` record: it was interrupted or is still going.\n")
        }
    }
    if ix.log.torn_tail {
        md.push_str("The log's last line was cut short (a crash while writing) and was ignored.\n");
    }
    md
}

/// The variants measured somewhere that a runtime fault keeps from being a champion, each with its
/// first fault (per shape, under per-shape dispatch).
fn never_a_champion(ix: &RunIndex, measured_variants: &BTreeSet<&str>) -> String {
    let shapes: &[crate::config::Shape] = ix.header.map_or(&[], |h| &h.shapes);
    let lines: Vec<String> = measured_variants
        .iter()
        .flat_map(|&v| {
            if !ix.per_shape_dispatch {
                let fault = ix.disqualified(v);
                return fault
                    .map(|f| format!("- `{v}`: {} (log line {})", f.describe(), f.line))
                    .into_iter()
                    .collect::<Vec<_>>();
            }
            shapes
                .iter()
                .filter_map(|s| {
                    let f = ix.disqualified_on(v, &s.name)?;
                    Some(format!(
                        "- `{v}` on {}: {} (log line {})",
                        s.name,
                        f.describe(),
                        f.line
                    ))
                })
                .collect()
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let scope = if ix.per_shape_dispatch {
        "Per-shape dispatch is on: a fault keeps a variant from the shape it happened on only (from every shape when the log ties it to no case)."
    } else {
        "A kernel that faults anywhere is not a candidate anywhere, even where a retry of the case later passed."
    };
    format!(
        "\n## Never a champion\n\nThese variants were measured on some cases but faulted on another: a wrong answer, a figure beyond a roof, a crash (a CUDA error or a dead worker), a hang, a write outside its outputs, or a quarantine. {scope}\n\n{}\n",
        lines.join("\n")
    )
}

fn geomean_speedup<'a>(
    baseline: &Row,
    row: &Row,
    shapes: impl Iterator<Item = &'a str>,
) -> Option<f64> {
    let ratios: Vec<f64> = shapes
        .filter_map(|s| match (baseline.cells.get(s), row.cells.get(s)) {
            (Some(Cell::Timed { median_us: b, .. }), Some(Cell::Timed { median_us: r, .. })) => {
                Some(b / r)
            }
            _ => None,
        })
        .collect();
    (!ratios.is_empty())
        .then(|| (ratios.iter().map(|x| x.ln()).sum::<f64>() / ratios.len() as f64).exp())
}

/// Three significant digits at most, so tiny decode figures do not print as 0.0.
pub fn three_digits(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// The adapter's name for FlashAttention-4's forward, timed beside PyTorch's backends where installed.
const FA4_BACKEND: &str = "fa4";

/// A reference-library column's title: PyTorch's SDPA backends by name, FA4 as itself.
fn backend_label(backend: &str) -> String {
    if backend == FA4_BACKEND {
        "FlashAttention-4".into()
    } else {
        format!("PyTorch {backend}")
    }
}

/// Per (shape, dtype): the champion beside the reference library (a time ratio) and the measured ceilings.
fn best_per_shape(found: &crate::findings::BestPerShape, fake: bool) -> String {
    let backends = &found.backends;
    let mut md = String::from("\n## Best per shape, beside PyTorch SDPA\n\n");
    if found.per_shape_dispatch {
        md.push_str("> **Per-shape dispatch is on** (`[gates] per_shape_dispatch` in this run's policies): a variant that faulted on one shape may still be the best on another. Dispatch each shape's best kernel for that shape only.\n\n");
    }
    let _ = write!(md, "| shape | dtype | best variant | µs | TF/s |");
    for b in backends {
        let _ = write!(md, " {} µs (spread) |", backend_label(b));
    }
    if backends.is_empty() {
        md.push_str(" PyTorch |");
    }
    let fastest = if backends.iter().any(|b| b == FA4_BACKEND) {
        "fastest backend"
    } else {
        "fastest PyTorch"
    };
    let _ = write!(md, " best ÷ {fastest} (time) | % of matmul ceiling | % of bandwidth ceiling |\n|---|---|---|---:|---:|");
    for _ in 0..backends.len().max(1) {
        md.push_str("---:|");
    }
    md.push_str("---:|---:|---:|\n");
    for row in &found.rows {
        let (name, us, tf) = match &row.best {
            Some((n, us, tf)) => (format!("`{n}`"), format!("{us:.1}"), three_digits(*tf)),
            None => ("none passed".into(), "—".into(), "—".into()),
        };
        let name = match &row.tie {
            Some(t) => format!("{name} **tied** with `{}`", t.variant),
            None => name,
        };
        let name = if row.under.is_empty() {
            name
        } else {
            format!(
                "{name} (measured under {}: no clean figure)",
                conditions_text(&row.under)
            )
        };
        let name = match &row.reused {
            Some((run, line)) => format!("{name} ↺ (run {run}, line {line})"),
            None => name,
        };
        let _ = write!(
            md,
            "| {} | {} | {name} | {us} | {tf} |",
            row.shape.label(),
            row.dtype
        );
        for cell in &row.torch {
            let cell = match cell {
                Some(Ok(t)) if t.noisy => {
                    format!("{:.1} ({:.1}%, **noisy**)", t.median_us, 100.0 * t.spread)
                }
                Some(Ok(t)) => format!("{:.1} ({:.1}%)", t.median_us, 100.0 * t.spread),
                Some(Err(e)) => {
                    format!("unsupported ({})", e.chars().take(60).collect::<String>())
                }
                None => "not measured".into(),
            };
            let _ = write!(md, " {cell} |");
        }
        if backends.is_empty() {
            md.push_str(" not measured |");
        }
        let ratio = match (&row.best, row.fastest_torch_us) {
            (Some((_, us, _)), Some(f)) if row.fastest_torch_noisy => {
                format!("{:.2}× (noisy PyTorch figure)", us / f)
            }
            (Some((_, us, _)), Some(f)) => format!("{:.2}×", us / f),
            _ => "—".into(),
        };
        let pct = |p: Option<f64>, roof_known: bool| match p {
            Some(p) => format!("{p:.1}%"),
            None if roof_known => "—".into(),
            None => "not measured".into(),
        };
        let c = &found.ceilings;
        let _ = writeln!(
            md,
            " {ratio} | {} | {} |",
            pct(row.pct_of_matmul, c.matmul_tflops.contains_key(&row.dtype)),
            pct(row.pct_of_copy, c.bandwidth().is_some())
        );
    }
    let ties: Vec<String> = found
        .rows
        .iter()
        .filter_map(|row| {
            let (t, (best, us, _)) = (row.tie.as_ref()?, row.best.as_ref()?);
            Some(format!(
                "- {} {}: `{best}` {us:.1} µs and `{}` {:.1} µs are {}: neither is faster beyond the noise.",
                row.shape.name,
                row.dtype,
                t.variant,
                t.median_us,
                t.closeness.describe()
            ))
        })
        .collect();
    let passed: Vec<String> = found
        .rows
        .iter()
        .flat_map(|row| {
            row.passed_over.iter().map(move |(variant, us, conditions, line)| {
                format!(
                    "- {} {}: `{variant}` {us:.1} µs was faster but measured under {} (log line {line}), still there when timed again: it does not decide the champion while a clean figure exists.",
                    row.shape.name,
                    row.dtype,
                    conditions_text(conditions)
                )
            })
        })
        .collect();
    if !passed.is_empty() {
        let _ = writeln!(
            md,
            "\nPassed over: figures measured on a throttled or shared GPU.\n\n{}",
            passed.join("\n")
        );
    }
    if !ties.is_empty() {
        let _ = writeln!(
            md,
            "\nTied: the runner-up is within the measured noise of the best (the larger p10..p90 spread of the two, or their interleaved duel's).\n\n{}",
            ties.join("\n")
        );
    }
    if found
        .rows
        .iter()
        .any(|r| r.torch.iter().flatten().any(|t| t.is_ok()))
    {
        md.push_str("\nPyTorch spread: (p90 − p10) ÷ median of its samples.");
        let noisy = found
            .rows
            .iter()
            .flat_map(|r| r.torch.iter().flatten().flatten())
            .filter(|t| t.noisy)
            .count();
        if noisy > 0 {
            let _ = write!(md, " **noisy** ({noisy}): still above the `[baseline] max_spread` limit after re-measuring; do not trust that figure or a ratio built on it.");
        }
        md.push('\n');
    }
    md.push_str(&ceilings_note(&found.ceilings, fake));
    if let Some(why) = &found.torch_missing {
        let _ = writeln!(md, "\nPyTorch not measured: {why}.");
    }
    md
}

/// "thermal throttling and another process on the GPU".
fn conditions_text(conditions: &[crate::protocol::Condition]) -> String {
    conditions
        .iter()
        .map(|c| c.describe())
        .collect::<Vec<_>>()
        .join(" and ")
}

/// What the GPU was doing while cases were timed: the ranges NVML read, the timings taken again
/// because the GPU was throttled or shared, the figures that stayed so; or that it could not be read.
fn gpu_state(ix: &RunIndex) -> String {
    let states = crate::findings::gpu_states(ix);
    if states.is_empty() && ix.disturbed.is_empty() && ix.state_unavailable.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## GPU state\n\n");
    for (line, device, why) in &ix.state_unavailable {
        let _ = writeln!(
            md,
            "GPU {device}: its state could not be read (log line {line}): {why}. Timings carry no clocks or temperature and none was timed again for them.\n"
        );
    }
    let range = |xs: Vec<f64>, unit: &str, digits: usize| -> Option<String> {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo.is_finite() && hi.is_finite()).then(|| format!("{lo:.digits$}–{hi:.digits$} {unit}"))
    };
    let figures: Vec<String> = [
        (
            "SM clock",
            range(
                states
                    .iter()
                    .filter_map(|s| s.sm_clock_mhz)
                    .map(f64::from)
                    .collect(),
                "MHz",
                0,
            ),
        ),
        (
            "memory clock",
            range(
                states
                    .iter()
                    .filter_map(|s| s.mem_clock_mhz)
                    .map(f64::from)
                    .collect(),
                "MHz",
                0,
            ),
        ),
        (
            "temperature",
            range(
                states
                    .iter()
                    .filter_map(|s| s.temperature_c)
                    .map(f64::from)
                    .collect(),
                "°C",
                0,
            ),
        ),
        (
            "power",
            range(states.iter().filter_map(|s| s.power_w).collect(), "W", 0),
        ),
    ]
    .into_iter()
    .filter_map(|(name, r)| Some(format!("{name} {}", r?)))
    .collect();
    if !figures.is_empty() {
        let _ = writeln!(
            md,
            "Read right after each case's timed replays and each sentinel ({} readings): {}.\n",
            states.len(),
            figures.join(", ")
        );
    }
    if !ix.disturbed.is_empty() {
        let _ = writeln!(
            md,
            "{} timing(s) taken on a throttled or shared GPU were taken again in the same worker:\n",
            ix.disturbed.len()
        );
        md.push_str("| variant | shape | dtype | first timing µs | under | again |\n|---|---|---|---:|---|---|\n");
        for d in &ix.disturbed {
            let again = match ix.case(d.variant, d.shape, d.dtype).map(|c| &c.outcome) {
                Some(Outcome::Measured {
                    timing,
                    conditions,
                    line,
                    ..
                }) if conditions.is_empty() => {
                    format!("{:.1} µs, clean (log line {line})", timing.median_us)
                }
                Some(Outcome::Measured {
                    timing,
                    conditions,
                    line,
                    ..
                }) => format!(
                    "{:.1} µs, **still under {}** (log line {line}): flagged",
                    timing.median_us,
                    conditions_text(conditions)
                ),
                Some(o) => o.status().replace('_', " "),
                None => "—".into(),
            };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {:.1} | {} (log line {}) | {again} |",
                d.variant,
                d.shape,
                d.dtype,
                d.timing.median_us,
                conditions_text(d.conditions),
                d.line
            );
        }
    }
    md
}

/// The drift sentinel over the run: each GPU's spread, whether it passed the policy's limit, and
/// the champions re-timed because their decision spanned the drift.
fn drift(ix: &RunIndex) -> String {
    let traces = crate::findings::sentinel_traces(ix);
    if traces.is_empty() && ix.drift_duels.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Drift sentinel\n\n");
    for tr in &traces {
        let spread: Vec<String> = tr
            .figures
            .iter()
            .map(|(name, first, points)| {
                let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
                let hi = points.iter().map(|p| p.1).fold(0.0, f64::max);
                format!(
                    "{name} {first:.1} µs at first, then {:.3}–{:.3}× of it over {} sentinels (spread {:.1}%)",
                    lo,
                    hi,
                    points.len(),
                    100.0 * (hi / lo - 1.0)
                )
            })
            .collect();
        let _ = writeln!(md, "GPU {}: {}.", tr.device, spread.join("; "));
        match (tr.first_beyond, tr.worst) {
            (Some((gap, t, line)), Some((worst, _, worst_line))) => {
                let _ = writeln!(
                    md,
                    "**Drifted beyond the limit**: {:.1}% from the first sentinel at {t:.0} s (log line {line}), at most {:.1}% (log line {worst_line}); the policy's limit is {:.1}% (`[sentinel] max_drift`). Figures timed on either side of it are not comparable as they stand.",
                    100.0 * gap,
                    100.0 * worst,
                    100.0 * tr.max_drift
                );
            }
            (None, Some((worst, _, line))) => {
                let _ = writeln!(
                    md,
                    "Within the limit: at most {:.1}% from the first sentinel (log line {line}); the policy's limit is {:.1}%.",
                    100.0 * worst,
                    100.0 * tr.max_drift
                );
            }
            _ => {}
        }
        for (line, why) in &tr.failed {
            let _ = writeln!(
                md,
                "A sentinel could not be timed (log line {line}): {why}."
            );
        }
        md.push('\n');
    }
    if !ix.drift_duels.is_empty() {
        let across = ix.drift_duels.iter().any(|d| d.placed.is_some());
        md.push_str(if across {
            "Champions whose case and runner-up's were timed on either side of a drift, or on different GPUs of a cluster, re-timed against each other interleaved on one GPU at the end of the run:\n\n"
        } else {
            "Champions whose case and runner-up's were timed on either side of a drift, re-timed against each other interleaved at the end of the run:\n\n"
        });
        md.push_str("| shape | dtype | champion by its figure | runner-up | sentinel apart | champion µs | runner-up µs | verdict | log line |\n|---|---|---|---|---:|---:|---:|---|---:|\n");
        for d in &ix.drift_duels {
            let us = |x: Option<f64>| x.map_or("—".into(), |v| format!("{v:.1}"));
            let verdict = match (d.verdict, d.failure) {
                (_, Some(why)) => format!("not judged: {}", why.replace('|', "/")),
                (Some(v), None) if v.accept => format!("`{}` is faster: {}", d.runner_up, v.reason),
                (Some(v), None) if v.gain < 0.0 && -v.gain > v.noise => {
                    format!("`{}` holds: {}", d.champion, v.reason)
                }
                (Some(v), None) => format!("tied: {}", v.reason),
                (None, None) => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | `{}` | `{}` | {:.1}%{} | {} | {} | {verdict} | {} |",
                d.shape,
                d.dtype,
                d.champion,
                d.runner_up,
                100.0 * d.drift,
                d.placed
                    .map_or(String::new(), |(a, b)| format!(" (timed on {a} / {b})")),
                us(d.champion_us),
                us(d.runner_up_us),
                d.line
            );
        }
    }
    md
}

/// planned = measured + failed + implausible + skipped (+ not run), and loudly when that does not hold.
fn accounting(ix: &RunIndex) -> String {
    let a = &ix.accounting;
    let not_run = if a.not_run > 0 || ix.unfinished() {
        format!(" + {} not run", a.not_run)
    } else {
        String::new()
    };
    let sum = a.measured + a.failed + a.implausible + a.skipped + a.not_run;
    let reused = if a.reused > 0 {
        format!(" ({} of them reused from earlier runs)", a.reused)
    } else {
        String::new()
    };
    let mut md = format!(
        "Cases: {} planned {} {} measured{reused} + {} failed + {} implausible + {} skipped{not_run}.\n\n",
        a.planned,
        if sum == a.planned { "=" } else { "≠" },
        a.measured,
        a.failed,
        a.implausible,
        a.skipped,
    );
    if !a.holds() {
        md.push_str("> **The cases do not add up.** Every planned case must end in exactly one outcome; this log breaks that:\n");
        const SHOWN: usize = 20;
        for p in a.problems.iter().take(SHOWN) {
            let _ = writeln!(md, "> - {p}");
        }
        if a.problems.len() > SHOWN {
            let _ = writeln!(md, "> - … and {} more", a.problems.len() - SHOWN);
        }
        md.push('\n');
    }
    md
}

/// What the results store supplied (`--reuse`), by the run that measured it, and what was measured
/// again to confirm it (`--confirm`), stored figure beside new.
pub fn reused(ix: &RunIndex) -> String {
    let mut from: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for c in &ix.cases {
        if let Some(r) = c.reused() {
            from.entry(r.run).or_default().push(r.line);
        }
    }
    if from.is_empty() && ix.confirmations.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Reused from earlier runs\n\n");
    if !from.is_empty() {
        md.push_str("Not measured again: the results store held a measurement of the same kernel build (sources, defines, flags, nvcc) checked against the same reference build, on the same GPU model and driver, shape and dtype. Each counts as measured; its `reused` record in this log names the run and log line of the measurement, as do the CSV's `reason` and the JSON's `reused_from`.\n\n");
        for (run, mut lines) in from {
            lines.sort_unstable();
            let _ = writeln!(
                md,
                "- {} case(s) from run {run}, its log lines {}",
                lines.len(),
                line_ranges(&lines)
            );
        }
    }
    if !ix.confirmations.is_empty() {
        md.push_str("\nMeasured again to confirm (`--confirm`): the fastest stored cases of each shape.\n\n| variant | shape | dtype | stored µs | from | now µs | change |\n|---|---|---|---:|---|---:|---:|\n");
        for c in &ix.confirmations {
            let now = ix
                .case(c.variant, c.shape, c.dtype)
                .and_then(|case| Some((case.measured()?, case.log_line())));
            let (now_s, change) = match now {
                Some((t, line)) => (
                    format!("{:.2} (line {line})", t.median_us),
                    format!("{:+.1}%", 100.0 * (t.median_us / c.stored_median_us - 1.0)),
                ),
                None => ("not measured".into(), "—".into()),
            };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {:.2} | run {} line {} | {now_s} | {change} |",
                c.variant, c.shape, c.dtype, c.stored_median_us, c.from_run, c.from_line
            );
        }
    }
    md
}

/// `3-5, 9, 12-13` for sorted line numbers; `33 to 91` when that would be a long list.
fn line_ranges(lines: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut j = i;
        while j + 1 < lines.len() && lines[j + 1] == lines[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            lines[i].to_string()
        } else {
            format!("{}-{}", lines[i], lines[j])
        });
        i = j + 1;
    }
    match (parts.len(), lines.first(), lines.last()) {
        (n, Some(first), Some(last)) if n > 4 => format!("{first} to {last}"),
        _ => parts.join(", "),
    }
}

/// Under a budget: the variants it left out, in the order they would have come, each with the
/// strategy's estimate of its promise (its rank and why) and what earlier runs measured of it.
fn not_measured(ix: &RunIndex) -> String {
    let mut left: Vec<&str> = Vec::new();
    let mut why: Option<&str> = None;
    for c in &ix.cases {
        if let Outcome::Skipped { reason, .. } = c.outcome {
            if let Some(budget) = reason.strip_prefix("not measured: ") {
                why.get_or_insert(budget);
                if !left.contains(&c.variant) {
                    left.push(c.variant);
                }
            }
        }
    }
    let Some(why) = why else {
        return String::new();
    };
    let order = ix.dispatch_order.map_or(&[][..], |(_, o)| o);
    let ranked = |v: &str| order.iter().find(|r| r.variant == v);
    left.sort_by_key(|v| ranked(v).map_or(usize::MAX, |r| r.rank));
    let measured = ix
        .dispatch_order
        .map(|(line, o)| {
            format!(
                " The run dispatched variants best first (log line {line}); {} of {} were reached.",
                o.len().saturating_sub(left.len()),
                o.len()
            )
        })
        .unwrap_or_default();
    let mut md = format!(
        "\n## Not measured ({why})\n\nThe budget ran out before these variants were reached.{measured} Rank and reason are the strategy's estimate of each one's promise; earlier figures are what the results store held for it on this GPU model (✓: the same kernel build this run would measure).\n\n| rank | variant | why it was there | earlier figures |\n|---:|---|---|---|\n"
    );
    for v in left {
        let (rank, reason, earlier) = match ranked(v) {
            Some(r) => {
                let earlier: Vec<String> = r
                    .earlier
                    .iter()
                    .map(|f| {
                        format!(
                            "{} {} {:.1} µs{} (run {} line {})",
                            f.shape,
                            f.dtype,
                            f.median_us,
                            if f.current { " ✓" } else { "" },
                            f.run,
                            f.line
                        )
                    })
                    .collect();
                (
                    r.rank.to_string(),
                    r.reason.replace('|', "/"),
                    if earlier.is_empty() {
                        "none".into()
                    } else {
                        earlier.join("; ")
                    },
                )
            }
            None => ("—".into(), "—".into(), "—".into()),
        };
        let _ = writeln!(md, "| {rank} | `{v}` | {reason} | {earlier} |");
    }
    md
}

/// Cases timed beyond a measured roof: their figures, the roofs, and by how much they passed them.
fn implausible(ix: &RunIndex) -> String {
    let cases: Vec<_> = ix
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Implausible { .. }))
        .collect();
    if cases.is_empty() {
        return String::new();
    }
    let c = &ix.ceilings;
    let mut md = String::from("\n## Implausible figures\n\nTimed beyond a roof the run measured, by more than `[gates] plausibility_margin`: above the dtype's dense matmul TFLOP/s, or moving the least traffic (Q, K, V read once, O written once) faster than the faster of copy and read-only bandwidth. A kernel that skips work or a timing that is wrong; never a champion, never committed. µs: the median; × ceiling: the figure ÷ the highest roof this log holds (the gate held it to the roofs measured before the case).\n\n");
    md.push_str("| variant | shape | dtype | µs | TF/s | × matmul ceiling | least-traffic GB/s | × bandwidth ceiling | why | log line |\n");
    md.push_str("|---|---|---|---:|---:|---:|---:|---:|---|---:|\n");
    for case in cases {
        let Outcome::Implausible {
            line,
            timing,
            reason,
            ..
        } = &case.outcome
        else {
            continue;
        };
        let gbs = crate::findings::min_bandwidth_gbs(case.shape, case.dtype, timing.median_us);
        let times = |x: f64, roof: Option<crate::runindex::Measured>| {
            roof.map_or("not measured".into(), |r| format!("{:.2}×", x / r.value))
        };
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {:.2} | {} | {} | {:.0} | {} | {} | {line} |",
            case.variant,
            case.shape.label(),
            case.dtype,
            timing.median_us,
            three_digits(timing.tflops),
            times(timing.tflops, c.matmul_tflops.get(&case.dtype).copied()),
            gbs,
            times(gbs, c.bandwidth()),
            reason.replace('|', "/"),
        );
    }
    md
}

/// Where the ceilings came from, or that there are none.
/// Whether the run's device is the test double: its figures are synthetic, and every line that
/// could be read as a measurement says so.
fn is_fake(ix: &RunIndex) -> bool {
    ix.log.header().is_some_and(|h| h.device.fake)
}

fn ceilings_note(c: &crate::findings::Ceilings, fake: bool) -> String {
    let missing: String = c
        .unavailable
        .iter()
        .map(|(line, why)| {
            format!("\nRoof not measured (log line {line}): {why}. Figures are not held to it.\n")
        })
        .collect();
    if c.is_empty() {
        return format!("\nCeilings not measured in this run (the worker measures them before the variants, the PyTorch adapter beside SDPA).\n{missing}");
    }
    let mut parts: Vec<String> = c
        .matmul_tflops
        .iter()
        .map(|(d, m)| {
            format!(
                "{d} matmul {} TFLOP/s (log line {})",
                three_digits(m.value),
                m.line
            )
        })
        .collect();
    if let Some(m) = c.copy_gbs {
        parts.push(format!(
            "copy {:.0} GB/s read + written (log line {})",
            m.value, m.line
        ));
    }
    if let Some(m) = c.read_gbs {
        parts.push(format!(
            "read-only stream {:.0} GB/s (log line {})",
            m.value, m.line
        ));
    }
    let title = if fake {
        "Synthetic ceilings (the test double's fixed roofs, not measured)"
    } else {
        "Measured ceilings"
    };
    format!("\n{title}: {}. % of matmul ceiling: the best's TF/s ÷ its dtype's dense matmul TFLOP/s. % of bandwidth ceiling: the least traffic (Q, K, V read once, O written once) per second at the best's median ÷ the faster measured stream. Where the worker and the PyTorch adapter both measured a roof, the higher figure is the ceiling.\n{missing}", parts.join(", "))
}

/// The ablation chain per shape: what each step changed and what it did, with ncu's figures where the step was profiled.
fn ablation_chain(blocks: &[(crate::config::Shape, Vec<crate::findings::ChainRow>)]) -> String {
    let mut md = String::from("\n## Ablation chain\n\nEach step changes one thing from the step before. µs: the median. × previous and × baseline (the space's baseline variant): the other's median ÷ this step's (higher is faster). max abs err: the step's last check. ncu figures: the longest profiled launch (SM and DRAM throughput, achieved occupancy and tensor pipe in % of peak).\n");
    let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("—".into(), f);
    for (shape, rows) in blocks {
        let _ = writeln!(md, "\n### {}\n", shape.label());
        md.push_str("| step | what changed | dtype | µs | TF/s | × previous | × baseline | max abs err | regs | spill B | SM % | DRAM % | occupancy % | tensor % | waves | limited by |\n");
        md.push_str(
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for r in rows {
            let us = match r.median_us {
                Some(us) => format!("{us:.1}"),
                None => format!("**{}**", r.status.replace('_', " ")),
            };
            let pct = |x: Option<f64>| opt(x, &|v| format!("{v:.0}"));
            let ncu = r.ncu.as_ref();
            let _ = writeln!(
                md,
                "| **{}** | {} | {} | {us} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.step,
                if r.changed.is_empty() { "—" } else { &r.changed },
                r.dtype,
                opt(r.tflops, &three_digits),
                opt(r.vs_previous, &|v| format!("{v:.2}×")),
                opt(r.vs_baseline, &|v| format!("{v:.2}×")),
                opt(r.max_abs, &|v| format!("{v:.2e}")),
                r.registers.map_or("—".into(), |v| v.to_string()),
                r.spill_bytes.map_or("—".into(), |v| v.to_string()),
                pct(ncu.and_then(|n| n.sm_pct)),
                pct(ncu.and_then(|n| n.dram_pct)),
                pct(ncu.and_then(|n| n.occupancy_pct)),
                pct(ncu.and_then(|n| n.tensor_pct)),
                opt(ncu.and_then(|n| n.waves), &|v| format!("{v:.2}")),
                ncu.map_or("—".into(), |n| {
                    let named = if n.bottlenecks.is_empty() { "no rule matched".to_owned() } else { n.bottlenecks.join(", ") };
                    format!("{named} (log line {})", n.line)
                }),
            );
        }
    }
    md
}

/// Where the wall time went: builds, GPU workers, and the gaps between workers (flashtune's own overhead).
fn run_statistics(ix: &RunIndex) -> String {
    let (mut compiled, mut cached, mut nvcc_seconds, mut last_build_t) =
        (0usize, 0usize, 0.0f64, 0.0f64);
    let mut workers: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    let wall = ix.wall_seconds;
    // Every timed replay the workers ran: kept figures, those taken again on a throttled or shared
    // GPU, and those beyond a roof.
    let replay_seconds: f64 = ix
        .timings
        .iter()
        .map(|t| t.timing)
        .chain(ix.disturbed.iter().map(|d| d.timing))
        .chain(ix.cases.iter().filter_map(|c| match &c.outcome {
            Outcome::Implausible { timing, .. } => Some(*timing),
            _ => None,
        }))
        .map(|t| t.samples_us.iter().sum::<f64>() * t.launches_per_sample as f64 / 1e6)
        .sum();
    for b in &ix.builds {
        match b.outcome {
            BuildOutcome::Built { cached: true, .. } => cached += 1,
            BuildOutcome::Built { seconds, .. } => {
                compiled += 1;
                nvcc_seconds += seconds;
                last_build_t = last_build_t.max(b.t);
            }
            BuildOutcome::Failed { .. } => last_build_t = last_build_t.max(b.t),
            BuildOutcome::Rejected { .. } => {}
        }
    }
    for w in &ix.workers {
        workers
            .entry(w.device)
            .or_default()
            .push((w.started_t, w.seconds));
    }
    if workers.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Run statistics\n\n");
    let _ = writeln!(md, "- wall time {wall:.1} s; builds: {compiled} compiled ({nvcc_seconds:.1} s of nvcc), {cached} from the cache; last build done at {last_build_t:.1} s ({:.0}% of the wall time)", 100.0 * last_build_t / wall.max(1e-9));
    for (device, runs) in &mut workers {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let busy: f64 = runs.iter().map(|r| r.1).sum();
        let first = runs[0].0;
        let end = runs.iter().map(|r| r.0 + r.1).fold(0.0, f64::max);
        let mut gaps: Vec<f64> = runs
            .windows(2)
            .map(|w| (w[1].0 - (w[0].0 + w[0].1)).max(0.0))
            .collect();
        gaps.sort_by(f64::total_cmp);
        let median_gap = if gaps.is_empty() {
            0.0
        } else {
            gaps[gaps.len() / 2]
        };
        let _ = writeln!(
            md,
            "- GPU {device}: {} worker runs held it {busy:.1} s, {:.0}% of the time from the first worker on; median gap between workers {:.0} ms",
            runs.len(),
            100.0 * busy / (end - first).max(1e-9),
            median_gap * 1000.0
        );
    }
    // A worker holds the GPU longer than its kernels run: process start, inputs, the reference, the checks.
    let held: f64 = workers.values().flatten().map(|r| r.1).sum();
    let _ = writeln!(md, "- timed graph replays: {replay_seconds:.1} s, {:.0}% of the workers' time (the rest is start-up, inputs, warm-up, the reference kernel and the checks)", 100.0 * replay_seconds / held.max(1e-9));
    // What the checks cost, from the timed records' own accounts (logs before they kept one say nothing).
    let mut costs = crate::protocol::CaseCosts::default();
    let mut costed = 0usize;
    for (_, e) in &ix.log.entries {
        if let Record::Timed { costs: Some(c), .. } = &e.record {
            costed += 1;
            costs.inputs_s += c.inputs_s;
            costs.check_s += c.check_s;
            costs.replays_s += c.replays_s;
            costs.verify_s += c.verify_s;
            costs.recheck_s += c.recheck_s;
            costs.timing_overhead_s += c.timing_overhead_s;
        }
    }
    if costed > 0 {
        let _ = writeln!(
            md,
            "- worker time of the {costed} timed cases by stage: inputs drawn {:.1} s, first check {:.1} s, replays (warm-up included) {:.1} s, verifying the timed outputs {:.1} s, re-checks on fresh and large inputs {:.1} s, other {:.1} s",
            costs.inputs_s,
            costs.check_s,
            costs.replays_s,
            costs.verify_s,
            costs.recheck_s,
            costs.timing_overhead_s
        );
    }
    // Each resource's busy share of the wall. ncu runs after the timing, never beside it: it
    // serialises the GPU's kernels and fixes its clocks, so a profile next to a timed replay on
    // the same GPU would change the figure being measured.
    let devices = workers.len().max(1) as f64;
    let cores = match ix.header.and_then(|h| h.build_jobs) {
        Some(jobs) => format!(
            "build cores {:.0}% ({nvcc_seconds:.1} s of nvcc on {jobs} jobs)",
            100.0 * nvcc_seconds / (jobs as f64 * wall).max(1e-9)
        ),
        None => format!("build cores: {nvcc_seconds:.1} s of nvcc (jobs not logged)"),
    };
    let _ = writeln!(
        md,
        "- busy share of the wall: GPU {:.0}% (worker runs), {cores}; ncu runs after the timing, not beside it, because it serialises the GPU and fixes its clocks",
        100.0 * held / (devices * wall).max(1e-9)
    );
    let raced: Vec<u32> = ix
        .cases
        .iter()
        .filter_map(|c| c.raced().map(|r| r.samples))
        .collect();
    if !raced.is_empty() {
        let timed = ix
            .cases
            .iter()
            .filter(|c| c.measured().is_some() && c.reused().is_none())
            .count();
        let _ = writeln!(md, "- racing: {} of {timed} timed cases stopped after {} samples, their p10 above the best timing's p90 at the time (marked ⏹)", raced.len(), raced.iter().max().copied().unwrap_or(0));
    }
    md
}

/// One line per profile: the bottlenecks, then the figures that show them.
pub fn profile_summary(p: &crate::profile::ProfileOutcome, line: usize) -> String {
    use crate::profile::ProfileOutcome as P;
    match p {
        P::Profiled {
            kernels,
            bottlenecks,
            ..
        } => {
            let figures: Vec<String> = kernels
                .iter()
                .map(|k| {
                    let f = |m: &str| k.get(m).map_or("?".into(), |v| format!("{v:.0}"));
                    let short = k.kernel.split('(').next().unwrap_or(&k.kernel);
                    format!(
                        "{short}: SM {}%, DRAM {}%, warps active {}%, tensor pipe {}%, waves {}, {} regs",
                        f("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                        f("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                        f("sm__warps_active.avg.pct_of_peak_sustained_active"),
                        f("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
                        k.get("launch__waves_per_multiprocessor").map_or("?".into(), |v| format!("{v:.2}")),
                        f("launch__registers_per_thread")
                    )
                })
                .collect();
            let named = if bottlenecks.is_empty() {
                "no rule matched".to_owned()
            } else {
                bottlenecks.join(", ")
            };
            format!("**{named}** — {} (log line {line})", figures.join("; "))
        }
        P::NoPermission { .. } => {
            format!("not profiled: no permission for GPU counters (log line {line})")
        }
        P::NoKernelsProfiled => {
            format!("not profiled: ncu saw no matching kernel (log line {line})")
        }
        P::TimedOut { seconds } => {
            format!("not profiled: ncu timed out after {seconds} s (log line {line})")
        }
        P::NcuMissing => "not profiled: ncu not found".into(),
        P::Failed { detail } => format!(
            "not profiled: {} (log line {line})",
            detail.lines().next().unwrap_or("")
        ),
    }
}

/// The report's guided-search section: every proposal, the rule behind it, and what it measured.
pub fn proposals_section(log: &LoadedLog) -> Option<String> {
    let proposals: Vec<(String, Proposal, Option<String>)> = log
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Planned {
                variant,
                proposed_by: Some(p),
                invalid,
                ..
            } => Some((variant.clone(), p.clone(), invalid.clone())),
            _ => None,
        })
        .collect();
    let rounds: Vec<&Record> = log
        .entries
        .iter()
        .map(|(_, e)| &e.record)
        .filter(|r| {
            matches!(
                r,
                Record::SearchRound { .. }
                    | Record::SearchStopped { .. }
                    | Record::SearchDuel { .. }
            )
        })
        .collect();
    if proposals.is_empty() && rounds.is_empty() {
        return None;
    }
    // Each case's last `timed` record: a re-timing replaces the first.
    let last_timed: BTreeMap<(String, String, Dtype), (f64, usize)> = log
        .timed()
        .map(|t| {
            (
                (t.variant.to_owned(), t.shape.to_owned(), t.dtype),
                (t.timing.median_us, t.line),
            )
        })
        .collect();
    let mut s = String::new();
    let _ = writeln!(s, "## Guided search\n");
    for r in &rounds {
        match r {
            Record::SearchRound {
                round,
                champions,
                proposed,
            } => {
                let from: BTreeSet<&str> = champions.iter().map(|c| c.variant.as_str()).collect();
                let _ = writeln!(
                    s,
                    "- round {round}: champions {} → {} proposal(s)",
                    from.iter()
                        .map(|v| format!("`{v}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    proposed.len()
                );
            }
            Record::SearchStopped { reason } => {
                let _ = writeln!(s, "- stopped: {reason}");
            }
            Record::SearchDuel {
                shape,
                dtype,
                champion,
                challenger,
                champion_us,
                challenger_us,
                verdict,
                failure,
                ..
            } => {
                let times = match (champion_us, challenger_us) {
                    (Some(a), Some(b)) => format!(" ({a:.1} → {b:.1} µs)"),
                    _ => String::new(),
                };
                let outcome = match (verdict, failure) {
                    (Some(v), _) if v.accept => format!("new champion: {}", v.reason),
                    (Some(v), _) => format!("kept `{champion}`: {}", v.reason),
                    (None, Some(why)) => format!("kept `{champion}`: {why}"),
                    (None, None) => format!("kept `{champion}`"),
                };
                let _ = writeln!(
                    s,
                    "  - interleaved re-timing on {shape} {dtype}: `{challenger}` vs `{champion}`{times} → {outcome}"
                );
            }
            _ => {}
        }
    }
    let _ = writeln!(s, "\nThe µs columns: the median of each variant's last timing on that case. × vs champion: the champion's median ÷ the proposal's (above 1: the proposal is faster).");
    let _ = writeln!(s, "\n| round | proposed variant | rule | bottleneck seen | from champion | on | its µs | champion's µs there | result |");
    let _ = writeln!(s, "|---:|---|---|---|---|---|---:|---:|---|");
    let mut seen = BTreeSet::new();
    for (variant, p, invalid) in &proposals {
        if !seen.insert((variant.clone(), p.round)) {
            continue; // one row per (variant, round), not per head dim
        }
        let on = format!("{} {}", p.shape, p.dtype);
        let mine = last_timed.get(&(variant.clone(), p.shape.clone(), p.dtype));
        let theirs = last_timed.get(&(p.from_variant.clone(), p.shape.clone(), p.dtype));
        let (mine_s, result) = match (mine, invalid) {
            (Some((us, line)), _) => (
                format!("{us:.1} (line {line})"),
                match theirs {
                    Some((t, _)) => format!("{:.2}× vs champion", t / us),
                    None => "measured".into(),
                },
            ),
            (None, Some(why)) if !why.is_empty() => ("—".into(), format!("not run: {why}")),
            (None, _) => ("—".into(), "not timed on this shape (see failures)".into()),
        };
        let theirs_s = theirs.map_or("—".into(), |(t, line)| format!("{t:.1} (line {line})"));
        let _ = writeln!(
            s,
            "| {} | `{variant}` | {} | {} | `{}` | {on} | {mine_s} | {theirs_s} | {result} |",
            p.round, p.rule, p.bottleneck, p.from_variant
        );
    }
    Some(s)
}

/// The report's factor table for an ablation run: each factor's cost, worst first.
pub fn factors_section(log: &LoadedLog) -> Option<String> {
    let header = log.header()?;
    let Strategy::Ablate { parent_run, .. } = &header.strategy else {
        return None;
    };
    let mut step_of: BTreeMap<String, String> = BTreeMap::new();
    let mut invalid: BTreeMap<String, String> = BTreeMap::new();
    for (_, e) in &log.entries {
        if let Record::Planned {
            variant,
            step: Some(step),
            invalid: why,
            ..
        } = &e.record
        {
            step_of.insert(variant.clone(), step.clone());
            if let Some(why) = why {
                invalid.insert(variant.clone(), why.clone());
            }
        }
    }
    let timed: BTreeMap<(String, String, Dtype), (f64, usize)> = log
        .timed()
        .map(|t| {
            (
                (t.variant.to_owned(), t.shape.to_owned(), t.dtype),
                (t.timing.median_us, t.line),
            )
        })
        .collect();
    let champion = step_of
        .iter()
        .find(|(_, s)| s.as_str() == CHAMPION_STEP)
        .map(|(v, _)| v.clone())?;
    let cases: Vec<(String, Dtype)> = header
        .shapes
        .iter()
        .flat_map(|s| header.dtypes.iter().map(move |d| (s.name.clone(), *d)))
        .collect();
    struct Factor {
        step: String,
        variant: String,
        losses: Vec<Option<f64>>,
        geomean: Option<f64>,
    }
    let mut factors: Vec<Factor> = step_of
        .iter()
        .filter(|(v, s)| **v != champion && s.as_str() != CHAMPION_STEP)
        .map(|(variant, step)| {
            let losses: Vec<Option<f64>> = cases
                .iter()
                .map(|(shape, dtype)| {
                    let mine = timed.get(&(variant.clone(), shape.clone(), *dtype))?;
                    let champ = timed.get(&(champion.clone(), shape.clone(), *dtype))?;
                    Some(mine.0 / champ.0)
                })
                .collect();
            let known: Vec<f64> = losses.iter().flatten().copied().collect();
            let geomean = (!known.is_empty())
                .then(|| (known.iter().map(|x| x.ln()).sum::<f64>() / known.len() as f64).exp());
            Factor {
                step: step.clone(),
                variant: variant.clone(),
                losses,
                geomean,
            }
        })
        .collect();
    factors.sort_by(|a, b| {
        b.geomean
            .unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&a.geomean.unwrap_or(f64::NEG_INFINITY))
    });
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Factor ablation around `{champion}` (from run {parent_run})\n"
    );
    let _ = writeln!(
        s,
        "Each row sets one parameter of the champion back to the baseline's value; the figure is its median ÷ the champion's, both measured in this run (above 1: the factor's removal costs time). Ranked by the geometric mean over the cases both timed: the factor whose removal costs most comes first.\n"
    );
    let _ = write!(s, "| rank | factor (champion → baseline) | variant |");
    for (shape, dtype) in &cases {
        let _ = write!(s, " {shape} {dtype} |");
    }
    let _ = writeln!(s, " geomean |");
    let _ = writeln!(s, "|---:|---|---|{}---:|", "---:|".repeat(cases.len()));
    let _ = write!(s, "| — | champion | `{champion}` |");
    for (shape, dtype) in &cases {
        match timed.get(&(champion.clone(), shape.clone(), *dtype)) {
            Some((us, line)) => {
                let _ = write!(s, " {us:.1} µs (line {line}) |");
            }
            None => {
                let _ = write!(s, " — |");
            }
        }
    }
    let _ = writeln!(s, " 1.00× |");
    for (rank, f) in factors.iter().enumerate() {
        let _ = write!(s, "| {} | {} | `{}` |", rank + 1, f.step, f.variant);
        for loss in &f.losses {
            let _ = match loss {
                Some(x) => write!(s, " {x:.2}× |"),
                None => write!(s, " — |"),
            };
        }
        let g = match (&f.geomean, invalid.get(&f.variant)) {
            (Some(g), _) => format!("**{g:.2}×**"),
            (None, Some(why)) => format!("not measurable alone: {why}"),
            (None, None) => "not timed (see failures)".into(),
        };
        let _ = writeln!(s, " {g} |");
    }
    Some(s)
}
