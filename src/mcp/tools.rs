//! The tools an agent calls: judge, judge_status, profile, history, attempt and context.
use super::jobs::{read_profile, read_verdict, Ended};
use super::lookup::timed_variants;
use super::stray::outside_scope_now;
use super::{
    refusal, to_value, wait_of, AttemptArgs, ContextArgs, HistoryArgs, Jobs, JudgeArgs, McpOptions,
    ProfileArgs, StatusArgs, Workbench, DEFAULT_HISTORY,
};
use crate::error::{Error, Result};
use crate::run::shared::Project;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, RequestMetaObject};
use rmcp::{tool, tool_router, Peer, RoleServer};
use serde_json::json;
use std::path::Path;
use std::sync::{Arc, Mutex};

#[tool_router]
impl Workbench {
    pub fn new(opts: McpOptions) -> Result<Self> {
        let root = opts.paths.root.clone();
        let baseline = outside_scope_now(&root).unwrap_or_default();
        let binary = std::env::current_exe().map_err(|e| {
            Error::Other(anyhow::anyhow!("cannot find flashtune's own binary: {e}"))
        })?;
        Ok(Workbench {
            root,
            paths: opts.paths,
            fake_gpu: opts.fake_gpu,
            binary,
            baseline: Arc::new(baseline),
            jobs: Arc::new(Mutex::new(Jobs::default())),
            tool_router: Self::tool_router(),
        })
    }

