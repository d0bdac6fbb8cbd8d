//! `flashtune mcp`: the step verdict, the profiler, the step history and the rules as MCP tools over stdio, for coding agents; and the snippets that register the server with them.
//!
//! Every answer is the same JSON document the command line prints (`judge --json`, `context
//! --json`, `history --json`, `show-attempt --json`), `schema_version` included, and every error is
//! `{"schema_version", "error": {"code", "message", ...}}`. A call the tool cannot take is refused
//! as JSON-RPC invalid params (-32602) carrying that document: an unknown tool (`unknown_tool`, with
//! the known ones), an unknown argument, an argument of the wrong type or a `wait_s` above 540
//! (`bad_argument`, naming the field). An unknown variant is `unknown_variant` in every tool.
//!
//! The protocol is JSON-RPC 2.0 to the letter (see `wire`): a line that is not JSON gets a parse
//! error (-32700, id null), one that is no request an invalid request (-32600, with its id where it
//! had one), and a notification never gets an answer.
//!
//! The server judges through the same `flashtune judge` the command line runs, as a child process:
//! the verdict, the commit and the restore stay flashtune's, a crash in a judge cannot take the
//! server down, and nothing but the protocol ever reaches stdout. A judge or a profile is a job:
//! the call waits a bounded time (sending progress notifications), then hands back the job's id
//! to poll with `judge_status`, so no client's tool timeout cuts a verdict in half. A client that
//! disconnects (or a stop signal to the server) ends a running job as a stop request ends a run: a
//! judge's run gets its `interrupted` record and its edit is restored, then the server exits.
use crate::error::{Error, Result};
use crate::log::runlog::Record;
use crate::model::config::ProjectPaths;
use crate::run::shared::Project;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolResult, Implementation, RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::schemars::{self, JsonSchema};
use rmcp::{tool, tool_handler, tool_router, Peer, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod config;
mod jobs;
mod stray;
mod wire;

pub use config::{client_config, write_client_config, Agent};
use jobs::{read_profile, read_verdict, Ended};
use stray::outside_scope_now;

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

/// Serve MCP on stdin/stdout until the client closes the connection (or the server is asked to
/// stop by SIGINT, SIGTERM or SIGHUP); a job still running then is stopped as a run is, and a
/// judge's run logs `interrupted` with its edit restored, before the server exits.
pub async fn serve(opts: McpOptions) -> Result<()> {
    let server = Workbench::new(opts)?;
    let bench = server.clone();
    let stops = listen_for_stops();
    let (input, output) = rmcp::transport::stdio_pipes();
    let (reads, writes, carried) = wire::gate(input, output);
    let mut signalled = stops.clone();
    let service = tokio::select! {
        service = server.serve((reads, writes)) => service
            .map_err(|e| Error::Other(anyhow::anyhow!("MCP handshake failed: {e}")))?,
        // Stopped before any client spoke: no job can run yet.
        _ = stopped(&mut signalled, 0) => return Ok(()),
    };
    let token = service.cancellation_token();
    let mut waiting = std::pin::pin!(service.waiting());
    let (quit, why) = tokio::select! {
        quit = &mut waiting => (quit, "the MCP client disconnected (closed its stdin)".to_owned()),
        _ = stopped(&mut signalled, 0) => {
            token.cancel();
            let signo = stops.borrow().first;
            (waiting.await, format!("flashtune mcp got {}", crate::os::stop::describe(signo)))
        }
    };
    bench.stop_running_job(&why, stops).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), carried).await;
    quit.map_err(|e| Error::Other(anyhow::anyhow!("MCP server stopped: {e}")))?;
    Ok(())
}

/// Stop requests the server itself got: how many, and the first one's signal.
#[derive(Clone, Copy, Debug, Default)]
struct Stops {
    count: u32,
    first: i32,
}

/// Resolves once more than `seen` stop requests came (never, where no signal can be heard).
async fn stopped(stops: &mut watch::Receiver<Stops>, seen: u32) {
    if stops.wait_for(|s| s.count > seen).await.is_err() {
        std::future::pending::<()>().await
    }
}

/// From here on SIGINT, SIGTERM and SIGHUP no longer kill the server outright (and its judge with
/// it): the first ends the service as a disconnect does, a later one cuts the job's grace short.
fn listen_for_stops() -> watch::Receiver<Stops> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = watch::channel(Stops::default());
    let kinds = [
        (SignalKind::interrupt(), libc::SIGINT),
        (SignalKind::terminate(), libc::SIGTERM),
        (SignalKind::hangup(), libc::SIGHUP),
    ];
    for (kind, signo) in kinds {
        let Ok(mut stream) = signal(kind) else {
            tracing::warn!("cannot listen for signal {signo}");
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                tx.send_modify(|s| {
                    s.count += 1;
                    if s.first == 0 {
                        s.first = signo;
                    }
                });
            }
        });
    }
    rx
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
    /// The child `flashtune` (None: it could not start).
    pid: Option<u32>,
    /// The run folders there were before the job: its own run is the new one.
    runs_before: Arc<Vec<PathBuf>>,
}

