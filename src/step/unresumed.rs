//! Why `resume` does not take up a step or a judge: said with what became of its edit and the command that judges it again.
use crate::error::Error;
use crate::log::runlog::{Header, LoadedLog, Record, RunCommand};
use std::path::Path;

/// The refusal `resume` answers a `step`'s or a `judge`'s run with (bad input, exit 2). It reads
/// the log and touches nothing: a duel cut short is not taken up, since judging the edit again
/// from its start is the same work and draws fresh inputs as a new run would.
pub fn refuse_resume(run_dir: &Path, log: &LoadedLog, header: &Header) -> Error {
    let command = header.command();
    let what = match command {
        RunCommand::Judge => "of the working tree's edit",
        _ => "of kernel edits",
    };
    let mut again = format!(
        "flashtune {} --space {}",
        command.name(),
        header.space_path.display()
    );
    if header.device.fake {
        again.push_str(" --fake-gpu");
    }
    if command == RunCommand::Step {
        again.push_str(" (with the --proposer and --steps it had, if any)");
    }
    Error::BadInput(format!(
        "{} is a `flashtune {}` {what}, and a {} is not resumed: its duel would start over on fresh inputs, as a new one does. {}\nJudge again with: {again}",
        run_dir.display(),
        command.name(),
        command.name(),
        how_it_ended(run_dir, log)
    ))
}

/// What the log says became of the run and its edit.
fn how_it_ended(run_dir: &Path, log: &LoadedLog) -> String {
    let records = || log.entries.iter().map(|(_, e)| &e.record);
    if let Some(reason) = records().find_map(|r| match r {
        Record::Interrupted { reason } => Some(reason),
        _ => None,
    }) {
        return format!("It was stopped: {reason}.");
    }
    let started = records()
        .filter_map(|r| match r {
            Record::StepStarted { step, .. } => Some(*step),
            _ => None,
        })
        .max();
    let decided = records()
        .filter_map(|r| match r {
            Record::StepDecided { step, .. } => Some(*step),
            _ => None,
        })
        .max();
    let in_flight = match (started, decided) {
        (Some(s), Some(d)) if d >= s => {
            return format!("Its last step, {d}, was decided: nothing was in flight.")
        }
        (Some(s), _) => s,
        (None, d) => d.unwrap_or(0) + 1,
    };
    let patch = crate::pack::attempt_patch_path(run_dir, in_flight, None);
    let kept = if patch.is_file() {
        format!("; its patch is kept as {}", patch.display())
    } else {
        String::new()
    };
    format!(
        "It was killed during step {in_flight} before it logged its end: whatever edit it was judging was left in the working tree{kept}."
    )
}
