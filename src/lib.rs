//! flashtune: an unattended tuning orchestrator for CUDA attention kernels.
//!
//! The workbench an agent drives (the CLI's `judge`, `context` and `history --json`, and an MCP
//! server) calls these, whose names and signatures stay stable:
//! - [`agent::judge_working_tree`]`(agent::JudgeOptions) -> Result<agent::JudgeVerdict>`: the
//!   working tree's edit under kernels/ judged as `flashtune step` does (build, checks, interleaved
//!   duel against HEAD's champion), committed or restored; the verdict (serde) read from its log.
//! - [`agent::context_pack`]`(&agent::ContextOptions) -> Result<pack::ContextPack>`: the pack for the
//!   next step at HEAD (cases, champion figures and % of roofs, bottleneck, guided rules, history);
//!   [`agent::write_context_pack`] writes it as AGENTS.md, PROMPT.md and context/.
//! - [`agent::step_history`]`(&config::ProjectPaths) -> Result<Vec<pack::HistoryEntry>>`: every
//!   step and candidate tried on the project, across sessions.
//! - [`agent::session`] and [`agent::resume`]: an agent session (`step --agent/--candidates`).
pub mod ablate;
pub mod agent;
pub mod anytime;
pub mod baseline;
pub mod build;
pub mod champions;
pub mod check;
pub mod cli;
pub mod config;
pub mod decide;
pub mod doctor;
pub mod duel;
pub mod engine;
pub mod error;
pub mod executor;
pub mod export;
pub mod fakegpu;
pub mod findings;
pub mod gpulock;
pub mod html;
pub mod mcp;
pub mod measure;
pub mod pack;
pub mod plan;
pub mod plots;
pub mod profile;
pub mod progress;
pub mod protocol;
pub mod ptxas;
pub mod report;
pub mod roofs;
pub mod run;
pub mod runindex;
pub mod runlog;
pub mod sandbox;
pub mod scheduler;
pub mod seal;
pub mod search;
pub mod slurm;
pub mod space;
pub mod step;
pub mod stop;
pub mod store;
pub mod toolchain;
pub mod trial;
pub mod trusted;
pub mod usage;
pub mod vcs;
pub mod vocab;
pub mod worker;

pub use cli::run;
