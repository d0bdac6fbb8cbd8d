//! The report's formats, one file each, all emitters of one typed `Document` (hyperfine's
//! `Exporter`): none reads another's output, and each marks text its own way.
mod html;
mod markdown;
mod terminal;

use crate::report::document::Document;
pub use html::Html;
pub use markdown::Markdown;
pub use terminal::Terminal;

/// One format of the report.
pub trait Emitter {
    fn emit(&self, doc: &Document) -> String;
}
