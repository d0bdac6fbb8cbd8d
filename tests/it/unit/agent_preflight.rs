//! The tests of `src/agent/preflight.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::agent::preflight::*;

#[test]
fn the_program_is_the_first_word_after_assignments() {
    assert_eq!(
        program_of(r#"claude -p "$(cat {prompt_file})""#).as_deref(),
        Some("claude")
    );
    assert_eq!(
        program_of("FOO=1 env BAR=2 codex exec").as_deref(),
        Some("codex")
    );
    assert!(find_program("sh").is_some());
    assert!(find_program("no-such-agent-cli-here").is_none());
}
