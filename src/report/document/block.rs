//! The blocks a section is made of.
use super::Text;

#[derive(Debug, Clone)]
pub enum Block {
    /// Lines of one paragraph, each on its own line.
    Paragraph(Vec<Text>),
    /// A heading inside a section (the ablation chain's shapes).
    Subheading(Text),
    List(Vec<Item>),
    /// What the reader must see before trusting the rest: a fake GPU, cases that do not add up.
    Warning {
        text: Text,
        items: Vec<Text>,
    },
    Table(Table),
    /// A plot of the report page, with what it shows.
    Figure(Figure),
    /// Why something the reader would look for is not there (a plot that has no data).
    Missing(Text),
}

impl Block {
    /// A paragraph of one line.
    pub fn line(text: impl Into<Text>) -> Block {
        Block::Paragraph(vec![text.into()])
    }

    pub fn list(items: impl IntoIterator<Item = Text>) -> Block {
        Block::List(items.into_iter().map(Item::from).collect())
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Block::Paragraph(lines) => lines.iter().all(Text::is_empty),
            Block::Subheading(t) | Block::Missing(t) => t.is_empty(),
            Block::List(items) => items.is_empty(),
            Block::Warning { text, items } => text.is_empty() && items.is_empty(),
            Block::Table(t) => t.rows.is_empty(),
            Block::Figure(_) => false,
        }
    }
}

/// A list item, with the items under it.
#[derive(Debug, Clone)]
pub struct Item {
    pub text: Text,
    pub under: Vec<Text>,
}

impl From<Text> for Item {
    fn from(text: Text) -> Item {
        Item {
            text,
            under: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    /// Figures: right-aligned so their digits line up.
    Right,
}

#[derive(Debug, Clone)]
pub struct Column {
    pub title: Text,
    pub align: Align,
}

/// A table: its columns and its rows, a cell per column.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Text>>,
    /// A column whose cells must not wrap (the variants' parameters: the id already names them).
    pub unwrapped: Option<usize>,
}

impl Table {
    pub fn new() -> Table {
        Table::default()
    }

    /// A left-aligned column (names, reasons).
    pub fn text(mut self, title: impl Into<Text>) -> Table {
        self.columns.push(Column {
            title: title.into(),
            align: Align::Left,
        });
        self
    }

    /// A right-aligned column (figures).
    pub fn figure(mut self, title: impl Into<Text>) -> Table {
        self.columns.push(Column {
            title: title.into(),
            align: Align::Right,
        });
        self
    }

    pub fn row(&mut self, cells: Vec<Text>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "a cell per column");
        self.rows.push(cells);
    }
}

/// A colour key entry of a bar chart: its colour and what it stands for.
#[derive(Debug, Clone)]
pub struct Swatch {
    pub rgb: (u8, u8, u8),
    pub label: String,
}

#[derive(Debug, Clone)]
pub struct Figure {
    /// The plot as an inline SVG document.
    pub svg: String,
    pub key: Vec<Swatch>,
    pub caption: Option<Text>,
}
