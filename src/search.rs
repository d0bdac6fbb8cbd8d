//! How a run chooses what to measure: the whole space, a random sample, the guided search (profile → bottleneck → neighbours), or an ablation.
use crate::config::{Dtype, Shape};
use crate::engine::{self, Events, Project};
use crate::error::Result;
use crate::protocol::{DeviceInfo, TimingStats};
use crate::runlog::{LoadedLog, Record};
use crate::scheduler::{Budget, Ending, Totals};
use crate::space::{Params, PlannedPoint, Variant};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;
use std::time::Instant;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Strategy {
    /// Every valid point of the space (or every step of a chain).
    #[default]
    Exhaustive,
    /// `count` valid points drawn without replacement, reproducibly from `seed`.
    Random { count: usize, seed: u64 },
    /// Start point, then neighbours proposed by the policy's rules from each champion's bottleneck.
    Guided,
    /// One factor at a time around `champion` (taken from run `parent_run`): each parameter set back to the baseline's value.
    Ablate {
        parent_run: String,
        champion: Params,
    },
}

impl Strategy {
    pub fn label(&self) -> String {
        match self {
            Strategy::Exhaustive => "exhaustive".into(),
            Strategy::Random { count, seed } => format!("random ({count} points, seed {seed})"),
            Strategy::Guided => "guided".into(),
            Strategy::Ablate { parent_run, .. } => {
                format!("ablate (around run {parent_run}'s champion)")
            }
        }
    }
}

/// Why the guided search tried a point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub round: u32,
    pub rule: String,
    pub bottleneck: String,
    /// The champion it is a neighbour of, and where that champion was champion.
    pub from_variant: String,
    pub shape: String,
    pub dtype: Dtype,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundChampion {
    pub shape: String,
    pub dtype: Dtype,
    pub variant: String,
    pub median_us: f64,
}

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

