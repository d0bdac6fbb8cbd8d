//! `Space::load`: parses a `variants/*.toml` file and checks its names, paths and expressions before anything compiles.
use super::family_from::family_origin;
use super::judge::expr_context;
use super::{ArchRule, ChainStep, Expr, Family, ParamValue, Params, Space};
use crate::error::Result;
use crate::model::config;
use indexmap::IndexMap;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SpaceFile {
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
    pub(super) timeouts: Option<crate::model::config::Timeouts>,
    /// Symbolic values with a numeric meaning in expressions, e.g. `auto = 0` for KV_SPLIT.
    pub(super) symbols: Option<IndexMap<String, i64>>,
    pub(super) family: Option<FamilyFile>,
    /// Or another space beside this one whose [family], [symbols] and [timeouts] this one takes
    /// (its own [timeouts] still win): an experiment on a family says which, not a copy of it.
    pub(super) family_from: Option<PathBuf>,
    /// A grid: every combination of these values.
    params: Option<IndexMap<String, Vec<ParamValue>>>,
    /// Or a named chain: exactly these points, in this order (an ablation).
    chain: Option<Vec<ChainStep>>,
    /// Or a list: exactly these points, measured as a set (no steps, no order of merit).
    points: Option<Vec<Params>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FamilyFile {
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
    /// Whether the kernel is persistent: a grid of the CTAs the GPU holds, each walking tiles
    /// (an expression; absent: never).
    #[serde(default)]
    persistent: Option<String>,
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

impl Space {
    pub fn load(path: &Path) -> Result<Self> {
        let text = config::read_text(path)?;
        let file: SpaceFile = config::parse_toml(path, &text)?;
        check_names(path, &text, &file)?;
        let origin = family_origin(path, &text, &file)?;
        // The family's own file, for errors in it: this one, or the one `family_from` names.
        let (family_path, family_text) = match &origin.source {
            Some(source) => (source.path.as_path(), source.text.as_str()),
            None => (path, text.as_str()),
        };
        // Said of an error in a taken family's file: which space took it.
        let taken_by = origin
            .source
            .as_ref()
            .map(|_| format!(" (the family {} takes with family_from)", path.display()));
        // Each expression is parsed and tried on the baseline now, so a typo is reported with its line.
        let probe = expr_context(&file.baseline, &origin.symbols, 64)
            .map_err(|e| config::config_error_at_key(path, &text, "baseline", e))?;
        let compile_in = |at_path: &Path, at_text: &str, key: &str, src: &str| -> Result<Expr> {
            let suffix = match &taken_by {
                Some(taken_by) if at_path != path => taken_by.as_str(),
                _ => "",
            };
            let at = |message: String| {
                config::config_error_at_text(
                    at_path,
                    at_text,
                    src,
                    key,
                    format!("{message}{suffix}"),
                )
            };
            let tree = evalexpr::build_operator_tree(src)
                .map_err(|e| at(format!("cannot parse expression `{src}`: {e}")))?;
            tree.eval_with_context(&probe)
                .map_err(|e| at(format!("expression `{src}` fails on the baseline: {e}")))?;
            Ok(Expr {
                text: src.to_owned(),
                tree,
            })
        };
        let compile = |key: &str, src: &str| compile_in(family_path, family_text, key, src);
        // An optional switch of the launch contract (absent: never on).
        let compile_flag = |key: &str, src: &Option<String>| -> Result<Option<Expr>> {
            src.as_deref().map(|src| compile(key, src)).transpose()
        };
        let family_file = &origin.family;
        check_family_paths(
            family_path,
            family_text,
            &family_file.forward,
            &family_file.reference,
        )?;
        let family = Family {
            threads: compile("family.threads", &family_file.threads)?,
            smem_bytes: compile("family.smem_bytes", &family_file.smem_bytes)?,
            rows_per_cta: compile("family.rows_per_cta", &family_file.rows_per_cta)?,
            kv_rows_per_block: compile("family.kv_rows_per_block", &family_file.kv_rows_per_block)?,
            kv_splits: compile("family.kv_splits", &family_file.kv_splits)?,
            tensor_maps: compile_flag("family.tensor_maps", &family_file.tensor_maps)?,
            combine_in_forward: compile_flag(
                "family.combine_in_forward",
                &family_file.combine_in_forward,
            )?,
            split_counters: compile_flag("family.split_counters", &family_file.split_counters)?,
            persistent: compile_flag("family.persistent", &family_file.persistent)?,
            arch_rules: family_file
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
            forward: family_file.forward.clone(),
            forward_entry: family_file.forward_entry.clone(),
            combine_entry: family_file.combine_entry.clone(),
            reference: family_file.reference.clone(),
            reference_entry: family_file.reference_entry.clone(),
        };
        let constraints = file
            .constraints
            .iter()
            .map(|c| compile_in(path, &text, "constraints", c))
            .collect::<Result<Vec<_>>>()?;
        let params = parameter_grid(path, &text, &file)?;
        check_named_points(path, &text, &file, &params)?;
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
            timeouts: origin.timeouts,
            constraints,
            symbols: origin.symbols,
            baseline: file.baseline,
            start: file.start,
            family_source: origin.source,
        })
    }
}

