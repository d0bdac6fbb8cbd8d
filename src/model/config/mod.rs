//! Loads `policies.toml` (and any TOML file) strictly, with errors that name file, line, column and key.
pub mod errors;
mod load;
mod paths;
pub mod policies;
pub mod shape;

pub use errors::{
    config_error_at_key, config_error_at_text, config_error_in_shape, line_column, parse_toml,
    read_text,
};
pub use paths::ProjectPaths;
pub use policies::{
    default_verified_replays, text_for_hash, unknown_placeholders, AgentTemplate, BaselinePolicy,
    BottleneckRule, BuildPolicy, DiskPolicy, Gates, GpuStatePolicy, GuidedPolicy, GuidedRule,
    MeasurePolicy, Policies, ProfilePolicy, SandboxPolicy, SentinelPolicy, SlurmPolicy, StepPolicy,
    TargetLimits, Timeouts, Tolerance, AGENT_PLACEHOLDERS, MAX_TIMEOUT_S,
};
pub use shape::{
    Causal, Dtype, Shape, MAX_HEADS, MAX_SEQ_LEN, MAX_SHAPE_BYTES, SUPPORTED_HEAD_DIMS,
};
