//! `flashtune mcp` driven by a real MCP client (rmcp's) over stdio, on the fake GPU with real nvcc builds: a faster edit committed; a wrong edit, an edit outside the scope and a cheat refused and restored; bad arguments and a second judge answered with structured errors while the server goes on.
use crate::common;
use common::gitstate::*;
use common::schema;
use common::*;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

type Client = RunningService<RoleClient, ()>;

async fn connect(root: &Path) -> Client {
    let mut cmd = tokio::process::Command::new(binary());
    cmd.arg("--root").arg(root).args(["mcp", "--fake-gpu"]).env(
        "FLASHTUNE_CACHE_DIR",
        repo().join("target/test-build-cache"),
    );
    let transport = TokioChildProcess::new(cmd).expect("flashtune mcp starts");
    ().serve(transport).await.expect("MCP handshake")
}

/// Call a tool; returns (is_error, structured content).
async fn call(client: &Client, tool: &str, args: Value) -> (bool, Value) {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().expect("arguments object").clone());
    let result: CallToolResult = client.call_tool(params).await.expect("tools/call answered");
    let doc = result.structured_content.expect("structured content");
    // Every answer is one of the workbench's documents, `schema_version` and all.
    let failed = result.is_error == Some(true);
    let def = if failed {
        "error"
    } else if doc["status"] == "running" {
        "running"
    } else {
        match tool {
            "judge" | "judge_status" if doc.get("verdict").is_some() => "verdict",
            "judge_status" | "profile" => "profile",
            other => other,
        }
    };
    schema::check(def, &doc);
    (failed, doc)
}

/// Every judge here is on the one-variant, one-shape space: the default space has shapes the test
/// double would compute on the CPU for minutes.
fn on_small(mut args: Value) -> Value {
    args["space"] = json!("variants/step-ci.toml");
    args
}

/// A judge that waits until the verdict comes, whatever path (direct or polled) it takes.
async fn judge(client: &Client, args: Value) -> (bool, Value) {
    let (failed, v) = call(client, "judge", on_small(args)).await;
    if failed || v["status"] != "running" {
        return (failed, v);
    }
    poll(client, v["job"].as_str().expect("a job id")).await
}

/// Poll a job with judge_status until it ends.
async fn poll(client: &Client, job: &str) -> (bool, Value) {
    loop {
        let (failed, v) = call(client, "judge_status", json!({ "job": job, "wait_s": 30 })).await;
        if failed || v["status"] != "running" {
            return (failed, v);
        }
    }
}