#[derive(Clone, Debug)]
enum JobState {
    Running { phase: String },
    Done { result: Value, is_error: bool },
}

/// A structured error the agent can act on: a code to branch on and a sentence to read.
fn refusal(code: &str, message: impl Into<String>, extra: Value) -> CallToolResult {
    CallToolResult::structured_error(crate::agent::error_document(code, &message.into(), extra))
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
    #[schemars(range(max = MAX_WAIT_S))]
    pub wait_s: Option<u64>,
    /// What the edit tries, in one sentence: its entry in the history every later attempt reads.
    #[serde(default)]
    pub idea: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StatusArgs {
    /// The job id `judge` or `profile` returned (e.g. `judge-1`).
    pub job: String,
    /// Seconds to wait for the job to end before answering "running" again (default 45, at most 540).
    #[serde(default)]
    #[schemars(range(max = MAX_WAIT_S))]
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
    #[schemars(range(max = MAX_WAIT_S))]
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
    /// The champion variant where HEAD's champion table names none.
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AttemptArgs {
    /// The attempt id `history` lists: `<run id>/<step>` or `<run id>/<step>.<candidate>`.
    pub id: String,
}

/// A call checked before it runs: an unknown tool, an unknown argument, an argument of the wrong type
/// or a `wait_s` above [`MAX_WAIT_S`] is a JSON-RPC invalid-params error (-32602) whose `data` is the
/// error document (`unknown_tool` with the known tools; `bad_argument` with the field), rather than
/// rmcp's bare "tool not found" or an argument silently ignored or cut down.
fn check_call(
    router: &ToolRouter<Workbench>,
    tool: &str,
    arguments: Option<&serde_json::Map<String, Value>>,
) -> std::result::Result<(), rmcp::ErrorData> {
    let refuse = |code: &str, message: String, extra: Value| {
        rmcp::ErrorData::invalid_params(
            message.clone(),
            Some(crate::agent::error_document(code, &message, extra)),
        )
    };
    let Some(schema) = router.get(tool) else {
        let mut known: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        known.sort();
        return Err(refuse(
            "unknown_tool",
            format!("no tool `{tool}`; the tools are {}", known.join(", ")),
            json!({ "tool": tool, "known": known }),
        ));
    };
    let given = arguments.cloned().unwrap_or_default();
    let accepted: Vec<String> = schema
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let unknown: Vec<String> = given
        .keys()
        .filter(|k| !accepted.contains(k))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        let quoted = |names: &[String]| {
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(refuse(
            "bad_argument",
            format!(
                "unknown argument{} {} to `{tool}`; it takes {}",
                if unknown.len() == 1 { "" } else { "s" },
                quoted(&unknown),
                if accepted.is_empty() {
                    "none".to_owned()
                } else {
                    quoted(&accepted)
                }
            ),
            json!({ "tool": tool, "field": unknown[0], "unknown": unknown, "accepted": accepted }),
        ));
    }
    check_arguments(tool, &given)?;
    if let Some(wait) = given.get("wait_s").and_then(Value::as_u64) {
        if wait > MAX_WAIT_S {
            return Err(refuse(
                "bad_argument",
                format!(
                    "`wait_s` {wait} to `{tool}` is above the maximum, {MAX_WAIT_S} s; wait at most {MAX_WAIT_S} s and poll with judge_status"
                ),
                json!({ "tool": tool, "field": "wait_s", "maximum": MAX_WAIT_S }),
            ));
        }
    }
    Ok(())
}

/// Each tool's arguments checked against its type before the call, so a wrong type is a JSON-RPC
/// invalid-params error with a structured `data` rather than rmcp's plain-text tool error.
fn check_arguments(
    tool: &str,
    given: &serde_json::Map<String, Value>,
) -> std::result::Result<(), rmcp::ErrorData> {
    fn parse<T: serde::de::DeserializeOwned>(v: Value) -> std::result::Result<(), String> {
        serde_json::from_value::<T>(v)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    let check = |args: &serde_json::Map<String, Value>| {
        let args = Value::Object(args.clone());
        match tool {
            "judge" => parse::<JudgeArgs>(args),
            "judge_status" => parse::<StatusArgs>(args),
            "profile" => parse::<ProfileArgs>(args),
            "history" => parse::<HistoryArgs>(args),
            "context" => parse::<ContextArgs>(args),
            "attempt" => parse::<AttemptArgs>(args),
            _ => Ok(()),
        }
    };
    let Err(why) = check(given) else {
        return Ok(());
    };
    // serde names a missing field but not a mistyped one: the argument whose removal cures it is.
    let field = given.keys().find(|k| {
        let mut without = given.clone();
        without.remove(*k);
        check(&without).is_ok()
    });
    let message = match field {
        Some(f) => format!("bad argument `{f}` to `{tool}`: {why}"),
        None => format!("bad arguments to `{tool}`: {why}"),
    };
    Err(rmcp::ErrorData::invalid_params(
        message.clone(),
        Some(crate::agent::error_document(
            "bad_argument",
            &message,
            json!({ "tool": tool, "field": field }),
        )),
    ))
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
        description = "Judge the uncommitted edit under kernels/ against HEAD's champion, exactly as `flashtune judge` does: build HEAD's champion and the edit, check both on fresh inputs with poisoned outputs, re-time them interleaved on every shape and dtype. A faster edit (beyond noise, no case slower) is committed by flashtune (on the fake GPU to a scratch ref, never your branch); anything else is restored to HEAD. Either way its patch is kept and it joins the history: say what it tries in `idea`. Changes outside kernels/ (or to kernels/attention/tuned.toml or the reference kernel) reject the edit unjudged and are undone, all of them. Returns the verdict document {schema_version, status: \"done\", verdict, accepted, reason, geomean_gain, commit, restored, cases[], attempt, idea, metrics, ...}; if the verdict takes longer than wait_s, returns {status: \"running\", job} instead: call judge_status with that job. Only one judge or profile runs at a time. Do not commit yourself."
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
        let mut command = vec!["judge".to_owned(), "--json".to_owned()];
        if let Some(idea) = &args.idea {
            command.extend(["--idea".to_owned(), idea.clone()]);
        }
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
                    .undo_stray_changes(None, &args)
                    .unwrap_or_else(|| refusal("bad_project", e.to_string(), json!({}))))
            }
        };
        if let Some(variant) = &args.variant {
            if let Some(refused) = unknown_variant(&project, variant) {
                return Ok(refused);
            }
            command.extend(["--variant".to_owned(), variant.clone()]);
        }
        if let Some(verdict) = self.undo_stray_changes(Some(&project), &args) {
            return Ok(verdict);
        }
        Ok(self
            .run_job("judge", command, read_verdict, wait, meta, peer)
            .await)
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
                None if !self.project_variants().contains(&args.variant) => {
                    return Ok(refusal(
                        "unknown_variant",
                        format!(
                            "`{}` is not a variant of any space in the project, and no run under runs/ timed it",
                            args.variant
                        ),
                        json!({ "known": self.variants_timed() }),
                    ))
                }
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
        let (log, header) = match crate::run::engine::read_run(&run_dir) {
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
        let command = vec![
            "profile".to_owned(),
            run_dir.display().to_string(),
            args.variant.clone(),
            "--shape".to_owned(),
            args.shape.clone(),
            "--dtype".to_owned(),
            dtype.clone(),
        ];
        let (variant, shape) = (args.variant.clone(), args.shape.clone());
        let interpret = move |ended: Ended| read_profile(ended, &run_dir, &variant, &shape, &dtype);
        Ok(self
            .run_job("profile", command, interpret, wait, meta, peer)
            .await)
    }

    #[tool(
        description = "Every earlier step and candidate on this repository, across sessions and agent sessions, newest last: each attempt's id, the idea it tried, the files it changed and its diff stat (the patch for the latest), its verdict (committed, accepted, rejected, dropped, unfinished) and reason, geomean gain, how the key metrics moved (per-case gains, registers, spills), the commit it became, per case the champion's and the edit's median µs, and what it cost. Returns {schema_version, total, steps[]}, as `flashtune history --json`. Read it before editing so you do not try again what was rejected; `attempt` gives any one's whole patch."
    )]
    async fn history(
        &self,
        Parameters(args): Parameters<HistoryArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let doc =
            crate::agent::step_history(&self.paths, Some(args.last.unwrap_or(DEFAULT_HISTORY)));
        Ok(CallToolResult::structured(to_value(&doc)))
    }

    #[tool(
        description = "One earlier attempt by the id `history` lists (`<run id>/<step>` or `<run id>/<step>.<candidate>`): its idea, verdict, reason, per-case figures, metrics, cost, and its whole patch, ready for `git apply` (a near miss to build on, or what not to repeat). Returns {schema_version, attempt, patch, ...}, as `flashtune show-attempt ID --json`."
    )]
    async fn attempt(
        &self,
        Parameters(args): Parameters<AttemptArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        Ok(match crate::agent::attempt(&self.paths, &args.id) {
            Ok(doc) => CallToolResult::structured(to_value(&doc)),
            Err(e) => refusal(
                if crate::pack::parse_attempt_id(&args.id).is_some() {
                    "not_found"
                } else {
                    "bad_argument"
                },
                e.to_string(),
                json!({}),
            ),
        })
    }

    #[tool(
        description = "The context pack, as `flashtune context --json` prints it and an agent session writes it: the rules (edit scope, protected files, how an edit is judged, what gets it rejected), HEAD's champion per case with its figures from the run logs (µs, TF/s, % of the measured roofs, PyTorch), Nsight Compute's speed of light and the named bottleneck with its evidence metrics, how to build the kernel locally, ideas tried and failed (avoid) and near misses worth another try, and the history. Read it first."
    )]
    async fn context(
        &self,
        Parameters(args): Parameters<ContextArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let space = match &args.space {
            Some(space) => match self.inside_project(space) {
                Ok(p) => Some(p),
                Err(refused) => return Ok(refused),
            },
            None => None,
        };
        if let Some(variant) = &args.variant {
            // As judge refuses it; a project that does not load is context_pack's to report.
            if let Ok(project) = Project::load(self.paths.clone(), space.as_deref()) {
                if let Some(refused) = unknown_variant(&project, variant) {
                    return Ok(refused);
                }
            }
        }
        let pack = crate::agent::context_pack(&crate::agent::ContextOptions {
            paths: self.paths.clone(),
            space,
            variant: args.variant.clone(),
        });
        Ok(match pack {
            Ok(p) => CallToolResult::structured(to_value(&p)),
            Err(e) => refusal("bad_project", e.to_string(), json!({})),
        })
    }
}

