//! The report's accounting line: planned = measured + failed + implausible + skipped (+ not run).
use crate::log::runindex::RunIndex;
use crate::report::document::{Block, Text};

/// planned = measured + failed + implausible + skipped (+ not run), and loudly when that does not hold.
pub(super) fn accounting(ix: &RunIndex) -> Vec<Block> {
    let a = &ix.accounting;
    let not_run = if a.not_run > 0 || ix.unfinished() {
        format!(" + {} not run", a.not_run)
    } else {
        String::new()
    };
    let sum = a.measured + a.failed + a.implausible + a.skipped + a.not_run;
    let reused = if a.reused > 0 {
        format!(" ({} of them reused from earlier runs)", a.reused)
    } else {
        String::new()
    };
    let mut blocks = vec![Block::line(format!(
        "Cases: {} planned {} {} measured{reused} + {} failed + {} implausible + {} skipped{not_run}.",
        a.planned,
        if sum == a.planned { "=" } else { "≠" },
        a.measured,
        a.failed,
        a.implausible,
        a.skipped,
    ))];
    if !a.holds() {
        const SHOWN: usize = 20;
        let mut items: Vec<Text> = a
            .problems
            .iter()
            .take(SHOWN)
            .map(|p| p.clone().into())
            .collect();
        if a.problems.len() > SHOWN {
            items.push(format!("… and {} more", a.problems.len() - SHOWN).into());
        }
        blocks.push(Block::Warning {
            text: Text::new().strong("The cases do not add up.").plain(
                " Every planned case must end in exactly one outcome; this log breaks that:",
            ),
            items,
        });
    }
    blocks
}
