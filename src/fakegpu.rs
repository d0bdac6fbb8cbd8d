//! `flashtune worker --fake`: a GPU-less test double behind the real worker protocol, so CI drives the real supervision.
//! Its figures are synthetic and its device says so. A `FAULT` define in a case makes it misbehave like a bad kernel.
use crate::check;
use crate::protocol::*;
use std::io::Read;

pub fn device(arch: &str, ordinal: u32) -> DeviceInfo {
    DeviceInfo {
        ordinal,
        name: "fake GPU (flashtune test double; no figure from it is a measurement)".into(),
        sm_count: 132,
        compute_capability: (9, 0),
        arch: arch.into(),
        max_threads_per_block: 1024,
        max_smem_optin_bytes: 232_448,
        driver_version: 0,
        total_memory_bytes: 0,
        visible_devices: 1,
        fake: true,
    }
}

pub fn serve(arch: &str) -> std::process::ExitCode {
    let mut input = String::new();
    let request: WorkerRequest = match std::io::stdin()
        .read_to_string(&mut input)
        .ok()
        .and_then(|_| serde_json::from_str(&input).ok())
    {
        Some(r) => r,
        None => {
            crate::worker::emit(&WorkerMessage::Fatal {
                message: "bad request".into(),
            });
            return std::process::ExitCode::from(2);
        }
    };
    match request {
        WorkerRequest::Probe { device: d } => {
            crate::worker::emit(&WorkerMessage::Device(device(arch, d)))
        }
        WorkerRequest::Run(req) => {
            crate::worker::emit(&WorkerMessage::Device(device(arch, req.device)));
            for case in &req.cases {
                let fault = case
                    .forward
                    .defines
                    .iter()
                    .find(|(k, _)| k == "FAULT")
                    .map(|(_, v)| v.as_str())
                    .unwrap_or("FAULT_NONE");
                match fault {
                    // A kernel that never returns: the supervisor's timeout must kill us.
                    "FAULT_HANG" => loop {
                        std::thread::sleep(std::time::Duration::from_secs(3600));
                    },
                    // A kernel that takes the process down, as an illegal address does to a context.
                    "FAULT_ILLEGAL_ADDRESS" => std::process::abort(),
                    _ => crate::worker::emit(&WorkerMessage::Case(Box::new(fake_case(
                        case,
                        fault,
                        req.measure.samples,
                    )))),
                }
            }
        }
    }
    crate::worker::emit(&WorkerMessage::Done);
    std::process::ExitCode::SUCCESS
}

/// Deterministic synthetic results: exact outputs unless the fault says otherwise; a time from the cubin and shape.
fn fake_case(case: &CaseSpec, fault: &str, samples: usize) -> CaseResult {
    let elements =
        case.shape.b as u64 * case.shape.h as u64 * case.shape.sq as u64 * case.shape.d as u64;
    let mut stats = CheckStats {
        elements,
        ..Default::default()
    };
    match fault {
        "FAULT_NAN" => stats.nan_count = elements,
        "FAULT_WRONG" => {
            stats.max_abs = 0.5;
            stats.rel_l2 = 0.3;
        }
        _ => {}
    }
    check::judge(
        &mut stats,
        &case.tolerance,
        crate::worker::REFERENCE_VS_CPU_LIMIT,
    );
    let key = format!("{}|{:?}", case.forward.cubin.display(), case.shape);
    let jitter = 1.0 + blake3::hash(key.as_bytes()).as_bytes()[0] as f64 / 255.0;
    let base_us = 5.0 + case.shape.flops() / 50e12 * 1e6;
    let timing = stats.passed().then(|| {
        let samples_us: Vec<f64> = (0..samples)
            .map(|i| base_us * jitter * (1.0 + 0.001 * (i % 5) as f64))
            .collect();
        check::summarize(samples_us, 1, case.shape.flops())
    });
    CaseResult {
        shape: case.shape.name.clone(),
        dtype: case.dtype,
        check: Some(stats),
        timing,
        function: None,
        kv_splits: case.forward.launch.kv_splits.max(1),
        error: None,
    }
}

/// A synthetic profile for the test double, so CI can drive the guided search: waves come from the
/// launch geometry as ncu computes them; the other figures follow the MMA path and tile size. The
/// real bottleneck rules from the policy classify them. Nothing here was measured.
pub fn profile(
    policy: &crate::config::ProfilePolicy,
    params: &crate::space::Params,
    launch: &crate::space::LaunchShape,
    shape: &crate::config::Shape,
    device: &DeviceInfo,
) -> crate::profile::ProfileOutcome {
    use crate::profile::{KernelProfile, Metric};
    use crate::space::ParamValue;
    let ctas = shape.b as f64
        * shape.h as f64
        * (shape.sq as f64 / launch.rows_per_cta as f64).ceil()
        * launch.kv_splits.max(1) as f64;
    let waves = ctas / device.sm_count.max(1) as f64;
    let mma = params.get("MMA").cloned();
    let tensor_path = mma == Some(ParamValue::Name("mma".into()));
    let big_tile = matches!(params.get("BLOCK_M"), Some(ParamValue::Int(m)) if *m >= 128);
    let (sm, tensor) = if tensor_path { (55.0, 45.0) } else { (70.0, 10.0) };
    let (limit_regs, warps_active) = if big_tile { (1.0, 12.0) } else { (4.0, 50.0) };
    let metrics: std::collections::BTreeMap<String, Metric> = [
        ("launch__waves_per_multiprocessor", waves),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", if waves < 1.0 { 15.0 } else { sm }),
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 20.0),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", warps_active),
        ("launch__occupancy_limit_registers", limit_regs),
        ("launch__occupancy_limit_shared_mem", 4.0),
        ("launch__occupancy_limit_warps", 8.0),
        ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", tensor),
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
    let bottlenecks = crate::profile::classify(&kernel, &policy.bottlenecks);
    crate::profile::ProfileOutcome::Profiled {
        kernels: vec![kernel],
        bottlenecks,
        report: "fake GPU: no ncu report".into(),
    }
}
