//! Judging an edit: its builds (each logged), then the interleaved duel against HEAD's champion on every case.
use super::candidate::{includes_outside, Candidate};
use super::report::DuelRow;
use super::{Pairing, Session, EDIT_SCOPE};
use crate::error::WriteError;
use crate::error::{Error, Result};
use crate::gpu::build::{BuildFailure, BuildOutput, BuildSpec, Builder};
use crate::gpu::decide::{self, Verdict};
use crate::log::runlog::Record;
use crate::model::protocol::{
    CaseSpec, DuelPair, DuelRequest, DuelResult, ForwardKernel, MeasureSpec, ReferenceKernel,
};
use crate::model::space::REFERENCE;
use crate::model::vocab::BuildRole;
use crate::run::shared::{self, Events, Project, UnitKey};
use anyhow::anyhow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

impl Session<'_> {
    /// Build the edit from its snapshot's export, check and re-time it against HEAD's champion;
    /// `Err` holds why it was turned away before timing ended.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn judge_edit(
        &self,
        n: u32,
        pairings: &[Pairing],
        head_cubins: &BTreeMap<UnitKey, PathBuf>,
        step_dir: &Path,
        candidate: &Candidate,
        events: &mut Events,
        duels: &mut Vec<DuelRow>,
    ) -> Result<std::result::Result<decide::Overall, String>> {
        let tree = match self.export_candidate(candidate, self.root, &step_dir.join("edit"))? {
            Ok(tree) => tree,
            Err(why) => return Ok(Err(why)),
        };
        // A cache of its own: a cubin the proposer planted in the shared cache is never used.
        let pending = self.spawn_edit_build(
            pairings,
            &tree,
            crate::model::vocab::BuildRole::Edit,
            step_dir.join("build"),
            self.project.jobs(),
        );
        let edit_cubins = match collect_builds(pending, self.project, events).await? {
            Ok(cubins) => cubins,
            Err(why) => return Ok(Err(why)),
        };
        self.duel_edit(
            n,
            None,
            pairings,
            head_cubins,
            &edit_cubins,
            crate::model::vocab::BuildRole::Edit,
            events,
            duels,
        )
        .await
    }

    /// Write the candidate's edit scope into `dest`, the only sources its builds see; `Err` inside
    /// names the includes that reach past it into `workdir` (ignored or untracked files, other
    /// folders), which the export would silently drop.
    pub(crate) fn export_candidate(
        &self,
        candidate: &Candidate,
        workdir: &Path,
        dest: &Path,
    ) -> Result<std::result::Result<PathBuf, String>> {
        let repo = git2::Repository::open(self.root)
            .map_err(|e| Error::Other(anyhow!("{}", e.message())))?;
        let _ = std::fs::remove_dir_all(dest);
        candidate.export(&repo, EDIT_SCOPE, dest)?;
        let reaching = includes_outside(dest, workdir, &self.project.space.family.forward);
        if !reaching.is_empty() {
            return Ok(Err(format!(
                "the edit includes files outside its tree: {}; an edit is judged and committed as \
                 the files git would commit, so it may include only those",
                reaching.join("; ")
            )));
        }
        Ok(Ok(dest.to_path_buf()))
    }

    /// Start building the edit's forward kernels from `tree` into the build cache `cache`.
    pub(crate) fn spawn_edit_build(
        &self,
        pairings: &[Pairing],
        tree: &Path,
        role: crate::model::vocab::BuildRole,
        cache: PathBuf,
        jobs: usize,
    ) -> PendingBuild {
        let builder = Builder {
            cache_dir: cache,
            confine: Some(tree.to_path_buf()),
            ..self.project.builder()
        };
        let specs = self.specs(pairings, tree, role);
        let order = specs.iter().map(|(k, _)| k.clone()).collect();
        let (tasks, rx) = crate::run::scheduler::spawn_builds_with(builder, jobs, specs);
        PendingBuild {
            tasks,
            rx,
            order,
            role,
        }
    }

    /// One side of a duel (or a profile) on a pairing's case: `cubin` checked against HEAD's reference.
    pub(super) fn case_spec(
        &self,
        p: &Pairing,
        cubin: &Path,
        head_cubins: &BTreeMap<UnitKey, PathBuf>,
        seed: u64,
    ) -> CaseSpec {
        let project = self.project;
        let family = &project.space.family;
        CaseSpec {
            shape: p.shape.clone(),
            dtype: p.dtype,
            seed,
            tolerance: project.policies.tolerance_for(p.dtype),
            cpu_oracle_max_macs: project.policies.measure.cpu_reference_max_macs,
            forward: ForwardKernel {
                cubin: cubin.to_path_buf(),
                entry: family.forward_entry.clone(),
                combine_entry: family.combine_entry.clone(),
                launch: p.point.launch.clone().expect("valid points have a launch"),
                defines: project
                    .space
                    .forward_defines(&p.point.variant, p.dtype, p.shape.d),
            },
            // The reference is HEAD's, one cubin for both sides; the worker checks it against the oracle.
            reference: ReferenceKernel {
                cubin: head_cubins[&(REFERENCE.to_owned(), p.dtype, 0)].clone(),
                entry: family.reference_entry.clone(),
            },
            // A duel interleaves both sides sample by sample: nothing to race.
            race: None,
        }
    }

    /// Check and re-time built edit kernels against HEAD's champion (interleaved, under the GPU lock).
    /// Each case is logged (and a line printed on stderr) as the worker answers it; the first case
    /// the edit fails ends the duel there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn duel_edit(
        &self,
        n: u32,
        candidate: Option<u32>,
        pairings: &[Pairing],
        head_cubins: &BTreeMap<UnitKey, PathBuf>,
        edit_cubins: &BTreeMap<UnitKey, PathBuf>,
        role: crate::model::vocab::BuildRole,
        events: &mut Events,
        duels: &mut Vec<DuelRow>,
    ) -> Result<std::result::Result<decide::Overall, String>> {
        let project = self.project;
        let policy = &project.policies.measure;
        let mut pairs = Vec::new();
        let mut seeds = Vec::new();
        for p in pairings {
            let id = &p.point.variant.id;
            // Fresh inputs every step: an edit cannot be fitted to inputs it has seen.
            let seed = shared::input_seed(
                self.seed ^ u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                &p.shape,
                p.dtype,
            );
            seeds.push(seed);
            let key = |role: crate::model::vocab::BuildRole| {
                (format!("{id}@{role}"), p.dtype, p.point.head_dim)
            };
            pairs.push(DuelPair {
                champion: self.case_spec(
                    p,
                    &head_cubins[&key(crate::model::vocab::BuildRole::Head)],
                    head_cubins,
                    seed,
                ),
                challenger: self.case_spec(p, &edit_cubins[&key(role)], head_cubins, seed),
            });
        }
        let request = DuelRequest {
            measure: MeasureSpec {
                warmup_ms: policy.warmup_ms,
                samples: project.policies.step.rounds,
                min_sample_us: policy.min_sample_us,
                verified_replays: policy.verified_replays,
            },
            rounds: project.policies.step.rounds,
            pairs,
            stop_at_failure: true,
        };
        let timeout = Duration::from_secs(project.timeouts.worker_s * 2);
        let label = match candidate {
            Some(k) => format!("step {n} candidate {k}"),
            None => format!("step {n}"),
        };
        let mut tally = Tally {
            verdicts: Vec::new(),
            failure: None,
            seen: vec![false; pairings.len()],
            logged: Ok(()),
        };
        let answered =
            crate::gpu::executor::WorkerOutcome::ended(crate::gpu::executor::WorkerEnd::Clean);
        let outcome = self
            .opts
            .executor
            .duel_each(self.opts.device, request, timeout, &mut |r: &DuelResult| {
                let Some(i) = pairings
                    .iter()
                    .position(|p| p.shape.name == r.shape && p.dtype == r.dtype)
                else {
                    return;
                };
                if tally.logged.is_ok() && !tally.seen[i] {
                    tally.seen[i] = true;
                    let judged = self.judge_one(Some(r), &answered, &pairings[i]);
                    tally.logged = self.log_pair(
                        (n, candidate, &label),
                        &pairings[i],
                        seeds[i],
                        judged,
                        events,
                        duels,
                        &mut tally.verdicts,
                        &mut tally.failure,
                    );
                }
            })
            .await;
        let Tally {
            mut verdicts,
            mut failure,
            seen,
            logged,
        } = tally;
        logged?;
        // A worker that stopped at the edit's first failure left the rest untimed, as it should;
        // otherwise a case without an answer is a failure of its own (the worker died, timed out).
        let stopped_early = failure.is_some() && outcome.trouble().is_none();
        for (i, p) in pairings.iter().enumerate() {
            if seen[i] || stopped_early {
                continue;
            }
            let judged = self.judge_one(None, &outcome, p);
            self.log_pair(
                (n, candidate, &label),
                p,
                seeds[i],
                judged,
                events,
                duels,
                &mut verdicts,
                &mut failure,
            )?;
        }
        if let Some(why) = failure {
            return Ok(Err(why));
        }
        Ok(Ok(decide::judge_overall(
            &verdicts,
            project.policies.step.threshold,
        )))
    }

    fn judge_one(
        &self,
        result: Option<&DuelResult>,
        outcome: &crate::gpu::executor::WorkerOutcome,
        p: &Pairing,
    ) -> crate::run::duel::PairOutcome {
        crate::run::duel::judge_pair(
            result,
            outcome,
            self.project.policies.step.threshold,
            &p.shape,
            &self.roofs,
            self.project.policies.gates.plausibility_margin,
        )
    }

    /// One judged case into the log (flushed), the report's rows and a line on stderr.
    #[allow(clippy::too_many_arguments)]
    fn log_pair(
        &self,
        (n, candidate, label): (u32, Option<u32>, &str),
        p: &Pairing,
        seed: u64,
        judged: crate::run::duel::PairOutcome,
        events: &mut Events,
        duels: &mut Vec<DuelRow>,
        verdicts: &mut Vec<(String, Verdict)>,
        failure: &mut Option<String>,
    ) -> Result<()> {
        let case = format!("{} {}", p.shape.name, p.dtype);
        if let Some(v) = &judged.verdict {
            verdicts.push((case.clone(), v.clone()));
        }
        if failure.is_none() {
            *failure = judged.failure.as_ref().map(|w| format!("{case}: {w}"));
        }
        let us = |t: &Option<crate::model::protocol::TimingStats>| {
            t.as_ref()
                .map_or("—".to_owned(), |t| format!("{:.2} µs", t.median_us))
        };
        let said = match (&judged.verdict, &judged.failure) {
            (_, Some(f)) => f.lines().next().unwrap_or("").to_owned(),
            (Some(v), None) => format!(
                "HEAD {}, edit {}: {:+.1}% (noise {:.1}%)",
                us(&judged.champion),
                us(&judged.challenger),
                v.gain * 100.0,
                v.noise * 100.0
            ),
            (None, None) => "no verdict".into(),
        };
        crate::tell!("{label}: {case}: {said}");
        duels.push(DuelRow {
            shape: p.shape.name.clone(),
            dtype: p.dtype,
            variant: p.point.variant.id.clone(),
            champion_us: judged.champion.as_ref().map(|t| t.median_us),
            challenger_us: judged.challenger.as_ref().map(|t| t.median_us),
            verdict: judged.verdict.clone(),
            failure: judged.failure.clone(),
        });
        events.emit(Record::Duel {
            step: n,
            shape: p.shape.name.clone(),
            dtype: p.dtype,
            variant: p.point.variant.id.clone(),
            seed,
            champion: judged.champion,
            challenger: judged.challenger,
            challenger_check: judged.challenger_check,
            verdict: judged.verdict,
            failure: judged.failure,
            candidate,
        })?;
        Ok(())
    }
}

