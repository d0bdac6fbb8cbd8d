//! The tests of `src/gpu/fakegpu/mod.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::fakegpu::*;
use flashtune::gpu::trial::Device;
use flashtune::gpu::trial::{Io, KernelId};
use flashtune::model::config::{Dtype, Shape};
use flashtune::model::protocol::{ForwardKernel, ReferenceKernel};
use flashtune::model::space::LaunchShape;
const PLAIN_ROWS: flashtune::gpu::trial::mixture::Geometry =
    flashtune::gpu::trial::mixture::Geometry { heads: 1, d: 64 };

#[test]
fn the_comparison_self_check_passes_the_host_path_and_refuses_a_miscount() {
    let mut honest = FakeGpu::new(device("sm_90a", 0));
    flashtune::gpu::trial::self_check_comparison(&mut honest)
        .expect("the host path agrees with itself");

    let mut broken = FakeGpu::new(device("sm_90a", 0));
    broken.miscounting_compare = true;
    let why = flashtune::gpu::trial::self_check_comparison(&mut broken)
        .expect_err("a comparison that misses an unwritten output must be refused")
        .to_string();
    assert!(
        why.contains("unwritten outputs: 1 on the device, 2 on the host"),
        "{why}"
    );
    // Every buffer the check drew was given back.
    assert!(broken.memory.iter().all(Option::is_none), "buffers leaked");
}

/// The double refuses to compute a reference from a buffer a kernel under test was given (the
/// timed launches' inputs, once captured), as the GPU worker does: a trial that computed its
/// reference from the kernel's buffers fails every case on the double.
#[test]
fn the_reference_is_refused_the_buffers_a_kernel_was_given() {
    let mut gpu = FakeGpu::new(device("sm_90a", 0));
    let dir = tempfile::tempdir().unwrap();
    let cubin = dir.path().join("reference.cubin");
    std::fs::write(&cubin, b"reference").unwrap();
    let reference = gpu
        .load_reference(&ReferenceKernel {
            cubin,
            entry: "attn_reference".into(),
        })
        .unwrap();
    let shape = Shape {
        name: "tiny".into(),
        b: 1,
        h: 1,
        sq: 8,
        sk: 8,
        d: 64,
        causal: Default::default(),
    };
    let launch: LaunchShape = serde_json::from_value(serde_json::json!({
        "threads": 128, "smem_bytes": 0, "rows_per_cta": 16, "kv_rows_per_block": 64, "kv_splits": 1
    }))
    .unwrap();
    let mut input = || {
        let b = gpu.alloc16(8 * 64).unwrap();
        gpu.generate(b, Dtype::F16, 1, b.0 as u64, PLAIN_ROWS)
            .unwrap();
        b
    };
    let (q, k, v) = (input(), input(), input());
    let slot = Io {
        q,
        k,
        v,
        o: gpu.alloc16(8 * 64).unwrap(),
        lse: gpu.alloc32(8).unwrap(),
        o_accum: None,
        lse_accum: None,
        counters: None,
    };
    let scratch = Io {
        o: gpu.alloc32(8 * 64).unwrap(),
        lse: gpu.alloc32(8).unwrap(),
        ..slot
    };
    gpu.reference(reference, &shape, Dtype::F16, &scratch)
        .expect("no kernel was given these inputs yet");
    gpu.capture(KernelId(usize::MAX), &shape, &launch, &[slot])
        .unwrap();
    let why = gpu
        .reference(reference, &shape, Dtype::F16, &scratch)
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("never reads memory the kernel under test can write"),
        "{why}"
    );
}

