//! Large copies between the device and the worker's pageable host memory, through a pinned staging
//! buffer. The driver copies pageable memory at about 10 GB/s on an H200 host (one thread empties
//! its own bounce buffer); into pinned memory it copies at 55 GB/s, and several threads move that
//! on (`os::host_memory`). Architecture Invariant: the staging buffer holds bytes only in transit.
//! Pinned memory is mapped into the device's address space, so a kernel under test can write it;
//! every copy here fills it and empties it with no launch in between, so nothing a kernel writes
//! there reaches what the harness keeps (that stays in pageable memory, out of the device's reach).
use super::gpu::cuda;
use anyhow::Result;
use cudarc::driver::{result, sys, CudaStream};
use std::sync::Arc;

/// Copies of fewer bytes take the driver's pageable path: staging would not pay.
pub(super) const STAGED_FROM_BYTES: usize = 1 << 20;
/// The pinned buffer: a larger copy goes through it in pieces of this size.
const STAGING_BYTES: usize = 32 << 20;

pub(super) struct Staging {
    ptr: *mut u8,
}

impl Staging {
    pub(super) fn new() -> Result<Self> {
        // Flags 0: cached, not write-combined (the host reads it back).
        let ptr = unsafe { result::malloc_host(STAGING_BYTES, 0) }.map_err(cuda)? as *mut u8;
        Ok(Staging { ptr })
    }

    fn bytes(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, STAGING_BYTES) }
    }

    /// `out` gets the `out.len()` elements at `src`; done when it returns.
    pub(super) fn read<T: Copy + Send + Sync>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: sys::CUdeviceptr,
        out: &mut [T],
    ) -> Result<()> {
        let out = as_bytes_mut(out);
        for start in (0..out.len()).step_by(STAGING_BYTES) {
            let n = STAGING_BYTES.min(out.len() - start);
            let staged = &mut self.bytes()[..n];
            unsafe { result::memcpy_dtoh_async(staged, src + start as u64, stream.cu_stream()) }
                .map_err(cuda)?;
            stream.synchronize().map_err(cuda)?;
            crate::os::host_memory::copy(staged, &mut out[start..start + n]);
        }
        Ok(())
    }

    /// Each read's bytes from its device address; done when it returns. Reads that fit the buffer
    /// together are copied in one go and waited for once (a launch's copy and its wait cost more
    /// than its bytes below a few MiB); each batch leaves the buffer before the next fills it.
    pub(super) fn read_all(
        &mut self,
        stream: &Arc<CudaStream>,
        reads: &mut [(sys::CUdeviceptr, &mut [u8])],
    ) -> Result<()> {
        let mut first = 0;
        while first < reads.len() {
            let (mut end, mut used) = (first, 0);
            while end < reads.len() && used + aligned(reads[end].1.len()) <= STAGING_BYTES {
                used += aligned(reads[end].1.len());
                end += 1;
            }
            if end == first {
                let (src, out) = &mut reads[first];
                self.read(stream, *src, out)?;
                first += 1;
                continue;
            }
            let mut at = 0;
            for (src, out) in reads[first..end].iter() {
                let staged = &mut self.bytes()[at..at + out.len()];
                unsafe { result::memcpy_dtoh_async(staged, *src, stream.cu_stream()) }
                    .map_err(cuda)?;
                at += aligned(out.len());
            }
            stream.synchronize().map_err(cuda)?;
            let staged: &[u8] = self.bytes();
            let mut at = 0;
            let mut pairs: Vec<(&[u8], &mut [u8])> = Vec::with_capacity(end - first);
            for (_, out) in reads[first..end].iter_mut() {
                let n = out.len();
                pairs.push((&staged[at..at + n], &mut **out));
                at += aligned(n);
            }
            crate::os::host_memory::copy_all(pairs);
            first = end;
        }
        Ok(())
    }

    /// The `data.len()` elements at `dst` get `data`; done when it returns.
    pub(super) fn write<T: Copy + Send + Sync>(
        &mut self,
        stream: &Arc<CudaStream>,
        dst: sys::CUdeviceptr,
        data: &[T],
    ) -> Result<()> {
        let data = as_bytes(data);
        for start in (0..data.len()).step_by(STAGING_BYTES) {
            let n = STAGING_BYTES.min(data.len() - start);
            let staged = &mut self.bytes()[..n];
            crate::os::host_memory::copy(&data[start..start + n], staged);
            unsafe { result::memcpy_htod_async(dst + start as u64, staged, stream.cu_stream()) }
                .map_err(cuda)?;
            stream.synchronize().map_err(cuda)?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// A place in the staging buffer for `n` bytes: 256-byte aligned, as the driver's copies like.
fn aligned(n: usize) -> usize {
    n.div_ceil(256) * 256
}

fn as_bytes<T: Copy>(s: &[T]) -> &[u8] {
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// The bytes of a slice of plain numbers.
pub(super) fn as_bytes_mut<T: Copy>(s: &mut [T]) -> &mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}
