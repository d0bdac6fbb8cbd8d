//! Every integration test, one binary (one link of the crate instead of one per file): a module per
//! topic. Helpers the topics share live in `common`.
mod common;

mod agent;
mod agent_cli;
mod anytime;
mod config_and_geometry;
mod config_errors;
mod edit_stops;
mod edit_tree;
mod exports;
mod git;
mod gpu;
mod layering;
mod mcp;
mod measurements;
mod ncu_fixtures;
mod night;
mod pipeline;
mod planning;
mod ptxas_fixtures;
mod racing;
mod real_builds;
mod reference_library;
mod report_snapshots;
mod reports;
mod run_log;
mod sandbox;
mod seals;
mod search;
mod several_gpus;
mod slurm;
mod source_shape;
mod step;
mod supervision;
mod trust;
mod unit;
