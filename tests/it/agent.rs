//! Agent sessions on the fake GPU: best of N in worktrees, the history the next pack shows, the usage adapters on real CLI outputs, the cost limit, and a killed session resumed with nothing half-done.
use crate::common;
use common::gitstate::{dirty, file_at, head, scratch_commits};
use common::*;
use flashtune::log::runlog::Record;
use flashtune::model::usage::{self, PriceTable, UsageFormat};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn worktrees(dir: &Path) -> usize {
    git2::Repository::open(dir)
        .unwrap()
        .worktrees()
        .unwrap()
        .len()
}

/// A scripted proposer: candidate 1 faster, 2 slower, 3 wrong (the fake GPU reads the marker in
/// the cubin); each says what it cost through $FLASHTUNE_USAGE_FILE and what it tried in an IDEA
/// line. From step 2 on, no edits; each writes down the last verdict it was given.
const THREE: &str = r#"
case "$FLASHTUNE_CANDIDATE" in 1) m='time x0.80';; 2) m='time x1.30';; *) m='fault FAULT_WRONG';; esac
echo "{\"model\": \"scripted\", \"input_tokens\": 1000, \"output_tokens\": 100, \"usd\": 0.25}" > "$FLASHTUNE_USAGE_FILE"
test -f AGENTS.md && test -f PROMPT.md && test -f context/history.json || exit 9
echo "$FLASHTUNE_LAST_VERDICT|$FLASHTUNE_LAST_REASON|$FLASHTUNE_LAST_REPORT|$FLASHTUNE_RUN_DIR" > "$FLASHTUNE_WORKDIR.agent/env.txt"
[ "$FLASHTUNE_STEP" = 1 ] || exit 0
printf '\n__device__ char flashtune_fake_c%s[] = "flashtune-fake: %s";\n' "$FLASHTUNE_CANDIDATE" "$m" >> kernels/attention/forward.cu
echo "IDEA: candidate $FLASHTUNE_CANDIDATE tries $m"
"#;

