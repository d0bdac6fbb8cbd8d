//! The context pack at a base commit: HEAD's champions with their figures from the logs, how to
//! build them locally, and the session's budget; for a session's step and for `flashtune context`.
use super::git;
use super::worktree::{champion_sources, sources_at};
use crate::error::{Error, Result};
use crate::model::config::ProjectPaths;
use crate::pack::{self, BudgetLeft, ContextPack, PackCase, PackInput};
use crate::step::{self, Pairing, EDIT_SCOPE};
use anyhow::Context;
use std::path::{Path, PathBuf};

/// What a pack is built from.
pub(super) struct PackFor<'a> {
    pub(super) project: &'a crate::run::shared::Project,
    pub(super) repo: &'a git2::Repository,
    pub(super) base: &'a str,
    pub(super) pairings: &'a [Pairing],
    pub(super) device: Option<&'a crate::model::protocol::DeviceInfo>,
    pub(super) roofs: &'a crate::report::roofs::Roofs,
    pub(super) step: u32,
    pub(super) budget: BudgetLeft,
}

/// Gather a pack for the base's champions.
pub(super) fn build_pack(f: PackFor) -> Result<ContextPack> {
    let project = f.project;
    let head_tree = tempfile_dir(&project.paths.runs())?;
    step::extract_tree(f.repo, f.base, EDIT_SCOPE, head_tree.path())?;
    let hash = crate::run::shared::kernel_sources_hash(project, Some(head_tree.path()));
    let cases = f
        .pairings
        .iter()
        .map(|p| PackCase {
            shape: p.shape.clone(),
            dtype: p.dtype,
            variant: p.point.variant.id.clone(),
            params: p
                .point
                .variant
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
        })
        .collect();
    let arch = f
        .device
        .map_or(project.policies.build.default_arch.clone(), |d| {
            d.arch.clone()
        });
    Ok(pack::gather(PackInput {
        policies: &project.policies,
        runs_dir: &project.paths.runs(),
        step: f.step,
        base_commit: f.base,
        kernel_sources_hash: &hash,
        edit_scope: EDIT_SCOPE,
        protected: step::protected(project),
        device: f.device,
        roofs: f.roofs,
        cases,
        sources: champion_sources(project, f.repo, f.base)?,
        budget: f.budget,
        build: build_hints(project, f.pairings, &arch),
        start_from: None,
    }))
}

/// The nvcc command line of each distinct champion build, as the judge runs it, relative to a
/// work directory (a checkout of the project).
fn build_hints(
    project: &crate::run::shared::Project,
    pairings: &[Pairing],
    arch: &str,
) -> Vec<pack::BuildHint> {
    let mut hints: Vec<(String, pack::BuildHint)> = Vec::new();
    for p in pairings {
        let mut spec = project.forward_spec(&p.point, p.dtype, arch);
        spec.source = project.space.family.forward.clone();
        let out = format!(
            "$TMPDIR/{}-{}-d{}.cubin",
            p.point.variant.id, p.dtype, p.point.head_dim
        );
        let command = std::iter::once("nvcc".to_owned())
            .chain(crate::gpu::build::nvcc_args(&spec, Path::new(&out)))
            .collect::<Vec<_>>()
            .join(" ");
        let case = format!("{} {}", p.shape.name, p.dtype);
        match hints.iter_mut().find(|(c, _)| *c == command) {
            Some((_, h)) => h.cases.push(case),
            None => hints.push((
                command.clone(),
                pack::BuildHint {
                    cases: vec![case],
                    variant: p.point.variant.id.clone(),
                    command,
                },
            )),
        }
    }
    hints.into_iter().map(|(_, h)| h).collect()
}

/// A scratch folder removed when dropped (under runs/, which is flashtune's own).
pub(super) struct ScratchDir(PathBuf);

impl ScratchDir {
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn tempfile_dir(runs: &Path) -> Result<ScratchDir> {
    let dir = runs.join(format!(
        ".scratch-{}-{}",
        std::process::id(),
        crate::run::shared::new_run_id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(ScratchDir(dir))
}

/// What `context_pack` needs: the project, and the space and champion as `step` would take them.
pub struct ContextOptions {
    pub paths: ProjectPaths,
    pub space: Option<PathBuf>,
    pub variant: Option<String>,
}

/// The context pack for the next step at HEAD, without a GPU: limits from policies.toml's
/// `[build.targets]` for the default arch, GPU facts and roofs from the newest run log that measured them.
pub fn context_pack(opts: &ContextOptions) -> Result<ContextPack> {
    let project = crate::run::shared::Project::load(opts.paths.clone(), opts.space.as_deref())?;
    let repo = git2::Repository::open(&project.paths.root).map_err(|e| {
        Error::BadInput(format!(
            "{} is not a git repository's top: {}",
            project.paths.root.display(),
            e.message()
        ))
    })?;
    let (base, _) = step::head_of(&repo)?;
    let newest = newest_device_log(&project.paths.runs());
    let (device, roofs) = match &newest {
        Some(log) => (
            log.header().map(|h| h.device.clone()),
            crate::report::roofs::Roofs::from_log(log),
        ),
        None => (None, crate::report::roofs::Roofs::default()),
    };
    let limits = match &device {
        Some(d) => crate::model::space::DeviceLimits {
            max_threads_per_block: d.max_threads_per_block,
            max_smem_optin_bytes: d.max_smem_optin_bytes,
            arch: d.arch.clone(),
        },
        None => {
            let arch = &project.policies.build.default_arch;
            let t = project.policies.build.targets.get(arch).ok_or_else(|| {
                Error::BadInput(format!(
                    "policies.toml has no [build.targets.{arch}] for the default arch"
                ))
            })?;
            crate::model::space::DeviceLimits {
                max_threads_per_block: t.max_threads_per_block,
                max_smem_optin_bytes: t.max_smem_optin_bytes,
                arch: arch.clone(),
            }
        }
    };
    let pairings = step::champions_for(&project, &limits, opts.variant.as_deref(), &repo)?;
    let history = pack::history(&project.paths.runs());
    let step = history
        .iter()
        .filter(|h| h.candidate.is_none() || h.candidate == Some(1))
        .count() as u32
        + 1;
    build_pack(PackFor {
        project: &project,
        repo: &repo,
        base: &base,
        pairings: &pairings,
        device: device.as_ref(),
        roofs: &roofs,
        step,
        budget: BudgetLeft::default(),
    })
}

/// The newest sealed run log that measured the GPU's roofs (its figures reach the agent).
pub(super) fn newest_device_log(runs: &Path) -> Option<crate::log::runlog::LoadedLog> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("log.jsonl").is_file())
        .collect();
    crate::log::runlog::sort_by_start(&mut dirs);
    dirs.iter().rev().find_map(|d| {
        let text = std::fs::read_to_string(d.join("log.jsonl")).ok()?;
        if !text.contains("\"event\":\"ceiling_measured\"") {
            return None;
        }
        crate::log::runlog::read_sealed(&d.join("log.jsonl"))
            .ok()
            .map(crate::log::runlog::SealedLog::into_log)
    })
}

/// Write a pack into `dir` (AGENTS.md, PROMPT.md, context/); the bytes written.
pub fn write_context_pack(pack: &ContextPack, paths: &ProjectPaths, dir: &Path) -> Result<u64> {
    let repo = git2::Repository::open(&paths.root).map_err(git)?;
    let sources = sources_at(&repo, &pack.base_commit, &pack.sources)?;
    pack::write(pack, &sources, dir)
        .map_err(|e| Error::Other(e.context("cannot write the context pack")))
}