/// The refusal every tool gives a variant its space does not have: `unknown_variant`, with the
/// space's variants.
fn unknown_variant(project: &Project, variant: &str) -> Option<CallToolResult> {
    let known: Vec<String> = project
        .space
        .variants()
        .map(|vs| vs.into_iter().map(|v| v.id).collect())
        .unwrap_or_default();
    (!known.iter().any(|k| k == variant)).then(|| {
        refusal(
            "unknown_variant",
            format!(
                "`{variant}` is not a variant of space `{}`",
                project.space.name
            ),
            json!({ "known": known }),
        )
    })
}

fn to_value<T: serde::Serialize>(doc: &T) -> Value {
    serde_json::to_value(doc).unwrap_or(Value::Null)
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Workbench {
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<RoleServer>,
    ) -> std::result::Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        check_call(&self.tool_router, &request.name, request.arguments.as_ref())?;
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(call).await
    }

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

pub(super) fn wait_of(asked: Option<u64>) -> Duration {
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
        // The deepest part that exists, resolved (symlinks, a relative root), with the rest after it:
        // a missing file inside the project is "not found", not "outside".
        let mut existing = normal.as_path();
        let mut rest = Vec::new();
        while !existing.exists() {
            match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => break,
            }
        }
        let mut real = existing
            .canonicalize()
            .unwrap_or_else(|_| existing.to_path_buf());
        real.extend(rest.iter().rev());
        if !real.starts_with(&root) {
            return Err(refusal(
                "path_outside_project",
                format!(
                    "`{given}` lies outside the project {}; name files relative to it",
                    root.display()
                ),
                json!({}),
            ));
        }
        if !real.exists() {
            return Err(refusal(
                "not_found",
                format!("`{given}` does not exist in the project {}", root.display()),
                json!({}),
            ));
        }
        Ok(real)
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
        crate::log::runlog::sort_by_start(&mut runs);
        runs.reverse();
        runs
    }

    fn newest_run_timing(&self, variant: &str) -> Option<PathBuf> {
        self.runs_newest_first().into_iter().find(|dir| {
            crate::log::runlog::read(&dir.join("log.jsonl"))
                .is_ok_and(|log| timed_variants(&log).iter().any(|v| v == variant))
        })
    }

    /// Every variant of every space beside the default one (`variants/*.toml`).
    fn project_variants(&self) -> Vec<String> {
        let Ok((policies, _)) = crate::model::config::Policies::load(&self.paths.policies()) else {
            return Vec::new();
        };
        let default = self.paths.resolve(&policies.default_space);
        let Some(dir) = default.parent() else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
        files
            .iter()
            .filter_map(|p| crate::model::space::Space::load(p).ok()?.variants().ok())
            .flatten()
            .map(|v| v.id)
            .collect()
    }

    fn variants_timed(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .runs_newest_first()
            .iter()
            .filter_map(|dir| crate::log::runlog::read(&dir.join("log.jsonl")).ok())
            .flat_map(|log| timed_variants(&log))
            .collect();
        all.sort();
        all.dedup();
        all
    }
}

fn timed_variants(log: &crate::log::runlog::LoadedLog) -> Vec<String> {
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
