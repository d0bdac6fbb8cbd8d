//! The report as a document of sections with ids: `report.md` is its sections in order, the HTML
//! page and the terminal summary choose and place sections by id. Nothing reads a section's text
//! back to decide anything.

/// What a section of the report holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionId {
    /// The run line, the GPU, the fake-GPU warning and the case accounting.
    Header,
    /// Every variant's row, with the notes under the table.
    Variants,
    BestPerShape,
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

/// One section: its Markdown (from its `\n## ` heading on) and, for a section the terminal summary
/// counts instead of showing, how many items it lists.
#[derive(Debug, Clone)]
pub struct Section {
    pub id: SectionId,
    pub markdown: String,
    pub items: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Document {
    pub title: String,
    pub sections: Vec<Section>,
}

impl Document {
    /// Adds a section; an empty one (nothing to say) is left out.
    pub fn push(&mut self, id: SectionId, markdown: String, items: usize) {
        if !markdown.is_empty() {
            self.sections.push(Section {
                id,
                markdown,
                items,
            });
        }
    }

    pub fn section(&self, id: SectionId) -> Option<&Section> {
        self.sections.iter().find(|s| s.id == id)
    }

    /// `report.md`: every section in order.
    pub fn markdown(&self) -> String {
        self.sections.iter().map(|s| s.markdown.as_str()).collect()
    }
}
