//! `flashtune worker`: the only process that touches the GPU. Reads one request, checks and times each case, answers in JSON lines.
use crate::check::{self, POISON_16, POISON_F32_BITS};
use crate::config::Shape;
use crate::protocol::*;
use crate::space::LaunchShape;
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

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

/// The fp32 reference kernel must agree with the f64 oracle this closely (it is plain fp32 math).
pub const REFERENCE_VS_CPU_LIMIT: f64 = 1e-5;
/// The combine kernel's fixed geometry; kernels/attention/forward.cu asserts the same numbers.
const COMBINE_THREADS: u32 = 128;
const COMBINE_ROWS_PER_BLOCK: u32 = 4;

/// Entry point of the subcommand. Exit code 0 when every case was attempted.
pub fn serve() -> std::process::ExitCode {
    let mut input = String::new();
    let request: WorkerRequest = match std::io::stdin()
        .read_to_string(&mut input)
        .map_err(anyhow::Error::from)
        .and_then(|_| Ok(serde_json::from_str(&input)?))
    {
        Ok(r) => r,
        Err(e) => {
            emit(&WorkerMessage::Fatal {
                message: format!("bad request: {e}"),
            });
            return std::process::ExitCode::from(2);
        }
    };
    match handle(request) {
        Ok(()) => {
            emit(&WorkerMessage::Done);
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            emit(&WorkerMessage::Fatal {
                message: format!("{e:#}"),
            });
            std::process::ExitCode::from(1)
        }
    }
}

pub fn emit(msg: &WorkerMessage) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, msg);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

fn handle(request: WorkerRequest) -> Result<()> {
    match request {
        WorkerRequest::Probe { device } => {
            let gpu = Gpu::open(device)?;
            emit(&WorkerMessage::Device(gpu.info.clone()));
            gpu.health_check()
        }
        WorkerRequest::Run(req) => {
            let mut gpu = Gpu::open(req.device)?;
            emit(&WorkerMessage::Device(gpu.info.clone()));
            for case in &req.cases {
                let result = gpu.run_case(case, &req.measure);
                let failed_in_cuda = result.error.is_some();
                emit(&WorkerMessage::Case(Box::new(result)));
                if failed_in_cuda {
                    // A sticky error (illegal address, trap) poisons the context: stop unless the GPU still computes.
                    gpu.health_check()
                        .context("GPU failed its health check after a kernel error")?;
                }
            }
            Ok(())
        }
        WorkerRequest::Duel(req) => {
            let mut gpu = Gpu::open(req.device)?;
            emit(&WorkerMessage::Device(gpu.info.clone()));
            for pair in &req.pairs {
                let result = gpu.duel(pair, &req.measure, req.rounds);
                let failed_in_cuda = result.error.is_some();
                emit(&WorkerMessage::Duel(Box::new(result)));
                if failed_in_cuda {
                    gpu.health_check()
                        .context("GPU failed its health check after a kernel error")?;
                }
            }
            Ok(())
        }
    }
}

/// Whether a CUDA driver library can be loaded at all; cudarc panics when it cannot.
pub fn driver_library_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        let c = std::ffi::CString::new(*name).expect("no NUL");
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

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: HashMap<PathBuf, Arc<CudaModule>>,
}

/// A forward kernel loaded and checked, with the buffers it ran on, ready to be timed.
struct Checked {
    forward: CudaFunction,
    combine: Option<CudaFunction>,
    launch: LaunchShape,
    bufs: Buffers,
    scale: f32,
    passed: bool,
}

