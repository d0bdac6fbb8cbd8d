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
