//! How a run explores beyond a fixed plan: a reproducible random sample, and the guided search (profile → bottleneck → neighbours, with interleaved re-timings before a challenger is crowned).
use crate::error::Result;
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::{Dtype, Shape};
use crate::model::plan::{Proposal, RoundChampion};
use crate::model::protocol::{DeviceInfo, TimingStats};
use crate::model::space::{Params, PlannedPoint, Variant};
use crate::run::budget::Budget;
use crate::run::scheduler::{Ending, Totals};
use crate::run::shared::{self, Events, Project};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `count` valid variants of `planned`, drawn reproducibly; every head dim of a drawn variant comes along.
pub fn random_sample(planned: &[PlannedPoint], count: usize, seed: u64) -> Vec<PlannedPoint> {
    use rand::{seq::SliceRandom, SeedableRng};
    let mut ids: Vec<&str> = Vec::new();
    for p in planned.iter().filter(|p| p.invalid.is_none()) {
        if !ids.contains(&p.variant.id.as_str()) {
            ids.push(&p.variant.id);
        }
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    ids.shuffle(&mut rng);
    let chosen: BTreeSet<&str> = ids.into_iter().take(count).collect();
    planned
        .iter()
        .filter(|p| chosen.contains(p.variant.id.as_str()))
        .cloned()
        .collect()
}

/// The champion of one (shape, dtype) as the guided search sees it.
#[derive(Debug, Clone)]
struct Holder {
    variant: String,
    timing: TimingStats,
}

/// Interleaved re-timings the search already ran: (shape, dtype, challenger) → accepted.
fn duel_verdicts(log: &LoadedLog) -> BTreeMap<(String, Dtype, String), bool> {
    log.entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::SearchDuel {
                shape,
                dtype,
                challenger,
                verdict,
                ..
            } => Some((
                (shape.clone(), *dtype, challenger.clone()),
                verdict.as_ref().is_some_and(|v| v.accept),
            )),
            _ => None,
        })
        .collect()
}

/// The champion of every (shape, dtype), by the read model's one rule (`RunIndex::pick`): a
/// challenger that lost its interleaved re-timing on a case is never champion there.
fn champions(log: &LoadedLog) -> BTreeMap<(String, Dtype), Holder> {
    let index = crate::log::runindex::RunIndex::new(log);
    index
        .champions()
        .into_iter()
        .filter_map(|((shape, dtype), case)| {
            Some((
                (shape.to_owned(), dtype),
                Holder {
                    variant: case.variant.to_owned(),
                    timing: case.measured()?.clone(),
                },
            ))
        })
        .collect()
}

/// Where the search starts: the space's `start`, else its baseline.
fn start_variant(space: &crate::model::space::Space) -> Variant {
    let params = space.start.as_ref().unwrap_or(&space.baseline);
    Variant {
        id: crate::model::space::variant_id(params),
        params: params.clone(),
        step: None,
    }
}

fn params_of(log: &LoadedLog) -> BTreeMap<String, Params> {
    log.entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Planned {
                variant, params, ..
            } => Some((variant.clone(), params.clone())),
            _ => None,
        })
        .collect()
}

/// The guided search over one run: measures through the engine, profiles champions, proposes neighbours.
pub struct Guided<'a> {
    pub project: &'a Project,
    pub device: &'a DeviceInfo,
    pub opts: &'a shared::TuneOptions,
    /// Variants a resumed run already finished: proposed again, never measured again.
    pub done: &'a BTreeSet<String>,
    pub run_dir: &'a Path,
}

