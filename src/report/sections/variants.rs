//! The variants table of a report: one row per (variant, dtype), a cell per shape, with what went
//! wrong in each row's builds and checks, and the worker's incidents beside them.
use super::three_digits;
use crate::log::runindex::{BuildOutcome, CaseStatus, Outcome, RunIndex};
use crate::log::runlog::{Header, Record};
use crate::model::config::Dtype;
use crate::model::space::REFERENCE;
use crate::report::document::{Block, Section, SectionId, Table as DocTable, Text};
use std::collections::{BTreeMap, BTreeSet};

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
    Failed(CaseStatus),
}

#[derive(Default)]
struct Row {
    params: Text,
    cells: BTreeMap<String, Cell>,
    max_abs: f64,
    max_rel_l2: f64,
    /// Whether any case passed its check (otherwise the error columns have nothing to show).
    checked: bool,
    registers: u32,
    spills: u64,
    problems: Vec<Text>,
}

/// The rows of the variants table in their order, and what went wrong around them.
pub(super) struct Table {
    rows: BTreeMap<(String, Dtype), Row>,
    order: Vec<(String, Dtype)>,
    /// Reason → (count, first few examples): a big space rules out thousands of points for a handful of reasons.
    invalid: BTreeMap<String, (usize, Vec<Text>)>,
    /// The reference's build failures and the workers' incidents, in log order.
    worker_problems: Vec<(usize, Text)>,
}

