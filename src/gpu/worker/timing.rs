//! Timing on the GPU's stream: event pairs, medians, the roofs (copy, read, matmul) and the sentinel's figures.
use super::gpu::{cuda, Gpu};
use super::library_present;
use crate::gpu::trial::mixture::Geometry;
use crate::model::config::Dtype;
use crate::model::protocol::SentinelFigure;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::sys;
use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

/// The roofs are measured on buffers far beyond any L2, with a matmul large enough to reach the sustained clock.
const ROOF_BYTES: usize = 1 << 30;
const MATMUL_N: usize = 8192;

impl Gpu {
    /// Microseconds the work `f` puts on the stream takes, between two events.
    pub(super) fn timed(&self, f: impl FnOnce() -> Result<()>) -> Result<f64> {
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

    pub(super) fn roof_bandwidth(&self) -> Result<(f64, f64)> {
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
    pub(super) fn sentinel_figure(
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

    pub(super) fn roof_matmul(&self, dtype: Dtype) -> Result<f64> {
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
}
