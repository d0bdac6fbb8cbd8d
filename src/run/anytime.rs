//! Anytime runs: what a run takes from before it measures anything — the stored measurements it may reuse (`--reuse`), and under a budget the dispatch order that puts the likely winners first.
use crate::error::Result;
use crate::log::runlog::{EarlierFigure, Ranked, Record};
use crate::log::store::{self, Store};
use crate::model::config::Dtype;
use crate::model::plan::Strategy;
use crate::model::protocol::DeviceInfo;
use crate::model::space::{Params, PlannedPoint, REFERENCE};
use crate::run::budget::Budget;
use crate::run::scheduler::CaseKey;
use crate::run::shared::{Events, Project, Reuse, TuneOptions};
use std::collections::{BTreeMap, BTreeSet};

/// `--reuse` takes figures for points fixed up front; the guided search and ablations decide from
/// what they measure and profile themselves, so they measure everything.
pub fn refuse_reuse(reuse: Option<Reuse>, strategy: &Strategy) -> Result<()> {
    match strategy {
        Strategy::Exhaustive | Strategy::Random { .. } => Ok(()),
        _ if reuse.is_none() => Ok(()),
        other => Err(crate::error::Error::BadInput(format!(
            "--reuse works with the exhaustive and random strategies; this run is {} (it profiles and decides from what it measures itself): drop --reuse",
            other.label()
        ))),
    }
}

/// What the scheduler gets: the points to build and measure, in dispatch order, and the cases it must leave alone.
pub struct Prepared {
    pub planned: Vec<PlannedPoint>,
    /// Cases the store supplied (this session or, for a resumed run, an earlier one).
    pub reused: BTreeSet<CaseKey>,
    /// Under a time limit alone, the scheduler takes variants near the leaders ahead of the order;
    /// `--max-variants` measures exactly the order's first N.
    pub climb: bool,
}

/// Content addresses of the builds a run would make, computed without building (hashing the sources).
struct Keys<'p> {
    project: &'p Project,
    arch: &'p str,
    builder: crate::gpu::build::Builder,
    known: BTreeMap<(String, Dtype, u32), Option<String>>,
}

impl<'p> Keys<'p> {
    fn new(project: &'p Project, arch: &'p str) -> Self {
        Keys {
            project,
            arch,
            builder: project.builder(),
            known: BTreeMap::new(),
        }
    }

    fn forward(&mut self, point: &PlannedPoint, dtype: Dtype) -> Option<String> {
        let k = (point.variant.id.clone(), dtype, point.head_dim);
        if let Some(v) = self.known.get(&k) {
            return v.clone();
        }
        let spec = self.project.forward_spec(point, dtype, self.arch);
        let key = self.builder.key(&spec).ok();
        self.known.insert(k, key.clone());
        key
    }

    fn reference(&mut self, dtype: Dtype) -> Option<String> {
        let k = (REFERENCE.to_owned(), dtype, 0);
        if let Some(v) = self.known.get(&k) {
            return v.clone();
        }
        let spec = self.project.reference_spec(dtype, self.arch);
        let key = self.builder.key(&spec).ok();
        self.known.insert(k, key.clone());
        key
    }
}

