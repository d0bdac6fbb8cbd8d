//! `flashtune ablate`: one factor at a time around a champion — each parameter set back to the baseline's value — and the factors ranked by what removing them costs.
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::plan::CHAMPION_STEP;
use crate::model::space::{Params, Space, Variant};
use std::collections::BTreeMap;

/// The champion, then one variant per parameter where it differs from the baseline, with that parameter reset.
pub fn variants(space: &Space, champion: &Params) -> Vec<Variant> {
    let mut out = vec![Variant {
        id: crate::model::space::variant_id(champion),
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
            id: crate::model::space::variant_id(&without),
            params: without,
            step: Some(format!("{name}: {value} → {base}")),
        });
    }
    out
}

/// The variant to ablate around: `wanted`, or the one with the best geometric-mean time over every
/// (shape, dtype) the run timed (only variants timed on all of them, with no runtime fault on any
/// case, qualify: a retry that timed a case does not undo its crash).
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
    let index = crate::log::runindex::RunIndex::new(log);
    let geomean = |t: &BTreeMap<(String, Dtype), f64>| {
        (t.values().map(|v| v.ln()).sum::<f64>() / t.len() as f64).exp()
    };
    times
        .iter()
        .filter(|(id, t)| t.len() == cases.len() && index.disqualified(id).is_none())
        .min_by(|a, b| geomean(a.1).total_cmp(&geomean(b.1)))
        .and_then(|(id, _)| params.get(id).map(|p| (id.clone(), p.clone())))
        .ok_or_else(|| {
            "no variant of this run was timed on every shape and dtype without a fault on any case; name one with --variant"
                .into()
        })
}
