//! The sandbox a proposer and a candidate's agent run in: Linux Landlock confines their whole process tree's writes to their own work folder, a scratch folder, the terminals and the folders their CLI keeps its config in (policies.toml `[sandbox]`), and can hide folders from their reads. Never the rest of the project, `.git`, `runs/`, another candidate's worktree, the build cache, the worker binary or the toolchain.
//!
//! Landlock is an allow-list bound to the folders as they are when the rules are made: a folder
//! granted is granted with everything beneath it, so a writable folder that holds something the
//! tool trusts is refused by name rather than granted. The rules are made and every path opened in
//! this process, before the fork; the child only calls `prctl` and `landlock_restrict_self`
//! (both async-signal-safe system calls) between fork and exec. Where the kernel has no Landlock,
//! the run says so once and the child runs unconfined: the tamper checks (run files, HEAD, the
//! worker binary, the toolchain) still hold. bubblewrap (Codex's `codex-rs/linux-sandbox`) would
//! also confine reads and the network; it is not used here.
use crate::error::{Error, Result};
use crate::model::config::SandboxPolicy;
use crate::run::shared::Project;
use landlock::{AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, ABI};
use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The device files any program may write: the null devices, terminals, shared memory.
const DEVICES: [&str; 7] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

/// The Landlock rights this sandbox takes over: every write (creating, removing, renaming across
/// folders, truncating), not device ioctls (an agent may run a CUDA program of its own).
fn write_access() -> landlock::BitFlags<AccessFs> {
    AccessFs::from_write(ABI::V4)
}

/// The rights hiding a folder takes over: reading a file and executing one (listing stays open).
fn read_access() -> landlock::BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::Execute
}

/// What one confined process may write and must never reach.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// Folders (or files) it may write, each with where it came from, for messages.
    writable: Vec<(PathBuf, String)>,
    /// What no writable folder may hold, each with its name.
    protected: Vec<(PathBuf, String)>,
    /// Folders it may not read.
    hidden: Vec<PathBuf>,
}

/// A confined child's scratch folder (its TMPDIR): removed when dropped if the child left it empty,
/// kept for a look otherwise.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Whether a run was already told that it runs unconfined (it is told once).
static TOLD: AtomicBool = AtomicBool::new(false);

/// Say once per run that proposers and agents run unconfined, and why.
fn say_unconfined(why: &str) {
    if !TOLD.swap(true, Ordering::SeqCst) {
        tracing::warn!(why, "proposers and agents run without a sandbox");
        crate::tell!(
            "flashtune: no sandbox: {why}; proposers and agents run with everything flashtune can \
             reach (the run files, HEAD, the worker binary and the toolchain are still checked after them)"
        );
    }
}

/// Whether `inner` is `outer` or lies beneath it (both canonical).
fn within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

fn canonical(path: &Path) -> Option<PathBuf> {
    path.canonicalize().ok()
}

impl Confinement {
    pub fn new() -> Self {
        Self::default()
    }

    /// Let it write `path` (`from` says why, e.g. "its worktree"); a path that does not exist is
    /// left out.
    pub fn writable(mut self, path: &Path, from: &str) -> Self {
        self.writable.push((path.to_path_buf(), from.to_owned()));
        self
    }

    /// No writable folder may hold `path` (`name` says what it is).
    pub fn protecting(mut self, path: &Path, name: &str) -> Self {
        self.protected.push((path.to_path_buf(), name.to_owned()));
        self
    }

    /// Deny reading files under `path`; see [`Confinement::hide_rules`].
    pub fn hide(mut self, path: &Path) -> Self {
        self.hidden.push(path.to_path_buf());
        self
    }

