//! The report's guided-search section: every proposal, its rule and what it measured.
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::plan::Proposal;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

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
    // Each case's last `timed` record: a re-timing replaces the first.
    let last_timed: BTreeMap<(String, String, Dtype), (f64, usize)> = log
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
    let _ = writeln!(s, "\nThe µs columns: the median of each variant's last timing on that case. × vs champion: the champion's median ÷ the proposal's (above 1: the proposal is faster).");
    let _ = writeln!(s, "\n| round | proposed variant | rule | bottleneck seen | from champion | on | its µs | champion's µs there | result |");
    let _ = writeln!(s, "|---:|---|---|---|---|---|---:|---:|---|");
    let mut seen = BTreeSet::new();
    for (variant, p, invalid) in &proposals {
        if !seen.insert((variant.clone(), p.round)) {
            continue; // one row per (variant, round), not per head dim
        }
        let on = format!("{} {}", p.shape, p.dtype);
        let mine = last_timed.get(&(variant.clone(), p.shape.clone(), p.dtype));
        let theirs = last_timed.get(&(p.from_variant.clone(), p.shape.clone(), p.dtype));
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
