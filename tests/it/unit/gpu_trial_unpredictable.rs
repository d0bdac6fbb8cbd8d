//! The tests of `src/gpu/trial/unpredictable.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::trial::unpredictable::rounds;

#[test]
fn rounds_vary_within_a_fifth_and_reach_both_ends() {
    let drawn: Vec<usize> = (0..2000).map(|_| rounds(30)).collect();
    assert!(drawn.iter().all(|r| (24..=36).contains(r)), "{drawn:?}");
    assert!(drawn.contains(&24) && drawn.contains(&36));
    assert_eq!(rounds(1), 1);
    assert_eq!(rounds(0), 0);
    assert!((2..=3).contains(&rounds(2)));
}
