//! A real coding-agent CLI (Gemini CLI, pinned, installed from npm by scripts/test.sh) against a model API faked on loopback: as `step`'s proposer its edit is judged and committed, and configured by `flashtune mcp print-config` it calls `judge` through `flashtune mcp`.
use crate::common;
use common::gitstate::*;
use common::*;
use flashtune::log::runlog::Record;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The version scripts/test.sh installs; the fake API answers what this version asks.
const GEMINI_CLI_VERSION: &str = "0.61.0";
/// Tokens the fake API reports per answer (tests/agents/fake_gemini_api.py's USAGE).
const TOKENS_PER_ANSWER: u64 = 3534;

/// The installed CLI, or None (with the reason printed) where npm is absent and nothing could install it.
fn gemini_cli() -> Option<PathBuf> {
    let installed = std::env::var_os("FLASHTUNE_GEMINI_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            repo().join(format!(
                ".tools/gemini-cli-{GEMINI_CLI_VERSION}/node_modules/.bin/gemini"
            ))
        });
    if installed.is_file() {
        return Some(installed);
    }
    let npm = Command::new("npm").arg("--version").output();
    if npm.is_err() {
        eprintln!("SKIPPED: npm is not installed, so the Gemini CLI could not be installed; the real-agent tests did not run");
        return None;
    }
    panic!(
        "{} is missing: scripts/test.sh installs @google/gemini-cli@{GEMINI_CLI_VERSION} there from npm",
        installed.display()
    );
}

/// The fake model API, killed when dropped.
struct FakeApi {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl FakeApi {
    fn start(
        scratch: &Path,
        kernel: &Path,
        write_as: Option<&str>,
        marker: &str,
        judge: bool,
    ) -> FakeApi {
        let port_file = scratch.join("api.port");
        let log = scratch.join("api.jsonl");
        let mut cmd = Command::new("python3");
        cmd.arg(repo().join("tests/agents/fake_gemini_api.py"))
            .arg("--kernel")
            .arg(kernel)
            .args(["--marker", marker, "--log"])
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file);
        if judge {
            cmd.arg("--judge");
        }
        if let Some(rel) = write_as {
            cmd.args(["--write-as", rel]);
        }
        let child = cmd.spawn().expect("python3 runs the fake API");
        let started = Instant::now();
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().expect("a port");
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the fake API did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        FakeApi { child, port, log }
    }

    /// Every request the CLI made to the model.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("API log line"))
            .collect()
    }
}

/// A HOME for the CLI that selects API-key auth; nothing of the user's own settings is read. Beside
/// it, the CLI's own temp folder (see `agent_env`).
fn gemini_home(scratch: &Path) -> PathBuf {
    let home = scratch.join("home");
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::create_dir_all(scratch.join("tmp")).unwrap();
    std::fs::write(
        home.join(".gemini/settings.json"),
        r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false}}"#,
    )
    .unwrap();
    home
}

