//! `flashtune mcp`: the step verdict, the profiler, the step history and the rules as MCP tools over stdio, for coding agents; and the snippets that register the server with them.
//!
//! The server judges through the same `flashtune step` the command line runs, as a child process:
//! the verdict, the commit and the restore stay flashtune's, a crash in a judge cannot take the
//! server down, and nothing but the protocol ever reaches stdout. A judge or a profile is a job:
//! the call waits a bounded time (sending progress notifications), then hands back the job's id
//! to poll with `judge_status`, so no client's tool timeout cuts a verdict in half.
use crate::config::ProjectPaths;
use crate::error::{Error, Result};
use crate::run::Project;
use crate::runlog::Record;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolResult, Implementation, ProgressNotificationParam, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::schemars::{self, JsonSchema};
use rmcp::{tool, tool_handler, tool_router, Peer, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a call waits for its job by default: under Codex's 60 s default tool timeout.
const DEFAULT_WAIT_S: u64 = 45;
/// The longest a call may ask to wait (Gemini CLI's default tool timeout is 10 minutes).
const MAX_WAIT_S: u64 = 540;
/// How often a waiting call tells the client the job is alive.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Steps `history` returns unless asked for more.
const DEFAULT_HISTORY: usize = 20;

pub struct McpOptions {
    pub paths: ProjectPaths,
    /// Judge and profile on the test double: figures are synthetic and labelled so.
    pub fake_gpu: bool,
}

/// Serve MCP on stdin/stdout until the client closes the connection.
pub async fn serve(opts: McpOptions) -> Result<()> {
    let server = Workbench::new(opts)?;
    let service = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::Other(anyhow::anyhow!("MCP handshake failed: {e}")))?;
    service
        .waiting()
        .await
        .map_err(|e| Error::Other(anyhow::anyhow!("MCP server stopped: {e}")))?;
    Ok(())
}

/// The server's state: the project, the jobs, and what lay outside the edit scope when it started.
#[derive(Clone)]
pub struct Workbench {
    root: PathBuf,
    paths: ProjectPaths,
    fake_gpu: bool,
    /// This very binary: judges run `flashtune step` through it.
    binary: PathBuf,
    /// Changes outside the edit scope that were there before any agent could act (the user's own,
    /// the MCP snippet itself): path → content then (None: deleted). Anything else outside the
    /// scope at judge time is the agent's, and is undone.
    baseline: Arc<BTreeMap<String, Option<Vec<u8>>>>,
    jobs: Arc<Mutex<Jobs>>,
    tool_router: ToolRouter<Self>,
}

#[derive(Default)]
struct Jobs {
    next: u32,
    all: BTreeMap<String, Job>,
    /// The job that holds the GPU; one at a time, as `flashtune step` and `profile` need it whole.
    running: Option<String>,
}

#[derive(Clone)]
struct Job {
    kind: &'static str,
    started: Instant,
    state: watch::Receiver<JobState>,
}

#[derive(Clone, Debug)]
enum JobState {
    Running { phase: String },
    Done { result: Value, is_error: bool },
}

