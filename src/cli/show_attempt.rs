//! `flashtune show-attempt`: an earlier attempt's patch, or the whole attempt as JSON.
use crate::cli::output::answer_json;
use crate::error::{Error, Result};
use crate::model::config::ProjectPaths;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// `<run id>/<step>` or `<run id>/<step>.<candidate>`, as `flashtune history` lists them.
    id: String,
    /// Print the attempt (idea, verdict, reason, per-case figures, metrics, whole patch) as JSON
    /// (an error as `{"schema_version", "error": {...}}`, with the same exit code).
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args { id, json } = args;
    let found = crate::agent::attempt(&paths, &id);
    if json {
        return answer_json(found);
    }
    let doc = found?;
    let patch = doc.entry.patch.as_deref().unwrap_or("");
    if patch.is_empty() {
        return Err(Error::BadInput(format!(
            "attempt `{id}` changed no file: there is no patch to show"
        )));
    }
    crate::os::console::out(&patch);
    if let Some(idea) = &doc.entry.idea {
        crate::tell!("# {}: {} ({})", doc.entry.attempt, idea.summary, idea.from);
    }
    crate::tell!("# verdict: {} — {}", doc.entry.verdict, doc.entry.reason);
    Ok(ExitCode::SUCCESS)
}
