//! The tests of `src/gpu/slurm.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::gpu::slurm::*;
use flashtune::model::config::SlurmPolicy;
use std::path::Path;

#[test]
fn slurms_own_words_name_the_loss_and_a_crash_is_not_one() {
    let cancelled = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\nslurmstepd-vm: error: *** STEP 6.0 ON vm CANCELLED AT 2026-11-24T14:46:53 ***\nsrun: error: vm: task 0: Killed";
    assert_eq!(step_loss(cancelled), Some(StepLoss::Cancelled));
    let limit = "slurmstepd-vm: error: *** STEP 8.0 ON vm CANCELLED AT 2026-11-24T14:48:06 DUE TO TIME LIMIT ***";
    assert_eq!(step_loss(limit), Some(StepLoss::TimeLimit));
    let job = "slurmstepd: error: *** JOB 12 ON gpu7 CANCELLED AT 2026-11-24T14:48:32 DUE TO PREEMPTION ***";
    assert_eq!(step_loss(job), Some(StepLoss::Preempted));
    assert_eq!(
        step_loss("srun: error: Node failure on gpu3\nsrun: Job step aborted"),
        Some(StepLoss::NodeFailure)
    );
    // Seen under load: srun's word that the controller aborted the step, slurmstepd's line lost.
    let abort_only = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\nsrun: error: vm: task 0: Killed";
    assert_eq!(step_loss(abort_only), Some(StepLoss::Cancelled));
    // The worker's own deaths: a signal, a kill of its own, an exit code.
    for own in [
        "srun: error: vm: task 0: Aborted",
        "srun: error: vm: task 0: Segmentation fault",
        "srun: error: vm: task 0: Killed\nsrun: Force Terminated StepId=5.0",
        "srun: error: vm: task 0: Exited with exit code 3",
        "the kernel printed *** something *** here",
    ] {
        assert_eq!(step_loss(own), None, "{own}");
    }
}

#[test]
fn job_states_that_end_a_run_and_those_that_do_not() {
    assert_eq!(job_state("RUNNING", ""), JobState::Running);
    assert_eq!(
        job_state("COMPLETING", ""),
        JobState::Ended("is completing".into())
    );
    assert_eq!(
        job_state("", "slurm_load_jobs error: Invalid job id specified"),
        JobState::Ended("is gone".into())
    );
    assert_eq!(
        job_state(
            "",
            "slurm_load_jobs error: Unable to contact slurm controller"
        ),
        JobState::Unknown
    );
}

#[test]
fn a_node_that_sees_other_files_is_named_with_the_fix() {
    let (exe, cache) = (Path::new("/home/a/flashtune"), Path::new("/tmp/cache"));
    assert!(shared_verdict("tok\n", "", "tok", exe, cache).is_ok());
    let e = shared_verdict("no-cache gpu7\n", "", "tok", exe, cache).unwrap_err();
    assert!(
        e.contains("gpu7") && e.contains("/tmp/cache") && e.contains("FLASHTUNE_CACHE_DIR"),
        "{e}"
    );
    let e = shared_verdict("no-binary gpu7\n", "", "tok", exe, cache).unwrap_err();
    assert!(e.contains("cannot run /home/a/flashtune"), "{e}");
    let e = shared_verdict(
        "",
        "srun: error: Unable to allocate resources: Invalid partition name specified",
        "tok",
        exe,
        cache,
    )
    .unwrap_err();
    assert!(e.contains("Invalid partition"), "{e}");
}

#[test]
fn the_options_ask_for_the_policys_resources_and_no_gpu_for_the_double() {
    let mut policy = SlurmPolicy {
        partition: "gpu".into(),
        extra_args: vec!["--constraint=h100".into()],
        ..SlurmPolicy::default()
    };
    let srun = Srun {
        policy: policy.clone(),
        tasks: 4,
        gres: true,
    };
    let o = srun.options();
    assert!(o.contains(&"--gres=gpu:1".to_owned()), "{o:?}");
    assert!(o.contains(&"--partition=gpu".to_owned()), "{o:?}");
    assert!(o.contains(&"--constraint=h100".to_owned()), "{o:?}");
    assert!(!o.iter().any(|a| a.starts_with("--account")), "{o:?}");
    policy.gres = "gpu:h100:1".into();
    let fake = Srun {
        policy,
        tasks: 4,
        gres: false,
    };
    assert!(!fake.options().iter().any(|a| a.starts_with("--gres")));
}
