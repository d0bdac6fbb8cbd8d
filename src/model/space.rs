//! Variant spaces: parse `variants/*.toml`, expand the parameter grid, and judge each point before anything compiles.
use crate::error::{Error, Result};
use crate::model::config::{self, Dtype};
use evalexpr::{ContextWithMutableVariables, HashMapContext, Node, Value};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use crate::model::vocab::ParamValue;

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
    fn define(&self, param: &str) -> String {
        match self {
            ParamValue::Int(v) => v.to_string(),
            ParamValue::Name(s) => format!("{param}_{}", s.to_uppercase()),
        }
    }
}

pub type Params = IndexMap<String, ParamValue>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpaceFile {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    constraints: Vec<String>,
    /// Names of `policies.toml` shapes this space is measured on; all of them when absent.
    shapes: Option<Vec<String>>,
    baseline: Params,
    /// Where `tune --strategy guided` starts (default: the baseline).
    start: Option<Params>,
    /// Overrides of policies.toml's [timeouts] for this space (fault spaces want short ones).
    timeouts: Option<crate::model::config::Timeouts>,
    /// Symbolic values with a numeric meaning in expressions, e.g. `auto = 0` for KV_SPLIT.
    #[serde(default)]
    symbols: IndexMap<String, i64>,
    family: FamilyFile,
    /// A grid: every combination of these values.
    params: Option<IndexMap<String, Vec<ParamValue>>>,
    /// Or a named chain: exactly these points, in this order (an ablation).
    chain: Option<Vec<ChainStep>>,
    /// Or a list: exactly these points, measured as a set (no steps, no order of merit).
    points: Option<Vec<Params>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainStep {
    pub name: String,
    pub params: Params,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FamilyFile {
    forward: PathBuf,
    forward_entry: String,
    combine_entry: String,
    reference: PathBuf,
    reference_entry: String,
    threads: String,
    smem_bytes: String,
    rows_per_cta: String,
    kv_rows_per_block: String,
    kv_splits: String,
    /// Whether a launch passes TMA tensor maps of Q, K and V after the usual arguments (an
    /// expression; absent: never). The contract is forward.cu's.
    #[serde(default)]
    tensor_maps: Option<String>,
    /// Whether a split launch merges its splits inside the forward kernel (a thread-block
    /// cluster over the splits, or the split that finishes last), so no combine kernel follows
    /// (an expression; absent: never).
    #[serde(default)]
    combine_in_forward: Option<String>,
    /// Whether a launch passes split counters after `causal` (an expression; absent: never).
    #[serde(default)]
    split_counters: Option<String>,
    /// Paths that only some targets can build (wgmma: sm_90a): ruled out elsewhere, with the reason.
    #[serde(default)]
    arch_rules: Vec<ArchRuleFile>,
}

/// `{ when = 'MMA == "wgmma"', archs = ["sm_90a"], reason = "..." }`: a point for which `when`
/// holds is valid only on those targets.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ArchRuleFile {
    when: String,
    archs: Vec<String>,
    reason: String,
}

/// How a kernel family is built and launched; expressions are over the parameters plus HEAD_DIM and ELEM_BYTES.
#[derive(Debug, Clone)]
pub struct Family {
    pub forward: PathBuf,
    pub forward_entry: String,
    pub combine_entry: String,
    pub reference: PathBuf,
    pub reference_entry: String,
    threads: Expr,
    smem_bytes: Expr,
    rows_per_cta: Expr,
    kv_rows_per_block: Expr,
    kv_splits: Expr,
    tensor_maps: Option<Expr>,
    combine_in_forward: Option<Expr>,
    split_counters: Option<Expr>,
    arch_rules: Vec<ArchRule>,
}

impl Family {
    /// The texts of the launch contract's expressions: a parameter one of them names shapes the
    /// launch even where no kernel source reads it.
    pub fn launch_expressions(&self) -> Vec<&str> {
        [
            &self.threads,
            &self.smem_bytes,
            &self.rows_per_cta,
            &self.kv_rows_per_block,
            &self.kv_splits,
        ]
        .into_iter()
        .chain(self.tensor_maps.iter())
        .chain(self.combine_in_forward.iter())
        .chain(self.split_counters.iter())
        .chain(self.arch_rules.iter().map(|r| &r.when))
        .map(|e| e.text.as_str())
        .collect()
    }
}

/// A path that only some nvcc targets have (the instructions it uses exist nowhere else).
#[derive(Debug, Clone)]
struct ArchRule {
    when: Expr,
    archs: Vec<String>,
    reason: String,
}

#[derive(Debug, Clone)]
struct Expr {
    text: String,
    tree: Node,
}

#[derive(Debug, Clone)]
pub struct Space {
    pub name: String,
    pub description: String,
    pub path: PathBuf,
    pub text: String,
    pub family: Family,
    /// Every value each parameter takes (the grid, or the union over a chain's steps).
    pub params: IndexMap<String, Vec<ParamValue>>,
    pub chain: Option<Vec<ChainStep>>,
    /// The points of a listed space (`points = [...]`).
    pub points: Option<Vec<Params>>,
    pub shapes: Option<Vec<String>>,
    pub timeouts: Option<crate::model::config::Timeouts>,
    constraints: Vec<Expr>,
    symbols: IndexMap<String, i64>,
    pub baseline: Params,
    pub start: Option<Params>,
}

/// The limits a launch must respect, read from the GPU (or the policy's default device).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceLimits {
    pub max_threads_per_block: u32,
    pub max_smem_optin_bytes: u32,
    /// The nvcc target: the GPU's compute capability as the worker names it (`sm_90a` on
    /// Hopper), or `flashtune build --arch`. The family's `arch_rules` are judged against it.
    pub arch: String,
}

