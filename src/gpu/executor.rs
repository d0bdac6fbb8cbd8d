//! Runs worker sessions: a supervised `flashtune worker` process per GPU (or its labelled GPU-less double, `worker --fake`) that serves request after request until it fails or is dropped; started here, or as a Slurm job step through `srun` (see `slurm`).
//!
//! Replies arrive on a pipe of their own (fd 3 in the worker), never on stdout: a kernel's printf
//! cannot pass for a reply, and a reply line that does not parse ends the session as `Garbled`.
//! Under `srun` the worker's stdout is that pipe (the worker sends everything else to stderr).
use crate::gpu::slurm::{Srun, StepLoss};
use crate::model::config::Dtype;
use crate::model::protocol::*;
use std::io::BufRead;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// How a request ended, beyond the replies that arrived.
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
    /// A line on the reply channel that is not a reply: the worker can no longer be believed.
    Garbled {
        line: String,
    },
    /// The cluster ended the worker's job step (Slurm said so): not the variant's fault.
    Lost {
        loss: StepLoss,
        detail: String,
    },
    /// The worker never started, or never got its GPU (no process, a replaced binary, a failed
    /// probe): the machine's failure, not the variant's.
    NotStarted {
        why: String,
    },
}

impl WorkerEnd {
    /// Whether this end may be the GPU's doing, so the GPU is checked before it takes more work:
    /// not a clean end, nor a worker that never started or whose step the cluster took away.
    pub fn may_be_gpus(&self) -> bool {
        match self {
            WorkerEnd::Clean | WorkerEnd::Lost { .. } | WorkerEnd::NotStarted { .. } => false,
            WorkerEnd::Fatal(_)
            | WorkerEnd::Crashed { .. }
            | WorkerEnd::TimedOut { .. }
            | WorkerEnd::Garbled { .. } => true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerOutcome {
    pub device: Option<DeviceInfo>,
    pub cases: Vec<CaseResult>,
    /// Answers to a duel request, one per pair finished.
    pub duels: Vec<DuelResult>,
    pub roofs: Vec<RoofMeasured>,
    /// The drift sentinel's answer, to a sentinel request.
    pub sentinel: Option<SentinelResult>,
    pub end: WorkerEnd,
}

impl WorkerOutcome {
    fn new() -> Self {
        WorkerOutcome {
            device: None,
            cases: Vec::new(),
            duels: Vec::new(),
            roofs: Vec::new(),
            sentinel: None,
            end: WorkerEnd::Clean,
        }
    }

    /// An outcome with no replies, ended as `end`.
    pub fn ended(end: WorkerEnd) -> Self {
        WorkerOutcome {
            end,
            ..WorkerOutcome::new()
        }
    }

    /// Why the request did not end cleanly, in words; `None` when it did.
    pub fn trouble(&self) -> Option<String> {
        match &self.end {
            WorkerEnd::Clean => None,
            WorkerEnd::Fatal(m) => Some(format!("worker: {m}")),
            WorkerEnd::Crashed {
                status,
                stderr_tail,
            } => Some(format!("worker crashed ({status}): {stderr_tail}")),
            WorkerEnd::TimedOut { seconds } => {
                Some(format!("worker timed out: no case finished in {seconds} s"))
            }
            WorkerEnd::Garbled { line } => Some(garbled_reason(line)),
            WorkerEnd::Lost { loss, detail } => {
                Some(format!("worker lost: {}: {detail}", loss.describe()))
            }
            WorkerEnd::NotStarted { why } => Some(format!("worker {WORKER_NOT_STARTED}: {why}")),
        }
    }
}

/// The logged reason for a reply that does not parse.
pub fn garbled_reason(line: &str) -> String {
    let shown: String = line.chars().take(300).collect();
    format!("{}: `{shown}`", crate::model::protocol::GARBLED_REPLY)
}

/// Starts worker sessions; the real GPU or the double, here or through Slurm, is chosen once, here.
#[derive(Debug, Clone)]
pub struct Executor {
    exe: PathBuf,
    /// The worker binary's bytes when this executor was set up: checked before every worker starts,
    /// so a binary replaced during the run (by a proposer) never measures anything.
    trusted_exe: Arc<crate::os::trusted::TrustedFile>,
    /// Limit for a probe (context creation plus the health kernel).
    probe_timeout: Duration,
    /// Run `worker --fake`: the same supervision around a test double whose figures are synthetic.
    fake: Option<String>,
    launcher: Launcher,
    /// The GPU model every session must have (set once the run probed its first GPU): a Slurm step
    /// may land on any node, and one run times one kind of GPU.
    model: Option<String>,
}

/// How a session's processes end when it is dropped or fails.
enum Group {
    /// A local worker's group: killed at once (when dropped).
    Kill {
        _on_drop: crate::gpu::build::ProcessGroup,
    },
    /// srun's group: SIGTERM first, so the step on the node ends with it.
    Srun(crate::gpu::slurm::SrunGroup),
}

/// Where a worker process runs.
#[derive(Debug, Clone)]
pub enum Launcher {
    /// A child of this process, on this host's GPU `device`.
    Local,
    /// A Slurm job step (`srun`), on whichever node and GPU the cluster gives it; the scheduler's
    /// `device` numbers are its queues, and the step's GPU is its device 0.
    Slurm(Srun),
}

/// Bytes of the worker's stdout and stderr kept for a crash report.
const OUTPUT_TAIL_BYTES: usize = 16 << 10;

/// One worker process serving one GPU. Dropping it kills the worker's process group.
pub struct Session {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    replies: mpsc::UnboundedReceiver<std::io::Result<String>>,
    output: Arc<Mutex<String>>,
    /// The tasks copying stdout and stderr into `output`; a crash report waits for them to drain.
    readers: Vec<tokio::task::JoinHandle<()>>,
    group: Group,
    /// False once a request ended badly: the process is gone or no longer trusted.
    pub alive: bool,
    /// A Slurm step: its end is read for the cluster's own words (see `slurm::step_loss`).
    slurm: bool,
    /// What the worker said of its GPU when the session opened (Slurm sessions: node, step, GPUs).
    pub device: Option<DeviceInfo>,
    /// A Slurm step may wait in the queue this long before its first reply.
    start_grace: Duration,
}

impl Executor {
    pub fn subprocess(probe_timeout: Duration) -> std::io::Result<Self> {
        Self::new(probe_timeout, None, Launcher::Local)
    }

    /// The GPU-less double, reporting `arch` as its target.
    pub fn fake(probe_timeout: Duration, arch: &str) -> std::io::Result<Self> {
        Self::new(probe_timeout, Some(arch.to_owned()), Launcher::Local)
    }

    /// Workers (or, with `fake`, their doubles) as Slurm job steps.
    pub fn slurm(probe_timeout: Duration, fake: Option<&str>, srun: Srun) -> std::io::Result<Self> {
        Self::new(
            probe_timeout,
            fake.map(str::to_owned),
            Launcher::Slurm(srun),
        )
    }

    fn new(
        probe_timeout: Duration,
        fake: Option<String>,
        launcher: Launcher,
    ) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        Ok(Executor {
            trusted_exe: Arc::new(crate::os::trusted::TrustedFile::take(
                &exe,
                "the worker binary",
                "rebuild or reinstall flashtune",
            )?),
            exe,
            probe_timeout,
            fake,
            launcher,
            model: None,
        })
    }

    pub fn is_fake(&self) -> bool {
        self.fake.is_some()
    }

    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    /// The binary every worker runs.
    pub fn exe(&self) -> &std::path::Path {
        &self.exe
    }

    /// Whether the worker binary still has the bytes it had when this executor was set up.
    pub fn check_untouched(&self) -> Result<(), crate::os::trusted::Tampered> {
        self.trusted_exe.check()
    }

    /// Whether workers run on this host's GPUs (locked here by ordinal before a run starts).
    pub fn local_gpus(&self) -> bool {
        matches!(self.launcher, Launcher::Local) && !self.is_fake()
    }

    /// The measurement queues this executor feeds when it chooses them itself: the Slurm workers.
    pub fn queues(&self) -> Option<u32> {
        match &self.launcher {
            Launcher::Local => None,
            Launcher::Slurm(srun) => Some(srun.tasks),
        }
    }

    /// Whether the workers see the build cache at `cache` (and the binary) as this host does.
    pub async fn check_reach(&self, cache: &std::path::Path) -> Result<(), String> {
        match &self.launcher {
            Launcher::Local => Ok(()),
            Launcher::Slurm(srun) => srun.check_shared(&self.exe, cache).await,
        }
    }

    /// From now on every session must serve a GPU named `model`.
    pub fn expecting(mut self, model: &str) -> Self {
        self.model = Some(model.to_owned());
        self
    }

    /// Start a worker for `device`; `Err` holds why it did not start.
    pub fn start(&self, device: u32) -> Result<Session, WorkerEnd> {
        let not_started = |e: std::io::Error| WorkerEnd::NotStarted { why: e.to_string() };
        // A replaced worker would judge every case from here on: the run stops (as on SIGTERM,
        // with this reason in its `interrupted` record), and this worker does not start.
        if let Err(tampered) = self.check_untouched() {
            crate::os::stop::request_because(libc::SIGTERM, tampered.to_string());
            return Err(WorkerEnd::NotStarted {
                why: tampered.to_string(),
            });
        }
        let (mut cmd, pipe) = match &self.launcher {
            Launcher::Local => {
                let (read_end, write_end) = reply_pipe().map_err(not_started)?;
                let mut cmd = tokio::process::Command::new(&self.exe);
                cmd.arg("worker").arg("--device").arg(device.to_string());
                if let Some(arch) = &self.fake {
                    cmd.arg("--fake").arg(arch);
                }
                cmd.env(REPLY_FD_ENV, REPLY_FD.to_string());
                hand_over(&mut cmd, &write_end);
                (cmd, Some((read_end, write_end)))
            }
            Launcher::Slurm(srun) => (srun.worker_command(&self.exe, self.fake.as_deref()), None),
        };
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Its own process group, so a timeout kills whatever the worker started too. srun is ended
        // gently instead (see `SrunGroup`): killed outright it would leave its step on the node.
        let slurm = matches!(self.launcher, Launcher::Slurm(_));
        cmd.process_group(0).kill_on_drop(!slurm);
        if !slurm {
            crate::gpu::build::die_with_parent(&mut cmd);
        }
        let mut child = cmd.spawn().map_err(not_started)?;
        let group = match slurm {
            true => Group::Srun(crate::gpu::slurm::SrunGroup(child.id())),
            false => Group::Kill {
                _on_drop: crate::gpu::build::ProcessGroup(child.id()),
            },
        };
        let output = Arc::new(Mutex::new(String::new()));
        let (tx, replies) = mpsc::unbounded_channel();
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        let mut readers = Vec::new();
        match pipe {
            Some((read_end, write_end)) => {
                // The worker holds the only write end now; EOF on ours means it is gone.
                drop(write_end);
                read_replies(read_end, tx);
                readers.extend(stdout.map(|s| tokio::spawn(keep_tail(s, output.clone()))));
            }
            // srun's stdout is the worker's reply channel.
            None => {
                stdout.map(|s| tokio::spawn(reply_lines(s, tx)));
            }
        }
        readers.extend(stderr.map(|s| tokio::spawn(keep_tail(s, output.clone()))));
        tracing::info!(pid = ?child.id(), device, "worker started");
        let start_grace = match &self.launcher {
            Launcher::Slurm(srun) => srun.start_timeout(),
            Launcher::Local => Duration::ZERO,
        };
        Ok(Session {
            stdin: child.stdin.take(),
            child,
            replies,
            output,
            readers,
            group,
            alive: true,
            slurm,
            device: None,
            start_grace,
        })
    }

    /// A session ready for work: started, and under Slurm asked where it landed (its first reply
    /// says which node and GPU, which must be the run's model; the worker locked that GPU there).
    pub async fn open(&self, device: u32) -> Result<Session, WorkerEnd> {
        let mut session = self.start(device)?;
        if !session.slurm {
            return Ok(session);
        }
        let outcome = session
            .request(&WorkerRequest::Probe, self.probe_timeout)
            .await;
        let not_started = |why: String| WorkerEnd::NotStarted { why };
        let info = match (outcome.end, outcome.device) {
            (WorkerEnd::Clean, Some(info)) => info,
            // The cluster ended the step before it served: that is still the cluster's doing.
            (end @ WorkerEnd::Lost { .. }, _) => return Err(end),
            (WorkerEnd::Clean, None) => {
                return Err(not_started("the step answered without its GPU".into()))
            }
            (end, _) => {
                let why = WorkerOutcome::ended(end).trouble().unwrap_or_default();
                return Err(not_started(why));
            }
        };
        if let Some(model) = self.model.as_ref().filter(|m| **m != info.name) {
            let node = info.placement.as_ref().map_or("?", |p| p.node.as_str());
            return Err(not_started(format!(
                "node {node} has a {}, the run times a {model}: one run times one kind of GPU; constrain the steps ([slurm] extra_args, e.g. --constraint)",
                info.name
            )));
        }
        session.device = Some(info);
        Ok(session)
    }

    /// Start a worker, send one request, and let it go.
    pub async fn once(
        &self,
        device: u32,
        request: &WorkerRequest,
        timeout: Duration,
    ) -> WorkerOutcome {
        match self.start(device) {
            Ok(mut session) => session.request(request, timeout).await,
            Err(end) => WorkerOutcome {
                end,
                ..WorkerOutcome::new()
            },
        }
    }

    pub async fn probe(&self, device: u32) -> Result<DeviceInfo, String> {
        let outcome = self
            .once(device, &WorkerRequest::Probe, self.probe_timeout)
            .await;
        match (outcome.device, outcome.end) {
            (Some(d), WorkerEnd::Clean) => Ok(d),
            (None, WorkerEnd::Clean) => Err("worker answered without describing the device".into()),
            (_, end) => Err(WorkerOutcome {
                end,
                ..WorkerOutcome::new()
            }
            .trouble()
            .unwrap_or_default()),
        }
    }

    pub async fn duel(
        &self,
        device: u32,
        request: DuelRequest,
        timeout: Duration,
    ) -> WorkerOutcome {
        self.duel_each(device, request, timeout, |_| {}).await
    }

    /// A duel whose pairs are handed to `on_pair` as each arrives (a step logs and prints each case
    /// as it is judged), then returned together as `duel` does.
    pub async fn duel_each(
        &self,
        device: u32,
        request: DuelRequest,
        timeout: Duration,
        mut on_pair: impl FnMut(&DuelResult),
    ) -> WorkerOutcome {
        let request = WorkerRequest::Duel(request);
        match self.start(device) {
            Ok(mut session) => {
                session
                    .request_each(&request, timeout, |m| {
                        if let WorkerMessage::Duel(d) = m {
                            on_pair(d);
                        }
                    })
                    .await
            }
            Err(end) => WorkerOutcome::ended(end),
        }
    }

    /// The GPU's roofs, measured by a worker of its own.
    pub async fn roofs(
        &self,
        device: u32,
        dtypes: &[Dtype],
        timeout: Duration,
    ) -> Result<Vec<RoofMeasured>, String> {
        let outcome = self
            .once(
                device,
                &WorkerRequest::Roofs {
                    dtypes: dtypes.to_vec(),
                },
                timeout,
            )
            .await;
        match outcome.trouble() {
            None => Ok(outcome.roofs),
            Some(why) => Err(why),
        }
    }
}

/// The descriptor number replies arrive on, in the worker.
const REPLY_FD: i32 = 3;

fn reply_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // Close-on-exec on both ends: only the dup2 in the child's pre-exec hook hands one over.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these two open descriptors, owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn into_raw(fd: OwnedFd) -> i32 {
    use std::os::fd::IntoRawFd;
    fd.into_raw_fd()
}

/// Give the worker `write_end` as its reply descriptor [`REPLY_FD`].
fn hand_over(cmd: &mut tokio::process::Command, write_end: &OwnedFd) {
    let write_fd = write_end.as_raw_fd();
    // SAFETY: dup2 and fcntl are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if write_fd == REPLY_FD {
                // dup2 onto itself keeps close-on-exec: clear it by hand.
                if libc::fcntl(REPLY_FD, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(write_fd, REPLY_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

type Replies = mpsc::UnboundedSender<std::io::Result<String>>;

/// A plain thread reads the reply pipe: blocking reads, one line at a time, until the worker closes it.
fn read_replies(read_end: OwnedFd, tx: Replies) {
    // SAFETY: `read_end` is an open descriptor this process owns; the File takes it over.
    let file = unsafe { std::fs::File::from_raw_fd(into_raw(read_end)) };
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(file).lines() {
            let stop = line.is_err();
            if tx.send(line).is_err() || stop {
                break;
            }
        }
    });
}

/// Reply lines from a stream (srun's stdout), until it closes.
async fn reply_lines(stream: Box<dyn tokio::io::AsyncRead + Send + Unpin>, tx: Replies) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stream).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if tx.send(Ok(line)).is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// Keep the last bytes of a worker's output stream: kernels may print, crashes explain themselves there.
async fn keep_tail(
    mut stream: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    tail: Arc<Mutex<String>>,
) {
    let mut buf = vec![0u8; 8192];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let mut t = tail.lock().expect("not poisoned");
        t.push_str(&String::from_utf8_lossy(&buf[..n]));
        if t.len() > OUTPUT_TAIL_BYTES {
            let cut = t.len() - OUTPUT_TAIL_BYTES;
            let cut = (cut..t.len())
                .find(|&i| t.is_char_boundary(i))
                .unwrap_or(t.len());
            t.drain(..cut);
        }
    }
}

