//! flashtune: an unattended tuning orchestrator for CUDA attention kernels.
pub mod baseline;
pub mod build;
pub mod champions;
pub mod check;
pub mod cli;
pub mod config;
pub mod decide;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod executor;
pub mod export;
pub mod fakegpu;
pub mod profile;
pub mod progress;
pub mod protocol;
pub mod ptxas;
pub mod report;
pub mod runlog;
pub mod scheduler;
pub mod space;
pub mod step;
pub mod vcs;
pub mod worker;

pub use cli::run;
