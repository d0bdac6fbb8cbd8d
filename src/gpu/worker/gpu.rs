//! The worker's hold on one GPU: its CUDA context and stream, its own kernels, and the slabs of buffers, kernels and graphs it hands out by id.
use super::launch::{TensorMap, TensorMapKey};
use super::staging::{Staging, STAGED_FROM_BYTES};
use super::{arch_for, driver_library_present, nvml, TOOLS_PTX};
use crate::gpu::trial::mixture::Geometry;
use crate::gpu::trial::Buf;
use crate::model::config::Dtype;
use crate::model::protocol::DeviceInfo;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

pub(super) enum Memory {
    U16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

pub(super) enum Loaded {
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

pub(super) struct Tools {
    _module: Arc<CudaModule>,
    generate: CudaFunction,
    pub(super) generate_many: CudaFunction,
    pub(super) checksum: CudaFunction,
    pub(super) checksum_many: CudaFunction,
    pub(super) read: CudaFunction,
    pub(super) fma: CudaFunction,
    pub(super) mask: CudaFunction,
    pub(super) compare: CudaFunction,
}

pub struct Gpu {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) info: DeviceInfo,
    pub(super) tools: Tools,
    pub(super) memory: Vec<Option<Memory>>,
    pub(super) kernels: Vec<Option<Loaded>>,
    pub(super) graphs: Vec<Option<CudaGraph>>,
    /// Encoded once per buffer and geometry: no host work between a timed launch's events.
    pub(super) tensor_maps: std::cell::RefCell<std::collections::HashMap<TensorMapKey, TensorMap>>,
    /// NVML on this GPU, or why it cannot be read (then no timing carries a state).
    pub(super) nvml: std::result::Result<nvml::Watch, String>,
    /// Where the table (address, length) of a buffer list `draw_inputs` or `checksum_all` is given
    /// goes: written anew for every call, since a kernel under test can write device memory between
    /// two (the device is the kernel's), grown as needed.
    buffer_table: Option<CudaSlice<u64>>,
    /// Scratch for `ft_compare`'s per-block figures, grown as needed: one comparison per verified launch.
    pub(super) compare_partials: Option<CudaSlice<u64>>,
    /// Twice the L2 cache, written over to push a draw's last writes out of L2 before a replay.
    pub(super) l2_flush: Option<CudaSlice<u32>>,
    /// Buffers a kernel under test was given: never a reference's.
    pub(super) exposure: crate::gpu::trial::Exposure,
    /// Pinned host memory for large copies, made at the first.
    staging: Option<Staging>,
}

pub(super) fn cuda(e: cudarc::driver::DriverError) -> anyhow::Error {
    anyhow!("{e:?}")
}

impl Gpu {
    pub(super) fn open(ordinal: u32) -> Result<Self> {
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
        // The harness keeps what it judges in pageable host memory because a kernel cannot reach it
        // there; on a device that addresses pageable memory (HMM, ATS) it could, so no timing here
        // would count.
        if attr(Attr::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0 {
            bail!(
                "GPU {ordinal} can address this process's pageable host memory (HMM or ATS: \
                 CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS = 1), so a kernel under test could \
                 rewrite the copies of its outputs the harness keeps there; flashtune times on no \
                 such device. On x86 with the open kernel modules, load nvidia_uvm with \
                 uvm_disable_hmm=1"
            );
        }
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
            staging: None,
        })
    }

    pub(super) fn slot<T>(slab: &mut Vec<Option<T>>, item: T) -> usize {
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
    pub(super) fn ptr(&self, buf: Buf) -> Result<(u64, usize)> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(s)) => Ok((s.device_ptr(&self.stream).0, s.len())),
            Some(Memory::F32(s)) => Ok((s.device_ptr(&self.stream).0, 2 * s.len())),
            None => bail!("no buffer {}", buf.0),
        }
    }

    /// Device address and element count of a 32-bit buffer.
    pub(super) fn ptr32(&self, buf: Buf) -> Result<(u64, usize)> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(s)) => Ok((s.device_ptr(&self.stream).0, s.len())),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    /// Device address and element count of a 16-bit buffer.
    pub(super) fn ptr16(&self, buf: Buf) -> Result<(u64, usize)> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::U16(s)) => Ok((s.device_ptr(&self.stream).0, s.len())),
            _ => bail!("buffer {} is not 16-bit", buf.0),
        }
    }

    pub(super) fn grid_for(&self, n: u64) -> LaunchConfig {
        let blocks = (n.div_ceil(256)).clamp(1, self.info.sm_count as u64 * 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The device table of `bufs` (16-bit buffers): uploaded once per list, reused for every replay.
    pub(super) fn table_of(&mut self, bufs: &[Buf]) -> Result<(u64, u32, u64)> {
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
    pub(super) fn grid_for_many(&self, count: u32, longest: u64) -> LaunchConfig {
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

    pub(super) fn generate_at(
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

/// Elements [start, start + len) of buffer `buf`, read back.
pub(super) fn read_range<T: cudarc::driver::DeviceRepr + Default + Clone>(
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

impl Gpu {
    /// The whole of a buffer (at `ptr`, `len` elements) into `out`, which must be its length, in
    /// pageable memory; done when it returns. A large one goes through the staging buffer.
    pub(super) fn read_whole<T: Copy + Send + Sync>(
        &mut self,
        buf: Buf,
        (ptr, len): (u64, usize),
        out: &mut [T],
    ) -> Result<()> {
        if len != out.len() {
            bail!(
                "read of buffer {} ({len} elements) into {}",
                buf.0,
                out.len()
            );
        }
        if std::mem::size_of_val(out) >= STAGED_FROM_BYTES {
            let stream = self.stream.clone();
            return self
                .staging()?
                .read(&stream, ptr, out)
                .map_err(|e| anyhow!("read back: {e:#}"));
        }
        unsafe { cudarc::driver::result::memcpy_dtoh_async(out, ptr, self.stream.cu_stream()) }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| anyhow!("read back: {e:?}"))
    }

    /// The whole of a buffer (at `ptr`, `len` elements) from the host; the lengths must agree.
    pub(super) fn write_whole<T: Copy + Send + Sync>(
        &mut self,
        buf: Buf,
        (ptr, len): (u64, usize),
        data: &[T],
    ) -> Result<()> {
        if len != data.len() {
            bail!(
                "upload of {} elements into buffer {} of {len}",
                data.len(),
                buf.0
            );
        }
        if std::mem::size_of_val(data) >= STAGED_FROM_BYTES {
            let stream = self.stream.clone();
            return self
                .staging()?
                .write(&stream, ptr, data)
                .map_err(|e| anyhow!("upload: {e:#}"));
        }
        unsafe { cudarc::driver::result::memcpy_htod_async(ptr, data, self.stream.cu_stream()) }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| anyhow!("upload: {e:?}"))
    }

    /// Every `(device address, host bytes)` read, done when it returns: those that fit the staging
    /// buffer together in one transfer each, a larger one alone.
    pub(super) fn read_all(&mut self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        let stream = self.stream.clone();
        self.staging()?
            .read_all(&stream, reads)
            .map_err(|e| anyhow!("read back: {e:#}"))
    }

    fn staging(&mut self) -> Result<&mut Staging> {
        if self.staging.is_none() {
            self.staging = Some(Staging::new()?);
        }
        Ok(self.staging.as_mut().expect("just made"))
    }
}
