//! The tests of `src/mcp/wire.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::mcp::wire::*;
use serde_json::{json, Value};

fn answer(line: &str) -> Value {
    match classify(line.as_bytes()) {
        Line::Answer(v) => v,
        other => panic!("{line}: {other:?}"),
    }
}

/// The id and the code of the answer to `line`.
fn answered(line: &str) -> (Value, i64) {
    let v = answer(line);
    (v["id"].clone(), v["error"]["code"].as_i64().unwrap())
}

#[test]
fn lines_are_held_to_json_rpc() {
    let null = Value::Null;
    let parse = r#"{"jsonrpc":"2.0","id":1,"method":"tools/li"#;
    assert_eq!(answered(parse), (null.clone(), -32700));
    let no_version = r#"{"id":7,"method":"tools/list"}"#;
    assert_eq!(answered(no_version), (json!(7), -32600));
    let bad_method = r#"{"jsonrpc":"2.0","id":"a","method":3}"#;
    assert_eq!(answered(bad_method), (json!("a"), -32600));
    let no_method = r#"{"jsonrpc":"2.0","id":"a"}"#;
    assert_eq!(answered(no_method), (json!("a"), -32600));
    let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#;
    assert_eq!(answered(batch), (null.clone(), -32600));
    let bad_id = r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#;
    assert_eq!(answered(bad_id), (null.clone(), -32600));
    let no_name = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{}}"#;
    assert_eq!(answered(no_name), (json!(2), -32602));
    assert!(answer(no_name)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("name"));
    let bad_arguments =
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"judge","arguments":7}}"#;
    assert_eq!(answered(bad_arguments), (json!(2), -32602));
    // A method MCP does not have is rmcp's to answer "method not found".
    assert_eq!(
        classify(br#"{"jsonrpc":"2.0","id":3,"method":"no/such"}"#),
        Line::Pass
    );
    let bad_params = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":"x"}"#;
    assert_eq!(answered(bad_params), (json!(2), -32600));
    assert_eq!(
        classify(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
        Line::Pass
    );
    assert_eq!(
        classify(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
        Line::Pass
    );
    // Notifications are never answered, malformed or not.
    for n in [
        r#"{"method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":5}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#,
        r#"{"jsonrpc":"2.0","method":"tools/call","params":{}}"#,
    ] {
        assert!(!matches!(classify(n.as_bytes()), Line::Answer(_)), "{n}");
    }
}
