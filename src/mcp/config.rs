//! `flashtune mcp print-config`: the snippet that registers the server with a coding agent, and
//! `--write`, which merges it into the agent's file (the `flashtune` entry added or replaced, the
//! rest kept), so a second run never leaves a file the agent cannot read.
use super::MAX_WAIT_S;
use crate::error::{Error, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The coding agents `print-config` writes a snippet for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    Claude,
    Codex,
    Gemini,
    Cursor,
}

/// Environment the server needs that clients may not pass on: Codex starts MCP servers with a
/// short allow-list of variables, so nvcc's location would be lost.
const PASSED_ENV: [&str; 2] = ["FLASHTUNE_NVCC", "FLASHTUNE_CACHE_DIR"];

/// Where `agent` reads its MCP servers from (relative to the project, or `~` for the user's), and
/// the snippet that registers `flashtune mcp` for this project with `binary`.
pub fn client_config(agent: Agent, binary: &Path, root: &Path, fake_gpu: bool) -> (String, String) {
    let mut args = vec![
        "--root".to_owned(),
        root.display().to_string(),
        "mcp".to_owned(),
    ];
    if fake_gpu {
        args.push("--fake-gpu".to_owned());
    }
    let env: BTreeMap<&str, String> = PASSED_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v)))
        .collect();
    let command = binary.display().to_string();
    // A judge waits up to 45 s before handing back a job to poll; the clients' timeouts leave room.
    let mut server = json!({ "command": command, "args": args });
    if !env.is_empty() {
        server["env"] = json!(env);
    }
    let json_file = |file: &str, server: Value| {
        (
            file.to_owned(),
            serde_json::to_string_pretty(&json!({ "mcpServers": { "flashtune": server } }))
                .expect("JSON")
                + "\n",
        )
    };
    match agent {
        Agent::Claude => {
            let mut s = server;
            s["type"] = json!("stdio");
            json_file(".mcp.json", s)
        }
        Agent::Cursor => json_file(".cursor/mcp.json", server),
        Agent::Gemini => {
            let mut s = server;
            s["timeout"] = json!(MAX_WAIT_S * 1000 + 60_000);
            // Trusted: Gemini CLI calls its tools without asking (the judge undoes what it must).
            s["trust"] = json!(true);
            // Gemini CLI reads a project's .gemini/settings.json only in a folder it trusts; the
            // user's settings always.
            json_file("~/.gemini/settings.json", s)
        }
        Agent::Codex => {
            let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
            let mut t = String::from("[mcp_servers.flashtune]\n");
            t.push_str(&format!("command = {}\n", quote(&command)));
            let list: Vec<String> = args.iter().map(|a| quote(a)).collect();
            t.push_str(&format!("args = [{}]\n", list.join(", ")));
            t.push_str(&format!("tool_timeout_sec = {}\n", MAX_WAIT_S + 60));
            if !env.is_empty() {
                t.push_str("\n[mcp_servers.flashtune.env]\n");
                for (k, v) in &env {
                    t.push_str(&format!("{k} = {}\n", quote(v)));
                }
            }
            ("~/.codex/config.toml".to_owned(), t)
        }
    }
}

/// Merge `snippet` (what `client_config` printed for `agent`) into the file at `path`: JSON files
/// get `mcpServers.flashtune` set, Codex's TOML its `[mcp_servers.flashtune]` tables replaced.
/// A file that does not parse is refused, not overwritten.
pub fn write_client_config(agent: Agent, path: &Path, snippet: &str) -> Result<()> {
    let before = match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(Error::BadInput(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    let merged = match agent {
        Agent::Codex => {
            let kept = before
                .as_deref()
                .map_or(String::new(), without_flashtune_tables);
            let text = if kept.trim().is_empty() {
                snippet.to_owned()
            } else {
                format!("{}\n\n{snippet}", kept.trim_end())
            };
            toml::from_str::<toml::Table>(&text).map_err(|e| {
                Error::BadInput(format!(
                    "{} would not be valid TOML with the snippet ({e}); fix the file first",
                    path.display()
                ))
            })?;
            text
        }
        Agent::Claude | Agent::Cursor | Agent::Gemini => {
            let mut doc: Value = match before.as_deref().filter(|t| !t.trim().is_empty()) {
                Some(t) => serde_json::from_str(t).map_err(|e| {
                    Error::BadInput(format!(
                        "{} is not JSON ({e}); fix it first, or write the snippet yourself",
                        path.display()
                    ))
                })?,
                None => json!({}),
            };
            let ours: Value = serde_json::from_str(snippet).expect("the snippet is JSON");
            if !doc.is_object() {
                return Err(Error::BadInput(format!(
                    "{} holds no JSON object",
                    path.display()
                )));
            }
            if !doc["mcpServers"].is_object() {
                doc["mcpServers"] = json!({});
            }
            doc["mcpServers"]["flashtune"] = ours["mcpServers"]["flashtune"].clone();
            serde_json::to_string_pretty(&doc).expect("JSON") + "\n"
        }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::BadInput(format!("cannot create {}: {e}", parent.display())))?;
    }
    std::fs::write(path, merged)
        .map_err(|e| Error::BadInput(format!("cannot write {}: {e}", path.display())))
}

/// A TOML text without its `[mcp_servers.flashtune]` table and the tables under it; comments and
/// everything else kept as written.
fn without_flashtune_tables(text: &str) -> String {
    let mut out = Vec::new();
    let mut skipping = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            let name = t.trim_start_matches('[').trim_end_matches(']').trim();
            skipping =
                name == "mcp_servers.flashtune" || name.starts_with("mcp_servers.flashtune.");
        }
        if !skipping {
            out.push(line);
        }
    }
    out.join("\n")
}
