//! `flashtune history`: every attempt on this project, or how a shape's champion moved across runs.
use crate::cli::output::answer_json;
use crate::cli::parse::parse_dtype;
use crate::error::{Error, Result};
use crate::model::config::ProjectPaths;
use std::fmt::Write;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// A shape of policies.toml (matched by its geometry, so a renamed shape keeps its history),
    /// or a name the store knows.
    shape: Option<String>,
    /// Print as JSON: `{"schema_version", "total", "steps": [...]}` without a shape,
    /// `{"schema_version", "shape", "rows": [...]}` with one; an error as `{"schema_version",
    /// "error": {...}}`, with the same exit code.
    #[arg(long)]
    json: bool,
    /// Only this dtype (with a shape).
    #[arg(long, value_parser = parse_dtype)]
    dtype: Option<crate::model::config::Dtype>,
    /// Only the latest N attempts (without a shape).
    #[arg(long)]
    last: Option<usize>,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        shape,
        json,
        dtype,
        last,
    } = args;
    // Outside a project there is no history to show: "None yet." would read as an empty one.
    if !paths.policies().is_file() {
        let refused = Error::BadInput(format!(
            "not a flashtune project: no {} (run `flashtune history` inside a project, or give --root)",
            paths.policies().display()
        ));
        return match json {
            true => answer_json::<()>(Err(refused)),
            false => Err(refused),
        };
    }
    match shape {
        None => attempts(paths, json, dtype, last),
        Some(shape) => champions(paths, shape, json, dtype, last),
    }
}

/// Without a shape: every step and agent candidate tried on this project.
fn attempts(
    paths: ProjectPaths,
    json: bool,
    dtype: Option<crate::model::config::Dtype>,
    last: Option<usize>,
) -> Result<ExitCode> {
    let listed = match dtype {
        Some(_) => Err(Error::BadInput(
            "--dtype filters a shape's history: give a shape (`flashtune history seed --dtype f16`)"
                .into(),
        )),
        None => Ok(crate::agent::step_history(&paths, last)),
    };
    if json {
        return answer_json(listed);
    }
    crate::os::console::out(&crate::pack::history_md(&listed?.steps));
    Ok(ExitCode::SUCCESS)
}

/// With a shape: its champion per run and dtype, from the results store.
fn champions(
    paths: ProjectPaths,
    shape: String,
    json: bool,
    dtype: Option<crate::model::config::Dtype>,
    last: Option<usize>,
) -> Result<ExitCode> {
    // The store's rows for the shape, and the table a person reads.
    let found = (|| {
        if last.is_some() {
            return Err(Error::BadInput(
                "--last counts attempts: it goes without a shape (`flashtune history --last 10`)"
                    .into(),
            ));
        }
        let (policies, _) = crate::model::config::Policies::load(&paths.policies())?;
        let known = policies.shapes.iter().find(|s| s.name == shape);
        let path = crate::log::store::path(&paths);
        let store = crate::log::store::Store::open_existing(&path)
            .map_err(|e| Error::BadInput(format!("{e:#}")))?
            .ok_or_else(|| {
                Error::BadInput(format!(
                    "no results store at {}: `flashtune tune` fills it as it measures, and `flashtune report <run>` adds an earlier run",
                    path.display()
                ))
            })?;
        let geometry = known.map(crate::log::store::geometry);
        let rows = store
            .history(&shape, geometry.as_deref())
            .map_err(|e| Error::Other(e.context(format!("cannot read {}", path.display()))))?;
        let rows: Vec<_> = rows
            .into_iter()
            .filter(|r| dtype.is_none_or(|d| d == r.dtype))
            .collect();
        if rows.is_empty() {
            return Err(Error::BadInput(format!(
                "{} holds no measurement of shape `{shape}`{}",
                path.display(),
                dtype.map_or(String::new(), |d| format!(" in {d}"))
            )));
        }
        let table = history_table(&shape, known, &rows);
        Ok((rows, table))
    })();
    if json {
        return answer_json(found.map(|(rows, _)| {
            serde_json::json!({
                "schema_version": crate::pack::JSON_SCHEMA_VERSION,
                "shape": shape,
                "rows": rows,
            })
        }));
    }
    crate::os::console::out(&found?.1);
    Ok(ExitCode::SUCCESS)
}

/// `flashtune history`: one row per run and dtype, grouped by GPU model, with what changed.
fn history_table(
    shape: &str,
    known: Option<&crate::model::config::Shape>,
    rows: &[crate::log::store::HistoryRow],
) -> String {
    let mut t = String::new();
    let title = known.map_or_else(|| format!("`{shape}`"), |s| s.label());
    let _ = writeln!(t, "Champion of {title} per run\n");
    let _ = writeln!(
        t,
        "| started | run | git | GPU | dtype | champion | µs | TF/s | change |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---:|---:|---|");
    let mut before: Option<&crate::log::store::HistoryRow> = None;
    for r in rows {
        let same_line = before.filter(|b| b.gpu == r.gpu && b.fake == r.fake && b.dtype == r.dtype);
        let change = match same_line {
            None => "first".to_owned(),
            Some(b) if b.variant == r.variant => format!(
                "same champion, {:+.1}%",
                100.0 * (r.median_us / b.median_us - 1.0)
            ),
            Some(b) => format!(
                "was `{}` {:.1} µs: {:+.1}%",
                b.variant,
                b.median_us,
                100.0 * (r.median_us / b.median_us - 1.0)
            ),
        };
        // Every figure names the record it stands on: its own run's line, or the run it was reused from.
        let (run, change) = if r.origin_run == r.run_id {
            (format!("{} line {}", r.run_id, r.origin_line), change)
        } else {
            let from = format!("reused from run {} line {}", r.origin_run, r.origin_line);
            (r.run_id.clone(), format!("{change} ({from})"))
        };
        let git = r
            .git_head
            .as_deref()
            .map_or("—".to_owned(), |g| g.chars().take(10).collect());
        let gpu = if r.fake {
            format!("{} (fake)", r.gpu.split(" (").next().unwrap_or(&r.gpu))
        } else {
            r.gpu.clone()
        };
        let _ = writeln!(
            t,
            "| {} | {run} | {git} | {gpu} | {} | `{}` | {:.2} | {} | {change} |",
            r.started_at,
            r.dtype,
            r.variant,
            r.median_us,
            crate::report::document::three_digits(r.tflops)
        );
        before = Some(r);
    }
    t
}
