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
use crate::model::config::ProjectPaths;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool_handler, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod args;
mod config;
mod jobs;
mod lookup;
mod stray;
mod tools;
pub mod wire;

use args::check_call;
pub use args::{AttemptArgs, ContextArgs, HistoryArgs, JudgeArgs, ProfileArgs, StatusArgs};
pub use config::{client_config, write_client_config, Agent};

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
    // The process-wide stop every command shares: from here SIGINT, SIGTERM and SIGHUP no longer
    // kill the server outright (and its judge with it); the first ends the service as a disconnect
    // does, a later one cuts the job's grace short.
    if let Err(e) = crate::os::stop::listen_as(crate::os::stop::FirstStop::EndsTheServer) {
        tracing::warn!("cannot listen for stop signals: {e}");
    }
    let (input, output) = rmcp::transport::stdio_pipes();
    let (reads, writes, carried) = wire::gate(input, output);
    let service = tokio::select! {
        service = server.serve((reads, writes)) => service
            .map_err(|e| Error::Other(anyhow::anyhow!("MCP handshake failed: {e}")))?,
        // Stopped before any client spoke: no job can run yet.
        _ = crate::os::stop::reached(1) => return Ok(()),
    };
    let token = service.cancellation_token();
    let mut waiting = std::pin::pin!(service.waiting());
    let (quit, why) = tokio::select! {
        quit = &mut waiting => (quit, "the MCP client disconnected (closed its stdin)".to_owned()),
        _ = crate::os::stop::reached(1) => {
            token.cancel();
            let signo = crate::os::stop::requested().unwrap_or(libc::SIGTERM);
            (waiting.await, format!("flashtune mcp got {}", crate::os::stop::describe(signo)))
        }
    };
    bench.stop_running_job(&why).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), carried).await;
    quit.map_err(|e| Error::Other(anyhow::anyhow!("MCP server stopped: {e}")))?;
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
