//! Batches served in place: host memory registered with the GPU (page-locked and mapped into its address
//! space, see [`crate::host`]) is read and written by the kernel where it lies, over PCIe.
//!
//! The slot pipeline (device.rs) copies every chunk into a pinned slot and every result back out on a CPU
//! core: 9-15 GB/s on an H100 machine, slower than one core computing the parity itself. Here the CPU only
//! writes a table of chunk addresses (8 bytes per chunk, 8 more per stripe naming its plan), queues the table's
//! copy and one launch, and sleeps on a blocking event until the GPU is done: the parity costs the host next to
//! no CPU. The stripes of one launch may each have their own plan (up to MAX_PLANS), so a rebuild's batch,
//! whose lost chunk is data in one row and P or Q in the next, is one launch, not one per row.
//! A batch goes this way only when every chunk lies inside one registered buffer, starts on a 16-byte
//! boundary and is a whole number of 16-byte words; anything else takes the slot pipeline.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};

use super::device::{DeviceBuf, Gpu, PinnedBuf, StripeIo, THREADS_PER_BLOCK};
use super::plan::{Job, Plan, FLAG_CHECK, WORD_BYTES};
use super::GpuError;

pub const IN_PLACE_KERNEL_NAME: &str = "paraid_stripe_in_place";

/// Table entries one launch takes (per stripe: its plan's index, its inputs' and outputs' addresses): 512 KiB.
const TABLE_ENTRIES: usize = 64 << 10;
/// Most distinct plans in one launch: a RAID6 rebuild's batch needs one per role of the lost chunk (data
/// chunks, P, Q), two lost members a plan per pair of roles.
pub(crate) const MAX_PLANS: usize = 64;
/// Most stripes per launch (grid.y).
const MAX_STRIPES: usize = 65535;

/// Registered host buffers: host start -> (bytes, device address of the start).
#[derive(Default)]
pub(crate) struct Registry {
    ranges: BTreeMap<usize, (usize, u64)>,
}

impl Registry {
    pub fn insert(&mut self, host: usize, bytes: usize, device: u64) {
        let previous = self.ranges.insert(host, (bytes, device));
        debug_assert!(previous.is_none(), "host buffer registered twice");
    }

    pub fn remove(&mut self, host: usize) {
        self.ranges.remove(&host);
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The device address of `bytes` at `host`, if they lie wholly inside one registered buffer.
    pub fn device_address(&self, host: usize, bytes: usize) -> Option<u64> {
        let (&start, &(len, device)) = self.ranges.range(..=host).next_back()?;
        let offset = host - start;
        (offset.checked_add(bytes)? <= len).then(|| device + offset as u64)
    }
}

/// The stream, buffers and event of the in-place path (one batch at a time: the Gpu is behind a mutex).
pub(crate) struct InPlace {
    stream: Arc<CudaStream>,
    func: CudaFunction,
    host_plans: PinnedBuf,
    dev_plans: DeviceBuf,
    host_table: PinnedBuf,
    dev_table: DeviceBuf,
    host_bad: PinnedBuf,
    dev_bad: DeviceBuf,
    /// Created with CU_EVENT_BLOCKING_SYNC: the waiting thread sleeps instead of spinning on a core.
    done: sys::CUevent,
    pub registry: Registry,
}

// SAFETY: the event and the buffers' raw pointers are owned here; InPlace lives inside the Gpu, behind a Mutex.
unsafe impl Send for InPlace {}

const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

impl InPlace {
    pub fn new(ctx: &Arc<CudaContext>, func: CudaFunction) -> Result<InPlace, GpuError> {
        let stream = ctx.new_stream().map_err(GpuError::CreateStream)?;
        let host_plans = PinnedBuf::new(ctx, MAX_PLANS * std::mem::size_of::<Plan>())?;
        let dev_plans = DeviceBuf::new(ctx, MAX_PLANS * std::mem::size_of::<Plan>())?;
        let host_table = PinnedBuf::new(ctx, TABLE_ENTRIES * 8)?;
        let dev_table = DeviceBuf::new(ctx, TABLE_ENTRIES * 8)?;
        let host_bad = PinnedBuf::new(ctx, MAX_STRIPES * 4)?;
        let dev_bad = DeviceBuf::new(ctx, MAX_STRIPES * 4)?;
        // Last, so that nothing after it can fail and leak it.
        let mut done: sys::CUevent = std::ptr::null_mut();
        // SAFETY: plain creation; destroyed in Drop.
        unsafe { sys::cuEventCreate(&mut done, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING) }
            .result()
            .map_err(GpuError::CreateStream)?;
        Ok(InPlace {
            stream,
            func,
            host_plans,
            dev_plans,
            host_table,
            dev_table,
            host_bad,
            dev_bad,
            done,
            registry: Registry::default(),
        })
    }

