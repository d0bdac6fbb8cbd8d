//! Agent sessions on the fake GPU: best of N in worktrees, the history the next pack shows, the usage adapters on real CLI outputs, the cost limit, and a killed session resumed with nothing half-done.
mod common;
use common::*;
use flashtune::runlog::Record;
use flashtune::usage::{self, PriceTable, UsageFormat};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn session(root: &Path, extra: &[&str]) -> Output {
    Command::new(binary())
        .arg("--root")
        .arg(root)
        .args(["step", "--fake-gpu", "--space", "variants/step-ci.toml"])
        .args(extra)
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .output()
        .expect("flashtune runs")
}

fn head(dir: &Path) -> (String, String) {
    let repo = git2::Repository::open(dir).unwrap();
    let c = repo.head().unwrap().peel_to_commit().unwrap();
    (c.id().to_string(), c.message().unwrap_or("").to_owned())
}

fn dirty(dir: &Path) -> Vec<String> {
    flashtune::vcs::changed_against_head(dir)
        .unwrap()
        .into_iter()
        .filter(|p| !p.starts_with("runs/"))
        .collect()
}

fn worktrees(dir: &Path) -> usize {
    git2::Repository::open(dir)
        .unwrap()
        .worktrees()
        .unwrap()
        .len()
}

/// A scripted proposer: candidate 1 faster, 2 slower, 3 wrong (the fake GPU reads the marker in
/// the cubin); each says what it cost through $FLASHTUNE_USAGE_FILE. From step 2 on, no edits.
const THREE: &str = r#"
case "$FLASHTUNE_CANDIDATE" in 1) m='time x0.80';; 2) m='time x1.30';; *) m='fault FAULT_WRONG';; esac
echo "{\"model\": \"scripted\", \"input_tokens\": 1000, \"output_tokens\": 100, \"usd\": 0.25}" > "$FLASHTUNE_USAGE_FILE"
test -f AGENTS.md && test -f PROMPT.md && test -f context/history.json || exit 9
[ "$FLASHTUNE_STEP" = 1 ] || exit 0
printf '\n__device__ char flashtune_fake_c%s[] = "flashtune-fake: %s";\n' "$FLASHTUNE_CANDIDATE" "$m" >> kernels/attention/forward.cu
"#;