/// `ForgeReference` in a worker session that checks another variant next against the same
/// input pool: the forger is named for its own case, and the next variant is judged on
/// references drawn anew, never failed for the forger's write (the pool once kept only its
/// inputs guarded, so the honest variant after a forger was rejected as having written them).
#[test]
fn a_forged_reference_is_blamed_on_the_forger_and_never_on_the_next_variant() {
    use flashtune::model::config::Tolerance;
    use flashtune::model::protocol::{CaseSpec, MeasureSpec};
    let mut gpu = FakeGpu::new(device("sm_90a", 0));
    let mut pools = flashtune::gpu::trial::Pools::new(1 << 30);
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference.cubin");
    std::fs::write(&reference, "reference").unwrap();
    let case = |cheat: &str| {
        let cubin = dir.path().join(format!("{cheat}.cubin"));
        std::fs::write(&cubin, cheat).unwrap();
        CaseSpec {
            shape: Shape {
                name: "tiny".into(),
                b: 1,
                h: 2,
                sq: 64,
                sk: 64,
                d: 64,
                causal: Default::default(),
            },
            dtype: Dtype::F16,
            seed: 7,
            tolerance: Tolerance {
                max_abs: 2e-2,
                rel_l2: 2e-2,
                row_rel_l2: 5e-2,
                lse_max_abs: 1e-3,
            },
            cpu_oracle_max_macs: 1e9,
            forward: ForwardKernel {
                cubin,
                entry: "attn_fwd".into(),
                combine_entry: "attn_combine".into(),
                launch: serde_json::from_value(serde_json::json!({
                    "threads": 128, "smem_bytes": 0, "rows_per_cta": 64,
                    "kv_rows_per_block": 64, "kv_splits": 1
                }))
                .unwrap(),
                defines: vec![
                    ("DTYPE".into(), "DTYPE_F16".into()),
                    ("CHEAT".into(), cheat.into()),
                ],
            },
            reference: ReferenceKernel {
                cubin: reference.clone(),
                entry: "attn_reference".into(),
            },
            race: None,
        }
    };
    let measure = MeasureSpec {
        warmup_ms: 0.0,
        samples: 5,
        min_sample_us: 0.0,
        verified_replays: 2,
    };
    let run = flashtune::gpu::trial::run_case;
    let forged = run(
        &mut gpu,
        &mut pools,
        &case("CHEAT_FORGE_REFERENCE"),
        &measure,
    );
    let why = forged.failure().expect("the forger is rejected");
    assert!(
        why.contains("the reference of input set 0 changed while the kernel ran"),
        "{why}"
    );
    let honest = run(&mut gpu, &mut pools, &case("CHEAT_NONE"), &measure);
    assert_eq!(honest.failure(), None);
    assert!(honest.timing.is_some());
}

