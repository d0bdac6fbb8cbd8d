//! The tests of `src/model/protocol.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::config::Dtype;
use flashtune::model::protocol::*;

#[test]
fn non_finite_figures_round_trip_through_json() {
    let stats = CheckStats {
        max_abs: f64::NAN,
        rel_l2: f64::INFINITY,
        lse_max_abs: f64::NEG_INFINITY,
        reference_vs_cpu_rel_l2: Some(f64::NAN),
        ..Default::default()
    };
    let json = serde_json::to_string(&stats).unwrap();
    assert!(
        json.contains("\"NaN\"") && json.contains("\"inf\""),
        "{json}"
    );
    let back: CheckStats = serde_json::from_str(&json).unwrap();
    assert!(back.max_abs.is_nan());
    assert_eq!(back.rel_l2, f64::INFINITY);
    assert_eq!(back.lse_max_abs, f64::NEG_INFINITY);
    assert!(back.reference_vs_cpu_rel_l2.unwrap().is_nan());
    let timing = TimingStats {
        samples_us: vec![1.0, f64::NAN],
        ..Default::default()
    };
    let back: TimingStats = serde_json::from_str(&serde_json::to_string(&timing).unwrap()).unwrap();
    assert!(back.samples_us[1].is_nan());
}

#[test]
fn old_logs_with_null_figures_still_read() {
    let back: CheckStats = serde_json::from_str(
        r#"{"elements":1,"max_abs":null,"rel_l2":0.0,"lse_max_abs":0.0,"nan_count":0,
            "unwritten_count":0,"nondeterministic_count":0,"reference_vs_cpu_rel_l2":null,"failures":[]}"#,
    )
    .unwrap();
    assert!(back.max_abs.is_nan());
    assert_eq!(back.reference_vs_cpu_rel_l2, None);
}

#[test]
fn a_failed_case_reads_back_as_the_fault_its_reason_was_written_for() {
    let dtype = Dtype::F16;
    let mut crashed = CaseResult::empty("small", dtype, 1);
    crashed.error = Some("an illegal memory access was encountered".into());
    let mut wrote = CaseResult::empty("small", dtype, 1);
    wrote.check = Some(CheckStats::default());
    wrote.stages = vec![Stage::Inputs.failed("input set 2 changed".into())];
    let mut wrong = CaseResult::empty("small", dtype, 1);
    wrong.check = Some(CheckStats {
        failures: vec!["12 NaN outputs".into()],
        ..Default::default()
    });
    let mut reference = CaseResult::empty("small", dtype, 1);
    reference.check = Some(CheckStats {
        failures: vec![format!(
            "{WROTE_OUTSIDE}: the reference of input set 0 changed"
        )],
        wrote_outside: true,
        ..Default::default()
    });
    // The typed fault, and the legacy reading of the reason it is written with, agree.
    for (case, fault) in [
        (&crashed, CaseFault::Crashed),
        (&wrote, CaseFault::WroteOutside),
        (&reference, CaseFault::WroteOutside),
        (&wrong, CaseFault::Wrong),
    ] {
        assert_eq!(case.fault(), Some(fault));
        assert_eq!(
            CaseFault::legacy(&case.failure().expect("it failed")),
            fault
        );
    }
    assert_eq!(
        CaseResult::empty("small", dtype, 1).fault(),
        Some(CaseFault::Wrong)
    );
    let garbled = format!("{GARBLED_REPLY}: `oops`");
    assert_eq!(CaseFault::legacy(&garbled), CaseFault::Crashed);
}

#[test]
fn the_power_cap_is_recorded_but_only_an_outside_brake_is_a_condition() {
    let state = |reasons: &[&str]| GpuState {
        throttle_reasons: reasons.iter().map(|r| r.to_string()).collect(),
        power_violation_ms: Some(40.0),
        ..Default::default()
    };
    assert!(state(&["sw_power_cap"]).conditions().is_empty());
    assert_eq!(
        state(&["hw_power_brake_slowdown"]).conditions(),
        [Condition::Power]
    );
    assert_eq!(
        state(&["sw_power_cap", "hw_thermal_slowdown"]).conditions(),
        [Condition::Thermal]
    );
}