/// Before the scheduler starts: log the cases the store supplies, and under a budget the dispatch
/// order. Only runs that fix their points up front (exhaustive, random) do either: the guided
/// search and ablations choose as they measure.
pub fn prepare(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
    done: &BTreeSet<String>,
    planned: &[PlannedPoint],
    budget: &Budget,
) -> Result<Prepared> {
    let mut prepared = Prepared {
        planned: planned.to_vec(),
        reused: BTreeSet::new(),
        climb: false,
    };
    if !matches!(
        opts.strategy,
        Strategy::Exhaustive | Strategy::Random { .. }
    ) {
        return Ok(prepared);
    }
    let budgeted = budget.max_variants.is_some() || budget.time_limit.is_some();
    let store = if opts.reuse.is_some() || budgeted {
        open_store(project, opts.reuse.is_some())
    } else {
        None
    };
    let mut keys = Keys::new(project, &device.arch);
    let todo: Vec<&PlannedPoint> = planned
        .iter()
        .filter(|p| p.invalid.is_none() && !done.contains(&p.variant.id))
        .collect();
    prepared.reused = reuse(
        project,
        device,
        opts,
        events,
        &todo,
        store.as_ref(),
        &mut keys,
    )?;

    // A variant the store supplied whole needs no build and no GPU: it is done already.
    let mut whole: BTreeSet<String> = BTreeSet::new();
    let mut cases_of: BTreeMap<&str, Vec<CaseKey>> = BTreeMap::new();
    for p in &todo {
        for shape in project.shapes.iter().filter(|s| s.d == p.head_dim) {
            for &dtype in &project.policies.dtypes {
                cases_of.entry(&p.variant.id).or_default().push((
                    p.variant.id.clone(),
                    shape.name.clone(),
                    dtype,
                ));
            }
        }
    }
    for p in &todo {
        let cases = &cases_of[p.variant.id.as_str()];
        if !cases.is_empty()
            && cases.iter().all(|c| prepared.reused.contains(c))
            && whole.insert(p.variant.id.clone())
        {
            events.emit(Record::VariantDone {
                variant: p.variant.id.clone(),
                measured_cases: 0,
            })?;
        }
    }
    prepared
        .planned
        .retain(|p| !whole.contains(&p.variant.id) && !done.contains(&p.variant.id));

    prepared.climb = budget.time_limit.is_some() && budget.max_variants.is_none();
    if budgeted {
        let known = known_champions(project, device, store.as_ref());
        let rules = &project.policies.guided.rules;
        let mut order = best_first(&project.space, rules, &prepared.planned, &known);
        if let Some(store) = &store {
            add_earlier_figures(
                project,
                device,
                store,
                &prepared.planned,
                &mut keys,
                &mut order,
            );
        }
        let rank: BTreeMap<&str, usize> =
            order.iter().map(|r| (r.variant.as_str(), r.rank)).collect();
        // Stable: a variant's head dims keep their order, so builds start in dispatch order too.
        prepared.planned.sort_by_key(|p| {
            rank.get(p.variant.id.as_str())
                .copied()
                .unwrap_or(usize::MAX)
        });
        events.emit(Record::DispatchOrder { order })?;
    }
    Ok(prepared)
}

/// The store, when there is one to read (created for `--reuse`, so the run fills it from the start).
fn open_store(project: &Project, create: bool) -> Option<Store> {
    let path = store::path(&project.paths);
    let opened = if create {
        Store::open(&path).map(Some)
    } else {
        Store::open_existing(&path)
    };
    opened.unwrap_or_else(|e| {
        crate::tell!("warning: results store not read: {e:#}; nothing is reused and the order knows no earlier run");
        None
    })
}