/// Headless, edits approved, the project trusted for this session, JSON result on stdout.
fn gemini_args(prompt: &str) -> Vec<String> {
    [
        "-p",
        prompt,
        "-o",
        "json",
        "--approval-mode",
        "yolo",
        "--skip-trust",
        "-m",
        "gemini-fake",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The CLI's environment, for it and for the flashtune command that runs it. GEMINI_MODEL names the
/// model as `-m` does (the `--agent gemini` template passes none): left to choose, the CLI's model
/// router first asks a classifier model, which the fake API cannot answer, and retries for about
/// 90 s. TMPDIR is the scratch's own: the CLI writes its `gemini-client-error-*.json` reports into
/// os.tmpdir(), and a test leaves nothing in /tmp (`assert_no_error_reports` reads it after).
fn agent_env(cmd: &mut Command, home: &Path, api: &FakeApi) {
    cmd.env("HOME", home)
        .env("TMPDIR", home.with_file_name("tmp"))
        .env("GEMINI_MODEL", "gemini-fake")
        .env("GEMINI_API_KEY", "fake-key")
        .env(
            "GOOGLE_GEMINI_BASE_URL",
            format!("http://127.0.0.1:{}", api.port),
        )
        .env("NO_COLOR", "1")
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        );
}

/// The answers the CLI got from the model, counted from the fake API's log.
fn answers(api: &FakeApi) -> u64 {
    api.requests()
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.contains("enerateContent"))
        })
        .count() as u64
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn gemini_cli_as_the_proposer_has_its_edit_judged_and_its_usage_logged() {
    let Some(gemini) = gemini_cli() else { return };
    let dir = repo_project();
    let root = dir.path();
    let scratch = tempfile::tempdir().unwrap();
    let marker = r#"__device__ char flashtune_fake_agent[] = "flashtune-fake: time x0.70";"#;
    let api = FakeApi::start(scratch.path(), &root.join(FORWARD), None, marker, false);
    let home = gemini_home(scratch.path());
    let (before, _) = head(root);
    // The CLI's JSON result, on one line so the step log's output tail keeps it whole.
    let args: Vec<String> = gemini_args("Make the attention kernel faster.")
        .iter()
        .map(|a| shell_quote(a))
        .collect();
    let proposer = format!(
        "{} {} | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))'",
        shell_quote(&gemini.display().to_string()),
        args.join(" ")
    );
    let mut cmd = Command::new(binary());
    cmd.arg("--root")
        .arg(root)
        .args(["step", "--fake-gpu", "--space", "variants/step-ci.toml"])
        .args(["--proposer", &proposer]);
    agent_env(&mut cmd, &home, &api);
    let out = cmd.output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("1 accepted, 0 rejected"), "{t}");
    assert_edit_committed(root, &before, marker, &t);

    // The CLI's own usage report is in the step's log, and its figures are the API's.
    let run = run_dir_from(&out);
    let tail = records(&run)
        .into_iter()
        .find_map(|r| match r {
            Record::ProposerRan { output_tail, .. } => Some(output_tail),
            _ => None,
        })
        .expect("a proposer_ran record");
    let result: Value = tail
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON result in the proposer's output:\n{tail}"));
    let tokens = &result["stats"]["models"]["gemini-fake"]["tokens"]["total"];
    let answered = answers(&api);
    assert!(answered >= 2, "a tool call and a final answer");
    assert_eq!(
        tokens.as_u64(),
        Some(answered * TOKENS_PER_ANSWER),
        "{result}"
    );
    assert_no_error_reports(&api, &home);
}

