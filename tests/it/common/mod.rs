//! Helpers every test binary shares: where the checkout and the binary are, scratch projects, running the CLI.
#![allow(dead_code)]
pub mod gitstate;
pub mod schema;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The checkout; `FLASHTUNE_REPO` points elsewhere when the test binary is carried to a GPU machine.
pub fn repo() -> PathBuf {
    std::env::var_os("FLASHTUNE_REPO")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

pub fn binary() -> PathBuf {
    seal_key_dir();
    std::env::var_os("FLASHTUNE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_flashtune")),
        PathBuf::from,
    )
}

/// The folder of the seal key the tests and every flashtune they start share, never the user's own:
/// set for this process on first use (every test starts the binary through [`binary`]), so each
/// child inherits it.
pub fn seal_key_dir() -> PathBuf {
    static SET: std::sync::Once = std::sync::Once::new();
    let dir = repo().join("target/test-seal-key");
    SET.call_once(|| std::env::set_var(flashtune::os::seal::KEY_DIR_ENV, &dir));
    dir
}

/// Seal a run log written by hand (a fixture standing for a log of flashtune's own), with the
/// tests' key, as flashtune seals a log it writes.
pub fn seal_log(log: &Path) {
    use flashtune::os::seal::{lines_of, seal_file_of, Chain, SealKey};
    let key = SealKey::load_or_create_in(&seal_key_dir()).unwrap();
    let run_id = log.parent().unwrap().file_name().unwrap().to_string_lossy();
    let mut chain = Chain::start(&key, &run_id);
    let bytes = std::fs::read(log).unwrap();
    let seals: String = lines_of(&bytes)
        .iter()
        .map(|line| chain.seal(line) + "\n")
        .collect();
    std::fs::write(seal_file_of(log), seals).unwrap();
}

/// A file under tests/fixtures (copied from real tool outputs; the repository stands alone).
pub fn fixture(rel: &str) -> String {
    let path = repo().join("tests/fixtures").join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {} missing: {e}", path.display()))
}

/// Copy a folder of the checkout, subfolders included.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// A throwaway project: the shipped policies, variants, kernels and baselines, its own runs/ folder.
/// Its default space is `smoke`, the space CI runs (the shipped default, `quick`, has shapes the
/// test double would compute on the CPU for minutes).
pub fn scratch_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for sub in ["variants", "kernels", "baselines"] {
        copy_tree(&repo().join(sub), &dir.path().join(sub));
    }
    let policies = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    let smoke = policies.replace(
        r#"default_space = "variants/quick.toml""#,
        r#"default_space = "variants/smoke.toml""#,
    );
    assert_ne!(policies, smoke, "policies.toml's default space moved");
    std::fs::write(dir.path().join("policies.toml"), smoke).unwrap();
    dir
}

/// Run the CLI on a project; every test shares one content-addressed build cache.
/// `flashtune judge --json --fake-gpu` on the one-shape CI space, then `extra`.
pub fn fake_judge_json(root: &Path, extra: &[&str]) -> Output {
    let args = [
        "judge",
        "--json",
        "--fake-gpu",
        "--space",
        "variants/step-ci.toml",
    ];
    let all: Vec<&str> = args.iter().chain(extra).copied().collect();
    flashtune(root, &all)
}

/// `flashtune step --fake-gpu` on the one-shape CI space, then `extra`.
pub fn fake_step(root: &Path, extra: &[&str]) -> Output {
    let args = ["step", "--fake-gpu", "--space", "variants/step-ci.toml"];
    let all: Vec<&str> = args.iter().chain(extra).copied().collect();
    flashtune(root, &all)
}

pub fn flashtune(root: &Path, args: &[&str]) -> Output {
    flashtune_with_env(root, args, &[])
}

pub fn flashtune_with_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(binary())
        .arg("--root")
        .arg(root)
        .args(args)
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .envs(env.iter().copied())
        .output()
        .expect("flashtune runs")
}

/// Each time the command read `run_dir`'s log back from disk, from its debug log (`FLASHTUNE_LOG`
/// set to [`LOG_READS`]).
pub fn log_reads_of(out: &Output, run_dir: &Path) -> usize {
    let id = run_dir.file_name().unwrap().to_string_lossy().into_owned();
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("reading a run log from disk") && l.contains(&id))
        .count()
}

