//! Compiles kernels with nvcc into content-addressed cubins and reads back what ptxas reports.
use crate::error::{is_out_of_room, Error, Result, WriteError};
use crate::gpu::ptxas::{self, EntryResources};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub mod cubin;
pub mod reads;

pub use crate::os::toolchain::{find_nvcc, Toolchain};

/// One compilation: a source file, its defines and the target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildSpec {
    pub source: PathBuf,
    pub defines: Vec<(String, String)>,
    /// e.g. `sm_90a`.
    pub arch: String,
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildOutput {
    pub key: String,
    pub cubin: PathBuf,
    pub cached: bool,
    pub seconds: f64,
    pub entries: Vec<EntryResources>,
}

#[derive(Debug)]
pub enum BuildFailure {
    Compiler {
        status: String,
        log: String,
    },
    TimedOut {
        seconds: u64,
    },
    Io(String),
    /// The compile read files outside the tree it was built from (nvcc's own dependency list).
    ReadsOutside {
        tree: PathBuf,
        files: Vec<String>,
    },
    /// The disk's failure, not the kernel's: a write of the build found no room (no space left, a
    /// quota reached), in the operating system's words, or nvcc's cubin came out cut short. It is
    /// never a `build_failed` record: the command stops as the write error it is, and runs again
    /// once there is room.
    Disk(WriteError),
}

impl std::fmt::Display for BuildFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildFailure::Compiler { status, .. } => write!(f, "nvcc failed ({status})"),
            BuildFailure::TimedOut { seconds } => write!(f, "nvcc timed out after {seconds} s"),
            BuildFailure::Io(e) => write!(f, "build I/O error: {e}"),
            BuildFailure::ReadsOutside { tree, files } => write!(
                f,
                "the kernel reads files outside the tree it is built from ({}): {}; a kernel is \
                 built from exactly the files that would be committed, so a git-ignored header, an \
                 untracked file outside kernels/ or a path outside the project is never part of it",
                tree.display(),
                files.join(", ")
            ),
            BuildFailure::Disk(e) => write!(f, "{e}"),
        }
    }
}

impl BuildFailure {
    /// A write of the build that failed, as the disk's failure when it says there was no room.
    fn written(what: &'static str, path: &Path, e: std::io::Error) -> BuildFailure {
        if is_out_of_room(&e) {
            BuildFailure::Disk(WriteError::new(what, path, e))
        } else {
            BuildFailure::Io(format!("{}: {e}", path.display()))
        }
    }

    pub fn log(&self) -> &str {
        match self {
            BuildFailure::Compiler { log, .. } => log,
            _ => "",
        }
    }
}

/// The build of `unit` (a variant, its dtype and head dim) that the disk stopped, as the error the
/// command ends with: the OS cause once, and `next`, what is left as it was and what to do once
/// there is room.
pub fn stopped_by_the_disk(unit: &str, full: WriteError, next: &str) -> Error {
    Error::Other(anyhow::Error::new(full).context(format!(
        "the build of {unit} found no room on disk, which is no fault of its code: {next}"
    )))
}

/// `sm_90a` → `arch=compute_90a,code=sm_90a`.
pub fn gencode(arch: &str) -> String {
    let number = arch.trim_start_matches("sm_");
    format!("arch=compute_{number},code=sm_{number}")
}

/// nvcc's arguments for `spec`, the cubin written to `out`: what the build cache runs, and what an
/// agent's AGENTS.md tells it to run to build the kernel as the judge does.
pub fn nvcc_args(spec: &BuildSpec, out: &Path) -> Vec<String> {
    let mut args = vec![
        "-cubin".to_owned(),
        "-gencode".to_owned(),
        gencode(&spec.arch),
    ];
    args.extend(spec.flags.iter().cloned());
    args.extend(["-Xptxas".to_owned(), "-v".to_owned()]);
    if let Some(dir) = spec.source.parent() {
        args.push(format!("-I{}", dir.display()));
    }
    for (k, v) in &spec.defines {
        args.push(format!("-D{k}={v}"));
    }
    args.push(spec.source.display().to_string());
    args.push("-o".to_owned());
    args.push(out.display().to_string());
    args
}

