//! Judging a point before anything compiles: its constraints, arch rules and launch against the device's limits, and its `-D` defines.
use super::{
    DeviceLimits, Expr, Invalid, LaunchShape, ParamValue, Params, PlannedPoint, RuledOutBy, Space,
    Variant,
};
use crate::error::{Error, Result};
use crate::model::config::Dtype;
use evalexpr::{ContextWithMutableVariables, HashMapContext, Value};
use indexmap::IndexMap;
use std::collections::BTreeSet;

// Inherent methods kept beside the expression and define code that alone uses them.
impl ParamValue {
    /// Names listed under `[symbols]` read as numbers in expressions (evalexpr cannot compare a string with a number).
    fn to_expr_value(&self, symbols: &IndexMap<String, i64>) -> Value {
        match self {
            ParamValue::Int(v) => Value::Int(*v),
            ParamValue::Name(s) => symbols
                .get(s)
                .map_or_else(|| Value::String(s.clone()), |&v| Value::Int(v)),
        }
    }
    /// The preprocessor token: integers as they are, names as `PARAM_NAME` (e.g. `MMA_WMMA`).
    pub fn define(&self, param: &str) -> String {
        match self {
            ParamValue::Int(v) => v.to_string(),
            ParamValue::Name(s) => format!("{param}_{}", s.to_uppercase()),
        }
    }
}

impl Space {
    /// Judge each (variant, head dim): constraints first, then the device's limits.
    pub fn plan(
        &self,
        head_dims: &BTreeSet<u32>,
        limits: &DeviceLimits,
    ) -> Result<Vec<PlannedPoint>> {
        self.plan_points(&self.variants()?, head_dims, limits)
    }

    /// Judge chosen points (a search's proposals, an ablation's one-factor variants) like grid points.
    pub fn plan_points(
        &self,
        variants: &[Variant],
        head_dims: &BTreeSet<u32>,
        limits: &DeviceLimits,
    ) -> Result<Vec<PlannedPoint>> {
        let mut planned = Vec::new();
        for variant in variants {
            for &head_dim in head_dims {
                planned.push(self.judge(variant, head_dim, limits)?);
            }
        }
        Ok(planned)
    }

    fn judge(
        &self,
        variant: &Variant,
        head_dim: u32,
        limits: &DeviceLimits,
    ) -> Result<PlannedPoint> {
        let ctx = expr_context(&variant.params, &self.symbols, head_dim).map_err(|e| {
            Error::BadInput(format!(
                "{}: point {}: {e}",
                self.path.display(),
                variant.id
            ))
        })?;
        let invalid = |by: RuledOutBy, reason: String| PlannedPoint {
            variant: variant.clone(),
            head_dim,
            launch: None,
            invalid: Some(Invalid { by, reason }),
        };
        for c in &self.constraints {
            let holds = c.tree.eval_boolean_with_context(&ctx).map_err(|e| {
                Error::BadInput(format!(
                    "{}: constraint `{}` cannot be evaluated for {}: {e}",
                    self.path.display(),
                    c.text,
                    variant.id
                ))
            })?;
            if !holds {
                return Ok(invalid(
                    RuledOutBy::Constraint,
                    format!("constraints: `{}` is false", c.text),
                ));
            }
        }
        for rule in &self.family.arch_rules {
            let applies = rule
                .when
                .tree
                .eval_boolean_with_context(&ctx)
                .map_err(|e| {
                    Error::BadInput(format!(
                        "{}: arch rule `{}` cannot be evaluated for {}: {e}",
                        self.path.display(),
                        rule.when.text,
                        variant.id
                    ))
                })?;
            if applies && !rule.archs.contains(&limits.arch) {
                return Ok(invalid(
                    RuledOutBy::Arch,
                    format!(
                        "device: {} needs {}; the target is {}",
                        rule.reason,
                        rule.archs.join(" or "),
                        limits.arch
                    ),
                ));
            }
        }
        let launch = LaunchShape {
            threads: self.eval_u32(&self.family.threads, &ctx, variant)?,
            smem_bytes: self.eval_u32(&self.family.smem_bytes, &ctx, variant)?,
            rows_per_cta: self.eval_u32(&self.family.rows_per_cta, &ctx, variant)?,
            kv_rows_per_block: self.eval_u32(&self.family.kv_rows_per_block, &ctx, variant)?,
            kv_splits: self.eval_u32(&self.family.kv_splits, &ctx, variant)?,
            tensor_maps: self.eval_flag(&self.family.tensor_maps, &ctx, variant)?,
            combine_in_forward: self.eval_flag(&self.family.combine_in_forward, &ctx, variant)?,
            split_counters: self.eval_flag(&self.family.split_counters, &ctx, variant)?,
            persistent: self.eval_flag(&self.family.persistent, &ctx, variant)?,
            resident_ctas: 0,
        };
        // Counters merge any split count, the worker's choice too; a cluster's size is fixed.
        if launch.combine_in_forward && !launch.split_counters && launch.kv_splits < 2 {
            let splits = match launch.kv_splits {
                0 => "the worker's choice".to_string(),
                n => n.to_string(),
            };
            return Ok(invalid(RuledOutBy::Family, format!(
                "family: combine_in_forward needs a fixed split count of 2 or more (a cluster's size), not {splits}"
            )));
        }
        if launch.threads == 0 || launch.threads > limits.max_threads_per_block {
            return Ok(invalid(
                RuledOutBy::DeviceLimits,
                format!(
                    "device limits: {} threads per block (limit {})",
                    launch.threads, limits.max_threads_per_block
                ),
            ));
        }
        if launch.smem_bytes > limits.max_smem_optin_bytes {
            return Ok(invalid(
                RuledOutBy::DeviceLimits,
                format!(
                    "device limits: {} bytes of shared memory (opt-in limit {})",
                    launch.smem_bytes, limits.max_smem_optin_bytes
                ),
            ));
        }
        if launch.rows_per_cta == 0 || launch.kv_rows_per_block == 0 {
            return Ok(invalid(
                RuledOutBy::Launch,
                "launch: rows_per_cta and kv_rows_per_block must be at least 1".into(),
            ));
        }
        Ok(PlannedPoint {
            variant: variant.clone(),
            head_dim,
            launch: Some(launch),
            invalid: None,
        })
    }

