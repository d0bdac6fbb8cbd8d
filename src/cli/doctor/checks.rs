//! `flashtune doctor`: one line per prerequisite, each pass or fail with what to do about it. Never panics.
use crate::gpu::executor::Executor;
use crate::model::config::ProjectPaths;
use crate::model::protocol::{DeviceInfo, WorkerRequest};
use std::process::Stdio;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = match self.status {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        write!(f, "[{tag}] {:<6} {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, " — fix: {fix}")?;
        }
        Ok(())
    }
}

fn check(
    name: &'static str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<&str>,
) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        fix: fix.map(str::to_owned),
    }
}

pub async fn run(paths: &ProjectPaths) -> Vec<Check> {
    let mut checks = vec![policies(paths), nvcc(paths)];
    let gpu = gpu().await;
    let device = gpu.as_ref().ok().cloned();
    checks.push(match gpu {
        Ok(d) => check(
            "gpu",
            Status::Pass,
            format!(
                "{} (GPU {}, {} SMs, {}, {} KiB shared memory opt-in, driver {}.{}); its output comparison agrees with the host's",
                d.name,
                d.ordinal,
                d.sm_count,
                d.arch,
                d.max_smem_optin_bytes / 1024,
                d.driver_version / 1000,
                (d.driver_version % 1000) / 10
            ),
            None,
        ),
        Err(e) => check("gpu", Status::Fail, format!("no GPU usable: {e}"), Some(crate::error::NO_GPU_NEXT_STEPS)),
    });
    checks.push(ncu(device.as_ref()).await);
    checks.push(pytorch(paths).await);
    checks.push(git(paths));
    checks.push(disk(paths));
    checks
}

/// policies.toml and the default space load as `tune` would load them.
fn policies(paths: &ProjectPaths) -> Check {
    let loaded = crate::model::config::Policies::load(&paths.policies()).and_then(|(p, _)| {
        crate::model::space::Space::load(&paths.resolve(&p.default_space)).map(|s| (p, s))
    });
    match loaded {
        Ok((p, _)) => check(
            "config",
            Status::Pass,
            format!(
                "{} and {} load ({} shapes, {} dtypes)",
                paths.policies().display(),
                p.default_space.display(),
                p.shapes.len(),
                p.dtypes.len()
            ),
            None,
        ),
        Err(e) => check(
            "config",
            Status::Fail,
            e.to_string(),
            Some("correct the file and line named; `git diff policies.toml variants/` shows what changed"),
        ),
    }
}

/// The reference library's Python has PyTorch with CUDA: without it the report's ratios say "not measured".
async fn pytorch(paths: &ProjectPaths) -> Check {
    let python = crate::model::config::Policies::load(&paths.policies())
        .ok()
        .and_then(|(p, _)| p.baseline.command.first().cloned())
        .unwrap_or_else(|| "python3".into());
    let probe = tokio::process::Command::new(&python)
        .args(["-c", "import torch; print(torch.__version__, 'cuda' if torch.cuda.is_available() else 'no-cuda')"])
        .current_dir(&paths.root)
        .stdin(Stdio::null())
        .output();
    let fix = "pip install torch (a CUDA build) for the reference library; tune runs without it and says `not measured`";
    match tokio::time::timeout(Duration::from_secs(60), probe).await {
        Ok(Ok(out)) if out.status.success() => {
            let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let status = if said.ends_with("no-cuda") {
                Status::Warn
            } else {
                Status::Pass
            };
            check(
                "torch",
                status,
                format!("PyTorch {said} ({python})"),
                (status != Status::Pass).then_some(fix),
            )
        }
        Ok(Ok(out)) => check(
            "torch",
            Status::Warn,
            format!(
                "{python} cannot import torch: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
            ),
            Some(fix),
        ),
        Ok(Err(e)) => check(
            "torch",
            Status::Warn,
            format!("cannot run {python}: {e}"),
            Some(fix),
        ),
        Err(_) => check(
            "torch",
            Status::Warn,
            format!("{python} did not import torch in 60 s"),
            Some(fix),
        ),
    }
}

fn nvcc(paths: &ProjectPaths) -> Check {
    match crate::os::toolchain::locate_nvcc(&paths.root) {
        Some((source, tc)) => check(
            "nvcc",
            Status::Pass,
            format!(
                "{} ({}, found by {})",
                tc.version,
                tc.nvcc.display(),
                source.describe()
            ),
            None,
        ),
        None => {
            let e = crate::os::toolchain::find_nvcc(&paths.root).unwrap_err();
            check("nvcc", Status::Fail, e.to_string(), None)
        }
    }
}

async fn gpu() -> Result<DeviceInfo, String> {
    let exe = Executor::subprocess(Duration::from_secs(60)).map_err(|e| e.to_string())?;
    exe.probe(0).await
}

