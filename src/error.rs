//! The errors that reach the user, each with its own exit code.
use std::path::PathBuf;

/// Exit codes are part of the interface: scripts branch on them.
pub mod exit_code {
    pub const FAILURE: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    pub const NO_GPU: u8 = 3;
    pub const TOOL_MISSING: u8 = 4;
    /// Another flashtune run holds the GPU (`--wait` queues behind it instead).
    pub const GPU_BUSY: u8 = 5;
    /// A write failed (a full disk, a quota, a read-only filesystem), or the free space under
    /// `runs/` or the build cache is below `[disk] min_free_gib`: sysexits' EX_IOERR.
    pub const IO: u8 = 74;
    /// Ctrl-C (SIGINT); SIGTERM and SIGHUP exit with 128 + their own number (143, 129).
    pub const INTERRUPTED: u8 = 130;
}

/// What a user without a usable GPU can do next; `tune` and `doctor` both print it.
pub const NO_GPU_NEXT_STEPS: &str = "Without a GPU: `flashtune tune --fake-gpu` runs the whole pipeline on a test double \
(1.5 to 2 minutes for the default space on two cores; `--space variants/smoke.toml` takes seconds); \
its figures are synthetic and marked so. For real figures run on a machine with an NVIDIA GPU and driver, where \
`flashtune doctor` lists anything missing. `flashtune build` compiles and gates every variant with no GPU at all.";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration file that cannot be used as written.
    #[error("{}:{}:{}: key `{}`: {}", file.display(), line, column, key, message)]
    Config {
        file: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
    #[error("{0}")]
    BadInput(String),
    /// A variant the space or the run does not have: bad input, named as MCP's tools name it.
    #[error("{0}")]
    UnknownVariant(String),
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    /// Another flashtune run holds a GPU this one needs.
    #[error("{0}")]
    GpuBusy(String),
    #[error("{tool} not found: {hint}")]
    ToolMissing { tool: String, hint: String },
    /// Too little free space to start a run.
    #[error("{0}")]
    DiskFull(String),
    /// A stop request (SIGINT, SIGTERM, SIGHUP) ended the command: it exits 128 + the signal.
    #[error("{message}")]
    Interrupted { signal: i32, message: String },
    #[error("{}", describe_other(.0))]
    Other(#[from] anyhow::Error),
}

/// A write that failed: which file, doing what, and the operating system's own words
/// ("No space left on device (os error 28)"), so the fix is obvious from the message alone.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {}: {source}", path.display())]
pub struct WriteError {
    pub what: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl WriteError {
    pub fn new(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WriteError {
            what,
            path: path.into(),
            source,
        }
    }
}

/// Whether an I/O error says the filesystem had no room (no space left, a quota reached): the
/// disk's fault, never that of what was being written.
pub fn is_out_of_room(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Whether a write failed somewhere in `e`'s chain: a [`WriteError`], or an I/O error saying the
/// filesystem had no room.
fn is_write_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<WriteError>()
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(is_out_of_room)
    })
}

/// An error from inside: its outermost message, and the chain when a write failed somewhere in it
/// (the OS cause is the part that says what to do), down to the [`WriteError`], whose own words end
/// with that cause: its source would say it a second time.
fn describe_other(e: &anyhow::Error) -> String {
    if !is_write_failure(e) {
        return e.to_string();
    }
    let mut said = Vec::new();
    for c in e.chain() {
        said.push(c.to_string());
        if c.is::<WriteError>() {
            break;
        }
    }
    said.join(": ")
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config { .. } | Error::BadInput(_) | Error::UnknownVariant(_) => {
                exit_code::BAD_INPUT
            }
            Error::NoGpu(_) => exit_code::NO_GPU,
            Error::ToolMissing { .. } => exit_code::TOOL_MISSING,
            Error::GpuBusy(_) => exit_code::GPU_BUSY,
            Error::DiskFull(_) => exit_code::IO,
            Error::Interrupted { signal, .. } => (128 + signal).clamp(0, 255) as u8,
            Error::Other(e) if is_write_failure(e) => exit_code::IO,
            Error::Other(_) => exit_code::FAILURE,
        }
    }
}

impl From<WriteError> for Error {
    fn from(e: WriteError) -> Self {
        Error::Other(anyhow::Error::new(e))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Debug builds only (tests): `FLASHTUNE_TEST_FAIL_WRITE=SITE` makes the file writes at `SITE`
/// (`head-tree`: HEAD's kernels written out for a step; `attempt-patch`: an attempt's patch) fail
/// as a full disk does, so CI shows what a full disk does to `judge` and `step` without filling one.
#[cfg(debug_assertions)]
pub fn injected_write_failure(site: &str) -> Option<std::io::Error> {
    (std::env::var("FLASHTUNE_TEST_FAIL_WRITE").ok()? == site)
        .then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
}

#[cfg(not(debug_assertions))]
pub fn injected_write_failure(_: &str) -> Option<std::io::Error> {
    None
}