/// The values of each parameter: the `[params]` grid, or those a `[[chain]]` or `points` list
/// takes; every point and chain step sets every parameter, and the baseline sets each one.
fn parameter_grid(
    path: &Path,
    text: &str,
    file: &SpaceFile,
) -> Result<IndexMap<String, Vec<ParamValue>>> {
    let params = match (&file.params, &file.chain, &file.points) {
        (Some(grid), None, None) => grid.clone(),
        (None, Some(chain), None) if !chain.is_empty() => {
            values_of(chain.iter().map(|step| &step.params))
        }
        (None, None, Some(points)) if !points.is_empty() => values_of(points.iter()),
        _ => {
            return Err(config::config_error_at_key(
                path,
                text,
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
                text,
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
                return Err(config::config_error_at_text(path, text, &step.name, "chain", format!("chain step `{}` must set every parameter, in the same order as the first step", step.name)));
            }
        }
    }
    for (name, values) in &params {
        if values.is_empty() {
            return Err(config::config_error_at_key(
                path,
                text,
                &format!("params.{name}"),
                "a parameter needs at least one value".into(),
            ));
        }
        if !file.baseline.contains_key(name) {
            // Placed at the parameter's own line: the new parameter is what the reader just wrote.
            return Err(config::config_error_at_key(
                path,
                text,
                &format!("params.{name}"),
                format!(
                    "parameter `{name}` is not set by `baseline`: add `{name} = <one of its values>` to the baseline, or remove the parameter"
                ),
            ));
        }
    }
    Ok(params)
}

/// The baseline and the start each set every parameter to one of its listed values.
fn check_named_points(
    path: &Path,
    text: &str,
    file: &SpaceFile,
    params: &IndexMap<String, Vec<ParamValue>>,
) -> Result<()> {
    let named_points = std::iter::once(("baseline", &file.baseline))
        .chain(file.start.iter().map(|s| ("start", s)));
    for (key, point) in named_points {
        if point.len() != params.len() {
            return Err(config::config_error_at_key(
                path,
                text,
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
                    text,
                    key,
                    format!("{key} sets `{name}`, which is not a parameter of this space"),
                )
            })?;
            if !known.contains(value) {
                return Err(config::config_error_at_key(
                    path,
                    text,
                    key,
                    format!("{key} value {name} = {value} is not among the listed values"),
                ));
            }
        }
    }
    Ok(())
}

/// Names the planner sets itself for every point; a space cannot make them parameters.
const PLANNER_NAMES: [(&str, &str); 3] = [
    ("HEAD_DIM", "each shape's head dim"),
    ("ELEM_BYTES", "the element size of the dtype"),
    ("DTYPE", "each dtype the policies list"),
];

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
