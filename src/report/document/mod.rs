//! The report as a typed document: sections with ids, each a list of blocks (paragraphs, lists,
//! tables, warnings, figures) whose text is spans (plain, code, strong). `report.md`, `report.html`
//! and the terminal summary are emitters of it (`report::emit`); none reads another's output back,
//! and nothing decides anything on a section's text.
mod block;
mod text;

pub use block::{Align, Block, Column, Figure, Item, Swatch, Table};
pub use text::{three_digits, Span, Text};

/// What a section of the report holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionId {
    /// The GPU, the fake-GPU warning and the case accounting (the title is the document's).
    Header,
    /// Every variant's row, with the notes under the table.
    Variants,
    BestPerShape,
    /// The report page's plots (the page adds them; Markdown has none).
    Plots,
    Reused,
    NotMeasured,
    Implausible,
    GpuState,
    Drift,
    AblationChain,
    Factors,
    Proposals,
    Profiles,
    Failures,
    NeverAChampion,
    NotBuilt,
    RunStatistics,
    /// How the run ended: interrupted, finished, a torn last line.
    Ending,
}

/// One section: its heading (none for the header, the variants table and the ending, which
/// follow the title), its blocks, and, for a section the terminal summary counts instead of
/// showing, how many items it lists.
#[derive(Debug, Clone)]
pub struct Section {
    pub id: SectionId,
    pub heading: Option<Text>,
    pub blocks: Vec<Block>,
    pub items: usize,
}

impl Section {
    pub fn new(id: SectionId, heading: impl Into<Option<Text>>) -> Section {
        Section {
            id,
            heading: heading.into(),
            blocks: Vec::new(),
            items: 0,
        }
    }

    /// Adds a block; one with nothing in it (an empty list, a table without rows) is left out.
    pub fn push(&mut self, block: Block) -> &mut Section {
        if !block.is_empty() {
            self.blocks.push(block);
        }
        self
    }

    pub fn counting(mut self, items: usize) -> Section {
        self.items = items;
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct Document {
    pub title: String,
    pub sections: Vec<Section>,
}

impl Document {
    /// Adds a section; one with no blocks (nothing to say) is left out.
    pub fn push(&mut self, section: Section) {
        if !section.blocks.is_empty() {
            self.sections.push(section);
        }
    }

    pub fn section(&self, id: SectionId) -> Option<&Section> {
        self.sections.iter().find(|s| s.id == id)
    }
}
