//! git2 on temporary repositories: champions committed on their own branch with trailers, a dirty table refused, kernel edits reverted or committed.
use crate::common;
use common::*;
use flashtune::gpu::decide;
use flashtune::log::runlog::{self};
use flashtune::os::vcs;
use std::path::Path;

/// A project that is its own git repository with one commit.
fn repo_project() -> tempfile::TempDir {
    let dir = scratch_project();
    let repo = git2::Repository::init(dir.path()).unwrap();
    std::fs::write(dir.path().join(".gitignore"), "runs/\n").unwrap();
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("test", "test@localhost").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "initial", &tree, &[])
        .unwrap();
    dir
}

fn head(dir: &Path) -> String {
    git2::Repository::open(dir)
        .unwrap()
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string()
}

#[test]
fn champions_are_committed_on_their_own_branch_with_trailers() {
    let dir = repo_project();
    let before = head(dir.path());
    // `--commit` refuses the fake GPU's synthetic figures, so commit its run's table directly.
    let out = flashtune(dir.path(), &["tune", "--fake-gpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let log = runlog::read(&run_dir_from(&out).join("log.jsonl")).unwrap();
    flashtune::report::champions::commit(
        dir.path(),
        "kernels/attention/tuned.toml",
        &log,
        &flashtune::report::champions::from_log(&log),
    )
    .unwrap();
    let repo = git2::Repository::open(dir.path()).unwrap();
    assert_eq!(head(dir.path()), before, "HEAD must not move");
    assert!(
        !dir.path().join("kernels/attention/tuned.toml").exists(),
        "the working tree must not change"
    );
    let branch = repo
        .branches(Some(git2::BranchType::Local))
        .unwrap()
        .filter_map(|b| b.ok())
        .find_map(|(b, _)| {
            b.name()
                .ok()
                .flatten()
                .filter(|n| n.starts_with("flashtune/"))
                .map(str::to_owned)
        })
        .expect("a flashtune/<run-id> branch");
    let commit = repo
        .revparse_single(&branch)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let message = commit.message().unwrap();
    assert!(
        message.contains("Flashtune-Run: ") && message.contains("Flashtune-Speedup: "),
        "{message}"
    );
    let blob = commit
        .tree()
        .unwrap()
        .get_path(Path::new("kernels/attention/tuned.toml"))
        .unwrap()
        .to_object(&repo)
        .unwrap()
        .peel_to_blob()
        .unwrap();
    let table: flashtune::report::champions::Table =
        toml::from_str(std::str::from_utf8(blob.content()).unwrap()).unwrap();
    assert_eq!(table.champion.len(), 14, "7 shapes x 2 dtypes");
    assert!(table
        .champion
        .iter()
        .all(|c| c.log_line > 0 && branch.ends_with(&c.run)));
}

#[test]
fn a_dirty_champion_table_is_refused_by_name() {
    let dir = repo_project();
    std::fs::write(dir.path().join("kernels/attention/tuned.toml"), "# mine\n").unwrap();
    let repo = git2::Repository::open(dir.path()).unwrap();
    let mut index = repo.index().unwrap();
    index
        .add_path(Path::new("kernels/attention/tuned.toml"))
        .unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("test", "test@localhost").unwrap();
    let parent = repo.head().unwrap().peel_to_commit().unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "table", &tree, &[&parent])
        .unwrap();
    std::fs::write(
        dir.path().join("kernels/attention/tuned.toml"),
        "# edited by hand\n",
    )
    .unwrap();
    // Refused before any GPU is needed (and --fake-gpu never commits).
    let out = flashtune(dir.path(), &["tune", "--commit"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("kernels/attention/tuned.toml"), "{t}");
}

#[test]
fn kernel_edits_are_reverted_or_committed() {
    // Interleaved samples as a duel returns them: 15 evenly spread over ±1% of the centre, so
    // their p10..p90 spread is 1.6%.
    let around = |center: f64| -> Vec<f64> {
        (0..15)
            .map(|i| center * (1.0 + 0.02 * (i as f64 / 14.0 - 0.5)))
            .collect()
    };
    let duel = |challenger: f64| decide::Duel {
        champion_us: around(100.0),
        challenger_us: around(challenger),
    };
    let dir = repo_project();
    let fwd = dir.path().join("kernels/attention/forward.cu");
    let original = std::fs::read_to_string(&fwd).unwrap();
    std::fs::write(&fwd, format!("{original}\n// slower\n")).unwrap();
    std::fs::write(
        dir.path().join("kernels/attention/new.cuh"),
        "// new file\n",
    )
    .unwrap();
    // 10% slower: rejected, and the edit (a changed file and a new one) goes back to HEAD.
    let slower = decide::judge(&duel(110.0), 0.02);
    assert!(!slower.accept, "{slower:?}");
    assert!(
        (slower.gain - (100.0 / 110.0 - 1.0)).abs() < 1e-9,
        "{slower:?}"
    );
    assert!(slower.reason.contains("threshold"), "{}", slower.reason);
    let changed: Vec<String> = vcs::changed_against_head(dir.path())
        .unwrap()
        .into_iter()
        .filter(|p| p.starts_with("kernels/"))
        .collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    vcs::restore_paths(dir.path(), &changed).unwrap();
    assert_eq!(std::fs::read_to_string(&fwd).unwrap(), original);
    assert!(!dir.path().join("kernels/attention/new.cuh").exists());
    assert!(vcs::changed_against_head(dir.path()).unwrap().is_empty());

    // 1% faster, above a 0.5% threshold but inside the 1.6% p10..p90 spread: not a win either.
    let within_noise = decide::judge(&duel(99.0), 0.005);
    assert!(!within_noise.accept, "{within_noise:?}");
    assert!(
        within_noise.reason.contains("noise"),
        "{}",
        within_noise.reason
    );

    // 10% faster (100 / 90.9 = 1.10): accepted, committed with the gain as its trailer.
    let faster = decide::judge(&duel(100.0 / 1.1), 0.02);
    assert!(faster.accept, "{faster:?}");
    assert!((faster.gain - 0.10).abs() < 1e-9, "{faster:?}");
    assert!((faster.noise - 0.016).abs() < 1e-9, "{faster:?}");
    let before = head(dir.path());
    std::fs::write(&fwd, format!("{original}\n// faster\n")).unwrap();
    vcs::commit_paths(
        dir.path(),
        &["kernels/attention/forward.cu".into()],
        &format!("faster\n\nFlashtune-Speedup: {:.2}x", 1.0 + faster.gain),
    )
    .unwrap();
    assert_ne!(head(dir.path()), before);
    assert!(vcs::changed_against_head(dir.path()).unwrap().is_empty());
    let message = git2::Repository::open(dir.path())
        .unwrap()
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .message()
        .unwrap()
        .to_owned();
    assert!(message.ends_with("Flashtune-Speedup: 1.10x"), "{message}");
}
