//! The tests of `src/gpu/trial/mixture.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::check::{self};
use flashtune::gpu::trial::mixture::*;
use flashtune::model::config::Dtype;
use rand_distr::StandardNormal;

#[test]
fn every_component_is_drawn_at_its_rate() {
    let mut counts = [0usize; 5];
    let n = 80_000;
    for head in 0..n {
        let c = component(head_hash(42, 3, head), 64);
        counts[match c {
            Component::Plain => 0,
            Component::Wide { .. } => 1,
            Component::Aligned { .. } => 2,
            Component::Spiky { .. } => 3,
            Component::Outliers { .. } => 4,
        }] += 1;
    }
    let share = |i: usize| counts[i] as f64 / n as f64;
    for (i, expected) in [0.25, 0.25, 0.125, 0.125, 0.25].into_iter().enumerate() {
        assert!((share(i) - expected).abs() < 0.01, "{counts:?}");
    }
}

/// The aligned component reaches logits a fixed-offset softmax cannot hold (above 11) at norms
/// below the old stress set's mark (‖q‖² > 4d): the hard heads are not the largest norms.
#[test]
fn hard_heads_are_not_the_largest_norms() {
    use rand::{Rng, SeedableRng};
    let d = 128u32;
    let hash = (0..)
        .map(|h| head_hash(7, 0, h))
        .find(|&h| component(h, d) == Component::Aligned { gain: 1.25 })
        .unwrap();
    let c = component(hash, d);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut rows = |t: u64| -> Vec<Vec<f32>> {
        (0..64)
            .map(|r| {
                (0..d)
                    .map(|ch| c.value(hash, t, r, ch, rng.sample(StandardNormal)))
                    .collect()
            })
            .collect()
    };
    let (q, k) = (rows(0), rows(1));
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let max_logit = q
        .iter()
        .flat_map(|a| k.iter().map(|b| dot(a, b)))
        .fold(f32::MIN, f32::max)
        / (d as f32).sqrt();
    let max_norm2 = q.iter().map(|a| dot(a, a)).fold(0.0, f32::max);
    assert!(max_logit > 11.0, "largest logit {max_logit}");
    assert!(max_norm2 < 3.0 * d as f32, "‖q‖² reaches {max_norm2}");
}

/// The self-check's expectations hold for a draw made per head as the GPU makes it (here on the
/// host), and fail for the double's one component per tensor.
#[test]
fn the_self_check_knows_each_components_mean_square() {
    use rand::{Rng, SeedableRng};
    let d = CHECK_GEOMETRY.d;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    for t in 0..2u64 {
        let mut values = Vec::new();
        for head in 0..CHECK_GEOMETRY.heads as u64 {
            let hash = head_hash(CHECK_SEED, 0, head);
            let c = component(hash, d);
            for row in 0..CHECK_ROWS {
                for ch in 0..d {
                    values.push(c.value(hash, t, row, ch, rng.sample(StandardNormal)));
                }
            }
        }
        check_heads(t, &values).unwrap();
        let bits = double_bits(Dtype::F16, values.len(), CHECK_SEED, t, d);
        assert!(check_heads(t, &check::values(Dtype::F16, &bits)).is_err());
    }
}

#[test]
fn v_is_never_transformed() {
    for head in 0..64 {
        let hash = head_hash(1, 2, head);
        let c = component(hash, 64);
        assert_eq!(c.value(hash, 2, 5, 3, 0.75), 0.75);
    }
}
