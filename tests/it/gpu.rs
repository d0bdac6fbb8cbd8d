//! Real-GPU tests: run with FLASHTUNE_GPU_TESTS=1 on a machine with an NVIDIA GPU.
use crate::common;
use common::*;
use flashtune::log::runlog::{self, Record};
use std::path::PathBuf;

#[test]
#[ignore = "needs an NVIDIA GPU: FLASHTUNE_GPU_TESTS=1 scripts/test.sh"]
fn smoke_tune_passes_every_check_on_the_gpu() {
    let dir = scratch_project();
    let out = flashtune(dir.path(), &["tune", "--space", "variants/smoke.toml"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let run = PathBuf::from(
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("Run log: "))
            .unwrap(),
    );
    let log = runlog::read(&run).unwrap();
    let failures: Vec<String> = log
        .entries
        .iter()
        .filter(|(_, e)| {
            matches!(
                e.record,
                Record::CheckFailed { .. }
                    | Record::WorkerCrashed { .. }
                    | Record::TimedOut { .. }
                    | Record::BuildFailed { .. }
            )
        })
        .map(|(l, e)| format!("line {l}: {:?}", e.record))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(log.header().unwrap().device.name.contains("NVIDIA"));
    // PyTorch is installed on the GPU machines this runs on: its timings land in the same log.
    assert!(
        log.entries
            .iter()
            .any(|(_, e)| matches!(e.record, Record::BaselineTimed { .. })),
        "no PyTorch timings in the log"
    );
}
