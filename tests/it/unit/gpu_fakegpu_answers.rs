//! The tests of `src/gpu/fakegpu/answers.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::fakegpu::answers::*;
use flashtune::model::config::Causal;
use flashtune::model::config::{Dtype, Shape};

fn shape(sq: u32, sk: u32, d: u32, causal: Causal) -> Shape {
    crate::common::shape(2, 3, sq, sk, d, causal)
}

/// The cheap form gives the oracle's figures on every row, for each mask and kept-key count.
#[test]
fn periodic_attention_is_the_oracle_on_periodic_draws() {
    let cases = [
        shape(100, 300, 64, Causal::None),
        shape(77, 1000, 128, Causal::TopLeft),
        shape(300, 77, 64, Causal::BottomRight),
        shape(257, 257, 96, Causal::TopLeft),
        shape(1, 700, 256, Causal::None),
        shape(33, 500, 64, Causal::BottomRight),
    ];
    for s in cases {
        for keys in [None, Some(s.sk / 2)] {
            let heads = (s.b * s.h) as usize;
            let draw = |tensor| Draw {
                dtype: Dtype::F16,
                seed: 7,
                tensor,
                d: s.d,
            };
            let lens = [
                heads * (s.sq * s.d) as usize,
                heads * (s.sk * s.d) as usize,
                heads * (s.sk * s.d) as usize,
            ];
            let inputs = [0, 1, 2].map(|t| Input::Drawn(draw(t as u64), lens[t]));
            let (o1, l1) = periodic(&s, Dtype::F16, [&draw(0), &draw(1), &draw(2)], keys);
            let (o2, l2) = plain(&s, Dtype::F16, &inputs, keys);
            // Both in f64; the cheap form is stored in fp32: equal to the oracle rounded.
            for (a, b) in o1.iter().zip(&o2).chain(l1.iter().zip(&l2)) {
                let b32 = *b as f32;
                assert!(
                    *a == b32 || (a - b32).abs() <= 1e-6 * (1.0 + b32.abs()),
                    "{s:?} keys {keys:?}: {a} against {b}"
                );
            }
        }
    }
}
