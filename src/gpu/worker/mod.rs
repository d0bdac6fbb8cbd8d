//! `flashtune worker --device N`: the only process that touches the GPU. It serves one GPU for its life, answering requests with the trials of `trial`, run on CUDA through cudarc.
use crate::gpu::check::{POISON_16, POISON_F32_BITS};
use crate::gpu::trial::mixture::Geometry;
use crate::gpu::trial::{Buf, Comparison, Device, GraphId, Io, KernelId};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::*;
use crate::model::space::LaunchShape;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::io::Write;
use std::sync::Arc;

mod nvml;

/// A kernel the driver JIT-compiles for any GPU: y = 2x + 1. It proves the GPU still computes after a fault.
const HEALTH_PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64
.visible .entry health_axpb(.param .u64 x, .param .u64 y, .param .u32 n)
{
  .reg .pred %p; .reg .b32 %r<5>; .reg .f32 %f<3>; .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [x]; ld.param.u64 %rd2, [y]; ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r2, %r2, %r3, %r4;
  setp.ge.u32 %p, %r2, %r1;
  @%p bra DONE;
  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
  mul.wide.u32 %rd3, %r2, 4; add.s64 %rd4, %rd1, %rd3; add.s64 %rd5, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  fma.rn.f32 %f2, %f1, 0f40000000, 0f3F800000;
  st.global.f32 [%rd5], %f2;
DONE:
  ret;
}
"#;

/// The worker's own kernels (tools.cu, compiled to PTX): input generation, checksums, masks, the comparison, read roof, sentinel.
pub const TOOLS_PTX: &str = include_str!("tools.ptx");

/// The combine kernel's fixed geometry; kernels/attention/forward.cu asserts the same numbers.
const COMBINE_THREADS: u32 = 128;
const COMBINE_ROWS_PER_BLOCK: u32 = 4;
/// The reference kernel's fixed geometry; kernels/oracle/reference.cu asserts the same numbers.
const REFERENCE_THREADS: u32 = 256;
const REFERENCE_ROWS_PER_BLOCK: u32 = 64;
/// The roofs are measured on buffers far beyond any L2, with a matmul large enough to reach the sustained clock.
const ROOF_BYTES: usize = 1 << 30;
const MATMUL_N: usize = 8192;
/// The sentinel's read stream: far beyond any L2 (50 MiB on an H100), a few hundred µs on HBM.
const SENTINEL_READ_BYTES: usize = 1 << 28;
/// Steps of each FMA chain in the sentinel's compute kernel: about a millisecond on an H100.
const SENTINEL_FMA_ITERS: u32 = 16384;

/// Entry point of the subcommand: serve requests on stdin until it closes. A Slurm step's worker
/// (`slurm_step`) first locks the GPUs the cluster gave it, on its node, for its life.
pub fn serve(device: u32, slurm_step: bool) -> std::process::ExitCode {
    let mut reply = reply_channel();
    let locks = match slurm_step {
        true => crate::gpu::slurm::lock_step_gpus(),
        false => Ok(Vec::new()),
    };
    let _locks = match locks {
        Ok(l) => l,
        Err(message) => {
            reply(&WorkerMessage::Fatal { message });
            return std::process::ExitCode::from(1);
        }
    };
    let gpu = match Gpu::open(device) {
        Ok(g) => g,
        Err(e) => {
            reply(&WorkerMessage::Fatal {
                message: format!("{e:#}"),
            });
            return std::process::ExitCode::from(1);
        }
    };
    // Input pools may take this share of the GPU's memory; the rest is the kernels' and the roofs'.
    let cap = gpu.info.total_memory_bytes / 10 * 4;
    crate::gpu::trial::serve(gpu, std::io::stdin().lock(), &mut reply, cap)
}

/// Where replies go: the descriptor the supervisor handed over in `FLASHTUNE_REPLY_FD`, else stdout.
pub fn reply_channel() -> impl FnMut(&WorkerMessage) {
    use std::os::fd::FromRawFd;
    let mut out: Box<dyn Write> = match reply_fd() {
        // SAFETY: the supervisor opened this descriptor for us (or `reply_fd` made it) and nothing
        // else in the process writes to it.
        Some(fd) => Box::new(unsafe { std::fs::File::from_raw_fd(fd) }),
        None => Box::new(std::io::stdout()),
    };
    move |msg: &WorkerMessage| {
        let mut line = serde_json::to_vec(msg).expect("replies serialize");
        line.push(b'\n');
        let _ = out.write_all(&line);
        let _ = out.flush();
    }
}

/// The reply descriptor, settled once: the number in `FLASHTUNE_REPLY_FD`; for
/// [`REPLY_ON_STDOUT`] (a Slurm step, whose stdout is the only way back) a copy of stdout, after
/// which fd 1 points at stderr, so what a kernel or a library prints cannot reach the reply channel;
/// `None` (a worker run by hand): stdout itself.
pub fn reply_fd() -> Option<i32> {
    static FD: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *FD.get_or_init(|| {
        let value = std::env::var(REPLY_FD_ENV).ok()?;
        if value != REPLY_ON_STDOUT {
            return value.parse().ok();
        }
        let _ = std::io::stdout().flush();
        // SAFETY: fcntl and dup2 on the process's own standard descriptors.
        unsafe {
            let fd = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
            if fd < 0 || libc::dup2(2, 1) < 0 {
                return None;
            }
            Some(fd)
        }
    })
}

/// Whether a CUDA driver library can be loaded at all; cudarc panics when it cannot.
pub fn driver_library_present() -> bool {
    library_present(&["libcuda.so.1", "libcuda.so"])
}

fn library_present(names: &[&str]) -> bool {
    names.iter().any(|name| {
        let Ok(c) = std::ffi::CString::new(*name) else {
            return false;
        };
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        !handle.is_null()
    })
}

pub fn arch_for(cc: (i32, i32)) -> String {
    // The `a` targets keep Hopper/Blackwell-only instructions (wgmma, tcgen05) available.
    match cc {
        (9, 0) | (10, 0) | (10, 3) | (12, 0) => format!("sm_{}{}a", cc.0, cc.1),
        _ => format!("sm_{}{}", cc.0, cc.1),
    }
}

