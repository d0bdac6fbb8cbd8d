//! Turns a run log into the Markdown table people read: one row per (variant, dtype), every figure from a log record. The guided-search and ablation sections are rendered here too, from the records alone.
mod ablation;
mod accounting;
mod best_per_shape;
mod document;
mod drift;
mod gpu_state;
mod implausible;
mod never_a_champion;
mod not_measured;
mod profiles;
mod proposals;
mod reused;
mod run_statistics;

use crate::log::runindex::{BuildOutcome, Outcome, RunIndex};
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::space::REFERENCE;
use ablation::ablation_chain;
pub use ablation::factors_section;
use accounting::accounting;
use best_per_shape::best_per_shape;
pub use document::{Document, Section, SectionId};
use drift::drift;
use gpu_state::gpu_state;
use implausible::implausible;
use never_a_champion::never_a_champion;
use not_measured::not_measured;
pub use profiles::profile_summary;
pub use proposals::proposals_section;
pub use reused::reused;
use run_statistics::run_statistics;
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
    let doc = document(&RunIndex::new(log));
    let mut out = String::new();
    for s in &doc.sections {
        match s.id {
            SectionId::Header => out.push_str(&s.markdown),
            SectionId::BestPerShape
            | SectionId::Factors
            | SectionId::GpuState
            | SectionId::Drift => {
                let _ = writeln!(out, "{}", s.markdown.trim_end());
            }
            SectionId::RunStatistics => {
                let ending = doc.section(SectionId::Ending).map_or("", |e| &e.markdown);
                let _ = writeln!(out, "{}", format!("{}{ending}", s.markdown).trim_end());
            }
            SectionId::Implausible => {
                let _ = writeln!(
                    out,
                    "\n{} implausible figure(s), beyond a measured roof: see the Implausible figures section of report.md.",
                    s.items
                );
            }
            SectionId::NotMeasured => {
                let _ = writeln!(
                    out,
                    "\n{} variant(s) not reached under the budget: see the Not measured section of report.md.",
                    s.items
                );
            }
            SectionId::Failures => {
                let _ = writeln!(
                    out,
                    "\n{} failure(s): see the Failures section of report.md.",
                    s.items
                );
            }
            _ => {}
        }
    }
    out
}

/// `report.md`.
pub fn markdown(ix: &RunIndex) -> String {
    document(ix).markdown()
}

/// The report of a run, section by section.
pub fn document(ix: &RunIndex) -> Document {
    let mut doc = Document::default();
    let mut md = String::new();
    let Some(header) = ix.header else {
        doc.title = "flashtune report".into();
        doc.push(
            SectionId::Header,
            "No header record: this is not a flashtune run log.\n".into(),
            0,
        );
        return doc;
    };
    doc.title = format!("flashtune run {}", header.run_id);
    let _ = writeln!(md, "# {}\n", doc.title);
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
    doc.push(SectionId::Header, std::mem::take(&mut md), 0);

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
        Resources(&'a [crate::gpu::ptxas::EntryResources]),
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
                ..
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
                stage.limit(*seconds),
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
    doc.push(SectionId::Variants, std::mem::take(&mut md), 0);
    doc.push(
        SectionId::BestPerShape,
        best_per_shape(&crate::report::findings::best_per_shape(ix), is_fake(ix)),
        0,
    );
    doc.push(SectionId::Reused, reused(ix), 0);
    let (text, left) = not_measured(ix);
    doc.push(SectionId::NotMeasured, text, left);
    let (text, count) = implausible(ix);
    doc.push(SectionId::Implausible, text, count);
    doc.push(SectionId::GpuState, gpu_state(ix), 0);
    doc.push(SectionId::Drift, drift(ix), 0);
    if let Some(chain) = crate::report::findings::chain(ix) {
        doc.push(SectionId::AblationChain, ablation_chain(&chain), 0);
    }
    if let Some(section) = factors_section(ix.log) {
        doc.push(SectionId::Factors, format!("\n{section}"), 0);
    }
    if let Some(section) = proposals_section(ix.log) {
        doc.push(SectionId::Proposals, format!("\n{section}"), 0);
    }
    if !profiles.is_empty() {
        md.push_str("\n## Profiles (Nsight Compute)\n\n| variant | shape | dtype | what limits it |\n|---|---|---|---|\n");
        for ((v, shape, dtype), summary) in &profiles {
            let _ = writeln!(md, "| `{v}` | {shape} | {dtype} | {summary} |");
        }
        doc.push(SectionId::Profiles, std::mem::take(&mut md), 0);
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
        doc.push(
            SectionId::Failures,
            format!("\n## Failures\n\n{}\n", problems.join("\n")),
            problems.len(),
        );
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
    doc.push(
        SectionId::NeverAChampion,
        never_a_champion(ix, &measured_variants),
        0,
    );
    if !invalid.is_empty() {
        let total: usize = invalid.values().map(|v| v.0).sum();
        let _ = writeln!(
            md,
            "\n## Not built ({total} points ruled out before compiling)\n"
        );
        for (why, (count, examples)) in &invalid {
            let _ = writeln!(md, "- {count} × {why}; e.g. {}", examples.join(", "));
        }
        doc.push(SectionId::NotBuilt, std::mem::take(&mut md), 0);
    }
    doc.push(SectionId::RunStatistics, run_statistics(ix), 0);
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
    doc.push(SectionId::Ending, md, 0);
    doc
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

/// Whether the run's device is the test double: its figures are synthetic, and every line that
/// could be read as a measurement says so.
fn is_fake(ix: &RunIndex) -> bool {
    ix.log.header().is_some_and(|h| h.device.fake)
}
