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
}