/// A point of the space.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Variant {
    pub id: String,
    pub params: Params,
    /// The chain step's name, in a chain space.
    #[serde(default)]
    pub step: Option<String>,
}

/// What one compiled kernel needs at launch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchShape {
    pub threads: u32,
    pub smem_bytes: u32,
    pub rows_per_cta: u32,
    /// Keys per K/V tile: the unit a KV split divides.
    pub kv_rows_per_block: u32,
    /// Split count; 0 lets the worker choose per shape (the waves heuristic).
    pub kv_splits: u32,
    /// The kernel takes TMA tensor maps of Q, K and V (boxes of [rows_per_cta or
    /// kv_rows_per_block rows x 64 elements], 128-byte swizzle) after its usual arguments.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tensor_maps: bool,
    /// A split launch merges its splits in the forward kernel (CLUSTER_COMBINE, LAST_CTA_COMBINE):
    /// no combine kernel is launched after it. Without `split_counters` (a cluster) its split
    /// count is fixed, the cluster's size.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub combine_in_forward: bool,
    /// The kernel takes `unsigned* split_counters` after `causal` (LAST_CTA_COMBINE): one word
    /// per (query block, batch x head), zero when first launched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub split_counters: bool,
}

/// A (variant, head dim) with its verdict; dtype does not change validity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlannedPoint {
    pub variant: Variant,
    pub head_dim: u32,
    pub launch: Option<LaunchShape>,
    /// Why the point cannot run; `None` when valid.
    pub invalid: Option<String>,
}

