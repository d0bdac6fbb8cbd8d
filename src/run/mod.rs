//! Running a tune: what every command shares (the project, the event stream, options), the scheduler, the strategies (exhaustive, anytime, guided search, ablation), duels, and the sandbox proposers run in.
pub mod ablate;
pub mod anytime;
pub mod budget;
pub mod duel;
pub mod engine;
pub mod measure;
pub mod sandbox;
pub mod scheduler;
pub mod search;
pub mod shared;
