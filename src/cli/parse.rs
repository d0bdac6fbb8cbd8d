//! Parsers of option values that several commands share.

pub(super) fn parse_dtype(s: &str) -> std::result::Result<crate::model::config::Dtype, String> {
    match s {
        "f16" => Ok(crate::model::config::Dtype::F16),
        "bf16" => Ok(crate::model::config::Dtype::Bf16),
        other => Err(format!("unknown dtype `{other}` (f16 or bf16)")),
    }
}

/// A count that must select something: 0 would run nothing and say nothing (issue 52).
pub(super) fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 selects nothing; give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
