//! What a space spans: its points (grid, chain or list) with their ids, its shapes, and a point's neighbours.
use super::{ParamValue, Params, Space, Variant};
use crate::error::{Error, Result};
use crate::model::config;
use indexmap::IndexMap;
use std::collections::BTreeSet;

impl Space {
    /// Every grid point, in file order (the last parameter varies fastest).
    pub fn variants(&self) -> Result<Vec<Variant>> {
        if let Some(chain) = &self.chain {
            return Ok(chain
                .iter()
                .map(|step| Variant {
                    id: variant_id(&step.params),
                    params: step.params.clone(),
                    step: Some(step.name.clone()),
                })
                .collect());
        }
        if let Some(points) = &self.points {
            return Ok(points
                .iter()
                .map(|params| Variant {
                    id: variant_id(params),
                    params: params.clone(),
                    step: None,
                })
                .collect());
        }
        // Only a grid is expanded as a product: a chain or a list is exactly its points, whatever
        // the product of the values they take.
        let within_bound = self
            .params
            .values()
            .try_fold(1usize, |n, values| n.checked_mul(values.len()))
            .is_some_and(|n| n <= MAX_GRID_POINTS);
        if !within_bound {
            return Err(config::config_error_at_key(
                &self.path,
                &self.text,
                "params",
                format!("the grid has more than {MAX_GRID_POINTS} points; list fewer values, or prune with a chain"),
            ));
        }
        let mut points: Vec<Params> = vec![Params::new()];
        for (name, values) in &self.params {
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut next = p.clone();
                        next.insert(name.clone(), v.clone());
                        next
                    })
                })
                .collect();
        }
        let variants: Vec<Variant> = points
            .into_iter()
            .map(|params| Variant {
                id: variant_id(&params),
                params,
                step: None,
            })
            .collect();
        let mut seen = BTreeSet::new();
        for v in &variants {
            if !seen.insert(v.id.clone()) {
                return Err(Error::BadInput(format!(
                    "{}: two points share the id `{}`; rename a parameter so their initials differ",
                    self.path.display(),
                    v.id
                )));
            }
        }
        Ok(variants)
    }

    /// The policy shapes this space selects, in policy order; an unknown name is a config error.
    pub fn select_shapes(
        &self,
        all: &[crate::model::config::Shape],
    ) -> Result<Vec<crate::model::config::Shape>> {
        let Some(names) = &self.shapes else {
            return Ok(all.to_vec());
        };
        for name in names {
            if !all.iter().any(|s| &s.name == name) {
                let known: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
                return Err(config::config_error_at_text(
                    &self.path,
                    &self.text,
                    &format!("\"{name}\""),
                    "shapes",
                    format!(
                        "no shape `{name}` in policies.toml (known: {})",
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(all
            .iter()
            .filter(|s| names.contains(&s.name))
            .cloned()
            .collect())
    }

    pub fn baseline_id(&self) -> String {
        variant_id(&self.baseline)
    }
}

/// Far more points than any run could build; a grid this large is a mistake in the file.
pub const MAX_GRID_POINTS: usize = 1_000_000;

/// How a search moves one parameter: along the space's list of values, or to a named value.
pub fn moved(values: &[ParamValue], current: &ParamValue, to: &ParamValue) -> Option<ParamValue> {
    let at = values.iter().position(|v| v == current)?;
    let next = match to {
        ParamValue::Name(s) if s == "up" => values.get(at + 1)?,
        ParamValue::Name(s) if s == "down" => values.get(at.checked_sub(1)?)?,
        value => values.iter().find(|v| *v == value)?,
    };
    (next != current).then(|| next.clone())
}

impl Space {
    /// `params` with every `change` applied; `None` when a change leaves the space or changes nothing.
    pub fn neighbour(
        &self,
        params: &Params,
        change: &IndexMap<String, ParamValue>,
    ) -> Option<Variant> {
        let mut next = params.clone();
        let mut changed = false;
        for (name, to) in change {
            let current = params.get(name)?;
            match moved(self.params.get(name)?, current, to) {
                Some(value) => {
                    next.insert(name.clone(), value);
                    changed = true;
                }
                // A rule that names a whole point (the Hopper path's tile) still applies to a
                // champion that already has some of its values.
                None if current == to => {}
                None => return None,
            }
        }
        changed.then(|| Variant {
            id: variant_id(&next),
            params: next,
            step: None,
        })
    }
}

/// How many parameters two points set differently (a parameter only one of them has counts): 1 for
/// a point's neighbours along one axis.
pub fn differing(a: &Params, b: &Params) -> usize {
    a.iter().filter(|(k, v)| b.get(*k) != Some(*v)).count()
        + b.keys().filter(|k| !a.contains_key(*k)).count()
}

/// A readable id: names as they are, numbers behind the parameter's initials (`BLOCK_M=64` → `bm64`).
/// A parameter at 0 is a switch left off (`PINGPONG = 0`) and is left out: the kernel source gives
/// it that default, so the build is the one the point had before the family grew the switch, and
/// the id, with its history and committed champions, stays the same.
pub fn variant_id(params: &Params) -> String {
    params
        .iter()
        .filter(|(_, v)| **v != ParamValue::Int(0))
        .map(|(k, v)| match v {
            ParamValue::Name(s) => s.clone(),
            ParamValue::Int(i) => {
                let initials: String = k
                    .split('_')
                    .filter_map(|w| w.chars().next())
                    .collect::<String>()
                    .to_lowercase();
                format!("{initials}{i}")
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}