struct Buffers {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    out: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    out_accum: Option<CudaSlice<f32>>,
    lse_accum: Option<CudaSlice<f32>>,
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
        let ctx = CudaContext::new(ordinal as usize)
            .map_err(|e| anyhow!("cannot create a CUDA context on GPU {ordinal}: {e:?}"))?;
        // One stream, no cudarc event bookkeeping: the timed graphs must contain only our kernels.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| anyhow!("{e:?}"))?;
        let attr = |a: Attr| {
            ctx.attribute(a)
                .map_err(|e| anyhow!("device attribute {a:?}: {e:?}"))
        };
        let cc = ctx.compute_capability().map_err(|e| anyhow!("{e:?}"))?;
        let mut driver_version = 0;
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| anyhow!("{e:?}"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(|e| anyhow!("{e:?}"))?,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            compute_capability: cc,
            arch: arch_for(cc),
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32,
            max_smem_optin_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u32,
            driver_version,
            total_memory_bytes: ctx.total_mem().map_err(|e| anyhow!("{e:?}"))? as u64,
            visible_devices: count as u32,
            fake: false,
        };
        Ok(Gpu {
            ctx,
            stream,
            info,
            modules: HashMap::new(),
        })
    }

    fn health_check(&self) -> Result<()> {
        let module = self
            .ctx
            .load_module(Ptx::from_src(HEALTH_PTX))
            .map_err(|e| anyhow!("health kernel: {e:?}"))?;
        let f = module
            .load_function("health_axpb")
            .map_err(|e| anyhow!("{e:?}"))?;
        let n = 4096u32;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let dx = self.stream.clone_htod(&x).map_err(|e| anyhow!("{e:?}"))?;
        let mut dy = self
            .stream
            .alloc_zeros::<f32>(n as usize)
            .map_err(|e| anyhow!("{e:?}"))?;
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

    fn function(&mut self, cubin: &PathBuf, entry: &str) -> Result<CudaFunction> {
        if !self.modules.contains_key(cubin) {
            let m = self
                .ctx
                .load_module(Ptx::from_file(cubin.clone()))
                .map_err(|e| anyhow!("cannot load {}: {e:?}", cubin.display()))?;
            self.modules.insert(cubin.clone(), m);
        }
        self.modules[cubin]
            .load_function(entry)
            .map_err(|e| anyhow!("no entry `{entry}` in {}: {e:?}", cubin.display()))
    }

    fn run_case(&mut self, case: &CaseSpec, measure: &MeasureSpec) -> CaseResult {
        let mut result = CaseResult {
            shape: case.shape.name.clone(),
            dtype: case.dtype,
            check: None,
            timing: None,
            function: None,
            kv_splits: case.forward.launch.kv_splits,
            error: None,
        };
        if let Err(e) = self.check_and_time(case, measure, &mut result) {
            result.error = Some(format!("{e:#}"));
        }
        result
    }

    fn check_and_time(
        &mut self,
        case: &CaseSpec,
        measure: &MeasureSpec,
        result: &mut CaseResult,
    ) -> Result<()> {
        let checked = self.check(case, result)?;
        // A profiling request asks for no samples: ncu only needs the launches of the check.
        if checked.passed && measure.samples > 0 {
            result.timing = Some(self.time(&checked, &case.shape, measure)?);
        }
        Ok(())
    }

    /// Load the variant, run it twice on fresh poisoned buffers and judge it against the reference.
    fn check(&mut self, case: &CaseSpec, result: &mut CaseResult) -> Result<Checked> {
        let s = &case.shape;
        let (heads, sq, sk, d) = (
            (s.b * s.h) as usize,
            s.sq as usize,
            s.sk as usize,
            s.d as usize,
        );
        let q_bits = check::random_bits(case.dtype, heads * sq * d, case.seed, 0);
        let k_bits = check::random_bits(case.dtype, heads * sk * d, case.seed, 1);
        let v_bits = check::random_bits(case.dtype, heads * sk * d, case.seed, 2);
        let st = self.stream.clone();
        let cuda = |e: cudarc::driver::DriverError| anyhow!("{e:?}");

        // The oracle chain: CPU f64 checks the fp32 kernel on small shapes, which checks the variant on all.
        let reference = self.function(&case.reference.cubin, &case.reference.entry)?;
        let forward = self.function(&case.forward.cubin, &case.forward.entry)?;
        let ctas_per_sm = forward
            .occupancy_max_active_blocks_per_multiprocessor(
                case.forward.launch.threads,
                case.forward.launch.smem_bytes as usize,
                None,
            )
            .map_err(cuda)?;
        let mut launch = case.forward.launch.clone();
        if launch.kv_splits == 0 {
            let ctas = s.sq.div_ceil(launch.rows_per_cta) * s.b * s.h;
            launch.kv_splits = auto_kv_splits(
                ctas,
                self.info.sm_count * ctas_per_sm.max(1),
                s.sk.div_ceil(launch.kv_rows_per_block),
            );
        }
        result.kv_splits = launch.kv_splits;
        let launch = &launch;
        let combine = if launch.kv_splits > 1 {
            Some(self.function(&case.forward.cubin, &case.forward.combine_entry)?)
        } else {
            None
        };
        let mut bufs = Buffers {
            q: st.clone_htod(&q_bits).map_err(cuda)?,
            k: st.clone_htod(&k_bits).map_err(cuda)?,
            v: st.clone_htod(&v_bits).map_err(cuda)?,
            out: st.alloc_zeros::<u16>(heads * sq * d).map_err(cuda)?,
            lse: st.alloc_zeros::<f32>(heads * sq).map_err(cuda)?,
            out_accum: None,
            lse_accum: None,
        };
        if combine.is_some() {
            let splits = launch.kv_splits as usize;
            bufs.out_accum = Some(
                st.alloc_zeros::<f32>(splits * heads * sq * d)
                    .map_err(cuda)?,
            );
            bufs.lse_accum = Some(st.alloc_zeros::<f32>(splits * heads * sq).map_err(cuda)?);
        }
        let mut ref_out = st.alloc_zeros::<f32>(heads * sq * d).map_err(cuda)?;
        let mut ref_lse = st.alloc_zeros::<f32>(heads * sq).map_err(cuda)?;
        self.poison_f32(&ref_out)?;
        self.poison_f32(&ref_lse)?;
        let scale = 1.0f32 / (d as f32).sqrt();
        {
            let mut lb = st.launch_builder(&reference);
            let (b, h, sq_i, sk_i, d_i, causal) = (
                s.b as i32,
                s.h as i32,
                s.sq as i32,
                s.sk as i32,
                s.d as i32,
                s.causal_code(),
            );
            lb.arg(&bufs.q)
                .arg(&bufs.k)
                .arg(&bufs.v)
                .arg(&mut ref_out)
                .arg(&mut ref_lse);
            lb.arg(&b)
                .arg(&h)
                .arg(&sq_i)
                .arg(&sk_i)
                .arg(&d_i)
                .arg(&scale)
                .arg(&causal);
            let cfg = LaunchConfig {
                grid_dim: (s.sq.div_ceil(4), s.b * s.h, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { lb.launch(cfg) }.map_err(|e| anyhow!("reference launch: {e:?}"))?;
        }
        let ref_out_h = st
            .clone_dtoh(&ref_out)
            .map_err(|e| anyhow!("reference kernel: {e:?}"))?;
        let ref_lse_h = st.clone_dtoh(&ref_lse).map_err(cuda)?;
        let reference_vs_cpu = case.cpu_oracle.then(|| {
            let [q, k, v] = [&q_bits, &k_bits, &v_bits].map(|b| check::values(case.dtype, b));
            let (o64, _) = check::cpu_attention(s, &q, &k, &v);
            check::rel_l2_f64(&ref_out_h, &o64)
        });

        if launch.smem_bytes > 48 * 1024 {
            forward
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.smem_bytes as i32,
                )
                .map_err(|e| {
                    anyhow!(
                        "cannot opt in to {} bytes of shared memory: {e:?}",
                        launch.smem_bytes
                    )
                })?;
        }
        result.function = Some(FunctionAttributes {
            registers: forward.num_regs().map_err(cuda)?,
            local_bytes: forward.local_size_bytes().map_err(cuda)?,
            max_active_ctas_per_sm: ctas_per_sm,
        });

        // Two runs on poisoned buffers: the first is judged, the second must match it bit for bit.
        let mut runs = Vec::new();
        for _ in 0..2 {
            self.poison_16(&bufs.out)?;
            self.poison_f32(&bufs.lse)?;
            if let (Some(oa), Some(la)) = (&bufs.out_accum, &bufs.lse_accum) {
                self.poison_f32(oa)?;
                self.poison_f32(la)?;
            }
            self.launch_forward(
                &forward,
                combine.as_ref(),
                &case.shape,
                launch,
                &bufs,
                scale,
            )?;
            let out = st
                .clone_dtoh(&bufs.out)
                .map_err(|e| anyhow!("forward kernel: {e:?}"))?;
            let lse = st.clone_dtoh(&bufs.lse).map_err(cuda)?;
            runs.push((out, lse));
        }
        let (out, lse) = &runs[0];
        let mut stats = check::compare(case.dtype, out, lse, &ref_out_h, &ref_lse_h);
        stats.nondeterministic_count = runs[0]
            .0
            .iter()
            .zip(&runs[1].0)
            .filter(|(a, b)| a != b)
            .count() as u64
            + runs[0]
                .1
                .iter()
                .zip(&runs[1].1)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count() as u64;
        stats.reference_vs_cpu_rel_l2 = reference_vs_cpu;
        check::judge(&mut stats, &case.tolerance, REFERENCE_VS_CPU_LIMIT);
        let passed = stats.passed();
        result.check = Some(stats);
        Ok(Checked {
            forward,
            combine,
            launch: launch.clone(),
            bufs,
            scale,
            passed,
        })
    }

    fn launch_forward(
        &self,
        forward: &CudaFunction,
        combine: Option<&CudaFunction>,
        s: &Shape,
        launch: &LaunchShape,
        bufs: &Buffers,
        scale: f32,
    ) -> Result<()> {
        let st = &self.stream;
        let ptr = |b: &Option<CudaSlice<f32>>| b.as_ref().map_or(0u64, |b| b.device_ptr(st).0);
        let (o_accum, lse_accum) = (ptr(&bufs.out_accum), ptr(&bufs.lse_accum));
        let (b, h, sq, sk, causal) = (
            s.b as i32,
            s.h as i32,
            s.sq as i32,
            s.sk as i32,
            s.causal_code(),
        );
        let (q, k, v) = (
            bufs.q.device_ptr(st).0,
            bufs.k.device_ptr(st).0,
            bufs.v.device_ptr(st).0,
        );
        let (out, lse) = (bufs.out.device_ptr(st).0, bufs.lse.device_ptr(st).0);
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
        if let Some(combine) = combine {
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

    /// CUDA-graph replay of back-to-back launches, timed with events: launch gaps stay out of the figure.
    fn time(&self, k: &Checked, shape: &Shape, measure: &MeasureSpec) -> Result<TimingStats> {
        let launches = self.launches_per_sample(k, shape, measure)?;
        let graph = self.capture(k, shape, launches)?;
        self.warm_up(&graph, measure)?;
        let mut samples = Vec::with_capacity(measure.samples);
        for _ in 0..measure.samples {
            samples.push(self.time_replay(&graph)? / launches as f64);
        }
        Ok(check::summarize(samples, launches, shape.flops()))
    }

    /// Microseconds the work `f` puts on the stream takes, between two events.
    fn timed(&self, f: &dyn Fn() -> Result<()>) -> Result<f64> {
        let st = &self.stream;
        let cuda = |e: cudarc::driver::DriverError| anyhow!("{e:?}");
        let start = st
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda)?;
        f()?;
        let end = st
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda)?;
        Ok(start.elapsed_ms(&end).map_err(cuda)? as f64 * 1000.0)
    }

    /// Enough back-to-back launches that one sample lasts `min_sample_us`.
    fn launches_per_sample(
        &self,
        k: &Checked,
        shape: &Shape,
        measure: &MeasureSpec,
    ) -> Result<u32> {
        let single_us = self.timed(&|| self.launch_checked(k, shape))?.max(0.5);
        Ok(((measure.min_sample_us / single_us).ceil() as u32).clamp(1, 1000))
    }

    fn capture(&self, k: &Checked, shape: &Shape, launches: u32) -> Result<CudaGraph> {
        let st = &self.stream;
        let cuda = |e: cudarc::driver::DriverError| anyhow!("{e:?}");
        st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(cuda)?;
        let captured = (0..launches).try_for_each(|_| self.launch_checked(k, shape));
        let graph = st
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(cuda)?;
        captured?;
        graph.ok_or_else(|| anyhow!("graph capture produced no graph"))
    }

    fn warm_up(&self, graph: &CudaGraph, measure: &MeasureSpec) -> Result<()> {
        let mut warm_us = 0.0;
        while warm_us < measure.warmup_ms * 1000.0 {
            warm_us += self.time_replay(graph)?;
        }
        Ok(())
    }

    fn time_replay(&self, graph: &CudaGraph) -> Result<f64> {
        self.timed(&|| graph.launch().map_err(|e| anyhow!("{e:?}")))
    }

    fn launch_checked(&self, k: &Checked, shape: &Shape) -> Result<()> {
        self.launch_forward(
            &k.forward,
            k.combine.as_ref(),
            shape,
            &k.launch,
            &k.bufs,
            k.scale,
        )
    }

    /// Check the challenger, then the champion, each on its own fresh inputs; then time them
    /// alternately (A B A B ...) so clock and thermal drift land on both sides alike.
    fn duel(&mut self, pair: &DuelPair, measure: &MeasureSpec, rounds: usize) -> DuelResult {
        let mut duel = DuelResult {
            shape: pair.challenger.shape.name.clone(),
            dtype: pair.challenger.dtype,
            champion_check: None,
            challenger_check: None,
            champion_us: Vec::new(),
            challenger_us: Vec::new(),
            launches_per_sample: 0,
            error: None,
        };
        if let Err(e) = self.duel_inner(pair, measure, rounds, &mut duel) {
            duel.error = Some(format!("{e:#}"));
        }
        duel
    }

    fn duel_inner(
        &mut self,
        pair: &DuelPair,
        measure: &MeasureSpec,
        rounds: usize,
        duel: &mut DuelResult,
    ) -> Result<()> {
        let shape = &pair.challenger.shape;
        let mut scratch = CaseResult {
            shape: shape.name.clone(),
            dtype: pair.challenger.dtype,
            check: None,
            timing: None,
            function: None,
            kv_splits: 0,
            error: None,
        };
        let challenger = self.check(&pair.challenger, &mut scratch)?;
        duel.challenger_check = scratch.check.take();
        if !challenger.passed {
            return Ok(());
        }
        let champion = self.check(&pair.champion, &mut scratch)?;
        duel.champion_check = scratch.check.take();
        if !champion.passed {
            return Ok(());
        }
        // The same launch count on both sides: each sample covers the same amount of champion work.
        let launches = self.launches_per_sample(&champion, shape, measure)?;
        duel.launches_per_sample = launches;
        let graphs = [
            self.capture(&champion, shape, launches)?,
            self.capture(&challenger, shape, launches)?,
        ];
        for g in &graphs {
            self.warm_up(g, measure)?;
        }
        for _ in 0..rounds {
            duel.champion_us
                .push(self.time_replay(&graphs[0])? / launches as f64);
            duel.challenger_us
                .push(self.time_replay(&graphs[1])? / launches as f64);
        }
        Ok(())
    }

    fn poison_16(&self, buf: &CudaSlice<u16>) -> Result<()> {
        let (p, _) = buf.device_ptr(&self.stream);
        unsafe { sys::cuMemsetD16Async(p, POISON_16, buf.len(), self.stream.cu_stream()) }
            .result()
            .map_err(|e| anyhow!("poison: {e:?}"))
    }

    fn poison_f32(&self, buf: &CudaSlice<f32>) -> Result<()> {
        let (p, _) = buf.device_ptr(&self.stream);
        unsafe { sys::cuMemsetD32Async(p, POISON_F32_BITS, buf.len(), self.stream.cu_stream()) }
            .result()
            .map_err(|e| anyhow!("poison: {e:?}"))
    }
}

/// FlashAttention-2's split heuristic: split only when the grid fills less than ~80% of one wave,
/// then take the fewest splits whose wave efficiency is within 85% of the best.
pub fn auto_kv_splits(ctas: u32, slots: u32, kv_blocks: u32) -> u32 {
    if ctas as f64 >= 0.8 * slots as f64 {
        return 1;
    }
    let max_splits = 128.min(slots).min(kv_blocks).max(1);
    let efficiency = |splits: u32| {
        let waves = (ctas * splits) as f64 / slots as f64;
        waves / waves.ceil()
    };
    // A split count that leaves the per-split block count unchanged only adds combine work.
    let useful =
        |splits: u32| splits == 1 || kv_blocks.div_ceil(splits) != kv_blocks.div_ceil(splits - 1);
    let best = (1..=max_splits)
        .filter(|&s| useful(s))
        .map(efficiency)
        .fold(0.0, f64::max);
    (1..=max_splits)
        .find(|&s| useful(s) && efficiency(s) >= 0.85 * best)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::auto_kv_splits;

    #[test]
    fn full_grids_are_not_split() {
        assert_eq!(auto_kv_splits(264, 264, 64), 1);
    }

    #[test]
    fn small_grids_are_split_to_fill_the_gpu() {
        // Decode (1,8,1,4096): 8 CTAs of one query block, 132 SMs x 2 CTAs, 64 key blocks.
        let s = auto_kv_splits(8, 264, 64);
        assert!(s > 1 && 8 * s <= 264 + 8, "{s}");
        // Never more splits than key blocks.
        assert_eq!(auto_kv_splits(1, 264, 3), 3);
    }
}
