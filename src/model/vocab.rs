//! Words every layer shares and that depend on nothing: a variant parameter's value and the conditions a figure may be measured under. They sit below config, space and protocol so those three need not import one another in a circle.
use serde::{Deserialize, Serialize};

/// What a figure may have been measured under, besides the kernel itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Clocks held down for heat (software or hardware thermal slowdown).
    Thermal,
    /// Clocks held down by the hardware power brake (a signal from outside the GPU: the board or
    /// the system's power supply). The software power cap is not a condition: a heavy kernel meets
    /// the board's power limit on every run, on any GPU, so its figure is the figure users get.
    Power,
    /// Another process had a compute context on the GPU.
    Neighbour,
}

impl Condition {
    pub fn describe(self) -> &'static str {
        match self {
            Condition::Thermal => "thermal throttling",
            Condition::Power => "power throttling",
            Condition::Neighbour => "another process on the GPU",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Condition::Thermal => "thermal",
            Condition::Power => "power",
            Condition::Neighbour => "neighbour",
        }
    }
}

/// A parameter value as written in a variants file: an integer or a symbolic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ParamValue {
    Int(i64),
    Name(String),
}

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Name(s) => f.write_str(s),
        }
    }
}