/// A structured error the agent can act on: a code to branch on and a sentence to read.
fn refusal(code: &str, message: impl Into<String>, extra: Value) -> CallToolResult {
    let mut body = json!({ "error": { "code": code, "message": message.into() } });
    if let (Some(error), Value::Object(extra)) = (body["error"].as_object_mut(), extra) {
        error.extend(extra);
    }
    CallToolResult::structured_error(body)
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct JudgeArgs {
    /// Variant space whose shapes are the cases judged, relative to the project root (default:
    /// policies.toml's default_space). Must lie inside the project.
    #[serde(default)]
    pub space: Option<String>,
    /// The champion variant where HEAD's champion table names none (an id of the space, e.g.
    /// `scalar-bm64-bn64-w4-ks1-s1`).
    #[serde(default)]
    pub variant: Option<String>,
    /// Seconds to wait for the verdict before returning the job id to poll (default 45, at most 540).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StatusArgs {
    /// The job id `judge` or `profile` returned (e.g. `judge-1`).
    pub job: String,
    /// Seconds to wait for the job to end before answering "running" again (default 45, at most 540).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProfileArgs {
    /// Variant id as the run logged it (e.g. `mma-bm128-bn64-w4-auto-s2`).
    pub variant: String,
    /// Shape name from policies.toml (e.g. `small`).
    pub shape: String,
    /// `f16` or `bf16` (default f16).
    #[serde(default)]
    pub dtype: Option<String>,
    /// The run the variant was built and timed in: its id or folder under runs/ (default: the
    /// newest run that timed the variant).
    #[serde(default)]
    pub run: Option<String>,
    /// Seconds to wait before returning the job id to poll (default 45, at most 540).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryArgs {
    /// How many of the most recent steps to return (default 20).
    #[serde(default)]
    pub last: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ContextArgs {
    /// Variant space to describe (default: policies.toml's default_space).
    #[serde(default)]
    pub space: Option<String>,
}

#[tool_router]
impl Workbench {
    pub fn new(opts: McpOptions) -> Result<Self> {
        let root = opts.paths.root.clone();
        let baseline = outside_scope_now(&root).unwrap_or_default();
        let binary = std::env::current_exe().map_err(|e| {
            Error::Other(anyhow::anyhow!("cannot find flashtune's own binary: {e}"))
        })?;
        Ok(Workbench {
            root,
            paths: opts.paths,
            fake_gpu: opts.fake_gpu,
            binary,
            baseline: Arc::new(baseline),
            jobs: Arc::new(Mutex::new(Jobs::default())),
            tool_router: Self::tool_router(),
        })
    }

    #[tool(
        description = "Judge the uncommitted edit under kernels/ against HEAD's champion, exactly as `flashtune step` does: build HEAD's champion and the edit, check both on fresh inputs with poisoned outputs, re-time them interleaved on every shape and dtype. A faster edit (beyond noise, no case slower) is committed by flashtune; anything else is restored to HEAD. Changes outside kernels/ (or to kernels/attention/tuned.toml or the reference kernel) reject the edit unjudged and are undone, all of them. Returns {status: \"done\", accepted, reason, geomean_gain, commit, restored, cases[]}; if the verdict takes longer than wait_s, returns {status: \"running\", job} instead: call judge_status with that job. Only one judge or profile runs at a time. Do not commit yourself."
    )]
    async fn judge(
        &self,
        Parameters(args): Parameters<JudgeArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let wait = wait_of(args.wait_s);
        if let Some(busy) = self.busy() {
            return Ok(busy);
        }
        let mut command = vec!["step".to_owned()];
        if let Some(space) = &args.space {
            match self.inside_project(space) {
                Ok(_) => command.extend(["--space".to_owned(), space.clone()]),
                Err(refused) => return Ok(refused),
            }
        }
        let project = match Project::load(self.paths.clone(), args.space.as_deref().map(Path::new))
        {
            Ok(p) => p,
            // An agent that broke policies.toml stepped outside its scope: undo that first.
            Err(e) => {
                return Ok(self
                    .undo_stray_changes(None)
                    .unwrap_or_else(|| refusal("bad_project", e.to_string(), json!({}))))
            }
        };
        if let Some(variant) = &args.variant {
            let known: Vec<String> = project
                .space
                .variants()
                .map(|vs| vs.into_iter().map(|v| v.id).collect())
                .unwrap_or_default();
            if !known.contains(variant) {
                return Ok(refusal(
                    "unknown_variant",
                    format!(
                        "`{variant}` is not a variant of space `{}`",
                        project.space.name
                    ),
                    json!({ "known": known }),
                ));
            }
            command.extend(["--variant".to_owned(), variant.clone()]);
        }
        if let Some(verdict) = self.undo_stray_changes(Some(&project)) {
            return Ok(verdict);
        }
        if self.fake_gpu {
            command.push("--fake-gpu".to_owned());
        }
        let job = match self.start_job("judge", command, read_verdict) {
            Ok(job) => job,
            Err(busy) => return Ok(busy),
        };
        Ok(self.wait_for(&job, wait, meta, peer).await)
    }

    #[tool(
        description = "Wait for a job that judge or profile started, and return its result once it ends: the same JSON judge or profile would have returned. While it still runs after wait_s, returns {status: \"running\", job, seconds, phase}; call again."
    )]
    async fn judge_status(
        &self,
        Parameters(args): Parameters<StatusArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let known = self
            .jobs
            .lock()
            .expect("jobs lock")
            .all
            .contains_key(&args.job);
        if !known {
            let ids: Vec<String> = self
                .jobs
                .lock()
                .expect("jobs lock")
                .all
                .keys()
                .cloned()
                .collect();
            return Ok(refusal(
                "unknown_job",
                format!("no job `{}` was started by this server", args.job),
                json!({ "jobs": ids }),
            ));
        }
        Ok(self
            .wait_for(&args.job, wait_of(args.wait_s), meta, peer)
            .await)
    }

    #[tool(
        description = "Nsight Compute digest of one variant on one shape and dtype, from a run that built and timed it: per-kernel metrics with units (SM and DRAM throughput, occupancy, tensor pipe, waves, registers) and the bottleneck flashtune's rules name. On the fake GPU the figures are the test double's and are labelled synthetic. Returns {status: \"done\", profile, ...} or {status: \"running\", job} to poll with judge_status."
    )]
    async fn profile(
        &self,
        Parameters(args): Parameters<ProfileArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let wait = wait_of(args.wait_s);
        if let Some(busy) = self.busy() {
            return Ok(busy);
        }
        let dtype = args.dtype.clone().unwrap_or_else(|| "f16".to_owned());
        if !["f16", "bf16"].contains(&dtype.as_str()) {
            return Ok(refusal(
                "bad_argument",
                format!("dtype `{dtype}`: f16 or bf16"),
                json!({}),
            ));
        }
        let run_dir = match &args.run {
            Some(run) => match self.run_folder(run) {
                Ok(dir) => dir,
                Err(refused) => return Ok(refused),
            },
            None => match self.newest_run_timing(&args.variant) {
                Some(dir) => dir,
                None => {
                    return Ok(refusal(
                        "no_run",
                        format!(
                            "no run under runs/ timed `{}`: profile needs a run that built it (`flashtune tune`)",
                            args.variant
                        ),
                        json!({ "variants_timed": self.variants_timed() }),
                    ))
                }
            },
        };
        let (log, header) = match crate::engine::read_run(&run_dir) {
            Ok(x) => x,
            Err(e) => return Ok(refusal("bad_run", e.to_string(), json!({}))),
        };
        let timed: Vec<String> = timed_variants(&log);
        if !timed.contains(&args.variant) {
            return Ok(refusal(
                "unknown_variant",
                format!("run {} did not time `{}`", header.run_id, args.variant),
                json!({ "known": timed }),
            ));
        }
        if !header.shapes.iter().any(|s| s.name == args.shape) {
            let shapes: Vec<&str> = header.shapes.iter().map(|s| s.name.as_str()).collect();
            return Ok(refusal(
                "unknown_shape",
                format!("run {} has no shape `{}`", header.run_id, args.shape),
                json!({ "known": shapes }),
            ));
        }
        let mut command = vec![
            "profile".to_owned(),
            run_dir.display().to_string(),
            args.variant.clone(),
            "--shape".to_owned(),
            args.shape.clone(),
            "--dtype".to_owned(),
            dtype.clone(),
        ];
        if self.fake_gpu {
            command.push("--fake-gpu".to_owned());
        }
        let (variant, shape) = (args.variant.clone(), args.shape.clone());
        let interpret = move |ended: Ended| read_profile(ended, &run_dir, &variant, &shape, &dtype);
        let job = match self.start_job("profile", command, interpret) {
            Ok(job) => job,
            Err(busy) => return Ok(busy),
        };
        Ok(self.wait_for(&job, wait, meta, peer).await)
    }

    #[tool(
        description = "Every earlier step and candidate on this repository, across sessions and agent sessions, newest last: the files each edit changed and its diff stat (the patch for the latest), its verdict (committed, accepted, rejected, dropped, unfinished) and reason, geomean gain, the commit it became, per case the champion's and the edit's median µs, and what it cost (agent and GPU seconds, tokens, dollars). Read it before editing so you do not try again what was rejected."
    )]
    async fn history(
        &self,
        Parameters(args): Parameters<HistoryArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let steps = history_values(&self.paths.runs());
        let last = args.last.unwrap_or(DEFAULT_HISTORY);
        let shown: Vec<Value> = steps.iter().rev().take(last).rev().cloned().collect();
        Ok(CallToolResult::structured(json!({
            "total": steps.len(),
            "steps": shown,
        })))
    }

    #[tool(
        description = "The standing rules and this repository's task: what you may edit (kernels/, except the champion table and the reference kernel), how an edit is judged and what gets it rejected, the shapes and dtypes it is judged on, HEAD's champion table, and the last few steps. Read it first."
    )]
    async fn context(
        &self,
        Parameters(args): Parameters<ContextArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        if let Some(space) = &args.space {
            if let Err(refused) = self.inside_project(space) {
                return Ok(refused);
            }
        }
        let project = match Project::load(self.paths.clone(), args.space.as_deref().map(Path::new))
        {
            Ok(p) => p,
            Err(e) => return Ok(refusal("bad_project", e.to_string(), json!({}))),
        };
        Ok(CallToolResult::structured(self.context_of(&project)))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Workbench {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("flashtune", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "flashtune judges CUDA attention kernel edits. Call `context` first, then `history`. \
                 Edit files under kernels/ only, then call `judge`: flashtune builds, checks and times \
                 your edit against HEAD's champion and commits it only if it is faster beyond noise; \
                 otherwise it restores the files. Never commit yourself.",
            )
    }
}

