//! `flashtune worker --device N`: the only process that touches the GPU. It serves one GPU for its life, answering requests with the trials of `trial`, run on CUDA through cudarc.
use crate::model::protocol::{WorkerMessage, REPLY_FD_ENV, REPLY_ON_STDOUT};
use gpu::Gpu;
use std::io::Write;

mod device;
pub mod gpu;
mod launch;
mod nvml;
mod staging;
mod timing;

/// The worker's own kernels (tools.cu, compiled to PTX): input generation, checksums, masks, the comparison, read roof, sentinel.
pub const TOOLS_PTX: &str = include_str!("tools.ptx");

/// Entry point of the subcommand: serve requests on stdin until it closes. A Slurm step's worker
/// (`slurm_step`) first locks the GPUs the cluster gave it, on its node, for its life.
pub fn serve(device: u32, slurm_step: bool) -> std::process::ExitCode {
    let mut reply = reply_channel();
    let locks = match slurm_step {
        true => crate::gpu::slurm::lock_step_gpus(),
        false => Ok(Vec::new()),
    };
    let _locks = match locks {
        Ok(l) => l,
        Err(message) => {
            reply(&WorkerMessage::Fatal { message });
            return std::process::ExitCode::from(1);
        }
    };
    let gpu = match Gpu::open(device) {
        Ok(g) => g,
        Err(e) => {
            reply(&WorkerMessage::Fatal {
                message: format!("{e:#}"),
            });
            return std::process::ExitCode::from(1);
        }
    };
    // Input pools may take this share of the GPU's memory; the rest is the kernels' and the roofs'.
    let cap = gpu.info.total_memory_bytes / 10 * 4;
    crate::gpu::trial::serve(gpu, std::io::stdin().lock(), &mut reply, cap)
}

/// Where replies go: the descriptor the supervisor handed over in `FLASHTUNE_REPLY_FD`, else stdout.
pub fn reply_channel() -> impl FnMut(&WorkerMessage) {
    use std::os::fd::FromRawFd;
    let mut out: Box<dyn Write> = match reply_fd() {
        // SAFETY: the supervisor opened this descriptor for us (or `reply_fd` made it) and nothing
        // else in the process writes to it.
        Some(fd) => Box::new(unsafe { std::fs::File::from_raw_fd(fd) }),
        None => Box::new(std::io::stdout()),
    };
    move |msg: &WorkerMessage| {
        let mut line = serde_json::to_vec(msg).expect("replies serialize");
        line.push(b'\n');
        let _ = out.write_all(&line);
        let _ = out.flush();
    }
}

/// The reply descriptor, settled once: the number in `FLASHTUNE_REPLY_FD`; for
/// [`REPLY_ON_STDOUT`] (a Slurm step, whose stdout is the only way back) a copy of stdout, after
/// which fd 1 points at stderr, so what a kernel or a library prints cannot reach the reply channel;
/// `None` (a worker run by hand): stdout itself.
pub fn reply_fd() -> Option<i32> {
    static FD: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *FD.get_or_init(|| {
        let value = std::env::var(REPLY_FD_ENV).ok()?;
        if value != REPLY_ON_STDOUT {
            return value.parse().ok();
        }
        let _ = std::io::stdout().flush();
        // SAFETY: fcntl and dup2 on the process's own standard descriptors.
        unsafe {
            let fd = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
            if fd < 0 || libc::dup2(2, 1) < 0 {
                return None;
            }
            Some(fd)
        }
    })
}

/// Whether a CUDA driver library can be loaded at all; cudarc panics when it cannot.
pub fn driver_library_present() -> bool {
    library_present(&["libcuda.so.1", "libcuda.so"])
}

fn library_present(names: &[&str]) -> bool {
    names.iter().any(|name| {
        let Ok(c) = std::ffi::CString::new(*name) else {
            return false;
        };
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        !handle.is_null()
    })
}

pub fn arch_for(cc: (i32, i32)) -> String {
    // The `a` targets keep Hopper/Blackwell-only instructions (wgmma, tcgen05) available.
    match cc {
        (9, 0) | (10, 0) | (10, 3) | (12, 0) => format!("sm_{}{}a", cc.0, cc.1),
        _ => format!("sm_{}{}", cc.0, cc.1),
    }
}

/// Whether the embedded PTX says which compiler built it (the test compares it with its source).
pub fn tools_ptx_compiler() -> Option<&'static str> {
    TOOLS_PTX
        .lines()
        .find(|l| l.starts_with("// Cuda compilation tools"))
        .map(|l| l.trim_start_matches("// "))
}