    /// The writable paths that exist, canonical; `Err` names one that holds a protected path or a
    /// hidden folder.
    pub fn granted(&self) -> std::result::Result<Vec<PathBuf>, String> {
        let hidden = self
            .hidden
            .iter()
            .map(|h| (h.clone(), "a hidden folder".to_owned()));
        let guarded: Vec<(PathBuf, String)> = self
            .protected
            .iter()
            .cloned()
            .chain(hidden)
            .filter_map(|(p, name)| Some((canonical(&p)?, name)))
            .collect();
        let mut out = Vec::new();
        for (path, from) in &self.writable {
            let Some(w) = canonical(path) else { continue };
            if let Some((p, name)) = guarded.iter().find(|(p, _)| within(p, &w)) {
                return Err(format!(
                    "{} ({from}) holds {name} ({}): a proposer or agent could then write what \
                     flashtune trusts; name a folder inside it instead",
                    path.display(),
                    p.display()
                ));
            }
            out.push(w);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Confine `cmd` when it is spawned. `Ok(false)`: the kernel has no Landlock, and the run was
    /// told so (once); `cmd` runs unconfined. `Err`: a writable folder holds what must be
    /// protected, or the rules could not be made.
    pub fn apply(&self, cmd: &mut tokio::process::Command) -> std::result::Result<bool, String> {
        let writable = self.granted()?;
        let abi = kernel_abi();
        if abi < 1 {
            say_unconfined("this kernel has no Landlock (Linux 5.13 or later, with `landlock` in its lsm= list)");
            return Ok(false);
        }
        let hidden: Vec<PathBuf> = self.hidden.iter().filter_map(|h| canonical(h)).collect();
        let handled = if hidden.is_empty() {
            write_access()
        } else {
            write_access() | read_access()
        };
        let fail = |e: &dyn std::fmt::Display| format!("cannot make the sandbox's rules: {e}");
        let mut rules = Ruleset::default()
            .handle_access(handled)
            .map_err(|e| fail(&e))?
            .create()
            .map_err(|e| fail(&e))?;
        let devices = DEVICES.iter().map(PathBuf::from).filter(|d| d.exists());
        for path in writable.iter().cloned().chain(devices) {
            rules = rules
                .add_rule(beneath(&path, handled)?)
                .map_err(|e| fail(&e))?;
        }
        for rule in read_grants(&hide_rules(&hidden))? {
            rules = rules.add_rule(rule).map_err(|e| fail(&e))?;
        }
        let Some(fd) = Option::<OwnedFd>::from(rules) else {
            say_unconfined("Landlock refused to make a ruleset");
            return Ok(false);
        };
        // SAFETY: between fork and exec the child only makes two system calls on an fd it already
        // holds; nothing allocates or takes a lock.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(true)
    }
}

/// A rule granting `access` beneath `path` (a file gets the rights that apply to files).
fn beneath(
    path: &Path,
    access: landlock::BitFlags<AccessFs>,
) -> std::result::Result<PathBeneath<PathFd>, String> {
    let fd = PathFd::new(path)
        .map_err(|e| format!("cannot open {} for the sandbox: {e}", path.display()))?;
    let access = if path.is_dir() {
        access
    } else {
        access & AccessFs::from_file(ABI::V4)
    };
    Ok(PathBeneath::new(fd, access))
}

/// Read rules for `paths`, listed a moment before: one that is gone since (another program's temp
/// file in /tmp, a sibling of a hidden folder's parent) needs no grant and is skipped; anything
/// else that cannot be opened is an error.
pub fn read_grants(paths: &[PathBuf]) -> std::result::Result<Vec<PathBeneath<PathFd>>, String> {
    let mut grants = Vec::new();
    for path in paths {
        match beneath(path, read_access()) {
            Ok(rule) => grants.push(rule),
            Err(_) if std::fs::symlink_metadata(path).is_err() => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(grants)
}

/// Whether this kernel offers Landlock, so that [`confine`] confines.
pub fn available() -> bool {
    kernel_abi() >= 1
}

/// The Landlock ABI the running kernel offers; 0 or less where it has none.
fn kernel_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: the documented version query: no attributes, no memory read or written.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    }
}

/// Landlock can only allow: to hide a folder, reading is granted on everything else along its path,
/// every sibling of the folder and of each folder above it, and nothing on those folders themselves
/// (their other entries made later stay unreadable). A sibling that is a link into a hidden folder
/// or above one is left out, since the rule would follow it.
pub fn hide_rules(hidden: &[PathBuf]) -> Vec<PathBuf> {
    // The hidden folders and every folder above them: granted on none of these.
    let mut withheld: BTreeSet<PathBuf> = BTreeSet::new();
    for h in hidden {
        withheld.extend(h.ancestors().map(Path::to_path_buf));
    }
    let reaches_hidden = |p: &Path| {
        canonical(p).is_none_or(|c| withheld.contains(&c) || hidden.iter().any(|h| within(&c, h)))
    };
    let mut out = BTreeSet::new();
    for folder in hidden
        .iter()
        .filter_map(|h| h.parent())
        .flat_map(Path::ancestors)
    {
        let Ok(entries) = std::fs::read_dir(folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !withheld.contains(&path) && !reaches_hidden(&path) {
                out.insert(path);
            }
        }
    }
    out.into_iter().collect()
}

/// Lines of a confined child's output that say a write was refused ("Permission denied", as the
/// sandbox's refusals read in C, Python and Node alike): its own words name the path.
pub fn refusals(output: &str) -> Vec<String> {
    output
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("permission denied") || l.contains("eacces")
        })
        .map(|l| l.trim().chars().take(300).collect())
        .collect()
}