/// How a job's child process ended.
struct Ended {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

fn wait_of(asked: Option<u64>) -> Duration {
    Duration::from_secs(asked.unwrap_or(DEFAULT_WAIT_S).min(MAX_WAIT_S))
}

impl Workbench {
    fn busy(&self) -> Option<CallToolResult> {
        let jobs = self.jobs.lock().expect("jobs lock");
        let id = jobs.running.as_ref()?;
        let job = &jobs.all[id];
        Some(refusal(
            "busy",
            format!(
                "{} job `{id}` is still running ({:.0} s); one judge or profile at a time holds the GPU. Poll it with judge_status.",
                job.kind,
                job.started.elapsed().as_secs_f64()
            ),
            json!({ "job": id }),
        ))
    }

    /// A path an agent names must stay inside the project: no absolute path elsewhere, no `..` out.
    fn inside_project(&self, given: &str) -> std::result::Result<PathBuf, CallToolResult> {
        let path = Path::new(given);
        let joined = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        };
        let mut normal = PathBuf::new();
        for c in joined.components() {
            match c {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        let root = self
            .root
            .canonicalize()
            .unwrap_or_else(|_| self.root.clone());
        let real = normal.canonicalize().unwrap_or(normal);
        if real.starts_with(&root) {
            Ok(real)
        } else {
            Err(refusal(
                "path_outside_project",
                format!(
                    "`{given}` lies outside the project {}; name files relative to it",
                    root.display()
                ),
                json!({}),
            ))
        }
    }

    fn run_folder(&self, given: &str) -> std::result::Result<PathBuf, CallToolResult> {
        let dir = if given.contains('/') {
            self.inside_project(given)?
        } else {
            self.paths.runs().join(given)
        };
        if !dir.join("log.jsonl").is_file() {
            return Err(refusal(
                "no_run",
                format!("no run log at {}", dir.join("log.jsonl").display()),
                json!({}),
            ));
        }
        Ok(dir)
    }

    fn runs_newest_first(&self) -> Vec<PathBuf> {
        let mut runs: Vec<PathBuf> = std::fs::read_dir(self.paths.runs())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        runs.retain(|p| p.join("log.jsonl").is_file());
        runs.sort();
        runs.reverse();
        runs
    }

    fn newest_run_timing(&self, variant: &str) -> Option<PathBuf> {
        self.runs_newest_first().into_iter().find(|dir| {
            crate::runlog::read(&dir.join("log.jsonl"))
                .is_ok_and(|log| timed_variants(&log).iter().any(|v| v == variant))
        })
    }

    fn variants_timed(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .runs_newest_first()
            .iter()
            .filter_map(|dir| crate::runlog::read(&dir.join("log.jsonl")).ok())
            .flat_map(|log| timed_variants(&log))
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Changes outside the edit scope that were not there when the server started are the agent's:
    /// undo them and every edit inside the scope too (half an edit is not judged), and say so.
    /// Without a project (its policies do not load), only `kernels/` is in scope.
    fn undo_stray_changes(&self, project: Option<&Project>) -> Option<CallToolResult> {
        let changed = match crate::vcs::changed_against_head(&self.root) {
            Ok(c) => c,
            Err(e) => {
                return Some(refusal(
                    "not_a_repository",
                    format!("judge commits or restores through git: {}", e.message()),
                    json!({}),
                ))
            }
        };
        let (inside, outside): (Vec<String>, Vec<String>) = changed
            .into_iter()
            .filter(|p| !p.starts_with("runs/"))
            .partition(|p| match project {
                Some(project) => crate::step::in_scope(project, p),
                None => p.starts_with(crate::step::EDIT_SCOPE),
            });
        let stray: Vec<String> = outside
            .into_iter()
            .filter(|p| self.baseline.get(p) != Some(&read_opt(&self.root.join(p))))
            .collect();
        if stray.is_empty() {
            return None;
        }
        let mut failed = Vec::new();
        let mut to_head: Vec<String> = inside.clone();
        for p in &stray {
            match self.baseline.get(p) {
                Some(Some(bytes)) => {
                    if let Err(e) = std::fs::write(self.root.join(p), bytes) {
                        failed.push(format!("{p}: {e}"));
                    }
                }
                Some(None) => {
                    let _ = std::fs::remove_file(self.root.join(p));
                }
                None => to_head.push(p.clone()),
            }
        }
        if let Err(e) = crate::vcs::restore_paths(&self.root, &to_head) {
            failed.push(e.message().to_owned());
        }
        let restored: Vec<String> = inside.iter().chain(&stray).cloned().collect();
        let reason = format!(
            "changes outside the edit scope ({}, except {}): {}; all the edit's changes were restored unjudged",
            crate::step::EDIT_SCOPE,
            project.map_or("nothing".to_owned(), |p| crate::step::protected(p).join(" and ")),
            stray.join(", ")
        );
        if !failed.is_empty() {
            return Some(refusal(
                "restore_failed",
                format!(
                    "{reason}; but some could not be restored: {}",
                    failed.join("; ")
                ),
                json!({ "restored": restored }),
            ));
        }
        Some(CallToolResult::structured(json!({
            "status": "done",
            "accepted": false,
            "verdict": "rejected",
            "reason": reason,
            "geomean_gain": null,
            "commit": null,
            "restored": restored,
            "changed_files": restored,
            "cases": [],
        })))
    }

    /// Start `flashtune <command>` as the GPU's one job; `interpret` turns its end into the tool's answer.
    fn start_job(
        &self,
        kind: &'static str,
        command: Vec<String>,
        interpret: impl FnOnce(Ended) -> (Value, bool) + Send + 'static,
    ) -> std::result::Result<String, CallToolResult> {
        let (tx, rx) = watch::channel(JobState::Running {
            phase: "starting".into(),
        });
        let id = {
            let mut jobs = self.jobs.lock().expect("jobs lock");
            if jobs.running.is_some() {
                drop(jobs);
                return Err(self.busy().expect("a job runs"));
            }
            jobs.next += 1;
            let id = format!("{kind}-{}", jobs.next);
            jobs.all.insert(
                id.clone(),
                Job {
                    kind,
                    started: Instant::now(),
                    state: rx,
                },
            );
            jobs.running = Some(id.clone());
            id
        };
        let runs_before: Vec<PathBuf> = self.runs_newest_first();
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .args(&command)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        crate::build::die_with_parent(&mut cmd);
        let jobs = self.jobs.clone();
        let this = self.clone();
        let job_id = id.clone();
        tokio::spawn(async move {
            let ended = match cmd.spawn() {
                Err(e) => Ended {
                    status: None,
                    stdout: String::new(),
                    stderr: format!("cannot start {}: {e}", this.binary.display()),
                },
                Ok(child) => {
                    let output = child.wait_with_output();
                    tokio::pin!(output);
                    loop {
                        tokio::select! {
                            out = &mut output => break match out {
                                Ok(o) => Ended {
                                    status: o.status.code(),
                                    stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                                    stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                                },
                                Err(e) => Ended { status: None, stdout: String::new(), stderr: format!("wait failed: {e}") },
                            },
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                                if let Some(phase) = this.phase_since(&runs_before) {
                                    let _ = tx.send(JobState::Running { phase });
                                }
                            }
                        }
                    }
                }
            };
            let (result, is_error) = interpret(ended);
            let _ = tx.send(JobState::Done { result, is_error });
            let mut jobs = jobs.lock().expect("jobs lock");
            if jobs.running.as_deref() == Some(job_id.as_str()) {
                jobs.running = None;
            }
        });
        Ok(id)
    }

    /// What the job's run log says it is doing: the newest run folder, its last record.
    fn phase_since(&self, before: &[PathBuf]) -> Option<String> {
        let dir = self
            .runs_newest_first()
            .into_iter()
            .find(|d| !before.contains(d))?;
        let log = crate::runlog::read(&dir.join("log.jsonl")).ok()?;
        let (_, last) = log.entries.last()?;
        let value = serde_json::to_value(&last.record).ok()?;
        let event = value.get("event")?.as_str()?.to_owned();
        let about = ["variant", "shape", "step"]
            .iter()
            .filter_map(|k| {
                value
                    .get(*k)
                    .map(|v| v.to_string().trim_matches('"').to_owned())
            })
            .collect::<Vec<_>>()
            .join(" ");
        Some(format!("{event} {about}").trim().to_owned())
    }

    /// Wait up to `wait` for the job, telling the client every few seconds that it is alive.
    async fn wait_for(
        &self,
        id: &str,
        wait: Duration,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> CallToolResult {
        let job = self.jobs.lock().expect("jobs lock").all[id].clone();
        let mut state = job.state.clone();
        let token = meta.get_progress_token();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let JobState::Done { result, is_error } = &*state.borrow() {
                return if *is_error {
                    CallToolResult::structured_error(result.clone())
                } else {
                    CallToolResult::structured(result.clone())
                };
            }
            let phase = match &*state.borrow() {
                JobState::Running { phase } => phase.clone(),
                JobState::Done { .. } => String::new(),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return CallToolResult::structured(json!({
                    "status": "running",
                    "job": id,
                    "seconds": job.started.elapsed().as_secs_f64().round(),
                    "phase": phase,
                    "next": format!("call judge_status with job `{id}` to wait for the result"),
                }));
            }
            let tick = (now + PROGRESS_EVERY).min(deadline);
            tokio::select! {
                changed = state.changed() => {
                    // The job's task ended without a result (it panicked): say so rather than spin.
                    if changed.is_err() && !matches!(&*state.borrow(), JobState::Done { .. }) {
                        return refusal(
                            "job_lost",
                            format!("job `{id}` ended without a result; see the server's stderr"),
                            json!({}),
                        );
                    }
                }
                _ = tokio::time::sleep_until(tick) => {
                    if let Some(token) = &token {
                        let _ = peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), job.started.elapsed().as_secs_f64().round())
                                    .with_message(format!("{} {id}: {phase}", job.kind)),
                            )
                            .await;
                    }
                }
            }
        }
    }

    fn context_of(&self, project: &Project) -> Value {
        let table_path = project.champion_table();
        let table = git2::Repository::open(&self.root).ok().and_then(|repo| {
            let tree = repo.head().ok()?.peel_to_tree().ok()?;
            let entry = tree.get_path(Path::new(&table_path)).ok()?;
            let blob = repo.find_blob(entry.id()).ok()?;
            Some(String::from_utf8_lossy(blob.content()).into_owned())
        });
        let shapes: Vec<Value> = project
            .shapes
            .iter()
            .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
            .collect();
        let steps = history_values(&self.paths.runs());
        let recent: Vec<Value> = steps.iter().rev().take(5).rev().cloned().collect();
        // The same pack an agent session writes into its work directory (PROMPT.md's figures,
        // roofs, bottleneck and guided next moves); a project with no run yet still gets the rules.
        let pack = crate::agent::context_pack(&crate::agent::ContextOptions {
            paths: self.paths.clone(),
            space: Some(project.space.path.clone()),
            variant: None,
        });
        let (pack, pack_error) = match pack {
            Ok(p) => {
                let mut v = serde_json::to_value(&p).unwrap_or(Value::Null);
                // The history is returned once, as `recent_steps` (and whole by `history`).
                if let Some(o) = v.as_object_mut() {
                    o.remove("history");
                }
                (v, Value::Null)
            }
            Err(e) => (Value::Null, json!(e.to_string())),
        };
        let step = &project.policies.step;
        json!({
            "edit_scope": crate::step::EDIT_SCOPE,
            "protected": crate::step::protected(project),
            "how_judged": format!(
                "HEAD's champion and your edit are built with the same parameters (HEAD's from HEAD's tree, yours from the working tree), \
                 checked against HEAD's fp32 reference on fresh inputs with poisoned outputs, then timed interleaved {} rounds on every \
                 shape and dtype below. The edit is committed only if its geomean gain beats {:.1}% and the noise, and no case is slower \
                 by more than its noise.",
                step.rounds,
                step.threshold * 100.0
            ),
            "rejected_when": [
                "it does not build, spills registers, or breaks a gate in policies.toml",
                "it is wrong on any case (max abs, relative L2, NaN or unwritten outputs against the reference)",
                "the outputs of the timed launches differ from the checked launch (caching, skipping work)",
                "it is wrong on fresh inputs after timing or on large-magnitude inputs",
                "its figure is implausible (beyond the GPU's measured roofs)",
                "it is slower on any case beyond noise, or not faster overall",
                "it changes anything outside the edit scope or a protected file"
            ],
            "space": {
                "name": project.space.name,
                "path": project.space.path.strip_prefix(&self.root).unwrap_or(&project.space.path),
                "shapes": shapes,
                "dtypes": project.policies.dtypes,
            },
            "champion_table_at_head": table,
            "fake_gpu": self.fake_gpu,
            "recent_steps": recent,
            "steps_total": steps.len(),
            "pack": pack,
            "pack_error": pack_error,
        })
    }
}