pub struct Builder {
    pub toolchain: Toolchain,
    pub cache_dir: PathBuf,
    pub timeout: Duration,
    /// The tree every file a compile reads must lie in, beside the compiler's and the system's
    /// headers (`None`: a build of the user's own working tree, where nothing is judged).
    pub confine: Option<PathBuf>,
}

impl Builder {
    /// The content address: what `spec_key` covers, and the whole invocation beside it: the
    /// compiler (its bytes and version) and the environment it runs with. A cubin built under
    /// another environment or by another nvcc is never reused.
    pub fn key(&self, spec: &BuildSpec) -> Result<String> {
        let mut h = blake3::Hasher::new();
        h.update(b"flashtune-build-v5\0");
        h.update(spec_key(spec)?.as_bytes());
        h.update(self.toolchain.version.as_bytes());
        h.update(self.toolchain.fingerprint.as_bytes());
        for (k, v) in &self.toolchain.environment {
            h.update(format!("{k}={v}\0").as_bytes());
        }
        Ok(h.finalize().to_hex()[..24].to_owned())
    }

    /// Compile, or reuse the cached cubin with the same key.
    pub async fn build(&self, spec: &BuildSpec) -> std::result::Result<BuildOutput, BuildFailure> {
        let key = self
            .key(spec)
            .map_err(|e| BuildFailure::Io(e.to_string()))?;
        let dir = self.cache_dir.join(&key);
        let cubin = dir.join("kernel.cubin");
        let report = dir.join("ptxas.txt");
        let reads = dir.join(reads::READS_FILE);
        if cubin.is_file() && report.is_file() && reads.is_file() {
            self.check_reads(spec, &reads)?;
            tracing::debug!(%key, source = %spec.source.display(), "build cache hit");
            let text =
                std::fs::read_to_string(&report).map_err(|e| BuildFailure::Io(e.to_string()))?;
            return Ok(BuildOutput {
                key,
                cubin,
                cached: true,
                seconds: 0.0,
                entries: ptxas::parse(&text),
            });
        }
        // A compiler swapped during the run builds nothing: the run stops, naming the file.
        if let Err(tampered) = self.toolchain.check_untouched() {
            crate::os::stop::request_because(libc::SIGTERM, tampered.to_string());
            return Err(BuildFailure::Io(tampered.to_string()));
        }
        let started = Instant::now();
        // Build in a private folder and rename: a crash never leaves a half-written cache entry.
        let staging = self
            .cache_dir
            .join(format!(".tmp-{key}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .map_err(|e| BuildFailure::written("create the build folder", &staging, e))?;
        let mut cmd = tokio::process::Command::from(self.toolchain.command());
        cmd.args(nvcc_args(spec, &staging.join("kernel.cubin")));
        // The list of every file the compile read, what the reads check judges, written by the
        // device pass's own preprocessing (gcc -E with -MD): nvcc's -MD runs a second preprocessing
        // of its own for it, about a tenth of a build's CPU. -Xcompiler splits its value at commas.
        let dependencies = staging.join(reads::DEPENDENCY_FILE);
        let Some(dependencies) = dependencies.to_str().filter(|p| !p.contains(',')) else {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(BuildFailure::Io(format!(
                "{}: nvcc passes this path to gcc through -Xcompiler, which splits at commas (and \
                 takes UTF-8 only); set FLASHTUNE_CACHE_DIR to a folder without one",
                dependencies.display()
            )));
        };
        cmd.arg("-Xcompiler").arg(format!("-MD,-MF,{dependencies}"));
        // nvcc runs cicc and ptxas as children: its own process group lets a timeout stop them all.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        tracing::info!(%key, source = %spec.source.display(), defines = ?spec.defines, "nvcc");
        die_with_parent(&mut cmd);
        // Below the GPU's feeders in the CPU's queue: the reference library's Python and the
        // workers launch kernels from the CPU, and nvcc on every core would slow their timing
        // (the reference library's took 73 s instead of 44 s beside the full space's builds).
        // SAFETY: setpriority is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpriority(libc::PRIO_PROCESS, 0, NVCC_NICENESS);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            BuildFailure::Io(format!(
                "cannot start {}: {e}",
                self.toolchain.nvcc.display()
            ))
        })?;
        let _group = ProcessGroup(child.id());
        let output = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(out) => out.map_err(|e| BuildFailure::Io(e.to_string()))?,
            Err(_) => {
                let _ = std::fs::remove_dir_all(&staging);
                return Err(BuildFailure::TimedOut {
                    seconds: self.timeout.as_secs(),
                });
            }
        };
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            let _ = std::fs::remove_dir_all(&staging);
            // nvcc says why in words of its own: whether the disk is full, its folders say.
            if let Some(full) = self.lacks_room() {
                return Err(BuildFailure::Disk(full));
            }
            return Err(BuildFailure::Compiler {
                status: output.status.to_string(),
                log,
            });
        }
        let written = staging.join("kernel.cubin");
        if let Some((have, declared)) =
            cubin::cut_short(&std::fs::read(&written).unwrap_or_default())
        {
            let _ = std::fs::remove_dir_all(&staging);
            let short = std::io::Error::other(match declared {
                Some(need) => format!("nvcc exited 0 having written {have} of its {need} bytes"),
                None => format!("nvcc exited 0 having written {have} bytes, not even its header"),
            });
            return Err(BuildFailure::Disk(self.lacks_room().unwrap_or_else(|| {
                WriteError::new("write the cubin", &written, short)
            })));
        }
        let ptxas_report = staging.join("ptxas.txt");
        std::fs::write(&ptxas_report, &log)
            .map_err(|e| BuildFailure::written("write the build's report to", &ptxas_report, e))?;
        let dependencies = std::fs::read_to_string(staging.join(reads::DEPENDENCY_FILE))
            .map_err(|e| BuildFailure::Io(format!("nvcc wrote no dependency list: {e}")))?;
        let kept = reads::record(
            &reads::parse_dependencies(&dependencies),
            spec.source.parent().unwrap_or(Path::new(".")),
            &reads::toolchain_root(&self.toolchain.nvcc),
        );
        let reads_record = staging.join(reads::READS_FILE);
        std::fs::write(&reads_record, &kept)
            .map_err(|e| BuildFailure::written("write the build's reads to", &reads_record, e))?;
        if std::fs::rename(&staging, &dir).is_err() {
            // Another run finished the same build first (its entry is equivalent), or an entry of
            // an earlier flashtune lacks the reads: this one replaces it.
            if !reads.is_file() {
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::rename(&staging, &dir);
            }
            let _ = std::fs::remove_dir_all(&staging);
        }
        self.check_reads(spec, &reads)?;
        let seconds = started.elapsed().as_secs_f64();
        Ok(BuildOutput {
            key,
            cubin,
            cached: false,
            seconds,
            entries: ptxas::parse(&log),
        })
    }
}
impl Builder {
    /// Why a failed compile is the disk's: the build cache or nvcc's scratch folder has no room
    /// to work in.
    fn lacks_room(&self) -> Option<WriteError> {
        crate::os::disk::lacks_room(&self.cache_dir)
            .or_else(|| crate::os::disk::lacks_room(&self.toolchain.scratch_dir()))
    }

