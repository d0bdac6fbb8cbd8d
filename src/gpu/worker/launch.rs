//! Launching a forward kernel: its arguments, the TMA tensor maps of the Hopper path, and the combine of a split launch.
use super::gpu::{Gpu, Loaded};
use crate::gpu::trial::{Buf, Io, KernelId};
use crate::model::config::Shape;
use crate::model::space::LaunchShape;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::sys;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The combine kernel's fixed geometry; kernels/attention/forward.cu asserts the same numbers.
const COMBINE_THREADS: u32 = 128;
const COMBINE_ROWS_PER_BLOCK: u32 = 4;

/// A TMA tensor map, passed by value as a kernel parameter (the driver copies its 128 bytes).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(super) struct TensorMap(sys::CUtensorMap);
// SAFETY: plain bytes the driver encoded, with the size and alignment of the kernel's parameter.
unsafe impl cudarc::driver::DeviceRepr for TensorMap {}

/// What one tensor map encodes: a buffer of `heads` x `rows` x `head_dim` 16-bit elements, read
/// in boxes of `box_rows` rows x 64 elements. The map is a pure function of these.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct TensorMapKey {
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

impl Gpu {
    pub(super) fn launch_forward(
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
            grid_dim: launch.forward_grid(s.sq, s.b * s.h),
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
}
