//! Layer 0, what the operating system gives: signals and the stop flag, room on disk, GPU locks, large host-memory copies, the CUDA toolchain, git, the fingerprints of what the tool trusts, and the log seals. Nothing here knows a kernel.
pub mod console;
pub mod disk;
pub mod gpulock;
pub mod host_memory;
pub mod seal;
pub mod stop;
pub mod toolchain;
pub mod trusted;
pub mod vcs;