    #[tool(
        description = "Judge the uncommitted edit under kernels/ against HEAD's champion, exactly as `flashtune judge` does: build HEAD's champion and the edit, check both on fresh inputs with poisoned outputs, re-time them interleaved on every shape and dtype. A faster edit (beyond noise, no case slower) is committed by flashtune (on the fake GPU to a scratch ref, never your branch); anything else is restored to HEAD. Either way its patch is kept and it joins the history: say what it tries in `idea`. Changes outside kernels/ (or to kernels/attention/tuned.toml or the reference kernel) reject the edit unjudged and are undone, all of them. Returns the verdict document {schema_version, status: \"done\", verdict, accepted, reason, geomean_gain, commit, restored, cases[], attempt, idea, metrics, ...}; if the verdict takes longer than wait_s, returns {status: \"running\", job} instead: call judge_status with that job. Only one judge or profile runs at a time. Do not commit yourself."
    )]
    async fn judge(
        &self,
        Parameters(args): Parameters<JudgeArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let wait = wait_of(args.wait_s);
        if let Some(busy) = self.busy() {
            return Ok(busy);
        }
        let mut command = vec!["judge".to_owned(), "--json".to_owned()];
        if let Some(idea) = &args.idea {
            command.extend(["--idea".to_owned(), idea.clone()]);
        }
        if let Some(space) = &args.space {
            match self.inside_project(space) {
                Ok(_) => command.extend(["--space".to_owned(), space.clone()]),
                Err(refused) => return Ok(refused),
            }
        }
        let project = match Project::load(self.paths.clone(), args.space.as_deref().map(Path::new))
        {
            Ok(p) => p,
            // An agent that broke policies.toml stepped outside its scope: undo that first.
            Err(e) => {
                return Ok(self
                    .undo_stray_changes(None, &args)
                    .unwrap_or_else(|| refusal("bad_project", e.to_string(), json!({}))))
            }
        };
        if let Some(variant) = &args.variant {
            if let Some(refused) = unknown_variant(&project, variant) {
                return Ok(refused);
            }
            command.extend(["--variant".to_owned(), variant.clone()]);
        }
        if let Some(verdict) = self.undo_stray_changes(Some(&project), &args) {
            return Ok(verdict);
        }
        Ok(self
            .run_job("judge", command, read_verdict, wait, meta, peer)
            .await)
    }

    #[tool(
        description = "Wait for a job that judge or profile started, and return its result once it ends: the same JSON judge or profile would have returned. While it still runs after wait_s, returns {status: \"running\", job, seconds, phase}; call again."
    )]
    async fn judge_status(
        &self,
        Parameters(args): Parameters<StatusArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let known = self
            .jobs
            .lock()
            .expect("jobs lock")
            .all
            .contains_key(&args.job);
        if !known {
            let ids: Vec<String> = self
                .jobs
                .lock()
                .expect("jobs lock")
                .all
                .keys()
                .cloned()
                .collect();
            return Ok(refusal(
                "unknown_job",
                format!("no job `{}` was started by this server", args.job),
                json!({ "jobs": ids }),
            ));
        }
        Ok(self
            .wait_for(&args.job, wait_of(args.wait_s), meta, peer)
            .await)
    }

    #[tool(
        description = "Nsight Compute digest of one variant on one shape and dtype, from a run that built and timed it: per-kernel metrics with units (SM and DRAM throughput, occupancy, tensor pipe, waves, registers) and the bottleneck flashtune's rules name. On the fake GPU the figures are the test double's and are labelled synthetic. Returns {status: \"done\", profile, ...} or {status: \"running\", job} to poll with judge_status."
    )]
    async fn profile(
        &self,
        Parameters(args): Parameters<ProfileArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let wait = wait_of(args.wait_s);
        if let Some(busy) = self.busy() {
            return Ok(busy);
        }
        let dtype = args.dtype.clone().unwrap_or_else(|| "f16".to_owned());
        if !["f16", "bf16"].contains(&dtype.as_str()) {
            return Ok(refusal(
                "bad_argument",
                format!("dtype `{dtype}`: f16 or bf16"),
                json!({}),
            ));
        }
        let run_dir = match &args.run {
            Some(run) => match self.run_folder(run) {
                Ok(dir) => dir,
                Err(refused) => return Ok(refused),
            },
            None => match self.newest_run_timing(&args.variant) {
                Some(dir) => dir,
                None if !self.project_variants().contains(&args.variant) => {
                    return Ok(refusal(
                        "unknown_variant",
                        format!(
                            "`{}` is not a variant of any space in the project, and no run under runs/ timed it",
                            args.variant
                        ),
                        json!({ "known": self.variants_timed() }),
                    ))
                }
                None => {
                    return Ok(refusal(
                        "no_run",
                        format!(
                            "no run under runs/ timed `{}`: profile needs a run that built it (`flashtune tune`)",
                            args.variant
                        ),
                        json!({ "variants_timed": self.variants_timed() }),
                    ))
                }
            },
        };
        let (log, header) = match crate::run::engine::read_run(&run_dir) {
            Ok(x) => x,
            Err(e) => return Ok(refusal("bad_run", e.to_string(), json!({}))),
        };
        let timed: Vec<String> = timed_variants(&log);
        if !timed.contains(&args.variant) {
            return Ok(refusal(
                "unknown_variant",
                format!("run {} did not time `{}`", header.run_id, args.variant),
                json!({ "known": timed }),
            ));
        }
        if !header.shapes.iter().any(|s| s.name == args.shape) {
            let shapes: Vec<&str> = header.shapes.iter().map(|s| s.name.as_str()).collect();
            return Ok(refusal(
                "unknown_shape",
                format!("run {} has no shape `{}`", header.run_id, args.shape),
                json!({ "known": shapes }),
            ));
        }
        let command = vec![
            "profile".to_owned(),
            run_dir.display().to_string(),
            args.variant.clone(),
            "--shape".to_owned(),
            args.shape.clone(),
            "--dtype".to_owned(),
            dtype.clone(),
        ];
        let (variant, shape) = (args.variant.clone(), args.shape.clone());
        let interpret = move |ended: Ended| read_profile(ended, &run_dir, &variant, &shape, &dtype);
        Ok(self
            .run_job("profile", command, interpret, wait, meta, peer)
            .await)
    }

    #[tool(
        description = "Every earlier step and candidate on this repository, across sessions and agent sessions, newest last: each attempt's id, the idea it tried, the files it changed and its diff stat (the patch for the latest), its verdict (committed, accepted, rejected, dropped, unfinished) and reason, geomean gain, how the key metrics moved (per-case gains, registers, spills), the commit it became, per case the champion's and the edit's median µs, and what it cost. Returns {schema_version, total, steps[]}, as `flashtune history --json`. Read it before editing so you do not try again what was rejected; `attempt` gives any one's whole patch."
    )]
    async fn history(
        &self,
        Parameters(args): Parameters<HistoryArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let doc =
            crate::agent::step_history(&self.paths, Some(args.last.unwrap_or(DEFAULT_HISTORY)));
        Ok(CallToolResult::structured(to_value(&doc)))
    }

    #[tool(
        description = "One earlier attempt by the id `history` lists (`<run id>/<step>` or `<run id>/<step>.<candidate>`): its idea, verdict, reason, per-case figures, metrics, cost, and its whole patch, ready for `git apply` (a near miss to build on, or what not to repeat). Returns {schema_version, attempt, patch, ...}, as `flashtune show-attempt ID --json`."
    )]
    async fn attempt(
        &self,
        Parameters(args): Parameters<AttemptArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        Ok(match crate::agent::attempt(&self.paths, &args.id) {
            Ok(doc) => CallToolResult::structured(to_value(&doc)),
            Err(e) => refusal(
                if crate::pack::parse_attempt_id(&args.id).is_some() {
                    "not_found"
                } else {
                    "bad_argument"
                },
                e.to_string(),
                json!({}),
            ),
        })
    }

    #[tool(
        description = "The context pack, as `flashtune context --json` prints it and an agent session writes it: the rules (edit scope, protected files, how an edit is judged, what gets it rejected), HEAD's champion per case with its figures from the run logs (µs, TF/s, % of the measured roofs, PyTorch), Nsight Compute's speed of light and the named bottleneck with its evidence metrics, how to build the kernel locally, ideas tried and failed (avoid) and near misses worth another try, and the history. Read it first."
    )]
    async fn context(
        &self,
        Parameters(args): Parameters<ContextArgs>,
    ) -> std::result::Result<CallToolResult, rmcp::ErrorData> {
        let space = match &args.space {
            Some(space) => match self.inside_project(space) {
                Ok(p) => Some(p),
                Err(refused) => return Ok(refused),
            },
            None => None,
        };
        if let Some(variant) = &args.variant {
            // As judge refuses it; a project that does not load is context_pack's to report.
            if let Ok(project) = Project::load(self.paths.clone(), space.as_deref()) {
                if let Some(refused) = unknown_variant(&project, variant) {
                    return Ok(refused);
                }
            }
        }
        let pack = crate::agent::context_pack(&crate::agent::ContextOptions {
            paths: self.paths.clone(),
            space,
            variant: args.variant.clone(),
        });
        Ok(match pack {
            Ok(p) => CallToolResult::structured(to_value(&p)),
            Err(e) => refusal("bad_project", e.to_string(), json!({})),
        })
    }
}

/// The refusal every tool gives a variant its space does not have: `unknown_variant`, with the
/// space's variants.
fn unknown_variant(project: &Project, variant: &str) -> Option<CallToolResult> {
    let known: Vec<String> = project
        .space
        .variants()
        .map(|vs| vs.into_iter().map(|v| v.id).collect())
        .unwrap_or_default();
    (!known.iter().any(|k| k == variant)).then(|| {
        refusal(
            "unknown_variant",
            format!(
                "`{variant}` is not a variant of space `{}`",
                project.space.name
            ),
            json!({ "known": known }),
        )
    })
}
