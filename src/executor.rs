//! Runs worker requests: in a supervised `flashtune worker` subprocess, or in a labelled fake for GPU-less tests.
use crate::check;
use crate::protocol::*;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How a worker ended, beyond the messages it managed to send.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEnd {
    Clean,
    /// The worker said it could not go on.
    Fatal(String),
    /// It died without finishing (signal, abort, non-zero exit without a message).
    Crashed { status: String, stderr_tail: String },
    TimedOut { seconds: u64 },
}

#[derive(Debug, Clone)]
pub struct WorkerOutcome {
    pub device: Option<DeviceInfo>,
    pub cases: Vec<CaseResult>,
    pub end: WorkerEnd,
}

#[derive(Debug, Clone)]
pub enum Executor {
    Subprocess { exe: PathBuf, timeout: Duration },
    /// A test double: its figures are synthetic and every record it produces says so.
    Fake { arch: String },
}

impl Executor {
    pub fn subprocess(timeout: Duration) -> std::io::Result<Self> {
        Ok(Executor::Subprocess { exe: std::env::current_exe()?, timeout })
    }

    pub fn is_fake(&self) -> bool {
        matches!(self, Executor::Fake { .. })
    }

    pub async fn probe(&self, device: u32) -> Result<DeviceInfo, String> {
        match self {
            Executor::Fake { arch } => Ok(fake_device(arch)),
            Executor::Subprocess { .. } => {
                let outcome = self.exchange(&WorkerRequest::Probe { device }).await;
                match (outcome.device, outcome.end) {
                    (Some(d), WorkerEnd::Clean) => Ok(d),
                    (_, WorkerEnd::Fatal(m)) => Err(m),
                    (_, WorkerEnd::Crashed { status, stderr_tail }) => Err(format!("worker crashed ({status}): {stderr_tail}")),
                    (_, WorkerEnd::TimedOut { seconds }) => Err(format!("worker did not answer within {seconds} s")),
                    (None, WorkerEnd::Clean) => Err("worker answered without describing the device".into()),
                }
            }
        }
    }

    pub async fn run(&self, request: RunRequest) -> WorkerOutcome {
        match self {
            Executor::Fake { arch } => fake_run(arch, &request),
            Executor::Subprocess { .. } => self.exchange(&WorkerRequest::Run(request)).await,
        }
    }

    async fn exchange(&self, request: &WorkerRequest) -> WorkerOutcome {
        let Executor::Subprocess { exe, timeout } = self else { unreachable!("exchange is only for subprocesses") };
        let mut outcome = WorkerOutcome { device: None, cases: Vec::new(), end: WorkerEnd::Clean };
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg("worker").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Its own process group, so a timeout kills whatever the worker started too.
        cmd.process_group(0).kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                outcome.end = WorkerEnd::Crashed { status: "not started".into(), stderr_tail: e.to_string() };
                return outcome;
            }
        };
        let pid = child.id();
        tracing::info!(?pid, "worker started");
        let payload = serde_json::to_vec(request).expect("requests serialize");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&payload).await;
            drop(stdin);
        }
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let stderr_task = tokio::spawn(async move {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s).await;
            s
        });
        let mut fatal = None;
        let mut done = false;
        let read_all = async {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<WorkerMessage>(&line) {
                    Ok(WorkerMessage::Device(d)) => outcome.device = Some(d),
                    Ok(WorkerMessage::Case(c)) => outcome.cases.push(*c),
                    Ok(WorkerMessage::Fatal { message }) => fatal = Some(message),
                    Ok(WorkerMessage::Done) => done = true,
                    // Kernels and drivers may print; only protocol lines count.
                    Err(_) => {}
                }
            }
            child.wait().await
        };
        let waited = tokio::time::timeout(*timeout, read_all).await;
        match waited {
            Err(_) => {
                if let Some(pid) = pid {
                    unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
                }
                outcome.end = WorkerEnd::TimedOut { seconds: timeout.as_secs() };
            }
            Ok(status) => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                outcome.end = if let Some(m) = fatal {
                    WorkerEnd::Fatal(m)
                } else if done {
                    WorkerEnd::Clean
                } else {
                    let stderr_tail = stderr_task.await.unwrap_or_default();
                    WorkerEnd::Crashed { status, stderr_tail: crate::build::log_tail(&stderr_tail, 20) }
                };
            }
        }
        tracing::info!(?pid, end = ?outcome.end, cases = outcome.cases.len(), "worker finished");
        outcome
    }
}

fn fake_device(arch: &str) -> DeviceInfo {
    DeviceInfo {
        ordinal: 0,
        name: "fake GPU (flashtune test double; no figure from it is a measurement)".into(),
        sm_count: 132,
        compute_capability: (9, 0),
        arch: arch.into(),
        max_threads_per_block: 1024,
        max_smem_optin_bytes: 232_448,
        driver_version: 0,
        total_memory_bytes: 0,
        fake: true,
    }
}

/// Deterministic synthetic results: exact outputs, and a time that depends on the cubin and shape only.
fn fake_run(arch: &str, request: &RunRequest) -> WorkerOutcome {
    let cases = request
        .cases
        .iter()
        .map(|case| {
            let key = format!("{}|{:?}", case.forward.cubin.display(), case.shape);
            let h = blake3::hash(key.as_bytes());
            let jitter = 1.0 + (h.as_bytes()[0] as f64) / 255.0;
            let base_us = 5.0 + case.shape.flops() / 50e12 * 1e6;
            let samples: Vec<f64> = (0..request.measure.samples).map(|i| base_us * jitter * (1.0 + 0.001 * (i % 5) as f64)).collect();
            let mut stats = CheckStats { elements: (case.shape.b * case.shape.h * case.shape.sq * case.shape.d) as u64, ..Default::default() };
            check::judge(&mut stats, &case.tolerance, crate::worker::REFERENCE_VS_CPU_LIMIT);
            CaseResult {
                shape: case.shape.name.clone(),
                dtype: case.dtype,
                check: Some(stats),
                timing: Some(check::summarize(samples, 1, case.shape.flops())),
                function: None,
                kv_splits: case.forward.launch.kv_splits.max(1),
                error: None,
            }
        })
        .collect();
    WorkerOutcome { device: Some(fake_device(arch)), cases, end: WorkerEnd::Clean }
}
