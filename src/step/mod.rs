//! `flashtune step`: judge the uncommitted edits under `kernels/` against HEAD's champion, commit them or restore HEAD; optionally let a proposer command make the edits, step after step.
//!
//! Trust boundary: the proposer may only change the edit scope (files under `kernels/`, except the
//! champion table and the reference kernel, which is the oracle). HEAD's kernels are built from a
//! copy of HEAD's tree, the edit from the working tree into a cache of its own; both are checked
//! against HEAD's reference on fresh inputs before the interleaved re-timing decides.
use crate::error::{Error, Result};
use crate::gpu::build::{BuildSpec, Builder};
use crate::gpu::decide;
use crate::gpu::executor::Executor;
use crate::log::runlog::{Idea, Record, RunLog};
use crate::model::config::{Dtype, ProjectPaths, Shape};
use crate::model::protocol::*;
use crate::model::space::{DeviceLimits, PlannedPoint, REFERENCE};
use crate::report::champions::Table;
use crate::run::shared::{self, Events, Project, UnitKey};
use anyhow::{anyhow, Context};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

mod attempt;
mod candidate;
mod judge;
mod profile;
mod report;
mod rules;
mod tree;

pub(crate) use attempt::{diff_against, diff_candidate, idea_line, keep_patch, one_line};
pub(crate) use candidate::Candidate;

use judge::build_logged;
pub(crate) use judge::collect_builds;
pub(crate) use report::{step_markdown, DuelRow, Outcome, StepSummary};
use tree::walk;
pub(crate) use tree::{
    extract_tree, file_hash, fingerprint, fingerprint_changes, head_of, put_head_back, restore,
    short,
};

/// Edits are judged only under this folder (repository-relative).
pub const EDIT_SCOPE: &str = "kernels/";

pub struct StepOptions {
    pub paths: ProjectPaths,
    pub space: Option<PathBuf>,
    /// The champion where HEAD's champion table names none.
    pub variant: Option<String>,
    /// A shell command that edits kernels/ before each step.
    pub proposer: Option<String>,
    pub steps: u32,
    pub time_limit: Option<Duration>,
    pub device: u32,
    pub executor: Executor,
    /// Queue behind another flashtune run that holds the GPU, or refuse at once.
    pub when_busy: shared::WhenBusy,
    /// Print nothing on stdout (the caller prints the verdict itself, e.g. as JSON).
    pub quiet: bool,
    /// What the edit tries, in one line (`judge --idea`, the MCP judge's `idea`): the history's entry.
    pub idea: Option<String>,
}

pub struct StepOutcome {
    pub run_dir: PathBuf,
    pub report_markdown: String,
    pub accepted: u32,
    pub rejected: u32,
}

/// What the proposer of an in-place step left: whether it finished, and what it said (the tail).
struct Proposed {
    finished: bool,
    output: String,
}

/// Where the fake GPU commits an accepted edit of step `n`: a scratch reference, never a branch.
/// Synthetic figures must not land where a user would build on them; the commit stays inspectable
/// (`git show refs/flashtune/fake/<run>/step-<n>`) and a session's later steps build on it.
pub fn scratch_ref(run_id: &str, n: u32) -> String {
    format!("refs/flashtune/fake/{run_id}/step-{n}")
}

/// What a step decided, as the next proposer sees it.
#[derive(Debug, Clone)]
struct Decided {
    accepted: bool,
    reason: String,
    report: PathBuf,
}