#[test]
fn best_of_three_commits_only_the_faster_and_the_next_pack_shows_all_three() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    let out = fake_step(
        dir.path(),
        &["--candidates", "3", "--proposer", THREE, "--steps", "2"],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    // On the fake GPU the winner goes to a scratch ref: the branch and the working tree stay as they were.
    assert_eq!(head(dir.path()).0, before, "{t}");
    let scratch = scratch_commits(dir.path());
    assert_eq!(scratch.len(), 1, "{scratch:?}");
    let (_, after, message) = scratch[0].clone();
    assert!(message.contains("Flashtune-Candidate: 1 of 3"), "{message}");
    let committed = file_at(dir.path(), &after, FORWARD);
    assert!(
        committed.contains("time x0.80")
            && !committed.contains("time x1.30")
            && !committed.contains("FAULT_WRONG"),
        "only the faster candidate's edit is committed"
    );
    assert!(!std::fs::read_to_string(dir.path().join(FORWARD))
        .unwrap()
        .contains("time x0.80"));
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
    // The candidates' own words are their ideas; every patch is kept whatever the verdict.
    // In the order the agents ended.
    let mut ideas: Vec<String> = records
        .iter()
        .filter_map(|r| match r {
            Record::CandidateProposed {
                step: 1,
                idea: Some(i),
                ..
            } => Some(format!("{} ({})", i.summary, i.from)),
            _ => None,
        })
        .collect();
    ideas.sort();
    assert_eq!(
        ideas,
        [
            "candidate 1 tries time x0.80 (agent)",
            "candidate 2 tries time x1.30 (agent)",
            "candidate 3 tries fault FAULT_WRONG (agent)"
        ]
    );
    for k in 1..=3 {
        assert!(run.join(format!("attempts/1.{k}.patch")).is_file());
    }
    // Step 2's candidates were told what step 1 decided, as any proposer is.
    let env = std::fs::read_to_string(run.join("step-2/cand-1.agent/env.txt")).unwrap();
    let fields: Vec<&str> = env.trim().split('|').collect();
    assert_eq!(fields[0], "accepted", "{env}");
    assert!(fields[1].starts_with("candidate 1:"), "{env}");
    assert!(
        fields[2].ends_with("step-1.md") && Path::new(fields[2]).is_file(),
        "{env}"
    );
    assert!(Path::new(fields[3]).join("log.jsonl").is_file(), "{env}");
    assert!(records.iter().any(|r| matches!(r,
        Record::StepDecided { step: 1, accepted: true, candidate: Some(1), commit: Some(c), scratch_ref: Some(_), .. } if *c == after)));
    // Step 2 built on step 1's scratch commit, not on the branch.
    assert!(records.iter().any(|r| matches!(r,
        Record::CandidateStarted { step: 2, base_commit, .. } if *base_commit == after)));
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
    assert!(agents_md.len() <= 32 * 1024 && agents_md.contains("kernels/oracle/reference.cu"));
    assert!(
        agents_md.contains("IDEA:") && agents_md.contains("nvcc -cubin") && agents_md.contains("`attempt`"),
        "AGENTS.md says how to report an idea, build locally, and which MCP tools exist:\n{agents_md}"
    );
    let prompt = std::fs::read_to_string(run.join("step-2/pack/PROMPT.md")).unwrap();
    assert!(
        prompt.contains("small") && prompt.contains("µs"),
        "{prompt}"
    );
    // The champion was profiled at the session's start: speed of light and bottleneck in the pack.
    assert!(
        prompt.contains("speed of light: SM") && prompt.contains("evidence: "),
        "{prompt}"
    );
    // Tried and failed: the slower and the wrong candidate, by their ideas.
    let avoid = &prompt[prompt.find("## Tried and failed").expect(&prompt)..];
    assert!(
        avoid.contains("candidate 2 tries time x1.30") && avoid.contains("candidate 3 tries fault"),
        "{avoid}"
    );
    let summary = std::fs::read_to_string(run.join("summary.md")).unwrap();
    assert!(
        summary.contains("committed: 1")
            && summary.contains("$1.500")
            && summary.contains("Synthetic"),
        "{summary}"
    );
    let ledger: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("ledger.json")).unwrap()).unwrap();
    schema::check("ledger", &ledger);
    assert_eq!(ledger["synthetic"], true);
    assert_eq!(ledger["rows"][0]["idea"], "candidate 1 tries time x0.80");
    // The same history through the CLI, as an agent without MCP reads it.
    let listed = flashtune(dir.path(), &["history", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    schema::check("history", &listed);
    assert_eq!(listed["total"], 6, "2 steps x 3 candidates");
    assert_eq!(listed["steps"].as_array().unwrap().len(), 6);
    let last = flashtune(dir.path(), &["history", "--json", "--last", "2"]);
    let last: serde_json::Value = serde_json::from_slice(&last.stdout).unwrap();
    assert_eq!(
        (
            last["total"].as_u64(),
            last["steps"].as_array().map(Vec::len)
        ),
        (Some(6), Some(2))
    );
    let context = flashtune(
        dir.path(),
        &["context", "--json", "--space", "variants/step-ci.toml"],
    );
    assert!(context.status.success(), "{}", text(&context));
    let context: serde_json::Value = serde_json::from_slice(&context.stdout).unwrap();
    schema::check("context", &context);
    assert_eq!(context["base_commit"], before.as_str());
    assert!(
        context["cases"][0]["champion_us"]["value"]
            .as_f64()
            .is_some(),
        "HEAD's figure comes from step 1's duels: {context}"
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
    let out = fake_step(
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
    let out = fake_step(
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
    assert!(ledger["rows"][0]["usd"].is_null(), "{ledger}");
}

#[test]
fn a_session_killed_mid_candidate_resumes_with_nothing_half_done() {
    let (dir, run, before) = session_killed_mid_candidate();
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
    // The fake GPU's winner is on the step's scratch ref; the branch and the tree are as before.
    assert_eq!(head(dir.path()).0, before, "{t}");
    let scratch = scratch_commits(dir.path());
    assert_eq!(scratch.len(), 1, "{scratch:?}");
    let (_, kept, message) = &scratch[0];
    assert!(message.contains("Flashtune-Candidate: 1 of 2"), "{message}");
    let won = file_at(dir.path(), kept, FORWARD);
    assert!(won.contains("time x0.80") && !won.contains("half an edit"));
    let now = std::fs::read_to_string(&fwd).unwrap();
    assert_eq!(now, original, "the tree is back at HEAD");
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
    // Dropped, but its patch is kept (issue 43, item 1).
    assert!(run.join("attempts/1.2.patch").is_file());
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

/// A two-candidate session killed while candidate 2's agent still runs (candidate 1 has proposed a
/// faster edit, candidate 2 has written half of one): the project, the run folder, HEAD before.
fn session_killed_mid_candidate() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let (dir, run, before, mut child) = session_mid_candidate();
    child.kill().unwrap();
    child.wait().unwrap();
    (dir, run, before)
}

/// Issue 52, item 2: SIGTERM to an agent session mid-candidate ends it through the one stop path
/// (exit 143, `interrupted` naming the signal and how to go on, the tree at HEAD), and `resume`
/// takes it up as the agent session its log's header names.
#[test]
fn sigterm_mid_candidate_ends_a_session_interrupted_and_resume_takes_it_up() {
    let (dir, run, before, mut child) = session_mid_candidate();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(143));
    match records(&run).last() {
        Some(Record::Interrupted { reason }) => {
            assert!(reason.contains("SIGTERM"), "{reason}");
            assert!(reason.contains("flashtune resume"), "{reason}");
        }
        other => panic!("the session ends with {other:?}, not `interrupted`"),
    }
    assert_eq!(head(dir.path()).0, before);
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    let run_id = run.file_name().unwrap().to_str().unwrap().to_owned();
    let out = flashtune(dir.path(), &["resume", &run_id, "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let records = records(&run);
    assert!(records.iter().any(|r| matches!(
        r,
        Record::CandidateJudged {
            step: 1,
            candidate: 1,
            accepted: true,
            ..
        }
    )));
    assert_eq!(scratch_commits(dir.path()).len(), 1);
    assert_eq!(worktrees(dir.path()), 0);
}

/// [`session_killed_mid_candidate`] before the kill: the session still runs as `child`.
fn session_mid_candidate() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    String,
    std::process::Child,
) {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    let proposer = r#"
if [ "$FLASHTUNE_CANDIDATE" = 1 ]; then
  printf '\n__device__ char flashtune_fake_k[] = "flashtune-fake: time x0.80";\n' >> kernels/attention/forward.cu
else
  echo '// half an edit' >> kernels/attention/forward.cu
  touch "$FLASHTUNE_WORKDIR.agent/started"
  exec sleep 60
fi
"#;
    let child = Command::new(binary())
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
            p.join("step-1/cand-2.agent/started").exists()
                && std::fs::read_to_string(p.join("log.jsonl"))
                    .is_ok_and(|t| t.contains("\"event\":\"candidate_proposed\""))
        });
        if let Some(run) = found {
            break run;
        }
    };
    (dir, run, before, child)
}

#[test]
/// Issue 43, item 1: a candidate whose agent had finished its edit when the session was killed
/// (its guard wrote the agent's exit code, the log had not yet said so) is judged on resume, not
/// dropped.
fn a_candidate_whose_agent_finished_before_the_kill_is_judged_on_resume() {
    let (dir, run, before) = session_killed_mid_candidate();
    // As if candidate 2's agent had finished a whole edit just before the kill.
    let wfwd = run.join("step-1/cand-2").join(FORWARD);
    let whole = std::fs::read_to_string(&wfwd)
        .unwrap()
        .replace("// half an edit\n", "// a whole edit\n");
    std::fs::write(&wfwd, whole).unwrap();
    std::fs::write(run.join("step-1/cand-2.agent/exit"), "0\n").unwrap();
    let run_id = run.file_name().unwrap().to_str().unwrap().to_owned();
    let out = flashtune(dir.path(), &["resume", &run_id, "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(head(dir.path()).0, before);
    let records = records(&run);
    let judged = |k: u32| {
        records.iter().any(
            |r| matches!(r, Record::CandidateJudged { step: 1, candidate, .. } if *candidate == k),
        )
    };
    assert!(judged(1) && judged(2), "{records:?}");
    assert!(!records
        .iter()
        .any(|r| matches!(r, Record::CandidateDropped { step: 1, .. })));
    assert_eq!(worktrees(dir.path()), 0);
}

#[test]
fn judge_json_keeps_a_faster_fake_edit_off_the_branch_and_says_so() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    let original = mark_forward(dir.path(), "time x0.80");
    let out = fake_judge_json(dir.path(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    schema::check("verdict", &doc);
    let v: flashtune::agent::JudgeVerdict = serde_json::from_value(doc).unwrap();
    assert!(v.accepted && v.synthetic, "{v:?}");
    assert_eq!(head(dir.path()).0, before);
    let scratch = scratch_commits(dir.path());
    assert_eq!(v.commit.as_deref(), Some(scratch[0].1.as_str()));
    assert_eq!(v.scratch_ref.as_deref(), Some(scratch[0].0.as_str()));
    assert_eq!(v.changed_files, [FORWARD]);
    assert_eq!(v.restored, [FORWARD]);
    assert!(v.cases[0].gain.unwrap() > 0.2, "{v:?}");
    assert_eq!(v.idea.as_ref().unwrap().from, "diff");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        original
    );
    // Issue 43, item 4: on a clean tree there is nothing to judge: a refusal, and no run folder.
    let runs_before = std::fs::read_dir(dir.path().join("runs")).unwrap().count();
    let out = fake_judge_json(dir.path(), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    schema::check("error", &err);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing to judge"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("runs")).unwrap().count(),
        runs_before,
        "a clean tree made a run"
    );
    // A refusal is a JSON document too, with the exit code it explains.
    // An unknown variant is `unknown_variant`, as MCP's tools call it (issue 52; it was `bad_input`).
    let out = fake_judge_json(dir.path(), &["--variant", "no-such-variant"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    schema::check("error", &err);
    assert_eq!(err["error"]["code"], "unknown_variant");
    assert_eq!(err["error"]["exit_code"], 2);
    // The schema is not a formality: a verdict without its cases is refused.
    let mut broken = serde_json::from_slice::<serde_json::Value>(
        &flashtune(dir.path(), &["history", "--json"]).stdout,
    )
    .unwrap();
    broken["steps"][0].as_object_mut().unwrap().remove("cases");
    assert!(!schema::is_valid("history", &broken));
    // --json is honoured or refused, never ignored.
    let dtype_alone = flashtune(dir.path(), &["history", "--dtype", "f16"]);
    assert_eq!(dtype_alone.status.code(), Some(2), "{}", text(&dtype_alone));
}

#[test]
fn tune_then_context_in_a_fresh_repository_gives_heads_figures() {
    let dir = repo_project();
    let out = flashtune(
        dir.path(),
        &["tune", "--fake-gpu", "--space", "variants/step-ci.toml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let tune = run_dir_from(&out);
    let tune_id = tune.file_name().unwrap().to_str().unwrap();
    let context = flashtune(
        dir.path(),
        &["context", "--json", "--space", "variants/step-ci.toml"],
    );
    assert!(context.status.success(), "{}", text(&context));
    let context: serde_json::Value = serde_json::from_slice(&context.stdout).unwrap();
    schema::check("context", &context);
    let case = &context["cases"][0];
    assert!(case["champion_us"]["value"].as_f64().is_some(), "{context}");
    assert!(
        case["champion_us"]["from"]
            .as_str()
            .unwrap()
            .starts_with(&format!("run {tune_id} line")),
        "{case}"
    );
    // A profile of that run's champion (the fake GPU's tune skips ncu; `profile` takes one) is of
    // HEAD's sources by the same rule.
    let variant = case["variant"].as_str().unwrap();
    let out = flashtune(
        dir.path(),
        &["profile", tune_id, variant, "--fake-gpu", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let profiled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(profiled["schema_version"], 1, "{profiled}");
    assert_eq!(profiled["synthetic"], true, "{profiled}");
    // Issue 52: a variant the run does not have is refused as MCP refuses it (`unknown_variant`,
    // exit 2), before a GPU is probed or a line logged; the plain output says the double's
    // profile is synthetic.
    let log = dir.path().join("runs").join(tune_id).join("log.jsonl");
    let lines = std::fs::read_to_string(&log).unwrap().lines().count();
    let out = flashtune(
        dir.path(),
        &[
            "profile",
            tune_id,
            "no-such-variant",
            "--fake-gpu",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let refused: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(refused["error"]["code"], "unknown_variant", "{refused}");
    let out = flashtune(
        dir.path(),
        &["profile", tune_id, "no-such-variant", "--fake-gpu"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("`no-such-variant` is not a variant of run"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("Logged in"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap().lines().count(),
        lines
    );
    let out = flashtune(dir.path(), &["profile", tune_id, variant, "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("(synthetic: fake GPU, nothing was profiled)"),
        "{}",
        text(&out)
    );
    let context = flashtune(
        dir.path(),
        &["context", "--json", "--space", "variants/step-ci.toml"],
    );
    let context: serde_json::Value = serde_json::from_slice(&context.stdout).unwrap();
    let case = &context["cases"][0];
    assert_eq!(case["bottleneck"]["same_sources"], true, "{case}");
    assert!(
        case["bottleneck"]["speed_of_light"]["sm_pct"]
            .as_f64()
            .is_some(),
        "{case}"
    );
    let prompt = flashtune(dir.path(), &["context", "--space", "variants/step-ci.toml"]);
    let prompt = String::from_utf8_lossy(&prompt.stdout);
    assert!(
        !prompt.contains("HEAD unknown") && !prompt.contains("other kernel sources"),
        "{prompt}"
    );
}

/// Step 1: candidate 1 comes close (1% slower, correct), candidate 2 is far slower. Step 2: both
/// make no edit of their own; the last candidate starts from the near miss.
const NEAR: &str = r#"
echo '{"input_tokens": 1, "output_tokens": 1, "usd": 0.0}' > "$FLASHTUNE_USAGE_FILE"
[ "$FLASHTUNE_STEP" = 1 ] || exit 0
case "$FLASHTUNE_CANDIDATE" in 1) m='time x1.01';; *) m='time x1.30';; esac
printf '\n__device__ char flashtune_fake_n%s[] = "flashtune-fake: %s";\n' "$FLASHTUNE_CANDIDATE" "$m" >> kernels/attention/forward.cu
echo "IDEA: near $m"
"#;

#[test]
fn a_near_miss_is_archived_and_a_later_candidate_starts_from_it() {
    let dir = repo_project();
    let out = fake_step(
        dir.path(),
        &["--candidates", "2", "--proposer", NEAR, "--steps", "2"],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let run = only_run(dir.path());
    let id = |s: u32, k: u32| format!("{}/{s}.{k}", run.file_name().unwrap().to_str().unwrap());
    let pack: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("step-2/pack/context/ideas.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(pack["worth_retrying"][0]["attempt"], id(1, 1), "{pack}");
    assert_eq!(pack["worth_retrying"][0]["idea"], "near time x1.01");
    assert_eq!(pack["avoid"][0]["attempt"], id(1, 2), "{pack}");
    assert!(run
        .join("step-2/pack")
        .join(format!(
            "context/attempts/{}.patch",
            id(1, 1).replace('/', "_")
        ))
        .is_file());
    let records = records(&run);
    assert!(records.iter().any(|r| matches!(r,
        Record::CandidateStarted { step: 2, candidate: 2, start_from: Some(s), .. } if *s == id(1, 1))));
    assert!(records.iter().any(|r| matches!(
        r,
        Record::CandidateStarted {
            step: 2,
            candidate: 1,
            start_from: None,
            ..
        }
    )));
    // Its agent added nothing, so its edit is the near miss itself, judged again.
    let patch = records.iter().find_map(|r| match r {
        Record::CandidateProposed {
            step: 2,
            candidate: 2,
            patch,
            ..
        } => Some(patch.clone()),
        _ => None,
    });
    assert!(patch.unwrap().contains("time x1.01"));
}

#[test]
fn a_missing_agent_is_refused_before_the_first_step() {
    let dir = repo_project();
    let out = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["step", "--fake-gpu", "--space", "variants/step-ci.toml"])
        .args(["--agent", "claude", "--steps", "3"])
        .env("PATH", "/usr/bin:/bin")
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(4), "{t}");
    assert!(t.contains("claude") && t.contains("not on PATH"), "{t}");
    assert!(!dir.path().join("runs").exists(), "no run started: {t}");
    // Installed but without its key: a warning, and the session goes on.
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("claude");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho '{\"result\": \"IDEA: nothing\", \"modelUsage\": {}}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(binary())
        .arg("--root")
        .arg(dir.path())
        .args(["step", "--fake-gpu", "--space", "variants/step-ci.toml"])
        .args(["--agent", "claude", "--steps", "1"])
        .env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()))
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("CLAUDE_CODE_OAUTH_TOKEN")
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("warning: none of ANTHROPIC_API_KEY"), "{t}");
}

#[test]
fn stop_at_roof_reads_the_best_known_figures_before_the_first_step() {
    let dir = repo_project();
    // A judged edit leaves HEAD's figures in the logs; the session's own duels are not needed.
    mark_forward(dir.path(), "time x1.30");
    let out = flashtune(
        dir.path(),
        &["judge", "--fake-gpu", "--space", "variants/step-ci.toml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = fake_step(
        dir.path(),
        &[
            "--candidates",
            "1",
            "--proposer",
            "true",
            "--steps",
            "5",
            "--stop-at-roof",
            "0.000001",
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("stopped: roof: every case's champion is at"),
        "{t}"
    );
    let session_run = only_run_holding(dir.path(), "ledger.json");
    let records = records(&session_run);
    assert!(
        !records
            .iter()
            .any(|r| matches!(r, Record::CandidateStarted { .. })),
        "no step started: {t}"
    );
}

/// Candidates that know the harness: kernels that skip the work where it used to go unverified
/// (2 and 3 repairing the copies the harness once kept on the device), one exact only while no
/// logit passes 11 and honest where the old stress set showed, one faster but in bursts on `small`,
/// and one that edits the oracle through the header it includes. An agent session rejects each by
/// name and commits nothing.
const HARNESS_CHEATERS: &str = r#"
echo "{\"model\": \"scripted\", \"input_tokens\": 1000, \"output_tokens\": 100, \"usd\": 0.25}" > "$FLASHTUNE_USAGE_FILE"
mark() { printf '\n__device__ char flashtune_fake_c[] = "flashtune-fake: cheat CHEAT_%s";\n' "$1" >> kernels/attention/forward.cu; }
case "$FLASHTUNE_CANDIDATE" in
  1) mark REWRITE_ON_RERUN ;; 2) mark L2_PROBE ;; 3) mark KEPT_COPY_REPAIR ;; 4) mark FIXED_OFFSET ;;
  5) mark BURSTY ;;
  *) printf '#define ORACLE_SHORTCUT 1\n' >> kernels/oracle/oracle.cuh; printf '\n// tuned\n' >> kernels/attention/forward.cu ;;
esac
echo "IDEA: candidate $FLASHTUNE_CANDIDATE"
"#;

#[test]
fn an_agent_session_rejects_the_harness_cheats_and_an_oracle_edit_by_name() {
    // Eight verified rounds, as the cheat suite's project has: the cheats that are honest on some
    // draws of the mixture are then caught every time, not with odds near 1 - 4^-4.
    let dir = repo_project_with(|p| p.replace("verified_replays = 2", "verified_replays = 8"));
    let (before, _) = head(dir.path());
    let out = fake_step(
        dir.path(),
        &[
            "--candidates",
            "6",
            "--proposer",
            HARNESS_CHEATERS,
            "--steps",
            "1",
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(head(dir.path()).0, before, "{t}");
    assert!(
        scratch_commits(dir.path()).is_empty(),
        "nothing committed: {t}"
    );
    assert!(dirty(dir.path()).is_empty(), "{:?}", dirty(dir.path()));
    let records = records(&only_run(dir.path()));
    let reasons: Vec<String> = records
        .iter()
        .filter_map(|r| match r {
            Record::CandidateJudged {
                candidate,
                accepted,
                reason,
                ..
            } => {
                assert!(!accepted, "candidate {candidate} accepted: {reason}");
                Some(format!("{candidate}: {reason}"))
            }
            _ => None,
        })
        .collect();
    let all = format!("{reasons:#?}\n{t}");
    for (k, why) in [
        (1, "a timed launch's output is wrong for the inputs it read"),
        (2, "a timed launch's output is wrong for the inputs it read"),
        (3, "a timed launch's output is wrong for the inputs it read"),
        (4, "NaN/inf outputs"),
    ] {
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with(&format!("{k}: ")) && r.contains(why)),
            "candidate {k}: `{why}` not found in {all}"
        );
    }
    // Its bursts make its samples on `small` spread or slow, depending on where they fall: either
    // way HEAD's noise judges it, and its own spread excuses nothing.
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("5: ") && regression_on(r, "small")),
        "candidate 5: {all}"
    );
    assert!(
        t.contains("the agent changed the oracle's sources (kernels/oracle/oracle.cuh)"),
        "{all}"
    );
}

/// Issue 43, item 5: a `--json` command answers an error with one versioned document on stdout
/// (`exit_code` the process's own), and the message on stderr too. Returns the document.
fn one_error_document(out: &std::process::Output, exit_code: i32) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(exit_code), "{}", text(out));
    // from_slice takes one document and refuses anything after it.
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(out)));
    schema::check("error", &doc);
    assert_eq!(doc["error"]["exit_code"], exit_code, "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(message),
        "stderr lacks the message `{message}`: {stderr}"
    );
    doc
}

