//! The report's Profiles section: one line per Nsight Compute profile.
use crate::report::document::Text;

/// One line per profile: the bottlenecks, then the figures that show them.
pub fn profile_text(p: &crate::gpu::profile::ProfileOutcome, line: usize) -> Text {
    use crate::gpu::profile::ProfileOutcome as P;
    match p {
        P::Profiled {
            kernels,
            bottlenecks,
            ..
        } => {
            let figures: Vec<String> = kernels
                .iter()
                .map(|k| {
                    let f = |m: &str| k.get(m).map_or("?".into(), |v| format!("{v:.0}"));
                    let short = k.kernel.split('(').next().unwrap_or(&k.kernel);
                    format!(
                        "{short}: SM {}%, DRAM {}%, warps active {}%, tensor pipe {}%, waves {}, {} regs",
                        f("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                        f("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                        f("sm__warps_active.avg.pct_of_peak_sustained_active"),
                        f("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
                        k.get("launch__waves_per_multiprocessor").map_or("?".into(), |v| format!("{v:.2}")),
                        f("launch__registers_per_thread")
                    )
                })
                .collect();
            let named = if bottlenecks.is_empty() {
                "no rule matched".to_owned()
            } else {
                bottlenecks.join(", ")
            };
            Text::new()
                .strong(named)
                .plain(format!(" — {} (log line {line})", figures.join("; ")))
        }
        P::NoPermission { .. } => {
            format!("not profiled: no permission for GPU counters (log line {line})").into()
        }
        P::NoKernelsProfiled => {
            format!("not profiled: ncu saw no matching kernel (log line {line})").into()
        }
        P::TimedOut { seconds } => {
            format!("not profiled: ncu timed out after {seconds} s (log line {line})").into()
        }
        P::NcuMissing => "not profiled: ncu not found".into(),
        P::Failed { detail } => format!(
            "not profiled: {} (log line {line})",
            detail.lines().next().unwrap_or("")
        )
        .into(),
    }
}
