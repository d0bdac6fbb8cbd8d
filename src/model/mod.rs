//! Layer 1, the vocabulary: the project's configuration, the variant space, the plan of cases, and the protocol between driver and worker. Pure data and its validation; no I/O but reading the project's TOML.
pub mod config;
pub mod plan;
pub mod protocol;
pub mod space;
pub mod usage;
pub mod vocab;
