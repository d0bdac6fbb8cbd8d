//! Where each second of a run went, lane by lane: the builds, each GPU's workers, and the stages
//! that hold a GPU outside the workers (the roofs, the re-duels, the profiles, the reference
//! library). From the log's own times: a worker's, a build's and a stage's spans are in their
//! records (`worker_ran`, `built`, `stage_ran`). A log from before `stage_ran` gives each stage the
//! stretch from the record before its first to its last, since the stages run one after another.
use crate::log::runindex::{BuildOutcome, RunIndex};
use crate::log::runlog::Record;

/// What held a lane for a stretch of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpanKind {
    Build,
    Worker,
    Roofs,
    Duels,
    Profiles,
    Reference,
}

impl SpanKind {
    fn of(stage: crate::model::vocab::Stage) -> SpanKind {
        use crate::model::vocab::Stage;
        match stage {
            Stage::Roofs => SpanKind::Roofs,
            Stage::Reference => SpanKind::Reference,
            Stage::Duels => SpanKind::Duels,
            Stage::Profiles => SpanKind::Profiles,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SpanKind::Build => "nvcc build",
            SpanKind::Worker => "worker (cases)",
            SpanKind::Roofs => "roofs",
            SpanKind::Duels => "re-duels",
            SpanKind::Profiles => "ncu profiles",
            SpanKind::Reference => "PyTorch SDPA",
        }
    }
}

/// A lane of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    Builds,
    Gpu(u32),
}

#[derive(Debug, Clone)]
pub struct Span {
    pub lane: Lane,
    pub kind: SpanKind,
    pub start: f64,
    pub end: f64,
}

/// Every span of the run, and the run's wall time (its last record's time).
pub fn spans(ix: &RunIndex) -> (Vec<Span>, f64) {
    let mut out: Vec<Span> = Vec::new();
    for b in &ix.builds {
        if let BuildOutcome::Built {
            cached: false,
            seconds,
            ..
        } = b.outcome
        {
            out.push(Span {
                lane: Lane::Builds,
                kind: SpanKind::Build,
                start: (b.t - seconds).max(0.0),
                end: b.t,
            });
        }
    }
    for w in &ix.workers {
        out.push(Span {
            lane: Lane::Gpu(w.device),
            kind: SpanKind::Worker,
            start: w.started_t,
            end: w.started_t + w.seconds,
        });
    }
    let wall = ix.log.entries.last().map_or(0.0, |(_, e)| e.t);
    if !ix.stages.is_empty() {
        for s in &ix.stages {
            out.push(Span {
                lane: Lane::Gpu(s.device),
                kind: SpanKind::of(s.stage),
                start: s.started_t,
                end: s.started_t + s.seconds,
            });
        }
        return (out, wall);
    }
    let stage_gpu = ix.header.and_then(|h| h.gpus.first().copied()).unwrap_or(0);
    let entries = &ix.log.entries;
    let mut stage: Option<(SpanKind, f64, f64)> = None;
    let mut before = 0.0;
    for (_, e) in entries {
        let kind = match &e.record {
            Record::CeilingMeasured { .. } | Record::RoofUnavailable { .. } => {
                Some(SpanKind::Roofs)
            }
            Record::DriftDuel { .. } => Some(SpanKind::Duels),
            Record::Profiled { .. } => Some(SpanKind::Profiles),
            Record::BaselineTimed { .. } | Record::BaselineUnavailable { .. } => {
                Some(SpanKind::Reference)
            }
            _ => None,
        };
        match (kind, stage) {
            (Some(k), Some((open, start, _))) if k == open => stage = Some((open, start, e.t)),
            (Some(k), _) => {
                if let Some((open, start, end)) = stage.take() {
                    out.push(stage_span(stage_gpu, open, start, end));
                }
                stage = Some((k, before, e.t));
            }
            (None, Some((open, start, end))) => {
                out.push(stage_span(stage_gpu, open, start, end));
                stage = None;
            }
            (None, None) => {}
        }
        before = e.t;
    }
    if let Some((open, start, end)) = stage {
        out.push(stage_span(stage_gpu, open, start, end));
    }
    (out, before)
}

fn stage_span(gpu: u32, kind: SpanKind, start: f64, end: f64) -> Span {
    Span {
        lane: Lane::Gpu(gpu),
        kind,
        start,
        end,
    }
}

/// Seconds of the wall each GPU lane was held (overlaps merged), by lane.
pub fn busy_seconds(spans: &[Span]) -> Vec<(u32, f64)> {
    let mut gpus: Vec<u32> = spans
        .iter()
        .filter_map(|s| match s.lane {
            Lane::Gpu(d) => Some(d),
            Lane::Builds => None,
        })
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus.into_iter()
        .map(|d| {
            let mut held: Vec<(f64, f64)> = spans
                .iter()
                .filter(|s| s.lane == Lane::Gpu(d))
                .map(|s| (s.start, s.end))
                .collect();
            held.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut total, mut reach) = (0.0, f64::NEG_INFINITY);
            for (a, b) in held {
                let a = a.max(reach);
                if b > a {
                    total += b - a;
                }
                reach = reach.max(b);
            }
            (d, total)
        })
        .collect()
}
