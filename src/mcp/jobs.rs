//! Jobs: a judge or a profile runs as a child `flashtune` on the GPU, one at a time; a call waits
//! for it a bounded time, telling the client every few seconds that it is alive.
use super::{refusal, Job, JobState, Workbench, PROGRESS_EVERY};
use crate::log::runlog::Record;
use rmcp::model::{CallToolResult, ProgressNotificationParam, RequestMetaObject};
use rmcp::{Peer, RoleServer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a job gets to end on the first SIGTERM (finishing the measurement in flight) before the
/// second, which stops it at once.
const FIRST_TERM_WAIT: Duration = Duration::from_secs(5);

impl Workbench {
    pub(super) fn busy(&self) -> Option<CallToolResult> {
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

    /// Run `flashtune <command>` (on the test double where the server is) as a job, and wait up to
    /// `wait` for its answer; a second job while one runs is refused as busy.
    pub(super) async fn run_job(
        &self,
        kind: &'static str,
        mut command: Vec<String>,
        interpret: impl FnOnce(Ended) -> (Value, bool) + Send + 'static,
        wait: Duration,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> CallToolResult {
        if self.fake_gpu {
            command.push("--fake-gpu".to_owned());
        }
        match self.start_job(kind, command, interpret) {
            Ok(job) => self.wait_for(&job, wait, meta, peer).await,
            Err(busy) => busy,
        }
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
        let mut jobs = self.jobs.lock().expect("jobs lock");
        if jobs.running.is_some() {
            drop(jobs);
            return Err(self.busy().expect("a job runs"));
        }
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
        // SIGTERM, not SIGKILL, when the server dies outright: a judge then ends through its own
        // stop path (the edit restored, its patch kept, `interrupted` logged) instead of mid-edit.
        crate::gpu::build::die_with_parent_by(&mut cmd, libc::SIGTERM);
        // Started under the lock: the job's pid is known to whoever stops the server next.
        let child = cmd.spawn();
        jobs.next += 1;
        let id = format!("{kind}-{}", jobs.next);
        jobs.all.insert(
            id.clone(),
            Job {
                kind,
                started: Instant::now(),
                state: rx,
                pid: child.as_ref().ok().and_then(|c| c.id()),
                runs_before: Arc::new(runs_before.clone()),
            },
        );
        jobs.running = Some(id.clone());
        drop(jobs);
        let jobs = self.jobs.clone();
        let this = self.clone();
        let job_id = id.clone();
        tokio::spawn(async move {
            let ended = match child {
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

    /// The server is ending (its client disconnected, or it got a stop signal): end the job that
    /// holds the GPU the way a stop request ends a run, never by killing it outright. The child gets
    /// SIGTERM, then after [`FIRST_TERM_WAIT`] a second one (stop at once) and [`stop::GRACE_S`] more
    /// for its records, and only then SIGKILL; another stop signal to the server skips ahead. A judge
    /// whose run did not log its own end then gets its `interrupted` record and its edit restored.
    ///
    /// [`stop::GRACE_S`]: crate::os::stop::GRACE_S
    pub(super) async fn stop_running_job(&self, why: &str) {
        let running = {
            let jobs = self.jobs.lock().expect("jobs lock");
            jobs.running
                .as_ref()
                .map(|id| (id.clone(), jobs.all[id].clone()))
        };
        let Some((id, job)) = running else {
            return;
        };
        crate::tell!("flashtune mcp: {why}: stopping {} job {id}", job.kind);
        let seen = crate::os::stop::count();
        let mut state = job.state.clone();
        let stages = [
            (libc::SIGTERM, FIRST_TERM_WAIT),
            (
                libc::SIGTERM,
                Duration::from_secs(crate::os::stop::GRACE_S + 5),
            ),
            (libc::SIGKILL, Duration::from_secs(5)),
        ];
        let mut signalled = false;
        for (signal, wait) in stages {
            if matches!(&*state.borrow(), JobState::Done { .. }) {
                break;
            }
            signalled = true;
            if let Some(pid) = job.pid {
                // SAFETY: a signal to the child this server started, which it has not reaped yet
                // (the job is not done); a pid already gone is a harmless ESRCH.
                unsafe { libc::kill(pid as i32, signal) };
            }
            tokio::select! {
                _ = state.wait_for(|s| matches!(s, JobState::Done { .. })) => break,
                _ = tokio::time::sleep(wait) => {}
                _ = crate::os::stop::reached(seen + 1) => {}
            }
        }
        // A job that ended on its own meanwhile has its verdict in its log: nothing to complete.
        if signalled && job.kind == "judge" {
            self.end_interrupted_judge(&job, why);
        }
    }

    /// After a judge was stopped: unless its run logged its own end (a verdict, or `interrupted`),
    /// restore the edit it was judging (the files its `step_started` names; its patch is already in
    /// the run's attempts/) and append the `interrupted` record saying so. A judge stopped before it
    /// took the edit in leaves the edit as it was.
    fn end_interrupted_judge(&self, job: &Job, why: &str) {
        let Some(run_dir) = self
            .runs_newest_first()
            .into_iter()
            .find(|d| !job.runs_before.contains(d))
        else {
            crate::tell!(
                "flashtune mcp: the judge had not started its run: the edit is left as it was"
            );
            return;
        };
        let path = run_dir.join("log.jsonl");
        let log = match super::lookup::run_log(&run_dir) {
            Ok(log) => log,
            Err(e) => {
                crate::tell!("flashtune mcp: cannot read the judge's run log: {e}");
                return;
            }
        };
        let ended = log.entries.iter().any(|(_, e)| {
            matches!(
                e.record,
                Record::StepDecided { .. } | Record::Interrupted { .. }
            )
        });
        if ended {
            return;
        }
        let edit: Option<Vec<String>> =
            log.entries.iter().rev().find_map(|(_, e)| match &e.record {
                Record::StepStarted { changed_files, .. } => Some(changed_files.clone()),
                _ => None,
            });
        let reason = match edit.filter(|files| !files.is_empty()) {
            None => format!("{why} before the judge took the edit in; the edit is left as it was"),
            Some(files) => match crate::os::vcs::restore_paths(&self.root, &files) {
                Ok(()) => format!(
                    "{why} while the judge ran; its edit was restored to HEAD ({}), its patch kept in attempts/",
                    files.join(", ")
                ),
                Err(e) => format!(
                    "{why} while the judge ran; its edit ({}) could not be restored: {}",
                    files.join(", "),
                    e.message()
                ),
            },
        };
        crate::tell!("flashtune mcp: {reason}");
        let logged = crate::log::runlog::RunLog::reopen(&path, &log)
            .and_then(|mut l| l.append(Record::Interrupted { reason }));
        if let Err(e) = logged {
            crate::tell!(
                "flashtune mcp: cannot log `interrupted` in {}: {e}",
                path.display()
            );
        }
    }

    /// What the job's run log says it is doing: the newest run folder, its last record.
    fn phase_since(&self, before: &[PathBuf]) -> Option<String> {
        let dir = self
            .runs_newest_first()
            .into_iter()
            .find(|d| !before.contains(d))?;
        let log = super::lookup::run_log(&dir).ok()?;
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
    pub(super) async fn wait_for(
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
        // Every PROGRESS_EVERY from the call's start, however often the job's phase changes.
        let mut next_tick = tokio::time::Instant::now() + PROGRESS_EVERY;
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
                    "schema_version": crate::pack::JSON_SCHEMA_VERSION,
                    "status": "running",
                    "job": id,
                    "seconds": job.started.elapsed().as_secs_f64().round(),
                    "phase": phase,
                    "next": format!("call judge_status with job `{id}` to wait for the result"),
                }));
            }
            let tick = next_tick.min(deadline);
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
                    next_tick += PROGRESS_EVERY;
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
}

/// How a job's child process ended.
pub(super) struct Ended {
    pub(super) status: Option<i32>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

fn tail(text: &str, lines: usize) -> String {
    crate::gpu::build::log_tail(text, lines)
}

/// A finished `flashtune judge --json`: its verdict document, or its error document with the
/// MCP's codes (`judge_refused` for a refusal, `gpu_busy`, `judge_failed`).
pub(super) fn read_verdict(ended: Ended) -> (Value, bool) {
    let printed: Option<Value> = ended
        .stdout
        .find('{')
        .and_then(|at| serde_json::from_str(ended.stdout[at..].trim()).ok());
    if ended.status == Some(0) {
        return match printed {
            Some(v) if v.get("status").is_some() => (v, false),
            _ => (
                crate::agent::error_document(
                    "judge_failed",
                    "flashtune judge printed no verdict",
                    json!({ "output": tail(&ended.stdout, 12) }),
                ),
                true,
            ),
        };
    }
    let code = match ended.status {
        Some(2) => "judge_refused",
        Some(5) => "gpu_busy",
        _ => "judge_failed",
    };
    let message = printed
        .as_ref()
        .and_then(|v| v.pointer("/error/message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| {
            // The last `error:` line and what follows it, not the progress lines before it.
            let text = tail(&ended.stderr, 12);
            let from = text.rfind("error: ").map_or(0, |at| at + "error: ".len());
            text[from..].trim().to_owned()
        });
    (
        crate::agent::error_document(code, &message, json!({ "exit_code": ended.status })),
        true,
    )
}

/// A finished `flashtune profile`: the newest `profiled` record of the case in the run's log.
pub(super) fn read_profile(
    ended: Ended,
    run_dir: &Path,
    variant: &str,
    shape: &str,
    dtype: &str,
) -> (Value, bool) {
    if ended.status != Some(0) {
        return (
            crate::agent::error_document(
                if ended.status == Some(5) {
                    "gpu_busy"
                } else {
                    "profile_failed"
                },
                tail(&ended.stderr, 12).trim(),
                json!({ "exit_code": ended.status }),
            ),
            true,
        );
    }
    let read = crate::run::engine::read_run(run_dir);
    let Ok((log, header)) = read else {
        return (
            crate::agent::error_document(
                "profile_failed",
                &format!("cannot read {}", run_dir.display()),
                json!({}),
            ),
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
                ..
            } if v == variant && s == shape && d.to_string() == dtype => {
                Some((*line, profile.clone()))
            }
            _ => None,
        });
    match found {
        None => (
            crate::agent::error_document(
                "not_profiled",
                &format!(
                    "run {} did not build {variant} for {shape} {dtype}: nothing to profile",
                    header.run_id
                ),
                json!({}),
            ),
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
                    "schema_version": crate::pack::JSON_SCHEMA_VERSION,
                    "synthetic": fake,
                    "note": if fake { "synthetic figures from the test double: nothing was measured" } else { "measured by Nsight Compute" },
                    "profile": profile,
                }),
                false,
            )
        }
    }
}
