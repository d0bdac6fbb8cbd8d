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
    pub const INTERRUPTED: u8 = 130;
}

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
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    /// Another flashtune run holds a GPU this one needs.
    #[error("{0}")]
    GpuBusy(String),
    #[error("{tool} not found: {hint}")]
    ToolMissing { tool: &'static str, hint: String },
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config { .. } | Error::BadInput(_) => exit_code::BAD_INPUT,
            Error::NoGpu(_) => exit_code::NO_GPU,
            Error::ToolMissing { .. } => exit_code::TOOL_MISSING,
            Error::GpuBusy(_) => exit_code::GPU_BUSY,
            Error::Other(_) => exit_code::FAILURE,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