    fn unevaluable(&self, e: &Expr, variant: &Variant, err: impl std::fmt::Display) -> Error {
        Error::BadInput(format!(
            "{}: expression `{}` cannot be evaluated for {}: {err}",
            self.path.display(),
            e.text,
            variant.id
        ))
    }

    fn eval_bool(&self, e: &Expr, ctx: &HashMapContext, variant: &Variant) -> Result<bool> {
        e.tree
            .eval_boolean_with_context(ctx)
            .map_err(|err| self.unevaluable(e, variant, err))
    }

    /// An optional switch of the family (absent: off).
    fn eval_flag(&self, e: &Option<Expr>, ctx: &HashMapContext, variant: &Variant) -> Result<bool> {
        e.as_ref()
            .map_or(Ok(false), |e| self.eval_bool(e, ctx, variant))
    }

    fn eval_u32(&self, e: &Expr, ctx: &HashMapContext, variant: &Variant) -> Result<u32> {
        let v = e
            .tree
            .eval_int_with_context(ctx)
            .map_err(|err| self.unevaluable(e, variant, err))?;
        u32::try_from(v).map_err(|_| {
            Error::BadInput(format!(
                "{}: expression `{}` gives {v} for {}, outside 0..2^32",
                self.path.display(),
                e.text,
                variant.id
            ))
        })
    }

    /// The `-D` definitions of one forward build.
    pub fn forward_defines(
        &self,
        variant: &Variant,
        dtype: Dtype,
        head_dim: u32,
    ) -> Vec<(String, String)> {
        let mut defines = vec![
            ("DTYPE".to_owned(), dtype.define().to_owned()),
            ("HEAD_DIM".to_owned(), head_dim.to_string()),
        ];
        defines.extend(variant.params.iter().map(|(k, v)| (k.clone(), v.define(k))));
        defines
    }
}

/// The expression variables of one point: its parameters, the head dim and the element size.
pub(super) fn expr_context(
    params: &Params,
    symbols: &IndexMap<String, i64>,
    head_dim: u32,
) -> std::result::Result<HashMapContext, String> {
    let mut ctx = HashMapContext::new();
    let values = params
        .iter()
        .map(|(k, v)| (k.clone(), v.to_expr_value(symbols)))
        .chain([
            ("HEAD_DIM".to_owned(), Value::Int(i64::from(head_dim))),
            ("ELEM_BYTES".to_owned(), Value::Int(2)),
        ]);
    for (name, value) in values {
        ctx.set_value(name.clone(), value)
            .map_err(|e| format!("cannot set `{name}` in the expression context: {e}"))?;
    }
    Ok(ctx)
}