/// What a streamed duel has judged so far.
struct Tally {
    verdicts: Vec<(String, Verdict)>,
    failure: Option<String>,
    seen: Vec<bool>,
    logged: Result<()>,
}

/// Build every spec, logging each result as `tune` does (with its role, where `roles` gives one);
/// returns them in spec order.
pub(super) async fn build_logged(
    builder: Builder,
    jobs: usize,
    specs: Vec<(UnitKey, BuildSpec)>,
    roles: &BTreeMap<UnitKey, crate::model::vocab::BuildRole>,
    events: &mut Events,
) -> Result<Vec<(UnitKey, std::result::Result<BuildOutput, String>)>> {
    let order: Vec<UnitKey> = specs.iter().map(|(k, _)| k.clone()).collect();
    let (_tasks, mut rx) = crate::run::scheduler::spawn_builds_with(builder, jobs, specs);
    let mut done = BTreeMap::new();
    while let Some(((variant, dtype, head_dim), result)) = rx.recv().await {
        if let Err(BuildFailure::Disk(full)) = result {
            let key = (variant, dtype, head_dim);
            return Err(stopped_by_the_disk(&key, BuildRole::Head, full));
        }
        let record = Record::build_outcome(&variant, dtype, head_dim, &result);
        events.emit(match roles.get(&(variant.clone(), dtype, head_dim)) {
            Some(&role) => record.of_role(role),
            None => record,
        })?;
        let result =
            result.map_err(|f| format!("{f}\n{}", crate::gpu::build::log_tail(f.log(), 12)));
        done.insert((variant, dtype, head_dim), result);
    }
    Ok(order
        .into_iter()
        .filter_map(|k| done.remove(&k).map(|r| (k, r)))
        .collect())
}

