//! The double's synthetic profiles, so CI can drive the guided search without ncu.
use crate::model::protocol::DeviceInfo;

/// A synthetic profile for the test double, so CI can drive the guided search: waves come from the
/// launch geometry as ncu computes them; the other figures follow the MMA path and tile size. The
/// real bottleneck rules from the policy classify them. Nothing here was measured.
pub fn profile(
    policy: &crate::model::config::ProfilePolicy,
    params: &crate::model::space::Params,
    launch: &crate::model::space::LaunchShape,
    shape: &crate::model::config::Shape,
    device: &DeviceInfo,
) -> crate::gpu::profile::ProfileOutcome {
    use crate::gpu::profile::{KernelProfile, Metric};
    use crate::model::space::ParamValue;
    let ctas = shape.b as f64
        * shape.h as f64
        * (shape.sq as f64 / launch.rows_per_cta as f64).ceil()
        * launch.kv_splits.max(1) as f64;
    let waves = ctas / device.sm_count.max(1) as f64;
    let mma = params.get("MMA").cloned();
    let tensor_path = matches!(&mma, Some(ParamValue::Name(m)) if m == "mma" || m == "wgmma");
    let big_tile = matches!(params.get("BLOCK_M"), Some(ParamValue::Int(m)) if *m >= 128);
    let (sm, tensor) = if tensor_path {
        (55.0, 45.0)
    } else {
        (70.0, 10.0)
    };
    let (limit_regs, warps_active) = if big_tile { (1.0, 12.0) } else { (4.0, 50.0) };
    let metrics: std::collections::BTreeMap<String, Metric> = [
        ("launch__waves_per_multiprocessor", waves),
        (
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            if waves < 1.0 { 15.0 } else { sm },
        ),
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 20.0),
        (
            "sm__warps_active.avg.pct_of_peak_sustained_active",
            warps_active,
        ),
        ("launch__occupancy_limit_registers", limit_regs),
        ("launch__occupancy_limit_shared_mem", 4.0),
        ("launch__occupancy_limit_warps", 8.0),
        (
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
            tensor,
        ),
    ]
    .into_iter()
    .map(|(k, v)| {
        (
            k.to_owned(),
            Metric {
                value: v,
                unit: String::new(),
            },
        )
    })
    .collect();
    let kernel = KernelProfile {
        id: 0,
        kernel: "attn_fwd (fake GPU: synthetic metrics)".into(),
        block_size: format!("({}, 1, 1)", launch.threads),
        grid_size: format!("({ctas}, 1, 1)"),
        metrics,
    };
    let bottlenecks = crate::gpu::profile::classify(&kernel, &policy.bottlenecks);
    crate::gpu::profile::ProfileOutcome::Profiled {
        kernels: vec![kernel],
        bottlenecks,
        report: "fake GPU: no ncu report".into(),
    }
}