async fn ncu(device: Option<&DeviceInfo>) -> Check {
    let Some(ncu) = crate::gpu::profile::find_ncu() else {
        return check(
            "ncu",
            Status::Fail,
            "Nsight Compute (ncu) not found",
            Some("install Nsight Compute and put ncu on PATH; profiling needs it"),
        );
    };
    let version = std::process::Command::new(&ncu)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default();
    if device.is_none() {
        return check(
            "ncu",
            Status::Warn,
            format!("{version} ({}); counters not tried: no GPU", ncu.display()),
            None,
        );
    }
    // Profile the worker's health kernel: the smallest real launch we have.
    let Ok(exe) = std::env::current_exe() else {
        return check(
            "ncu",
            Status::Warn,
            "cannot locate the flashtune binary to profile",
            None,
        );
    };
    let mut cmd = tokio::process::Command::new(&ncu);
    cmd.args([
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--metrics",
        "gpu__time_duration.sum",
        "--csv",
    ])
    .arg(&exe)
    .arg("worker")
    .arg("--device")
    .arg("0")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let Ok(mut child) = cmd.spawn() else {
        return check(
            "ncu",
            Status::Fail,
            format!("cannot start {}", ncu.display()),
            None,
        );
    };
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let mut req = serde_json::to_vec(&WorkerRequest::Probe).expect("serializes");
        req.push(b'\n');
        let _ = stdin.write_all(&req).await;
    }
    let out = match tokio::time::timeout(Duration::from_secs(120), child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return check("ncu", Status::Fail, format!("ncu failed: {e}"), None),
        Err(_) => return check("ncu", Status::Fail, "ncu did not finish within 120 s", None),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains("ERR_NVGPUCTRPERM") {
        check(
            "ncu",
            Status::Fail,
            format!("{version}: no permission to read GPU performance counters"),
            Some("run as root or set the driver option NVreg_RestrictProfilingToAdminUsers=0"),
        )
    } else if text.contains("No kernels were profiled") {
        check(
            "ncu",
            Status::Fail,
            format!("{version}: ncu saw no kernel launch"),
            Some("check that ncu and the driver versions match"),
        )
    } else if text.contains("gpu__time_duration.sum") {
        check(
            "ncu",
            Status::Pass,
            format!(
                "{version}: read counters on a tiny kernel ({})",
                ncu.display()
            ),
            None,
        )
    } else {
        check(
            "ncu",
            Status::Fail,
            format!(
                "{version}: unexpected output: {}",
                crate::gpu::build::log_tail(&text, 3)
            ),
            None,
        )
    }
}

fn git(paths: &ProjectPaths) -> Check {
    match git2::Repository::discover(&paths.root) {
        Err(_) => check(
            "git",
            Status::Warn,
            format!("{} is not in a git repository", paths.root.display()),
            Some("`git init` so champions can be committed"),
        ),
        Ok(repo) => {
            let head = repo
                .head()
                .ok()
                .and_then(|h| h.shorthand().ok().map(str::to_owned));
            let commit = repo
                .head()
                .ok()
                .and_then(|h| h.peel_to_commit().ok())
                .map(|c| c.id().to_string()[..10].to_owned());
            let changed = crate::os::vcs::changed_files(&repo);
            let state = if changed.is_empty() {
                "clean".to_owned()
            } else {
                format!("{} tracked files changed", changed.len())
            };
            match commit {
                Some(c) => check(
                    "git",
                    Status::Pass,
                    format!(
                        "on {} at {c}, {state}",
                        head.unwrap_or_else(|| "(detached)".into())
                    ),
                    None,
                ),
                None => check(
                    "git",
                    Status::Warn,
                    "repository has no commits yet",
                    Some("commit the project once"),
                ),
            }
        }
    }
}

/// Free space under runs/ and the build cache against `[disk] min_free_gib`: the very figures
/// `tune` and `resume` refuse to start below.
fn disk(paths: &ProjectPaths) -> Check {
    let (floor, from) = match crate::model::config::Policies::load(&paths.policies()) {
        Ok((p, _)) => (p.disk.min_free_gib, "policies.toml [disk] min_free_gib"),
        Err(_) => (2.0, "the default, policies.toml not loaded"),
    };
    let room = crate::run::shared::disk_room(paths);
    let mut parts = Vec::new();
    let mut short = Vec::new();
    for (what, dir, free) in &room {
        match free {
            Some(free) => {
                parts.push(format!(
                    "{free:.1} GiB free under {} ({what})",
                    dir.display()
                ));
                if *free < floor {
                    short.push(dir.display().to_string());
                }
            }
            None => parts.push(format!("free space under {} unreadable", dir.display())),
        }
    }
    let detail = format!("{}; floor {floor} GiB ({from})", parts.join(", "));
    if short.is_empty() {
        check("disk", Status::Pass, detail, None)
    } else {
        Check {
            name: "disk",
            status: Status::Fail,
            detail: format!("{detail}: tune and resume refuse to start"),
            fix: Some(format!(
                "free space under {}, move the build cache with FLASHTUNE_CACHE_DIR, or lower min_free_gib",
                short.join(" and ")
            )),
        }
    }
}
