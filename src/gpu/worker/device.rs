//! The trials' `Device` on a real GPU: each request of `trial` as CUDA work on the worker's stream.
use super::gpu::{cuda, read_range, Gpu, Loaded, Memory};
use super::staging::as_bytes_mut;
use crate::gpu::check::PartialStats;
use crate::gpu::check::{POISON_16, POISON_F32_BITS};
use crate::gpu::trial::mixture::Geometry;
use crate::gpu::trial::{Buf, Comparison, Device, GraphId, Io, KernelId};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::{
    CheckStats, DeviceInfo, ForwardKernel, FunctionAttributes, GpuState, ReferenceKernel,
    RoofMeasured, SentinelFigure,
};
use crate::model::space::LaunchShape;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::sys;
use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

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

/// The reference kernel's fixed geometry; kernels/oracle/reference.cu asserts the same numbers.
const REFERENCE_THREADS: u32 = 256;
const REFERENCE_ROWS_PER_BLOCK: u32 = 64;
/// The sentinel's read stream: far beyond any L2 (50 MiB on an H100), a few hundred µs on HBM.
const SENTINEL_READ_BYTES: usize = 1 << 28;
/// Steps of each FMA chain in the sentinel's compute kernel: about a millisecond on an H100.
const SENTINEL_FMA_ITERS: u32 = 16384;

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
        let at = self.ptr16(buf)?;
        self.read_whole(buf, at, out)
    }

    fn read32_into(&mut self, buf: Buf, out: &mut [f32]) -> Result<()> {
        let at = self.ptr32(buf)?;
        self.read_whole(buf, at, out)
    }

    fn read_outputs_into(&mut self, reads: &mut [(&Io, &mut [u16], &mut [f32])]) -> Result<()> {
        let mut all: Vec<(u64, &mut [u8])> = Vec::with_capacity(2 * reads.len());
        for (io, o, lse) in reads.iter_mut() {
            let (o_at, o_len) = self.ptr16(io.o)?;
            let (lse_at, lse_len) = self.ptr32(io.lse)?;
            if o_len != o.len() || lse_len != lse.len() {
                bail!(
                    "read of buffers {} and {} ({o_len} and {lse_len} elements) into {} and {}",
                    io.o.0,
                    io.lse.0,
                    o.len(),
                    lse.len()
                );
            }
            all.push((o_at, as_bytes_mut(o)));
            all.push((lse_at, as_bytes_mut(lse)));
        }
        self.read_all(&mut all)
    }

    fn read32_range(&mut self, buf: Buf, start: usize, len: usize) -> Result<Vec<f32>> {
        match self.memory.get(buf.0).and_then(Option::as_ref) {
            Some(Memory::F32(m)) => read_range(&self.stream, m, buf, start, len),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        }
    }

    fn upload16(&mut self, buf: Buf, data: &[u16]) -> Result<()> {
        let at = self.ptr16(buf)?;
        self.write_whole(buf, at, data)
    }

    fn upload32(&mut self, buf: Buf, data: &[f32]) -> Result<()> {
        let at = self.ptr32(buf)?;
        self.write_whole(buf, at, data)
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
        use crate::model::vocab::Roof;
        let gbps =
            |name: Roof, r: &Result<(f64, f64)>, pick: fn(&(f64, f64)) -> f64| RoofMeasured {
                name,
                dtype: None,
                value: r.as_ref().ok().map(pick),
                unit: name.unit().into(),
                error: r.as_ref().err().map(|e| format!("{e:#}")),
            };
        let bandwidth = self.roof_bandwidth();
        let mut roofs = vec![
            gbps(Roof::Copy, &bandwidth, |r| r.0),
            gbps(Roof::Read, &bandwidth, |r| r.1),
        ];
        for &dtype in dtypes {
            // cuBLAS panics inside cudarc when a symbol is missing; that must not end the worker.
            let measured =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.roof_matmul(dtype)))
                    .unwrap_or_else(|_| Err(anyhow!("cuBLAS panicked while loading")));
            roofs.push(RoofMeasured {
                name: Roof::Matmul,
                dtype: Some(dtype),
                value: measured.as_ref().ok().copied(),
                unit: Roof::Matmul.unit().into(),
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
