//! `flashtune ablate`: one factor at a time around a champion — each parameter set back to the baseline's value — and the factors ranked by what removing them costs.
use crate::config::Dtype;
use crate::runlog::{LoadedLog, Record};
use crate::search::Strategy;
use crate::space::{Params, Space, Variant};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The step name the champion itself carries in an ablation run.
pub const CHAMPION_STEP: &str = "champion";

/// The champion, then one variant per parameter where it differs from the baseline, with that parameter reset.
pub fn variants(space: &Space, champion: &Params) -> Vec<Variant> {
    let mut out = vec![Variant {
        id: crate::space::variant_id(champion),
        params: champion.clone(),
        step: Some(CHAMPION_STEP.into()),
    }];
    for (name, value) in champion {
        let Some(base) = space.baseline.get(name) else {
            continue;
        };
        if base == value {
            continue;
        }
        let mut without = champion.clone();
        without.insert(name.clone(), base.clone());
        out.push(Variant {
            id: crate::space::variant_id(&without),
            params: without,
            step: Some(format!("{name}: {value} → {base}")),
        });
    }
    out
}

/// The variant to ablate around: `wanted`, or the one with the best geometric-mean time over every
/// (shape, dtype) the run timed (only variants timed on all of them qualify).
pub fn choose_champion(log: &LoadedLog, wanted: Option<&str>) -> Result<(String, Params), String> {
    let mut params: BTreeMap<String, Params> = BTreeMap::new();
    for (_, e) in &log.entries {
        if let Record::Planned {
            variant, params: p, ..
        } = &e.record
        {
            params.insert(variant.clone(), p.clone());
        }
    }
    let mut times: BTreeMap<String, BTreeMap<(String, Dtype), f64>> = BTreeMap::new();
    for t in log.timed() {
        times
            .entry(t.variant.to_owned())
            .or_default()
            .insert((t.shape.to_owned(), t.dtype), t.timing.median_us);
    }
    if let Some(id) = wanted {
        return params
            .get(id)
            .map(|p| (id.to_owned(), p.clone()))
            .ok_or_else(|| format!("variant `{id}` was not planned in this run"));
    }
    let cases: std::collections::BTreeSet<&(String, Dtype)> =
        times.values().flat_map(|t| t.keys()).collect();
    let geomean = |t: &BTreeMap<(String, Dtype), f64>| {
        (t.values().map(|v| v.ln()).sum::<f64>() / t.len() as f64).exp()
    };
    times
        .iter()
        .filter(|(_, t)| t.len() == cases.len())
        .min_by(|a, b| geomean(a.1).total_cmp(&geomean(b.1)))
        .and_then(|(id, _)| params.get(id).map(|p| (id.clone(), p.clone())))
        .ok_or_else(|| {
            "no variant of this run was timed on every shape and dtype; name one with --variant"
                .into()
        })
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
        "Each row sets one parameter of the champion back to the baseline's value; the figure is its time ÷ the champion's, both measured in this run. Ranked by geometric mean: the factor whose removal costs most comes first.\n"
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
