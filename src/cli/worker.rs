//! `flashtune worker` (hidden): the GPU worker process, or its test double, for one GPU.
use std::process::ExitCode;

#[derive(clap::Args)]
pub(super) struct Args {
    /// GPU ordinal this worker serves.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Be the GPU-less test double for this target arch.
    #[arg(long)]
    fake: Option<String>,
    /// Started as a Slurm job step (`--executor slurm`): lock the step's GPUs on this node.
    #[arg(long)]
    slurm_step: bool,
}

pub(super) fn run(args: &Args) -> ExitCode {
    let Args {
        device,
        fake,
        slurm_step,
    } = args;
    match fake {
        // The double touches no GPU: nothing to lock.
        Some(arch) => crate::gpu::fakegpu::serve(arch, *device),
        None => crate::gpu::worker::serve(*device, *slurm_step),
    }
}
