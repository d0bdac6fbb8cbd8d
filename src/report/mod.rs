//! Reading a run for people: the report as a typed document of sections and its emitters
//! (Markdown, HTML, the terminal), the findings, plots, exports, champions and roofs. Every figure
//! comes from a log record.
pub mod champions;
pub mod document;
pub mod emit;
pub mod export;
pub mod findings;
pub mod plots;
pub mod roofs;
pub mod sections;
pub mod timeline;
