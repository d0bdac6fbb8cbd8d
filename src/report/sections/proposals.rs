//! The report's guided-search section: every proposal, its rule and what it measured.
use crate::log::runlog::{LoadedLog, Record};
use crate::model::config::Dtype;
use crate::model::plan::Proposal;
use crate::report::document::{Block, Item, Section, SectionId, Table, Text};
use std::collections::{BTreeMap, BTreeSet};

/// The report's guided-search section: every proposal, the rule behind it, and what it measured.
pub(super) fn proposals_section(log: &LoadedLog) -> Option<Section> {
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
    let mut items: Vec<Item> = Vec::new();
    for r in &rounds {
        match r {
            Record::SearchRound {
                round,
                champions,
                proposed,
            } => {
                let from: BTreeSet<&str> = champions.iter().map(|c| c.variant.as_str()).collect();
                items.push(
                    Text::from(format!("round {round}: champions "))
                        .then(Text::join(from.iter().map(|v| Text::new().code(*v)), ", "))
                        .plain(format!(" → {} proposal(s)", proposed.len()))
                        .into(),
                );
            }
            Record::SearchStopped { reason } => {
                items.push(Text::from(format!("stopped: {reason}")).into());
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
                let kept = || Text::new().plain("kept ").code(champion.as_str());
                let outcome = match (verdict, failure) {
                    (Some(v), _) if v.accept => Text::from(format!("new champion: {}", v.reason)),
                    (Some(v), _) => kept().plain(format!(": {}", v.reason)),
                    (None, Some(why)) => kept().plain(format!(": {why}")),
                    (None, None) => kept(),
                };
                let duel = Text::from(format!("interleaved re-timing on {shape} {dtype}: "))
                    .code(challenger.as_str())
                    .plain(" vs ")
                    .code(champion.as_str())
                    .plain(format!("{times} → "))
                    .then(outcome);
                // A duel belongs to the round before it.
                match items.last_mut() {
                    Some(round) => round.under.push(duel),
                    None => items.push(duel.into()),
                }
            }
            _ => {}
        }
    }
    let mut s = Section::new(SectionId::Proposals, Text::from("Guided search"));
    s.push(Block::List(items));
    s.push(Block::line("The µs columns: the median of each variant's last timing on that case. × vs champion: the champion's median ÷ the proposal's (above 1: the proposal is faster)."));
    let mut t = Table::new()
        .figure("round")
        .text("proposed variant")
        .text("rule")
        .text("bottleneck seen")
        .text("from champion")
        .text("on")
        .figure("its µs")
        .figure("champion's µs there")
        .text("result");
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
        t.row(vec![
            p.round.to_string().into(),
            Text::new().code(variant.as_str()),
            p.rule.to_string().into(),
            p.bottleneck.to_string().into(),
            Text::new().code(p.from_variant.as_str()),
            on.into(),
            mine_s.into(),
            theirs_s.into(),
            result.into(),
        ]);
    }
    s.push(Block::Table(t));
    Some(s)
}
