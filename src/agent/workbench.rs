//! The workbench: the operations an agent calls (CLI `--json`, MCP): judge the working tree, the context pack, the history. Names are stable.
use super::*;

/// Gather a pack for HEAD's champions.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_pack(
    project: &crate::run::Project,
    repo: &git2::Repository,
    base: &str,
    pairings: &[Pairing],
    device: Option<&crate::protocol::DeviceInfo>,
    roofs: &crate::roofs::Roofs,
    n: u32,
    budget: BudgetLeft,
) -> Result<ContextPack> {
    let head_tree = tempfile_dir(&project.paths.runs())?;
    step::extract_tree(repo, base, EDIT_SCOPE, head_tree.path())?;
    let hash = crate::run::sources_hash(&head_tree.path().join(EDIT_SCOPE));
    let cases = pairings
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
    Ok(pack::gather(PackInput {
        policies: &project.policies,
        runs_dir: &project.paths.runs(),
        step: n,
        base_commit: base,
        kernel_sources_hash: &hash,
        edit_scope: EDIT_SCOPE,
        protected: step::protected(project),
        device,
        roofs,
        cases,
        sources: champion_sources(project, repo, base)?,
        budget,
    }))
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
        crate::run::new_run_id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(ScratchDir(dir))
}

/// Where and how to judge: the project, and the GPU (or the test double).
pub struct JudgeOptions {
    pub paths: ProjectPaths,
    /// Variant space whose shapes are the cases judged (default: policies.toml's).
    pub space: Option<PathBuf>,
    /// The champion where HEAD's champion table names none.
    pub variant: Option<String>,
    pub device: u32,
    pub executor: Executor,
    pub when_busy: WhenBusy,
}

/// The verdict on the working tree's edit, as `flashtune judge --json` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JudgeVerdict {
    pub run_id: String,
    pub run_dir: PathBuf,
    pub accepted: bool,
    pub reason: String,
    pub geomean_gain: Option<f64>,
    /// The commit made for an accepted edit.
    pub commit: Option<String>,
    /// Files put back as HEAD has them (a rejected edit).
    pub restored: Vec<String>,
    pub changed_files: Vec<String>,
    pub duels: Vec<pack::DuelFigure>,
    /// The step's Markdown report.
    pub report: PathBuf,
    /// True on the test double: the figures are synthetic.
    pub fake_gpu: bool,
}

/// Judge the uncommitted edit under kernels/ as `flashtune step` does (build, check, interleaved
/// duel against HEAD's champion; commit or restore) and return the verdict from the run's log.
pub async fn judge_working_tree(opts: JudgeOptions) -> Result<JudgeVerdict> {
    let outcome = step::step(StepOptions {
        paths: opts.paths,
        space: opts.space,
        variant: opts.variant,
        proposer: None,
        steps: 1,
        time_limit: None,
        device: opts.device,
        executor: opts.executor,
        when_busy: opts.when_busy,
        quiet: true,
    })
    .await?;
    verdict_from_log(&outcome.run_dir)
}

/// The verdict of a one-step run, read from its log.
pub fn verdict_from_log(run_dir: &Path) -> Result<JudgeVerdict> {
    let log = crate::runlog::read(&run_dir.join("log.jsonl"))?;
    let header = log
        .header()
        .ok_or_else(|| Error::Other(anyhow!("{} has no header", run_dir.display())))?;
    let mut v = JudgeVerdict {
        run_id: header.run_id.clone(),
        run_dir: run_dir.to_path_buf(),
        accepted: false,
        reason: "the log holds no decision".into(),
        geomean_gain: None,
        commit: None,
        restored: Vec::new(),
        changed_files: Vec::new(),
        duels: Vec::new(),
        report: run_dir.join("step-1.md"),
        fake_gpu: header.device.fake,
    };
    for (_, e) in &log.entries {
        match &e.record {
            Record::StepStarted { changed_files, .. } => v.changed_files = changed_files.clone(),
            Record::Duel {
                shape,
                dtype,
                champion,
                challenger,
                verdict,
                failure,
                ..
            } => v.duels.push(pack::DuelFigure {
                shape: shape.clone(),
                dtype: *dtype,
                champion_us: champion.as_ref().map(|t| t.median_us),
                challenger_us: challenger.as_ref().map(|t| t.median_us),
                gain: verdict.as_ref().map(|x| x.gain),
                noise: verdict.as_ref().map(|x| x.noise),
                failure: failure.clone(),
            }),
            Record::StepDecided {
                accepted,
                reason,
                geomean_gain,
                commit,
                restored,
                ..
            } => {
                v.accepted = *accepted;
                v.reason = reason.clone();
                v.geomean_gain = *geomean_gain;
                v.commit = commit.clone();
                v.restored = restored.clone();
            }
            _ => {}
        }
    }
    Ok(v)
}

/// Every earlier step and candidate on this project, across sessions, oldest first.
pub fn step_history(paths: &ProjectPaths) -> Result<Vec<HistoryEntry>> {
    Ok(pack::history(&paths.runs()))
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
    let project = crate::run::Project::load(opts.paths.clone(), opts.space.as_deref())?;
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
            crate::roofs::Roofs::from_log(log),
        ),
        None => (None, crate::roofs::Roofs::default()),
    };
    let arch = &project.policies.build.default_arch;
    let limits = match &device {
        Some(d) => crate::space::DeviceLimits {
            max_threads_per_block: d.max_threads_per_block,
            max_smem_optin_bytes: d.max_smem_optin_bytes,
            arch: d.arch.clone(),
        },
        None => {
            let t = project.policies.build.targets.get(arch).ok_or_else(|| {
                Error::BadInput(format!(
                    "policies.toml has no [build.targets.{arch}] for the default arch"
                ))
            })?;
            crate::space::DeviceLimits {
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
    build_pack(
        &project,
        &repo,
        &base,
        &pairings,
        device.as_ref(),
        &roofs,
        step,
        BudgetLeft::default(),
    )
}

/// The newest run log that measured the GPU's roofs.
pub(super) fn newest_device_log(runs: &Path) -> Option<crate::runlog::LoadedLog> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("log.jsonl").is_file())
        .collect();
    dirs.sort();
    dirs.iter().rev().find_map(|d| {
        let text = std::fs::read_to_string(d.join("log.jsonl")).ok()?;
        if !text.contains("\"event\":\"ceiling_measured\"") {
            return None;
        }
        crate::runlog::read(&d.join("log.jsonl")).ok()
    })
}

/// Write a pack into `dir` (AGENTS.md, PROMPT.md, context/); the bytes written.
pub fn write_context_pack(pack: &ContextPack, paths: &ProjectPaths, dir: &Path) -> Result<u64> {
    let repo = git2::Repository::open(&paths.root).map_err(git)?;
    let sources = sources_at(&repo, &pack.base_commit, &pack.sources)?;
    pack::write(pack, &sources, dir)
        .map_err(|e| Error::Other(e.context("cannot write the context pack")))
}
