//! `flashtune worker --fake`: a GPU-less test double behind the real worker protocol, so CI drives the real supervision.
//! Its figures are synthetic and its device says so. A `FAULT` define in a case makes it misbehave like a bad kernel;
//! so does a marker string compiled into the cubin (`flashtune-fake: fault FAULT_WRONG`), which also scales
//! its duel times (`flashtune-fake: time x1.50`), so tests can make a source edit wrong, slower or faster.
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
                let fault = fault_of(&case.forward);
                match fault.as_str() {
                    // A kernel that never returns: the supervisor's timeout must kill us.
                    "FAULT_HANG" => loop {
                        std::thread::sleep(std::time::Duration::from_secs(3600));
                    },
                    // A kernel that takes the process down, as an illegal address does to a context.
                    "FAULT_ILLEGAL_ADDRESS" => std::process::abort(),
                    _ => crate::worker::emit(&WorkerMessage::Case(Box::new(fake_case(
                        case,
                        &fault,
                        req.measure.samples,
                    )))),
                }
            }
        }
        WorkerRequest::Duel(req) => {
            crate::worker::emit(&WorkerMessage::Device(device(arch, req.device)));
            for pair in &req.pairs {
                crate::worker::emit(&WorkerMessage::Duel(Box::new(fake_duel(pair, req.rounds))));
            }
        }
    }
    crate::worker::emit(&WorkerMessage::Done);
    std::process::ExitCode::SUCCESS
}

/// The kernel's injected fault: a `FAULT` define, else a marker in the cubin, else none.
fn fault_of(forward: &ForwardKernel) -> String {
    if let Some((_, v)) = forward.defines.iter().find(|(k, _)| k == "FAULT") {
        return v.clone();
    }
    cubin_marker(forward, "fault ").unwrap_or_else(|| "FAULT_NONE".into())
}

/// The word after `flashtune-fake: <what>` in the cubin's bytes (string constants survive compilation).
fn cubin_marker(forward: &ForwardKernel, what: &str) -> Option<String> {
    let bytes = std::fs::read(&forward.cubin).ok()?;
    let needle = format!("flashtune-fake: {what}");
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())?
        + needle.len();
    let word: String = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_graphic())
        .map(|&b| b as char)
        .collect();
    Some(word)
}

/// Multiplier on the fake time: `flashtune-fake: time x1.50` in the cubin, else 1.
fn time_scale(forward: &ForwardKernel) -> f64 {
    cubin_marker(forward, "time x")
        .and_then(|w| w.parse::<f64>().ok())
        .filter(|x| *x > 0.0)
        .unwrap_or(1.0)
}

/// Both sides checked as the fake checks any case; times from the shape alone (no per-cubin jitter,
/// so an unmarked edit ties) scaled by each cubin's marker, with a small deterministic wobble.
fn fake_duel(pair: &DuelPair, rounds: usize) -> DuelResult {
    let side = |case: &CaseSpec| fake_case(case, &fault_of(&case.forward), 0);
    let (champion, challenger) = (side(&pair.champion), side(&pair.challenger));
    let passed = |r: &CaseResult| r.check.as_ref().is_some_and(|c| c.passed());
    let timed = passed(&champion) && passed(&challenger);
    let shape = &pair.challenger.shape;
    let base_us = 5.0 + shape.flops() / 50e12 * 1e6;
    let samples = |forward: &ForwardKernel| -> Vec<f64> {
        let scale = time_scale(forward);
        (0..rounds)
            .map(|i| base_us * scale * (1.0 + 0.001 * (i % 3) as f64))
            .collect()
    };
    DuelResult {
        shape: shape.name.clone(),
        dtype: pair.challenger.dtype,
        champion_check: champion.check,
        challenger_check: challenger.check,
        champion_us: if timed {
            samples(&pair.champion.forward)
        } else {
            Vec::new()
        },
        challenger_us: if timed {
            samples(&pair.challenger.forward)
        } else {
            Vec::new()
        },
        launches_per_sample: 1,
        error: None,
    }
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
    let timing = (stats.passed() && samples > 0).then(|| {
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
    let bottlenecks = crate::profile::classify(&kernel, &policy.bottlenecks);
    crate::profile::ProfileOutcome::Profiled {
        kernels: vec![kernel],
        bottlenecks,
        report: "fake GPU: no ncu report".into(),
    }
}
