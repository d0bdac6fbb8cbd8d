//! The report's ablation sections: the chain per shape and the factor table.
use super::three_digits;
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::plan::{Strategy, CHAMPION_STEP};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The ablation chain per shape: what each step changed and what it did, with ncu's figures where the step was profiled.
pub(super) fn ablation_chain(
    blocks: &[(
        crate::model::config::Shape,
        Vec<crate::report::findings::ChainRow>,
    )],
) -> String {
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
