//! The report's Not measured section: what a budget left out.
use crate::log::runindex::{Outcome, RunIndex};
use crate::log::runlog::Record;
use crate::model::vocab::SkipReason;
use crate::report::document::{Block, Section, SectionId, Table, Text};

/// Under a budget: the variants it left out, in the order they would have come, each with the
/// strategy's estimate of its promise (its rank and why) and what earlier runs measured of it.
/// The section counts the variants it lists.
pub(super) fn not_measured(ix: &RunIndex) -> Section {
    let mut left: Vec<&str> = Vec::new();
    for c in &ix.cases {
        if let Outcome::Skipped {
            why: Some(SkipReason::Budget),
            ..
        } = c.outcome
        {
            if !left.contains(&c.variant) {
                left.push(c.variant);
            }
        }
    }
    // The budget's own words, from the record that says it was reached.
    let reached = ix.incidents.iter().rev().find_map(|(line, r)| match r {
        Record::BudgetReached {
            reason,
            variants_not_measured,
        } => Some((*line, reason.as_str(), variants_not_measured)),
        _ => None,
    });
    let Some((line, why, left_then)) = reached else {
        return Section::new(SectionId::NotMeasured, None);
    };
    if left.is_empty() {
        // Everything planned was measured: the budget fell in a stage after the variants, or a
        // resume measured what it had left.
        let resumed = match left_then.len() {
            0 => String::new(),
            n => format!(" A resume measured the {n} variant(s) it had left."),
        };
        let mut s = Section::new(
            SectionId::NotMeasured,
            Text::from(format!("Budget reached ({why})")),
        );
        s.push(Block::line(format!(
            "The budget was reached (log line {line}), and every planned variant was measured.{resumed} The stages after the variants (re-duels, profiles) stop where a budget falls: Run statistics shows those that ran."
        )));
        return s;
    }
    let listed = left.len();
    let order = ix.dispatch_order.map_or(&[][..], |(_, o)| o);
    let ranked = |v: &str| order.iter().find(|r| r.variant == v);
    left.sort_by_key(|v| ranked(v).map_or(usize::MAX, |r| r.rank));
    let measured = ix
        .dispatch_order
        .map(|(line, o)| {
            format!(
                " The run dispatched variants best first (log line {line}); {} of {} were reached.",
                o.len().saturating_sub(left.len()),
                o.len()
            )
        })
        .unwrap_or_default();
    let mut s = Section::new(
        SectionId::NotMeasured,
        Text::from(format!("Not measured ({why})")),
    );
    let resumed = match left_then.len().saturating_sub(listed) {
        0 => String::new(),
        n => format!(
            " {n} of the {} it left were measured after a resume.",
            left_then.len()
        ),
    };
    s.push(Block::line(format!("The budget ran out before these variants were reached (log line {line}).{resumed}{measured} Rank and reason are the strategy's estimate of each one's promise; earlier figures are what the results store held for it on this GPU model (✓: the same kernel build this run would measure).")));
    let mut t = Table::new()
        .figure("rank")
        .text("variant")
        .text("why it was there")
        .text("earlier figures");
    for v in left {
        let (rank, reason, earlier) = match ranked(v) {
            Some(r) => {
                let earlier: Vec<String> = r
                    .earlier
                    .iter()
                    .map(|f| {
                        format!(
                            "{} {} {:.1} µs{} (run {} line {})",
                            f.shape,
                            f.dtype,
                            f.median_us,
                            if f.current { " ✓" } else { "" },
                            f.run,
                            f.line
                        )
                    })
                    .collect();
                (
                    r.rank.to_string(),
                    r.reason.to_string(),
                    if earlier.is_empty() {
                        "none".into()
                    } else {
                        earlier.join("; ")
                    },
                )
            }
            None => ("—".into(), "—".into(), "—".into()),
        };
        t.row(vec![
            rank.into(),
            Text::new().code(v),
            reason.into(),
            earlier.into(),
        ]);
    }
    s.push(Block::Table(t));
    s.counting(listed)
}