    /// A confined build whose compile read files outside its tree fails, naming them.
    fn check_reads(&self, spec: &BuildSpec, kept: &Path) -> std::result::Result<(), BuildFailure> {
        let Some(tree) = &self.confine else {
            return Ok(());
        };
        let record = std::fs::read_to_string(kept)
            .map_err(|e| BuildFailure::Io(format!("{}: {e}", kept.display())))?;
        let files = reads::outside(
            &record,
            spec.source.parent().unwrap_or(Path::new(".")),
            tree,
        );
        if files.is_empty() {
            Ok(())
        } else {
            Err(BuildFailure::ReadsOutside {
                tree: tree.clone(),
                files,
            })
        }
    }
}

/// What a build compiles, whatever the compiler: the source and every file it includes, defines,
/// flags and target. The build gate's manifest lists these, so a contributor's nvcc still matches.
pub fn spec_key(spec: &BuildSpec) -> Result<String> {
    let mut h = blake3::Hasher::new();
    h.update(b"flashtune-spec-v1\0");
    for f in include_closure(&spec.source)? {
        let bytes = std::fs::read(&f)
            .map_err(|e| Error::BadInput(format!("cannot read {}: {e}", f.display())))?;
        h.update(f.file_name().unwrap_or_default().as_encoded_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    h.update(
        spec.source
            .file_name()
            .unwrap_or_default()
            .as_encoded_bytes(),
    );
    for (k, v) in &spec.defines {
        h.update(format!("-D{k}={v}\0").as_bytes());
    }
    for f in &spec.flags {
        h.update(format!("{f}\0").as_bytes());
    }
    h.update(spec.arch.as_bytes());
    Ok(h.finalize().to_hex()[..24].to_owned())
}

/// The source and the files its quoted `#include`s reach, recursively, in a stable order.
pub fn include_closure(source: &Path) -> Result<Vec<PathBuf>> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut todo = vec![source.to_path_buf()];
    let search_dir = source.parent().unwrap_or(Path::new(".")).to_path_buf();
    while let Some(file) = todo.pop() {
        let file = file.canonicalize().unwrap_or(file);
        if seen.contains(&file) {
            continue;
        }
        let text = std::fs::read_to_string(&file).map_err(|e| {
            Error::BadInput(format!("cannot read kernel source {}: {e}", file.display()))
        })?;
        let here = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        for name in quoted_includes(&text) {
            // Quoted includes resolve next to the including file first, then in the -I folder.
            if let Some(found) = [here.join(&name), search_dir.join(&name)]
                .into_iter()
                .find(|p| p.is_file())
            {
                todo.push(found);
            }
        }
        seen.push(file);
    }
    seen.sort();
    Ok(seen)
}

/// The names of `#include "…"` and `__has_include("…")` in `text`.
pub fn quoted_includes(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let rest = if let Some(r) = line.strip_prefix('#') {
            r.trim_start().strip_prefix("include").map(str::trim_start)
        } else {
            None
        };
        let mut candidates: Vec<&str> = rest.into_iter().collect();
        let mut tail = line;
        while let Some(at) = tail.find("__has_include") {
            tail = &tail[at + "__has_include".len()..];
            candidates.push(tail.trim_start().trim_start_matches('(').trim_start());
        }
        for c in candidates {
            if let Some(name) = c.strip_prefix('"').and_then(|r| r.split('"').next()) {
                out.push(name.to_owned());
            }
        }
    }
    out
}

/// nvcc's niceness: it yields the CPU to the processes that feed the GPU.
const NVCC_NICENESS: i32 = 10;

/// Children die with flashtune: a SIGKILLed orchestrator must not leave workers on the GPU or nvcc on the CPUs.
pub fn die_with_parent(cmd: &mut tokio::process::Command) {
    die_with_parent_by(cmd, libc::SIGKILL);
}

/// [`die_with_parent`] by `signal` (SIGTERM for a child that must pass the end on, as srun).
pub fn die_with_parent_by(cmd: &mut tokio::process::Command, signal: i32) {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, signal);
            Ok(())
        });
    }
}

/// Kills a child's whole process group when dropped: on timeout, on Ctrl-C, or after it exited.
pub struct ProcessGroup(pub Option<u32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // The group id is the leader's pid; once every member is gone this is a harmless ESRCH.
            unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
        }
    }
}

/// The first line of a compiler log that names an error (nvcc's `file(line): error: ...`, the host
/// compiler's and ptxas's): what a reader must fix, in the compiler's (and the kernel's) words.
pub fn first_error(log: &str) -> Option<&str> {
    log.lines().map(str::trim).find(|l| l.contains("error"))
}

/// Tail of a compiler log worth keeping in a run record.
pub fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