pub async fn step(opts: StepOptions) -> Result<StepOutcome> {
    if opts.steps > 1 && opts.proposer.is_none() {
        return Err(Error::BadInput(
            "--steps above 1 needs --proposer: without one, every step would judge the same edit"
                .into(),
        ));
    }
    let (bench, mut events) = Bench::open(&opts, opts.proposer.is_some(), None).await?;
    let session = bench.session(&opts);
    let run_dir = bench.run_dir.clone();
    let started = Instant::now();
    let mut last: Option<Decided> = None;
    let mut report = String::new();
    let (mut accepted, mut rejected) = (0, 0);
    for n in 1..=opts.steps {
        if opts
            .time_limit
            .is_some_and(|limit| started.elapsed() >= limit)
        {
            let _ = writeln!(report, "Time limit reached before step {n}.\n");
            break;
        }
        let (decided, markdown) = session.one_step(n, last.as_ref(), &mut events).await?;
        // Printed as each step ends: an unattended loop shows its progress.
        if !opts.quiet {
            println!("{markdown}");
        }
        report.push_str(&markdown);
        report.push('\n');
        if decided.accepted {
            accepted += 1;
        } else {
            rejected += 1;
        }
        last = Some(decided);
    }
    std::fs::write(run_dir.join("report.md"), &report)
        .with_context(|| format!("cannot write {}", run_dir.join("report.md").display()))?;
    Ok(StepOutcome {
        run_dir,
        report_markdown: report,
        accepted,
        rejected,
    })
}

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
        resume: Option<&Path>,
    ) -> Result<(Bench, Events)> {
        let project = Project::load(opts.paths.clone(), opts.space.as_deref())?;
        let root = repository_root(&project.paths.root)?;
        refuse_dirty_outside_scope(&project, &root, proposer)?;
        let repo =
            git2::Repository::open(&root).map_err(|e| Error::Other(anyhow!("{}", e.message())))?;
        rules::refuse_rules_not_at_head(&project, &root, &repo)?;
        let device = opts.executor.probe(opts.device).await.map_err(|reason| {
            Error::NoGpu(format!(
                "{reason}\n`flashtune step` times kernels on an NVIDIA GPU; `--fake-gpu` runs it with the test double"
            ))
        })?;
        let locks = shared::lock_gpus(&[opts.device], opts.executor.is_fake(), opts.when_busy)?;
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
        if let Some(run_dir) = resume {
            let loaded = crate::log::runlog::read(&run_dir.join("log.jsonl"))?;
            let header = loaded
                .header()
                .ok_or_else(|| Error::BadInput(format!("{} has no header", run_dir.display())))?;
            bench.run_id = header.run_id.clone();
            bench.seed = header.run_seed.unwrap_or(0);
            bench.run_dir = run_dir.to_path_buf();
            bench.roofs = crate::report::roofs::Roofs::from_log(&loaded);
            let log = RunLog::reopen(&run_dir.join("log.jsonl"), &loaded)?;
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
        let mut head = shared::header(&bench.project, &bench.device, &bench.run_id, &strategy);
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

/// Paths under kernels/ that an edit may not touch: the table flashtune writes, and the oracle's
/// whole source closure (the reference and every file it includes), with the reference's folder
/// when the kernels judged live elsewhere, so nothing can be slipped in beside it. A path ending in
/// `/` is a folder. Architecture Invariant: no edit that `step`, `judge`, MCP or an agent session
/// judges can change the oracle.
pub(crate) fn protected(project: &Project) -> Vec<String> {
    let mut out = vec![project.champion_table()];
    out.extend(oracle_sources(project));
    out
}

/// The oracle's sources, repository-relative: its folder (when no forward kernel lives there) and
/// every file of its include closure.
pub(crate) fn oracle_sources(project: &Project) -> Vec<String> {
    let family = &project.space.family;
    let reference = family.reference.to_string_lossy().into_owned();
    let mut out = Vec::new();
    let folder = |p: &Path| p.parent().map(|d| d.to_string_lossy().into_owned());
    if let Some(dir) = folder(&family.reference).filter(|d| !d.is_empty()) {
        if folder(&family.forward).as_deref() != Some(dir.as_str()) {
            out.push(format!("{dir}/"));
        }
    }
    out.push(reference);
    let root = &project.paths.root;
    let root_abs = root.canonicalize().unwrap_or_else(|_| root.clone());
    // A closure that cannot be read (the file is gone) protects what it names and no more.
    for file in
        crate::gpu::build::include_closure(&root.join(&family.reference)).unwrap_or_default()
    {
        if let Ok(rel) = file.strip_prefix(&root_abs) {
            let rel = rel.to_string_lossy().into_owned();
            if !out.contains(&rel) {
                out.push(rel);
            }
        }
    }
    out
}

/// Whether `path` (repository-relative) is protected: named, or inside a protected folder.
pub(crate) fn is_protected(project: &Project, path: &str) -> bool {
    protected(project)
        .iter()
        .any(|p| p == path || (p.ends_with('/') && path.starts_with(p.as_str())))
}

/// Of `paths`, the oracle's sources: an edit that touches one is refused naming them.
pub(crate) fn oracle_touched(project: &Project, paths: &[String]) -> Vec<String> {
    let oracle = oracle_sources(project);
    paths
        .iter()
        .filter(|path| {
            oracle
                .iter()
                .any(|p| p == *path || (p.ends_with('/') && path.starts_with(p.as_str())))
        })
        .cloned()
        .collect()
}

/// Why an edit that changed `stray` (paths outside the edit scope) is refused: the oracle's sources
/// by name first, when it touched any.
pub(crate) fn outside_scope_reason(project: &Project, who: &str, stray: &[String]) -> String {
    let oracle = oracle_touched(project, stray);
    if oracle.is_empty() {
        format!(
            "{who} changed files outside the edit scope: {}",
            stray.join(", ")
        )
    } else {
        format!(
            "{who} changed the oracle's sources ({}), which no edit may touch: the reference every \
             edit is judged by is built from them; outside the edit scope: {}",
            oracle.join(", "),
            stray.join(", ")
        )
    }
}

/// Of the changed `paths` under `root`, those that exist as something other than a regular file (a
/// symbolic link, a FIFO, a socket, a folder where git saw a submodule), each with what it is. An
/// edit is regular files only: a link is followed by nvcc, by the judge and by a later checkout
/// to wherever it points, which may lie outside the project.
pub(crate) fn irregular(root: &Path, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter_map(|p| {
            let kind = std::fs::symlink_metadata(root.join(p)).ok()?.file_type();
            let what = if kind.is_file() {
                return None;
            } else if kind.is_symlink() {
                "a symbolic link"
            } else if kind.is_dir() {
                "a folder"
            } else {
                "not a regular file"
            };
            Some(format!("{p} is {what}"))
        })
        .collect()
}

/// Why an edit with `irregular` paths is refused, naming them.
pub(crate) fn irregular_reason(who: &str, irregular: &[String]) -> String {
    format!(
        "{who} left paths that are not regular files ({}): an edit is regular files only",
        irregular.join(", ")
    )
}

pub(crate) fn in_scope(project: &Project, path: &str) -> bool {
    path.starts_with(EDIT_SCOPE) && !is_protected(project, path)
}

/// Changed paths against HEAD (untracked included), split into the edit scope and the rest; runs/ is flashtune's own.
pub(crate) fn changes(project: &Project, root: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let all = crate::os::vcs::changed_against_head(root)
        .map_err(|e| Error::Other(anyhow!("git status: {}", e.message())))?;
    Ok(all
        .into_iter()
        .filter(|p| !p.starts_with("runs/"))
        .partition(|p| in_scope(project, p)))
}

/// What decides a step must be committed: the policies, the spaces, the protected kernels.
/// With a proposer every change outside the scope counts, since its own changes must be told apart.
fn refuse_dirty_outside_scope(project: &Project, root: &Path, proposer: bool) -> Result<()> {
    let (_, outside) = changes(project, root)?;
    let space = project
        .space
        .path
        .strip_prefix(root)
        .unwrap_or(&project.space.path)
        .to_string_lossy()
        .into_owned();
    let matters = |p: &String| {
        proposer
            || p == "policies.toml"
            || p.starts_with("variants/")
            || *p == space
            || p.starts_with(EDIT_SCOPE)
    };
    let dirty: Vec<String> = outside.into_iter().filter(matters).collect();
    if dirty.is_empty() {
        return Ok(());
    }
    Err(Error::BadInput(format!(
        "uncommitted changes outside the edit scope (kernels/, except {}): {}\n\
         They decide how an edit is judged{}; commit or revert them first.",
        protected(project).join(" and "),
        dirty.join(", "),
        if proposer {
            ", and a proposer's changes must be told apart from them"
        } else {
            ""
        }
    )))
}

pub(crate) struct Session<'a> {
    pub(crate) project: &'a Project,
    pub(crate) root: &'a Path,
    pub(crate) device: &'a DeviceInfo,
    pub(crate) opts: &'a StepOptions,
    pub(crate) run_dir: &'a Path,
    pub(crate) run_id: &'a str,
    /// The step run's input seed; each step draws its own sets from it.
    pub(crate) seed: u64,
    /// Roofs measured at the start of the step run: an edit whose figure passes one is rejected.
    pub(crate) roofs: crate::report::roofs::Roofs,
}

/// HEAD's champion for one (shape, dtype), built from HEAD's sources.
pub(crate) struct Pairing {
    pub(crate) shape: Shape,
    pub(crate) dtype: Dtype,
    pub(crate) point: PlannedPoint,
}

/// Files a proposer must leave alone, with what they looked like before it ran.
pub(crate) type Fingerprint = BTreeMap<PathBuf, (u64, i64, i64, i64)>;

impl Session<'_> {
    async fn one_step(
        &self,
        n: u32,
        last: Option<&Decided>,
        events: &mut Events,
    ) -> Result<(Decided, String)> {
        let project = self.project;
        let step_dir = self.run_dir.join(format!("step-{n}"));
        let report_path = self.run_dir.join(format!("step-{n}.md"));
        let repo = git2::Repository::open(self.root)
            .map_err(|e| Error::Other(anyhow!("{}", e.message())))?;
        let (base, base_ref) = head_of(&repo)?;
        let pairings = self.champions(&repo)?;
        // HEAD's side is built before the proposer runs, so the proposer cannot plant its cubins.
        let head_tree = step_dir.join("head");
        extract_tree(&repo, &base, EDIT_SCOPE, &head_tree)?;
        let head_cubins = self.build_head(&pairings, &head_tree, events).await?;
        let mut duels = Vec::new();
        let proposed = match &self.opts.proposer {
            Some(command) => {
                let sources = crate::run::shared::kernel_sources_hash(project, Some(&head_tree));
                self.profile_champions(&pairings, &head_cubins, &sources, events)
                    .await?;
                let p = self
                    .propose(
                        n,
                        command,
                        last,
                        &repo,
                        (&base, &base_ref),
                        &head_cubins,
                        events,
                    )
                    .await?;
                Some(p)
            }
            None => None,
        };
        let (inside, outside) = changes(project, self.root)?;
        let stray: Vec<String> = if proposed.is_some() {
            outside
        } else {
            Vec::new()
        };
        let proposer_failed = proposed.as_ref().is_some_and(|p| !p.finished);
        let edit: Vec<String> = inside.iter().chain(&stray).cloned().collect();
        let not_files = irregular(self.root, &inside);
        // The edit as it is judged and would be committed, read from the working tree once, now.
        let candidate =
            if not_files.is_empty() && stray.is_empty() && !proposer_failed && !inside.is_empty() {
                Some(Candidate::snapshot(&repo, &base, self.root, &inside)?)
            } else {
                None
            };
        let diff = match &candidate {
            Some(c) => attempt::diff_candidate(&repo, c, |p| in_scope(project, p))?,
            None => attempt::diff_against(
                self.root,
                &base,
                |p| in_scope(project, p),
                |p| !edit.iter().any(|e| e == p),
            )?,
        };
        if !edit.is_empty() {
            attempt::keep_patch(self.run_dir, n, None, &diff.patch)?;
        }
        let idea = self
            .opts
            .idea
            .as_deref()
            .and_then(attempt::one_line)
            .map(|summary| Idea {
                summary,
                from: "caller".into(),
            })
            .or_else(|| {
                let said = attempt::idea_line(&proposed.as_ref()?.output)?;
                Some(Idea {
                    summary: said,
                    from: "agent".into(),
                })
            })
            .or_else(|| (!edit.is_empty()).then(|| diff.as_idea()));
        events.emit(Record::StepStarted {
            step: n,
            base_commit: base.clone(),
            changed_files: edit.clone(),
            diff_stat: Some(diff.stat.clone()),
            patch: (!edit.is_empty()).then(|| diff.bounded()),
            idea,
        })?;
        if !edit.is_empty() {
            eprintln!(
                "step {n}: {} against HEAD {} ({})",
                edit.join(", "),
                short(&base),
                diff.stat
            );
        }
        let outcome = if !not_files.is_empty() {
            restore(self.root, &edit)?;
            Outcome::rejected(
                format!(
                    "{}; all its changes were restored",
                    irregular_reason(
                        if proposed.is_some() {
                            "the proposer"
                        } else {
                            "the edit"
                        },
                        &not_files
                    )
                ),
                None,
                edit.clone(),
            )
        } else if !stray.is_empty() {
            // The proposer stepped outside its scope: undo all of it, judge nothing.
            restore(self.root, &edit)?;
            Outcome::rejected(
                format!(
                    "{}; all its changes were restored",
                    outside_scope_reason(self.project, "the proposer", &stray)
                ),
                None,
                edit.clone(),
            )
        } else if proposer_failed {
            // A proposer that failed or ran out of time may have left half an edit.
            restore(self.root, &inside)?;
            let refused = proposed
                .as_ref()
                .and_then(|p| crate::run::sandbox::refusal_note(&p.output, EDIT_SCOPE))
                .map_or(String::new(), |note| format!("; {note}"));
            Outcome::rejected(
                format!("the proposer did not finish cleanly (see proposer_ran); its edits were restored unjudged{refused}"),
                None,
                inside.clone(),
            )
        } else if let Some(candidate) = &candidate {
            let judged = self
                .judge_edit(
                    n,
                    &pairings,
                    &head_cubins,
                    &step_dir,
                    candidate,
                    events,
                    &mut duels,
                )
                .await?;
            match judged {
                Ok(overall) if overall.accept => {
                    self.keep_in_place(n, &repo, candidate, &overall, &duels)?
                }
                Ok(overall) => {
                    restore(self.root, &inside)?;
                    Outcome::rejected(overall.reason, Some(overall.geomean_gain), inside.clone())
                }
                Err(why) => {
                    restore(self.root, &inside)?;
                    Outcome::rejected(why, None, inside.clone())
                }
            }
        } else {
            Outcome::rejected("no edits under kernels/ to judge".into(), None, Vec::new())
        };
        eprintln!(
            "step {n}: {}: {}",
            if outcome.accepted {
                "accepted"
            } else {
                "rejected"
            },
            outcome.reason.lines().next().unwrap_or("")
        );
        events.emit(Record::StepDecided {
            step: n,
            accepted: outcome.accepted,
            reason: outcome.reason.clone(),
            geomean_gain: outcome.geomean_gain,
            commit: outcome.commit.clone(),
            restored: outcome.restored.clone(),
            candidate: None,
            scratch_ref: outcome.scratch_ref.clone(),
        })?;
        let markdown = step_markdown(&StepSummary {
            step: n,
            base: &base,
            device: self.device,
            files: &inside,
            outcome: &outcome,
            duels: &duels,
        });
        std::fs::write(&report_path, &markdown)
            .with_context(|| format!("cannot write {}", report_path.display()))?;
        Ok((
            Decided {
                accepted: outcome.accepted,
                reason: outcome.reason,
                report: report_path,
            },
            markdown,
        ))
    }

    /// Run the proposer, then check it left flashtune's files and HEAD alone; `Err` stops the run.
    #[allow(clippy::too_many_arguments)]
    async fn propose(
        &self,
        n: u32,
        command: &str,
        last: Option<&Decided>,
        repo: &git2::Repository,
        (base, base_ref): (&str, &str),
        head_cubins: &BTreeMap<UnitKey, PathBuf>,
        events: &mut Events,
    ) -> Result<Proposed> {
        let guarded = self.guarded_files(head_cubins);
        let before = fingerprint(&guarded);
        let log_before = file_hash(&events.log.path);
        eprintln!("step {n}: the proposer runs");
        let ran = self.run_proposer(n, command, last).await?;
        // What the tool trusts and did not build: the worker binary and the toolchain.
        self.opts
            .executor
            .check_untouched()
            .and(self.project.toolchain.check_untouched())
            .map_err(|t| Error::Other(anyhow!("{t}")))?;
        let tampered = fingerprint_changes(&before, &fingerprint(&guarded));
        if file_hash(&events.log.path) != log_before || !tampered.is_empty() {
            return Err(Error::Other(anyhow!(
                "the proposer modified flashtune's run files ({}); the run log can no longer be trusted, stopping",
                if tampered.is_empty() {
                    "log.jsonl".to_owned()
                } else {
                    tampered.join(", ")
                }
            )));
        }
        let proposed = match &ran {
            Record::ProposerRan {
                status,
                timed_out,
                output_tail,
                ..
            } => Proposed {
                finished: !timed_out && status == "exit status: 0",
                output: output_tail.clone(),
            },
            _ => unreachable!("run_proposer returns proposer_ran"),
        };
        events.emit(ran)?;
        let (now, now_ref) = head_of(repo)?;
        if now != base || now_ref != base_ref {
            let reason = format!(
                "the proposer moved HEAD ({base_ref} {}) to ({now_ref} {}); flashtune commits accepted edits itself. \
                 HEAD was put back; the proposer's commit stays reachable as {now}",
                short(base),
                short(&now)
            );
            put_head_back(repo, base_ref, base)?;
            let (inside, outside) = changes(self.project, self.root)?;
            let left: Vec<String> = inside.into_iter().chain(outside).collect();
            restore(self.root, &left)?;
            events.emit(Record::StepDecided {
                step: n,
                accepted: false,
                reason: reason.clone(),
                geomean_gain: None,
                commit: None,
                restored: left,
                candidate: None,
                scratch_ref: None,
            })?;
            return Err(Error::Other(anyhow!("{reason}")));
        }
        Ok(proposed)
    }

    /// Commit an accepted in-place edit, as the tree it was judged from: on a GPU onto the current
    /// branch (HEAD moves); on the fake GPU onto the scratch reference `scratch_ref`, never a
    /// branch, the working tree back at HEAD.
    fn keep_in_place(
        &self,
        n: u32,
        repo: &git2::Repository,
        candidate: &Candidate,
        overall: &decide::Overall,
        duels: &[DuelRow],
    ) -> Result<Outcome> {
        let message = self.commit_message(n, &candidate.files, overall, duels);
        let (commit, restored, reference) = if self.device.fake {
            let reference = scratch_ref(self.run_id, n);
            let commit = candidate.commit(repo, &message, Some(&reference))?;
            restore(self.root, &candidate.files)?;
            (commit, candidate.files.clone(), Some(reference))
        } else {
            (candidate.commit(repo, &message, None)?, Vec::new(), None)
        };
        Ok(Outcome {
            accepted: true,
            reason: overall.reason.clone(),
            geomean_gain: Some(overall.geomean_gain),
            commit: Some(commit),
            restored,
            scratch_ref: reference,
        })
    }

    /// Per (shape, dtype): the variant HEAD's champion table names, else `--variant`, else the space's default.
    pub(crate) fn champions(&self, repo: &git2::Repository) -> Result<Vec<Pairing>> {
        let limits = DeviceLimits {
            max_threads_per_block: self.device.max_threads_per_block,
            max_smem_optin_bytes: self.device.max_smem_optin_bytes,
            arch: self.device.arch.clone(),
        };
        champions_for(self.project, &limits, self.opts.variant.as_deref(), repo)
    }

    fn specs(&self, pairings: &[Pairing], tree: &Path, tag: &str) -> Vec<(UnitKey, BuildSpec)> {
        let project = self.project;
        let arch = &self.device.arch;
        let mut specs = BTreeMap::new();
        for p in pairings {
            let mut spec = project.forward_spec(&p.point, p.dtype, arch);
            spec.source = tree.join(&project.space.family.forward);
            specs.insert(
                (
                    format!("{}@{tag}", p.point.variant.id),
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
        let mut specs = self.specs(pairings, head_tree, "head");
        for &d in &project.policies.dtypes {
            let mut spec = project.reference_spec(d, &self.device.arch);
            spec.source = head_tree.join(&project.space.family.reference);
            specs.push(((REFERENCE.into(), d, 0), spec));
        }
        let builder = Builder {
            confine: Some(head_tree.to_path_buf()),
            ..project.builder()
        };
        let built = build_logged(builder, project.jobs(), specs, events).await?;
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

    /// The run folder and the cubins HEAD's side will use.
    fn guarded_files(&self, head_cubins: &BTreeMap<UnitKey, PathBuf>) -> Vec<PathBuf> {
        let mut files = walk(self.run_dir);
        files.push(self.run_dir.to_path_buf());
        files.extend(head_cubins.values().cloned());
        files
    }

    async fn run_proposer(&self, n: u32, command: &str, last: Option<&Decided>) -> Result<Record> {
        let timeout = Duration::from_secs(self.project.policies.step.proposer_timeout_s);
        let mut cmd = crate::os::stop::guarded_shell(command)
            .with_context(|| format!("cannot start the proposer `{command}`"))?;
        cmd.current_dir(self.root)
            .env("FLASHTUNE_STEP", n.to_string())
            .env("FLASHTUNE_STEPS", self.opts.steps.to_string())
            .env("FLASHTUNE_RUN_DIR", self.run_dir)
            .env("FLASHTUNE_EDIT_SCOPE", EDIT_SCOPE)
            .env("FLASHTUNE_PROTECTED", protected(self.project).join(" "))
            .env(
                "FLASHTUNE_THRESHOLD",
                self.project.policies.step.threshold.to_string(),
            )
            .env(
                "FLASHTUNE_LAST_VERDICT",
                last.map_or("none", |d| if d.accepted { "accepted" } else { "rejected" }),
            )
            .env(
                "FLASHTUNE_LAST_REASON",
                last.map_or("", |d| d.reason.as_str()),
            )
            .env(
                "FLASHTUNE_LAST_REPORT",
                last.map_or(PathBuf::new(), |d| d.report.clone()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group (the guard's): the timeout, the end of the step, and flashtune's death
            // stop whatever it started.
            .kill_on_drop(true);
        // It writes the edit scope and a scratch folder, nothing else (src/sandbox.rs).
        let scope = self.root.join(EDIT_SCOPE);
        let _scratch = crate::run::sandbox::confine(
            &mut cmd,
            self.project,
            self.opts.executor.exe(),
            &[(&scope, "the edit scope")],
            &format!("{}-step-{n}", self.run_id),
        )?;
        let started = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the proposer `{command}`"))?;
        let group = crate::gpu::build::ProcessGroup(child.id());
        let waited = tokio::time::timeout(timeout, child.wait_with_output()).await;
        // Nothing it left running in the background may edit files while the step is judged.
        drop(group);
        let (status, timed_out, output) = match waited {
            Err(_) => (
                format!("killed after {} s", timeout.as_secs()),
                true,
                String::new(),
            ),
            Ok(Err(e)) => (format!("wait failed: {e}"), false, String::new()),
            Ok(Ok(out)) => (
                out.status.to_string(),
                false,
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            ),
        };
        Ok(Record::ProposerRan {
            step: n,
            command: command.to_owned(),
            seconds: started.elapsed().as_secs_f64(),
            status,
            timed_out,
            output_tail: crate::gpu::build::log_tail(&output, 40),
        })
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
                    Error::BadInput(format!(
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
                    "champion `{variant}` cannot run shape {} (d={}): {why}",
                    shape.name, shape.d
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
