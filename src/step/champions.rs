//! HEAD's side of a step: its champion per case, read from HEAD's champion table, and their builds from HEAD's tree.
use super::judge::build_logged;
use super::{Pairing, Session};
use crate::error::{Error, Result};
use crate::gpu::build::{BuildSpec, Builder};
use crate::model::space::{DeviceLimits, REFERENCE};
use crate::report::champions::Table;
use crate::run::shared::{Events, Project, UnitKey};
use anyhow::anyhow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

impl Session<'_> {
    /// Per (shape, dtype): the variant HEAD's champion table names, else `--variant`, else the space's default.
    pub(crate) fn champions(&self, repo: &git2::Repository) -> Result<Vec<Pairing>> {
        let limits = DeviceLimits {
            max_threads_per_block: self.device.max_threads_per_block,
            max_smem_optin_bytes: self.device.max_smem_optin_bytes,
            arch: self.device.arch.clone(),
        };
        champions_for(self.project, &limits, self.opts.variant.as_deref(), repo)
    }

    pub(super) fn specs(
        &self,
        pairings: &[Pairing],
        tree: &Path,
        role: crate::model::vocab::BuildRole,
    ) -> Vec<(UnitKey, BuildSpec)> {
        let project = self.project;
        let arch = &self.device.arch;
        let mut specs = BTreeMap::new();
        for p in pairings {
            let mut spec = project.forward_spec(&p.point, p.dtype, arch);
            spec.source = tree.join(&project.space.family.forward);
            specs.insert(
                (
                    format!("{}@{role}", p.point.variant.id),
                    p.dtype,
                    p.point.head_dim,
                ),
                spec,
            );
        }
        specs.into_iter().collect()
    }

    /// The reference and the champion, both from HEAD's tree, through the shared cache.
    pub(crate) async fn build_head(
        &self,
        pairings: &[Pairing],
        head_tree: &Path,
        events: &mut Events,
    ) -> Result<BTreeMap<UnitKey, PathBuf>> {
        let project = self.project;
        let mut specs = self.specs(pairings, head_tree, crate::model::vocab::BuildRole::Head);
        let roles = specs
            .iter()
            .map(|(k, _)| (k.clone(), crate::model::vocab::BuildRole::Head))
            .collect();
        for &d in &project.policies.dtypes {
            let mut spec = project.reference_spec(d, &self.device.arch);
            spec.source = head_tree.join(&project.space.family.reference);
            specs.push(((REFERENCE.into(), d, 0), spec));
        }
        let builder = Builder {
            confine: Some(head_tree.to_path_buf()),
            ..project.builder()
        };
        let built = build_logged(builder, project.jobs(), specs, &roles, events).await?;
        let mut cubins = BTreeMap::new();
        for (key, result) in built {
            match result {
                Ok(out) => {
                    cubins.insert(key, out.cubin);
                }
                Err(why) => {
                    return Err(Error::Other(anyhow!(
                        "HEAD's own kernel {} ({}, d={}) does not build, so there is no champion to judge against: {why}",
                        key.0, key.1, key.2
                    )))
                }
            }
        }
        Ok(cubins)
    }
}

/// Per (shape, dtype): the variant HEAD's champion table names, else `variant_opt`, else the space's default.
pub(crate) fn champions_for(
    project: &Project,
    limits: &DeviceLimits,
    variant_opt: Option<&str>,
    repo: &git2::Repository,
) -> Result<Vec<Pairing>> {
    let planned = project.space.plan(&project.head_dims(), limits)?;
    let table = head_table(repo, &project.champion_table())?;
    let fallback = match variant_opt {
        Some(v) => v.to_owned(),
        None => {
            let variants = project.space.variants()?;
            // A chain's last step is its most developed point; a grid has no order of merit.
            let pick = if project.space.chain.is_some() {
                variants.last()
            } else {
                variants.first()
            };
            pick.map(|v| v.id.clone())
                .ok_or_else(|| Error::BadInput("the space has no variant".into()))?
        }
    };
    let mut out = Vec::new();
    for shape in &project.shapes {
        for &dtype in &project.policies.dtypes {
            let named = table
                .iter()
                .find(|c| c.shape == shape.name && c.dtype == dtype)
                .map(|c| c.variant.clone());
            let variant = named.clone().unwrap_or_else(|| fallback.clone());
            let point = planned
                .iter()
                .find(|p| p.variant.id == variant && p.head_dim == shape.d)
                .ok_or_else(|| {
                    let known: BTreeSet<&str> =
                        planned.iter().map(|p| p.variant.id.as_str()).collect();
                    Error::UnknownVariant(format!(
                        "champion `{variant}` ({}) is not a point of space `{}` (its points: {}); pass --space or --variant",
                        if named.is_some() {
                            format!("named by {} at HEAD", project.champion_table())
                        } else if variant_opt.is_some() {
                            "from --variant".to_owned()
                        } else {
                            "the space's default".to_owned()
                        },
                        project.space.name,
                        known.into_iter().collect::<Vec<_>>().join(", ")
                    ))
                })?;
            if let Some(why) = &point.invalid {
                return Err(Error::BadInput(format!(
                    "champion `{variant}` cannot run shape {} (d={}): {}",
                    shape.name, shape.d, why.reason
                )));
            }
            out.push(Pairing {
                shape: shape.clone(),
                dtype,
                point: point.clone(),
            });
        }
    }
    Ok(out)
}

/// The champion table as HEAD has it; none when HEAD has no table.
fn head_table(
    repo: &git2::Repository,
    path: &str,
) -> Result<Vec<crate::report::champions::Champion>> {
    let tree = repo
        .head()
        .and_then(|h| h.peel_to_tree())
        .map_err(|e| Error::Other(anyhow!("HEAD: {}", e.message())))?;
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(Vec::new());
    };
    let blob = repo
        .find_blob(entry.id())
        .map_err(|e| Error::Other(anyhow!("{path} at HEAD: {}", e.message())))?;
    let text = String::from_utf8_lossy(blob.content());
    let table: Table = crate::model::config::parse_toml(Path::new(&format!("HEAD:{path}")), &text)?;
    Ok(table.champion)
}
