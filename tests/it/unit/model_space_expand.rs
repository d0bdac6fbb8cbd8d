//! The tests of `src/model/space/expand.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::model::space::expand::{moved, variant_id};
use flashtune::model::space::{ParamValue, Params};

#[test]
fn ids_are_readable() {
    let mut p = Params::new();
    p.insert("MMA".into(), ParamValue::Name("wmma".into()));
    p.insert("BLOCK_M".into(), ParamValue::Int(64));
    p.insert("KV_SPLIT".into(), ParamValue::Int(4));
    assert_eq!(variant_id(&p), "wmma-bm64-ks4");
    p.insert("PINGPONG".into(), ParamValue::Int(0));
    assert_eq!(
        variant_id(&p),
        "wmma-bm64-ks4",
        "a switch left off is not in the id"
    );
    p.insert("PINGPONG".into(), ParamValue::Int(1));
    assert_eq!(variant_id(&p), "wmma-bm64-ks4-p1");
}

#[test]
fn moves_step_along_the_listed_values() {
    let values = [
        ParamValue::Int(1),
        ParamValue::Int(2),
        ParamValue::Name("auto".into()),
    ];
    let up = ParamValue::Name("up".into());
    let down = ParamValue::Name("down".into());
    assert_eq!(moved(&values, &values[0], &up), Some(values[1].clone()));
    assert_eq!(
        moved(&values, &values[2], &up),
        None,
        "no value past the last"
    );
    assert_eq!(
        moved(&values, &values[0], &down),
        None,
        "no value before the first"
    );
    assert_eq!(
        moved(&values, &values[0], &values[2]),
        Some(values[2].clone())
    );
    assert_eq!(
        moved(&values, &values[2], &values[2]),
        None,
        "a move that changes nothing"
    );
    assert_eq!(
        moved(&values, &values[0], &ParamValue::Int(4)),
        None,
        "only listed values"
    );
}
