//! Workers as Slurm job steps: the `srun` line that starts one, what a step's end says about who ended it, whether the run's allocation still stands, and whether the nodes see this host's files.
//!
//! A worker under Slurm is the same `flashtune worker` speaking the same protocol; `srun` carries its
//! stdin, stdout and stderr, so its replies come back on stdout (see [`REPLY_ON_STDOUT`]). Inside an
//! allocation (`salloc`, `sbatch`) each `srun` is a step of that job and uses its GPUs; outside one,
//! each `srun` is a job of its own.
use crate::model::config::SlurmPolicy;
use crate::model::protocol::{Placement, REPLY_FD_ENV, REPLY_ON_STDOUT};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Why the cluster ended a worker's step: never the variant's fault, so never a quarantine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepLoss {
    /// `scancel` of the step or of its job.
    Cancelled,
    /// The step's or the job's time limit.
    TimeLimit,
    /// A job of higher priority took the resources.
    Preempted,
    /// The node stopped answering.
    NodeFailure,
    /// The allocation the run's steps belong to is gone: the run stops as on a signal.
    AllocationEnded,
}

impl StepLoss {
    pub fn describe(self) -> &'static str {
        match self {
            StepLoss::Cancelled => "the step was cancelled (scancel)",
            StepLoss::TimeLimit => "the step reached its time limit",
            StepLoss::Preempted => "the step was preempted",
            StepLoss::NodeFailure => "the node failed",
            StepLoss::AllocationEnded => "the Slurm allocation ended",
        }
    }
}

/// What Slurm's own words at the end of a step say: `slurmstepd` writes
/// `*** STEP 12.0 ON node CANCELLED AT <time> [DUE TO TIME LIMIT|PREEMPTION|NODE FAILURE] ***` (or
/// `*** JOB 12 ...`) into the step's stderr, and srun `Node failure on node`; a worker that died by
/// itself (a signal, an exit) has neither. srun's own `Job step aborted` says the controller ended
/// the step: slurmstepd's line, which says why, can be lost with the step's output under load, and
/// then the step reads as cancelled (flashtune never aborts a step through srun: it kills srun).
/// `None`: the step was not ended by the cluster.
pub fn step_loss(stderr: &str) -> Option<StepLoss> {
    let mut aborted = false;
    for line in stderr.lines() {
        aborted |= line.starts_with("srun: Job step aborted");
        if line.contains("srun: error: Node failure on") {
            return Some(StepLoss::NodeFailure);
        }
        let Some(start) = line.find("*** ") else {
            continue;
        };
        let inner = line[start + 4..].trim_end().trim_end_matches('*').trim();
        let mut words = inner.split_whitespace();
        let scope = words.next();
        let (_id, on, _node, cancelled) = (words.next(), words.next(), words.next(), words.next());
        if !matches!(scope, Some("STEP" | "JOB"))
            || on != Some("ON")
            || cancelled != Some("CANCELLED")
        {
            continue;
        }
        let reason = inner.split_once(" DUE TO ").map(|(_, r)| r.trim());
        return Some(match reason {
            Some(r) if r.starts_with("TIME LIMIT") => StepLoss::TimeLimit,
            Some(r) if r.starts_with("PREEMPTION") => StepLoss::Preempted,
            Some(r) if r.starts_with("NODE FAIL") => StepLoss::NodeFailure,
            _ => StepLoss::Cancelled,
        });
    }
    aborted.then_some(StepLoss::Cancelled)
}

/// How workers are started as job steps.
#[derive(Debug, Clone)]
pub struct Srun {
    pub policy: SlurmPolicy,
    /// Workers at once (`--tasks`, else `[slurm] tasks`).
    pub tasks: u32,
    /// Ask for `[slurm] gres` (not for the test double, which needs no GPU).
    pub gres: bool,
}

/// The job name every worker step carries, so `squeue -n` finds them.
pub const JOB_NAME: &str = "flashtune-worker";

impl Srun {
    /// srun's options for one worker: one task on one node, the policy's resources, the whole
    /// environment (the worker reads `FLASHTUNE_*`), and only the resources asked for (`--exact`), so
    /// the steps of one allocation run side by side.
    pub fn options(&self) -> Vec<String> {
        let p = &self.policy;
        let mut args = vec![
            "--ntasks=1".to_owned(),
            "--nodes=1".to_owned(),
            "--exact".to_owned(),
            "--export=ALL".to_owned(),
            format!("--job-name={JOB_NAME}"),
        ];
        if self.gres && !p.gres.is_empty() {
            args.push(format!("--gres={}", p.gres));
        }
        for (flag, value) in [
            ("partition", &p.partition),
            ("account", &p.account),
            ("time", &p.time),
        ] {
            if !value.is_empty() {
                args.push(format!("--{flag}={value}"));
            }
        }
        args.extend(p.extra_args.iter().cloned());
        args
    }