#[test]
fn show_attempt_json_answers_an_unknown_attempt_with_one_error_document() {
    let dir = repo_project();
    let out = flashtune(
        dir.path(),
        &["show-attempt", "20990101-000000-0000/1", "--json"],
    );
    let err = one_error_document(&out, 2);
    assert_eq!(err["error"]["code"], "bad_input", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no attempt `20990101-000000-0000/1`"),
        "{err}"
    );
    let out = flashtune(dir.path(), &["show-attempt", "not-an-id", "--json"]);
    let err = one_error_document(&out, 2);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is not an attempt id"),
        "{err}"
    );
    // Without --json the refusal stays plain text on stderr.
    let out = flashtune(dir.path(), &["show-attempt", "not-an-id"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
}

#[test]
fn context_json_answers_a_missing_space_and_broken_policies_with_one_error_document() {
    let dir = repo_project();
    let out = flashtune(
        dir.path(),
        &[
            "context",
            "--json",
            "--space",
            "variants/no-such-space.toml",
        ],
    );
    let err = one_error_document(&out, 2);
    assert_eq!(err["error"]["code"], "bad_input", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-space.toml"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("policies.toml"),
        "[build\ndefault_arch = \"sm_90a\"\n",
    )
    .unwrap();
    let out = flashtune(
        dir.path(),
        &["context", "--json", "--space", "variants/step-ci.toml"],
    );
    let err = one_error_document(&out, 2);
    assert_eq!(err["error"]["code"], "bad_input", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("policies.toml"),
        "{err}"
    );
}

#[test]
fn history_and_profile_json_answer_what_is_not_there_with_one_error_document() {
    let dir = repo_project();
    // No results store yet.
    let out = flashtune(dir.path(), &["history", "no-such-shape", "--json"]);
    let err = one_error_document(&out, 2);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no results store"),
        "{err}"
    );
    // A store that never measured the shape.
    flashtune::log::store::Store::open(&dir.path().join("runs/results.sqlite")).unwrap();
    let out = flashtune(dir.path(), &["history", "no-such-shape", "--json"]);
    let err = one_error_document(&out, 2);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("holds no measurement of shape `no-such-shape`"),
        "{err}"
    );
    // A flag that needs a shape, and one that goes without.
    let out = flashtune(dir.path(), &["history", "--dtype", "f16", "--json"]);
    one_error_document(&out, 2);
    let out = flashtune(dir.path(), &["history", "seed", "--last", "3", "--json"]);
    one_error_document(&out, 2);
    // `profile --json` of a run that is not there.
    let out = flashtune(
        dir.path(),
        &[
            "profile",
            "20990101-000000-0000",
            "v",
            "--fake-gpu",
            "--json",
        ],
    );
    one_error_document(&out, 2);
}