/// Noise-aware: the challenger must be faster by more than `min_gain` and by more than either one's p10..p90 spread.
pub fn beats(challenger: &TimingStats, champion: &TimingStats, min_gain: f64) -> bool {
    let spread = |t: &TimingStats| (t.p90_us - t.p10_us) / t.median_us;
    let gain = champion.median_us / challenger.median_us - 1.0;
    gain > min_gain && gain > spread(challenger).max(spread(champion))
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

/// Champions per (shape, dtype) over the log's timed records, in the order they were measured;
/// a challenger that lost its interleaved re-timing on a case never becomes champion there.
fn champions(log: &LoadedLog, min_gain: f64) -> BTreeMap<(String, Dtype), Holder> {
    let lost: BTreeSet<(String, Dtype, String)> = duel_verdicts(log)
        .into_iter()
        .filter(|(_, accepted)| !accepted)
        .map(|(k, _)| k)
        .collect();
    // A variant wrong (or implausible) on any case is nobody's champion, as in the reports.
    let index = crate::runindex::RunIndex::new(log);
    let mut out: BTreeMap<(String, Dtype), Holder> = BTreeMap::new();
    for t in log.timed() {
        let key = (t.shape.to_owned(), t.dtype);
        if lost.contains(&(t.shape.to_owned(), t.dtype, t.variant.to_owned()))
            || index.disqualified(t.variant).is_some()
        {
            continue;
        }
        let replace = out
            .get(&key)
            .is_none_or(|h| beats(t.timing, &h.timing, min_gain));
        if replace {
            out.insert(
                key,
                Holder {
                    variant: t.variant.to_owned(),
                    timing: t.timing.clone(),
                },
            );
        }
    }
    out
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
    pub opts: &'a engine::TuneOptions,
    /// Variants a resumed run already finished: proposed again, never measured again.
    pub done: &'a BTreeSet<String>,
    pub run_dir: &'a Path,
}

impl Guided<'_> {
    /// Rounds of: champions → their bottlenecks (ncu) → the rules' neighbours → measure; until no neighbour helps.
    pub async fn run(
        &self,
        events: &mut Events,
        limits: &crate::space::DeviceLimits,
    ) -> Result<Ending> {
        let project = self.project;
        let policy = &project.policies.guided;
        let head_dims = project.head_dims();
        let started = Instant::now();
        let mut totals = Totals::default();
        let start = Variant {
            id: crate::space::variant_id(
                project
                    .space
                    .start
                    .as_ref()
                    .unwrap_or(&project.space.baseline),
            ),
            params: project
                .space
                .start
                .clone()
                .unwrap_or_else(|| project.space.baseline.clone()),
            step: None,
        };
        let mut proposed_ever: BTreeSet<String> = BTreeSet::from([start.id.clone()]);
        let points = project.space.plan_points(&[start], &head_dims, limits)?;
        let ending = engine::measure_points(
            project,
            self.device,
            self.opts,
            events,
            self.done,
            &points,
            &BTreeMap::new(),
            &self.opts.budget,
        )
        .await?;
        if let Some(stop) = self.absorb(ending, &mut totals, events)? {
            return Ok(stop);
        }
        for round in 1..=policy.max_rounds {
            let log = crate::runlog::read(&events.log.path)?;
            let before = champions(&log, policy.min_gain);
            let params = params_of(&log);
            let mut proposals: BTreeMap<String, (Variant, Proposal)> = BTreeMap::new();
            let profiled_dtypes: Vec<Dtype> = project.policies.profile.dtypes.clone();
            for ((shape_name, dtype), holder) in &before {
                if !profiled_dtypes.contains(dtype) {
                    continue;
                }
                let Some(shape) = shape_named(&project.shapes, shape_name) else {
                    continue;
                };
                let outcome = engine::profile_case(
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
                    Some(crate::profile::ProfileOutcome::Profiled { bottlenecks, .. }) => {
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
            let budget = remaining(&self.opts.budget, totals.variants, started);
            let ending = engine::measure_points(
                project,
                self.device,
                self.opts,
                events,
                self.done,
                &points,
                &reasons,
                &budget,
            )
            .await?;
            if let Some(stop) = self.absorb(ending, &mut totals, events)? {
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
            let log = crate::runlog::read(&events.log.path)?;
            let after = champions(&log, policy.min_gain);
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
                    engine::logged_case(project, &log, &old.variant, shape, *dtype),
                    engine::logged_case(project, &log, &new.variant, shape, *dtype),
                ) else {
                    continue;
                };
                pairs.push(crate::protocol::DuelPair {
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
            let request = crate::protocol::DuelRequest {
                measure: crate::protocol::MeasureSpec {
                    warmup_ms: measure.warmup_ms,
                    samples: rounds,
                    min_sample_us: measure.min_sample_us,
                },
                rounds,
                pairs,
            };
            let timeout = std::time::Duration::from_secs(project.timeouts.worker_s * 2);
            let outcome = self
                .opts
                .executor
                .duel(self.device.ordinal, request, timeout)
                .await;
            for (i, (shape, dtype, champion, challenger)) in names.into_iter().enumerate() {
                let judged = crate::step::judge_pair(
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
fn remaining(budget: &Budget, variants_so_far: usize, started: Instant) -> Budget {
    Budget {
        max_variants: budget
            .max_variants
            .map(|m| m.saturating_sub(variants_so_far)),
        time_limit: budget
            .time_limit
            .map(|t| t.saturating_sub(started.elapsed())),
    }
}

/// Shapes of the run by name.
pub fn shape_named<'a>(shapes: &'a [Shape], name: &str) -> Option<&'a Shape> {
    shapes.iter().find(|s| s.name == name)
}

/// The report's guided-search section: every proposal, the rule behind it, and what it measured.
pub fn proposals_section(log: &LoadedLog) -> Option<String> {
    let proposals: Vec<(String, Proposal, Option<String>)> = log
        .entries
        .iter()
        .filter_map(|(_, e)| match &e.record {
            Record::Planned {
                variant,
                proposed_by: Some(p),
                invalid,
                ..
            } => Some((variant.clone(), p.clone(), invalid.clone())),
            _ => None,
        })
        .collect();
    let rounds: Vec<&Record> = log
        .entries
        .iter()
        .map(|(_, e)| &e.record)
        .filter(|r| {
            matches!(
                r,
                Record::SearchRound { .. }
                    | Record::SearchStopped { .. }
                    | Record::SearchDuel { .. }
            )
        })
        .collect();
    if proposals.is_empty() && rounds.is_empty() {
        return None;
    }
    let best: BTreeMap<(String, String, Dtype), (f64, usize)> = log
        .timed()
        .map(|t| {
            (
                (t.variant.to_owned(), t.shape.to_owned(), t.dtype),
                (t.timing.median_us, t.line),
            )
        })
        .collect();
    let mut s = String::new();
    let _ = writeln!(s, "## Guided search\n");
    for r in &rounds {
        match r {
            Record::SearchRound {
                round,
                champions,
                proposed,
            } => {
                let from: BTreeSet<&str> = champions.iter().map(|c| c.variant.as_str()).collect();
                let _ = writeln!(
                    s,
                    "- round {round}: champions {} → {} proposal(s)",
                    from.iter()
                        .map(|v| format!("`{v}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    proposed.len()
                );
            }
            Record::SearchStopped { reason } => {
                let _ = writeln!(s, "- stopped: {reason}");
            }
            Record::SearchDuel {
                shape,
                dtype,
                champion,
                challenger,
                champion_us,
                challenger_us,
                verdict,
                failure,
                ..
            } => {
                let times = match (champion_us, challenger_us) {
                    (Some(a), Some(b)) => format!(" ({a:.1} → {b:.1} µs)"),
                    _ => String::new(),
                };
                let outcome = match (verdict, failure) {
                    (Some(v), _) if v.accept => format!("new champion: {}", v.reason),
                    (Some(v), _) => format!("kept `{champion}`: {}", v.reason),
                    (None, Some(why)) => format!("kept `{champion}`: {why}"),
                    (None, None) => format!("kept `{champion}`"),
                };
                let _ = writeln!(
                    s,
                    "  - interleaved re-timing on {shape} {dtype}: `{challenger}` vs `{champion}`{times} → {outcome}"
                );
            }
            _ => {}
        }
    }
    let _ = writeln!(s, "\n| round | proposed variant | rule | bottleneck seen | from champion | on | its µs | champion's µs there | result |");
    let _ = writeln!(s, "|---:|---|---|---|---|---|---:|---:|---|");
    let mut seen = BTreeSet::new();
    for (variant, p, invalid) in &proposals {
        if !seen.insert((variant.clone(), p.round)) {
            continue; // one row per (variant, round), not per head dim
        }
        let on = format!("{} {}", p.shape, p.dtype);
        let mine = best.get(&(variant.clone(), p.shape.clone(), p.dtype));
        let theirs = best.get(&(p.from_variant.clone(), p.shape.clone(), p.dtype));
        let (mine_s, result) = match (mine, invalid) {
            (Some((us, line)), _) => (
                format!("{us:.1} (line {line})"),
                match theirs {
                    Some((t, _)) => format!("{:.2}× vs champion", t / us),
                    None => "measured".into(),
                },
            ),
            (None, Some(why)) if !why.is_empty() => ("—".into(), format!("not run: {why}")),
            (None, _) => ("—".into(), "not timed on this shape (see failures)".into()),
        };
        let theirs_s = theirs.map_or("—".into(), |(t, line)| format!("{t:.1} (line {line})"));
        let _ = writeln!(
            s,
            "| {} | `{variant}` | {} | {} | `{}` | {on} | {mine_s} | {theirs_s} | {result} |",
            p.round, p.rule, p.bottleneck, p.from_variant
        );
    }
    Some(s)
}

/// Where a champion known before a run comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum KnownFrom {
    /// The champion table committed at HEAD.
    Committed,
    /// An earlier run's fastest on this GPU model, from the results store.
    Run(String),
}

/// A champion known before a run starts, on one of the run's (shape, dtype) where it can be named so.
#[derive(Debug, Clone)]
pub struct KnownChampion {
    pub from: KnownFrom,
    pub params: Params,
    pub shape: String,
    pub dtype: Dtype,
    pub median_us: f64,
    /// Its newest profile on that shape on this GPU model: the run that took it and the bottlenecks named.
    pub profile: Option<(String, Vec<String>)>,
}

/// Past this many variants the spread order costs more than it is worth: the rest keep the space's order.
const MAX_SPREAD_ORDERED: usize = 20_000;

/// The dispatch order of a budgeted run, best first: the committed champions, earlier runs'
/// champions (those that won the most cases first, then the newest), the neighbours the `[guided]`
/// rules propose from those champions' earlier profiles, then the rest, each next one as unlike
/// the variants before it as the space allows (the most parameters different), so that a run cut
/// short has seen every corner of the space rather than one corner in full.
pub fn best_first(
    space: &crate::space::Space,
    rules: &[crate::config::GuidedRule],
    planned: &[PlannedPoint],
    known: &[KnownChampion],
) -> Vec<crate::runlog::Ranked> {
    use crate::runlog::{RankReason, Ranked};
    let mut variants: Vec<(&str, &Params)> = Vec::new();
    for p in planned.iter().filter(|p| p.invalid.is_none()) {
        if !variants.iter().any(|(id, _)| *id == p.variant.id) {
            variants.push((&p.variant.id, &p.variant.params));
        }
    }
    let find = |params: &Params| variants.iter().position(|(_, p)| *p == params);
    let mut placed: Vec<(usize, RankReason, String)> = Vec::new();
    let is_placed =
        |placed: &[(usize, RankReason, String)], i: usize| placed.iter().any(|p| p.0 == i);
    let list = |cases: &[String]| {
        const SHOWN: usize = 4;
        let mut s = cases
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if cases.len() > SHOWN {
            s.push_str(&format!(" and {} more", cases.len() - SHOWN));
        }
        s
    };

    // Champions, committed first: per variant the cases it holds, most cases first.
    for (kind, committed) in [
        (RankReason::Committed, true),
        (RankReason::EarlierChampion, false),
    ] {
        let mut held: Vec<(usize, Vec<String>)> = Vec::new();
        for k in known
            .iter()
            .filter(|k| (k.from == KnownFrom::Committed) == committed)
        {
            let Some(i) = find(&k.params) else { continue };
            if is_placed(&placed, i) {
                continue;
            }
            let case = match &k.from {
                KnownFrom::Committed => format!("{} {}", k.shape, k.dtype),
                KnownFrom::Run(run) => {
                    format!(
                        "{} {} in run {run} ({:.1} µs)",
                        k.shape, k.dtype, k.median_us
                    )
                }
            };
            match held.iter_mut().find(|h| h.0 == i) {
                Some(h) => h.1.push(case),
                None => held.push((i, vec![case])),
            }
        }
        // Stable: among equals, the first seen (the newest run, or the table's order) leads.
        held.sort_by_key(|h| std::cmp::Reverse(h.1.len()));
        for (i, cases) in held {
            let reason = if committed {
                format!("committed champion for {}", list(&cases))
            } else {
                format!("champion of {}", list(&cases))
            };
            placed.push((i, kind, reason));
        }
    }

    // The guided rules, applied to the known champions' earlier bottlenecks.
    for k in known {
        let Some((run, bottlenecks)) = &k.profile else {
            continue;
        };
        for rule in rules.iter().filter(|r| bottlenecks.contains(&r.bottleneck)) {
            let Some(next) = space.neighbour(&k.params, &rule.change) else {
                continue;
            };
            let Some(i) = find(&next.params) else {
                continue;
            };
            if is_placed(&placed, i) {
                continue;
            }
            let reason = format!(
                "guided: {}, from `{}` on {} {} ({} in run {run}'s profile)",
                rule.name,
                crate::space::variant_id(&k.params),
                k.shape,
                k.dtype,
                rule.bottleneck
            );
            placed.push((i, RankReason::Guided, reason));
        }
    }

    // The rest, spread: each next variant the one farthest (most parameters different) from
    // everything before it; the space's order breaks ties.
    let rest: Vec<usize> = (0..variants.len())
        .filter(|&i| !is_placed(&placed, i))
        .collect();
    if rest.len() > MAX_SPREAD_ORDERED {
        for i in rest {
            placed.push((
                i,
                RankReason::Spread,
                "remaining, in the space's order".into(),
            ));
        }
    } else {
        let distance = |a: usize, b: usize| {
            let (pa, pb) = (variants[a].1, variants[b].1);
            pa.iter().filter(|(k, v)| pb.get(*k) != Some(*v)).count()
                + pb.keys().filter(|k| !pa.contains_key(*k)).count()
        };
        let mut nearest: Vec<usize> = rest
            .iter()
            .map(|&i| {
                placed
                    .iter()
                    .map(|p| distance(i, p.0))
                    .min()
                    .unwrap_or(usize::MAX)
            })
            .collect();
        let mut left: Vec<bool> = vec![true; rest.len()];
        for _ in 0..rest.len() {
            let mut pick: Option<usize> = None;
            for j in (0..rest.len()).filter(|&j| left[j]) {
                if pick.is_none_or(|p| nearest[j] > nearest[p]) {
                    pick = Some(j);
                }
            }
            let j = pick.expect("a variant is left");
            left[j] = false;
            let reason = if nearest[j] == usize::MAX {
                "remaining, spread: the first of the space".to_owned()
            } else {
                format!(
                    "remaining, spread: {} parameter(s) unlike any variant before it",
                    nearest[j]
                )
            };
            placed.push((rest[j], RankReason::Spread, reason));
            for k in (0..rest.len()).filter(|&k| left[k]) {
                nearest[k] = nearest[k].min(distance(rest[k], rest[j]));
            }
        }
    }
    placed
        .into_iter()
        .enumerate()
        .map(|(n, (i, why, reason))| Ranked {
            rank: n + 1,
            variant: variants[i].0.to_owned(),
            why,
            reason,
            earlier: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runlog::RankReason;
    use crate::space::{DeviceLimits, ParamValue, Space};

    fn smoke() -> (Space, Vec<PlannedPoint>) {
        let space = Space::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("variants/smoke.toml"))
            .expect("the smoke space loads");
        let limits = DeviceLimits {
            max_threads_per_block: 1024,
            max_smem_optin_bytes: 232448,
        };
        let planned = space
            .plan(&BTreeSet::from([64]), &limits)
            .expect("the smoke space plans");
        (space, planned)
    }

    fn params_of(planned: &[PlannedPoint], id: &str) -> Params {
        planned
            .iter()
            .find(|p| p.variant.id == id)
            .map(|p| p.variant.params.clone())
            .unwrap_or_else(|| panic!("no {id}"))
    }

    fn champion(from: KnownFrom, params: Params, profile: Option<&str>) -> KnownChampion {
        KnownChampion {
            from,
            params,
            shape: "small".into(),
            dtype: Dtype::F16,
            median_us: 4.5,
            profile: profile.map(|b| ("r1".to_owned(), vec![b.to_owned()])),
        }
    }

    #[test]
    fn committed_then_earlier_then_guided_then_spread() {
        let (space, planned) = smoke();
        let rule = crate::config::GuidedRule {
            bottleneck: "grid too small (waves < 1)".into(),
            name: "waves < 1: more KV splits".into(),
            change: [("KV_SPLIT".to_owned(), ParamValue::Name("up".into()))]
                .into_iter()
                .collect(),
        };
        let known = [
            // Listed first, but an earlier run's word counts for less than the committed table's.
            champion(
                KnownFrom::Run("r1".into()),
                params_of(&planned, "scalar-bm64-bn64-w4-ks1-s1"),
                Some("grid too small (waves < 1)"),
            ),
            champion(
                KnownFrom::Committed,
                params_of(&planned, "wmma-bm64-bn64-w4-ks4-s1"),
                None,
            ),
        ];
        let order = best_first(&space, &[rule], &planned, &known);
        let got: Vec<(&str, RankReason)> =
            order.iter().map(|r| (r.variant.as_str(), r.why)).collect();
        assert_eq!(
            got,
            [
                ("wmma-bm64-bn64-w4-ks4-s1", RankReason::Committed),
                ("scalar-bm64-bn64-w4-ks1-s1", RankReason::EarlierChampion),
                ("scalar-bm64-bn64-w4-ks4-s1", RankReason::Guided),
                ("wmma-bm64-bn64-w4-ks1-s1", RankReason::Spread),
            ]
        );
        assert_eq!(
            order.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert!(order[0].reason.contains("committed champion for small f16"));
        assert!(order[1].reason.contains("run r1"), "{}", order[1].reason);
        assert!(
            order[2]
                .reason
                .starts_with("guided: waves < 1: more KV splits"),
            "{}",
            order[2].reason
        );
    }

    #[test]
    fn without_evidence_the_order_spreads_over_the_space() {
        let (space, planned) = smoke();
        let order = best_first(&space, &[], &planned, &[]);
        let ids: Vec<&str> = order.iter().map(|r| r.variant.as_str()).collect();
        // The second differs from the first in both parameters that vary, then the rest.
        assert_eq!(
            ids,
            [
                "scalar-bm64-bn64-w4-ks1-s1",
                "wmma-bm64-bn64-w4-ks4-s1",
                "scalar-bm64-bn64-w4-ks4-s1",
                "wmma-bm64-bn64-w4-ks1-s1",
            ]
        );
        assert!(order.iter().all(|r| r.why == RankReason::Spread));
    }
}
