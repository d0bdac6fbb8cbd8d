//! `flashtune mcp`: serve the MCP tools on stdin/stdout, or print the config that registers them.
use crate::error::{Error, Result};
use crate::model::config::ProjectPaths;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// Judge and profile on the test double instead of a GPU: synthetic figures, labelled as such.
    #[arg(long)]
    fake_gpu: bool,
    #[command(subcommand)]
    action: Option<McpAction>,
}

#[derive(Subcommand)]
enum McpAction {
    /// Print the snippet that registers `flashtune mcp` for this project with an agent (stdout;
    /// the file it belongs in goes to stderr), with the absolute paths of this binary and project.
    PrintConfig {
        #[arg(long, value_enum)]
        agent: AgentArg,
        /// The server the snippet starts judges on the test double.
        #[arg(long)]
        fake_gpu: bool,
        /// Merge the snippet into the agent's config file instead of printing it: the `flashtune`
        /// server entry is added or replaced, everything else in the file is kept.
        #[arg(long)]
        write: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AgentArg {
    Claude,
    Codex,
    Gemini,
    Cursor,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args { fake_gpu, action } = args;
    match action {
        None => {
            crate::mcp::serve(crate::mcp::McpOptions { paths, fake_gpu }).await?;
            Ok(ExitCode::SUCCESS)
        }
        Some(McpAction::PrintConfig {
            agent,
            fake_gpu,
            write,
        }) => {
            let agent = match agent {
                AgentArg::Claude => crate::mcp::Agent::Claude,
                AgentArg::Codex => crate::mcp::Agent::Codex,
                AgentArg::Gemini => crate::mcp::Agent::Gemini,
                AgentArg::Cursor => crate::mcp::Agent::Cursor,
            };
            let binary = std::env::current_exe()
                .map_err(|e| Error::Other(anyhow::anyhow!("cannot find this binary: {e}")))?;
            let root = paths.root.canonicalize().map_err(|e| {
                Error::BadInput(format!("project root {}: {e}", paths.root.display()))
            })?;
            let (file, snippet) = crate::mcp::client_config(agent, &binary, &root, fake_gpu);
            let place = match file.strip_prefix("~/") {
                Some(rel) => std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .ok_or_else(|| {
                        Error::BadInput(format!("{file} is under HOME, which is not set"))
                    })?
                    .join(rel),
                None => root.join(&file),
            };
            if write {
                crate::mcp::write_client_config(agent, &place, &snippet)?;
                crate::tell!("merged the flashtune server into {}", place.display());
                // A file in the project left uncommitted stops `step --proposer` (a proposer's
                // edit is told apart from the tree by what changed): say so now, not then.
                if place.starts_with(&root) && crate::os::vcs::head(&root).is_some() {
                    crate::tell!(
                        "commit {} (`git add {file} && git commit`) or list it in .gitignore: `step` with a proposer and agent sessions start only from a tree with no uncommitted files",
                        place.display()
                    );
                }
            } else {
                crate::tell!(
                    "# belongs in {}; `--write` merges it there, keeping the rest of the file",
                    place.display()
                );
                crate::os::console::out(&snippet);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
