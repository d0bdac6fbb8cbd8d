//! `flashtune mcp` driven by a real MCP client (rmcp's) over stdio, on the fake GPU with real nvcc builds: a faster edit committed; a wrong edit, an edit outside the scope and a cheat refused and restored; bad arguments and a second judge answered with structured errors while the server goes on.
mod common;
use common::gitstate::*;
use common::*;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::path::Path;

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
    (
        result.is_error == Some(true),
        result.structured_content.expect("structured content"),
    )
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
    let original = read(root, FORWARD);
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
    let (failed, ctx) = call(&client, "context", json!({})).await;
    assert!(!failed, "{ctx}");
    assert_eq!(ctx["edit_scope"], "kernels/");
    assert!(ctx["protected"].to_string().contains("tuned.toml"), "{ctx}");

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
    mark_forward(root, "time x0.80");
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
    let (after, message) = head(root);
    assert_ne!(after, before);
    assert_eq!(v["commit"], json!(after));
    assert!(message.contains("Flashtune-Step: "), "{message}");
    assert_eq!(read(root, FORWARD), edited);
    assert_eq!(
        dirty(root),
        [".mcp.json"],
        "only the snippet stays uncommitted"
    );
    let cases = v["duels"].as_array().unwrap();
    assert!(
        !cases.is_empty() && cases.iter().all(|c| c["gain"].as_f64() > Some(0.1)),
        "{v}"
    );

    // A wrong edit: refused and restored.
    let champion = read(root, FORWARD);
    mark_forward(root, "fault FAULT_WRONG");
    let (failed, v) = judge(&client, json!({})).await;
    assert!(!failed, "{v}");
    assert_eq!(v["accepted"], false, "{v}");
    assert!(v["reason"].as_str().unwrap().contains("relative L2"), "{v}");
    assert_eq!(read(root, FORWARD), champion);
    assert_eq!(head(root).0, after);

    // An edit outside the scope (the policies, a stray file, the oracle): all of it undone unjudged.
    let policies = read(root, "policies.toml");
    let reference = read(root, "kernels/attention/reference.cu");
    std::fs::write(
        root.join("policies.toml"),
        policies.replace("threshold = 0.02", "threshold = 0.0"),
    )
    .unwrap();
    std::fs::write(root.join("stray.txt"), "note").unwrap();
    std::fs::write(
        root.join("kernels/attention/reference.cu"),
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
    assert_eq!(read(root, "kernels/attention/reference.cu"), reference);
    assert_eq!(read(root, FORWARD), champion);
    assert!(!root.join("stray.txt").exists());
    assert_eq!(dirty(root), [".mcp.json"]);
    assert_eq!(head(root).0, after);

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
    assert_eq!(head(root).0, after);
    assert_ne!(read(root, FORWARD), original);

    // The history holds every judged step, in order.
    let (failed, h) = call(&client, "history", json!({})).await;
    assert!(!failed, "{h}");
    let verdicts: Vec<&str> = h["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["verdict"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(verdicts, ["committed", "rejected", "rejected"], "{h}");
    client.cancel().await.unwrap();
}
