//! What a session opens once before its steps: the repository checked, the GPU locked, the run folder and its log started or reopened.
use super::scope::{changes, protected};
use super::{rules, Session, StepOptions, EDIT_SCOPE};
use crate::error::{Error, Result};
use crate::log::runlog::{Record, RunLog};
use crate::model::protocol::DeviceInfo;
use crate::run::shared::{self, Events, Project};
use anyhow::{anyhow, Context};
use std::path::{Path, PathBuf};

/// What every step of a session shares: the project, the repository, the GPU (locked), the run folder and its log.
pub(crate) struct Bench {
    pub(crate) project: Project,
    pub(crate) root: PathBuf,
    pub(crate) device: DeviceInfo,
    pub(crate) run_id: String,
    pub(crate) run_dir: PathBuf,
    /// The step run's input seed; each step draws its own sets from it.
    pub(crate) seed: u64,
    pub(crate) roofs: crate::report::roofs::Roofs,
    _locks: Vec<std::fs::File>,
}

impl Bench {
    /// Load the project, check the repository, take the GPU and start the run log, or, with
    /// `resume`, reopen that run's log (same run id, seed and roofs).
    pub(crate) async fn open(
        opts: &StepOptions,
        proposer: bool,
        resume: Option<(&Path, &crate::log::runlog::LoadedLog)>,
    ) -> Result<(Bench, Events)> {
        let project = Project::load(opts.paths.clone(), opts.space.as_deref())?;
        let root = repository_root(&project.paths.root)?;
        refuse_uncommitted(&project, &root, proposer, resume.is_some())?;
        let repo =
            git2::Repository::open(&root).map_err(|e| Error::Other(anyhow!("{}", e.message())))?;
        rules::refuse_rules_not_at_head(&project, &root, &repo)?;
        let device = opts.executor.probe(opts.device).await.map_err(|reason| {
            Error::NoGpu(format!(
                "{reason}\n`flashtune step` times kernels on an NVIDIA GPU; `--fake-gpu` runs it with the test double"
            ))
        })?;
        let locks = shared::lock_gpus(&[opts.device], opts.executor.is_fake(), opts.when_busy)?;
        // From here (not while `--wait` queues for the GPU, where a signal should simply end the
        // wait) a stop request ends the run through its one stop path (`interrupt`), not the
        // signal's default, which would leave the edit in the tree and the log without its end.
        crate::os::stop::listen_as(crate::os::stop::FirstStop::DropsTheStep)
            .map_err(|e| Error::Other(anyhow!("cannot listen for stop signals: {e}")))?;
        let mut bench = Bench {
            project,
            root,
            device,
            run_id: String::new(),
            run_dir: PathBuf::new(),
            seed: 0,
            roofs: crate::report::roofs::Roofs::default(),
            _locks: locks,
        };
        if let Some((run_dir, loaded)) = resume {
            let header = loaded
                .header()
                .ok_or_else(|| Error::BadInput(format!("{} has no header", run_dir.display())))?;
            bench.run_id = header.run_id.clone();
            bench.seed = header.run_seed.unwrap_or(0);
            bench.run_dir = run_dir.to_path_buf();
            bench.roofs = crate::report::roofs::Roofs::from_log(loaded);
            let log = RunLog::reopen(&run_dir.join("log.jsonl"), loaded)?;
            return Ok((bench, Events::new(log, Vec::new())));
        }
        bench.run_id = shared::new_run_id();
        bench.run_dir = bench.project.paths.runs().join(&bench.run_id);
        // A champion that cannot be found is a usage error, reported before any run folder exists.
        bench.session(opts).champions(&repo)?;
        // Judging the working tree: a clean one has nothing to judge, and gets no run and no attempt.
        if !proposer {
            let (inside, _) = changes(&bench.project, &bench.root)?;
            if inside.is_empty() {
                return Err(Error::BadInput(format!(
                    "nothing to judge: the working tree holds no edit under {EDIT_SCOPE} against HEAD \
                     (no run was started); edit a kernel first"
                )));
            }
        }
        std::fs::create_dir_all(&bench.run_dir)
            .with_context(|| format!("cannot create {}", bench.run_dir.display()))?;
        let log = RunLog::create(&bench.run_dir.join("log.jsonl"))?;
        let mut events = Events::new(log, Vec::new());
        // No search chooses the points of a step (they are HEAD's champions); the header's default says so least wrongly.
        let strategy = crate::model::plan::Strategy::default();
        let mut head = shared::header(
            &bench.project,
            &bench.device,
            &bench.run_id,
            &strategy,
            opts.command,
        );
        bench.seed = shared::fresh_run_seed(bench.project.policies.measure.seed, &bench.run_id);
        head.run_seed = Some(bench.seed);
        events.emit(Record::Header(Box::new(head)))?;
        bench.roofs = shared::measure_roofs(
            &bench.project,
            opts.device,
            &opts.executor,
            &mut events,
            None,
        )
        .await?;
        Ok((bench, events))
    }

