//! Layer 2, building and running kernels: nvcc builds and their ptxas figures, the trial a worker runs (checks, timed rounds), the worker and its CPU test double, the executors (local, Slurm), the reference library and ncu profiles. The only layer that touches a GPU, and only `worker` names the driver.
pub mod baseline;
pub mod build;
pub mod check;
pub mod decide;
pub mod executor;
pub mod fakegpu;
pub mod profile;
pub mod ptxas;
pub mod slurm;
pub mod trial;
pub mod worker;
