//! Anytime runs: what a run takes from before it measures anything — the stored measurements it may reuse (`--reuse`), and under a budget the dispatch order that puts the likely winners first.
use crate::config::Dtype;
use crate::engine::{Events, Project, TuneOptions, REFERENCE};
use crate::error::Result;
use crate::protocol::DeviceInfo;
use crate::runlog::{EarlierFigure, Ranked, Record};
use crate::scheduler::Budget;
use crate::search::{KnownChampion, KnownFrom, Strategy};
use crate::space::PlannedPoint;
use crate::store::{self, Store};
use std::collections::{BTreeMap, BTreeSet};

/// `--reuse`: cases the results store already measured are taken from it, not measured again.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reuse {
    /// Per (shape, dtype), the N fastest stored cases are measured again to confirm them.
    pub confirm: usize,
}

/// A (variant, shape, dtype).
pub type CaseKey = (String, String, Dtype);

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
}

/// Content addresses of the builds a run would make, computed without building (hashing the sources).
struct Keys<'p> {
    project: &'p Project,
    arch: &'p str,
    builder: crate::build::Builder,
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

    if budgeted {
        let known = known_champions(project, device, store.as_ref());
        let rules = &project.policies.guided.rules;
        let mut order = crate::search::best_first(&project.space, rules, &prepared.planned, &known);
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
        eprintln!("warning: results store not read: {e:#}; nothing is reused and the order knows no earlier run");
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
    let log = crate::runlog::read(&events.log.path)?;
    let mut reused: BTreeSet<CaseKey> = BTreeSet::new();
    let mut confirming: BTreeSet<CaseKey> = BTreeSet::new();
    for (_, e) in &log.entries {
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
                    Ok(Some(stored)) => found
                        .entry((shape.name.clone(), dtype))
                        .or_default()
                        .push((p.variant.id.clone(), stored)),
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("warning: results store not read: {e:#}; the case is measured");
                    }
                }
            }
        }
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
                    from_run: stored.origin_run,
                    from_line: stored.origin_line,
                })?;
                continue;
            }
            reused.insert((variant.clone(), shape.clone(), dtype));
            events.emit(Record::Reused {
                variant,
                shape: shape.clone(),
                dtype,
                kv_splits: stored.kv_splits,
                timing: stored.timing,
                from_run: stored.origin_run,
                from_line: stored.origin_line,
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
    for c in crate::champions::committed(&project.paths.root, &project.champion_table()) {
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
            Err(e) => eprintln!("warning: results store not read: {e:#}"),
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
