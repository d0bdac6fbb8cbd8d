//! Room on disk: the free space of a folder's filesystem, and whether a write that failed for a
//! reason its writer did not say (nvcc's exit status, libgit2's "failed to write out file") failed
//! for want of room, as the operating system answers a reservation there.
use crate::error::{is_out_of_room, WriteError};
use std::os::fd::AsRawFd;
use std::path::Path;

/// The room every write flashtune makes fits in with much to spare: one build (nvcc's
/// intermediates, 2.3 MB for the largest Hopper variant, and its cubin, 0.4 MB at most), a
/// checkout of the kernels and the index, a run log's next records. A folder that cannot take this
/// much is full, whatever a failed write's own words.
pub const WORKING_ROOM: u64 = 64 << 20;

/// Bytes an unprivileged user may still write on the filesystem holding `path` (or its nearest
/// existing parent: `runs/` need not exist yet); `None` when it cannot be read.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct it is given and reads a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Why `dir` cannot take [`WORKING_ROOM`] more, in the operating system's words (no space left, a
/// quota reached); `None` when it can, or when nothing can be told. The room is reserved in a
/// scratch file there (fallocate: nothing is written, and a quota counts) and let go at once; where
/// the filesystem reserves nothing, its free space decides.
pub fn lacks_room(dir: &Path) -> Option<WriteError> {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".room-probe-{}-{n}", std::process::id()));
    let refused = |source| Some(WriteError::new("reserve room to work in", dir, source));
    let file = match std::fs::File::create_new(&probe) {
        Ok(file) => file,
        Err(e) if is_out_of_room(&e) => return refused(e),
        Err(_) => return None,
    };
    // SAFETY: fallocate on a file descriptor this function owns, over a range it names.
    let reserved = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, WORKING_ROOM as libc::off_t) };
    let error = (reserved != 0).then(std::io::Error::last_os_error);
    drop(file);
    let _ = std::fs::remove_file(&probe);
    match error {
        None => None,
        Some(e) if is_out_of_room(&e) => refused(e),
        Some(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
            let free = free_bytes(dir)?;
            (free < WORKING_ROOM)
                .then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
                .and_then(refused)
        }
        Some(_) => None,
    }
}
