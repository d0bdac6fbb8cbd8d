//! `flashtune build`: compile and gate every variant of a space without a GPU; the resource table.
use crate::error::{exit_code, Result};
use crate::model::config::ProjectPaths;
use crate::run::engine;
use crate::run::shared::Project;
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// Variant space (default: `default_space` in policies.toml).
    #[arg(long)]
    space: Option<PathBuf>,
    /// Only a covering sample: per (MMA path, head dim) the points at the extremes of shared
    /// memory and per-thread work, and enough others that every value of every parameter is
    /// built once (a gate that takes a minute, not ten).
    #[arg(long)]
    covering: bool,
    /// nvcc target, e.g. sm_89 (default: policies.toml's build.default_arch). Points are ruled
    /// out with that target's limits from policies.toml's [build.targets.<arch>].
    #[arg(long)]
    arch: Option<String>,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        space,
        arch,
        covering,
    } = args;
    let project = Project::load(paths, space.as_deref())?;
    let (planned, rows) = engine::build_space(&project, arch.as_deref(), covering).await?;
    let (table, failures) = build_table(&planned, &rows);
    crate::say!("{table}");
    if failures > 0 {
        crate::tell!("{failures} build(s) failed or were rejected by the gates");
        return Ok(ExitCode::from(exit_code::FAILURE));
    }
    Ok(ExitCode::SUCCESS)
}

fn build_table(
    planned: &[crate::model::space::PlannedPoint],
    rows: &[engine::BuiltRow],
) -> (String, usize) {
    let mut t = String::new();
    let mut failures = 0;
    let _ = writeln!(t, "| unit | dtype | d | entry | regs | spill st/ld B | stack B | static smem B | build | verdict |");
    let _ = writeln!(t, "|---|---|---:|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        match &r.outcome {
            Ok(out) => {
                if r.gate.is_some() {
                    failures += 1;
                }
                let verdict = r.gate.clone().unwrap_or_else(|| "ok".into());
                let build = if out.cached {
                    "cached".to_owned()
                } else {
                    format!("{:.1} s", out.seconds)
                };
                for e in &out.entries {
                    let _ = writeln!(
                        t,
                        "| `{}` | {} | {} | {} | {} | {}/{} | {} | {} | {build} | {verdict} |",
                        r.variant,
                        r.dtype,
                        if r.head_dim == 0 {
                            "any".into()
                        } else {
                            r.head_dim.to_string()
                        },
                        e.name,
                        e.registers,
                        e.spill_store_bytes,
                        e.spill_load_bytes,
                        e.stack_frame_bytes,
                        e.static_smem_bytes
                    );
                }
            }
            Err(why) => {
                failures += 1;
                let first = why.lines().next().unwrap_or("");
                let _ = writeln!(
                    t,
                    "| `{}` | {} | {} | — | — | — | — | — | — | **{first}** |",
                    r.variant, r.dtype, r.head_dim
                );
                crate::tell!(
                    "build of {} {} d{} failed:\n{why}\n",
                    r.variant,
                    r.dtype,
                    r.head_dim
                );
            }
        }
    }
    let invalid: Vec<_> = planned.iter().filter(|p| p.invalid.is_some()).collect();
    if !invalid.is_empty() {
        // One line per reason, its figures folded (a full space rules out tens of thousands).
        let mut groups: std::collections::BTreeMap<
            String,
            (usize, &crate::model::space::PlannedPoint),
        > = Default::default();
        for p in &invalid {
            let Some(invalid) = &p.invalid else { continue };
            let reason = invalid.reason.as_str();
            // A constraint is named by its text; a limit's figures vary point to point.
            let key = if invalid.by == crate::model::space::RuledOutBy::Constraint {
                reason.to_owned()
            } else {
                let mut key = String::with_capacity(reason.len());
                for c in reason.chars() {
                    if !c.is_ascii_digit() {
                        key.push(c);
                    } else if !key.ends_with('N') {
                        key.push('N');
                    }
                }
                key
            };
            groups.entry(key).or_insert((0, p)).0 += 1;
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        let _ = writeln!(
            t,
            "\n{} points ruled out before compiling, for {} reasons:",
            invalid.len(),
            groups.len()
        );
        for (reason, (count, example)) in &groups {
            let example_reason = example.invalid.as_ref().map_or("", |i| i.reason.as_str());
            let detail = if example_reason == reason {
                String::new()
            } else {
                format!(": {example_reason}")
            };
            let _ = writeln!(
                t,
                "- {count} × {reason} (for example `{}` d={}{detail})",
                example.variant.id, example.head_dim
            );
        }
    }
    let units = rows.len();
    let cached = rows
        .iter()
        .filter(|r| r.outcome.as_ref().is_ok_and(|o| o.cached))
        .count();
    let _ = writeln!(
        t,
        "\n{} points planned: {} valid, {} ruled out; {units} builds ({cached} from the cache), {} failed or rejected by the gates",
        planned.len(),
        planned.len() - invalid.len(),
        invalid.len(),
        failures
    );
    (t, failures)
}
