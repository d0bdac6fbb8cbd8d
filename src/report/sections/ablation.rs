//! The report's ablation sections: the chain per shape and the factor table.
use super::three_digits;
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::plan::{Strategy, CHAMPION_STEP};
use crate::report::document::{Block, Section, SectionId, Table, Text};
use std::collections::BTreeMap;

/// The ablation chain per shape: what each step changed and what it did, with ncu's figures where the step was profiled.
pub(super) fn ablation_chain(
    blocks: &[(
        crate::model::config::Shape,
        Vec<crate::report::findings::ChainRow>,
    )],
) -> Section {
    let mut s = Section::new(SectionId::AblationChain, Text::from("Ablation chain"));
    s.push(Block::line("Each step changes one thing from the step before. µs: the median. × previous and × baseline (the space's baseline variant): the other's median ÷ this step's (higher is faster). max abs err: the step's last check. ncu figures: the longest profiled launch (SM and DRAM throughput, achieved occupancy and tensor pipe in % of peak)."));
    let opt =
        |x: Option<f64>, f: &dyn Fn(f64) -> String| -> Text { x.map_or("—".into(), f).into() };
    for (shape, rows) in blocks {
        s.push(Block::Subheading(shape.label().into()));
        let mut t = Table::new().text("step").text("what changed").text("dtype");
        for figure in [
            "µs",
            "TF/s",
            "× previous",
            "× baseline",
            "max abs err",
            "regs",
            "spill B",
            "SM %",
            "DRAM %",
            "occupancy %",
            "tensor %",
            "waves",
        ] {
            t = t.figure(figure);
        }
        t = t.text("limited by");
        for r in rows {
            let us = match r.median_us {
                Some(us) => format!("{us:.1}").into(),
                None => Text::new().strong(r.status.words()),
            };
            let pct = |x: Option<f64>| opt(x, &|v| format!("{v:.0}"));
            let ncu = r.ncu.as_ref();
            t.row(vec![
                Text::new().strong(r.step.as_str()),
                if r.changed.is_empty() {
                    "—".into()
                } else {
                    r.changed.as_str().into()
                },
                r.dtype.to_string().into(),
                us,
                opt(r.tflops, &three_digits),
                opt(r.vs_previous, &|v| format!("{v:.2}×")),
                opt(r.vs_baseline, &|v| format!("{v:.2}×")),
                opt(r.max_abs, &|v| format!("{v:.2e}")),
                r.registers.map_or("—".into(), |v| v.to_string()).into(),
                r.spill_bytes.map_or("—".into(), |v| v.to_string()).into(),
                pct(ncu.and_then(|n| n.sm_pct)),
                pct(ncu.and_then(|n| n.dram_pct)),
                pct(ncu.and_then(|n| n.occupancy_pct)),
                pct(ncu.and_then(|n| n.tensor_pct)),
                opt(ncu.and_then(|n| n.waves), &|v| format!("{v:.2}")),
                ncu.map_or("—".into(), |n| {
                    let named = if n.bottlenecks.is_empty() {
                        "no rule matched".to_owned()
                    } else {
                        n.bottlenecks.join(", ")
                    };
                    format!("{named} (log line {})", n.line)
                })
                .into(),
            ]);
        }
        s.push(Block::Table(t));
    }
    s
}

/// The report's factor table for an ablation run: each factor's cost, worst first.
pub(super) fn factors_section(log: &LoadedLog) -> Option<Section> {
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
    let mut s = Section::new(
        SectionId::Factors,
        Text::new()
            .plain("Factor ablation around ")
            .code(champion.as_str())
            .plain(format!(" (from run {parent_run})")),
    );
    s.push(Block::line("Each row sets one parameter of the champion back to the baseline's value; the figure is its median ÷ the champion's, both measured in this run (above 1: the factor's removal costs time). Ranked by the geometric mean over the cases both timed: the factor whose removal costs most comes first."));
    let mut t = Table::new()
        .figure("rank")
        .text("factor (champion → baseline)")
        .text("variant");
    for (shape, dtype) in &cases {
        t = t.figure(format!("{shape} {dtype}"));
    }
    t = t.figure("geomean");
    let mut champion_row: Vec<Text> = vec![
        "—".into(),
        "champion".into(),
        Text::new().code(champion.as_str()),
    ];
    for (shape, dtype) in &cases {
        champion_row.push(
            match timed.get(&(champion.clone(), shape.clone(), *dtype)) {
                Some((us, line)) => format!("{us:.1} µs (line {line})").into(),
                None => "—".into(),
            },
        );
    }
    champion_row.push("1.00×".into());
    t.row(champion_row);
    for (rank, f) in factors.iter().enumerate() {
        let mut row: Vec<Text> = vec![
            (rank + 1).to_string().into(),
            f.step.as_str().into(),
            Text::new().code(f.variant.as_str()),
        ];
        for loss in &f.losses {
            row.push(match loss {
                Some(x) => format!("{x:.2}×").into(),
                None => "—".into(),
            });
        }
        row.push(match (&f.geomean, invalid.get(&f.variant)) {
            (Some(g), _) => Text::new().strong(format!("{g:.2}×")),
            (None, Some(why)) => format!("not measurable alone: {why}").into(),
            (None, None) => "not timed (see failures)".into(),
        });
        t.row(row);
    }
    s.push(Block::Table(t));
    Some(s)
}
