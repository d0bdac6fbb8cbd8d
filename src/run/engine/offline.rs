//! `flashtune build` and the build gate: every point of the space compiled and gated for an architecture, without a GPU.
use crate::error::Result;
use crate::gpu::build::{self, BuildOutput};
use crate::model::config::Dtype;
use crate::model::space::{DeviceLimits, PlannedPoint};
use crate::run::shared::{Project, UnitKey};
use std::collections::{BTreeMap, BTreeSet};

/// One row of `flashtune build`'s table.
pub struct BuiltRow {
    pub variant: String,
    pub dtype: Dtype,
    pub head_dim: u32,
    pub outcome: std::result::Result<BuildOutput, String>,
    pub gate: Option<String>,
}

/// What `arch` allows a block, from policies.toml's `[build.targets]` (no GPU to ask).
pub fn offline_limits(project: &Project, arch: &str) -> Result<DeviceLimits> {
    let target = project.policies.target_limits(arch).map_err(|e| {
        crate::model::config::config_error_at_key(
            &project.paths.policies(),
            &project.policies_text,
            "build.targets",
            e.to_string(),
        )
    })?;
    Ok(DeviceLimits {
        max_threads_per_block: target.max_threads_per_block,
        max_smem_optin_bytes: target.max_smem_optin_bytes,
        arch: arch.to_owned(),
    })
}

/// Compile and gate every valid point without a GPU, for `arch` (default: policies.toml's `default_arch`) and its limits.
pub async fn build_space(
    project: &Project,
    arch: Option<&str>,
    covering: bool,
) -> Result<(Vec<PlannedPoint>, Vec<BuiltRow>)> {
    let arch = arch
        .unwrap_or(&project.policies.build.default_arch)
        .to_owned();
    let limits = offline_limits(project, &arch)?;
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    let specs = if covering {
        covering_specs(project, &planned, &arch)
    } else {
        project.build_specs(&planned, &arch, &BTreeSet::new())
    };
    let order: Vec<UnitKey> = specs.iter().map(|(k, _)| k.clone()).collect();
    let mut done: BTreeMap<UnitKey, BuiltRow> = BTreeMap::new();
    let (_tasks, mut results) = crate::run::scheduler::spawn_builds(project, specs);
    while let Some(((variant, dtype, head_dim), result)) = results.recv().await {
        if let Err(build::BuildFailure::Disk(full)) = result {
            return Err(build::stopped_by_the_disk(
                &format!("{variant} ({dtype}, d={head_dim})"),
                full,
                &format!(
                    "free space under {}, then build again",
                    project.paths.build_cache().display()
                ),
            ));
        }
        let gate = result.as_ref().ok().and_then(|o| project.gate(o));
        let outcome = result.map_err(|f| format!("{f}\n{}", build::log_tail(f.log(), 30)));
        done.insert(
            (variant.clone(), dtype, head_dim),
            BuiltRow {
                variant,
                dtype,
                head_dim,
                outcome,
                gate,
            },
        );
    }
    let rows = order.into_iter().filter_map(|k| done.remove(&k)).collect();
    Ok((planned, rows))
}

/// The builds of the covering sample (`CoverRole`): its register extremes in every dtype, its
/// shared-memory extremes in one dtype of each element size, each other point in one dtype, the
/// dtypes taking turns.
fn covering_specs(
    project: &Project,
    planned: &[PlannedPoint],
    arch: &str,
) -> Vec<(UnitKey, build::BuildSpec)> {
    use crate::model::plan::{covering_sample, CoverRole};
    let dtypes = &project.policies.dtypes;
    let sample = covering_sample(planned);
    let mut turn = 0;
    let mut wanted: BTreeSet<(String, Dtype, u32)> = BTreeSet::new();
    for c in &sample {
        let key = |d: Dtype| (c.point.variant.id.clone(), d, c.point.head_dim);
        match c.role {
            CoverRole::Registers => wanted.extend(dtypes.iter().map(|&d| key(d))),
            CoverRole::SharedMemory => {
                let mut sizes = BTreeSet::new();
                wanted.extend(
                    dtypes
                        .iter()
                        .filter(|d| sizes.insert(d.bytes()))
                        .map(|&d| key(d)),
                );
            }
            CoverRole::Value => {
                wanted.extend(dtypes.get(turn % dtypes.len().max(1)).map(|&d| key(d)));
                turn += 1;
            }
        }
    }
    let points: Vec<PlannedPoint> = sample.into_iter().map(|c| c.point).collect();
    project
        .build_specs(&points, arch, &BTreeSet::new())
        .into_iter()
        .filter(|((variant, dtype, head_dim), _)| {
            *variant == crate::model::space::REFERENCE
                || wanted.contains(&(variant.clone(), *dtype, *head_dim))
        })
        .collect()
}

/// The spec keys (`build::spec_key`) of every build the whole plan of the project's space needs
/// for `arch`, sorted: what the full build gate certifies in its manifest.
pub fn gate_spec_keys(project: &Project, arch: Option<&str>) -> Result<Vec<String>> {
    let arch = arch
        .unwrap_or(&project.policies.build.default_arch)
        .to_owned();
    let limits = offline_limits(project, &arch)?;
    let planned = project.space.plan(&project.head_dims(), &limits)?;
    let mut keys = project
        .build_specs(&planned, &arch, &BTreeSet::new())
        .iter()
        .map(|(_, spec)| build::spec_key(spec))
        .collect::<Result<Vec<_>>>()?;
    keys.sort();
    keys.dedup();
    Ok(keys)
}
