//! Requests to stop a run: SIGINT, SIGTERM and SIGHUP. The first finishes the measurement in flight, then the run logs `interrupted`, writes its reports and exits 128 + the signal; the second stops at once; no child process outlives the run.
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

/// Start listening for SIGINT, SIGTERM and SIGHUP (once per process; later calls do nothing). From
/// then on these signals no longer kill the process: the run must ask [`requested`].
pub fn listen() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
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

/// Record one request, as a signal would (tests and the signal listener call it).
pub fn request(signo: i32) {
    let _ = FIRST.compare_exchange(0, signo, Ordering::SeqCst, Ordering::SeqCst);
    let count = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    changes().send_replace(count);
    let name = name(signo);
    match count {
        1 => eprintln!(
            "\n{}: finishing the measurement in flight, then writing the reports; send it again to stop at once.",
            describe(signo)
        ),
        2 => {
            eprintln!("\n{name} again: stopping now (the reports follow within {GRACE_S} s).");
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_secs(GRACE_S));
                eprintln!("flashtune: still running {GRACE_S} s after the second signal: exiting now.");
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
    let mut r = describe(first);
    if count() >= 2 {
        r.push_str(", then a second signal: the measurement in flight was abandoned");
    }
    r
}

/// Kill every child process group of this process (workers, nvcc with its cicc and ptxas, ncu with
/// the worker it profiles, a proposer), then the children themselves. Every child flashtune starts
/// leads a process group of its own, so killing the group reaches its whole tree.
pub fn kill_children() {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces and parentheses): state, ppid, pgrp.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(ppid), Some(pgrp)) = (
            fields.get(1).and_then(|f| f.parse::<i32>().ok()),
            fields.get(2).and_then(|f| f.parse::<i32>().ok()),
        ) else {
            continue;
        };
        if ppid != me {
            continue;
        }
        // SAFETY: signals to processes this process started; a pid already gone is a harmless ESRCH.
        unsafe {
            if pgrp == pid {
                libc::killpg(pid, libc::SIGKILL);
            }
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Leave now: children first, so none outlives the run.
fn exit_now() -> ! {
    kill_children();
    std::process::exit(i32::from(exit_code()));
}