    /// The address table of `stripes` stripes, stripe `s` done by `jobs[job_of(s)]`: one row of `stride` entries
    /// per stripe (its job's index, its inputs' device addresses, its outputs'), and the stride. None when the
    /// jobs differ in chunk length or kind, are too many, or some chunk is not in registered memory, not on a
    /// 16-byte boundary, or not whole words.
    pub fn table(
        &self,
        jobs: &[Job],
        job_of: &dyn Fn(usize) -> usize,
        stripes: usize,
        io: &mut dyn StripeIo,
    ) -> Option<(Vec<u64>, usize)> {
        let first = jobs.first()?;
        let bytes = first.chunk_bytes;
        let kind = first.plan.flags & FLAG_CHECK;
        if self.registry.is_empty()
            || jobs.len() > MAX_PLANS
            || bytes == 0
            || jobs.iter().any(|job| {
                job.chunk_bytes != bytes
                    || job.pitch_bytes() != bytes
                    || job.plan.flags & FLAG_CHECK != kind
            })
        {
            return None;
        }
        let stride = 1 + jobs
            .iter()
            .map(|job| (job.plan.in_chunks + job.plan.out_chunks) as usize)
            .max()?;
        if TABLE_ENTRIES / stride == 0 {
            return None;
        }
        let address = |ptr: usize| -> Option<u64> {
            if !ptr.is_multiple_of(WORD_BYTES) {
                return None;
            }
            self.registry.device_address(ptr, bytes)
        };
        let mut table = vec![0u64; stripes * stride];
        for (stripe, row) in table.chunks_exact_mut(stride).enumerate() {
            let index = job_of(stripe);
            let job = &jobs[index];
            row[0] = index as u64;
            let mut cells = row[1..].iter_mut();
            for chunk in job.input_indices() {
                let chunk = io.input(stripe, chunk);
                debug_assert_eq!(chunk.len(), bytes);
                *cells.next()? = address(chunk.as_ptr() as usize)?;
            }
            for chunk in job.output_indices() {
                let chunk = io.output(stripe, chunk);
                debug_assert_eq!(chunk.len(), bytes);
                *cells.next()? = address(chunk.as_mut_ptr() as usize)?;
            }
        }
        Some((table, stride))
    }