/// `KeptCopyRepair` against both ways of keeping a timed round's outputs: a copy kept in device
/// memory is found by the next launch and gets the honest answer written over it (what made the
/// old harness crown it), while a copy read back to the host keeps the zeros it wrote.
#[test]
fn a_kept_copy_on_the_device_is_repaired_by_the_next_launch_and_one_on_the_host_is_not() {
    let mut gpu = FakeGpu::new(device("sm_90a", 0));
    let dir = tempfile::tempdir().unwrap();
    let launch: LaunchShape = serde_json::from_value(serde_json::json!({
        "threads": 128, "smem_bytes": 0, "rows_per_cta": 16, "kv_rows_per_block": 64, "kv_splits": 1
    }))
    .unwrap();
    let load = |gpu: &mut FakeGpu, name: &str, marker: &str| {
        let cubin = dir.path().join(name);
        std::fs::write(&cubin, marker).unwrap();
        gpu.load_forward(&ForwardKernel {
            cubin,
            entry: "attn_fwd".into(),
            combine_entry: "attn_combine".into(),
            launch: launch.clone(),
            defines: vec![("DTYPE".into(), "DTYPE_F16".into())],
        })
        .unwrap()
    };
    let cheat = load(
        &mut gpu,
        "cheat.cubin",
        "flashtune-fake: cheat CHEAT_KEPT_COPY_REPAIR\0",
    );
    let honest = load(&mut gpu, "honest.cubin", "honest");
    let shape = Shape {
        name: "tiny".into(),
        b: 1,
        h: 2,
        sq: 16,
        sk: 64,
        d: 64,
        causal: Default::default(),
    };
    let geometry = flashtune::gpu::trial::geometry(&shape);
    let io = |gpu: &mut FakeGpu, seed: u64| {
        let q = gpu.alloc16(2 * 16 * 64).unwrap();
        let (k, v) = (
            gpu.alloc16(2 * 64 * 64).unwrap(),
            gpu.alloc16(2 * 64 * 64).unwrap(),
        );
        for (t, b) in [q, k, v].into_iter().enumerate() {
            gpu.generate(b, Dtype::F16, seed, t as u64, geometry)
                .unwrap();
        }
        Io {
            q,
            k,
            v,
            o: gpu.alloc16(2 * 16 * 64).unwrap(),
            lse: gpu.alloc32(2 * 16).unwrap(),
            o_accum: None,
            lse_accum: None,
            counters: None,
        }
    };
    // The check set first (the cheat is honest on the first Q buffer it sees), then a timed slot
    // drawn plain (the cheat is honest on inputs with the old stress set's mark).
    let checked = io(&mut gpu, 1);
    gpu.forward(cheat, &shape, &launch, &checked).unwrap();
    use flashtune::gpu::trial::mixture::{component, head_hash, Component};
    let plain = (2..)
        .find(|&s| component(head_hash(s, 0, 0), 64) == Component::Plain)
        .unwrap();
    let slot = io(&mut gpu, plain);
    gpu.forward(cheat, &shape, &launch, &slot).unwrap();
    let on_host = (gpu.read16(slot.o).unwrap(), gpu.read32(slot.lse).unwrap());
    let (copy_o, copy_lse) = (
        gpu.alloc16(2 * 16 * 64).unwrap(),
        gpu.alloc32(2 * 16).unwrap(),
    );
    gpu.copy(slot.o, copy_o).unwrap();
    gpu.copy(slot.lse, copy_lse).unwrap();
    // The next round: the slot drawn anew, the cheat launched again.
    for (t, b) in [slot.q, slot.k, slot.v].into_iter().enumerate() {
        gpu.generate(b, Dtype::F16, 3, t as u64, geometry).unwrap();
    }
    gpu.forward(cheat, &shape, &launch, &slot).unwrap();
    // What an honest kernel writes for the first round's inputs.
    let again = io(&mut gpu, plain);
    gpu.forward(honest, &shape, &launch, &again).unwrap();
    let right = (gpu.read16(again.o).unwrap(), gpu.read32(again.lse).unwrap());
    assert!(right.0.iter().any(|&b| b != 0));
    assert_eq!(
        (gpu.read16(copy_o).unwrap(), gpu.read32(copy_lse).unwrap()),
        right,
        "the device copy was repaired"
    );
    assert!(
        on_host.0.iter().all(|&b| b == 0),
        "the host copy keeps the zeros"
    );
    assert_ne!(on_host, right);
}

/// A draw reads back as the same bits whether made whole or by range, and keeps its checksum
/// once read; a write changes it.
#[test]
fn a_draw_is_the_same_however_it_is_read_and_its_checksum_moves_only_on_a_write() {
    let mut gpu = FakeGpu::new(device("sm_90a", 0));
    let b = gpu.alloc16(100_000).unwrap();
    gpu.generate(b, Dtype::Bf16, 3, 1, PLAIN_ROWS).unwrap();
    let before = gpu.checksum(b).unwrap();
    let part = gpu.read16_range(b, 40_000, 30_000).unwrap();
    let whole = gpu.read16(b).unwrap();
    assert_eq!(part, whole[40_000..70_000]);
    assert_eq!(gpu.checksum(b).unwrap(), before);
    gpu.narrow_mut(b).unwrap()[5] ^= 1;
    assert_ne!(gpu.checksum(b).unwrap(), before);
}