#[test]
fn gemini_cli_as_a_named_agent_has_its_edit_committed_and_its_usage_in_the_ledger() {
    let Some(gemini) = gemini_cli() else { return };
    let dir = repo_project();
    let root = dir.path();
    let scratch = tempfile::tempdir().unwrap();
    let marker = r#"__device__ char flashtune_fake_agent[] = "flashtune-fake: time x0.70";"#;
    // The agent works in its own worktree: the edit names the kernel relative to it.
    let api = FakeApi::start(
        scratch.path(),
        &root.join(FORWARD),
        Some(FORWARD),
        marker,
        false,
    );
    let home = gemini_home(scratch.path());
    let (before, _) = head(root);
    // `--agent gemini` runs policies.toml's shipped template: `gemini` is found on PATH.
    let path = format!(
        "{}:{}",
        gemini.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(binary());
    cmd.arg("--root")
        .arg(root)
        .args(["step", "--fake-gpu", "--space", "variants/step-ci.toml"])
        .args(["--agent", "gemini", "--candidates", "1", "--steps", "1"])
        .env("PATH", path);
    agent_env(&mut cmd, &home, &api);
    let out = cmd.output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_edit_committed(root, &before, marker, &t);

    // The ledger holds the CLI's own token counts, which are the fake API's.
    let answered = answers(&api);
    assert!(answered >= 2, "a tool call and a final answer");
    let session = only_run_holding(root, "ledger.json");
    let ledger: Value =
        serde_json::from_str(&std::fs::read_to_string(session.join("ledger.json")).unwrap())
            .unwrap();
    assert_eq!(ledger["synthetic"], true, "{ledger}");
    let row = &ledger["rows"][0];
    assert_eq!(row["verdict"], "committed", "{ledger}");
    let tokens = row["input_tokens"].as_u64().unwrap_or(0)
        + row["cached_input_tokens"].as_u64().unwrap_or(0)
        + row["output_tokens"].as_u64().unwrap_or(0);
    assert_eq!(tokens, answered * TOKENS_PER_ANSWER, "{ledger}");
    assert!(
        row["agent_seconds"].as_f64().unwrap_or(0.0) > 0.0,
        "{ledger}"
    );
    assert_no_error_reports(&api, &home);
}

#[test]
fn gemini_cli_configured_by_print_config_calls_judge_through_flashtune_mcp() {
    let Some(gemini) = gemini_cli() else { return };
    // The agent calls judge with no arguments: the default space is the one-shape space.
    let dir = repo_project_with(|p| {
        p.replace(
            r#"default_space = "variants/quick.toml""#,
            r#"default_space = "variants/step-ci.toml""#,
        )
    });
    let root = dir.path();
    let scratch = tempfile::tempdir().unwrap();
    let marker = r#"__device__ char flashtune_fake_agent[] = "flashtune-fake: time x0.70";"#;
    let api = FakeApi::start(scratch.path(), &root.join(FORWARD), None, marker, true);
    let home = gemini_home(scratch.path());
    let (before, _) = head(root);

    let mut print = Command::new(binary());
    print
        .arg("--root")
        .arg(root)
        .args(["mcp", "print-config", "--agent", "gemini", "--fake-gpu"]);
    agent_env(&mut print, &home, &api);
    let out = print.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // Into the user's settings: Gemini CLI reads a project's own only in a folder it trusts.
    let settings = home.join(".gemini/settings.json");
    let mut merged: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    let snippet: Value = serde_json::from_slice(&out.stdout).expect("print-config prints JSON");
    assert_eq!(
        snippet["mcpServers"]["flashtune"]["trust"], true,
        "{snippet}"
    );
    merged["mcpServers"] = snippet["mcpServers"].clone();
    std::fs::write(&settings, merged.to_string()).unwrap();

    let mut cmd = Command::new(&gemini);
    cmd.current_dir(root)
        .args(gemini_args(
            "Make the attention kernel faster, then call judge.",
        ))
        .stdin(Stdio::null());
    agent_env(&mut cmd, &home, &api);
    let out = cmd.output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {t}"));
    assert_eq!(result["stats"]["tools"]["totalCalls"], 2, "{result}");

    // The model got the judge's verdict back, and flashtune committed the edit.
    let verdict = api
        .requests()
        .iter()
        .flat_map(|r| {
            r["body"]["contents"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| {
            let f = &p["functionResponse"];
            f["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("judge"))
                .then(|| f["response"].to_string())
        })
        .next_back()
        .unwrap_or_else(|| panic!("the CLI never returned a judge result to the model: {t}"));
    assert!(
        verdict.contains(r#"\"accepted\":true"#) || verdict.contains(r#""accepted":true"#),
        "{verdict}"
    );
    assert_edit_committed(root, &before, marker, &t);
    let (_, after, _) = scratch_commits(root).pop().unwrap();
    assert!(verdict.contains(&after), "{verdict}");
    assert_no_error_reports(&api, &home);
}

/// The CLI ran on the model it was given and reported no error: every model call it made names
/// `gemini-fake` (no call to the router's classifier), and no `gemini-client-error-*.json` report
/// is in the temp folder `agent_env` gave it, or in the scratch folder the sandbox made in it (a
/// confined agent's TMPDIR, kept when not empty).
fn assert_no_error_reports(api: &FakeApi, home: &Path) {
    let tmp = home.with_file_name("tmp");
    let names = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| Some(e.ok()?.path()))
            .collect()
    };
    let reports: Vec<String> = names(&tmp)
        .into_iter()
        .flat_map(|p| if p.is_dir() { names(&p) } else { vec![p] })
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|n| n.starts_with("gemini-client-error-"))
        .collect();
    assert!(
        reports.is_empty(),
        "the Gemini CLI reported errors: {reports:?} in {}",
        tmp.display()
    );
    let elsewhere: Vec<String> = api
        .requests()
        .iter()
        .filter_map(|r| r["path"].as_str().map(str::to_owned))
        .filter(|p| p.contains("enerateContent") && !p.contains("/models/gemini-fake:"))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "model calls not to gemini-fake: {elsewhere:?}"
    );
}

/// The agent's edit (the marker in forward.cu) is committed with step's trailers, on the fake GPU
/// to a scratch ref (never the branch, which stays at `before`), and nothing is left uncommitted.
fn assert_edit_committed(root: &Path, before: &str, marker: &str, output: &str) {
    assert_eq!(head(root).0, before, "the branch moved:\n{output}");
    let scratch = scratch_commits(root);
    let Some((_, commit, message)) = scratch.last() else {
        panic!("the agent's edit was not committed:\n{output}");
    };
    assert!(message.contains("Flashtune-Speedup: "), "{message}");
    assert!(message.contains("Flashtune-Step: "), "{message}");
    assert!(file_at(root, commit, FORWARD).contains(marker));
    assert!(!std::fs::read_to_string(root.join(FORWARD))
        .unwrap()
        .contains(marker));
    assert!(dirty(root).is_empty(), "{:?}", dirty(root));
}