/// What the step says of a confined child that failed, when its output shows refused writes.
pub fn refusal_note(output: &str, work: &str) -> Option<String> {
    let refused = refusals(output);
    if refused.is_empty() {
        return None;
    }
    let shown: Vec<String> = refused.iter().take(3).map(|l| format!("`{l}`")).collect();
    Some(format!(
        "the sandbox lets it write only {work}, its scratch folder and policies.toml [sandbox] \
         writable, and refused: {}",
        shown.join("; ")
    ))
}

/// Confine `cmd`, a proposer's or an agent's command for `project`, to writing `own` (its work
/// folders) and a fresh scratch folder named after `label` (made here, its TMPDIR), plus the
/// devices and `[sandbox] writable`; `[sandbox] hidden` unreadable. With `[sandbox] enabled =
/// false` it only says so, once. `Err` stops the run: a writable folder holding what the tool
/// trusts, or rules that could not be made.
pub fn confine(
    cmd: &mut tokio::process::Command,
    project: &Project,
    worker_exe: &Path,
    own: &[(&Path, &str)],
    label: &str,
) -> Result<Option<Scratch>> {
    let policy = &project.policies.sandbox;
    if !policy.enabled {
        say_unconfined("policies.toml [sandbox] enabled = false");
        return Ok(None);
    }
    let scratch = Scratch(fresh_folder(
        &std::env::temp_dir(),
        &format!("flashtune-{label}"),
    )?);
    let mut c = Confinement::new().writable(&scratch.0, "its scratch folder");
    for (path, from) in own {
        c = c.writable(path, from);
    }
    for entry in &policy.writable {
        if let Some(path) = SandboxPolicy::expand(entry) {
            c = c.writable(
                &path,
                &format!("policies.toml [sandbox] writable `{entry}`"),
            );
        }
    }
    for entry in &policy.hidden {
        if let Some(path) = SandboxPolicy::expand(entry) {
            c = c.hide(&path);
        }
    }
    let paths = &project.paths;
    c = c
        .protecting(&paths.root, "the project")
        .protecting(&paths.runs(), "the run folders")
        .protecting(&paths.build_cache(), "the build cache")
        .protecting(worker_exe, "flashtune's binary");
    for folder in project.toolchain.trusted_folders() {
        c = c.protecting(&folder, "the CUDA toolchain");
    }
    c.apply(cmd)
        .map_err(|e| Error::BadInput(format!("the sandbox: {e}")))?;
    cmd.env("TMPDIR", &scratch.0);
    Ok(Some(scratch))
}

/// A folder made new under `parent` (`name`, else `name.2`, `name.3`...): never one that was there,
/// which may be another user's link in a shared temp folder.
fn fresh_folder(parent: &Path, name: &str) -> Result<PathBuf> {
    let mut last = None;
    for n in 1..=100 {
        let path = match n {
            1 => parent.join(name),
            n => parent.join(format!("{name}.{n}")),
        };
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(Error::Other(anyhow::anyhow!(
                    "cannot make the scratch folder {}: {e}",
                    path.display()
                )))
            }
        }
    }
    Err(Error::Other(anyhow::anyhow!(
        "cannot make a scratch folder {name} in {}: {}",
        parent.display(),
        last.map_or(String::new(), |e| e.to_string())
    )))
}
