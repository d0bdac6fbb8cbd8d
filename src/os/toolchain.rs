//! Finding nvcc, one order for every command (`tune`, `build`, `doctor`, `setup`, the tests), and
//! installing the pinned PyPI compiler when none is found.
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The CUDA compiler in use, identified by its full version banner (part of every build key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    pub version: String,
    /// The environment every nvcc run gets: the allow-listed variables ([`NVCC_ENVIRONMENT`]) as
    /// this process had them when the compiler was found, nothing else. Not logged: a PATH is the
    /// user's business; the build key covers it.
    #[serde(default, skip_serializing)]
    pub environment: Vec<(String, String)>,
    /// A hash of the compiler's own bytes and version: a cubin built by another nvcc at the same
    /// path is never reused (absent from logs written before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
}

/// The only variables nvcc is run with. Anything else in flashtune's environment is dropped: an
/// `NVCC_APPEND_FLAGS`, `NVCC_PREPEND_FLAGS` or `CPATH` set by whoever started the run (an agent
/// that runs `flashtune judge` itself) would change what is built without changing the source.
/// PATH finds the host compiler; TMPDIR is where nvcc writes its intermediates.
pub const NVCC_ENVIRONMENT: [&str; 2] = ["PATH", "TMPDIR"];

impl Toolchain {
    /// A toolchain for `nvcc`, its version as it reports it, with this process's allow-listed
    /// environment and the compiler's fingerprint.
    pub fn new(nvcc: PathBuf, version: String) -> Self {
        let environment = NVCC_ENVIRONMENT
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
            .collect();
        let mut h = blake3::Hasher::new();
        h.update(version.as_bytes());
        match std::fs::read(&nvcc) {
            Ok(bytes) => h.update(&bytes),
            Err(e) => h.update(format!("unreadable: {e}").as_bytes()),
        };
        let tc = Toolchain {
            nvcc,
            version,
            environment,
            fingerprint: h.finalize().to_hex()[..24].to_owned(),
        };
        trusted_tree(&tc);
        tc
    }

    /// The folders nvcc runs and reads from when it builds a cubin: `bin/` (nvcc, ptxas,
    /// fatbinary), `nvvm/` (cicc, libdevice) and `include/` under the toolkit's top (nvcc's
    /// folder's parent), each resolved where it is a link (`include` is one in a full toolkit). Not
    /// the whole top: nvcc on PATH may be `/usr/bin/nvcc`, and all of `/usr` is not cheap to check.
    pub fn trusted_folders(&self) -> Vec<PathBuf> {
        let nvcc = self
            .nvcc
            .canonicalize()
            .unwrap_or_else(|_| self.nvcc.clone());
        let Some(top) = nvcc.parent().and_then(Path::parent) else {
            return Vec::new();
        };
        let mut out: Vec<PathBuf> = ["bin", "nvvm", "include"]
            .iter()
            .filter_map(|d| top.join(d).canonicalize().ok())
            .collect();
        out.dedup();
        out
    }

    /// Whether the toolchain's folders are as they were when this process first set this
    /// toolchain up (see [`Toolchain::trusted_folders`]): checked before every nvcc run.
    pub fn check_untouched(&self) -> std::result::Result<(), crate::os::trusted::Tampered> {
        trusted_tree(self).check()
    }

    /// Where nvcc writes its intermediates: the TMPDIR it runs with, else /tmp.
    pub fn scratch_dir(&self) -> PathBuf {
        self.environment
            .iter()
            .find(|(k, v)| k == "TMPDIR" && !v.is_empty())
            .map_or_else(|| PathBuf::from("/tmp"), |(_, v)| PathBuf::from(v))
    }

    /// A command that runs this nvcc with the allow-listed environment only.
    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.nvcc);
        cmd.env_clear().envs(self.environment.iter().cloned());
        cmd
    }
}

