//! The tests of `src/gpu/trial/mod.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::trial::{auto_kv_splits, Buf, Exposure, Io, RoundSample};
use rand::{rngs::SmallRng, SeedableRng};

/// How often each of `rounds` rounds ends up kept when `k` are sampled, over `trials` cases.
fn kept_frequencies(k: usize, rounds: usize, trials: usize) -> Vec<f64> {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut counts = vec![0usize; rounds];
    for _ in 0..trials {
        let mut sample = RoundSample::new(k);
        for round in 0..rounds {
            sample.offer(round, &mut rng);
        }
        assert_eq!(sample.rounds().len(), k.min(rounds));
        for &r in sample.rounds() {
            counts[r] += 1;
        }
    }
    counts.iter().map(|&c| c as f64 / trials as f64).collect()
}

/// Architecture Invariant: a verified round is drawn from all the rounds that ran, each with the
/// same chance, however many ran (racing may stop a case after 8 of 30): the first rounds, the
/// last, or any other are not favoured, so a kernel honest in some rounds only cannot pick them.
#[test]
fn verified_rounds_are_a_uniform_sample_of_every_round_that_ran() {
    for (k, rounds) in [(2, 30), (2, 8), (8, 30), (1, 15)] {
        let expected = k as f64 / rounds as f64;
        for (round, f) in kept_frequencies(k, rounds, 40_000).into_iter().enumerate() {
            assert!(
                (f - expected).abs() < 0.1 * expected,
                "k={k} of {rounds}: round {round} kept {f:.4} of the time, not {expected:.4}"
            );
        }
    }
    // Fewer rounds than places: every round is kept.
    assert_eq!(kept_frequencies(8, 5, 10), vec![1.0; 5]);
}

fn io(first: usize) -> Io {
    Io {
        q: Buf(first),
        k: Buf(first + 1),
        v: Buf(first + 2),
        o: Buf(first + 3),
        lse: Buf(first + 4),
        o_accum: None,
        lse_accum: None,
        counters: None,
    }
}

/// Architecture Invariant: the reference never reads memory the kernel under test can write.
/// Both devices refuse a reference launch on any buffer a kernel was given, until it is freed.
#[test]
fn a_reference_on_buffers_a_kernel_was_given_is_refused() {
    let mut exposure = Exposure::default();
    let (timed, private) = (io(0), io(10));
    exposure.give(&timed);
    exposure.check_reference(&private).expect("never given");
    for shared in [
        Io {
            q: timed.q,
            ..private
        },
        Io {
            v: timed.v,
            ..private
        },
        Io {
            o: timed.o,
            ..private
        },
    ] {
        let why = exposure.check_reference(&shared).unwrap_err().to_string();
        assert!(
            why.contains("never reads memory the kernel under test can write"),
            "{why}"
        );
    }
    for b in [timed.q, timed.k, timed.v, timed.o, timed.lse] {
        exposure.forget(b);
    }
    exposure
        .check_reference(&timed)
        .expect("freed, so the handle is new memory");
}

#[test]
fn full_grids_are_not_split() {
    assert_eq!(auto_kv_splits(264, 264, 64), 1);
}

#[test]
fn small_grids_are_split_to_fill_the_gpu() {
    // Decode (1,8,1,4096): 8 CTAs of one query block, 132 SMs x 2 CTAs, 64 key blocks.
    let s = auto_kv_splits(8, 264, 64);
    assert!(s > 1 && 8 * s <= 264 + 8, "{s}");
    // Never more splits than key blocks.
    assert_eq!(auto_kv_splits(1, 264, 3), 3);
}