impl Session {
    /// Send one request and collect its replies until `Done`; anything else ends the session.
    pub async fn request(&mut self, request: &WorkerRequest, timeout: Duration) -> WorkerOutcome {
        self.request_each(request, timeout, |_| {}).await
    }

    /// `request`, with each reply also handed to `on_reply` the moment it arrives.
    pub async fn request_each(
        &mut self,
        request: &WorkerRequest,
        timeout: Duration,
        mut on_reply: impl FnMut(&WorkerMessage),
    ) -> WorkerOutcome {
        let mut outcome = WorkerOutcome::new();
        if !self.alive {
            outcome.end = WorkerEnd::Crashed {
                status: "not running".into(),
                stderr_tail: "the session ended earlier".into(),
            };
            return outcome;
        }
        let mut line = serde_json::to_vec(request).expect("requests serialize");
        line.push(b'\n');
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin.write_all(&line).await.and(stdin.flush().await),
            None => Err(std::io::Error::other("stdin closed")),
        };
        // A request that could not be sent still reads what the worker said: one that failed to
        // start writes its reason (a `Fatal` reply) and exits before it reads its stdin.
        if let Err(e) = &sent {
            tracing::debug!(error = %e, "request not sent; reading what the worker said");
        }
        let read = async {
            // The limit is on silence, not on the whole request: a variant with many large cases
            // may run for long, but a hung launch stops the replies and is caught `timeout` after
            // the last case the worker finished.
            loop {
                // A Slurm step's first reply may wait for the step to be scheduled.
                let limit = timeout + std::mem::take(&mut self.start_grace);
                let line = match tokio::time::timeout(limit, self.replies.recv()).await {
                    Err(_) => {
                        return Some(WorkerEnd::TimedOut {
                            seconds: limit.as_secs(),
                        })
                    }
                    Ok(None) => return None,
                    Ok(Some(line)) => line,
                };
                let Ok(line) = line else { return None };
                if line.trim().is_empty() {
                    continue;
                }
                let message = serde_json::from_str::<WorkerMessage>(&line);
                if let Ok(m) = &message {
                    on_reply(m);
                }
                match message {
                    Ok(WorkerMessage::Device(d)) => outcome.device = Some(d),
                    Ok(WorkerMessage::Case(c)) => outcome.cases.push(*c),
                    Ok(WorkerMessage::Duel(d)) => outcome.duels.push(*d),
                    Ok(WorkerMessage::Roofs { roofs }) => outcome.roofs = roofs,
                    Ok(WorkerMessage::Sentinel(r)) => outcome.sentinel = Some(r),
                    Ok(WorkerMessage::Fatal { message }) => return Some(WorkerEnd::Fatal(message)),
                    Ok(WorkerMessage::Done) => return Some(WorkerEnd::Clean),
                    Err(_) => return Some(WorkerEnd::Garbled { line }),
                }
            }
        };
        let end = match read.await {
            Some(end) => end,
            // The reply channel closed: the worker is gone; its exit status and output say how.
            None => {
                // srun outlives its step's task: on scancel it waits for the step to end (up to the
                // cluster's KillWait, 30 s by default) and only then prints slurmstepd's "*** STEP
                // .. CANCELLED" line, the one that says the step was lost and not crashed.
                let patience = Duration::from_secs(if self.slurm { 90 } else { 5 });
                let status = match tokio::time::timeout(patience, self.child.wait()).await {
                    Ok(Ok(s)) => s.to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "reply channel closed".into(),
                };
                // The readers reach end of file once the worker (or srun) is gone; a busy machine
                // may take a while to get there, and the last words are the crash's cause. A
                // process the worker left behind may hold the pipes open, hence the limit.
                for reader in std::mem::take(&mut self.readers) {
                    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
                }
                let tail = self.output.lock().expect("not poisoned").clone();
                let stderr_tail = crate::gpu::build::log_tail(&tail, 20);
                match self
                    .slurm
                    .then(|| crate::gpu::slurm::step_loss(&tail))
                    .flatten()
                {
                    Some(loss) => WorkerEnd::Lost {
                        loss,
                        detail: format!("srun {status}: {stderr_tail}"),
                    },
                    None => WorkerEnd::Crashed {
                        status,
                        stderr_tail,
                    },
                }
            }
        };
        // A step that died in an allocation that is over died of it (scancel of the job, its time limit).
        let end = match end {
            WorkerEnd::Lost { .. } | WorkerEnd::Crashed { .. } | WorkerEnd::NotStarted { .. }
                if self.slurm =>
            {
                match crate::gpu::slurm::allocation_ended().await {
                    Some(why) => WorkerEnd::Lost {
                        loss: StepLoss::AllocationEnded,
                        detail: why,
                    },
                    None => end,
                }
            }
            end => end,
        };
        if end != WorkerEnd::Clean {
            self.alive = false;
            match &self.group {
                Group::Kill { .. } => {
                    let _ = self.child.start_kill();
                }
                Group::Srun(srun) => srun.terminate(),
            }
        }
        tracing::info!(end = ?end, cases = outcome.cases.len(), "worker request finished");
        outcome.end = end;
        outcome
    }
}