#[test]
fn step_json_prints_one_document_naming_its_run_and_each_steps_verdict() {
    let dir = repo_project();
    let (before, _) = head(dir.path());
    // Step 1 makes the kernel faster; step 2 adds a file that changes nothing.
    let proposer = r#"if [ "$FLASHTUNE_STEP" = 1 ]; then printf '\n__device__ char flashtune_fake_m[] = "flashtune-fake: time x0.50";\n' >> kernels/attention/forward.cu; else echo "// $FLASHTUNE_LAST_VERDICT" > kernels/attention/seen.txt; fi"#;
    let out = fake_step(
        dir.path(),
        &["--proposer", proposer, "--steps", "2", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(&out)));
    schema::check("step_run", &doc);
    let run = only_run(dir.path());
    let run_id = run.file_name().unwrap().to_str().unwrap();
    assert_eq!(doc["run_id"], run_id, "{doc}");
    assert!(
        Path::new(doc["run_dir"].as_str().unwrap()).ends_with(run_id),
        "{doc}"
    );
    let d: flashtune::agent::StepRunDoc = serde_json::from_value(doc.clone()).unwrap();
    assert!(d.synthetic && d.stopped.is_none(), "{doc}");
    assert_eq!((d.accepted, d.rejected), (1, 1), "{doc}");
    assert_eq!(d.steps.len(), 2, "{doc}");
    let (one, two) = (&d.steps[0], &d.steps[1]);
    assert!(
        one.accepted && one.verdict == flashtune::model::vocab::AttemptVerdict::Accepted,
        "{doc}"
    );
    assert_eq!(one.changed_files, [FORWARD]);
    assert_eq!(
        one.restored,
        [FORWARD],
        "the fake GPU keeps the branch as it was"
    );
    let scratch = scratch_commits(dir.path());
    assert_eq!(one.commit.as_deref(), Some(scratch[0].1.as_str()), "{doc}");
    assert_eq!(
        one.scratch_ref.as_deref(),
        Some(scratch[0].0.as_str()),
        "{doc}"
    );
    assert_eq!(one.attempts.len(), 1, "{doc}");
    assert_eq!(one.attempts[0].attempt, format!("{run_id}/1"));
    assert!(one.attempts[0].cases[0].gain.unwrap() > 0.2, "{doc}");
    assert!(
        !two.accepted && two.verdict == flashtune::model::vocab::AttemptVerdict::Rejected,
        "{doc}"
    );
    assert_eq!(two.changed_files, ["kernels/attention/seen.txt"], "{doc}");
    assert!(one.report.is_file() && two.report.is_file(), "{doc}");
    assert_eq!(head(dir.path()).0, before);
    // Refused before any step: the error document, with its exit code.
    let out = fake_step(dir.path(), &["--steps", "2", "--json"]);
    let err = one_error_document(&out, 2);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs --proposer"),
        "{err}"
    );
    let out = fake_step(dir.path(), &["--patience", "2", "--json"]);
    one_error_document(&out, 2);
}