/// `FLASHTUNE_LOG` that makes a command say every run log it reads from disk.
pub const LOG_READS: (&str, &str) = ("FLASHTUNE_LOG", "warn,flashtune::log_read=debug");

/// [`flashtune`] started with extra environment, its output piped, for a test that acts on it
/// while it runs (a signal, a cancelled Slurm step).
pub fn flashtune_child(root: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(binary());
    cmd.arg("--root")
        .arg(root)
        .args(args)
        .env(
            "FLASHTUNE_CACHE_DIR",
            repo().join("target/test-build-cache"),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Make `dir` a git repository whose one commit holds everything in it.
pub fn commit_all(dir: &Path, message: &str) {
    let repo = git2::Repository::open(dir)
        .or_else(|_| git2::Repository::init(dir))
        .unwrap();
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("test", "test@localhost").unwrap();
    let parents: Vec<git2::Commit> = repo
        .head()
        .ok()
        .and_then(|h| h.peel_to_commit().ok())
        .into_iter()
        .collect();
    let parents: Vec<&git2::Commit> = parents.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
        .unwrap();
}

/// Rewrite a file with every `from` replaced by `to`; `from` must be there (a test that edits
/// nothing tests nothing).
pub fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.contains(from),
        "{} holds no `{from}` to replace",
        path.display()
    );
    std::fs::write(path, text.replace(from, to)).unwrap();
}

/// Rewrite line `n` (1-based) of a file with its first `from` replaced by `to`, as a hand that
/// edits one record would.
pub fn edit_line(path: &Path, n: usize, from: &str, to: &str) {
    let lines: Vec<String> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i + 1 == n {
                assert!(
                    l.contains(from),
                    "line {n} of {} holds no `{from}`",
                    path.display()
                );
                l.replacen(from, to, 1)
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// The run folder a CLI run printed (`Run log: runs/<id>/log.jsonl`, alone on its line or, as
/// `flashtune step` prints it, at the end of one).
pub fn run_dir_from(out: &Output) -> PathBuf {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("Run log: ").map(|(_, path)| path.to_owned()))
        .unwrap_or_else(|| panic!("no run log in:\n{}", text(out)));
    PathBuf::from(line).parent().unwrap().to_path_buf()
}

/// The one run folder under `root/runs` that holds a run log.
pub fn only_run(root: &Path) -> PathBuf {
    only_run_holding(root, "log.jsonl")
}

/// The one run folder under `root/runs` that holds `file` (an agent session's `ledger.json`).
pub fn only_run_holding(root: &Path, file: &str) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(root.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join(file).is_file())
        .collect();
    assert_eq!(runs.len(), 1, "one run folder holding {file}: {runs:?}");
    runs[0].clone()
}

/// A run's records with the log line each came from.
pub fn numbered_records(run_dir: &Path) -> Vec<(usize, flashtune::log::runlog::Record)> {
    flashtune::log::runlog::read(&run_dir.join("log.jsonl"))
        .unwrap()
        .entries
        .into_iter()
        .map(|(l, e)| (l, e.record))
        .collect()
}

