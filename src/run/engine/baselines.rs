//! The reference library's stage: PyTorch (and FlashAttention-4) timed on the run's shapes, or
//! taken from the results store where an earlier run timed them on the same GPU model and driver
//! with the same library (`gpu::baseline::Library`), each taken record citing the one it repeats.
use crate::error::Result;
use crate::gpu::baseline::{self, Library};
use crate::log::runlog::Record;
use crate::log::store::{LibraryKey, Store, StoredBaseline};
use crate::model::config::Shape;
use crate::model::protocol::DeviceInfo;
use crate::model::vocab::Stage;
use crate::run::scheduler::HeldGpu;
use crate::run::shared::{Events, Project, TuneOptions};
use std::collections::BTreeMap;

/// The reference library's stage: what the store holds is logged now; the shapes it does not hold
/// become a job that holds the run's first GPU beside the case queues (none when nothing is left
/// to time). A resumed run that logged its baselines has nothing to do.
pub(super) async fn reference_job<'a>(
    project: &'a Project,
    device: &'a DeviceInfo,
    opts: &TuneOptions,
    events: &mut Events,
) -> Result<Option<HeldGpu<'a>>> {
    let logged = events.records().entries.iter().any(|(_, e)| {
        matches!(
            e.record,
            Record::BaselineTimed { .. } | Record::BaselineUnavailable { .. }
        )
    });
    if logged {
        return Ok(None);
    }
    let unavailable = |reason: String| Record::BaselineUnavailable {
        backend: None,
        shape: None,
        dtype: None,
        reason,
    };
    if device.fake && !project.policies.baseline.on_fake_gpu {
        events.emit(unavailable(
            "fake GPU: the reference library is not run".into(),
        ))?;
        return Ok(None);
    }
    if project.policies.baseline.command.is_empty() {
        events.emit(unavailable(
            "baseline.command is empty in policies.toml".into(),
        ))?;
        return Ok(None);
    }
    let library = match baseline::library(&project.paths.root, &project.policies).await {
        Ok(library) => {
            events.emit(Record::ReferenceLibrary {
                versions: library.versions.clone(),
                fingerprint: library.fingerprint.clone(),
            })?;
            Some(library)
        }
        Err(why) => {
            tracing::warn!(%why, "the reference library's versions are unknown: nothing is taken from the results store");
            None
        }
    };
    let stored = library
        .as_ref()
        .filter(|_| !opts.fresh_baselines)
        .map(|l| stored_baselines(project, device, l))
        .unwrap_or_default();
    let mut taken = take(project, &stored);
    let to_time: Vec<Shape> = project
        .shapes
        .iter()
        .filter(|s| !taken.shapes.contains(&s.name))
        .cloned()
        .collect();
    if !to_time.is_empty() {
        // The adapter measures the roofs with the shapes it times: one set of them, this session's.
        taken
            .records
            .retain(|r| !matches!(r, Record::CeilingMeasured { .. }));
    }
    for record in &taken.records {
        events.emit(record.clone())?;
    }
    let roofs_taken = taken
        .records
        .iter()
        .any(|r| matches!(r, Record::CeilingMeasured { .. }));
    if to_time.is_empty() && roofs_taken {
        return Ok(None);
    }
    let gpu = opts.gpus(device).first().copied().unwrap_or(device.ordinal);
    Ok(Some(HeldGpu {
        gpu,
        stage: Stage::Reference,
        work: Box::pin(time_shapes(project, device, gpu, to_time)),
    }))
}

/// The reference library's records the store holds for this GPU, driver and library; none where
/// the store cannot be read (the stage then times everything).
fn stored_baselines(
    project: &Project,
    device: &DeviceInfo,
    library: &Library,
) -> Vec<StoredBaseline> {
    let key = LibraryKey {
        gpu: &device.name,
        driver: device.driver_version,
        fake: device.fake,
        library: &library.fingerprint,
    };
    let path = crate::log::store::path(&project.paths);
    let rows = match Store::open_existing(&path)
        .and_then(|s| s.map_or(Ok(Vec::new()), |s| s.baselines(&key)))
    {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot read the results store's baselines");
            return Vec::new();
        }
    };
    // A sealed row is flashtune's writing; the sealed log line it cites says it still holds.
    let mut cited = crate::log::store::CitedLogs::new(project.paths.runs());
    let mut said = false;
    rows.into_iter()
        .filter(|row| match cited.check_baseline(row, &key) {
            Ok(()) => true,
            Err(why) => {
                if !std::mem::replace(&mut said, true) {
                    crate::tell!(
                        "a stored reference-library figure is not taken ({why}): its shape is timed again"
                    );
                }
                false
            }
        })
        .collect()
}

/// What the stage takes from the store: the records to log (the PyTorch roofs among them where
/// stored) and the shapes they cover.
#[derive(Default)]
struct Taken {
    records: Vec<Record>,
    shapes: Vec<String>,
}

