//! GPU locks: one flashtune run per GPU at a time, held as an flock on a file in the temp folder of the GPU's own host that names the holder's pid, keyed on the GPU's number there: the orchestrator takes it for a local run, a Slurm step's worker on its node for the GPUs the cluster gave it, so the two exclude each other.
use crate::error::{Error, Result};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;

/// What a run does when another flashtune run holds one of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenBusy {
    /// Exit at once with [`crate::error::exit_code::GPU_BUSY`].
    #[default]
    Refuse,
    /// Queue behind the holder (`--wait`): two overnight runs follow each other.
    Wait,
}

fn open(name: &str) -> std::io::Result<(File, std::path::PathBuf)> {
    let path = std::env::temp_dir().join(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)?;
    Ok((file, path))
}

fn flock(file: &File, operation: i32) -> bool {
    // SAFETY: flock on a descriptor this process holds open.
    unsafe { libc::flock(file.as_raw_fd(), operation) == 0 }
}

fn claim(mut file: File) -> File {
    file.set_len(0).ok();
    let _ = write!(file, "{}", std::process::id());
    file
}

fn lock_name(device: u32) -> String {
    format!("flashtune-gpu{device}.lock")
}

/// Local GPU `device`: refuse with the holder's pid, or wait for it.
pub fn lock_gpu(device: u32, when_busy: WhenBusy) -> Result<File> {
    let name = lock_name(device);
    let (file, path) = open(&name).map_err(|e| {
        Error::Other(anyhow::anyhow!(
            "cannot open {}: {e}",
            std::env::temp_dir().join(&name).display()
        ))
    })?;
    if !flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        let holder = holder.trim();
        if when_busy == WhenBusy::Refuse {
            return Err(Error::GpuBusy(format!(
                "GPU {device} is in use by another flashtune run (pid {holder}); pass --wait to queue behind it, or pick another GPU with --gpus"
            )));
        }
        crate::tell!("GPU {device} is in use by another flashtune run (pid {holder}); waiting for it to finish (--wait)");
        // Blocking on purpose: nothing else of this run has started, and Ctrl-C still ends it.
        while !flock(&file, libc::LOCK_EX) {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Other(anyhow::anyhow!(
                    "cannot wait for the lock {}: {err}",
                    path.display()
                )));
            }
        }
    }
    Ok(claim(file))
}

/// GPU `device` of this host, now or never (a Slurm step's, which cannot wait: the cluster gave it
/// that GPU); `Err` says who holds it, `what` naming the GPU.
pub fn try_lock_gpu(device: u32, what: &str) -> std::result::Result<File, String> {
    let (file, path) =
        open(&lock_name(device)).map_err(|e| format!("cannot open the lock of {what}: {e}"))?;
    if !flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(format!(
            "{what} is in use by another flashtune run (pid {} on that host)",
            holder.trim()
        ));
    }
    Ok(claim(file))
}
