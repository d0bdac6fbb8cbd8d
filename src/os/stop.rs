//! Requests to stop a run: SIGINT, SIGTERM and SIGHUP. The first does what the command's `FirstStop` says (a tune finishes the measurement in flight; a step, a judge or an agent session drops the step in flight and restores its edit; the MCP server stops its judge), then the run logs `interrupted` and exits 128 + the signal; the second stops at once; no child process outlives the run.
//!
//! systemd, Slurm at its time limit, `docker stop` and `timeout` send SIGTERM; a closed ssh session
//! sends SIGHUP. All three mean the same to a run, so they are handled alike. The requests are kept
//! process-wide (a signal that lands between two stages, or before the scheduler started, is not
//! lost), and every stage asks [`requested`] or waits on [`reached`].
//!
//! After the second request the run has [`GRACE_S`] seconds to write its `interrupted` record and its
//! reports; then (or at a third request) every child process group is killed and the process exits.
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::watch;

/// Seconds between the second request and the exit that no longer waits for the run (Slurm's
/// default KillWait is 30 s, systemd's TimeoutStopSec 90 s: both leave room for this).
pub const GRACE_S: u64 = 20;

static COUNT: AtomicU32 = AtomicU32::new(0);
static FIRST: AtomicI32 = AtomicI32::new(0);
static LISTENING: AtomicBool = AtomicBool::new(false);
static CHANGES: OnceLock<watch::Sender<u32>> = OnceLock::new();

fn changes() -> &'static watch::Sender<u32> {
    CHANGES.get_or_init(|| watch::channel(0).0)
}

/// What the first stop request does to the command that listens, said when it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstStop {
    /// A tune: the measurement in flight finishes, then the reports are written.
    FinishesTheMeasurement,
    /// A step, a judge or an agent session: the step in flight is dropped and its edit restored.
    DropsTheStep,
    /// The MCP server: its client is let go, and its judge is stopped as a run is.
    EndsTheServer,
}

static FIRST_STOP: OnceLock<FirstStop> = OnceLock::new();

/// Start listening for SIGINT, SIGTERM and SIGHUP (once per process; later calls do nothing). From
/// then on these signals no longer kill the process: the run must ask [`requested`].
pub fn listen() -> std::io::Result<()> {
    listen_as(FirstStop::FinishesTheMeasurement)
}

/// [`listen`], for a command whose first stop request does what `first` says.
pub fn listen_as(first: FirstStop) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let _ = FIRST_STOP.set(first);
    if LISTENING.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            let signo = tokio::select! {
                Some(()) = int.recv() => libc::SIGINT,
                Some(()) = term.recv() => libc::SIGTERM,
                Some(()) = hup.recv() => libc::SIGHUP,
                else => return,
            };
            request(signo);
        }
    });
    Ok(())
}

/// Why a run stopped when no signal of its own said so (the Slurm allocation its workers ran in
/// ended): the `interrupted` record names it instead of the signal.
static BECAUSE: OnceLock<String> = OnceLock::new();

/// A stop request from outside any signal, as if `signo` had arrived first: `why` is logged. Does
/// nothing once a stop was requested.
pub fn request_because(signo: i32, why: String) {
    // A stop already requested (the same end seen as a signal, or by another worker) is not doubled.
    if requested().is_none() {
        crate::tell!("\n{why}");
        let _ = BECAUSE.set(why);
        request(signo);
    }
}

/// Record one request, as a signal would (tests and the signal listener call it).
pub fn request(signo: i32) {
    let _ = FIRST.compare_exchange(0, signo, Ordering::SeqCst, Ordering::SeqCst);
    let count = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    changes().send_replace(count);
    let name = name(signo);
    match count {
        1 => match FIRST_STOP.get() {
            Some(FirstStop::DropsTheStep) => crate::tell!(
                "\n{}: dropping the step in flight, restoring its edit and keeping its patch.",
                describe(signo)
            ),
            Some(FirstStop::EndsTheServer) => crate::tell!(
                "\n{}: ending the MCP server; a judge in flight is stopped and its edit restored.",
                describe(signo)
            ),
            _ => crate::tell!(
                "\n{}: finishing the measurement in flight, then writing the reports; send it again to stop at once.",
                describe(signo)
            ),
        },
        2 => {
            crate::tell!("\n{name} again: stopping now (the reports follow within {GRACE_S} s).");
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_secs(GRACE_S));
                crate::tell!("flashtune: still running {GRACE_S} s after the second signal: exiting now.");
                exit_now();
            });
        }
        _ => exit_now(),
    }
}