#[test]
fn step_json_of_an_agent_session_prints_one_document_with_every_candidate() {
    let dir = repo_project();
    let out = fake_step(
        dir.path(),
        &[
            "--candidates",
            "3",
            "--proposer",
            THREE,
            "--steps",
            "1",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(&out)));
    schema::check("step_run", &doc);
    let run = only_run(dir.path());
    let d: flashtune::agent::StepRunDoc = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(d.run_id, run.file_name().unwrap().to_str().unwrap());
    assert_eq!(d.report.as_deref(), Some(run.join("summary.md").as_path()));
    assert_eq!(d.steps.len(), 1, "{doc}");
    let step = &d.steps[0];
    assert!(step.accepted && step.candidate == Some(1), "{doc}");
    assert_eq!(step.changed_files, [FORWARD], "{doc}");
    use flashtune::model::vocab::AttemptVerdict::{Committed, Rejected};
    let verdicts: Vec<(Option<u32>, _)> = step
        .attempts
        .iter()
        .map(|a| (a.candidate, a.verdict))
        .collect();
    assert_eq!(
        verdicts,
        [
            (Some(1), Committed),
            (Some(2), Rejected),
            (Some(3), Rejected)
        ],
        "{doc}"
    );
    assert_eq!(
        step.commit.as_deref(),
        Some(scratch_commits(dir.path())[0].1.as_str())
    );
}