/// The toolchain's folders as this process first saw them, one fingerprint per nvcc: taken when a
/// toolchain is set up (`Toolchain::new`), or at its first check for one made otherwise. Kept
/// process-wide, not in `Toolchain`, which is logged and compared: the fingerprint is state of this
/// run, not a property of the compiler.
fn trusted_tree(tc: &Toolchain) -> std::sync::Arc<crate::os::trusted::TrustedTree> {
    use std::sync::{Arc, Mutex, OnceLock};
    type Trees = Mutex<std::collections::BTreeMap<PathBuf, Arc<crate::os::trusted::TrustedTree>>>;
    static TREES: OnceLock<Trees> = OnceLock::new();
    let mut trees = TREES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    trees
        .entry(tc.nvcc.clone())
        .or_insert_with(|| {
            let started = std::time::Instant::now();
            let tree = crate::os::trusted::TrustedTree::take(
                tc.trusted_folders(),
                "the CUDA toolchain",
                "reinstall it: `flashtune setup` for .tools/cuda, or your CUDA installer",
            );
            tracing::debug!(nvcc = %tc.nvcc.display(), files = tree.len(), ms = started.elapsed().as_millis() as u64, "toolchain fingerprinted");
            Arc::new(tree)
        })
        .clone()
}

/// Where an nvcc candidate comes from, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvccSource {
    /// `FLASHTUNE_NVCC`: an explicit choice wins over everything found.
    Override,
    /// The first `nvcc` on PATH.
    Path,
    /// `$CUDA_HOME/bin/nvcc`, then `$CUDA_PATH/bin/nvcc`.
    CudaHome,
    /// `/usr/local/cuda/bin/nvcc`, where the toolkit's installers put it.
    UsrLocal,
    /// `.tools/cuda` in the project: what `flashtune setup` (and `scripts/test.sh`) install.
    ProjectTools,
}

impl NvccSource {
    pub fn describe(self) -> &'static str {
        match self {
            NvccSource::Override => "FLASHTUNE_NVCC",
            NvccSource::Path => "PATH",
            NvccSource::CudaHome => "CUDA_HOME / CUDA_PATH",
            NvccSource::UsrLocal => "/usr/local/cuda",
            NvccSource::ProjectTools => ".tools/cuda (flashtune setup)",
        }
    }
}

/// The PyPI packages `flashtune setup` installs, pinned together (scripts/cuda-requirements.txt).
pub const PINNED_REQUIREMENTS: &str = include_str!("../../scripts/cuda-requirements.txt");
/// Where `flashtune setup` installs, under the project root.
pub const PROJECT_TOOLS_DIR: &str = ".tools/cuda";
/// The command every "nvcc not found" message gives: it works from any project folder.
pub const SETUP_HINT: &str = "flashtune setup";

fn project_nvcc(root: &Path) -> PathBuf {
    root.join(PROJECT_TOOLS_DIR).join("nvidia/cu13/bin/nvcc")
}

/// Every place nvcc may be, in the order they are tried.
pub fn nvcc_candidates(root: &Path) -> Vec<(NvccSource, PathBuf)> {
    let mut out: Vec<(NvccSource, PathBuf)> = Vec::new();
    if let Some(p) = std::env::var_os("FLASHTUNE_NVCC").filter(|p| !p.is_empty()) {
        out.push((NvccSource::Override, p.into()));
    }
    if let Some(path) = std::env::var_os("PATH") {
        out.extend(std::env::split_paths(&path).map(|d| (NvccSource::Path, d.join("nvcc"))));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            out.push((NvccSource::CudaHome, Path::new(&home).join("bin/nvcc")));
        }
    }
    out.push((NvccSource::UsrLocal, "/usr/local/cuda/bin/nvcc".into()));
    out.push((NvccSource::ProjectTools, project_nvcc(root)));
    out
}