    /// Runs the stripes whose rows `table` holds (see `table`); flags of check jobs go to `io`.
    /// SAFETY: every address in `table` is the device address of a live registered chunk of the jobs' chunk
    /// length that nothing else reads (outputs) or writes (inputs and outputs) until this returns.
    pub unsafe fn run(
        &mut self,
        jobs: &[Job],
        table: &[u64],
        stride: usize,
        stripes: usize,
        io: &mut dyn StripeIo,
    ) -> Result<(), GpuError> {
        debug_assert!(!jobs.is_empty() && jobs.len() <= MAX_PLANS);
        debug_assert_eq!(table.len(), stripes * stride);
        let is_check = jobs[0].plan.flags & FLAG_CHECK != 0;
        let per_launch = (TABLE_ENTRIES / stride).min(MAX_STRIPES);
        let stream = self.stream.cu_stream();
        let plan_bytes = std::mem::size_of::<Plan>();
        let host_plans = self.host_plans.slice_mut(jobs.len() * plan_bytes);
        for (dst, job) in host_plans.chunks_exact_mut(plan_bytes).zip(jobs) {
            dst.copy_from_slice(job.plan.as_bytes());
        }
        result::memcpy_htod_async(self.dev_plans.ptr, &*host_plans, stream)
            .map_err(GpuError::CopyToDevice)?;
        let pitch_words = jobs[0].plan.pitch_words as u32;
        let mut first = 0;
        while first < stripes {
            let n = per_launch.min(stripes - first);
            let rows = &table[first * stride..(first + n) * stride];
            // The previous launch was waited for (below), so nothing reads the host table now.
            let host_table = self.host_table.slice_mut(rows.len() * 8);
            for (dst, entry) in host_table.chunks_exact_mut(8).zip(rows) {
                dst.copy_from_slice(&entry.to_ne_bytes());
            }
            result::memcpy_htod_async(self.dev_table.ptr, &*host_table, stream)
                .map_err(GpuError::CopyToDevice)?;
            if is_check {
                result::memset_d8_async(self.dev_bad.ptr, 0, n * 4, stream)
                    .map_err(GpuError::CopyToDevice)?;
            }
            let config = LaunchConfig {
                grid_dim: (pitch_words.div_ceil(THREADS_PER_BLOCK).max(1), n as u32, 1),
                block_dim: (THREADS_PER_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            let (stride_arg, count) = (stride as i32, n as i32);
            let mut builder = self.stream.launch_builder(&self.func);
            builder
                .arg(&self.dev_plans.ptr)
                .arg(&self.dev_table.ptr)
                .arg(&stride_arg)
                .arg(&self.dev_bad.ptr)
                .arg(&count);
            builder.launch(config).map_err(GpuError::Launch)?;
            if is_check {
                let host_bad = self.host_bad.slice_mut(n * 4);
                result::memcpy_dtoh_async(host_bad, self.dev_bad.ptr, stream)
                    .map_err(GpuError::CopyToHost)?;
            }
            sys::cuEventRecord(self.done, stream)
                .result()
                .map_err(GpuError::Synchronize)?;
            sys::cuEventSynchronize(self.done)
                .result()
                .map_err(GpuError::Synchronize)?;
            if is_check {
                let host_bad = self.host_bad.slice_mut(n * 4);
                for (j, flag) in host_bad.chunks_exact(4).enumerate() {
                    io.flag(first + j, flag != [0, 0, 0, 0]);
                }
            }
            first += n;
        }
        Ok(())
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        // SAFETY: created in new(); nothing waits on it any more.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.done);
        }
    }
}

impl Gpu {
    /// Page-locks `bytes` at `host` and maps them for the GPU; the device address of the start.
    /// SAFETY: `host` is a live allocation of at least `bytes`, unregistered until `unregister` is called.
    pub(crate) unsafe fn register(&mut self, host: *mut u8, bytes: usize) -> Result<u64, GpuError> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        sys::cuMemHostRegister_v2(host.cast(), bytes, flags)
            .result()
            .map_err(GpuError::AllocatePinned)?;
        let mut device: sys::CUdeviceptr = 0;
        if let Err(e) = sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0).result() {
            let _ = sys::cuMemHostUnregister(host.cast());
            return Err(GpuError::AllocatePinned(e));
        }
        self.in_place.registry.insert(host as usize, bytes, device);
        Ok(device)
    }

    /// Undoes `register`.
    /// SAFETY: `host` was registered by `register` and no batch uses it.
    pub(crate) unsafe fn unregister(&mut self, host: *mut u8) {
        self.in_place.registry.remove(host as usize);
        if self.bind().is_ok() {
            let _ = sys::cuMemHostUnregister(host.cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Registry;

    #[test]
    fn device_address_only_inside_one_registered_buffer() {
        let mut registry = Registry::default();
        assert_eq!(registry.device_address(0x10_000, 16), None);
        registry.insert(0x10_000, 0x4000, 0x7000_0000);
        registry.insert(0x20_000, 0x1000, 0x9000_0000);
        assert_eq!(registry.device_address(0x10_000, 0x4000), Some(0x7000_0000));
        assert_eq!(registry.device_address(0x11_010, 0x100), Some(0x7000_1010));
        // Running past the end, starting before the first buffer, in the gap, or past the second.
        assert_eq!(registry.device_address(0x13_ff0, 0x20), None);
        assert_eq!(registry.device_address(0x0f_ff0, 0x10), None);
        assert_eq!(registry.device_address(0x18_000, 0x10), None);
        assert_eq!(registry.device_address(0x20_ff0, 0x10), Some(0x9000_0ff0));
        assert_eq!(registry.device_address(0x20_ff0, 0x11), None);
        assert_eq!(registry.device_address(usize::MAX - 4, 0x10), None);
        registry.remove(0x10_000);
        assert_eq!(registry.device_address(0x11_010, 0x100), None);
        assert!(!registry.is_empty());
        registry.remove(0x20_000);
        assert!(registry.is_empty());
    }
}