#[test]
fn best_of_three_commits_only_the_faster_and_the_next_pack_shows_all_three() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    let out = session(
        dir.path(),
        &["--candidates", "3", "--proposer", THREE, "--steps", "2"],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let (after, message) = head(dir.path());
    assert_ne!(after, before, "{t}");
    assert!(message.contains("Flashtune-Candidate: 1 of 3"), "{message}");
    let committed = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    assert!(
        committed.contains("time x0.80")
            && !committed.contains("time x1.30")
            && !committed.contains("FAULT_WRONG"),
        "only the faster candidate's edit is committed"
    );
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    assert_eq!(
        worktrees(dir.path()),
        0,
        "every candidate worktree is removed"
    );
    let run = only_run(dir.path());
    let records = records(&run);
    let judged: Vec<(u32, bool, String)> = records
        .iter()
        .filter_map(|r| match r {
            Record::CandidateJudged {
                step: 1,
                candidate,
                accepted,
                reason,
                ..
            } => Some((*candidate, *accepted, reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(judged.len(), 3, "{judged:?}");
    assert!(judged[0].1, "{judged:?}");
    assert!(!judged[1].1 && judged[1].2.contains("slower"), "{judged:?}");
    assert!(
        !judged[2].1 && judged[2].2.contains("fails its checks"),
        "{judged:?}"
    );
    assert!(records.iter().any(|r| matches!(r,
        Record::StepDecided { step: 1, accepted: true, candidate: Some(1), commit: Some(c), .. } if *c == after)));
    // Step 2's pack, written before its agents ran, holds all three candidates of step 1.
    let history: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("step-2/pack/context/history.json")).unwrap(),
    )
    .unwrap();
    let step1: Vec<(u64, String)> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["step"] == 1)
        .map(|h| {
            (
                h["candidate"].as_u64().unwrap(),
                h["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        step1,
        [
            (1, "committed".to_owned()),
            (2, "rejected".to_owned()),
            (3, "rejected".to_owned())
        ]
    );
    let step1_costs: Vec<f64> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["step"] == 1)
        .map(|h| h["cost"]["usd"].as_f64().unwrap())
        .collect();
    assert_eq!(step1_costs, [0.25, 0.25, 0.25]);
    let agents_md = std::fs::read_to_string(run.join("step-2/pack/AGENTS.md")).unwrap();
    assert!(agents_md.len() <= 32 * 1024 && agents_md.contains("kernels/attention/reference.cu"));
    let prompt = std::fs::read_to_string(run.join("step-2/pack/PROMPT.md")).unwrap();
    assert!(
        prompt.contains("small") && prompt.contains("µs"),
        "{prompt}"
    );
    let summary = std::fs::read_to_string(run.join("summary.md")).unwrap();
    assert!(
        summary.contains("committed: 1") && summary.contains("$1.500"),
        "{summary}"
    );
    // The same history through the CLI, as an agent without MCP reads it.
    let listed = flashtune(dir.path(), &["history", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        listed.as_array().unwrap().len(),
        6,
        "2 steps x 3 candidates"
    );
    let context = flashtune(
        dir.path(),
        &["context", "--json", "--space", "variants/step-ci.toml"],
    );
    assert!(context.status.success(), "{}", text(&context));
    let context: serde_json::Value = serde_json::from_slice(&context.stdout).unwrap();
    assert_eq!(context["base_commit"], after.as_str());
    assert!(
        context["cases"][0]["champion_us"]["value"]
            .as_f64()
            .is_some(),
        "HEAD's figure comes from step 1's winning duel: {context}"
    );
}

#[test]
fn usage_adapters_read_the_real_cli_outputs() {
    let none = PriceTable::new();
    let claude = usage::read(
        UsageFormat::Claude,
        &fixture("agents/claude-code-2.1.330-result.json"),
        None,
        &none,
    )
    .unwrap();
    assert_eq!(
        (claude.input_tokens, claude.output_tokens),
        (1234, 56),
        "{claude:?}"
    );
    assert_eq!(claude.usd, Some(0.004542000000000001));
    assert_eq!(claude.usd_from.as_deref(), Some("agent"));
    assert_eq!(claude.models[0].model, "claude-sonnet-4-5");
    let denied = usage::read(
        UsageFormat::Claude,
        &fixture("agents/claude-code-2.1.330-result-permission-denied.json"),
        None,
        &none,
    )
    .unwrap();
    assert_eq!(denied.input_tokens, 3702);
    assert_eq!(denied.usd, Some(0.013626000000000003));

    let codex_out = fixture("agents/codex-0.169.0-exec.jsonl");
    let codex = usage::read(UsageFormat::Codex, &codex_out, None, &none).unwrap();
    // Codex counts cached input inside input_tokens; the ledger keeps them apart.
    assert_eq!(
        (
            codex.input_tokens,
            codex.cached_input_tokens,
            codex.output_tokens
        ),
        (1345, 1000, 67)
    );
    assert_eq!(
        codex.usd, None,
        "Codex reports no dollars and no price is set"
    );
    let prices: PriceTable = toml::from_str(
        "[codex]\ninput_per_mtok = 1.0\noutput_per_mtok = 10.0\ncached_input_per_mtok = 0.1\n",
    )
    .unwrap();
    let priced = usage::read(UsageFormat::Codex, &codex_out, None, &prices).unwrap();
    let expected = (1345.0 * 1.0 + 67.0 * 10.0 + 1000.0 * 0.1) / 1e6;
    assert!((priced.usd.unwrap() - expected).abs() < 1e-12, "{priced:?}");
    assert_eq!(priced.usd_from.as_deref(), Some("price table"));

    let gemini = usage::read(
        UsageFormat::Gemini,
        &fixture("agents/gemini-cli-0.61.0-result.json"),
        None,
        &none,
    )
    .unwrap();
    assert_eq!(
        (gemini.input_tokens, gemini.output_tokens, gemini.usd),
        (3456, 78, None)
    );
    assert_eq!(gemini.models[0].model, "gemini-fake");

    let aider = usage::read(
        UsageFormat::Aider,
        "",
        Some(&fixture("agents/aider-analytics-constructed.jsonl")),
        &none,
    )
    .unwrap();
    assert_eq!((aider.input_tokens, aider.output_tokens), (4500, 150));
    assert!((aider.usd.unwrap() - 0.0156).abs() < 1e-12);

    let wrapped = usage::read(
        UsageFormat::File,
        "",
        Some(r#"{"model": "m", "input_tokens": 10, "output_tokens": 2, "usd": 0.5}"#),
        &none,
    )
    .unwrap();
    assert_eq!((wrapped.input_tokens, wrapped.usd), (10, Some(0.5)));
    // What is not the CLI's output is an error, never zero tokens.
    assert!(usage::read(UsageFormat::Claude, "Error: not logged in", None, &none).is_err());
    assert!(usage::read(
        UsageFormat::Codex,
        &fixture("agents/gemini-cli-0.61.0-result.json"),
        None,
        &none
    )
    .is_err());
}

#[test]
fn cost_limit_and_patience_stop_a_session() {
    let dir = repo_project();
    // No edits, 0.6 dollars per candidate: the second step passes $1.00 and the third never starts.
    let costly =
        r#"echo '{"input_tokens": 5, "output_tokens": 1, "usd": 0.6}' > "$FLASHTUNE_USAGE_FILE""#;
    let out = session(
        dir.path(),
        &[
            "--candidates",
            "1",
            "--proposer",
            costly,
            "--steps",
            "5",
            "--max-cost-usd",
            "1.0",
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let run = only_run(dir.path());
    let records = records(&run);
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::StepDecided { .. }))
        .count();
    assert_eq!(steps, 2, "{t}");
    assert!(
        records.iter().any(
            |r| matches!(r, Record::SessionStopped { reason } if reason.contains("cost limit"))
        ),
        "{t}"
    );
    assert!(t.contains("stopped: cost limit"), "{t}");

    std::fs::remove_dir_all(dir.path().join("runs")).unwrap();
    let out = session(
        dir.path(),
        &[
            "--candidates",
            "2",
            "--proposer",
            "true",
            "--steps",
            "5",
            "--patience",
            "2",
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let records = common::records(&only_run(dir.path()));
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::StepDecided { .. }))
        .count();
    assert_eq!(steps, 2, "{t}");
    assert!(t.contains("stopped: patience"), "{t}");
    // Dollars nobody reported are null, not zero.
    let ledger: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(only_run(dir.path()).join("ledger.json")).unwrap(),
    )
    .unwrap();
    assert!(ledger[0]["usd"].is_null(), "{ledger}");
}

#[test]
fn a_session_killed_mid_candidate_resumes_with_nothing_half_done() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    // Candidate 1 finishes a faster edit at once; candidate 2 is still running when the session is killed.
    let proposer = r#"
if [ "$FLASHTUNE_CANDIDATE" = 1 ]; then
  printf '\n__device__ char flashtune_fake_k[] = "flashtune-fake: time x0.80";\n' >> kernels/attention/forward.cu
else
  echo '// half an edit' >> kernels/attention/forward.cu
  touch "$FLASHTUNE_WORKDIR.started"
  exec sleep 60
fi
"#;
    let mut child = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args([
            "step",
            "--fake-gpu",
            "--space",
            "variants/step-ci.toml",
            "--candidates",
            "2",
            "--proposer",
            proposer,
        ])
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let run = loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the session never reached its second candidate"
        );
        std::thread::sleep(Duration::from_millis(100));
        let Ok(dirs) = std::fs::read_dir(dir.path().join("runs")) else {
            continue;
        };
        let found = dirs.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
            p.join("step-1/cand-2.started").exists()
                && std::fs::read_to_string(p.join("log.jsonl"))
                    .is_ok_and(|t| t.contains("\"event\":\"candidate_proposed\""))
        });
        if let Some(run) = found {
            break run;
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        head(dir.path()).0,
        before,
        "nothing committed by a killed step"
    );
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    // As if the session had died between copying a winner into the tree and committing it.
    let fwd = dir.path().join(FORWARD);
    let original = std::fs::read_to_string(&fwd).unwrap();
    std::fs::write(&fwd, format!("{original}\n// applied, never committed\n")).unwrap();

    let run_id = run.file_name().unwrap().to_str().unwrap().to_owned();
    let out = flashtune(dir.path(), &["resume", &run_id, "--fake-gpu"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let (after, message) = head(dir.path());
    assert_ne!(after, before, "{t}");
    assert!(message.contains("Flashtune-Candidate: 1 of 2"), "{message}");
    let now = std::fs::read_to_string(&fwd).unwrap();
    assert!(
        now.contains("time x0.80")
            && !now.contains("never committed")
            && !now.contains("half an edit")
    );
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    assert_eq!(worktrees(dir.path()), 0);
    let records = records(&run);
    assert!(records.iter().any(|r| matches!(r,
        Record::SessionResumed { step: Some(1), restored, recovered_commit: None } if restored == &[FORWARD])));
    assert!(records.iter().any(|r| matches!(
        r,
        Record::CandidateDropped {
            step: 1,
            candidate: 2,
            ..
        }
    )));
    assert!(records.iter().any(|r| matches!(
        r,
        Record::CandidateJudged {
            step: 1,
            candidate: 1,
            accepted: true,
            ..
        }
    )));
    let decided: Vec<_> = records
        .iter()
        .filter(|r| matches!(r, Record::StepDecided { step: 1, .. }))
        .collect();
    assert_eq!(decided.len(), 1, "{decided:?}");
}

#[test]
fn judge_json_commits_a_faster_edit_with_its_verdict() {
    let dir = repo_project();
    mark_forward(dir.path(), "time x0.80");
    let out = flashtune(
        dir.path(),
        &[
            "judge",
            "--json",
            "--fake-gpu",
            "--space",
            "variants/step-ci.toml",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let v: flashtune::agent::JudgeVerdict = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.accepted && v.fake_gpu, "{v:?}");
    assert_eq!(v.commit.as_deref(), Some(head(dir.path()).0.as_str()));
    assert_eq!(v.changed_files, [FORWARD]);
    assert!(v.duels[0].gain.unwrap() > 0.2, "{v:?}");
}