    pub(crate) fn session<'a>(&'a self, opts: &'a StepOptions) -> Session<'a> {
        Session {
            project: &self.project,
            root: &self.root,
            device: &self.device,
            opts,
            run_dir: &self.run_dir,
            run_id: &self.run_id,
            seed: self.seed,
            roofs: self.roofs.clone(),
        }
    }
}

/// The project root must be the repository's working directory: edit paths are repository-relative.
fn repository_root(project_root: &Path) -> Result<PathBuf> {
    let repo = git2::Repository::discover(project_root).map_err(|e| {
        Error::BadInput(format!(
            "`flashtune step` commits or reverts kernel edits, so {} must be a git repository: {}",
            project_root.display(),
            e.message()
        ))
    })?;
    repo.head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|_| Error::BadInput("the repository has no commit: HEAD's champion is the baseline every edit is judged against; commit the project first".into()))?;
    let workdir = repo
        .workdir()
        .ok_or_else(|| Error::BadInput("bare repository".into()))?;
    let same = |a: &Path, b: &Path| a.canonicalize().ok() == b.canonicalize().ok();
    if !same(workdir, project_root) {
        return Err(Error::BadInput(format!(
            "run `flashtune step` with --root at the repository's top ({}), not {}",
            workdir.display(),
            project_root.display()
        )));
    }
    Ok(workdir.to_path_buf())
}

/// What the tree may hold uncommitted when a session starts. Without a proposer the edit under
/// the scope is what is judged, but what decides how it is judged (the policies, the spaces, the
/// protected kernels) must be committed. With a proposer or an agent, whatever changed is taken for
/// theirs, judged and restored as theirs: the user's work must not be in the tree at all. A resumed
/// session's edit in the scope is its own step in flight, which it finishes.
fn refuse_uncommitted(
    project: &Project,
    root: &Path,
    proposer: bool,
    resuming: bool,
) -> Result<()> {
    let (inside, outside) = changes(project, root)?;
    if proposer {
        let users: Vec<String> = if resuming {
            outside
        } else {
            inside.into_iter().chain(outside).collect()
        };
        if users.is_empty() {
            return Ok(());
        }
        return Err(Error::BadInput(format!(
            "the working tree holds uncommitted changes: {}\n\
             A proposer's or an agent's edit can be told apart from your work only on a clean tree: \
             yours would be judged as its edit and restored with it. Commit them, set them aside \
             with `git stash` (`git stash pop` after the session), or, for an edit under \
             {EDIT_SCOPE}, judge it first with `flashtune judge`; then start the session again.",
            users.join(", ")
        )));
    }
    // The space, and the space its family comes from.
    let spaces: Vec<String> = project
        .space
        .sources()
        .into_iter()
        .map(|(path, _)| {
            path.strip_prefix(root)
                .unwrap_or(path)
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let decides_judging = |p: &String| {
        p == "policies.toml"
            || p.starts_with("variants/")
            || spaces.contains(p)
            || p.starts_with(EDIT_SCOPE)
    };
    let dirty: Vec<String> = outside.into_iter().filter(decides_judging).collect();
    if dirty.is_empty() {
        return Ok(());
    }
    Err(Error::BadInput(format!(
        "uncommitted changes outside the edit scope (kernels/, except {}): {}\n\
         They decide how an edit is judged; commit or revert them first.",
        protected(project).join(" and "),
        dirty.join(", "),
    )))
}
