//! The proposer of an in-place step: run confined to the edit scope under a timeout, then checked to have left flashtune's files and HEAD alone.
use super::scope::protected;
use super::tree::walk;
use super::{
    changes, file_hash, fingerprint, fingerprint_changes, head_of, put_head_back, restore, short,
    Decided, Proposed, Session, EDIT_SCOPE,
};
use crate::error::{Error, Result};
use crate::log::runlog::Record;
use crate::model::vocab::ProcessEnd;
use crate::run::shared::{Events, UnitKey};
use anyhow::{anyhow, Context};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

impl Session<'_> {
    /// Run the proposer, then check it left flashtune's files and HEAD alone; `Err` stops the run.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn propose(
        &self,
        n: u32,
        command: &str,
        last: Option<&Decided>,
        repo: &git2::Repository,
        (base, base_ref): (&str, &str),
        head_cubins: &BTreeMap<UnitKey, PathBuf>,
        events: &mut Events,
    ) -> Result<Proposed> {
        let guarded = self.guarded_files(head_cubins);
        let before = fingerprint(&guarded);
        let log_before = file_hash(&events.log.path);
        crate::tell!("step {n}: the proposer runs");
        let ran = self.run_proposer(n, command, last).await?;
        // What the tool trusts and did not build: the worker binary and the toolchain.
        self.opts
            .executor
            .check_untouched()
            .and(self.project.toolchain.check_untouched())
            .map_err(|t| Error::Other(anyhow!("{t}")))?;
        let tampered = fingerprint_changes(&before, &fingerprint(&guarded));
        if file_hash(&events.log.path) != log_before || !tampered.is_empty() {
            return Err(Error::Other(anyhow!(
                "the proposer modified flashtune's run files ({}); the run log can no longer be trusted, stopping",
                if tampered.is_empty() {
                    "log.jsonl".to_owned()
                } else {
                    tampered.join(", ")
                }
            )));
        }
        let proposed = match &ran {
            Record::ProposerRan {
                output_tail, end, ..
            } => Proposed {
                finished: end.unwrap_or(ProcessEnd::WaitFailed).succeeded(),
                output: output_tail.clone(),
            },
            _ => unreachable!("run_proposer returns proposer_ran"),
        };
        events.emit(ran)?;
        let (now, now_ref) = head_of(repo)?;
        if now != base || now_ref != base_ref {
            let reason = format!(
                "the proposer moved HEAD ({base_ref} {}) to ({now_ref} {}); flashtune commits accepted edits itself. \
                 HEAD was put back; the proposer's commit stays reachable as {now}",
                short(base),
                short(&now)
            );
            put_head_back(repo, base_ref, base)?;
            let (inside, outside) = changes(self.project, self.root)?;
            let left: Vec<String> = inside.into_iter().chain(outside).collect();
            restore(self.root, &left)?;
            events.emit(Record::StepDecided {
                step: n,
                accepted: false,
                reason: reason.clone(),
                geomean_gain: None,
                commit: None,
                restored: left,
                candidate: None,
                scratch_ref: None,
            })?;
            return Err(Error::Other(anyhow!("{reason}")));
        }
        Ok(proposed)
    }

    /// The run folder and the cubins HEAD's side will use.
    fn guarded_files(&self, head_cubins: &BTreeMap<UnitKey, PathBuf>) -> Vec<PathBuf> {
        let mut files = walk(self.run_dir);
        files.push(self.run_dir.to_path_buf());
        files.extend(head_cubins.values().cloned());
        files
    }

    async fn run_proposer(&self, n: u32, command: &str, last: Option<&Decided>) -> Result<Record> {
        let timeout = Duration::from_secs(self.project.policies.step.proposer_timeout_s);
        let mut cmd = crate::os::stop::guarded_shell(command)
            .with_context(|| format!("cannot start the proposer `{command}`"))?;
        cmd.current_dir(self.root)
            .env("FLASHTUNE_STEP", n.to_string())
            .env("FLASHTUNE_STEPS", self.opts.steps.to_string())
            .env("FLASHTUNE_RUN_DIR", self.run_dir)
            .env("FLASHTUNE_EDIT_SCOPE", EDIT_SCOPE)
            .env("FLASHTUNE_PROTECTED", protected(self.project).join(" "))
            .env(
                "FLASHTUNE_THRESHOLD",
                self.project.policies.step.threshold.to_string(),
            )
            .env(
                "FLASHTUNE_LAST_VERDICT",
                last.map_or("none", |d| if d.accepted { "accepted" } else { "rejected" }),
            )
            .env(
                "FLASHTUNE_LAST_REASON",
                last.map_or("", |d| d.reason.as_str()),
            )
            .env(
                "FLASHTUNE_LAST_REPORT",
                last.map_or(PathBuf::new(), |d| d.report.clone()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group (the guard's): the timeout, the end of the step, and flashtune's death
            // stop whatever it started.
            .kill_on_drop(true);
        // It writes the edit scope and a scratch folder, nothing else (src/run/sandbox.rs).
        let scope = self.root.join(EDIT_SCOPE);
        let _scratch = crate::run::sandbox::confine(
            &mut cmd,
            self.project,
            self.opts.executor.exe(),
            &[(&scope, "the edit scope")],
            &format!("{}-step-{n}", self.run_id),
        )?;
        let started = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the proposer `{command}`"))?;
        let group = crate::gpu::build::ProcessGroup(child.id());
        let waited = tokio::time::timeout(timeout, child.wait_with_output()).await;
        // Nothing it left running in the background may edit files while the step is judged.
        drop(group);
        let (status, end, output) = match waited {
            Err(_) => (
                format!("killed after {} s", timeout.as_secs()),
                ProcessEnd::TimedOut,
                String::new(),
            ),
            Ok(Err(e)) => (
                format!("wait failed: {e}"),
                ProcessEnd::WaitFailed,
                String::new(),
            ),
            Ok(Ok(out)) => (
                out.status.to_string(),
                ProcessEnd::of(&out.status),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            ),
        };
        Ok(Record::ProposerRan {
            step: n,
            command: command.to_owned(),
            seconds: started.elapsed().as_secs_f64(),
            status,
            timed_out: end == ProcessEnd::TimedOut,
            output_tail: crate::gpu::build::log_tail(&output, 40),
            end: Some(end),
        })
    }
}