impl Guided<'_> {
    /// Rounds of: champions → their bottlenecks (ncu) → the rules' neighbours → measure; until no neighbour helps.
    /// `held` holds a GPU beside the first round (the reference library), as in `measure_points`.
    pub async fn run(
        &self,
        events: &mut Events,
        limits: &crate::model::space::DeviceLimits,
        held: Option<crate::run::scheduler::HeldGpu<'_>>,
    ) -> Result<Ending> {
        let project = self.project;
        let policy = &project.policies.guided;
        let head_dims = project.head_dims();
        let mut totals = Totals::default();
        let start = start_variant(&project.space);
        let mut proposed_ever: BTreeSet<String> = BTreeSet::from([start.id.clone()]);
        let points = project.space.plan_points(&[start], &head_dims, limits)?;
        let ending = crate::run::measure::measure_points(
            project,
            self.device,
            self.opts,
            events,
            self.done,
            &points,
            &BTreeMap::new(),
            &self.opts.budget,
            held,
        )
        .await?;
        if let Some(stop) = self.absorb(ending, &mut totals, events)? {
            return Ok(stop);
        }
        for round in 1..=policy.max_rounds {
            if let Some(stop) = self.out_of_time(&mut totals, events)? {
                return Ok(stop);
            }
            // A snapshot: this round's profiles are logged while it is read.
            let log = events.records().clone();
            let before = champions(&log);
            let proposals = self
                .propose(events, round, &log, &before, &proposed_ever)
                .await?;
            events.emit(Record::SearchRound {
                round,
                champions: before
                    .iter()
                    .map(|((shape, dtype), h)| RoundChampion {
                        shape: shape.clone(),
                        dtype: *dtype,
                        variant: h.variant.clone(),
                        median_us: h.timing.median_us,
                    })
                    .collect(),
                proposed: proposals.keys().cloned().collect(),
            })?;
            if proposals.is_empty() {
                events.emit(Record::SearchStopped {
                    reason: format!(
                        "round {round}: the rules propose no untried neighbour of any champion"
                    ),
                })?;
                return Ok(Ending::Finished(totals));
            }
            proposed_ever.extend(proposals.keys().cloned());
            let variants: Vec<Variant> = proposals.values().map(|(v, _)| v.clone()).collect();
            let reasons: BTreeMap<String, Proposal> = proposals
                .into_iter()
                .map(|(id, (_, why))| (id, why))
                .collect();
            let points = project.space.plan_points(&variants, &head_dims, limits)?;
            let budget = remaining(&self.opts.budget, totals.variants);
            let ending = crate::run::measure::measure_points(
                project,
                self.device,
                self.opts,
                events,
                self.done,
                &points,
                &reasons,
                &budget,
                None,
            )
            .await?;
            if let Some(stop) = self.absorb(ending, &mut totals, events)? {
                return Ok(stop);
            }
            if let Some(stop) = self.out_of_time(&mut totals, events)? {
                return Ok(stop);
            }
            let after = self.confirmed_champions(events, round, &before).await?;
            let changed = after
                .iter()
                .any(|(k, h)| before.get(k).is_none_or(|b| b.variant != h.variant));
            if !changed {
                events.emit(Record::SearchStopped {
                    reason: format!(
                        "round {round}: no proposal beat a champion by more than {:.0}% and its noise",
                        policy.min_gain * 100.0
                    ),
                })?;
                return Ok(Ending::Finished(totals));
            }
        }
        events.emit(Record::SearchStopped {
            reason: format!(
                "max_rounds = {} reached (policies.toml [guided])",
                policy.max_rounds
            ),
        })?;
        Ok(Ending::Finished(totals))
    }

    /// One round's proposals: each champion of a profiled dtype is profiled (or its profile taken
    /// from the log), and every rule for a bottleneck it shows proposes a neighbour never proposed.
    async fn propose(
        &self,
        events: &mut Events,
        round: u32,
        log: &LoadedLog,
        before: &BTreeMap<(String, Dtype), Holder>,
        proposed_ever: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, (Variant, Proposal)>> {
        let project = self.project;
        let policy = &project.policies.guided;
        let params = params_of(&log);
        let mut proposals: BTreeMap<String, (Variant, Proposal)> = BTreeMap::new();
        let profiled_dtypes: Vec<Dtype> = project.policies.profile.dtypes.clone();
        for ((shape_name, dtype), holder) in before {
            if !profiled_dtypes.contains(dtype) {
                continue;
            }
            let Some(shape) = shape_named(&project.shapes, shape_name) else {
                continue;
            };
            let outcome = shared::profile_case(
                project,
                self.device,
                events,
                &log,
                self.run_dir,
                &holder.variant,
                shape,
                *dtype,
            )
            .await?;
            let bottlenecks = match outcome {
                Some(crate::gpu::profile::ProfileOutcome::Profiled { bottlenecks, .. }) => {
                    bottlenecks
                }
                _ => continue,
            };
            let Some(champion_params) = params.get(&holder.variant) else {
                continue;
            };
            for rule in policy
                .rules
                .iter()
                .filter(|r| bottlenecks.contains(&r.bottleneck))
            {
                let Some(next) = project.space.neighbour(champion_params, &rule.change) else {
                    continue;
                };
                if proposed_ever.contains(&next.id) || proposals.contains_key(&next.id) {
                    continue;
                }
                let why = Proposal {
                    round,
                    rule: rule.name.clone(),
                    bottleneck: rule.bottleneck.clone(),
                    from_variant: holder.variant.clone(),
                    shape: shape_name.clone(),
                    dtype: *dtype,
                };
                proposals.insert(next.id.clone(), (next, why));
            }
        }
        Ok(proposals)
    }

    /// Champions after a round, each change confirmed by re-timing old and new interleaved (A B A B) in one
    /// worker: a challenger whose gain does not beat `min_gain` and the noise of that duel stays out.
    async fn confirmed_champions(
        &self,
        events: &mut Events,
        round: u32,
        before: &BTreeMap<(String, Dtype), Holder>,
    ) -> Result<BTreeMap<(String, Dtype), Holder>> {
        let project = self.project;
        let policy = &project.policies.guided;
        // Each pass settles every unconfirmed change; a rejection can expose the runner-up, hence the loop.
        loop {
            let log = events.records();
            let after = champions(log);
            let judged = duel_verdicts(&log);
            let mut pairs = Vec::new();
            let mut names = Vec::new();
            for ((shape_name, dtype), new) in &after {
                let Some(old) = before.get(&(shape_name.clone(), *dtype)) else {
                    continue;
                };
                if old.variant == new.variant
                    || judged.contains_key(&(shape_name.clone(), *dtype, new.variant.clone()))
                {
                    continue;
                }
                let Some(shape) = shape_named(&project.shapes, shape_name) else {
                    continue;
                };
                let (Some(a), Some(b)) = (
                    shared::logged_case(project, &log, &old.variant, shape, *dtype),
                    shared::logged_case(project, &log, &new.variant, shape, *dtype),
                ) else {
                    continue;
                };
                pairs.push(crate::model::protocol::DuelPair {
                    champion: a.spec,
                    challenger: b.spec,
                });
                names.push((
                    shape.clone(),
                    *dtype,
                    old.variant.clone(),
                    new.variant.clone(),
                ));
            }
            if pairs.is_empty() {
                return Ok(after);
            }
            let measure = &project.policies.measure;
            let rounds = project.policies.step.rounds;
            let request = crate::model::protocol::DuelRequest {
                measure: crate::model::protocol::MeasureSpec {
                    warmup_ms: measure.warmup_ms,
                    samples: rounds,
                    min_sample_us: measure.min_sample_us,
                    verified_replays: measure.verified_replays,
                },
                rounds,
                pairs,
                stop_at_failure: false,
            };
            let timeout = std::time::Duration::from_secs(project.timeouts.worker_s * 2);
            let outcome = self
                .opts
                .executor
                .duel(self.device.ordinal, request, timeout)
                .await;
            for (i, (shape, dtype, champion, challenger)) in names.into_iter().enumerate() {
                let judged = crate::run::duel::judge_pair(
                    outcome.duels.get(i),
                    &outcome,
                    policy.min_gain,
                    &shape,
                    &self.opts.run.roofs,
                    project.policies.gates.plausibility_margin,
                );
                events.emit(Record::SearchDuel {
                    round,
                    shape: shape.name.clone(),
                    dtype,
                    champion,
                    challenger,
                    champion_us: judged.champion.map(|t| t.median_us),
                    challenger_us: judged.challenger.map(|t| t.median_us),
                    verdict: judged.verdict,
                    failure: judged.failure,
                })?;
            }
        }
    }

    /// The time limit fell between rounds: nothing more is profiled, measured or duelled.
    fn out_of_time(&self, totals: &mut Totals, events: &mut Events) -> Result<Option<Ending>> {
        let Some(reason) = self
            .opts
            .budget
            .time_limit_reason()
            .filter(|_| self.opts.budget.time_is_up())
        else {
            return Ok(None);
        };
        events.emit(Record::BudgetReached {
            reason: reason.clone(),
            variants_not_measured: Vec::new(),
        })?;
        events.emit(Record::SearchStopped {
            reason: format!("budget: {reason}"),
        })?;
        totals.budget_stop = Some(reason);
        Ok(Some(Ending::Finished(totals.clone())))
    }

    /// Add a round's totals; the ending to return when the round was interrupted or hit the budget.
    fn absorb(
        &self,
        ending: Ending,
        totals: &mut Totals,
        events: &mut Events,
    ) -> Result<Option<Ending>> {
        let (t, interrupted) = match ending {
            Ending::Finished(t) => (t, false),
            Ending::Interrupted(t) => (t, true),
        };
        totals.variants += t.variants;
        totals.measured += t.measured;
        totals.failed += t.failed;
        if interrupted {
            return Ok(Some(Ending::Interrupted(totals.clone())));
        }
        if let Some(reason) = t.budget_stop {
            totals.budget_stop = Some(reason.clone());
            events.emit(Record::SearchStopped {
                reason: format!("budget: {reason}"),
            })?;
            return Ok(Some(Ending::Finished(totals.clone())));
        }
        Ok(None)
    }
}

/// The run's budget less what earlier rounds used.
/// The time limit's clock is the run's, so it carries over as it is.
fn remaining(budget: &Budget, variants_so_far: usize) -> Budget {
    Budget {
        max_variants: budget
            .max_variants
            .map(|m| m.saturating_sub(variants_so_far)),
        ..budget.clone()
    }
}

/// Shapes of the run by name.
pub fn shape_named<'a>(shapes: &'a [Shape], name: &str) -> Option<&'a Shape> {
    shapes.iter().find(|s| s.name == name)
}