/// The first signal received, if any.
pub fn requested() -> Option<i32> {
    match FIRST.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// How many stop requests arrived.
pub fn count() -> u32 {
    COUNT.load(Ordering::SeqCst)
}

/// Resolves once at least `n` requests arrived (at once if they already did).
pub async fn reached(n: u32) {
    let mut rx = changes().subscribe();
    let _ = rx.wait_for(|&c| c >= n).await;
}

/// The exit code of an interrupted run: 128 + the first signal (130 for Ctrl-C, 143 for SIGTERM).
pub fn exit_code() -> u8 {
    requested().map_or(crate::error::exit_code::INTERRUPTED, |s| {
        (128 + s).clamp(0, 255) as u8
    })
}

pub fn name(signo: i32) -> &'static str {
    match signo {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// The signal as a person would name what happened.
pub fn describe(signo: i32) -> String {
    match signo {
        libc::SIGINT => "Ctrl-C (SIGINT)".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP (the terminal or ssh session closed)".into(),
        s => format!("signal {s}"),
    }
}

/// The `interrupted` record's reason: the first signal, and whether a second one cut the run short.
pub fn reason() -> String {
    let Some(first) = requested() else {
        return "stopped".into();
    };
    let mut r = BECAUSE.get().cloned().unwrap_or_else(|| describe(first));
    if count() >= 2 {
        r.push_str(", then a second signal: the measurement in flight was abandoned");
    }
    r
}

/// End every child process group of this process (workers, srun with its job step, nvcc with its
/// cicc and ptxas, ncu with the worker it profiles, a proposer), then the children themselves: first
/// SIGTERM, on which srun cancels its step on the node (killed outright it would leave the step
/// running), then, for whatever is still there after [`TERM_WAIT_MS`], SIGKILL. Every child
/// flashtune starts leads a process group of its own, so signalling the group reaches its whole tree.
pub fn kill_children() {
    let children = children();
    if children.is_empty() {
        return;
    }
    signal_all(&children, libc::SIGTERM);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(TERM_WAIT_MS)
        && children.iter().any(|&(pid, _)| running(pid))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_all(&children, libc::SIGKILL);
}

/// How long children get to end on SIGTERM before SIGKILL (srun needs a few tens of ms).
pub const TERM_WAIT_MS: u64 = 3000;

fn signal_all(children: &[(i32, bool)], signal: i32) {
    for &(pid, leads_group) in children {
        // SAFETY: signals to processes this process started; a pid already gone is a harmless ESRCH.
        unsafe {
            if leads_group {
                libc::killpg(pid, signal);
            }
            libc::kill(pid, signal);
        }
    }
}

/// Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Alive and not a zombie.
fn running(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| !matches!(f.first().map(String::as_str), Some("Z" | "X")))
}

/// This process's children: (pid, whether it leads its own process group).
fn children() -> Vec<(i32, bool)> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            // state, ppid, pgrp
            let fields = stat_fields(pid)?;
            let ppid = fields.get(1)?.parse::<i32>().ok()?;
            let pgrp = fields.get(2)?.parse::<i32>().ok()?;
            (ppid == me).then_some((pid, pgrp == pid))
        })
        .collect()
}

/// Leave now: children first, so none outlives the run.
fn exit_now() -> ! {
    kill_children();
    std::process::exit(i32::from(exit_code()));
}

/// The file `flashtune guard` writes its command's exit code into when the command ends, if set.
pub const GUARD_EXIT_FILE: &str = "FLASHTUNE_GUARD_EXIT_FILE";

/// A proposer's or agent's shell command, run through `flashtune guard` so that it ends with this
/// process however this process ends, SIGKILL included: the guard is the leader of the command's
/// process group and gets SIGTERM when its parent dies (`PR_SET_PDEATHSIG`); it then kills the
/// whole group, every background process the command started included. (A process that leaves
/// the group, by `setsid`, is beyond any group kill.)
pub fn guarded_shell(command: &str) -> std::io::Result<tokio::process::Command> {
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.arg("guard").arg("--").arg(command).process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    Ok(cmd)
}

extern "C" fn kill_own_group(_: libc::c_int) {
    // SAFETY: kill is async-signal-safe; 0 is this process's own group, the guard included.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
}

/// `flashtune guard -- COMMAND`: run `sh -c COMMAND` in this process's group and exit as it exits;
/// on SIGTERM, SIGINT or SIGHUP (its parent's death among them) kill the whole group first.
pub fn guard(command: &str) -> std::process::ExitCode {
    // SAFETY: the handler only calls kill, which is async-signal-safe.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(signal, kill_own_group as *const () as libc::sighandler_t);
        }
        // The parent died before the death signal was armed: nobody is waiting for this command.
        if libc::getppid() == 1 {
            return std::process::ExitCode::from(129);
        }
    }
    use std::os::unix::process::ExitStatusExt;
    match std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .status()
    {
        Ok(status) => {
            let code = match (status.code(), status.signal()) {
                (Some(code), _) => code,
                (None, Some(signal)) => 128 + signal,
                (None, None) => 1,
            };
            // Where asked, the command's end is written down: a session killed after it finished
            // still knows, on resume, that the edit it left is whole.
            if let Some(path) = std::env::var_os(GUARD_EXIT_FILE) {
                let tmp = std::path::PathBuf::from(&path).with_extension("tmp");
                if std::fs::write(&tmp, format!("{code}\n")).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
            }
            std::process::ExitCode::from(code as u8)
        }
        Err(e) => {
            crate::tell!("flashtune guard: cannot run sh: {e}");
            std::process::ExitCode::from(127)
        }
    }
}