/// Per shape, every record of the newest earlier run that answered every dtype and backend of this
/// run for it (a shape is timed whole or taken whole: its backends' figures come from one
/// session); the roofs from the newest run that measured them. Each taken record cites where it
/// was measured.
fn take(project: &Project, stored: &[StoredBaseline]) -> Taken {
    let mut taken = Taken::default();
    for shape in &project.shapes {
        let geometry = crate::log::store::geometry(shape);
        // The store gives the newest run first.
        let mut by_run: Vec<(&str, Vec<&StoredBaseline>)> = Vec::new();
        for row in stored.iter().filter(|r| r.geometry == geometry) {
            match by_run.iter_mut().find(|(run, _)| *run == row.run_id) {
                Some((_, rows)) => rows.push(row),
                None => by_run.push((&row.run_id, vec![row])),
            }
        }
        // Every (dtype, backend) this run asks for answered, timed or not.
        let whole = by_run.into_iter().find(|(_, rows)| {
            project.policies.dtypes.iter().all(|d| {
                project.policies.baseline.backends.iter().all(|b| {
                    rows.iter()
                        .any(|r| answers(&r.record) == Some((*d, b.as_str())))
                })
            })
        });
        if let Some((_, rows)) = whole {
            taken.shapes.push(shape.name.clone());
            // The shape's name is this run's (an earlier run may have named the geometry otherwise).
            taken.records.extend(
                rows.into_iter()
                    .filter(|r| {
                        dtype_of(&r.record).is_some_and(|d| project.policies.dtypes.contains(&d))
                    })
                    .map(|r| taken_as(r, Some(&shape.name))),
            );
        }
    }
    let roofs_run = stored
        .iter()
        .find(|r| r.geometry.is_empty())
        .map(|r| r.run_id.clone());
    if let Some(run) = roofs_run {
        taken.records.extend(
            stored
                .iter()
                .filter(|r| r.geometry.is_empty() && r.run_id == run)
                .map(|r| taken_as(r, None)),
        );
    }
    taken
}

fn dtype_of(record: &Record) -> Option<crate::model::config::Dtype> {
    answers(record).map(|(dtype, _)| dtype)
}

/// The (dtype, backend) a stored record answers for its shape.
fn answers(record: &Record) -> Option<(crate::model::config::Dtype, &str)> {
    match record {
        Record::BaselineTimed { dtype, backend, .. } => Some((*dtype, backend)),
        Record::BaselineUnavailable {
            dtype: Some(dtype),
            backend: Some(backend),
            ..
        } => Some((*dtype, backend)),
        _ => None,
    }
}

/// A stored record as this run logs it: citing where it was measured, under this run's name for
/// its shape (an earlier run may have named the same geometry otherwise).
fn taken_as(row: &StoredBaseline, shape_name: Option<&str>) -> Record {
    let mut record = row.record.clone();
    match &mut record {
        Record::BaselineTimed {
            shape, reused_from, ..
        } => {
            *reused_from = Some(row.origin.clone());
            if let Some(name) = shape_name {
                *shape = name.to_owned();
            }
        }
        Record::BaselineUnavailable { shape, .. } => {
            if let Some(name) = shape_name {
                *shape = Some(name.to_owned());
            }
        }
        Record::CeilingMeasured { reused_from, .. } => *reused_from = Some(row.origin.clone()),
        _ => {}
    }
    record
}

/// Run the adapter on `shapes` (none: the roofs alone): the records of what it says. It runs on
/// the run's first GPU. One adapter per GPU, each on a share of the shapes by FLOPs, was not faster on two
/// H200s (the stage 52.1 s against 48.9 s for one adapter, one run each from a cold start:
/// docs/measurements/2026-11-29-h200x2-fresh): an adapter's time goes by its rows, each with a
/// warm-up, a graph capture and its samples, more than by their FLOPs.
async fn time_shapes(
    project: &Project,
    device: &DeviceInfo,
    gpu: u32,
    shapes: Vec<Shape>,
) -> Vec<Record> {
    // PyTorch's calls rotate over enough distinct input sets to fill twice the L2 cache, so it is
    // not timed on inputs sitting in L2 (the variants' inputs are drawn anew and L2 flushed
    // before each replay).
    let sets: BTreeMap<String, u32> = shapes
        .iter()
        .map(|s| (s.name.clone(), baseline::rotating_sets(s, device.l2_bytes)))
        .collect();
    let measured = baseline::measure_rotating(
        &project.paths.root,
        &project.policies,
        &shapes,
        &sets,
        gpu,
        true,
    );
    measured_records(measured.await)
}

/// One adapter's answer as records: its rows and roofs, or why it could not run at all.
fn measured_records(
    outcome: std::result::Result<(Vec<baseline::BaselineRow>, Vec<baseline::Ceiling>), String>,
) -> Vec<Record> {
    match outcome {
        Err(reason) => vec![Record::BaselineUnavailable {
            backend: None,
            shape: None,
            dtype: None,
            reason,
        }],
        Ok((rows, ceilings)) => {
            let mut records = Vec::with_capacity(rows.len() + ceilings.len());
            for row in rows {
                let (backend, shape, dtype) = (row.backend, row.shape, row.dtype);
                records.push(match row.outcome {
                    Ok(timing) => Record::BaselineTimed {
                        backend,
                        shape,
                        dtype,
                        timing,
                        remeasured: row.remeasured,
                        noisy: row.noisy,
                        reused_from: None,
                    },
                    Err(reason) => Record::BaselineUnavailable {
                        backend: Some(backend),
                        shape: Some(shape),
                        dtype: Some(dtype),
                        reason,
                    },
                });
            }
            for c in ceilings {
                records.push(Record::CeilingMeasured {
                    name: c.name,
                    dtype: c.dtype,
                    value: c.value,
                    unit: c.unit,
                    source: Some(crate::model::vocab::RoofSource::Pytorch),
                    reused_from: None,
                });
            }
            records
        }
    }
}
