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

/// One `--gpus` value: an ordinal, or `all` (every GPU the host shows, as leaving the flag out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GpuPick {
    All,
    Ordinal(u32),
}

pub(super) fn parse_gpu(s: &str) -> std::result::Result<GpuPick, String> {
    match s {
        "all" => Ok(GpuPick::All),
        n => n
            .parse()
            .map(GpuPick::Ordinal)
            .map_err(|_| format!("`{n}` is not a GPU ordinal (0, 1, ...) or `all`")),
    }
}

/// The ordinals picked; none (every visible GPU) when `all` is among them or nothing was given.
pub(super) fn ordinals(picks: &[GpuPick]) -> Vec<u32> {
    if picks.contains(&GpuPick::All) {
        return Vec::new();
    }
    let mut out: Vec<u32> = Vec::new();
    for p in picks {
        if let GpuPick::Ordinal(n) = *p {
            // `--gpus 0,0` is one GPU, not two queues racing on it.
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}