/// Log what the store supplies (`reused`) and what it could have but is measured again to confirm
/// (`confirming`); returns every case supplied, this session's and a resumed run's earlier ones.
fn reuse(
    project: &Project,
    device: &DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
    todo: &[&PlannedPoint],
    store: Option<&Store>,
    keys: &mut Keys,
) -> Result<BTreeSet<CaseKey>> {
    // A resumed run keeps what it already took from the store, and what it chose to confirm.
    let mut reused: BTreeSet<CaseKey> = BTreeSet::new();
    let mut confirming: BTreeSet<CaseKey> = BTreeSet::new();
    for (_, e) in &events.records().entries {
        match &e.record {
            Record::Reused {
                variant,
                shape,
                dtype,
                ..
            } => {
                reused.insert((variant.clone(), shape.clone(), *dtype));
            }
            Record::Confirming {
                variant,
                shape,
                dtype,
                ..
            } => {
                confirming.insert((variant.clone(), shape.clone(), *dtype));
            }
            _ => {}
        }
    }
    let (Some(want), Some(store)) = (opts.reuse, store) else {
        return Ok(reused);
    };
    let mut found: BTreeMap<(String, Dtype), Vec<(String, store::Stored)>> = BTreeMap::new();
    // A sealed row is taken only when the sealed log line it cites says the same; the first refusal
    // is said with its reason, the rest counted.
    let mut cited = store::CitedLogs::new(project.paths.runs());
    let mut refused: Vec<String> = Vec::new();
    for p in todo {
        for shape in project.shapes.iter().filter(|s| s.d == p.head_dim) {
            let geometry = store::geometry(shape);
            for &dtype in &project.policies.dtypes {
                let case = (p.variant.id.clone(), shape.name.clone(), dtype);
                if reused.contains(&case) || confirming.contains(&case) {
                    continue;
                }
                let (Some(build), Some(reference)) =
                    (keys.forward(p, dtype), keys.reference(dtype))
                else {
                    continue;
                };
                let key = store::Key {
                    gpu: &device.name,
                    driver: device.driver_version,
                    nvcc: &project.toolchain.version,
                    fake: device.fake,
                    build_key: &build,
                    reference_key: &reference,
                    geometry: &geometry,
                    dtype,
                };
                match store.lookup(&key) {
                    Ok(Some(stored)) => match cited.check(&stored) {
                        Ok(()) => found
                            .entry((shape.name.clone(), dtype))
                            .or_default()
                            .push((p.variant.id.clone(), stored)),
                        Err(why) => refused
                            .push(format!("{} on {} {dtype}: {why}", p.variant.id, shape.name)),
                    },
                    Ok(None) => {}
                    Err(e) => {
                        crate::tell!(
                            "warning: results store not read: {e:#}; the case is measured"
                        );
                    }
                }
            }
        }
    }
    if let Some(first) = refused.first() {
        crate::tell!(
            "--reuse: a stored figure does not match the log record it cites, so it is measured afresh: {first}{}",
            match refused.len() - 1 {
                0 => String::new(),
                more => format!(" ({more} more stored figure(s) refused the same way)"),
            }
        );
    }
    for ((shape, dtype), mut cases) in found {
        cases.sort_by(|a, b| a.1.timing.median_us.total_cmp(&b.1.timing.median_us));
        for (n, (variant, stored)) in cases.into_iter().enumerate() {
            if n < want.confirm {
                events.emit(Record::Confirming {
                    variant,
                    shape: shape.clone(),
                    dtype,
                    stored_median_us: stored.timing.median_us,
                    from_run: stored.row.origin_run,
                    from_line: stored.row.origin_line,
                })?;
                continue;
            }
            reused.insert((variant.clone(), shape.clone(), dtype));
            events.emit(Record::Reused {
                variant,
                shape: shape.clone(),
                dtype,
                kv_splits: stored.row.kv_splits,
                timing: stored.timing,
                from_run: stored.row.origin_run,
                from_line: stored.row.origin_line,
            })?;
        }
    }
    Ok(reused)
}

/// The champions known before this run: the committed table's, then earlier runs' on this GPU
/// model (newest first), each with its newest profile's bottlenecks where the store has one.
fn known_champions(
    project: &Project,
    device: &DeviceInfo,
    store: Option<&Store>,
) -> Vec<KnownChampion> {
    let shapes = &project.shapes;
    let by_geometry = |g: &str| shapes.iter().find(|s| store::geometry(s) == g);
    let mut known = Vec::new();
    for c in crate::report::champions::committed(&project.paths.root, &project.champion_table()) {
        known.push(KnownChampion {
            from: KnownFrom::Committed,
            params: c.params,
            shape: c.shape,
            dtype: c.dtype,
            median_us: c.median_us,
            profile: None,
        });
    }
    if let Some(store) = store {
        match store.champions(&device.name, device.fake) {
            Ok(stored) => {
                for c in stored {
                    // Only this run's shapes: a champion elsewhere says little about these.
                    let Some(shape) = by_geometry(&c.geometry) else {
                        continue;
                    };
                    known.push(KnownChampion {
                        from: KnownFrom::Run(c.run_id),
                        params: c.params,
                        shape: shape.name.clone(),
                        dtype: c.dtype,
                        median_us: c.median_us,
                        profile: None,
                    });
                }
            }
            Err(e) => crate::tell!("warning: results store not read: {e:#}"),
        }
        for k in &mut known {
            let Some(shape) = shapes.iter().find(|s| s.name == k.shape) else {
                continue;
            };
            k.profile = store
                .bottlenecks(
                    &device.name,
                    device.fake,
                    &k.params,
                    &store::geometry(shape),
                    k.dtype,
                )
                .ok()
                .flatten();
        }
    }
    known
}

