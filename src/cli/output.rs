//! What commands print: a `--json` command's one answer or error document, an agent session's last words.
use crate::error::{Error, Result};
use std::process::ExitCode;

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Other(e.into()))
}

/// A `--json` command's one answer (issue 43, item 5): the document on stdout and exit code 0, or
/// the error document on stdout, the message on stderr and the error's exit code.
pub(super) fn answer_json<T: serde::Serialize>(result: Result<T>) -> Result<ExitCode> {
    answer_json_with(result.map(|doc| (doc, ExitCode::SUCCESS)))
}

/// [`answer_json`] for a document that comes with its own exit code.
pub(super) fn answer_json_with<T: serde::Serialize>(
    result: Result<(T, ExitCode)>,
) -> Result<ExitCode> {
    match result.and_then(|(doc, code)| Ok((to_json(&doc)?, code))) {
        Ok((doc, code)) => {
            crate::say!("{doc}");
            Ok(code)
        }
        Err(e) => answer_json_error(&e),
    }
}

/// A `--json` command's error: `{"schema_version", "error": {"code", "message", "exit_code"}}` on
/// stdout (a script reading stdout gets the code and message), the message on stderr.
pub(super) fn answer_json_error(e: &Error) -> Result<ExitCode> {
    let doc = crate::agent::error_document(
        crate::agent::error_code(e),
        &e.to_string(),
        serde_json::json!({ "exit_code": e.exit_code() }),
    );
    crate::say!("{}", to_json(&doc)?);
    crate::tell!("error: {e}");
    Ok(ExitCode::from(e.exit_code()))
}

/// An agent session's last words: the summary and where its log is.
pub(super) fn session_finished(outcome: &crate::agent::SessionOutcome) -> ExitCode {
    crate::os::console::out(&session_finished_text(outcome));
    ExitCode::SUCCESS
}

pub(super) fn session_finished_text(outcome: &crate::agent::SessionOutcome) -> String {
    format!(
        "{}\n{} steps, {} committed{}. Run log: {}\n",
        outcome.summary,
        outcome.steps,
        outcome.committed,
        outcome
            .stopped
            .as_ref()
            .map_or(String::new(), |s| format!(", stopped: {s}")),
        outcome.run_dir.join("log.jsonl").display()
    )
}
