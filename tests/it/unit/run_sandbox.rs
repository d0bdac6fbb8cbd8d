//! The tests of `src/run/sandbox.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::run::sandbox::*;

#[test]
fn a_writable_folder_that_holds_what_the_tool_trusts_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join("kernels")).unwrap();
    let c = Confinement::new()
        .writable(&project.join("kernels"), "the edit scope")
        .writable(dir.path(), "policies.toml [sandbox] writable `/x`")
        .protecting(&project, "the project");
    let e = c.granted().unwrap_err();
    assert!(
        e.contains("holds the project") && e.contains("[sandbox] writable `/x`"),
        "{e}"
    );
    let c = Confinement::new()
        .writable(&project.join("kernels"), "the edit scope")
        .writable(&dir.path().join("missing"), "left out")
        .protecting(&project, "the project");
    assert_eq!(
        c.granted().unwrap(),
        vec![project.join("kernels").canonicalize().unwrap()]
    );
}

/// A temp file another program removes between the listing and the rule (it happened to
/// nvcc's files in /tmp while a step confined its proposer) costs no error.
#[test]
fn a_sibling_gone_since_the_listing_needs_no_grant() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("kept");
    std::fs::write(&kept, "").unwrap();
    let gone = dir.path().join("tmpxft_gone.bc");
    assert_eq!(read_grants(&[kept.clone(), gone]).unwrap().len(), 1);
    assert_eq!(read_grants(&[kept]).unwrap().len(), 1);
}

#[test]
fn hiding_a_folder_grants_its_siblings_and_its_parents_siblings_only() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().canonicalize().unwrap();
    let key = home.join(".local/state/flashtune");
    std::fs::create_dir_all(&key).unwrap();
    std::fs::create_dir_all(home.join(".local/share")).unwrap();
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(home.join(".local/state/other"), "").unwrap();
    std::os::unix::fs::symlink(&key, home.join("key-link")).unwrap();
    std::os::unix::fs::symlink(home.join(".local"), home.join("local-link")).unwrap();
    let rules = hide_rules(std::slice::from_ref(&key));
    for granted in [".local/share", ".gemini", ".local/state/other"] {
        assert!(rules.contains(&home.join(granted)), "{granted}: {rules:?}");
    }
    for withheld in [
        ".local/state/flashtune",
        ".local/state",
        ".local",
        "key-link",
        "local-link",
    ] {
        assert!(
            !rules.contains(&home.join(withheld)),
            "{withheld}: {rules:?}"
        );
    }
    assert!(
        !rules.iter().any(|r| r == &home || home.starts_with(r)),
        "{rules:?}"
    );
}

#[test]
fn refusals_are_the_lines_that_say_permission_denied() {
    let out = "editing\nsh: 1: cannot create runs/x.txt: Permission denied\nError: EACCES: permission denied, open '/p/.git/HEAD'\ndone";
    assert_eq!(refusals(out).len(), 2);
    let note = refusal_note(out, "kernels/").unwrap();
    assert!(
        note.contains("runs/x.txt") && note.contains(".git/HEAD"),
        "{note}"
    );
    assert_eq!(refusal_note("fine", "kernels/"), None);
}
