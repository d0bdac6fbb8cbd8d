//! Parsers of option values that several commands share.

pub(super) fn parse_dtype(s: &str) -> std::result::Result<crate::model::config::Dtype, String> {
    match s {
        "f16" => Ok(crate::model::config::Dtype::F16),
        "bf16" => Ok(crate::model::config::Dtype::Bf16),
        other => Err(format!("unknown dtype `{other}` (f16 or bf16)")),
    }
}