/// Elements [start, start + len) of buffer `buf`, read back.
fn read_range<T: cudarc::driver::DeviceRepr + Default + Clone>(
    stream: &Arc<CudaStream>,
    m: &CudaSlice<T>,
    buf: Buf,
    start: usize,
    len: usize,
) -> Result<Vec<T>> {
    if start + len > m.len() {
        bail!(
            "read of {len} elements at {start} is past buffer {} ({} elements)",
            buf.0,
            m.len()
        );
    }
    stream
        .clone_dtoh(&m.slice(start..start + len))
        .map_err(|e| anyhow!("read back: {e:?}"))
}

/// The whole of buffer `buf` into `out`, which must be its length. Pageable memory: the copy has
/// finished when the call returns; the sync says so.
fn read_into<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    m: &CudaSlice<T>,
    buf: Buf,
    out: &mut [T],
) -> Result<()> {
    if m.len() != out.len() {
        bail!(
            "read of buffer {} ({} elements) into {}",
            buf.0,
            m.len(),
            out.len()
        );
    }
    stream
        .memcpy_dtoh(m, out)
        .and_then(|()| stream.synchronize())
        .map_err(|e| anyhow!("read back: {e:?}"))
}

/// The whole of buffer `buf` from the host; the lengths must agree.
fn upload<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    m: &mut CudaSlice<T>,
    buf: Buf,
    data: &[T],
) -> Result<()> {
    if m.len() != data.len() {
        bail!(
            "upload of {} elements into buffer {} of {}",
            data.len(),
            buf.0,
            m.len()
        );
    }
    stream
        .memcpy_htod(data, m)
        .map_err(|e| anyhow!("upload: {e:?}"))
}

/// A TMA tensor map, passed by value as a kernel parameter (the driver copies its 128 bytes).
#[repr(transparent)]
#[derive(Clone, Copy)]
struct TensorMap(sys::CUtensorMap);
// SAFETY: plain bytes the driver encoded, with the size and alignment of the kernel's parameter.
unsafe impl cudarc::driver::DeviceRepr for TensorMap {}

/// What one tensor map encodes: a buffer of `heads` x `rows` x `head_dim` 16-bit elements, read
/// in boxes of `box_rows` rows x 64 elements. The map is a pure function of these.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct TensorMapKey {
    address: u64,
    heads: u64,
    rows: u64,
    head_dim: u64,
    box_rows: u32,
}

impl TensorMapKey {
    /// The map the Hopper path's TMA loads read (kernels/attention/hopper.cuh, tma_load_tile):
    /// three dimensions (element, row, batch x head) so that a box reaching past a head's last
    /// row reads zeros, not the next head; 64-element (128-byte) boxes in the 128-byte swizzle.
    /// A head dim of 96 is read as two boxes whose second reaches 32 elements past the row: TMA
    /// fills those with zeros too (the kernel holds 96 as 128, hopper.cuh's kHeadDimSmem).
    fn encode(&self) -> Result<TensorMap> {
        let elem = 2u64;
        if self.head_dim % 32 != 0 || !(1..=256).contains(&self.box_rows) {
            bail!(
                "no TMA map for head dim {} in boxes of {} rows: the contract is 64-element boxes over a multiple of 32 elements and at most 256 rows",
                self.head_dim,
                self.box_rows
            );
        }
        let dims = [self.head_dim, self.rows, self.heads];
        let strides = [self.head_dim * elem, self.rows * self.head_dim * elem];
        let boxes = [64u32, self.box_rows, 1];
        let element_strides = [1u32; 3];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // UINT16 for both f16 and bf16: TMA only copies, and its zero fill is +0.0 in either.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                3,
                self.address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(|e| {
            anyhow!(
                "cuTensorMapEncodeTiled ({} rows x {} of {} heads, boxes of {} rows): {e:?}",
                self.rows,
                self.head_dim,
                self.heads,
                self.box_rows
            )
        })?;
        Ok(TensorMap(unsafe { map.assume_init() }))
    }
}

