//! The report's accounting line: planned = measured + failed + implausible + skipped (+ not run).
use crate::log::runindex::RunIndex;
use std::fmt::Write;

/// planned = measured + failed + implausible + skipped (+ not run), and loudly when that does not hold.
pub(super) fn accounting(ix: &RunIndex) -> String {
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
    let mut md = format!(
        "Cases: {} planned {} {} measured{reused} + {} failed + {} implausible + {} skipped{not_run}.\n\n",
        a.planned,
        if sum == a.planned { "=" } else { "≠" },
        a.measured,
        a.failed,
        a.implausible,
        a.skipped,
    );
    if !a.holds() {
        md.push_str("> **The cases do not add up.** Every planned case must end in exactly one outcome; this log breaks that:\n");
        const SHOWN: usize = 20;
        for p in a.problems.iter().take(SHOWN) {
            let _ = writeln!(md, "> - {p}");
        }
        if a.problems.len() > SHOWN {
            let _ = writeln!(md, "> - … and {} more", a.problems.len() - SHOWN);
        }
        md.push('\n');
    }
    md
}