/// Note on each ranked variant what the store holds of it on this GPU model: its best figure per
/// (shape, dtype) of this run, and whether it was measured on the build this run would make.
fn add_earlier_figures(
    project: &Project,
    device: &DeviceInfo,
    store: &Store,
    planned: &[PlannedPoint],
    keys: &mut Keys,
    order: &mut [Ranked],
) {
    for r in order.iter_mut() {
        let Some(point) = planned.iter().find(|p| p.variant.id == r.variant) else {
            continue;
        };
        let Ok(figures) = store.figures(&device.name, device.fake, &point.variant.params) else {
            continue;
        };
        let mut best: BTreeMap<(String, Dtype), EarlierFigure> = BTreeMap::new();
        for f in figures {
            let Some(shape) = project
                .shapes
                .iter()
                .find(|s| store::geometry(s) == f.geometry)
            else {
                continue;
            };
            let at_d = planned
                .iter()
                .find(|p| p.variant.id == r.variant && p.head_dim == shape.d);
            let current = at_d.is_some_and(|p| {
                keys.forward(p, f.dtype).as_deref() == Some(f.build_key.as_str())
                    && keys.reference(f.dtype).as_deref() == Some(f.reference_key.as_str())
                    && f.driver == device.driver_version
                    && f.nvcc == project.toolchain.version
            });
            let figure = EarlierFigure {
                shape: shape.name.clone(),
                dtype: f.dtype,
                median_us: f.median_us,
                run: f.origin_run,
                line: f.origin_line,
                current,
            };
            let k = (shape.name.clone(), f.dtype);
            // The current build's figure outranks an older build's; then the faster.
            let better = best
                .get(&k)
                .is_none_or(|b| (figure.current, -figure.median_us) > (b.current, -b.median_us));
            if better {
                best.insert(k, figure);
            }
        }
        r.earlier = best.into_values().collect();
    }
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

/// The variants not placed yet, spread: each next one the farthest (most parameters different)
/// from every variant before it; the space's order breaks ties. Past [`MAX_SPREAD_ORDERED`] the
/// rest keep the space's order.
fn place_the_rest_spread(
    variants: &[(&str, &Params)],
    placed: &mut Vec<(usize, crate::log::runlog::RankReason, String)>,
) {
    use crate::log::runlog::RankReason;
    let rest: Vec<usize> = (0..variants.len())
        .filter(|&i| !placed.iter().any(|p| p.0 == i))
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
        let distance =
            |a: usize, b: usize| crate::model::space::differing(variants[a].1, variants[b].1);
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
}

/// The dispatch order of a budgeted run, best first: the committed champions, earlier runs'
/// champions (those that won the most cases first, then the newest), the neighbours the `[guided]`
/// rules propose from those champions' earlier profiles, then the rest, each next one as unlike
/// the variants before it as the space allows (the most parameters different), so that a run cut
/// short has seen every corner of the space rather than one corner in full; the baseline last.
pub fn best_first(
    space: &crate::model::space::Space,
    rules: &[crate::model::config::GuidedRule],
    planned: &[PlannedPoint],
    known: &[KnownChampion],
) -> Vec<crate::log::runlog::Ranked> {
    use crate::log::runlog::{RankReason, Ranked};
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
                crate::model::space::variant_id(&k.params),
                k.shape,
                k.dtype,
                rule.bottleneck
            );
            placed.push((i, RankReason::Guided, reason));
        }
    }

    // The baseline is what every figure is compared with, not a contender: last, where every case
    // has a race bar and a slow baseline stops after a few samples (first, it was timed in full on
    // every case, 26 s of a 442 s run of the attention space on an H200). A champion stays where
    // its evidence put it.
    let baseline = space.baseline_id();
    let baseline_at = variants
        .iter()
        .position(|(id, _)| *id == baseline)
        .filter(|&i| !is_placed(&placed, i));
    if let Some(i) = baseline_at {
        placed.push((i, RankReason::Baseline, String::new()));
    }
    place_the_rest_spread(&variants, &mut placed);
    if let Some(i) = baseline_at {
        let at = placed.iter().position(|p| p.0 == i).expect("placed above");
        placed.remove(at);
        placed.push((
            i,
            RankReason::Baseline,
            "the space's baseline, last: every figure is compared with it, and timed after \
             every case has a best it stops after a few samples"
                .into(),
        ));
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
