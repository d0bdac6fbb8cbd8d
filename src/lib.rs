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
//! - [`agent::step_history`]`(&model::config::ProjectPaths) -> Result<Vec<pack::HistoryEntry>>`: every
//!   step and candidate tried on the project, across sessions.
//! - [`agent::session`] and [`agent::resume`]: an agent session (`step --agent/--candidates`).
pub mod agent;
pub mod cli;
pub mod error;
pub mod gpu;
pub mod log;
pub mod mcp;
pub mod model;
pub mod os;
pub mod pack;
pub mod report;
pub mod run;
pub mod step;

pub use cli::run;