impl Table {
    pub(super) fn of(ix: &RunIndex, header: &Header) -> Table {
        let mut rows: BTreeMap<(String, Dtype), Row> = BTreeMap::new();
        let mut order: Vec<(String, Dtype)> = Vec::new();
        let mut invalid: BTreeMap<String, (usize, Vec<Text>)> = BTreeMap::new();
        let mut worker_problems: Vec<(usize, Text)> = Vec::new();
        let mut row =
            |rows: &mut BTreeMap<(String, Dtype), Row>, v: &str, dt: Dtype| -> (String, Dtype) {
                let key = (v.to_owned(), dt);
                if !rows.contains_key(&key) {
                    order.push(key.clone());
                    rows.insert(key.clone(), Row::default());
                }
                key
            };
        let mut params_of: BTreeMap<String, Text> = BTreeMap::new();
        for p in &ix.planned {
            let described = p
                .params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            let described = match p.step {
                Some(step) => Text::new().strong(step).plain(format!(": {described}")),
                None => described.into(),
            };
            params_of.insert(p.variant.to_owned(), described);
            if let Some(why) = p.invalid {
                let entry = invalid.entry(why.to_owned()).or_default();
                entry.0 += 1;
                if entry.1.len() < 3 {
                    entry.1.push(
                        Text::new()
                            .code(p.variant)
                            .plain(format!(" d={} (log line {})", p.head_dim, p.line)),
                    );
                }
            }
        }
        // Rows are made in log order: builds and failed checks as they happened.
        enum Seen<'a> {
            Resources(&'a [crate::gpu::ptxas::EntryResources]),
            Problem(Text),
        }
        let mut seen: Vec<(usize, &str, Dtype, Seen)> = Vec::new();
        for b in &ix.builds {
            let line = b.line;
            match b.outcome {
                BuildOutcome::Built { .. } if b.variant == REFERENCE => {}
                BuildOutcome::Built { entries, .. } => {
                    seen.push((line, b.variant, b.dtype, Seen::Resources(entries)))
                }
                BuildOutcome::Failed { reason, .. } | BuildOutcome::Rejected { reason } => {
                    if b.variant == REFERENCE {
                        let text =
                            format!("reference kernel ({}): {reason} (log line {line})", b.dtype);
                        worker_problems.push((line, text.into()));
                        continue;
                    }
                    // The compiler's first error, in the kernel's own words: shown as words.
                    let said = match b.outcome {
                        BuildOutcome::Failed {
                            first_error: Some(error),
                            ..
                        } => format!(": {error}"),
                        _ => String::new(),
                    };
                    let text = format!("d={}: {reason}{said} (log line {line})", b.head_dim);
                    seen.push((line, b.variant, b.dtype, Seen::Problem(text.into())));
                }
            }
        }
        for f in &ix.check_failures {
            let text = format!("{}: {} (log line {})", f.shape, f.reason, f.line);
            seen.push((f.line, f.variant, f.dtype, Seen::Problem(text.into())));
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
            if let Some(text) = incident(line, record) {
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
                outcome => Cell::Failed(outcome.status()),
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

    /// The table, with the notes under it.
    pub(super) fn section(&self, ix: &RunIndex, header: &Header) -> Section {
        let (rows, order) = (&self.rows, &self.order);
        let mut t = DocTable::new()
            .text("variant")
            .text("parameters")
            .text("dtype");
        for s in &header.shapes {
            t = t.figure(format!("{} µs (TF/s)", s.label()));
        }
        t = t
            .figure("speedup vs baseline")
            .figure("max abs err")
            .figure("max rel L2")
            .figure("regs")
            .figure("spill B");
        t.unwrapped = Some(1);
        for key in order {
            let r = &rows[key];
            let baseline = rows.get(&(header.baseline.clone(), key.1));
            let mut cells: Vec<Text> = vec![
                Text::new().code(key.0.clone()),
                r.params.clone(),
                key.1.to_string().into(),
            ];
            for s in &header.shapes {
                cells.push(match r.cells.get(&s.name) {
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
                    )
                    .into(),
                    Some(Cell::Failed(status)) => Text::new().strong(failed_cell(*status)),
                    None => "—".into(),
                });
            }
            let speedup = baseline
                .and_then(|b| geomean_speedup(b, r, header.shapes.iter().map(|s| s.name.as_str())));
            cells.push(speedup.map_or("—".into(), |x| format!("{x:.2}×")).into());
            if r.checked {
                cells.push(format!("{:.2e}", r.max_abs).into());
                cells.push(format!("{:.2e}", r.max_rel_l2).into());
            } else {
                cells.push("—".into());
                cells.push("—".into());
            }
            cells.push(r.registers.to_string().into());
            cells.push(r.spills.to_string().into());
            t.row(cells);
        }
        let mut notes: Vec<Text> = vec![Text::new()
            .plain("µs: median per launch (forward + combine) over CUDA-graph replays. TF/s: 4·D FLOPs (the two matmuls) per (query, key) pair the mask admits, over every batch and head, ÷ that median; unmasked that is 4·B·H·Sq·Sk·D, causal it counts only the visible pairs (about half when Sq = Sk). Speedup vs baseline: the baseline variant ")
            .code(header.baseline.clone())
            .plain("'s median ÷ this row's, per shape in the same dtype, geometric mean over the shapes both rows measured.")];
        if ix.accounting.reused > 0 {
            notes.push(
                Text::new()
                    .plain("↺: taken from the results store (")
                    .code("--reuse")
                    .plain("), measured by an earlier run; see Reused from earlier runs."),
            );
        }
        let raced: Vec<_> = ix.cases.iter().filter_map(|c| c.raced()).collect();
        if let Some(first) = raced.first() {
            notes.push(
                Text::new()
                    .plain(format!(
                        "⏹: raced out ({} cases): stopped after {} of its samples because their p10 lay above the p90 of the best timing of its shape and dtype so far (",
                        raced.len(),
                        first.samples
                    ))
                    .code("[measure] race_samples")
                    .plain("), so it could neither win nor tie; its median stands on those samples, its outputs were verified as every case's are. Each case's figures and bar are in its ")
                    .code("timed")
                    .plain(" record."),
            );
        }
        let mut section = Section::new(SectionId::Variants, None);
        section.push(Block::Table(t));
        section.push(Block::Paragraph(notes));
        section
    }

    /// Every row's problems, then the workers', one list item each; the section counts them.
    pub(super) fn failures(&self) -> Section {
        let items: Vec<Text> = self
            .order
            .iter()
            .flat_map(|k| {
                self.rows[k].problems.iter().map(move |p| {
                    Text::new()
                        .code(k.0.clone())
                        .plain(format!(" {}: ", k.1))
                        .then(p.clone())
                })
            })
            .chain(self.worker_problems.iter().map(|p| p.1.clone()))
            .collect();
        let count = items.len();
        let mut s = Section::new(SectionId::Failures, Text::from("Failures"));
        s.push(Block::list(items));
        s.counting(count)
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
    pub(super) fn not_built(&self) -> Section {
        let total: usize = self.invalid.values().map(|v| v.0).sum();
        let mut s = Section::new(
            SectionId::NotBuilt,
            Text::from(format!(
                "Not built ({total} points ruled out before compiling)"
            )),
        );
        s.push(Block::list(self.invalid.iter().map(
            |(why, (count, examples))| {
                Text::from(format!("{count} × {why}; e.g. "))
                    .then(Text::join(examples.iter().cloned(), ", "))
            },
        )));
        s
    }
}

/// A failed case's cell: short, since a row holds a cell per shape.
fn failed_cell(status: CaseStatus) -> &'static str {
    match status {
        CaseStatus::BuildFailed => "build",
        status => status.words(),
    }
}

/// A worker's incident (a crash, a timeout, a quarantine, a lost step, an unhealthy GPU) as a line
/// of the Failures section. A budget reached is no failure: the Not measured section says it.
fn incident(line: usize, record: &Record) -> Option<Text> {
    Some(match record {
            Record::WorkerCrashed {
                variant,
                detail,
                cases_not_run,
                ..
            } => Text::new().code(variant.as_str()).plain(format!(
                ": worker crashed: {detail}; not run: {} (log line {line})",
                cases_not_run.join(", ")
            )),
            Record::TimedOut {
                variant,
                stage,
                seconds,
                cases_not_run,
            } => Text::new().code(variant.as_str()).plain(format!(
                ": {stage} timed out, {}; not run: {} (log line {line})",
                stage.limit(*seconds),
                cases_not_run.join(", ")
            )),
            Record::Quarantined { variant, reason, .. } => Text::new().code(variant.as_str()).plain(format!(" quarantined: {reason} (log line {line})")),
            Record::WorkerLost { variant, placed, loss, cases_not_run, .. } => Text::new().code(variant.as_str()).plain(format!(
                ": worker lost to the cluster{}: {} (not the variant's fault: its cases are run again); not run then: {} (log line {line})",
                placed.as_ref().map_or(String::new(), |n| format!(" on {n}")),
                loss.describe(),
                cases_not_run.join(", ")
            )),
            Record::GpuUnhealthy { device, reason } => format!("GPU {device} failed its health check and took no more work: {reason} (log line {line})").into(),
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
