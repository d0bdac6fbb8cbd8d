//! A line of report text as spans, so each emitter marks code and emphasis its own way and no
//! emitter parses another's markup.

/// One run of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Span {
    Plain(String),
    /// A name from the run: a variant, a policy key, a flag.
    Code(String),
    /// What the reader must not miss: a failure in a cell, a warning's lead.
    Strong(String),
}

/// A line of text: spans in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text(pub Vec<Span>);

impl Text {
    pub fn new() -> Text {
        Text::default()
    }

    pub fn plain(mut self, s: impl Into<String>) -> Text {
        let s = s.into();
        if s.is_empty() {
            return self;
        }
        // Adjacent plain runs are one run: emitters escape per run, and equality stays simple.
        match self.0.last_mut() {
            Some(Span::Plain(last)) => last.push_str(&s),
            _ => self.0.push(Span::Plain(s)),
        }
        self
    }

    pub fn code(mut self, s: impl Into<String>) -> Text {
        self.0.push(Span::Code(s.into()));
        self
    }

    pub fn strong(mut self, s: impl Into<String>) -> Text {
        self.0.push(Span::Strong(s.into()));
        self
    }

    /// Appends another text's spans.
    pub fn then(mut self, other: Text) -> Text {
        for span in other.0 {
            self = match span {
                Span::Plain(s) => self.plain(s),
                span => {
                    self.0.push(span);
                    self
                }
            };
        }
        self
    }

    /// The texts one after another with `separator` between them.
    pub fn join(texts: impl IntoIterator<Item = Text>, separator: &str) -> Text {
        let mut out = Text::new();
        for (i, t) in texts.into_iter().enumerate() {
            if i > 0 {
                out = out.plain(separator);
            }
            out = out.then(t);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|s| match s {
            Span::Plain(s) | Span::Code(s) | Span::Strong(s) => s.is_empty(),
        })
    }

    /// The words without marks, for the terminal and for tests.
    pub fn words(&self) -> String {
        self.0
            .iter()
            .map(|s| match s {
                Span::Plain(s) | Span::Code(s) | Span::Strong(s) => s.as_str(),
            })
            .collect()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text::new().plain(s)
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text::new().plain(s)
    }
}

/// Three significant digits at most, so tiny decode figures do not print as 0.0.
pub fn three_digits(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}
