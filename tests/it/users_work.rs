//! The user's own uncommitted work is never judged, restored or filed as a proposer's or an agent's:
//! `step --proposer` and agent sessions refuse a tree holding it, naming the files and what to do.
use crate::common;
use common::*;
use std::path::Path;

/// A proposer that would make an edit of its own, if it ever ran.
const PROPOSER: &str = r#"printf '\n// the proposer was here\n' >> kernels/attention/forward.cu"#;

/// No run was started: nothing under runs/ holds a log.
fn no_run_started(root: &Path) -> bool {
    std::fs::read_dir(root.join("runs")).map_or(true, |entries| {
        entries
            .flatten()
            .all(|e| !e.path().join("log.jsonl").exists())
    })
}

fn assert_refused_naming(out: &std::process::Output, file: &str) {
    let t = text(out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains(file), "the refusal names {file}: {t}");
    assert!(
        t.contains("git stash") && t.contains("flashtune judge") && t.contains("commit"),
        "the refusal says how to proceed: {t}"
    );
}

#[test]
fn a_proposer_step_refuses_a_tree_holding_the_users_kernel_edit_and_leaves_it_as_it_was() {
    let dir = repo_project();
    mark_forward(dir.path(), "time x1.30");
    let users = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let out = fake_step(dir.path(), &["--proposer", PROPOSER]);
    assert_refused_naming(&out, FORWARD);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        users,
        "the user's edit stays in the tree, untouched"
    );
    assert!(no_run_started(dir.path()), "{}", text(&out));
}

#[test]
fn an_agent_session_refuses_a_tree_holding_the_users_kernel_edit_before_any_run_starts() {
    let dir = repo_project();
    mark_forward(dir.path(), "time x1.30");
    let users = std::fs::read_to_string(dir.path().join(FORWARD)).unwrap();
    let out = fake_step(dir.path(), &["--candidates", "2", "--proposer", PROPOSER]);
    assert_refused_naming(&out, FORWARD);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(FORWARD)).unwrap(),
        users
    );
    assert!(no_run_started(dir.path()), "{}", text(&out));
}

#[test]
fn a_proposer_step_refuses_the_users_file_outside_the_scope_for_the_right_reason() {
    let dir = repo_project();
    std::fs::write(dir.path().join("notes.txt"), "the user's notes\n").unwrap();
    let out = fake_step(dir.path(), &["--proposer", PROPOSER]);
    assert_refused_naming(&out, "notes.txt");
    let t = text(&out);
    // notes.txt decides nothing about judging: the reason is telling the proposer's changes apart.
    assert!(!t.contains("decide how an edit is judged"), "{t}");
    assert!(t.contains("told apart"), "{t}");
    assert!(no_run_started(dir.path()), "{t}");
}
