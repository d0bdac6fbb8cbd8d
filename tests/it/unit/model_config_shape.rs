//! The tests of `src/model/config/shape.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::config::shape::{Causal, Shape, MAX_SEQ_LEN};
use serde::{Deserialize, Serialize};

fn shape(sq: u32, sk: u32, causal: Causal) -> Shape {
    crate::common::shape(2, 3, sq, sk, 64, causal)
}

/// The definition, one (query, key) pair at a time.
fn brute_force_pairs(s: &Shape) -> u64 {
    let offset = s.causal.offset(s.sq, s.sk);
    let mut n = 0;
    for i in 0..i64::from(s.sq) {
        for j in 0..i64::from(s.sk) {
            n += u64::from(offset.is_none_or(|c| j <= i + c));
        }
    }
    n
}

#[test]
fn pairs_in_closed_form_match_a_brute_force_count() {
    let sizes = [1, 2, 3, 7, 16, 77, 128, 300];
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        for &sq in &sizes {
            for &sk in &sizes {
                let s = shape(sq, sk, causal);
                assert_eq!(
                    s.pairs_per_head(),
                    brute_force_pairs(&s),
                    "{causal:?} {sq}x{sk}"
                );
                let by_rows: u64 = (0..sq).map(|i| u64::from(s.visible_keys(i))).sum();
                assert_eq!(s.pairs_per_head(), by_rows, "{causal:?} {sq}x{sk}");
            }
        }
    }
}

#[test]
fn flops_count_what_the_mask_admits() {
    let full = |s: &Shape| 4.0 * 6.0 * 64.0 * f64::from(s.sq) * f64::from(s.sk);
    let square = shape(1000, 1000, Causal::TopLeft);
    assert_eq!(square.flops(), full(&square) * 1001.0 / 2000.0);
    // The smoke space's ragged-causal: 87 % of the full work, not half.
    let ragged = shape(300, 77, Causal::TopLeft);
    assert_eq!(ragged.pairs_per_head(), 77 * 78 / 2 + (300 - 77) * 77);
    assert!((ragged.flops() / full(&ragged) - 0.873).abs() < 1e-3);
    // Bottom-right, Sq > Sk: 223 rows see nothing, the last 77 a triangle.
    let hidden = shape(300, 77, Causal::BottomRight);
    assert_eq!(hidden.pairs_per_head(), 77 * 78 / 2);
    // Decode: one query, bottom-right, sees every key; top-left sees key 0 only.
    assert_eq!(shape(1, 4096, Causal::BottomRight).pairs_per_head(), 4096);
    assert_eq!(shape(1, 4096, Causal::TopLeft).pairs_per_head(), 1);
    assert_eq!(
        shape(1, 4096, Causal::None).flops(),
        full(&shape(1, 4096, Causal::None))
    );
    // Sizes where Sq·Sk overflows u32 (and i32) still count exactly.
    let big = shape(MAX_SEQ_LEN, MAX_SEQ_LEN, Causal::TopLeft);
    let n = u64::from(MAX_SEQ_LEN);
    assert_eq!(big.pairs_per_head(), n * (n + 1) / 2);
}

#[test]
fn causal_reads_bools_and_names_and_writes_bools_where_it_can() {
    #[derive(Deserialize, Serialize)]
    struct W {
        causal: Causal,
    }
    for (toml_value, want) in [
        ("true", Causal::TopLeft),
        ("false", Causal::None),
        ("\"none\"", Causal::None),
        ("\"top-left\"", Causal::TopLeft),
        ("\"bottom-right\"", Causal::BottomRight),
    ] {
        let w: W = toml::from_str(&format!("causal = {toml_value}")).unwrap();
        assert_eq!(w.causal, want, "{toml_value}");
    }
    let json = |c| serde_json::to_string(&W { causal: c }).unwrap();
    assert_eq!(json(Causal::TopLeft), r#"{"causal":true}"#);
    assert_eq!(json(Causal::None), r#"{"causal":false}"#);
    assert_eq!(json(Causal::BottomRight), r#"{"causal":"bottom-right"}"#);
    let back: W = serde_json::from_str(&json(Causal::BottomRight)).unwrap();
    assert_eq!(back.causal, Causal::BottomRight);
    let err = toml::from_str::<W>("causal = \"lower-right\"")
        .err()
        .unwrap();
    assert!(err.to_string().contains("bottom-right"), "{err}");
    assert_eq!(
        [Causal::None, Causal::TopLeft, Causal::BottomRight].map(Causal::code),
        [0, 1, 2]
    );
}

#[test]
fn size_helpers_never_wrap_and_absurd_shapes_are_refused() {
    let mut s = shape(u32::MAX, u32::MAX, Causal::None);
    s.b = u32::MAX;
    s.h = u32::MAX;
    assert_eq!(s.heads(), u64::from(u32::MAX) * u64::from(u32::MAX));
    assert_eq!(s.q_elements(), u64::MAX, "saturates instead of wrapping");
    assert!(s.check_size().is_err());
    let ok = shape(8192, 8192, Causal::TopLeft);
    assert_eq!(ok.q_elements(), 6 * 8192 * 64);
    assert_eq!(ok.rows(), 6 * 8192);
    assert!(ok.check_size().is_ok());
    let many_heads = Shape {
        b: 1024,
        h: 128,
        ..ok.clone()
    };
    assert!(many_heads.check_size().unwrap_err().contains("65535"));
    let long = Shape {
        sk: MAX_SEQ_LEN + 1,
        ..ok.clone()
    };
    assert!(long.check_size().unwrap_err().contains("2^30"));
    let huge = Shape {
        b: 64,
        h: 64,
        sq: 1 << 20,
        sk: 1 << 20,
        ..ok
    };
    assert!(huge.check_size().unwrap_err().contains("GiB"));
}
