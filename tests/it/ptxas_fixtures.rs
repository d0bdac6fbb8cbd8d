//! The ptxas report parser on real compiler outputs (tests/fixtures/ptxas).
use crate::common;
use common::*;
use flashtune::gpu::ptxas;

#[test]
fn saxpy_report() {
    let e = ptxas::parse(&fixture("ptxas/saxpy_sm90a_nvcc13.0.txt"));
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].name, "saxpy");
    assert_eq!(e[0].arch, "sm_90a");
    assert_eq!(
        (
            e[0].registers,
            e[0].spill_bytes(),
            e[0].stack_frame_bytes,
            e[0].static_smem_bytes
        ),
        (10, 0, 0, 0)
    );
}

#[test]
fn mixed_report_with_stack_smem_and_register_limit() {
    let e = ptxas::parse(&fixture(
        "ptxas/mixed_stack_smem_dynamic_template_nvcc13.5.txt",
    ));
    let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["_Z5templILi64EEvPf", "dyn", "spills"]);
    let spills = &e[2];
    assert_eq!(spills.registers, 31);
    assert_eq!(spills.barriers, 1);
    assert_eq!(spills.stack_frame_bytes, 1056);
    assert_eq!(spills.static_smem_bytes, 4096);
    assert_eq!(spills.spill_bytes(), 0);
    assert_eq!(spills.max_registers_override, Some(32));
    assert_eq!(
        (e[1].registers, e[1].barriers, e[1].static_smem_bytes),
        (12, 1, 0)
    );
}
