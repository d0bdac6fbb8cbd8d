//! `FakeGpu` as the trial's `Device`: memory, drawing, checksums, reads, comparison, kernels, launches, replays and the modelled GPU state, all on the host.
use super::answers::Draw;
use super::memory::{self, Buffer, Narrow, Wide};
use super::models::{self, FakeKernel, Model, StateModel};
use super::{slot, FakeGpu, FAKE_COPY_GBPS, FAKE_MATMUL_TFLOPS, FAKE_READ_GBPS};
use crate::gpu::check;
use crate::gpu::trial::{Buf, Device, GraphId, Io, KernelId};
use crate::model::config::{Dtype, Shape};
use crate::model::protocol::{
    CheckStats, DeviceInfo, ForwardKernel, FunctionAttributes, GpuProcess, GpuState,
    ReferenceKernel, RoofMeasured, SentinelFigure,
};
use crate::model::space::LaunchShape;
use anyhow::{anyhow, bail, Result};
use std::sync::Arc;

impl Device for FakeGpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc16(&mut self, len: usize) -> Result<Buf> {
        Ok(Buf(slot(
            &mut self.memory,
            Buffer::narrow(len, Narrow::Fill(0)),
        )))
    }

    fn alloc32(&mut self, len: usize) -> Result<Buf> {
        Ok(Buf(slot(
            &mut self.memory,
            Buffer::wide(len, Wide::Fill(0)),
        )))
    }

    fn free(&mut self, buf: Buf) {
        self.exposure.forget(buf);
        self.warm.remove(&buf.0);
        if let Some(s) = self.memory.get_mut(buf.0) {
            *s = None;
        }
    }

    fn generate(
        &mut self,
        buf: Buf,
        dtype: Dtype,
        seed: u64,
        tensor: u64,
        geometry: crate::gpu::trial::mixture::Geometry,
    ) -> Result<()> {
        self.warm.insert(buf.0);
        self.set_narrow(
            buf,
            Narrow::Drawn(Draw {
                dtype,
                seed,
                tensor,
                d: geometry.d,
            }),
        )
    }

    fn poison(&mut self, buf: Buf) -> Result<()> {
        match self.buffer(buf)? {
            Buffer::Narrow { .. } => self.set_narrow(buf, Narrow::Fill(check::POISON_16)),
            Buffer::Wide { .. } => self.set_wide(buf, Wide::Fill(check::POISON_F32_BITS)),
        }
    }

    fn flush_l2(&mut self) -> Result<()> {
        self.warm.clear();
        Ok(())
    }

    fn copy(&mut self, src: Buf, dst: Buf) -> Result<()> {
        self.warm.extend([src.0, dst.0]);
        let (from, to) = (self.buffer(src)?.len(), self.buffer(dst)?.len());
        if from != to {
            bail!("copy between buffers of {from} and {to} elements");
        }
        match self.buffer(src)? {
            Buffer::Narrow { content, .. } => {
                let content = content.clone();
                self.set_narrow(dst, content)
            }
            Buffer::Wide { content, .. } => {
                let content = content.clone();
                self.set_wide(dst, content)
            }
        }
    }

    fn checksum(&mut self, buf: Buf) -> Result<u64> {
        self.warm.insert(buf.0);
        let id = match self.buffer(buf)? {
            Buffer::Narrow { .. } => self.identity(buf)?,
            Buffer::Wide { .. } => {
                let bits: Vec<u16> = self
                    .wide(buf)?
                    .iter()
                    .flat_map(|f| {
                        let b = f.to_bits();
                        [b as u16, (b >> 16) as u16]
                    })
                    .collect();
                memory::bits_identity(&bits)
            }
        };
        Ok(u64::from_le_bytes(id[..8].try_into().expect("8 bytes")))
    }

    fn read16(&mut self, buf: Buf) -> Result<Vec<u16>> {
        Ok(self.narrow(buf)?.to_vec())
    }

    fn read16_range(&mut self, buf: Buf, start: usize, len: usize) -> Result<Vec<u16>> {
        let total = self.buffer(buf)?.len();
        if start + len > total {
            bail!("read of {len} elements at {start} is past buffer {}", buf.0);
        }
        // A draw makes just the range (the oracle reads a few heads of a large set).
        if let Buffer::Narrow {
            content: Narrow::Drawn(d),
            made: None,
            ..
        } = self.buffer(buf)?
        {
            return Ok(d.range(total, start, len));
        }
        Ok(self.narrow(buf)?[start..start + len].to_vec())
    }

    fn read32(&mut self, buf: Buf) -> Result<Vec<f32>> {
        Ok(self.wide(buf)?.to_vec())
    }

    fn upload16(&mut self, buf: Buf, data: &[u16]) -> Result<()> {
        let len = self.buffer(buf)?.len();
        if len != data.len() {
            bail!("upload of {} elements into {len}", data.len());
        }
        self.set_narrow(buf, Narrow::Bits(Arc::new(data.to_vec())))
    }

    fn upload32(&mut self, buf: Buf, data: &[f32]) -> Result<()> {
        let len = self.buffer(buf)?.len();
        if len != data.len() {
            bail!("upload of {} elements into {len}", data.len());
        }
        self.set_wide(buf, Wide::Floats(Arc::new(data.to_vec())))
    }

    fn mask(&mut self, buf: Buf, key: u64) -> Result<()> {
        // Masking twice under one key gives the content back, as the XOR does.
        let content = match self.buffer(buf)? {
            Buffer::Wide { content, .. } => content.clone(),
            _ => bail!("buffer {} is not 32-bit", buf.0),
        };
        let masked = match content {
            Wide::Masked(inner, k) if k == key => *inner,
            other => Wide::Masked(Box::new(other), key),
        };
        self.set_wide(buf, masked)
    }

    /// `compare_on_host`'s figures (`check::compare`, `check::differing_bits`) on the buffers'
    /// shared arrays: no copies, and a reference unmasked by dropping the mask it was given.
    fn compare(&mut self, job: &crate::gpu::trial::Comparison) -> Result<CheckStats> {
        let (o, lse) = (self.narrow(job.o)?, self.wide(job.lse)?);
        let ref_o = self.unmasked(job.reference.o, job.reference.o_key)?;
        let ref_lse = self.unmasked(job.reference.lse, job.reference.lse_key)?;
        if job.d == 0
            || o.len() != lse.len() * job.d
            || ref_o.len() != o.len()
            || ref_lse.len() != lse.len()
        {
            bail!(
                "compare: {} outputs and {} LSE rows against {} and {} of the reference, rows of {}",
                o.len(),
                lse.len(),
                ref_o.len(),
                ref_lse.len(),
                job.d
            );
        }
        let scales = job.lse_scales();
        let mut stats = check::compare(job.dtype, job.d, &o, &lse, &ref_o, &ref_lse, &scales);
        if let Some(e) = job.earlier {
            let (eo, el) = (self.narrow(e.o)?, self.wide(e.lse)?);
            if eo.len() != o.len() || el.len() != lse.len() {
                bail!("compare: the earlier run's buffers differ in size");
            }
            // One array behind both: nothing differs (an answer shared by two launches).
            stats.nondeterministic_count = if Arc::ptr_eq(&o, &eo) && Arc::ptr_eq(&lse, &el) {
                0
            } else {
                check::differing_bits((&o, &lse), (&eo, &el))
            };
        }
        if self.miscounting_compare && stats.unwritten_count > 0 {
            stats.unwritten_count -= 1;
        }
        Ok(stats)
    }

    fn load_forward(&mut self, kernel: &ForwardKernel) -> Result<KernelId> {
        let bytes = std::fs::read(&kernel.cubin)
            .map_err(|e| anyhow!("cannot load {}: {e}", kernel.cubin.display()))?;
        let named = |key: &str| {
            kernel
                .defines
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let name = named("FAULT")
            .filter(|v| v != "FAULT_NONE")
            .or_else(|| named("CHEAT").filter(|v| v != "CHEAT_NONE"))
            .or_else(|| models::cubin_marker(&bytes, "fault "))
            .or_else(|| models::cubin_marker(&bytes, "cheat "))
            .unwrap_or_else(|| "FAULT_NONE".into());
        let model = models::model_named(&name)
            .ok_or_else(|| anyhow!("the test double has no model for {name}"))?;
        let mut k = FakeKernel::new(model, kernel.defines.clone(), kernel.cubin.clone());
        k.time_scale = models::cubin_marker(&bytes, "time x")
            .and_then(|w| w.parse::<f64>().ok())
            .filter(|x| *x > 0.0)
            .unwrap_or(1.0);
        k.block_n = kernel.launch.kv_rows_per_block.max(1);
        let state_name = named("FAKE_STATE").or_else(|| models::cubin_marker(&bytes, "state "));
        k.state = match state_name {
            None => (StateModel::Clean, false),
            Some(name) => models::state_named(&name)
                .ok_or_else(|| anyhow!("the test double has no state model `{name}`"))?,
        };
        Ok(KernelId(slot(&mut self.kernels, k)))
    }

    fn load_reference(&mut self, kernel: &ReferenceKernel) -> Result<KernelId> {
        let bytes = std::fs::read(&kernel.cubin)
            .map_err(|e| anyhow!("cannot load {}: {e}", kernel.cubin.display()))?;
        let mut k = FakeKernel::new(Model::Honest, Vec::new(), kernel.cubin.clone());
        k.nan_reference = models::cubin_marker(&bytes, "reference ").is_some_and(|w| w == "nan");
        Ok(KernelId(slot(&mut self.kernels, k)))
    }

    fn unload(&mut self, kernel: KernelId) {
        if let Some(s) = self.kernels.get_mut(kernel.0) {
            *s = None;
        }
    }

    fn occupancy(&mut self, _kernel: KernelId, _launch: &LaunchShape) -> Result<u32> {
        Ok(2)
    }

    fn attributes(&mut self, _kernel: KernelId) -> Result<Option<FunctionAttributes>> {
        Ok(None)
    }

    fn reference(&mut self, kernel: KernelId, shape: &Shape, dtype: Dtype, io: &Io) -> Result<()> {
        self.exposure.check_reference(io)?;
        let nan = self.kernel(kernel)?.nan_reference;
        let launch = self.launch(dtype, shape, io, None)?;
        self.set_wide(
            io.o,
            if nan {
                Wide::Fill(f32::NAN.to_bits())
            } else {
                Wide::ReferenceO(launch.clone())
            },
        )?;
        self.set_wide(io.lse, Wide::Lse(launch))
    }

    fn forward(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        _launch: &LaunchShape,
        io: &Io,
    ) -> Result<()> {
        self.exposure.give(io);
        self.run_model(kernel, shape, io)
    }

    fn time_forward(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        io: &Io,
    ) -> Result<f64> {
        self.exposure.give(io);
        self.run_model(kernel, shape, io)?;
        let us = self.kernel(kernel)?.model_us(shape, launch);
        Ok(us * self.time_factor())
    }

    fn capture(
        &mut self,
        kernel: KernelId,
        shape: &Shape,
        launch: &LaunchShape,
        ios: &[Io],
    ) -> Result<GraphId> {
        ios.iter().for_each(|io| self.exposure.give(io));
        Ok(GraphId(slot(
            &mut self.graphs,
            (kernel, shape.clone(), launch.clone(), ios.to_vec()),
        )))
    }

    fn replay(&mut self, graph: GraphId) -> Result<f64> {
        let (kernel, shape, launch, ios) = self.graphs[graph.0]
            .clone()
            .ok_or_else(|| anyhow!("no graph {}", graph.0))?;
        self.last_replayed = Some((kernel, shape.name.clone()));
        let mut us = 0.0;
        for io in &ios {
            us += self.time_forward(kernel, &shape, &launch, io)?;
        }
        Ok(us)
    }

    fn drop_graph(&mut self, graph: GraphId) {
        if let Some(s) = self.graphs.get_mut(graph.0) {
            *s = None;
        }
    }

    fn roofs(&mut self, dtypes: &[Dtype]) -> Vec<RoofMeasured> {
        use crate::model::vocab::Roof;
        let roof = |name: Roof, dtype, value| RoofMeasured {
            name,
            dtype,
            value: Some(value),
            unit: name.unit().into(),
            error: None,
        };
        let mut r = vec![
            roof(Roof::Copy, None, FAKE_COPY_GBPS),
            roof(Roof::Read, None, FAKE_READ_GBPS),
        ];
        r.extend(
            dtypes
                .iter()
                .map(|&d| roof(Roof::Matmul, Some(d), FAKE_MATMUL_TFLOPS)),
        );
        r
    }

    fn health_check(&mut self) -> Result<()> {
        Ok(())
    }

    fn sentinel(&mut self, _reps: usize) -> Result<Vec<SentinelFigure>> {
        let factor = self.time_factor();
        Ok([("fma", 1000.0), ("read", 400.0)]
            .into_iter()
            .map(|(name, us)| SentinelFigure {
                name: name.into(),
                median_us: us * factor,
                p10_us: us * factor,
                p90_us: us * factor,
            })
            .collect())
    }

    fn gpu_state_begin(&mut self) {
        self.last_replayed = None;
    }

    fn gpu_state(&mut self) -> std::result::Result<GpuState, String> {
        let factor = self.time_factor();
        // A reading right after a case's replays: that case is timed.
        let replayed = self.last_replayed.take();
        let mut model = StateModel::Clean;
        if let Some((kernel, shape)) = replayed {
            self.cases_timed += 1;
            if let Some(pace) = self.pace {
                std::thread::sleep(pace);
            }
            if let Some(k) = self.kernels.get(kernel.0).and_then(Option::as_ref) {
                let (state, once) = k.state;
                let n = self.timings_of.entry((k.cubin.clone(), shape)).or_insert(0);
                *n += 1;
                if !once || *n == 1 {
                    model = state;
                }
            }
        }
        if self.nvml_absent {
            return Err("NVML cannot be loaded (fake GPU: FLASHTUNE_FAKE_NVML=absent)".into());
        }
        let mut state = GpuState {
            sm_clock_mhz: Some((1980.0 / factor).round() as u32),
            mem_clock_mhz: Some(2619),
            temperature_c: Some(40 + (self.cases_timed / 5).min(35) as u32),
            power_w: Some(350.0),
            power_violation_ms: Some(0.0),
            thermal_violation_ms: Some(0.0),
            ..Default::default()
        };
        match model {
            StateModel::Clean => {}
            StateModel::Thermal => {
                state.sm_clock_mhz = Some(1410);
                state.temperature_c = Some(88);
                state.throttle_reasons = vec!["hw_thermal_slowdown".into()];
                state.thermal_violation_ms = Some(12.0);
            }
            StateModel::Power => {
                state.power_w = Some(700.0);
                state.throttle_reasons = vec!["hw_power_brake_slowdown".into()];
                state.power_violation_ms = Some(30.0);
            }
            StateModel::Neighbour => {
                state.other_processes = vec![GpuProcess {
                    pid: 4242,
                    used_bytes: Some(2 << 30),
                }];
            }
        }
        Ok(state)
    }

    fn launch_cap(&self) -> u32 {
        // Host memory and a CPU answer per verified launch: replays stay at the minimum.
        crate::gpu::trial::MIN_LAUNCHES
    }
}
