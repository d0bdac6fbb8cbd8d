//! Runs worker requests in a supervised `flashtune worker` subprocess (or its labelled GPU-less double, `worker --fake`).
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
    Crashed {
        status: String,
        stderr_tail: String,
    },
    TimedOut {
        seconds: u64,
    },
}

#[derive(Debug, Clone)]
pub struct WorkerOutcome {
    pub device: Option<DeviceInfo>,
    pub cases: Vec<CaseResult>,
    /// Answers to a duel request, one per pair finished.
    pub duels: Vec<DuelResult>,
    pub end: WorkerEnd,
}

/// Spawns one worker process per request; a timeout kills its whole process group.
#[derive(Debug, Clone)]
pub struct Executor {
    exe: PathBuf,
    /// Limit for a probe (context creation plus the health kernel).
    probe_timeout: Duration,
    /// Run `worker --fake`: the same supervision around a test double whose figures are synthetic.
    fake: Option<String>,
}

impl Executor {
    pub fn subprocess(probe_timeout: Duration) -> std::io::Result<Self> {
        Ok(Executor {
            exe: std::env::current_exe()?,
            probe_timeout,
            fake: None,
        })
    }

    /// The GPU-less double, reporting `arch` as its target.
    pub fn fake(probe_timeout: Duration, arch: &str) -> std::io::Result<Self> {
        Ok(Executor {
            exe: std::env::current_exe()?,
            probe_timeout,
            fake: Some(arch.to_owned()),
        })
    }

    pub fn is_fake(&self) -> bool {
        self.fake.is_some()
    }

    pub async fn probe(&self, device: u32) -> Result<DeviceInfo, String> {
        let outcome = self
            .exchange(&WorkerRequest::Probe { device }, self.probe_timeout)
            .await;
        match (outcome.device, outcome.end) {
            (Some(d), WorkerEnd::Clean) => Ok(d),
            (_, WorkerEnd::Fatal(m)) => Err(m),
            (
                _,
                WorkerEnd::Crashed {
                    status,
                    stderr_tail,
                },
            ) => Err(format!("worker crashed ({status}): {stderr_tail}")),
            (_, WorkerEnd::TimedOut { seconds }) => {
                Err(format!("worker did not answer within {seconds} s"))
            }
            (None, WorkerEnd::Clean) => Err("worker answered without describing the device".into()),
        }
    }

    pub async fn run(&self, request: RunRequest, timeout: Duration) -> WorkerOutcome {
        self.exchange(&WorkerRequest::Run(request), timeout).await
    }

    pub async fn duel(&self, request: DuelRequest, timeout: Duration) -> WorkerOutcome {
        self.exchange(&WorkerRequest::Duel(request), timeout).await
    }

    async fn exchange(&self, request: &WorkerRequest, timeout: Duration) -> WorkerOutcome {
        let exe = &self.exe;
        let mut outcome = WorkerOutcome {
            device: None,
            cases: Vec::new(),
            duels: Vec::new(),
            end: WorkerEnd::Clean,
        };
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg("worker");
        if let Some(arch) = &self.fake {
            cmd.arg("--fake").arg(arch);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Its own process group, so a timeout kills whatever the worker started too.
        cmd.process_group(0).kill_on_drop(true);
        crate::build::die_with_parent(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                outcome.end = WorkerEnd::Crashed {
                    status: "not started".into(),
                    stderr_tail: e.to_string(),
                };
                return outcome;
            }
        };
        let pid = child.id();
        let _group = crate::build::ProcessGroup(pid);
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
                    Ok(WorkerMessage::Duel(d)) => outcome.duels.push(*d),
                    Ok(WorkerMessage::Fatal { message }) => fatal = Some(message),
                    Ok(WorkerMessage::Done) => done = true,
                    // Kernels and drivers may print; only protocol lines count.
                    Err(_) => {}
                }
            }
            child.wait().await
        };
        let waited = tokio::time::timeout(timeout, read_all).await;
        match waited {
            // The group guard kills the worker and anything it started.
            Err(_) => {
                outcome.end = WorkerEnd::TimedOut {
                    seconds: timeout.as_secs(),
                }
            }
            Ok(status) => {
                let status = status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                outcome.end = if let Some(m) = fatal {
                    WorkerEnd::Fatal(m)
                } else if done {
                    WorkerEnd::Clean
                } else {
                    let stderr_tail = stderr_task.await.unwrap_or_default();
                    WorkerEnd::Crashed {
                        status,
                        stderr_tail: crate::build::log_tail(&stderr_tail, 20),
                    }
                };
            }
        }
        tracing::info!(?pid, end = ?outcome.end, cases = outcome.cases.len(), "worker finished");
        outcome
    }
}
