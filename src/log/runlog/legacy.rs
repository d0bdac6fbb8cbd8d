//! Logs written before a record carried its typed fields: the one place where an old record's
//! words are read for what a type now says. `read` upgrades every record it parses; what this
//! flashtune writes carries the types already, so nothing else reads those words.
use super::reader::LoadedLog;
use super::record::{Record, RunCommand};
use crate::model::protocol::{CaseFault, GARBLED_REPLY, WORKER_NOT_STARTED};
use crate::model::vocab::{BuildRole, ProcessEnd, SkipReason, WorkerFailure};

/// Fill in the typed fields an older log's record lacks, from its words.
pub fn upgrade(record: &mut Record) {
    match record {
        Record::CheckFailed { reason, fault, .. } => {
            fault.get_or_insert_with(|| CaseFault::legacy(reason));
        }
        Record::Built { variant, role, .. } => {
            if role.is_none() {
                *role = BuildRole::legacy(variant);
            }
        }
        Record::WorkerCrashed {
            detail,
            failure,
            not_started,
            ..
        } => {
            // Schema 1 said whether it started in `not_started`; before that, only in its words.
            failure.get_or_insert_with(|| match not_started {
                Some(true) => WorkerFailure::NotStarted,
                None if detail.starts_with(WORKER_NOT_STARTED) => WorkerFailure::NotStarted,
                _ if detail.starts_with(GARBLED_REPLY) => WorkerFailure::Garbled,
                _ => WorkerFailure::Died,
            });
        }
        Record::ProposerRan {
            status,
            timed_out,
            end,
            ..
        }
        | Record::CandidateProposed {
            status,
            timed_out,
            end,
            ..
        } => {
            end.get_or_insert_with(|| ProcessEnd::legacy(status, *timed_out));
        }
        Record::CaseSkipped {
            reason,
            skipped_for,
            ..
        } => {
            skipped_for.get_or_insert_with(|| skip_reason(reason));
        }
        _ => {}
    }
}

/// Name the command of an older log whose header does not, from the records only it writes: an
/// agent session's settings, a step's builds of HEAD and the edit, its steps; else a tune. (A judge
/// logged as a step with one step: the older log cannot tell them apart, and neither is resumed.)
/// Called once the records are upgraded.
pub fn upgrade_log(log: &mut LoadedLog) {
    let records = || log.entries.iter().map(|(_, e)| &e.record);
    let command = if records().any(|r| matches!(r, Record::AgentSession(_))) {
        RunCommand::AgentSession
    } else if records().any(|r| {
        matches!(
            r,
            Record::Built { role: Some(_), .. }
                | Record::ProposerRan { .. }
                | Record::StepStarted { .. }
                | Record::StepDecided { .. }
        )
    }) {
        RunCommand::Step
    } else {
        RunCommand::Tune
    };
    for (_, entry) in &mut log.entries {
        if let Record::Header(header) = &mut entry.record {
            header.command.get_or_insert(command);
        }
    }
}

/// The words each kind of skip began with.
fn skip_reason(reason: &str) -> SkipReason {
    if reason.starts_with("not measured: the cluster ended") {
        SkipReason::ClusterLost
    } else if reason.starts_with("not measured: ") {
        SkipReason::Budget
    } else if reason.starts_with("quarantined: ") {
        SkipReason::Quarantined
    } else {
        SkipReason::Build
    }
}