/// The first candidate that runs `--version`, and where it came from.
pub fn locate_nvcc(root: &Path) -> Option<(NvccSource, Toolchain)> {
    nvcc_candidates(root)
        .into_iter()
        .find_map(|(source, nvcc)| {
            // Absolute, whatever the candidate: the path reaches processes that run elsewhere (a
            // judge the MCP server starts in the project, a Slurm step, the test script's children).
            let nvcc = std::path::absolute(&nvcc).unwrap_or(nvcc);
            if !nvcc.is_file() {
                return None;
            }
            let out = std::process::Command::new(&nvcc)
                .env_clear()
                .envs(
                    NVCC_ENVIRONMENT
                        .iter()
                        .filter_map(|k| Some((k, std::env::var(k).ok()?))),
                )
                .arg("--version")
                .output()
                .ok()?;
            if !out.status.success() {
                return None;
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let version = text
                .lines()
                .filter(|l| l.contains("release") || l.starts_with("Build"))
                .collect::<Vec<_>>()
                .join("; ");
            Some((source, Toolchain::new(nvcc, version)))
        })
}

/// A relative `FLASHTUNE_NVCC` made absolute against this process's folder, before anything starts
/// a child in another folder with the variable inherited. Call before any thread starts.
pub fn absolutize_override() {
    let Some(given) = std::env::var_os("FLASHTUNE_NVCC").filter(|p| !p.is_empty()) else {
        return;
    };
    if Path::new(&given).is_relative() {
        if let Ok(abs) = std::path::absolute(Path::new(&given)) {
            std::env::set_var("FLASHTUNE_NVCC", abs);
        }
    }
}

/// nvcc for the project at `root`, or an error whose hint is a command that installs one.
pub fn find_nvcc(root: &Path) -> Result<Toolchain> {
    locate_nvcc(root).map(|(_, tc)| tc).ok_or_else(not_found)
}

fn not_found() -> Error {
    Error::ToolMissing {
        tool: "nvcc".into(),
        hint: format!(
            "looked at FLASHTUNE_NVCC, PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda and {PROJECT_TOOLS_DIR}; \
             install the CUDA toolkit, or run `{SETUP_HINT}` (installs the pinned nvcc 13.0 from \
             PyPI into {PROJECT_TOOLS_DIR}: python3 with pip, network, about 300 MB). \
             `--fake-gpu` needs it too: the test double times no GPU but runs the real builds"
        ),
    }
}

/// A program that needs the headers a kernel build needs (cuda_fp16.h reaches into CCCL).
const PROBE_SOURCE: &str =
    "#include <cuda_fp16.h>\n__global__ void probe(__half *x) { x[0] = __float2half(1.0f); }\n";

/// Compiles a probe with `tc` for `arch`: nvcc found is not nvcc that works.
pub fn probe_compile(tc: &Toolchain, arch: &str) -> Result<()> {
    let dir = tempfile_dir()?;
    let src = dir.join("probe.cu");
    std::fs::write(&src, PROBE_SOURCE)
        .map_err(|e| Error::BadInput(format!("{}: {e}", src.display())))?;
    let out = tc
        .command()
        .args(["-cubin", &format!("-arch={arch}"), "-o"])
        .arg(dir.join("probe.cubin"))
        .arg(&src)
        .output()
        .map_err(|e| Error::BadInput(format!("{}: {e}", tc.nvcc.display())))?;
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::BadInput(format!(
            "{} cannot compile a kernel that includes cuda_fp16.h for {arch}:\n{}",
            tc.nvcc.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("flashtune-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::BadInput(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// `flashtune setup`: use the nvcc the search finds, or install the pinned one into the project's
/// `.tools/cuda`; either way, prove it compiles for `arch`. Returns what is in use and where from.
pub fn setup(root: &Path, arch: &str) -> Result<(NvccSource, Toolchain)> {
    if let Some((source, tc)) = locate_nvcc(root) {
        crate::tell!(
            "nvcc found ({}): {} — {}",
            source.describe(),
            tc.nvcc.display(),
            tc.version
        );
        probe_compile(&tc, arch)?;
        return Ok((source, tc));
    }
    let target = root.join(PROJECT_TOOLS_DIR);
    let requirements =
        std::env::temp_dir().join(format!("flashtune-cuda-{}.txt", std::process::id()));
    std::fs::write(&requirements, PINNED_REQUIREMENTS)
        .map_err(|e| Error::BadInput(format!("{}: {e}", requirements.display())))?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    crate::tell!(
        "no nvcc found: installing the pinned CUDA compiler from PyPI into {} ({python} -m pip install --target ...)",
        target.display()
    );
    let status = std::process::Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(&target)
        .arg("-r")
        .arg(&requirements)
        .status();
    let _ = std::fs::remove_file(&requirements);
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            return Err(Error::BadInput(format!(
                "`{python} -m pip install` into {} failed ({s}); it needs network access to PyPI",
                target.display()
            )))
        }
        Err(e) => {
            return Err(Error::ToolMissing {
                tool: "python3".into(),
                hint: format!("{python}: {e}; `flashtune setup` installs nvcc with pip (set PYTHON to choose the interpreter)"),
            })
        }
    }
    let (source, tc) = locate_nvcc(root).ok_or_else(not_found)?;
    probe_compile(&tc, arch)?;
    crate::tell!(
        "installed ({}): {} — {}",
        source.describe(),
        tc.nvcc.display(),
        tc.version
    );
    Ok((source, tc))
}
