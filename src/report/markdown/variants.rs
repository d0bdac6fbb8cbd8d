//! The variants table of a report: one row per (variant, dtype), a cell per shape, with what went
//! wrong in each row's builds and checks, and the worker's incidents beside them.
use super::three_digits;
use crate::log::runindex::{BuildOutcome, Outcome, RunIndex};
use crate::log::runlog::{Header, Record};
use crate::model::config::Dtype;
use crate::model::space::REFERENCE;
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

/// The rows of the variants table in their order, and what went wrong around them.
pub(super) struct Table {
    rows: BTreeMap<(String, Dtype), Row>,
    order: Vec<(String, Dtype)>,
    /// Reason → (count, first few examples): a big space rules out thousands of points for a handful of reasons.
    invalid: BTreeMap<String, (usize, Vec<String>)>,
    /// The reference's build failures and the workers' incidents, in log order.
    worker_problems: Vec<(usize, String)>,
}

impl Table {
    pub(super) fn of(ix: &RunIndex, header: &Header) -> Table {
        let mut rows: BTreeMap<(String, Dtype), Row> = BTreeMap::new();
        let mut order: Vec<(String, Dtype)> = Vec::new();
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
            if let Some(text) = incident(ix, line, record) {
                worker_problems.push((line, text));
            }
        }
        worker_problems.sort_by_key(|p| p.0);
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

        Table {
            rows,
            order,
            invalid,
            worker_problems,
        }
    }

    /// The table in Markdown, with the notes under it.
    pub(super) fn section(&self, ix: &RunIndex, header: &Header) -> String {
        let (rows, order) = (&self.rows, &self.order);
        let mut md = String::new();
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
        for key in order {
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
        md
    }

    /// Every row's problems, then the workers', one list item each.
    pub(super) fn failures(&self) -> Vec<String> {
        self.order
            .iter()
            .flat_map(|k| {
                self.rows[k]
                    .problems
                    .iter()
                    .map(move |p| format!("- `{}` {}: {p}", k.0, k.1))
            })
            .chain(self.worker_problems.iter().map(|p| format!("- {}", p.1)))
            .collect()
    }

    /// The variants with a row that measured at least one case.
    pub(super) fn measured_variants<'t>(&'t self, ix: &RunIndex) -> BTreeSet<&'t str> {
        self.order
            .iter()
            .map(|k| k.0.as_str())
            .filter(|v| {
                ix.cases
                    .iter()
                    .any(|c| c.variant == *v && c.measured().is_some())
            })
            .collect()
    }

    /// The points ruled out before compiling, by reason.
    pub(super) fn not_built(&self) -> String {
        let mut md = String::new();
        if !self.invalid.is_empty() {
            let total: usize = self.invalid.values().map(|v| v.0).sum();
            let _ = writeln!(
                md,
                "\n## Not built ({total} points ruled out before compiling)\n"
            );
            for (why, (count, examples)) in &self.invalid {
                let _ = writeln!(md, "- {count} × {why}; e.g. {}", examples.join(", "));
            }
        }
        md
    }
}

/// A worker's incident (a crash, a timeout, a quarantine, a lost step, an unhealthy GPU, the budget) as a line of the Failures section.
fn incident(ix: &RunIndex, line: usize, record: &Record) -> Option<String> {
    Some(match record {
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
            _ => return None,
        })
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
