//! The run log `runs/<id>/log.jsonl`: a header, then one record per event, each appended and flushed before anything depends on it.
pub mod legacy;
mod reader;
mod record;
mod sealed;
mod writer;

pub use reader::{path_in, read, sort_by_start, LoadedLog, TimedCase};
pub use record::{
    AgentSettings, Citation, EarlierFigure, Entry, Header, Idea, Leader, RankReason, Ranked,
    Record, RunCommand, TimedOutStage, SCHEMA_VERSION,
};
pub use sealed::{read_sealed, read_sealed_with, SealedLog, Unsealed};
pub use writer::RunLog;
// `sealed` appends its seals the way the log appends its records.
use writer::append_whole;
