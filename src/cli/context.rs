//! `flashtune context`: the context pack for the next step at HEAD.
use crate::cli::output::answer_json;
use crate::error::Result;
use crate::model::config::ProjectPaths;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// Variant space whose shapes the pack covers (default: `default_space` in policies.toml).
    #[arg(long)]
    space: Option<PathBuf>,
    /// The champion variant where HEAD's champion table names none.
    #[arg(long)]
    variant: Option<String>,
    /// Print the pack as JSON (default: PROMPT.md); an error as `{"schema_version", "error":
    /// {...}}`, with the same exit code.
    #[arg(long)]
    json: bool,
    /// Also write AGENTS.md, PROMPT.md and context/ into this folder.
    #[arg(long)]
    write: Option<PathBuf>,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        space,
        variant,
        json,
        write,
    } = args;
    let packed = (|| {
        let pack = crate::agent::context_pack(&crate::agent::ContextOptions {
            paths: paths.clone(),
            space,
            variant,
        })?;
        if let Some(dir) = write {
            crate::agent::write_context_pack(&pack, &paths, &dir)?;
        }
        Ok(pack)
    })();
    if json {
        return answer_json(packed);
    }
    crate::os::console::out(&crate::pack::prompt_md(&packed?));
    Ok(ExitCode::SUCCESS)
}