    /// `srun ... <exe> worker --device 0 [--fake ARCH]`: the step's GPU is its device 0.
    /// srun outlives nothing: it gets SIGTERM (and so cancels its step) when this process dies.
    pub fn worker_command(&self, exe: &Path, fake: Option<&str>) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("srun");
        crate::gpu::build::die_with_parent_by(&mut cmd, libc::SIGTERM);
        cmd.args(self.options())
            .arg(exe)
            .arg("worker")
            .arg("--device")
            .arg("0")
            .arg("--slurm-step");
        if let Some(arch) = fake {
            cmd.arg("--fake").arg(arch);
        }
        cmd.env(REPLY_FD_ENV, REPLY_ON_STDOUT);
        cmd
    }

    /// How long a step may take to start before the session counts as not started.
    pub fn start_timeout(&self) -> Duration {
        Duration::from_secs(self.policy.start_timeout_s)
    }

    /// Whether a step started here sees this host's flashtune binary and build cache at the same
    /// paths: the workers load the cubins the builds here wrote, by path. One step answers for the
    /// cluster (every node should mount the same file systems). `Err` says what to change.
    pub async fn check_shared(&self, exe: &Path, cache: &Path) -> Result<(), String> {
        std::fs::create_dir_all(cache)
            .map_err(|e| format!("cannot create the build cache {}: {e}", cache.display()))?;
        let token = format!(
            "flashtune {} {}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let probe = cache.join(format!(".slurm-visible-{}", std::process::id()));
        std::fs::write(&probe, &token)
            .map_err(|e| format!("cannot write {}: {e}", probe.display()))?;
        let mut cmd = tokio::process::Command::new("srun");
        cmd.args(self.options())
            .args(["sh", "-c"])
            .arg(r#"test -x "$1" || { echo "no-binary $(hostname)"; exit 0; }; cat "$2" 2>/dev/null || echo "no-cache $(hostname)""#)
            .arg("sh")
            .arg(exe)
            .arg(&probe)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let limit = self.start_timeout() + Duration::from_secs(60);
        let out = tokio::time::timeout(limit, cmd.output()).await;
        let _ = std::fs::remove_file(&probe);
        let out = match out {
            Err(_) => {
                return Err(format!(
                    "no Slurm step started within {} s ([slurm] start_timeout_s)",
                    limit.as_secs()
                ))
            }
            Ok(Err(e)) => return Err(format!("cannot run srun: {e} (is Slurm installed here?)")),
            Ok(Ok(out)) => out,
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        shared_verdict(&stdout, &stderr, &token, exe, cache)
    }
}

/// What the probe step of [`Srun::check_shared`] printed: the token it was given, or which of
/// the two paths its node could not see, or nothing (the step did not run).
#[derive(Debug, PartialEq, Eq)]
enum ProbeAnswer<'a> {
    Sees,
    NoBinary { node: &'a str },
    NoCache { node: &'a str },
    Nothing,
}

impl<'a> ProbeAnswer<'a> {
    /// The probe's one line: the token, or `no-binary HOST`, or `no-cache HOST`; anything else
    /// (a cache file holding other bytes) is a cache this node does not share.
    fn parse(stdout: &'a str, token: &str) -> ProbeAnswer<'a> {
        let answer = stdout.trim();
        if answer.is_empty() {
            return ProbeAnswer::Nothing;
        }
        if answer == token {
            return ProbeAnswer::Sees;
        }
        let mut words = answer.split_whitespace();
        let (word, node) = (words.next(), words.next().unwrap_or("the node"));
        match word {
            Some("no-binary") => ProbeAnswer::NoBinary { node },
            Some("no-cache") => ProbeAnswer::NoCache { node },
            // Another run's probe file, or bytes cached elsewhere: not this host's cache.
            _ => ProbeAnswer::NoCache { node: "the node" },
        }
    }
}

/// The verdict of [`Srun::check_shared`] from what its step printed.
pub fn shared_verdict(
    stdout: &str,
    stderr: &str,
    token: &str,
    exe: &Path,
    cache: &Path,
) -> Result<(), String> {
    let fix = "flashtune builds on this host and each worker loads the cubins by path, so every node must see the \
               binary and the build cache at the same paths as here: put both on a file system the nodes share \
               (set FLASHTUNE_CACHE_DIR to a folder there, and run a flashtune binary installed there)";
    match ProbeAnswer::parse(stdout, token) {
        ProbeAnswer::Sees => Ok(()),
        ProbeAnswer::NoBinary { node } => {
            Err(format!("{node} cannot run {}: {fix}", exe.display()))
        }
        ProbeAnswer::NoCache { node } => Err(format!(
            "{node} does not see this host's build cache {}: {fix}",
            cache.display()
        )),
        ProbeAnswer::Nothing => Err(format!(
            "srun could not run a step: {}",
            crate::gpu::build::log_tail(stderr, 3)
        )),
    }
}

/// An srun's process group, ended so that its job step ends too. srun killed outright leaves its
/// step running on the node (a worker waiting on a stdin that never closes); on SIGTERM it cancels
/// the step and exits within a fraction of a second. Dropped, it gives srun a second to finish by
/// itself (its worker saw stdin close), then SIGTERM, then SIGKILL if it is still there 5 s later.
pub struct SrunGroup(pub Option<u32>);

impl SrunGroup {
    /// Ask srun to end its step now.
    pub fn terminate(&self) {
        if let Some(pid) = self.0 {
            // SAFETY: a signal to the group this process started; a group already gone is ESRCH.
            unsafe { libc::killpg(pid as i32, libc::SIGTERM) };
        }
    }
}

impl Drop for SrunGroup {
    fn drop(&mut self) {
        let Some(pid) = self.0 else { return };
        std::thread::spawn(move || {
            for (wait, signal) in [(1, libc::SIGTERM), (5, libc::SIGKILL)] {
                if gone_within(pid, Duration::from_secs(wait)) {
                    return;
                }
                // SAFETY: as in `terminate`.
                unsafe { libc::killpg(pid as i32, signal) };
            }
        });
    }
}

/// Whether process `pid` exits (or is a zombie) within `limit`.
pub fn gone_within(pid: u32, limit: Duration) -> bool {
    let started = std::time::Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.trim_start().chars().next())
            });
        if matches!(state, None | Some('Z' | 'X')) {
            return true;
        }
        if started.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The GPUs Slurm gave this job step, in the node's own numbering (`SLURM_STEP_GPUS`, `0,2`); none
/// when the step asked for none or the cluster does not say (no gres plugin).
pub fn step_gpus() -> Result<Vec<u32>, String> {
    let Ok(list) = std::env::var("SLURM_STEP_GPUS") else {
        return Ok(Vec::new());
    };
    list.split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(|g| {
            g.parse()
                .map_err(|_| format!("SLURM_STEP_GPUS={list}: `{g}` is not a GPU number"))
        })
        .collect()
}

/// A worker started as a job step (`worker --slurm-step`) holds, on its node and for its whole life,
/// the lock of each GPU the step was given: the same lock a local run on that node takes for that
/// GPU, so a run started there by hand and a Slurm step never time on one GPU together.
pub fn lock_step_gpus() -> Result<Vec<std::fs::File>, String> {
    let node = std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| host_name());
    step_gpus()?
        .into_iter()
        .map(|g| crate::os::gpulock::try_lock_gpu(g, &format!("GPU {g} of node {node}")))
        .collect()
}

/// Where this worker runs, when Slurm started it (`SLURM_JOB_ID` set); `None` for a local worker.
pub fn placement_here() -> Option<Placement> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let job = var("SLURM_JOB_ID")?;
    let node = var("SLURMD_NODENAME").unwrap_or_else(host_name);
    Some(Placement {
        node,
        job,
        step: var("SLURM_STEP_ID"),
        gpus: var("SLURM_STEP_GPUS").or_else(|| var("CUDA_VISIBLE_DEVICES")),
    })
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer it is given.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The allocation this process runs in (`SLURM_JOB_ID`), if any: the job whose steps the workers are.
pub fn allocation() -> Option<String> {
    std::env::var("SLURM_JOB_ID")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Whether the allocation this run's steps belong to is over (cancelled, at its time limit): asked
/// of `squeue` after a step was lost. `None` when there is no allocation, it still runs, or the
/// controller cannot say (a run is not stopped on a controller's hiccup).
pub async fn allocation_ended() -> Option<String> {
    let job = allocation()?;
    let out = tokio::process::Command::new("squeue")
        .args(["-h", "-j", &job, "-o", "%T"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .ok()?
        .ok()?;
    let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match job_state(&state, &stderr) {
        JobState::Running => None,
        JobState::Ended(why) => Some(format!("Slurm job {job} {why}")),
        JobState::Unknown => None,
    }
}

/// A job's state as `squeue -h -j ID -o %T` reports it.
#[derive(Debug, PartialEq)]
pub enum JobState {
    Running,
    Ended(String),
    Unknown,
}

pub fn job_state(state: &str, stderr: &str) -> JobState {
    match state {
        "RUNNING" | "CONFIGURING" | "SUSPENDED" | "PENDING" => JobState::Running,
        "" if stderr.contains("Invalid job id") => JobState::Ended("is gone".into()),
        "" => JobState::Unknown,
        other => JobState::Ended(format!("is {}", other.to_lowercase())),
    }
}