/// Edit builds in flight, and what they are judged by once done.
pub(crate) struct PendingBuild {
    tasks: tokio::task::JoinSet<()>,
    rx: tokio::sync::mpsc::UnboundedReceiver<crate::run::scheduler::BuildResult>,
    order: Vec<UnitKey>,
    /// Which tree they are of, as their records say.
    role: crate::model::vocab::BuildRole,
}

/// Wait for an edit's builds, logging each; `Err` inside says why the edit is turned away.
pub(crate) async fn collect_builds(
    pending: PendingBuild,
    project: &Project,
    events: &mut Events,
) -> Result<std::result::Result<BTreeMap<UnitKey, PathBuf>, String>> {
    let PendingBuild {
        tasks: _tasks,
        mut rx,
        order,
        role,
    } = pending;
    let mut done = BTreeMap::new();
    while let Some(((variant, dtype, head_dim), result)) = rx.recv().await {
        if let Err(BuildFailure::Disk(full)) = result {
            return Err(stopped_by_the_disk(&(variant, dtype, head_dim), role, full));
        }
        events.emit(Record::build_outcome(&variant, dtype, head_dim, &result).of_role(role))?;
        done.insert((variant, dtype, head_dim), result);
    }
    let mut cubins = BTreeMap::new();
    for key in order {
        match done.remove(&key) {
            None => return Ok(Err(format!("the build of {} was lost", key.0))),
            Some(Err(f)) => {
                return Ok(Err(format!(
                    "the edit does not build ({}, {}, d={}): {f}\n{}",
                    key.0,
                    key.1,
                    key.2,
                    crate::gpu::build::log_tail(f.log(), 12)
                )))
            }
            Some(Ok(out)) => {
                if let Some(why) = project.gate(&out) {
                    return Ok(Err(format!("the edit is rejected by the gates: {why}")));
                }
                cubins.insert(key, out.cubin);
            }
        }
    }
    Ok(Ok(cubins))
}

/// A build the disk stopped: the edit is not to blame, so nothing is recorded against it and it
/// stays where it is, to be judged once there is room.
fn stopped_by_the_disk(key: &UnitKey, role: BuildRole, full: WriteError) -> Error {
    let (variant, dtype, head_dim) = key;
    let next = match role {
        BuildRole::Head => "nothing was judged; free space, then run it again".to_owned(),
        BuildRole::Edit => "the edit was not judged and is left in the working tree (its patch \
             kept in the run's attempts/); free space, then judge it again (`flashtune judge`)"
            .to_owned(),
        BuildRole::Candidate(k) => format!(
            "candidate {k} was not judged and is left in its worktree; free space, then \
             `flashtune resume` the session"
        ),
    };
    crate::gpu::build::stopped_by_the_disk(
        &format!("{variant} ({dtype}, d={head_dim})"),
        full,
        &next,
    )
}