fn read(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_judges_edits_and_only_the_faster_is_committed() {
    let dir = repo_project();
    let root = dir.path();
    // The cheats' sources, which the cheat below includes.
    copy_tree(
        &repo().join("kernels/attention/faults"),
        &root.join("kernels/attention/faults"),
    );
    commit_all(root, "the cheats' sources");
    // The agent's own MCP registration, untracked before the server starts, is not the agent's edit.
    let out = flashtune(
        root,
        &["mcp", "print-config", "--agent", "claude", "--fake-gpu"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let snippet: Value = serde_json::from_slice(&out.stdout).expect("print-config prints JSON");
    assert_eq!(
        snippet["mcpServers"]["flashtune"]["command"],
        json!(binary().canonicalize().unwrap().display().to_string())
    );
    std::fs::write(root.join(".mcp.json"), &out.stdout).unwrap();
    let client = connect(root).await;

    let tools = client.list_all_tools().await.unwrap();
    for name in ["judge", "judge_status", "profile", "history", "context"] {
        let tool = tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tool {name}"));
        assert!(
            tool.description.as_ref().is_some_and(|d| d.len() > 80),
            "{name} needs a description an agent can act on"
        );
    }
    // AGENTS.md names every tool the server has.
    for (name, _) in flashtune::pack::MCP_TOOLS {
        assert!(tools.iter().any(|t| t.name == *name), "no tool {name}");
    }
    let (failed, ctx) = call(&client, "context", on_small(json!({}))).await;
    assert!(!failed, "{ctx}");
    assert_eq!(ctx["edit_scope"], "kernels/");
    assert!(ctx["protected"].to_string().contains("tuned.toml"), "{ctx}");
    // The same document `flashtune context --json` prints.
    let cli = flashtune(
        root,
        &["context", "--json", "--space", "variants/step-ci.toml"],
    );
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(cli, ctx);
    // A missing file inside the project is not found; a path outside it is refused as such.
    let (failed, v) = call(&client, "context", json!({ "space": "variants/nope.toml" })).await;
    assert!(failed && v["error"]["code"] == "not_found", "{v}");
    let (failed, v) = call(&client, "context", json!({ "space": "../../outside.toml" })).await;
    assert!(
        failed && v["error"]["code"] == "path_outside_project",
        "{v}"
    );
    // An argument of the wrong type: JSON-RPC invalid params, with the error document as its data.
    let params = CallToolRequestParams::new("judge")
        .with_arguments(json!({ "wait_s": "soon" }).as_object().unwrap().clone());
    match client.call_tool(params).await {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{e:?}");
            let data = e.data.expect("structured data");
            schema::check("error", &data);
            assert_eq!(data["error"]["code"], "bad_argument", "{data}");
            assert!(
                data["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("wait_s"),
                "{data}"
            );
        }
        other => panic!("a wrong type must be invalid params, not {other:?}"),
    }

    // Bad arguments: structured errors, and the server goes on.
    let (failed, v) = call(
        &client,
        "judge",
        on_small(json!({ "variant": "no-such-variant" })),
    )
    .await;
    assert!(failed && v["error"]["code"] == "unknown_variant", "{v}");
    let (failed, v) = call(&client, "judge", json!({ "space": "../../outside.toml" })).await;
    assert!(
        failed && v["error"]["code"] == "path_outside_project",
        "{v}"
    );
    let (failed, v) = call(&client, "judge_status", json!({ "job": "judge-99" })).await;
    assert!(failed && v["error"]["code"] == "unknown_job", "{v}");
    let (failed, v) = call(
        &client,
        "profile",
        json!({ "variant": "scalar-bm64-bn64-w4-ks1-s1", "shape": "small" }),
    )
    .await;
    assert!(failed && v["error"]["code"] == "no_run", "{v}");

    // A faster edit: a job that returns at once, a second judge refused while it runs, then the verdict.
    let (before, _) = head(root);
    let champion = mark_forward(root, "time x0.80");
    let edited = read(root, FORWARD);
    let (failed, first) = call(&client, "judge", on_small(json!({ "wait_s": 0 }))).await;
    assert!(!failed && first["status"] == "running", "{first}");
    let job = first["job"].as_str().unwrap().to_owned();
    let (failed, second) = call(&client, "judge", on_small(json!({}))).await;
    assert!(failed, "{second}");
    assert_eq!(second["error"]["code"], "busy", "{second}");
    assert_eq!(second["error"]["job"], json!(job));
    let (failed, v) = poll(&client, &job).await;
    assert!(!failed, "{v}");
    assert_eq!(v["accepted"], true, "{v}");
    // The fake GPU's verdict is committed to a scratch ref, never the branch; the tree goes back.
    assert_eq!(head(root).0, before);
    let scratch = scratch_commits(root);
    let (_, after, message) = scratch.last().expect("a scratch commit").clone();
    assert_eq!(v["commit"], json!(after));
    assert_eq!(v["synthetic"], true);
    assert!(message.contains("Flashtune-Step: "), "{message}");
    assert_eq!(file_at(root, &after, FORWARD), edited);
    assert_eq!(read(root, FORWARD), champion);
    assert_eq!(
        dirty(root),
        [".mcp.json"],
        "only the snippet stays uncommitted"
    );
    let cases = v["cases"].as_array().unwrap();
    assert!(
        !cases.is_empty() && cases.iter().all(|c| c["gain"].as_f64() > Some(0.1)),
        "{v}"
    );

    // A wrong edit: refused and restored, and its patch comes back from `attempt`.
    mark_forward(root, "fault FAULT_WRONG");
    let (failed, v) = judge(&client, json!({ "idea": "skip the softmax rescale" })).await;
    assert!(!failed, "{v}");
    assert_eq!(v["accepted"], false, "{v}");
    assert!(v["reason"].as_str().unwrap().contains("relative L2"), "{v}");
    assert_eq!(v["idea"]["summary"], "skip the softmax rescale");
    assert_eq!(read(root, FORWARD), champion);
    assert_eq!(head(root).0, before);
    let (failed, a) = call(&client, "attempt", json!({ "id": v["attempt"] })).await;
    assert!(!failed, "{a}");
    assert!(a["patch"].as_str().unwrap().contains("FAULT_WRONG"), "{a}");
    let (failed, a) = call(
        &client,
        "attempt",
        json!({ "id": "20990101-000000-abcd/1" }),
    )
    .await;
    assert!(failed && a["error"]["code"] == "not_found", "{a}");

    // An edit outside the scope (the policies, a stray file, the oracle): all of it undone unjudged.
    let policies = read(root, "policies.toml");
    let reference = read(root, "kernels/oracle/reference.cu");
    std::fs::write(
        root.join("policies.toml"),
        policies.replace("threshold = 0.02", "threshold = 0.0"),
    )
    .unwrap();
    std::fs::write(root.join("stray.txt"), "note").unwrap();
    std::fs::write(
        root.join("kernels/oracle/reference.cu"),
        format!("{reference}\n// easier\n"),
    )
    .unwrap();
    mark_forward(root, "time x0.50");
    let (failed, v) = judge(&client, json!({})).await;
    assert!(!failed, "{v}");
    assert_eq!(v["accepted"], false, "{v}");
    let reason = v["reason"].as_str().unwrap();
    for named in ["policies.toml", "stray.txt", "reference.cu"] {
        assert!(reason.contains(named), "{named} not in {reason}");
    }
    assert_eq!(read(root, "policies.toml"), policies);
    assert_eq!(read(root, "kernels/oracle/reference.cu"), reference);
    assert_eq!(read(root, FORWARD), champion);
    assert!(!root.join("stray.txt").exists());
    assert_eq!(dirty(root), [".mcp.json"]);
    assert_eq!(head(root).0, before);
    // Refused before any build, yet kept: its patch (the stray file included) is in the history.
    let (failed, a) = call(&client, "attempt", json!({ "id": v["attempt"] })).await;
    assert!(!failed, "{a}");
    let patch = a["patch"].as_str().unwrap();
    assert!(
        patch.contains("stray.txt") && patch.contains("time x0.50"),
        "{patch}"
    );

    // A cheat (outputs cached by pointer): refused by name and restored.
    std::fs::write(
        root.join(FORWARD),
        "#define CHEAT CHEAT_CACHE_BY_POINTER\n#include \"faults/cheats.cu\"\n__device__ char flashtune_fake_mark[] = \"flashtune-fake: cheat CHEAT_CACHE_BY_POINTER\";\n",
    )
    .unwrap();
    let (failed, v) = judge(&client, json!({})).await;
    assert!(!failed, "{v}");
    assert_eq!(v["accepted"], false, "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("a timed launch's output is wrong for the inputs it read"),
        "{v}"
    );
    assert_eq!(read(root, FORWARD), champion);
    assert_eq!(head(root).0, before);

    // The history holds every judged step, in order.
    let (failed, h) = call(&client, "history", json!({})).await;
    assert!(!failed, "{h}");
    let verdicts: Vec<&str> = h["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["verdict"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(
        verdicts,
        ["committed", "rejected", "rejected", "rejected"],
        "{h}"
    );
    client.cancel().await.unwrap();
}

#[test]
fn print_config_write_merges_into_the_agents_files_and_keeps_them_valid() {
    let dir = repo_project();
    let home = tempfile::tempdir().unwrap();
    let codex = home.path().join(".codex/config.toml");
    std::fs::create_dir_all(codex.parent().unwrap()).unwrap();
    std::fs::write(
        &codex,
        "# my settings\nmodel = \"gpt-x\"\n\n[mcp_servers.other]\ncommand = \"other\"\n",
    )
    .unwrap();
    let print = |agent: &str| {
        std::process::Command::new(binary())
            .arg("--root")
            .arg(dir.path())
            .args(["mcp", "print-config", "--agent", agent, "--write"])
            .env("HOME", home.path())
            .output()
            .unwrap()
    };
    // Twice: the second replaces the first, where `>>` twice made invalid TOML.
    for _ in 0..2 {
        let out = print("codex");
        assert!(out.status.success(), "{}", text(&out));
    }
    let written = std::fs::read_to_string(&codex).unwrap();
    let parsed: toml::Table = toml::from_str(&written).expect("valid TOML");
    let servers = parsed["mcp_servers"].as_table().unwrap();
    assert!(
        servers.contains_key("other") && servers.contains_key("flashtune"),
        "{written}"
    );
    assert!(written.starts_with("# my settings"), "{written}");
    assert_eq!(
        written.matches("[mcp_servers.flashtune]").count(),
        1,
        "{written}"
    );
    // A JSON file keeps its other servers.
    std::fs::write(
        dir.path().join(".mcp.json"),
        r#"{"mcpServers": {"other": {"command": "other"}}}"#,
    )
    .unwrap();
    let out = print("claude");
    assert!(out.status.success(), "{}", text(&out));
    let merged: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(".mcp.json")).unwrap())
            .unwrap();
    assert!(
        merged["mcpServers"]["other"].is_object() && merged["mcpServers"]["flashtune"].is_object(),
        "{merged}"
    );
    // Issue 52: the file it wrote in the project is uncommitted; it says so, and `step` with a
    // proposer refuses it for the reason that holds (its changes must be told apart from the
    // proposer's), not as a file that decides how an edit is judged.
    assert!(
        text(&out).contains("commit ") && text(&out).contains(".gitignore"),
        "{}",
        text(&out)
    );
    let out = fake_step(dir.path(), &["--proposer", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("the working tree holds uncommitted changes: .mcp.json"),
        "{}",
        text(&out)
    );
    assert!(
        !text(&out).contains("decide how an edit is judged"),
        "{}",
        text(&out)
    );
}

/// `flashtune mcp` on raw pipes: lines in, lines out, as a client that may send anything.
struct Raw {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Raw {
    fn start(root: &Path) -> Raw {
        let mut child = std::process::Command::new(binary())
            .arg("--root")
            .arg(root)
            .args(["mcp", "--fake-gpu"])
            .env(
                "FLASHTUNE_CACHE_DIR",
                repo().join("target/test-build-cache"),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("flashtune mcp starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut raw = Raw {
            child,
            stdin,
            lines,
        };
        raw.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#);
        let init = raw.next();
        assert_eq!(init["id"], 0, "{init}");
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        raw
    }

    fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message from the server that is not a notification.
    fn next(&mut self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("the server answers within 30 s");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("the server wrote a line that is not JSON ({e}): {line}")
            });
            assert_eq!(v["jsonrpc"], "2.0", "{v}");
            if v.get("id").is_some() {
                return v;
            }
        }
    }

    /// Send one line; the error response it gets: its id, code and error object.
    fn error_for(&mut self, line: &str) -> (Value, i64, Value) {
        self.send(line);
        let v = self.next();
        let error = v
            .get("error")
            .unwrap_or_else(|| panic!("{line}: no error in {v}"));
        assert!(v.get("result").is_none(), "{v}");
        (
            v["id"].clone(),
            error["code"].as_i64().unwrap(),
            error.clone(),
        )
    }

    /// Close stdin, as a client that disconnects; then wait up to `limit` for the server to exit.
    fn disconnect(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        drop(self.stdin.take());
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_server_answers_every_line_as_json_rpc_2_0_asks() {
    let dir = repo_project();
    let mut raw = Raw::start(dir.path());
    // A line cut short: Parse error, id null.
    let (id, code, _) = raw.error_for(r#"{"jsonrpc":"2.0","id":1,"method":"tools/li"#);
    assert_eq!((id, code), (Value::Null, -32700));
    let (id, code, _) = raw.error_for("not json at all");
    assert_eq!((id, code), (Value::Null, -32700));
    // Valid JSON that is no request: Invalid Request, with the request's id where it had one.
    let (id, code, e) = raw.error_for(r#"{"id":2,"method":"tools/list"}"#);
    assert_eq!((id, code), (json!(2), -32600), "{e}");
    let (id, code, e) = raw.error_for(r#"{"jsonrpc":"2.0","id":"three","method":7}"#);
    assert_eq!((id, code), (json!("three"), -32600), "{e}");
    let (id, code, e) = raw.error_for(r#"{"jsonrpc":"2.0","id":4}"#);
    assert_eq!((id, code), (json!(4), -32600), "{e}");
    let (id, code, e) = raw.error_for(r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#);
    assert_eq!((id, code), (json!(5), -32600), "{e}");
    let (id, code, e) = raw.error_for(r#"[{"jsonrpc":"2.0","id":6,"method":"ping"}]"#);
    assert_eq!((id, code), (Value::Null, -32600), "{e}");
    let (id, code, e) = raw.error_for("42");
    assert_eq!((id, code), (Value::Null, -32600), "{e}");
    let (id, code, e) = raw.error_for(r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#);
    assert_eq!((id, code), (Value::Null, -32600), "{e}");
    // Notifications are never answered, well-formed, unknown or malformed: the next answer is the ping's.
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/no_such_thing"}"#);
    raw.send(r#"{"method":"notifications/initialized"}"#);
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":"x"}"#);
    raw.send(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
    let pong = raw.next();
    assert_eq!(pong["id"], 7, "{pong}");
    assert!(pong.get("result").is_some(), "{pong}");
    // And the server goes on.
    raw.send(r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#);
    let tools = raw.next();
    assert_eq!(tools["id"], 8, "{tools}");
    assert!(
        tools["result"]["tools"].as_array().unwrap().len() >= 6,
        "{tools}"
    );
    // wait_s says its maximum in the schema.
    let judge = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "judge")
        .unwrap();
    assert_eq!(
        judge["inputSchema"]["properties"]["wait_s"]["maximum"], 540,
        "{judge}"
    );
    let (id, code, e) = raw.error_for(
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"judge","arguments":7}}"#,
    );
    assert_eq!((id, code), (json!(9), -32602), "{e}");
}

#[test]
fn unknown_tools_unknown_arguments_and_too_long_waits_are_refused_by_name() {
    let dir = repo_project();
    let root = dir.path();
    let mut raw = Raw::start(root);
    let call = |raw: &mut Raw, id: u32, tool: &str, args: Value| {
        let line = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": args },
        });
        let (got, code, e) = raw.error_for(&line.to_string());
        assert_eq!((got, code), (json!(id), -32602), "{e}");
        let data = e["data"].clone();
        schema::check("error", &data);
        (e["message"].as_str().unwrap().to_owned(), data)
    };
    // An unknown tool: named, with the tools there are.
    let (message, data) = call(&mut raw, 1, "jugde", json!({}));
    assert_eq!(data["error"]["code"], "unknown_tool", "{data}");
    assert!(message.contains("`jugde`"), "{message}");
    for tool in [
        "judge",
        "judge_status",
        "profile",
        "history",
        "context",
        "attempt",
    ] {
        assert!(message.contains(tool), "{tool} not in {message}");
        assert!(
            data["error"]["known"]
                .as_array()
                .unwrap()
                .contains(&json!(tool)),
            "{data}"
        );
    }
    // Unknown arguments: named, with the accepted ones; nothing runs.
    let (message, data) = call(
        &mut raw,
        2,
        "judge",
        on_small(json!({ "wait": 5, "ideas": "x" })),
    );
    assert_eq!(data["error"]["code"], "bad_argument", "{data}");
    for named in [
        "`wait`",
        "`ideas`",
        "`wait_s`",
        "`idea`",
        "`space`",
        "`variant`",
    ] {
        assert!(message.contains(named), "{named} not in {message}");
    }
    assert_eq!(data["error"]["unknown"], json!(["ideas", "wait"]), "{data}");
    let (message, data) = call(
        &mut raw,
        3,
        "history",
        json!({ "last": 3, "verbose": true }),
    );
    assert_eq!(data["error"]["code"], "bad_argument", "{data}");
    assert!(
        message.contains("`verbose`") && message.contains("`last`"),
        "{message}"
    );
    // A wait above the maximum: refused, naming it, by every tool that waits.
    for (id, tool, args) in [
        (4, "judge", on_small(json!({ "wait_s": 541 }))),
        (
            5,
            "judge_status",
            json!({ "job": "judge-1", "wait_s": 3600 }),
        ),
        (
            6,
            "profile",
            json!({ "variant": "scalar-bm64-bn64-w4-ks1-s1", "shape": "small", "wait_s": 600 }),
        ),
    ] {
        let (message, data) = call(&mut raw, id, tool, args);
        assert_eq!(data["error"]["code"], "bad_argument", "{data}");
        assert_eq!(data["error"]["field"], "wait_s", "{data}");
        assert_eq!(data["error"]["maximum"], 540, "{data}");
        assert!(
            message.contains("540") && message.contains("wait_s"),
            "{message}"
        );
    }
    // Nothing was judged.
    assert!(!root.join("runs").exists());
    // The maximum itself is accepted.
    raw.send(
        &json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": { "name": "judge_status", "arguments": { "job": "judge-1", "wait_s": 540 } },
        })
        .to_string(),
    );
    let v = raw.next();
    assert_eq!(
        v["result"]["structuredContent"]["error"]["code"], "unknown_job",
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_variant_is_unknown_variant_in_every_tool() {
    let dir = repo_project();
    let client = connect(dir.path()).await;
    let wrong = "no-such-variant";
    for (tool, args) in [
        ("context", on_small(json!({ "variant": wrong }))),
        ("judge", on_small(json!({ "variant": wrong }))),
        ("profile", json!({ "variant": wrong, "shape": "small" })),
    ] {
        let (failed, v) = call(&client, tool, args).await;
        assert!(failed, "{tool}: {v}");
        assert_eq!(v["error"]["code"], "unknown_variant", "{tool}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(wrong),
            "{tool}: {v}"
        );
        assert!(v["error"]["known"].is_array(), "{tool}: {v}");
    }
    // A variant of the project that no run timed yet is still `no_run` to profile.
    let (failed, v) = call(
        &client,
        "profile",
        json!({ "variant": "scalar-bm64-bn64-w4-ks1-s1", "shape": "small" }),
    )
    .await;
    assert!(failed && v["error"]["code"] == "no_run", "{v}");
    client.cancel().await.unwrap();
}

/// An MCP server whose judge duels an edit whose kernel never returns: the server, the judge's run.
fn judge_in_flight(root: &Path) -> (Raw, PathBuf) {
    // The edit's kernel never returns: the duel is still in flight when the server goes.
    mark_forward(root, "fault FAULT_HANG");
    let mut raw = Raw::start(root);
    raw.send(
        &json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": { "name": "judge", "arguments": on_small(json!({ "wait_s": 1, "idea": "a kernel that hangs" })) },
        })
        .to_string(),
    );
    let v = raw.next();
    assert_eq!(v["result"]["structuredContent"]["status"], "running", "{v}");
    // Wait until the judge built the edit and duels it.
    let started = std::time::Instant::now();
    let run_dir = loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(180),
            "the judge never built the edit"
        );
        let built = std::fs::read_dir(root.join("runs")).ok().and_then(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path())).find(|d| {
                std::fs::read_to_string(d.join("log.jsonl"))
                    .is_ok_and(|log| log.contains("@edit\"") && log.contains("\"built\""))
            })
        });
        if let Some(d) = built {
            break d;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    std::thread::sleep(std::time::Duration::from_secs(1));
    (raw, run_dir)
}

/// The judge's run ended `interrupted` (its reason naming `why` and the file), decided nothing, and
/// left the tree at HEAD with the edit's patch kept.
fn assert_judge_interrupted(root: &Path, run_dir: &Path, champion: &str, why: &str) {
    let records = records(run_dir);
    match records.last() {
        Some(flashtune::log::runlog::Record::Interrupted { reason }) => {
            assert!(reason.contains(why), "{reason}");
            assert!(reason.contains(FORWARD), "{reason}");
        }
        other => panic!("the judge's run ends with {other:?}, not `interrupted`"),
    }
    assert!(
        !records
            .iter()
            .any(|r| matches!(r, flashtune::log::runlog::Record::StepDecided { .. })),
        "an interrupted judge decides nothing"
    );
    // The edit is restored, as on any interruption, and its patch kept.
    assert_eq!(read(root, FORWARD), champion);
    assert!(dirty(root).is_empty(), "{:?}", dirty(root));
    let patch = std::fs::read_to_string(run_dir.join("attempts/1.patch")).unwrap();
    assert!(patch.contains("FAULT_HANG"), "{patch}");
}

#[test]
fn a_client_that_disconnects_mid_judge_leaves_the_run_interrupted_and_the_edit_restored() {
    let dir = repo_project();
    let root = dir.path();
    let champion = read(root, FORWARD);
    let (mut raw, run_dir) = judge_in_flight(root);
    let status = raw
        .disconnect(std::time::Duration::from_secs(60))
        .expect("the server exits once its client is gone");
    assert!(status.success(), "{status:?}");
    // The server stops its judge as a stop request does: the judge ends through its own stop path.
    assert_judge_interrupted(root, &run_dir, &champion, "SIGTERM");
}

/// A stop signal to the server (SIGHUP here: its terminal closed) stops its judge as a client's
/// disconnect does: the judge ends through its own stop path.
#[test]
fn a_server_stopped_by_a_signal_mid_judge_leaves_the_edit_restored() {
    let dir = repo_project();
    let root = dir.path();
    let champion = read(root, FORWARD);
    let (mut raw, run_dir) = judge_in_flight(root);
    unsafe { libc::kill(raw.child.id() as i32, libc::SIGHUP) };
    let status = raw.child.wait().unwrap();
    assert!(
        status.code().is_some(),
        "the server exits by itself: {status:?}"
    );
    assert_judge_interrupted(root, &run_dir, &champion, "SIGTERM");
}

/// Issue 52, item 2: a server killed outright takes its judge down by SIGTERM, not SIGKILL, so
/// the judge still restores its edit and logs `interrupted` (before: the edit stayed in the tree).
#[test]
fn a_server_killed_outright_mid_judge_still_leaves_the_edit_restored() {
    let dir = repo_project();
    let root = dir.path();
    let champion = read(root, FORWARD);
    let (mut raw, run_dir) = judge_in_flight(root);
    raw.child.kill().unwrap();
    raw.child.wait().unwrap();
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(run_dir.join("log.jsonl"))
        .is_ok_and(|t| t.contains("\"event\":\"interrupted\""))
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the orphaned judge never logged `interrupted`"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_judge_interrupted(root, &run_dir, &champion, "SIGTERM");
}
