//! `flashtune profile`: one variant of a run under Nsight Compute, logged in the run.
use crate::cli::output::{answer_json_error, answer_json_with};
use crate::cli::parse::parse_dtype;
use crate::cli::run_options::{GpuArgs, RunArgs};
use crate::error::{exit_code, Result};
use crate::model::config::ProjectPaths;
use crate::run::engine;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The run the variant was built and timed in: its folder or its id.
    run_dir: PathBuf,
    /// Variant id, as in the report (e.g. mma-bm128-bn64-w4-auto-s2).
    variant: String,
    /// Only these shapes (default: every shape of the run).
    #[arg(long, value_delimiter = ',')]
    shape: Vec<String>,
    /// Only these dtypes (default: [profile] dtypes).
    #[arg(long, value_delimiter = ',', value_parser = parse_dtype)]
    dtype: Vec<crate::model::config::Dtype>,
    #[command(flatten)]
    run: GpuArgs,
}

pub(super) async fn run(args: Args, paths: ProjectPaths) -> Result<ExitCode> {
    let Args {
        run_dir,
        variant,
        shape,
        dtype,
        run,
    } = args;
    let run = RunArgs::from(&run);
    let profiled = async {
        let run_dir = engine::resolve_run_dir(&paths, &run_dir)?;
        let results = engine::profile_on_demand(
            run.options(paths, None)?,
            &run_dir,
            &variant,
            &shape,
            &dtype,
        )
        .await?;
        let (log, header) = engine::read_run(&run_dir)?;
        Ok((run_dir, results, log, header))
    }
    .await;
    let (run_dir, results, log, header) = match profiled {
        Ok(p) => p,
        Err(e) if run.json => return answer_json_error(&e),
        Err(e) => return Err(e),
    };
    let line_of = |shape: &str, dtype: crate::model::config::Dtype| {
        log.entries
            .iter()
            .rev()
            .find_map(|(line, e)| match &e.record {
                crate::log::runlog::Record::Profiled {
                    variant: v,
                    shape: s,
                    dtype: d,
                    ..
                } if v == &variant && s == shape && *d == dtype => Some(*line),
                _ => None,
            })
    };
    let profiled = results
        .iter()
        .filter(|(_, _, o)| {
            matches!(
                o,
                Some(crate::gpu::profile::ProfileOutcome::Profiled { .. })
            )
        })
        .count();
    let code = if profiled == 0 {
        ExitCode::from(exit_code::FAILURE)
    } else {
        ExitCode::SUCCESS
    };
    if run.json {
        let profiles: Vec<serde_json::Value> = results
            .iter()
            .map(|(shape, dtype, outcome)| {
                serde_json::json!({
                    "shape": shape,
                    "dtype": dtype,
                    "log_line": line_of(shape, *dtype),
                    "profile": outcome,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "schema_version": crate::pack::JSON_SCHEMA_VERSION,
            "run": header.run_id,
            "variant": variant,
            "synthetic": header.device.fake,
            "profiles": profiles,
        });
        return answer_json_with(Ok((doc, code)));
    }
    let unbuilt = results.iter().filter(|(_, _, o)| o.is_none()).count();
    if unbuilt == results.len() {
        crate::say!(
            "{variant} was built for none of these cases in run {}: nothing was profiled, nothing logged",
            header.run_id
        );
        return Ok(code);
    }
    // The double's profiles are synthetic, as its timings are: every line says so.
    let synthetic = if header.device.fake {
        " (synthetic: fake GPU, nothing was profiled)"
    } else {
        ""
    };
    for (shape, dtype, outcome) in &results {
        if let Some(outcome) = outcome {
            let line = line_of(shape, *dtype);
            crate::say!(
                "{variant} {shape} {dtype}: {}{synthetic}",
                crate::report::sections::profile_text(outcome, line.unwrap_or(0)).words()
            );
        }
    }
    if unbuilt > 0 {
        crate::say!("{unbuilt} other case(s) of {variant} were not built in this run: nothing to profile there");
    }
    crate::say!("Logged in {}", run_dir.join("log.jsonl").display());
    Ok(code)
}