/// Every changed path outside `runs/` with its content now (None: deleted).
fn outside_scope_now(root: &Path) -> Option<BTreeMap<String, Option<Vec<u8>>>> {
    let changed = crate::vcs::changed_against_head(root).ok()?;
    Some(
        changed
            .into_iter()
            .filter(|p| !p.starts_with("runs/"))
            .map(|p| {
                let content = read_opt(&root.join(&p));
                (p, content)
            })
            .collect(),
    )
}

fn read_opt(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

fn timed_variants(log: &crate::runlog::LoadedLog) -> Vec<String> {
    let mut v: Vec<String> = log
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Timed { variant, .. } => Some(variant.clone()),
            _ => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The run folder `flashtune step` printed on its last `... Run log: runs/<id>/log.jsonl` line.
fn run_dir_printed(stdout: &str) -> Option<PathBuf> {
    stdout.lines().rev().find_map(|l| {
        let at = l.find("Run log: ")?;
        Some(
            PathBuf::from(l[at + "Run log: ".len()..].trim())
                .parent()?
                .to_path_buf(),
        )
    })
}

fn tail(text: &str, lines: usize) -> String {
    crate::build::log_tail(text, lines)
}

/// A finished `flashtune step`: its verdict from the run log, or why it refused to judge.
fn read_verdict(ended: Ended) -> (Value, bool) {
    let run_dir = run_dir_printed(&ended.stdout);
    if ended.status != Some(0) {
        let code = match ended.status {
            Some(2) => "judge_refused",
            Some(5) => "gpu_busy",
            _ => "judge_failed",
        };
        let mut message = tail(&ended.stderr, 12);
        if let Some(m) = message.strip_prefix("error: ") {
            message = m.to_owned();
        }
        return (
            json!({ "error": {
                "code": code,
                "message": message.trim(),
                "exit_code": ended.status,
                "run_dir": run_dir,
            }}),
            true,
        );
    }
    let Some(run_dir) = run_dir else {
        return (
            json!({ "error": { "code": "judge_failed", "message": "flashtune step printed no run log", "output": tail(&ended.stdout, 12) }}),
            true,
        );
    };
    // The same verdict `flashtune judge --json` prints, read from the step's log.
    match crate::agent::verdict_from_log(&run_dir) {
        Ok(v) => {
            let report = std::fs::read_to_string(&v.report).ok();
            let mut verdict = serde_json::to_value(&v).unwrap_or(Value::Null);
            verdict["verdict"] = json!(if v.accepted { "accepted" } else { "rejected" });
            verdict["status"] = json!("done");
            verdict["report"] = json!(report);
            (verdict, false)
        }
        Err(e) => (
            json!({ "error": { "code": "judge_failed", "message": format!("{}: {e}", run_dir.display()) }}),
            true,
        ),
    }
}

/// A finished `flashtune profile`: the newest `profiled` record of the case in the run's log.
fn read_profile(
    ended: Ended,
    run_dir: &Path,
    variant: &str,
    shape: &str,
    dtype: &str,
) -> (Value, bool) {
    if ended.status != Some(0) {
        return (
            json!({ "error": {
                "code": if ended.status == Some(5) { "gpu_busy" } else { "profile_failed" },
                "message": tail(&ended.stderr, 12).trim(),
                "exit_code": ended.status,
            }}),
            true,
        );
    }
    let read = crate::engine::read_run(run_dir);
    let Ok((log, header)) = read else {
        return (
            json!({ "error": { "code": "profile_failed", "message": format!("cannot read {}", run_dir.display()) }}),
            true,
        );
    };
    let found = log
        .entries
        .iter()
        .rev()
        .find_map(|(line, e)| match &e.record {
            Record::Profiled {
                variant: v,
                shape: s,
                dtype: d,
                profile,
            } if v == variant && s == shape && d.to_string() == dtype => {
                Some((*line, profile.clone()))
            }
            _ => None,
        });
    match found {
        None => (
            json!({ "error": { "code": "not_profiled", "message": format!("run {} did not build {variant} for {shape} {dtype}: nothing to profile", header.run_id) }}),
            true,
        ),
        Some((line, profile)) => {
            let fake = header.device.fake;
            (
                json!({
                    "status": "done",
                    "run": header.run_id,
                    "log_line": line,
                    "variant": variant,
                    "shape": shape,
                    "dtype": dtype,
                    "gpu": header.device.name,
                    "fake_gpu": fake,
                    "note": if fake { "synthetic figures from the test double: nothing was measured" } else { "measured by Nsight Compute" },
                    "profile": profile,
                }),
                false,
            )
        }
    }
}

/// Every step and candidate of every run under `runs/`, oldest first, as `history` returns them
/// (the agent sessions' own history: one reader for both).
fn history_values(runs: &Path) -> Vec<Value> {
    crate::pack::history(runs)
        .iter()
        .map(|h| serde_json::to_value(h).unwrap_or(Value::Null))
        .collect()
}

/// The coding agents `print-config` writes a snippet for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    Claude,
    Codex,
    Gemini,
    Cursor,
}

/// Environment the server needs that clients may not pass on: Codex starts MCP servers with a
/// short allow-list of variables, so nvcc's location would be lost.
const PASSED_ENV: [&str; 2] = ["FLASHTUNE_NVCC", "FLASHTUNE_CACHE_DIR"];

/// Where `agent` reads its MCP servers from (relative to the project, or `~` for the user's), and
/// the snippet that registers `flashtune mcp` for this project with `binary`.
pub fn client_config(agent: Agent, binary: &Path, root: &Path, fake_gpu: bool) -> (String, String) {
    let mut args = vec![
        "--root".to_owned(),
        root.display().to_string(),
        "mcp".to_owned(),
    ];
    if fake_gpu {
        args.push("--fake-gpu".to_owned());
    }
    let env: BTreeMap<&str, String> = PASSED_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v)))
        .collect();
    let command = binary.display().to_string();
    // A judge waits up to 45 s before handing back a job to poll; the clients' timeouts leave room.
    let mut server = json!({ "command": command, "args": args });
    if !env.is_empty() {
        server["env"] = json!(env);
    }
    let json_file = |file: &str, server: Value| {
        (
            file.to_owned(),
            serde_json::to_string_pretty(&json!({ "mcpServers": { "flashtune": server } }))
                .expect("JSON")
                + "\n",
        )
    };
    match agent {
        Agent::Claude => {
            let mut s = server;
            s["type"] = json!("stdio");
            json_file(".mcp.json", s)
        }
        Agent::Cursor => json_file(".cursor/mcp.json", server),
        Agent::Gemini => {
            let mut s = server;
            s["timeout"] = json!(MAX_WAIT_S * 1000 + 60_000);
            // Gemini CLI reads a project's .gemini/settings.json only in a folder it trusts; the
            // user's settings always.
            json_file("~/.gemini/settings.json", s)
        }
        Agent::Codex => {
            let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
            let mut t = String::from("[mcp_servers.flashtune]\n");
            t.push_str(&format!("command = {}\n", quote(&command)));
            let list: Vec<String> = args.iter().map(|a| quote(a)).collect();
            t.push_str(&format!("args = [{}]\n", list.join(", ")));
            t.push_str(&format!("tool_timeout_sec = {}\n", MAX_WAIT_S + 60));
            if !env.is_empty() {
                t.push_str("\n[mcp_servers.flashtune.env]\n");
                for (k, v) in &env {
                    t.push_str(&format!("{k} = {}\n", quote(v)));
                }
            }
            ("~/.codex/config.toml".to_owned(), t)
        }
    }
}
