//! Before an agent session's first step: the agent's command must exist, and the variables that
//! carry its credentials should be set. A missing command is refused by name; a missing credential
//! is a warning, since each of these CLIs can also be logged in on its own.
use super::AgentOptions;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Refuse a session whose agent command is not installed; the warnings for credentials not set.
/// A `--proposer` command (`custom`) is a shell line of the user's and is not checked.
pub fn preflight(agent: &AgentOptions) -> Result<Vec<String>> {
    if agent.name == "custom" {
        return Ok(Vec::new());
    }
    let Some(program) = program_of(&agent.command) else {
        return Ok(Vec::new());
    };
    if find_program(&program).is_none() {
        return Err(Error::ToolMissing {
            tool: program.clone(),
            hint: format!(
                "`--agent {}` runs `{program}` (policies.toml's [agents.{}] command), which is not on PATH: \
                 install it, or point [agents.{}] command at it",
                agent.name, agent.name, agent.name
            ),
        });
    }
    let set = |k: &String| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if agent.auth_env.is_empty() || agent.auth_env.iter().any(set) {
        return Ok(Vec::new());
    }
    Ok(vec![format!(
        "none of {} is set: `{program}` must be logged in on its own, or every candidate fails",
        agent.auth_env.join(", ")
    )])
}

/// The program a command line starts: its first word after `VAR=value` assignments and `env`/`exec`.
pub fn program_of(command: &str) -> Option<String> {
    command
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == '\'' || c == '"'))
        .find(|w| !w.is_empty() && !w.contains('=') && *w != "env" && *w != "exec")
        .map(str::to_owned)
}

/// Where `program` is: itself if it names a path, else the first match on PATH.
pub fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return runnable(&p).then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| runnable(p))
}