impl Space {
    pub fn load(path: &Path) -> Result<Self> {
        let text = config::read_text(path)?;
        let file: SpaceFile = config::parse_toml(path, &text)?;
        check_names(path, &text, &file)?;
        if let Some(timeouts) = &file.timeouts {
            timeouts.check("timeouts", path, &text)?;
        }
        // Each expression is parsed and tried on the baseline now, so a typo is reported with its line.
        let probe = expr_context(&file.baseline, &file.symbols, 64)
            .map_err(|e| config::config_error_at_key(path, &text, "baseline", e))?;
        let compile = |key: &str, src: &str| -> Result<Expr> {
            let at = |message: String| config::config_error_at_text(path, &text, src, key, message);
            let tree = evalexpr::build_operator_tree(src)
                .map_err(|e| at(format!("cannot parse expression `{src}`: {e}")))?;
            tree.eval_with_context(&probe)
                .map_err(|e| at(format!("expression `{src}` fails on the baseline: {e}")))?;
            Ok(Expr {
                text: src.to_owned(),
                tree,
            })
        };
        // An optional switch of the launch contract (absent: never on).
        let compile_flag = |key: &str, src: &Option<String>| -> Result<Option<Expr>> {
            src.as_deref().map(|src| compile(key, src)).transpose()
        };
        check_family_paths(path, &text, &file.family.forward, &file.family.reference)?;
        let family = Family {
            threads: compile("family.threads", &file.family.threads)?,
            smem_bytes: compile("family.smem_bytes", &file.family.smem_bytes)?,
            rows_per_cta: compile("family.rows_per_cta", &file.family.rows_per_cta)?,
            kv_rows_per_block: compile("family.kv_rows_per_block", &file.family.kv_rows_per_block)?,
            kv_splits: compile("family.kv_splits", &file.family.kv_splits)?,
            tensor_maps: compile_flag("family.tensor_maps", &file.family.tensor_maps)?,
            combine_in_forward: compile_flag(
                "family.combine_in_forward",
                &file.family.combine_in_forward,
            )?,
            split_counters: compile_flag("family.split_counters", &file.family.split_counters)?,
            arch_rules: file
                .family
                .arch_rules
                .iter()
                .map(|rule| {
                    Ok(ArchRule {
                        when: compile("family.arch_rules", &rule.when)?,
                        archs: rule.archs.clone(),
                        reason: rule.reason.clone(),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            forward: file.family.forward,
            forward_entry: file.family.forward_entry,
            combine_entry: file.family.combine_entry,
            reference: file.family.reference,
            reference_entry: file.family.reference_entry,
        };
        let constraints = file
            .constraints
            .iter()
            .map(|c| compile("constraints", c))
            .collect::<Result<Vec<_>>>()?;
        let params = match (&file.params, &file.chain, &file.points) {
            (Some(grid), None, None) => grid.clone(),
            (None, Some(chain), None) if !chain.is_empty() => {
                values_of(chain.iter().map(|step| &step.params))
            }
            (None, None, Some(points)) if !points.is_empty() => values_of(points.iter()),
            _ => {
                return Err(config::config_error_at_key(
                    path,
                    &text,
                    "params",
                    "a space needs exactly one of a [params] grid, a non-empty [[chain]] or a non-empty `points` list"
                        .into(),
                ));
            }
        };
        for point in file.points.iter().flatten() {
            if point.keys().ne(params.keys()) {
                return Err(config::config_error_at_key(
                    path,
                    &text,
                    "points",
                    format!(
                        "every point must set every parameter, in the same order as the first ({})",
                        params.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        if let Some(chain) = &file.chain {
            for step in chain {
                if step.params.keys().ne(params.keys()) {
                    return Err(config::config_error_at_text(path, &text, &step.name, "chain", format!("chain step `{}` must set every parameter, in the same order as the first step", step.name)));
                }
            }
        }
        for (name, values) in &params {
            if values.is_empty() {
                return Err(config::config_error_at_key(
                    path,
                    &text,
                    &format!("params.{name}"),
                    "a parameter needs at least one value".into(),
                ));
            }
            if !file.baseline.contains_key(name) {
                return Err(config::config_error_at_key(
                    path,
                    &text,
                    "baseline",
                    format!("baseline does not set parameter `{name}`"),
                ));
            }
        }
        let named_points = std::iter::once(("baseline", &file.baseline))
            .chain(file.start.iter().map(|s| ("start", s)));
        for (key, point) in named_points {
            if point.len() != params.len() {
                return Err(config::config_error_at_key(
                    path,
                    &text,
                    key,
                    format!(
                        "{key} must set every parameter of the space ({})",
                        params.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            for (name, value) in point {
                let known = params.get(name).ok_or_else(|| {
                    config::config_error_at_key(
                        path,
                        &text,
                        key,
                        format!("{key} sets `{name}`, which is not a parameter of this space"),
                    )
                })?;
                if !known.contains(value) {
                    return Err(config::config_error_at_key(
                        path,
                        &text,
                        key,
                        format!("{key} value {name} = {value} is not among the listed values"),
                    ));
                }
            }
        }
        Ok(Space {
            name: file.name,
            description: file.description,
            path: path.to_path_buf(),
            text,
            family,
            params,
            chain: file.chain,
            points: file.points,
            shapes: file.shapes,
            timeouts: file.timeouts,
            constraints,
            symbols: file.symbols,
            baseline: file.baseline,
            start: file.start,
        })
    }

    /// Every grid point, in file order (the last parameter varies fastest).
    pub fn variants(&self) -> Result<Vec<Variant>> {
        let points = self
            .params
            .values()
            .try_fold(1usize, |n, values| n.checked_mul(values.len()))
            .filter(|&n| n <= MAX_GRID_POINTS);
        if points.is_none() {
            return Err(config::config_error_at_key(
                &self.path,
                &self.text,
                "params",
                format!("the grid has more than {MAX_GRID_POINTS} points; list fewer values, or prune with a chain"),
            ));
        }
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
        let invalid = |reason: String| PlannedPoint {
            variant: variant.clone(),
            head_dim,
            launch: None,
            invalid: Some(reason),
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
                return Ok(invalid(format!("constraints: `{}` is false", c.text)));
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
                return Ok(invalid(format!(
                    "device: {} needs {}; the target is {}",
                    rule.reason,
                    rule.archs.join(" or "),
                    limits.arch
                )));
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
        };
        // Counters merge any split count, the worker's choice too; a cluster's size is fixed.
        if launch.combine_in_forward && !launch.split_counters && launch.kv_splits < 2 {
            let splits = match launch.kv_splits {
                0 => "the worker's choice".to_string(),
                n => n.to_string(),
            };
            return Ok(invalid(format!(
                "family: combine_in_forward needs a fixed split count of 2 or more (a cluster's size), not {splits}"
            )));
        }
        if launch.threads == 0 || launch.threads > limits.max_threads_per_block {
            return Ok(invalid(format!(
                "device limits: {} threads per block (limit {})",
                launch.threads, limits.max_threads_per_block
            )));
        }
        if launch.smem_bytes > limits.max_smem_optin_bytes {
            return Ok(invalid(format!(
                "device limits: {} bytes of shared memory (opt-in limit {})",
                launch.smem_bytes, limits.max_smem_optin_bytes
            )));
        }
        if launch.rows_per_cta == 0 || launch.kv_rows_per_block == 0 {
            return Ok(invalid(
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

/// Names the planner sets itself for every point; a space cannot make them parameters.
const PLANNER_NAMES: [(&str, &str); 3] = [
    ("HEAD_DIM", "each shape's head dim"),
    ("ELEM_BYTES", "the element size of the dtype"),
    ("DTYPE", "each dtype the policies list"),
];

/// Far more points than any run could build; a grid this large is a mistake in the file.
pub const MAX_GRID_POINTS: usize = 1_000_000;

/// Parameter names and symbolic values become `-D` tokens: they must be C identifiers, and not the
/// names the planner defines itself.
fn check_names(path: &Path, text: &str, file: &SpaceFile) -> Result<()> {
    let is_identifier = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let grid_names = file.params.iter().flat_map(|grid| grid.iter());
    let chain_names = file.chain.iter().flatten().flat_map(|step| {
        step.params
            .iter()
            .map(|(k, v)| (k, std::slice::from_ref(v)))
    });
    let all = grid_names
        .map(|(k, v)| (k, v.as_slice()))
        .chain(chain_names)
        .chain(
            file.baseline
                .iter()
                .map(|(k, v)| (k, std::slice::from_ref(v))),
        );
    for (name, values) in all {
        let key = if file.params.is_some() {
            format!("params.{name}")
        } else {
            "chain".to_owned()
        };
        if let Some((_, what)) = PLANNER_NAMES.iter().find(|(n, _)| n == name) {
            return Err(config::config_error_at_key(
                path,
                text,
                &key,
                format!(
                    "`{name}` cannot be a parameter: flashtune sets it from {what} for every point"
                ),
            ));
        }
        if !is_identifier(name) {
            return Err(config::config_error_at_key(
                path,
                text,
                &key,
                format!("parameter name `{name}` must be a C identifier (letters, digits, _): it becomes a -D define"),
            ));
        }
        for value in values {
            if let ParamValue::Name(s) = value {
                if !is_identifier(s) {
                    return Err(config::config_error_at_key(
                        path,
                        text,
                        &key,
                        format!("value \"{s}\" of `{name}` must be a number or a C identifier (letters, digits, _): it becomes -D{name}={name}_{}", s.to_uppercase()),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The expression variables of one point: its parameters, the head dim and the element size.
fn expr_context(
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

/// Each parameter's values over a chain's steps or a list's points, in first-seen order.
fn values_of<'a>(points: impl Iterator<Item = &'a Params>) -> IndexMap<String, Vec<ParamValue>> {
    let mut values: IndexMap<String, Vec<ParamValue>> = IndexMap::new();
    for params in points {
        for (k, v) in params {
            let list = values.entry(k.clone()).or_default();
            if !list.contains(v) {
                list.push(v.clone());
            }
        }
    }
    values
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

/// Where the oracle's sources live; the step protects this folder.
pub const ORACLE_DIR: &str = "kernels/oracle/";

/// The kernels a space names lie inside the project, and its oracle inside [`ORACLE_DIR`]: an
/// absolute path or one that climbs out (`..`) could name a file of anyone's, the agent's
/// included, as the kernel or as the oracle every edit is judged by (issue 47, item 6).
fn check_family_paths(path: &Path, text: &str, forward: &Path, reference: &Path) -> Result<()> {
    let inside = |p: &Path| {
        p.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        })
    };
    for (key, p) in [("forward", forward), ("reference", reference)] {
        if !inside(p) {
            return Err(config::config_error_at_key(
                path,
                text,
                &format!("family.{key}"),
                format!(
                    "`{}` must be a path inside the project, relative to its root, with no `..`",
                    p.display()
                ),
            ));
        }
    }
    if !reference.starts_with(ORACLE_DIR) {
        return Err(config::config_error_at_key(
            path,
            text,
            "family.reference",
            format!(
                "the oracle `{}` must lie under {ORACLE_DIR}, the folder no edit may touch",
                reference.display()
            ),
        ));
    }
    Ok(())
}

/// The unit name under which the fp32 reference kernel is built and logged.
pub const REFERENCE: &str = "reference";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_readable() {
        let mut p = Params::new();
        p.insert("MMA".into(), ParamValue::Name("wmma".into()));
        p.insert("BLOCK_M".into(), ParamValue::Int(64));
        p.insert("KV_SPLIT".into(), ParamValue::Int(4));
        assert_eq!(variant_id(&p), "wmma-bm64-ks4");
        p.insert("PINGPONG".into(), ParamValue::Int(0));
        assert_eq!(
            variant_id(&p),
            "wmma-bm64-ks4",
            "a switch left off is not in the id"
        );
        p.insert("PINGPONG".into(), ParamValue::Int(1));
        assert_eq!(variant_id(&p), "wmma-bm64-ks4-p1");
    }

    #[test]
    fn moves_step_along_the_listed_values() {
        let values = [
            ParamValue::Int(1),
            ParamValue::Int(2),
            ParamValue::Name("auto".into()),
        ];
        let up = ParamValue::Name("up".into());
        let down = ParamValue::Name("down".into());
        assert_eq!(moved(&values, &values[0], &up), Some(values[1].clone()));
        assert_eq!(
            moved(&values, &values[2], &up),
            None,
            "no value past the last"
        );
        assert_eq!(
            moved(&values, &values[0], &down),
            None,
            "no value before the first"
        );
        assert_eq!(
            moved(&values, &values[0], &values[2]),
            Some(values[2].clone())
        );
        assert_eq!(
            moved(&values, &values[2], &values[2]),
            None,
            "a move that changes nothing"
        );
        assert_eq!(
            moved(&values, &values[0], &ParamValue::Int(4)),
            None,
            "only listed values"
        );
    }

    #[test]
    fn names_become_prefixed_tokens() {
        assert_eq!(ParamValue::Name("wmma".into()).define("MMA"), "MMA_WMMA");
        assert_eq!(ParamValue::Int(3).define("STAGES"), "3");
    }
}