enum Memory {
    U16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

enum Loaded {
    Forward {
        _module: Arc<CudaModule>,
        forward: CudaFunction,
        combine: Option<CudaFunction>,
    },
    Reference {
        _module: Arc<CudaModule>,
        function: CudaFunction,
    },
}

struct Tools {
    _module: Arc<CudaModule>,
    generate: CudaFunction,
    generate_many: CudaFunction,
    checksum: CudaFunction,
    checksum_many: CudaFunction,
    read: CudaFunction,
    fma: CudaFunction,
    mask: CudaFunction,
    compare: CudaFunction,
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    tools: Tools,
    memory: Vec<Option<Memory>>,
    kernels: Vec<Option<Loaded>>,
    graphs: Vec<Option<CudaGraph>>,
    /// Encoded once per buffer and geometry: no host work between a timed launch's events.
    tensor_maps: std::cell::RefCell<std::collections::HashMap<TensorMapKey, TensorMap>>,
    /// NVML on this GPU, or why it cannot be read (then no timing carries a state).
    nvml: std::result::Result<nvml::Watch, String>,
    /// Where the table (address, length) of a buffer list `draw_inputs` or `checksum_all` is given
    /// goes: written anew for every call, since a kernel under test can write device memory between
    /// two (the device is the kernel's), grown as needed.
    buffer_table: Option<CudaSlice<u64>>,
    /// Scratch for `ft_compare`'s per-block figures, grown as needed: one comparison per verified launch.
    compare_partials: Option<CudaSlice<u64>>,
    /// Twice the L2 cache, written over to push a draw's last writes out of L2 before a replay.
    l2_flush: Option<CudaSlice<u32>>,
    /// Buffers a kernel under test was given: never a reference's.
    exposure: crate::gpu::trial::Exposure,
}

fn cuda(e: cudarc::driver::DriverError) -> anyhow::Error {
    anyhow!("{e:?}")
}

impl Gpu {
    fn open(ordinal: u32) -> Result<Self> {
        if !driver_library_present() {
            bail!("no NVIDIA driver: libcuda.so.1 cannot be loaded on this machine");
        }
        let count = CudaContext::device_count()
            .map_err(|e| anyhow!("the CUDA driver reports no usable device: {e:?}"))?;
        if count <= ordinal as i32 {
            bail!("GPU {ordinal} requested, {count} visible");
        }
        // Before the context: NVML then tells the worker's own process apart from the others.
        let before = nvml::before_context();
        let ctx = CudaContext::new(ordinal as usize)
            .map_err(|e| anyhow!("cannot create a CUDA context on GPU {ordinal}: {e:?}"))?;
        // One stream, no cudarc event bookkeeping: the timed graphs must contain only our kernels.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda)?;
        let attr = |a: Attr| {
            ctx.attribute(a)
                .map_err(|e| anyhow!("device attribute {a:?}: {e:?}"))
        };
        let cc = ctx.compute_capability().map_err(cuda)?;
        let mut driver_version = 0;
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(cuda)?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(cuda)?,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            compute_capability: cc,
            arch: arch_for(cc),
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32,
            max_smem_optin_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u32,
            driver_version,
            total_memory_bytes: ctx.total_mem().map_err(cuda)? as u64,
            visible_devices: count as u32,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
            fake: false,
            placement: crate::gpu::slurm::placement_here(),
        };
        let module = ctx
            .load_module(Ptx::from_src(TOOLS_PTX))
            .map_err(|e| anyhow!("the worker's own kernels do not load: {e:?}"))?;
        let f = |name: &str| module.load_function(name).map_err(cuda);
        let tools = Tools {
            generate: f("ft_generate")?,
            generate_many: f("ft_generate_many")?,
            checksum: f("ft_checksum")?,
            checksum_many: f("ft_checksum_many")?,
            read: f("ft_read")?,
            fma: f("ft_fma")?,
            mask: f("ft_mask")?,
            compare: f("ft_compare")?,
            _module: module,
        };
        let pci = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)? as u32,
            attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)? as u32,
            attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)? as u32,
        );
        let nvml = before.and_then(|b| nvml::Watch::open(b, pci));
        Ok(Gpu {
            ctx,
            stream,
            info,
            tools,
            memory: Vec::new(),
            kernels: Vec::new(),
            graphs: Vec::new(),
            tensor_maps: Default::default(),
            nvml,
            buffer_table: None,
            compare_partials: None,
            l2_flush: None,
            exposure: crate::gpu::trial::Exposure::default(),
        })
    }

    fn slot<T>(slab: &mut Vec<Option<T>>, item: T) -> usize {
        match slab.iter().position(Option::is_none) {
            Some(i) => {
                slab[i] = Some(item);
                i
            }
            None => {
                slab.push(Some(item));
                slab.len() - 1
            }
        }
    }

    /// Device address and 16-bit length of a buffer.
    fn ptr(&self, buf: Buf) -> Result<(u64, usize)> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(s)) => Ok((s.device_ptr(&self.stream).0, s.len())),
            Some(Memory::F32(s)) => Ok((s.device_ptr(&self.stream).0, 2 * s.len())),
            None => bail!("no buffer {}", buf.0),
        }
    }

    /// Device address and element count of a 32-bit buffer.
    fn ptr32(&self, buf: Buf) -> Result<(u64, usize)> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(s)) => Ok((s.device_ptr(&self.stream).0, s.len())),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    /// Device address and element count of a 16-bit buffer.
    fn ptr16(&self, buf: Buf) -> Result<(u64, usize)> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(s)) => Ok((s.device_ptr(&self.stream).0, s.len())),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn grid_for(&self, n: u64) -> LaunchConfig {
        let blocks = (n.div_ceil(256)).clamp(1, self.info.sm_count as u64 * 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn launch_forward(
        &self,
        kernel: KernelId,
        s: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<()> {
        let Some(Some(Loaded::Forward {
            forward, combine, ..
        })) = self.kernels.get(kernel.0)
        else {
            bail!("no forward kernel {}", kernel.0);
        };
        let st = &self.stream;
        let p = |b: Option<Buf>| -> Result<u64> { b.map_or(Ok(0), |b| Ok(self.ptr(b)?.0)) };
        let (o_accum, lse_accum) = (p(io.o_accum)?, p(io.lse_accum)?);
        let (q, k, v, out, lse) = (
            self.ptr(io.q)?.0,
            self.ptr(io.k)?.0,
            self.ptr(io.v)?.0,
            self.ptr(io.o)?.0,
            self.ptr(io.lse)?.0,
        );
        let (b, h, sq, sk, causal) = (
            s.b as i32,
            s.h as i32,
            s.sq as i32,
            s.sk as i32,
            s.causal_code(),
        );
        let scale = 1.0f32 / (s.d as f32).sqrt();
        let mut lb = st.launch_builder(forward);
        lb.arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&out)
            .arg(&lse)
            .arg(&o_accum)
            .arg(&lse_accum);
        lb.arg(&b)
            .arg(&h)
            .arg(&sq)
            .arg(&sk)
            .arg(&scale)
            .arg(&causal);
        let counters = p(io.counters)?;
        if launch.split_counters {
            lb.arg(&counters);
        }
        let maps;
        if launch.tensor_maps {
            let heads = (s.b * s.h) as u64;
            maps = [
                self.tensor_map(q, heads, s.sq, s.d, launch.rows_per_cta)?,
                self.tensor_map(k, heads, s.sk, s.d, launch.kv_rows_per_block)?,
                self.tensor_map(v, heads, s.sk, s.d, launch.kv_rows_per_block)?,
            ];
            for map in &maps {
                lb.arg(map);
            }
        }
        let cfg = LaunchConfig {
            grid_dim: (
                s.sq.div_ceil(launch.rows_per_cta),
                s.b * s.h,
                launch.kv_splits,
            ),
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.smem_bytes,
        };
        unsafe { lb.launch(cfg) }.map_err(|e| anyhow!("forward launch: {e:?}"))?;
        // CLUSTER_COMBINE and LAST_CTA_COMBINE kernels merged their splits themselves.
        if launch.kv_splits > 1 && !launch.combine_in_forward {
            let combine = combine
                .as_ref()
                .ok_or_else(|| anyhow!("a split launch needs the combine kernel"))?;
            let splits = launch.kv_splits as i32;
            let mut lb = st.launch_builder(combine);
            lb.arg(&o_accum)
                .arg(&lse_accum)
                .arg(&out)
                .arg(&lse)
                .arg(&b)
                .arg(&h)
                .arg(&sq)
                .arg(&splits);
            let rows = s.b * s.h * s.sq;
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(COMBINE_ROWS_PER_BLOCK), 1, 1),
                block_dim: (COMBINE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { lb.launch(cfg) }.map_err(|e| anyhow!("combine launch: {e:?}"))?;
        }
        Ok(())
    }

    fn tensor_map(
        &self,
        address: u64,
        heads: u64,
        rows: u32,
        head_dim: u32,
        box_rows: u32,
    ) -> Result<TensorMap> {
        let key = TensorMapKey {
            address,
            heads,
            rows: rows as u64,
            head_dim: head_dim as u64,
            box_rows,
        };
        if let Some(map) = self.tensor_maps.borrow().get(&key) {
            return Ok(*map);
        }
        let map = key.encode()?;
        self.tensor_maps.borrow_mut().insert(key, map);
        Ok(map)
    }

    /// Microseconds the work `f` puts on the stream takes, between two events.
    fn timed(&self, f: impl FnOnce() -> Result<()>) -> Result<f64> {
        let st = &self.stream;
        let start = st
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda)?;
        f()?;
        let end = st
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda)?;
        Ok(start.elapsed_ms(&end).map_err(cuda)? as f64 * 1000.0)
    }

    fn median_of(&self, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        f()?;
        let mut us = Vec::with_capacity(reps);
        for _ in 0..reps {
            us.push(self.timed(&mut f)?);
        }
        us.sort_by(f64::total_cmp);
        Ok(us[us.len() / 2])
    }

    fn roof_bandwidth(&self) -> Result<(f64, f64)> {
        let st = &self.stream;
        let src = st.alloc_zeros::<u8>(ROOF_BYTES).map_err(cuda)?;
        let mut dst = st.alloc_zeros::<u8>(ROOF_BYTES).map_err(cuda)?;
        let copy_us = self.median_of(10, || st.memcpy_dtod(&src, &mut dst).map_err(cuda))?;
        let sink = st
            .alloc_zeros::<u32>(self.info.sm_count as usize * 64)
            .map_err(cuda)?;
        let n_vec = (ROOF_BYTES / 16) as u64;
        let never = 0x9E37_79B9u32;
        let cfg = LaunchConfig {
            grid_dim: (self.info.sm_count * 8, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        let read_us = self.median_of(10, || {
            let mut lb = st.launch_builder(&self.tools.read);
            lb.arg(&src).arg(&n_vec).arg(&never).arg(&sink);
            unsafe { lb.launch(cfg) }.map(|_| ()).map_err(cuda)
        })?;
        // Copy moves every byte twice (read and write); the read-only stream once.
        Ok((
            2.0 * ROOF_BYTES as f64 / copy_us / 1e3,
            ROOF_BYTES as f64 / read_us / 1e3,
        ))
    }

    /// `reps` timings of `f`, sorted: median, p10, p90 in µs.
    fn sentinel_figure(
        &self,
        name: &str,
        reps: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<SentinelFigure> {
        f()?;
        let mut us = Vec::with_capacity(reps);
        for _ in 0..reps {
            us.push(self.timed(&mut f)?);
        }
        us.sort_by(f64::total_cmp);
        Ok(SentinelFigure {
            name: name.into(),
            median_us: crate::gpu::check::percentile(&us, 50.0),
            p10_us: crate::gpu::check::percentile(&us, 10.0),
            p90_us: crate::gpu::check::percentile(&us, 90.0),
        })
    }

    fn roof_matmul(&self, dtype: Dtype) -> Result<f64> {
        let candidates = cudarc::get_lib_name_candidates("cublas");
        let names: Vec<&str> = candidates.iter().map(String::as_str).collect();
        if !library_present(&names) {
            bail!("cuBLAS cannot be loaded (looked for {})", names.join(", "));
        }
        let blas = cudarc::cublas::CudaBlas::new(self.stream.clone())
            .map_err(|e| anyhow!("cuBLAS: {e:?}"))?;
        let us = match dtype {
            Dtype::F16 => self.time_gemm(&blas, dtype, half::f16::ONE, half::f16::ZERO)?,
            Dtype::Bf16 => self.time_gemm(&blas, dtype, half::bf16::ONE, half::bf16::ZERO)?,
        };
        Ok(2.0 * (MATMUL_N as f64).powi(3) / us / 1e6)
    }

    /// Median microseconds of an n×n×n product on random operands (zeros run faster than real data).
    fn time_gemm<T>(
        &self,
        blas: &cudarc::cublas::CudaBlas,
        dtype: Dtype,
        one: T,
        zero: T,
    ) -> Result<f64>
    where
        T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy,
        cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
    {
        use cudarc::cublas::{sys::cublasOperation_t::CUBLAS_OP_N, Gemm, GemmConfig};
        let n = MATMUL_N;
        let st = &self.stream;
        let a = st.alloc_zeros::<T>(n * n).map_err(cuda)?;
        let b = st.alloc_zeros::<T>(n * n).map_err(cuda)?;
        let mut c = st.alloc_zeros::<T>(n * n).map_err(cuda)?;
        for (i, m) in [&a, &b].into_iter().enumerate() {
            let (p, _) = m.device_ptr(st);
            // As V of launch i: the mixture never transforms V, so both operands are N(0, 1).
            let plain = Geometry {
                heads: 1,
                d: n as u32,
            };
            self.generate_at(p, (n * n) as u64, dtype, 0xC0FFEE, 3 * i as u64 + 2, plain)?;
        }
        let ni = n as i32;
        let g = GemmConfig {
            transa: CUBLAS_OP_N,
            transb: CUBLAS_OP_N,
            m: ni,
            n: ni,
            k: ni,
            alpha: one,
            lda: ni,
            ldb: ni,
            beta: zero,
            ldc: ni,
        };
        self.median_of(5, || {
            // SAFETY: three n×n buffers of T, as the config says.
            unsafe { blas.gemm(g, &a, &b, &mut c) }.map_err(|e| anyhow!("gemm: {e:?}"))
        })
    }

    /// The device table of `bufs` (16-bit buffers): uploaded once per list, reused for every replay.
    fn table_of(&mut self, bufs: &[Buf]) -> Result<(u64, u32, u64)> {
        let mut longest = 0u64;
        let mut words = Vec::with_capacity(2 * bufs.len());
        for &b in bufs {
            // 32-bit buffers as twice as many 16-bit words: a checksum covers every bit either way.
            let (p, n) = self.ptr(b)?;
            words.extend([p, n as u64]);
            longest = longest.max(n as u64);
        }
        if self
            .buffer_table
            .as_ref()
            .is_none_or(|t| t.len() < words.len())
        {
            self.buffer_table = Some(self.stream.alloc_zeros::<u64>(words.len()).map_err(cuda)?);
        }
        let table = self.buffer_table.as_mut().expect("set above");
        self.stream
            .memcpy_htod(&words, &mut table.slice_mut(0..words.len()))
            .map_err(cuda)?;
        Ok((table.device_ptr(&self.stream).0, bufs.len() as u32, longest))
    }

    /// A grid over `count` buffers of at most `longest` elements: y picks the buffer, x strides
    /// over it, about as many blocks in all as one buffer alone would get.
    fn grid_for_many(&self, count: u32, longest: u64) -> LaunchConfig {
        let all = self.info.sm_count as u64 * 16;
        let per_buffer = (all / count.max(1) as u64).max(1);
        LaunchConfig {
            grid_dim: (
                longest.div_ceil(256).clamp(1, per_buffer) as u32,
                count.clamp(1, 65535),
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn generate_at(
        &self,
        ptr: u64,
        n: u64,
        dtype: Dtype,
        seed: u64,
        tensor: u64,
        geometry: Geometry,
    ) -> Result<()> {
        let bf16 = i32::from(dtype == Dtype::Bf16);
        let mut lb = self.stream.launch_builder(&self.tools.generate);
        lb.arg(&ptr)
            .arg(&n)
            .arg(&seed)
            .arg(&tensor)
            .arg(&geometry.heads)
            .arg(&geometry.d)
            .arg(&bf16);
        // Eight elements a thread (one 16-byte store).
        unsafe { lb.launch(self.grid_for(n.div_ceil(8))) }
            .map(|_| ())
            .map_err(|e| anyhow!("input generation: {e:?}"))
    }
}

impl Device for Gpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc16(&mut self, len: usize) -> Result<Buf> {
        let m = self
            .stream
            .alloc_zeros::<u16>(len.max(1))
            .map_err(|e| anyhow!("cannot allocate {len} 16-bit elements: {e:?}"))?;
        Ok(Buf(Self::slot(&mut self.memory, Memory::U16(m))))
    }

    fn alloc32(&mut self, len: usize) -> Result<Buf> {
        let m = self
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| anyhow!("cannot allocate {len} floats: {e:?}"))?;
        Ok(Buf(Self::slot(&mut self.memory, Memory::F32(m))))
    }

    fn free(&mut self, buf: Buf) {
        self.exposure.forget(buf);
        if let Some(slot) = self.memory.get_mut(buf.0) {
            *slot = None;
        }
    }

    fn generate(
        &mut self,
        buf: Buf,
        dtype: Dtype,
        seed: u64,
        tensor: u64,
        geometry: Geometry,
    ) -> Result<()> {
        let (p, n) = self.ptr(buf)?;
        self.generate_at(p, n as u64, dtype, seed, tensor, geometry)
    }

    fn poison(&mut self, buf: Buf) -> Result<()> {
        let s = self.stream.cu_stream();
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(m)) => {
                let (p, _) = m.device_ptr(&self.stream);
                unsafe { sys::cuMemsetD16Async(p, POISON_16, m.len(), s) }
            }
            Some(Memory::F32(m)) => {
                let (p, _) = m.device_ptr(&self.stream);
                unsafe { sys::cuMemsetD32Async(p, POISON_F32_BITS, m.len(), s) }
            }
            None => bail!("no buffer {}", buf.0),
        }
        .result()
        .map_err(|e| anyhow!("poison: {e:?}"))
    }

    fn draw_inputs(
        &mut self,
        bufs: &[Buf],
        dtype: Dtype,
        seed: u64,
        geometry: Geometry,
    ) -> Result<()> {
        let (table, count, longest) = self.table_of(bufs)?;
        let bf16 = i32::from(dtype == Dtype::Bf16);
        let mut lb = self.stream.launch_builder(&self.tools.generate_many);
        lb.arg(&table)
            .arg(&count)
            .arg(&seed)
            .arg(&geometry.heads)
            .arg(&geometry.d)
            .arg(&bf16);
        // Eight elements a thread (one 16-byte store).
        unsafe { lb.launch(self.grid_for_many(count, longest.div_ceil(8))) }
            .map(|_| ())
            .map_err(|e| anyhow!("drawing the timed inputs: {e:?}"))
    }

    fn flush_l2(&mut self) -> Result<()> {
        if self.l2_flush.is_none() {
            let words = (2 * self.info.l2_bytes.max(1 << 20) / 4) as usize;
            self.l2_flush = Some(self.stream.alloc_zeros::<u32>(words).map_err(cuda)?);
        }
        let scratch = self.l2_flush.as_ref().expect("set above");
        let (p, _) = scratch.device_ptr(&self.stream);
        unsafe { sys::cuMemsetD32Async(p, 0, scratch.len(), self.stream.cu_stream()) }
            .result()
            .map_err(|e| anyhow!("flushing L2: {e:?}"))
    }

    fn sync(&mut self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| anyhow!("waiting for queued work: {e:?}"))
    }

    fn checksum_all(&mut self, bufs: &[Buf]) -> Result<u64> {
        let (table, count, longest) = self.table_of(bufs)?;
        let mut out = self.stream.alloc_zeros::<u64>(1).map_err(cuda)?;
        let mut lb = self.stream.launch_builder(&self.tools.checksum_many);
        lb.arg(&table).arg(&count).arg(&mut out);
        unsafe { lb.launch(self.grid_for_many(count, longest)) }
            .map_err(|e| anyhow!("checksum of the timed inputs: {e:?}"))?;
        Ok(self.stream.clone_dtoh(&out).map_err(cuda)?[0])
    }

    fn copy(&mut self, src: Buf, dst: Buf) -> Result<()> {
        let ((s, sn), (d, dn)) = (self.ptr(src)?, self.ptr(dst)?);
        if sn != dn {
            bail!("copy between buffers of {sn} and {dn} elements");
        }
        unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, 2 * sn, self.stream.cu_stream()) }
            .result()
            .map_err(|e| anyhow!("copy: {e:?}"))
    }

    fn checksum(&mut self, buf: Buf) -> Result<u64> {
        let (p, n) = self.ptr(buf)?;
        let n = n as u64;
        let mut out = self.stream.alloc_zeros::<u64>(1).map_err(cuda)?;
        let mut lb = self.stream.launch_builder(&self.tools.checksum);
        lb.arg(&p).arg(&n).arg(&mut out);
        unsafe { lb.launch(self.grid_for(n)) }.map_err(|e| anyhow!("checksum: {e:?}"))?;
        Ok(self.stream.clone_dtoh(&out).map_err(cuda)?[0])
    }

    fn read16(&mut self, buf: Buf) -> Result<Vec<u16>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(m)) => self
                .stream
                .clone_dtoh(m)
                .map_err(|e| anyhow!("read back: {e:?}")),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn read16_range(&mut self, buf: Buf, start: usize, len: usize) -> Result<Vec<u16>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(m)) => read_range(&self.stream, m, buf, start, len),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn read32(&mut self, buf: Buf) -> Result<Vec<f32>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(m)) => self
                .stream
                .clone_dtoh(m)
                .map_err(|e| anyhow!("read back: {e:?}")),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn read16_into(&mut self, buf: Buf, out: &mut [u16]) -> Result<()> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(m)) => read_into(&self.stream, m, buf, out),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn read32_into(&mut self, buf: Buf, out: &mut [f32]) -> Result<()> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(m)) => read_into(&self.stream, m, buf, out),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn read32_range(&mut self, buf: Buf, start: usize, len: usize) -> Result<Vec<f32>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(m)) => read_range(&self.stream, m, buf, start, len),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn upload16(&mut self, buf: Buf, data: &[u16]) -> Result<()> {
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Memory::U16(m)) => upload(&self.stream, m, buf, data),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    fn upload32(&mut self, buf: Buf, data: &[f32]) -> Result<()> {
        match self.memory.get_mut(buf.0).and_then(Option::as_mut) {
            Some(Memory::F32(m)) => upload(&self.stream, m, buf, data),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn mask(&mut self, buf: Buf, key: u64) -> Result<()> {
        let (p, n) = self.ptr32(buf)?;
        let n = n as u64;
        let mut lb = self.stream.launch_builder(&self.tools.mask);
        lb.arg(&p).arg(&n).arg(&key);
        unsafe { lb.launch(self.grid_for(n)) }
            .map(|_| ())
            .map_err(|e| anyhow!("mask: {e:?}"))
    }

    /// The comparison in `ft_compare`: only a few hundred per-block partials come back, not the outputs.
    fn compare(&mut self, job: &Comparison) -> Result<CheckStats> {
        const WARPS_PER_BLOCK: u64 = 8;
        let (o, o_len) = self.ptr16(job.o)?;
        let (lse, rows) = self.ptr32(job.lse)?;
        let (ref_o, ref_o_len) = self.ptr32(job.reference.o)?;
        let (ref_lse, ref_rows) = self.ptr32(job.reference.lse)?;
        let d = job.d;
        if d == 0 || o_len != rows * d || ref_o_len != o_len || ref_rows != rows {
            bail!(
                "compare: {o_len} outputs and {rows} LSE rows against {ref_o_len} and {ref_rows} of the reference, rows of {d}"
            );
        }
        let (earlier_o, earlier_lse) = match job.earlier {
            None => (0u64, 0u64),
            Some(e) => {
                let ((eo, eo_len), (el, el_rows)) = (self.ptr16(e.o)?, self.ptr32(e.lse)?);
                if eo_len != o_len || el_rows != rows {
                    bail!("compare: the earlier run has {eo_len} outputs and {el_rows} rows, not {o_len} and {rows}");
                }
                (eo, el)
            }
        };
        let rows = rows as u64;
        let blocks = rows
            .div_ceil(WARPS_PER_BLOCK)
            .clamp(1, self.info.sm_count as u64 * 8);
        let words = blocks as usize * crate::gpu::check::ComparePartial::WORDS;
        if self
            .compare_partials
            .as_ref()
            .is_none_or(|p| p.len() < words)
        {
            self.compare_partials = Some(self.stream.alloc_zeros::<u64>(words).map_err(cuda)?);
        }
        let partials = self.compare_partials.as_mut().expect("set above");
        let (d32, bf16) = (d as i32, (job.dtype == Dtype::Bf16) as i32);
        // Each head's LSE scale, uploaded for this comparison alone (no kernel runs before it).
        let scales = job.lse_scales();
        let heads = scales.len() as u64;
        let scales = self
            .stream
            .clone_htod(if scales.is_empty() {
                &[1.0][..]
            } else {
                &scales[..]
            })
            .map_err(cuda)?;
        let mut lb = self.stream.launch_builder(&self.tools.compare);
        lb.arg(&o)
            .arg(&lse)
            .arg(&ref_o)
            .arg(&ref_lse)
            .arg(&job.reference.o_key)
            .arg(&job.reference.lse_key)
            .arg(&rows)
            .arg(&d32)
            .arg(&bf16)
            .arg(&earlier_o)
            .arg(&earlier_lse)
            .arg(&scales)
            .arg(&heads)
            .arg(&mut *partials);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (WARPS_PER_BLOCK as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { lb.launch(config) }.map_err(|e| anyhow!("compare: {e:?}"))?;
        // Every block writes its own partial: the scratch needs no zeroing between comparisons.
        let words = self
            .stream
            .clone_dtoh(&partials.slice(0..words))
            .map_err(|e| anyhow!("compare: reading its figures back: {e:?}"))?;
        Ok(words
            .chunks_exact(crate::gpu::check::ComparePartial::WORDS)
            .map(crate::gpu::check::ComparePartial::from_words)
            .fold(Default::default(), crate::gpu::check::ComparePartial::merge)
            .stats(o_len as u64))
    }

    fn load_forward(&mut self, kernel: &ForwardKernel) -> Result<KernelId> {
        let module = self
            .ctx
            .load_module(Ptx::from_file(kernel.cubin.clone()))
            .map_err(|e| anyhow!("cannot load {}: {e:?}", kernel.cubin.display()))?;
        let forward = module.load_function(&kernel.entry).map_err(|e| {
            anyhow!(
                "no entry `{}` in {}: {e:?}",
                kernel.entry,
                kernel.cubin.display()
            )
        })?;
        if kernel.launch.smem_bytes > 48 * 1024 {
            forward
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    kernel.launch.smem_bytes as i32,
                )
                .map_err(|e| {
                    anyhow!(
                        "cannot opt in to {} bytes of shared memory: {e:?}",
                        kernel.launch.smem_bytes
                    )
                })?;
        }
        // The combine is looked up now, used only when a launch splits.
        let combine = module.load_function(&kernel.combine_entry).ok();
        let loaded = Loaded::Forward {
            _module: module,
            forward,
            combine,
        };
        Ok(KernelId(Self::slot(&mut self.kernels, loaded)))
    }

    fn load_reference(&mut self, kernel: &ReferenceKernel) -> Result<KernelId> {
        let module = self
            .ctx
            .load_module(Ptx::from_file(kernel.cubin.clone()))
            .map_err(|e| anyhow!("cannot load {}: {e:?}", kernel.cubin.display()))?;
        let function = module.load_function(&kernel.entry).map_err(|e| {
            anyhow!(
                "no entry `{}` in {}: {e:?}",
                kernel.entry,
                kernel.cubin.display()
            )
        })?;
        Ok(KernelId(Self::slot(
            &mut self.kernels,
            Loaded::Reference {
                _module: module,
                function,
            },
        )))
    }

    fn unload(&mut self, kernel: KernelId) {
        if let Some(slot) = self.kernels.get_mut(kernel.0) {
            *slot = None;
        }
    }

    fn occupancy(&mut self, kernel: KernelId, launch: &LaunchShape) -> Result<u32> {
        let Some(Some(Loaded::Forward { forward, .. })) = self.kernels.get(kernel.0) else {
            bail!("no forward kernel {}", kernel.0);
        };
        forward
            .occupancy_max_active_blocks_per_multiprocessor(
                launch.threads,
                launch.smem_bytes as usize,
                None,
            )
            .map_err(cuda)
    }

    fn attributes(&mut self, kernel: KernelId) -> Result<Option<FunctionAttributes>> {
        let Some(Some(Loaded::Forward { forward, .. })) = self.kernels.get(kernel.0) else {
            bail!("no forward kernel {}", kernel.0);
        };
        Ok(Some(FunctionAttributes {
            registers: forward.num_regs().map_err(cuda)?,
            local_bytes: forward.local_size_bytes().map_err(cuda)?,
            max_active_ctas_per_sm: 0,
        }))
    }

    fn reference(&mut self, kernel: KernelId, s: &Shape, _dtype: Dtype, io: &Io) -> Result<()> {
        self.exposure.check_reference(io)?;
        let Some(Some(Loaded::Reference { function, .. })) = self.kernels.get(kernel.0) else {
            bail!("no reference kernel {}", kernel.0);
        };
        let (q, k, v, o, lse) = (
            self.ptr(io.q)?.0,
            self.ptr(io.k)?.0,
            self.ptr(io.v)?.0,
            self.ptr(io.o)?.0,
            self.ptr(io.lse)?.0,
        );
        let (b, h, sq, sk, d, causal) = (
            s.b as i32,
            s.h as i32,
            s.sq as i32,
            s.sk as i32,
            s.d as i32,
            s.causal_code(),
        );
        let scale = 1.0f32 / (s.d as f32).sqrt();
        let mut lb = self.stream.launch_builder(function);
        lb.arg(&q).arg(&k).arg(&v).arg(&o).arg(&lse);
        lb.arg(&b)
            .arg(&h)
            .arg(&sq)
            .arg(&sk)
            .arg(&d)
            .arg(&scale)
            .arg(&causal);
        let cfg = LaunchConfig {
            grid_dim: (s.sq.div_ceil(REFERENCE_ROWS_PER_BLOCK), s.b * s.h, 1),
            block_dim: (REFERENCE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { lb.launch(cfg) }.map_err(|e| anyhow!("reference launch: {e:?}"))?;
        self.stream
            .synchronize()
            .map_err(|e| anyhow!("reference kernel: {e:?}"))
    }

    fn forward(
        &mut self,
        kernel: KernelId,
        s: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<()> {
        self.exposure.give(io);
        self.launch_forward(kernel, s, launch, io)?;
        self.stream
            .synchronize()
            .map_err(|e| anyhow!("forward kernel: {e:?}"))
    }

    fn time_forward(
        &mut self,
        kernel: KernelId,
        s: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<f64> {
        self.exposure.give(io);
        self.timed(|| self.launch_forward(kernel, s, launch, io))
    }

    fn capture(
        &mut self,
        kernel: KernelId,
        s: &Shape,
        launch: &LaunchShape,
        ios: &[Io],
    ) -> Result<GraphId> {
        ios.iter().for_each(|io| self.exposure.give(io));
        let st = &self.stream;
        st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(cuda)?;
        let captured = ios
            .iter()
            .try_for_each(|io| self.launch_forward(kernel, s, launch, io));
        let graph = st
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(cuda)?;
        captured?;
        let graph = graph.ok_or_else(|| anyhow!("graph capture produced no graph"))?;
        Ok(GraphId(Self::slot(&mut self.graphs, graph)))
    }

    fn replay(&mut self, graph: GraphId) -> Result<f64> {
        let Some(Some(g)) = self.graphs.get(graph.0) else {
            bail!("no graph {}", graph.0);
        };
        self.timed(|| g.launch().map_err(|e| anyhow!("replay: {e:?}")))
    }

    fn drop_graph(&mut self, graph: GraphId) {
        if let Some(slot) = self.graphs.get_mut(graph.0) {
            *slot = None;
        }
    }

    fn roofs(&mut self, dtypes: &[Dtype]) -> Vec<RoofMeasured> {
        let gbps =
            |name: &str, r: &Result<(f64, f64)>, pick: fn(&(f64, f64)) -> f64| RoofMeasured {
                name: name.into(),
                dtype: None,
                value: r.as_ref().ok().map(pick),
                unit: "GB/s".into(),
                error: r.as_ref().err().map(|e| format!("{e:#}")),
            };
        let bandwidth = self.roof_bandwidth();
        let mut roofs = vec![
            gbps("copy", &bandwidth, |r| r.0),
            gbps("read", &bandwidth, |r| r.1),
        ];
        for &dtype in dtypes {
            // cuBLAS panics inside cudarc when a symbol is missing; that must not end the worker.
            let measured =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.roof_matmul(dtype)))
                    .unwrap_or_else(|_| Err(anyhow!("cuBLAS panicked while loading")));
            roofs.push(RoofMeasured {
                name: "matmul".into(),
                dtype: Some(dtype),
                value: measured.as_ref().ok().copied(),
                unit: "TFLOP/s".into(),
                error: measured.err().map(|e| format!("{e:#}")),
            });
        }
        roofs
    }

    fn sentinel(&mut self, reps: usize) -> Result<Vec<SentinelFigure>> {
        let st = self.stream.clone();
        let sink = st
            .alloc_zeros::<f32>(self.info.sm_count as usize * 64)
            .map_err(cuda)?;
        let (iters, never) = (SENTINEL_FMA_ITERS, -1.0f32);
        let cfg = LaunchConfig {
            grid_dim: (self.info.sm_count * 8, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let fma = self.sentinel_figure("fma", reps, || {
            let mut lb = st.launch_builder(&self.tools.fma);
            lb.arg(&iters).arg(&never).arg(&sink);
            unsafe { lb.launch(cfg) }.map(|_| ()).map_err(cuda)
        })?;
        let src = st.alloc_zeros::<u8>(SENTINEL_READ_BYTES).map_err(cuda)?;
        let words = st
            .alloc_zeros::<u32>(self.info.sm_count as usize * 64)
            .map_err(cuda)?;
        let n_vec = (SENTINEL_READ_BYTES / 16) as u64;
        let never_word = 0x9E37_79B9u32;
        let read = self.sentinel_figure("read", reps, || {
            let mut lb = st.launch_builder(&self.tools.read);
            lb.arg(&src).arg(&n_vec).arg(&never_word).arg(&words);
            unsafe { lb.launch(cfg) }.map(|_| ()).map_err(cuda)
        })?;
        Ok(vec![fma, read])
    }

    fn gpu_state_begin(&mut self) {
        if let Ok(w) = self.nvml.as_mut() {
            w.begin();
        }
    }

    fn gpu_state(&mut self) -> std::result::Result<GpuState, String> {
        match self.nvml.as_mut() {
            Ok(w) => w.read(),
            Err(why) => Err(why.clone()),
        }
    }

    fn health_check(&mut self) -> Result<()> {
        let module = self
            .ctx
            .load_module(Ptx::from_src(HEALTH_PTX))
            .map_err(|e| anyhow!("health kernel: {e:?}"))?;
        let f = module.load_function("health_axpb").map_err(cuda)?;
        let n = 4096u32;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let dx = self.stream.clone_htod(&x).map_err(cuda)?;
        let mut dy = self.stream.alloc_zeros::<f32>(n as usize).map_err(cuda)?;
        let mut lb = self.stream.launch_builder(&f);
        lb.arg(&dx).arg(&mut dy).arg(&n);
        unsafe { lb.launch(LaunchConfig::for_num_elems(n)) }
            .map_err(|e| anyhow!("health kernel launch: {e:?}"))?;
        let y = self
            .stream
            .clone_dtoh(&dy)
            .map_err(|e| anyhow!("health kernel result: {e:?}"))?;
        let wrong = x
            .iter()
            .zip(&y)
            .filter(|(x, y)| (2.0 * **x + 1.0) != **y)
            .count();
        if wrong > 0 {
            bail!("health kernel computed {wrong} wrong values of {n}");
        }
        Ok(())
    }
}

/// Whether the embedded PTX says which compiler built it (the test compares it with its source).
pub fn tools_ptx_compiler() -> Option<&'static str> {
    TOOLS_PTX
        .lines()
        .find(|l| l.starts_with("// Cuda compilation tools"))
        .map(|l| l.trim_start_matches("// "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn tools_ptx_has_every_entry() {
        for entry in [
            "ft_generate",
            "ft_generate_many",
            "ft_checksum",
            "ft_checksum_many",
            "ft_read",
            "ft_fma",
            "ft_mask",
            "ft_compare",
        ] {
            assert!(
                super::TOOLS_PTX.contains(&format!(".entry {entry}(")),
                "{entry} missing from tools.ptx"
            );
        }
    }
}
