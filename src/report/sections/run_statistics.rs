//! The report's Run statistics section: where the wall time went.
use crate::log::runindex::{BuildOutcome, Outcome, RunIndex};
use crate::log::runlog::Record;
use crate::report::document::{Block, Section, SectionId, Text};
use std::collections::BTreeMap;

/// Where the wall time went: builds, GPU workers, and the gaps between workers (flashtune's own overhead).
pub(super) fn run_statistics(ix: &RunIndex) -> Section {
    let (mut compiled, mut cached, mut nvcc_seconds, mut last_build_t) =
        (0usize, 0usize, 0.0f64, 0.0f64);
    let mut workers: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    let wall = ix.wall_seconds;
    // Every timed replay the workers ran: kept figures, those taken again on a throttled or shared
    // GPU, and those beyond a roof.
    let replay_seconds: f64 = ix
        .timings
        .iter()
        .map(|t| t.timing)
        .chain(ix.disturbed.iter().map(|d| d.timing))
        .chain(ix.cases.iter().filter_map(|c| match &c.outcome {
            Outcome::Implausible { timing, .. } => Some(*timing),
            _ => None,
        }))
        .map(|t| t.samples_us.iter().sum::<f64>() * t.launches_per_sample as f64 / 1e6)
        .sum();
    for b in &ix.builds {
        match b.outcome {
            BuildOutcome::Built { cached: true, .. } => cached += 1,
            BuildOutcome::Built { seconds, .. } => {
                compiled += 1;
                nvcc_seconds += seconds;
                last_build_t = last_build_t.max(b.t);
            }
            BuildOutcome::Failed { .. } => last_build_t = last_build_t.max(b.t),
            BuildOutcome::Rejected { .. } => {}
        }
    }
    for w in &ix.workers {
        workers
            .entry(w.device)
            .or_default()
            .push((w.started_t, w.seconds));
    }
    let mut s = Section::new(SectionId::RunStatistics, Text::from("Run statistics"));
    if workers.is_empty() {
        return s;
    }
    let mut items: Vec<Text> = Vec::new();
    items.push(format!("wall time {wall:.1} s; builds: {compiled} compiled ({nvcc_seconds:.1} s of nvcc), {cached} from the cache; last build done at {last_build_t:.1} s ({:.0}% of the wall time)", 100.0 * last_build_t / wall.max(1e-9)).into());
    for (device, runs) in &mut workers {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let busy: f64 = runs.iter().map(|r| r.1).sum();
        let first = runs[0].0;
        let end = runs.iter().map(|r| r.0 + r.1).fold(0.0, f64::max);
        let mut gaps: Vec<f64> = runs
            .windows(2)
            .map(|w| (w[1].0 - (w[0].0 + w[0].1)).max(0.0))
            .collect();
        gaps.sort_by(f64::total_cmp);
        let median_gap = if gaps.is_empty() {
            0.0
        } else {
            gaps[gaps.len() / 2]
        };
        items.push(format!("GPU {device}: {} worker runs held it {busy:.1} s, {:.0}% of the time from the first worker on; median gap between workers {:.0} ms",
            runs.len(),
            100.0 * busy / (end - first).max(1e-9),
            median_gap * 1000.0
        ).into());
    }
    if ix.climbs > 0 {
        items.push(format!("dispatch under the time limit: {} variants taken for being one parameter from a case's best so far (`climbed` records)", ix.climbs).into());
    }
    // A worker holds the GPU longer than its kernels run: process start, inputs, the reference, the checks.
    let held: f64 = workers.values().flatten().map(|r| r.1).sum();
    items.push(format!("timed graph replays: {replay_seconds:.1} s, {:.0}% of the workers' time (the rest is start-up, inputs, warm-up, the reference kernel and the checks)", 100.0 * replay_seconds / held.max(1e-9)).into());
    // What the checks cost, from the timed records' own accounts (logs before they kept one say nothing).
    let mut costs = crate::model::protocol::CaseCosts::default();
    let mut costed = 0usize;
    for (_, e) in &ix.log.entries {
        if let Record::Timed { costs: Some(c), .. } = &e.record {
            costed += 1;
            costs.inputs_s += c.inputs_s;
            costs.check_s += c.check_s;
            costs.replays_s += c.replays_s;
            costs.verify_s += c.verify_s;
            costs.verify_parts.add(&c.verify_parts);
            costs.recheck_s += c.recheck_s;
            costs.timing_overhead_s += c.timing_overhead_s;
        }
    }
    if costed > 0 {
        items.push(format!("worker time of the {costed} timed cases by stage: inputs drawn {:.1} s, first check {:.1} s, replays (warm-up included) {:.1} s, verifying the timed outputs {:.1} s, re-checks on fresh and large inputs {:.1} s, other {:.1} s",
            costs.inputs_s,
            costs.check_s,
            costs.replays_s,
            costs.verify_s,
            costs.recheck_s,
            costs.timing_overhead_s
        ).into());
        let v = &costs.verify_parts;
        if v.keep_s + v.references_s + v.comparisons_s + v.reruns_s > 0.0 {
            items.push(format!("verifying the timed outputs, by part: reading kept rounds back {:.1} s, references (inputs drawn again, the oracle) {:.1} s, uploads and comparisons {:.1} s, re-runs {:.1} s",
                v.keep_s, v.references_s, v.comparisons_s, v.reruns_s
            ).into());
        }
    }
    // Each resource's busy share of the wall. ncu runs after the timing, never beside it: it
    // serialises the GPU's kernels and fixes its clocks, so a profile next to a timed replay on
    // the same GPU would change the figure being measured.
    let devices = workers.len().max(1) as f64;
    let cores = match ix.header.and_then(|h| h.build_jobs) {
        Some(jobs) => format!(
            "build cores {:.0}% ({nvcc_seconds:.1} s of nvcc on {jobs} jobs)",
            100.0 * nvcc_seconds / (jobs as f64 * wall).max(1e-9)
        ),
        None => format!("build cores: {nvcc_seconds:.1} s of nvcc (jobs not logged)"),
    };
    items.push(format!("busy share of the wall: GPU {:.0}% (worker runs), {cores}; ncu runs after the timing, not beside it, because it serialises the GPU and fixes its clocks",
        100.0 * held / (devices * wall).max(1e-9)
    ).into());
    // With the stages outside the workers (roofs, re-duels, profiles, the reference library), each
    // GPU's whole held share: the figure the timeline plots.
    let (spans, _) = crate::report::timeline::spans(ix);
    let held_by: Vec<String> = crate::report::timeline::busy_seconds(&spans)
        .into_iter()
        .map(|(d, s)| format!("GPU {d} {s:.1} s ({:.0}%)", 100.0 * s / wall.max(1e-9)))
        .collect();
    if !held_by.is_empty() {
        items.push(format!("held with every stage on it (workers, roofs, re-duels, profiles, PyTorch; the timeline on report.html): {}", held_by.join(", ")).into());
    }
    let raced: Vec<u32> = ix
        .cases
        .iter()
        .filter_map(|c| c.raced().map(|r| r.samples))
        .collect();
    if !raced.is_empty() {
        let timed = ix
            .cases
            .iter()
            .filter(|c| c.measured().is_some() && c.reused().is_none())
            .count();
        items.push(format!("racing: {} of {timed} timed cases stopped after {} samples, their p10 above the best timing's p90 at the time (marked ⏹)", raced.len(), raced.iter().max().copied().unwrap_or(0)).into());
    }
    s.push(Block::list(items));
    s
}
