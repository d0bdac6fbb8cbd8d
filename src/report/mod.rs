//! Reading a run for people: the Markdown report and its sections, the findings, plots and HTML page, the exports, the champions and the roofs. Every figure comes from a log record.
pub mod champions;
pub mod export;
pub mod findings;
pub mod html;
pub mod markdown;
pub mod plots;
pub mod roofs;
