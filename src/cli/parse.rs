//! Parsers of option values that several commands share.

pub(super) fn parse_dtype(s: &str) -> std::result::Result<crate::config::Dtype, String> {
    match s {
        "f16" => Ok(crate::config::Dtype::F16),
        "bf16" => Ok(crate::config::Dtype::Bf16),
        other => Err(format!("unknown dtype `{other}` (f16 or bf16)")),
    }
}
