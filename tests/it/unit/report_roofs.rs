//! The tests of `src/report/roofs.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::config::{Dtype, Shape};
use flashtune::model::protocol::TimingStats;
use flashtune::model::vocab::Roof;
use flashtune::report::roofs::*;

fn shape() -> Shape {
    Shape {
        name: "large".into(),
        b: 2,
        h: 16,
        sq: 8192,
        sk: 8192,
        d: 128,
        causal: flashtune::model::config::Causal::None,
    }
}

fn timing(us: f64) -> TimingStats {
    TimingStats {
        median_us: us,
        ..Default::default()
    }
}

#[test]
fn figures_beyond_a_measured_roof_are_implausible_and_others_are_not() {
    let mut roofs = Roofs::default();
    roofs.add(Roof::Matmul, Some(Dtype::F16), 700.0);
    roofs.add(Roof::Copy, None, 2400.0);
    roofs.add(Roof::Read, None, 3000.0);
    // 4·2·16·8192²·128 = 1.1e15 FLOP: 3.2 ms is 344 TFLOP/s, 1.4 ms is 786 (112%).
    assert_eq!(
        roofs.beyond(&shape(), Dtype::F16, &timing(3200.0), 0.05),
        None
    );
    let why = roofs
        .beyond(&shape(), Dtype::F16, &timing(1400.0), 0.05)
        .expect("beyond the matmul roof");
    assert!(why.contains("matmul roof"), "{why}");
    // No bf16 matmul roof measured: only the bandwidth roof applies (Q+K+V+O = 268 MB: 89 µs at 3000 GB/s).
    assert_eq!(
        roofs.beyond(&shape(), Dtype::Bf16, &timing(1400.0), 0.05),
        None
    );
    let why = roofs
        .beyond(&shape(), Dtype::Bf16, &timing(50.0), 0.05)
        .expect("beyond the bandwidth roof");
    assert!(why.contains("bandwidth roof (3000 GB/s"), "{why}");
    assert!(roofs
        .beyond(&shape(), Dtype::F16, &timing(f64::NAN), 0.05)
        .is_some());
}