/// A run's records.
pub fn records(run_dir: &Path) -> Vec<flashtune::log::runlog::Record> {
    numbered_records(run_dir)
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// A scratch project that measures f16 only, with `space` measured on `shapes` (a TOML list of
/// names from policies.toml): each point is one real nvcc build per head dim.
pub fn f16_project(space: &str, shapes: &str) -> tempfile::TempDir {
    let dir = scratch_project();
    replace_in(
        &dir.path().join("policies.toml"),
        "dtypes = [\"f16\", \"bf16\"]",
        "dtypes = [\"f16\"]",
    );
    let path = dir.path().join("variants").join(space);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("\nshapes = [").expect("space selects shapes") + 1;
    let end = start + text[start..].find('\n').unwrap();
    std::fs::write(
        &path,
        format!("{}shapes = {shapes}{}", &text[..start], &text[end..]),
    )
    .unwrap();
    dir
}

/// The forward kernel every step test edits.
pub const FORWARD: &str = "kernels/attention/forward.cu";

/// One variant, one shape, one dtype: each step builds a single forward kernel for the edit.
pub const SPACE: &str = r#"
name = "step-ci"
description = "the scalar baseline on one small shape"
constraints = []
shapes = ["small"]
baseline = { MMA = "scalar", BLOCK_M = 64, BLOCK_N = 64, WARPS = 4, KV_SPLIT = 1, STAGES = 1 }

[symbols]
auto = 0

[family]
forward = "kernels/attention/forward.cu"
forward_entry = "attn_fwd"
combine_entry = "attn_combine"
reference = "kernels/oracle/reference.cu"
reference_entry = "attn_reference"
threads = "WARPS * 32"
rows_per_cta = "BLOCK_M"
kv_rows_per_block = "BLOCK_N"
kv_splits = "KV_SPLIT"
smem_bytes = '(BLOCK_M + 2 * STAGES * BLOCK_N) * (HEAD_DIM + 8) * ELEM_BYTES + BLOCK_M * (BLOCK_N + 4) * 4'

[params]
MMA = ["scalar"]
BLOCK_M = [64]
BLOCK_N = [64]
WARPS = [4]
KV_SPLIT = [1]
STAGES = [1]
"#;

/// A scratch copy of the project (f16 only, plus the small space) as a git repository with one commit.
pub fn repo_project() -> tempfile::TempDir {
    repo_project_with(|p| p)
}

pub fn repo_project_with(edit_policies: impl Fn(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for sub in ["variants", "kernels/attention", "kernels/oracle"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for f in std::fs::read_dir(repo().join(sub)).unwrap() {
            let f = f.unwrap().path();
            if f.is_file() {
                std::fs::copy(&f, dir.path().join(sub).join(f.file_name().unwrap())).unwrap();
            }
        }
    }
    let policies = std::fs::read_to_string(repo().join("policies.toml")).unwrap();
    let policies = policies.replace(r#"dtypes = ["f16", "bf16"]"#, r#"dtypes = ["f16"]"#);
    assert!(policies.contains(r#"dtypes = ["f16"]"#));
    let policies = edit_policies(policies);
    std::fs::write(dir.path().join("policies.toml"), policies).unwrap();
    std::fs::write(dir.path().join("variants/step-ci.toml"), SPACE).unwrap();
    std::fs::write(dir.path().join(".gitignore"), "runs/\n").unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
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

/// policies.toml with the sandbox switched off: for the checks that hold where the kernel offers no
/// sandbox (a proposer's writes outside its scope, its commits, its edits of the run files).
pub fn unconfined(policies: String) -> String {
    let off = policies.replace("[sandbox]\nenabled = true", "[sandbox]\nenabled = false");
    assert_ne!(off, policies, "policies.toml's [sandbox] table moved");
    off
}

/// Appends a global the fake GPU finds in the cubin: it scales the edit's times or injects a fault.
pub fn mark_forward(dir: &Path, marker: &str) -> String {
    let path = dir.join(FORWARD);
    let original = std::fs::read_to_string(&path).unwrap();
    let name = marker.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    std::fs::write(
        &path,
        format!(
            "{original}\n__device__ char flashtune_fake_{name}[] = \"flashtune-fake: {marker}\";\n"
        ),
    )
    .unwrap();
    original
}

/// Whether a verdict refuses an edit for its timing on `shape`: unstable there (a spread far beyond
/// HEAD's) or slower there beyond HEAD's noise.
pub fn regression_on(reason: &str, shape: &str) -> bool {
    reason.contains(&format!("unstable on {shape}"))
        || reason.contains(&format!("slower beyond noise on {shape}"))
}

/// A shape named "t" of `b` batches and `h` heads: what the unit tests of shapes, the oracle and the
/// double build their cases from.
pub fn shape(
    b: u32,
    h: u32,
    sq: u32,
    sk: u32,
    d: u32,
    causal: flashtune::model::config::Causal,
) -> flashtune::model::config::Shape {
    flashtune::model::config::Shape {
        name: "t".into(),
        b,
        h,
        sq,
        sk,
        d,
        causal,
    }
}

/// The champion variant per (shape, dtype) that a run's report.json names.
pub fn champions(run: &Path) -> std::collections::BTreeMap<(String, String), String> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("report.json")).unwrap()).unwrap();
    json["champions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap().to_owned();
            ((field("shape"), field("dtype")), field("variant"))
        })
        .collect()
}
