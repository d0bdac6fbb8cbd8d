//! What a compile read, as nvcc's own dependency list gives it. Every file but the compiler's and
//! the system's headers must lie in the tree being built: a kernel that reaches a file the tree
//! does not hold (a git-ignored header, a path outside the project, a name built by a macro) was
//! not the kernel that gets committed.
use std::path::{Component, Path, PathBuf};

/// The dependency list the device pass's preprocessor writes (`-Xcompiler -MD,-MF,…`) beside the cubin.
pub(super) const DEPENDENCY_FILE: &str = "deps.d";
/// What a cache entry keeps of it: the reads that are neither the compiler's nor the system's,
/// each relative to the source's folder, so that a hit from another copy of the same tree is
/// judged against the tree it is served to.
pub(super) const READS_FILE: &str = "reads.txt";

/// Folders whose files no user edit reaches: the system's headers (root's to write).
const SYSTEM_PREFIXES: [&str; 1] = ["/usr/"];

/// The files a make-style dependency list names after its target, unescaped.
pub fn parse_dependencies(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let Some((_, deps)) = split_target(line) else {
            continue;
        };
        let mut current = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    current.push(' ');
                    chars.next();
                }
                c if c.is_whitespace() => {
                    if !current.is_empty() {
                        out.push(PathBuf::from(std::mem::take(&mut current)));
                    }
                }
                c => current.push(c),
            }
        }
        if !current.is_empty() {
            out.push(PathBuf::from(current));
        }
    }
    out
}

/// `target : deps`, the colon being the first one followed by a space (a path may hold one).
fn split_target(line: &str) -> Option<(&str, &str)> {
    let at = line
        .find(": ")
        .or_else(|| line.strip_suffix(':').map(|l| l.len()))?;
    Some((&line[..at], line.get(at + 1..).unwrap_or("")))
}

/// Of `dependencies`, those worth keeping (not the compiler's, not the system's), relative to
/// `source_dir`, one per line.
pub fn record(dependencies: &[PathBuf], source_dir: &Path, toolchain_root: &Path) -> String {
    let base = canonical(source_dir);
    let toolchain = canonical(toolchain_root);
    let mut out = String::new();
    for dep in dependencies {
        let dep = canonical(dep);
        let ours = dep.starts_with(&toolchain)
            || SYSTEM_PREFIXES
                .iter()
                .any(|p| dep.to_string_lossy().starts_with(p));
        if !ours {
            out.push_str(&relative(&dep, &base).to_string_lossy());
            out.push('\n');
        }
    }
    out
}

/// Of a kept record, the reads that, anchored at `source_dir`, fall outside `tree`.
pub fn outside(record: &str, source_dir: &Path, tree: &Path) -> Vec<String> {
    let base = canonical(source_dir);
    let tree = canonical(tree);
    record
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| normalize(&base.join(l)))
        .filter(|p| !p.starts_with(&tree))
        .map(|p| p.display().to_string())
        .collect()
}

/// The nvcc installation's top folder (`…/bin/nvcc` → `…`): its headers are the compiler's.
pub(super) fn toolchain_root(nvcc: &Path) -> PathBuf {
    let nvcc = canonical(nvcc);
    nvcc.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or(nvcc)
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| normalize(p))
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `path` as seen from `base` (both absolute): `..` up to their common folder, then down.
fn relative(path: &Path, base: &Path) -> PathBuf {
    let (p, b): (Vec<_>, Vec<_>) = (path.components().collect(), base.components().collect());
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &p[common..] {
        out.push(c);
    }
    out
}
