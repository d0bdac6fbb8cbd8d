//! `flashtune ablate`: one factor at a time around a champion — each parameter set back to the baseline's value — and the factors ranked by what removing them costs.
use crate::log::runlog::LoadedLog;
use crate::model::plan::CHAMPION_STEP;
use crate::model::space::{Params, Space, Variant};

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

/// The variant to ablate around: `wanted`, or the run's champion by the read model's one rule
/// (`RunIndex::run_champion`: champion of the most (shape, dtype) cases; a variant with a runtime
/// fault is nobody's champion).
pub fn choose_champion(log: &LoadedLog, wanted: Option<&str>) -> Result<(String, Params), String> {
    let index = crate::log::runindex::RunIndex::new(log);
    if let Some(id) = wanted {
        return index
            .params_of(id)
            .map(|p| (id.to_owned(), p.clone()))
            .ok_or_else(|| format!("variant `{id}` was not planned in this run"));
    }
    index
        .run_champion()
        .and_then(|id| index.params_of(id).map(|p| (id.to_owned(), p.clone())))
        .ok_or_else(|| {
            "no variant of this run was measured without a runtime fault; name one with --variant"
                .into()
        })
}
