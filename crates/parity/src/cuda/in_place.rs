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
//!
//! Batches from several threads at once run side by side, each on a lane of its own (stream, tables, event),
//! outside the lock of the slot pipeline: one lane at a time capped a client's whole-stripe writes at about
//! 7,700 batches a second on an H200 machine (8 writers of 1 MiB batches: 8.1 GB/s, half what the CPU did),
//! because every batch waited for the one before it to be launched, run and waited for.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};

use super::device::{DeviceBuf, PinnedBuf, StripeIo, THREADS_PER_BLOCK};
use super::plan::{Job, Plan, FLAG_CHECK, WORD_BYTES};
use super::wait::wait_for;
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

/// Lanes the in-place path has: batches from this many threads run at once.
pub(crate) const LANES: usize = 4;

/// The in-place path: the registry of registered host memory and the lanes batches run on.
pub(crate) struct Lanes {
    // Field order is drop order: the lanes' streams, buffers and events before the context.
    lanes: Vec<Mutex<InPlace>>,
    /// Where the next batch looks for a free lane first (round robin, so that lanes share the work).
    next: AtomicUsize,
    registry: RwLock<Registry>,
    ctx: Arc<CudaContext>,
}

impl Lanes {
    pub fn new(ctx: &Arc<CudaContext>, func: &CudaFunction) -> Result<Lanes, GpuError> {
        let lanes = (0..LANES)
            .map(|_| InPlace::new(ctx, func.clone()).map(Mutex::new))
            .collect::<Result<_, _>>()?;
        Ok(Lanes {
            lanes,
            next: AtomicUsize::new(0),
            registry: RwLock::new(Registry::default()),
            ctx: ctx.clone(),
        })
    }

    /// Runs the batch in place, stripe `s` with `jobs[job_of(s)]`, on the first free lane (or waits for one).
    /// Ok(false): some chunk is not in registered memory, not on a 16-byte boundary or not whole words (nothing
    /// ran).
    /// SAFETY: every chunk `io` lends stays alive, and nothing else reads the outputs or writes any chunk,
    /// until this returns.
    pub unsafe fn run_batch(
        &self,
        jobs: &[Job],
        job_of: &dyn Fn(usize) -> usize,
        stripes: usize,
        io: &mut dyn StripeIo,
    ) -> Result<bool, GpuError> {
        let table = {
            let registry = self.registry.read().unwrap_or_else(|e| e.into_inner());
            build_table(&registry, jobs, job_of, stripes, io)
        };
        // The buffers in the table stay registered: `io` borrows them, and they are unregistered only when
        // freed.
        let Some((table, stride)) = table else {
            return Ok(false);
        };
        self.ctx.bind_to_thread().map_err(GpuError::InitDriver)?;
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut lane = take_lane(&self.lanes, first)
            .ok_or_else(|| GpuError::Panicked("a GPU lane poisoned by an earlier panic".into()))?;
        lane.run(jobs, &table, stride, stripes, io)?;
        Ok(true)
    }

    /// Page-locks `bytes` at `host` and maps them for the GPU; the device address of the start.
    /// SAFETY: `host` is a live allocation of at least `bytes`, unregistered until `unregister` is called.
    pub(crate) unsafe fn register(&self, host: *mut u8, bytes: usize) -> Result<u64, GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::InitDriver)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        sys::cuMemHostRegister_v2(host.cast(), bytes, flags)
            .result()
            .map_err(GpuError::AllocatePinned)?;
        let mut device: sys::CUdeviceptr = 0;
        if let Err(e) = sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0).result() {
            let _ = sys::cuMemHostUnregister(host.cast());
            return Err(GpuError::AllocatePinned(e));
        }
        self.registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(host as usize, bytes, device);
        Ok(device)
    }

    /// Undoes `register`.
    /// SAFETY: `host` was registered by `register` and no batch uses it.
    pub(crate) unsafe fn unregister(&self, host: *mut u8) {
        // Never leave a freed buffer in the registry, even after a panic elsewhere poisoned the lock.
        self.registry
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(host as usize);
        if self.ctx.bind_to_thread().is_ok() {
            let _ = sys::cuMemHostUnregister(host.cast());
        }
    }
}

/// The first free lane from `first` on (modulo their count), else waits for lane `first`; None when that one was
/// poisoned by a panic (a poisoned lane is never taken: what it holds may be half done).
fn take_lane<T>(lanes: &[Mutex<T>], first: usize) -> Option<MutexGuard<'_, T>> {
    let first = first % lanes.len();
    (0..lanes.len())
        .map(|i| (first + i) % lanes.len())
        .find_map(|i| lanes[i].try_lock().ok())
        .or_else(|| lanes[first].lock().ok())
}

/// One lane: the stream, buffers and event of one in-place batch at a time.
struct InPlace {
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
}

// SAFETY: the event and the buffers' raw pointers are owned here; each lane is used behind its own Mutex.
unsafe impl Send for InPlace {}

const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

impl InPlace {
    fn new(ctx: &Arc<CudaContext>, func: CudaFunction) -> Result<InPlace, GpuError> {
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
        })
    }

    /// Runs the stripes whose rows `table` holds (see `table`); flags of check jobs go to `io`.
    /// SAFETY: every address in `table` is the device address of a live registered chunk of the jobs' chunk
    /// length that nothing else reads (outputs) or writes (inputs and outputs) until this returns.
    unsafe fn run(
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
            wait_for(self.done)?;
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

/// The address table of `stripes` stripes, stripe `s` done by `jobs[job_of(s)]`: one row of `stride` entries
/// per stripe (its job's index, its inputs' device addresses, its outputs'), and the stride. None when the
/// jobs differ in chunk length or kind, are too many, or some chunk is not in registered memory, not on a
/// 16-byte boundary, or not whole words.
pub(crate) fn build_table(
    registry: &Registry,
    jobs: &[Job],
    job_of: &dyn Fn(usize) -> usize,
    stripes: usize,
    io: &mut dyn StripeIo,
) -> Option<(Vec<u64>, usize)> {
    let first = jobs.first()?;
    let bytes = first.chunk_bytes;
    let kind = first.plan.flags & FLAG_CHECK;
    if registry.is_empty()
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
        registry.device_address(ptr, bytes)
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

impl Drop for InPlace {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        // SAFETY: created in new(); nothing waits on it any more.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.done);
        }
    }
}

#[cfg(test)]
mod lane_tests {
    use std::sync::Mutex;

    use super::take_lane;

    #[test]
    fn a_batch_takes_the_first_free_lane_from_its_turn_on() {
        let lanes: Vec<Mutex<usize>> = (0..4).map(Mutex::new).collect();
        assert_eq!(*take_lane(&lanes, 2).unwrap(), 2, "its own turn when free");
        assert_eq!(
            *take_lane(&lanes, 6).unwrap(),
            2,
            "turns wrap around the lanes"
        );
        let _busy2 = lanes[2].lock().unwrap();
        let _busy3 = lanes[3].lock().unwrap();
        assert_eq!(
            *take_lane(&lanes, 2).unwrap(),
            0,
            "past the busy ones, round to the start"
        );
        let _busy0 = lanes[0].lock().unwrap();
        assert_eq!(*take_lane(&lanes, 3).unwrap(), 1);
    }

    #[test]
    fn a_batch_waits_for_its_turn_when_every_lane_is_busy() {
        let lanes: Vec<Mutex<usize>> = (0..2).map(Mutex::new).collect();
        std::thread::scope(|scope| {
            let held = lanes[1].lock().unwrap();
            let _other = lanes[0].lock().unwrap();
            let waiter = scope.spawn(|| *take_lane(&lanes, 1).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "every lane is held: it waits");
            // Its turn's lane comes free: it takes that one.
            drop(held);
            assert_eq!(waiter.join().unwrap(), 1);
        });
    }

    #[test]
    fn a_poisoned_lane_is_never_taken() {
        let lanes: Vec<Mutex<usize>> = (0..2).map(Mutex::new).collect();
        let _ = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let _guard = lanes[0].lock().unwrap();
                    panic!("a batch panicked on lane 0");
                })
                .join()
        });
        assert!(lanes[0].is_poisoned());
        assert_eq!(
            *take_lane(&lanes, 0).unwrap(),
            1,
            "the healthy lane instead"
        );
        let _busy1 = lanes[1].lock().unwrap();
        assert!(
            take_lane(&lanes, 0).is_none(),
            "no healthy lane free and the turn's lane poisoned: an error, not a wait on it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{build_table, Registry, MAX_PLANS};
    use crate::cuda::plan::{emulate, Job};
    use crate::cuda::{recovery_jobs, RecoverIo};
    use crate::reference::Reference;
    use crate::stripe::{validate_recover, Erasures};
    use crate::{Backend, StripeRecover};

    const K: usize = 4;
    const LEN: usize = 64;
    const WIDTH: usize = K + 2;
    const STRIPES: usize = 6;
    /// Where the test pretends the GPU sees the arena: a translation the table must apply.
    const DEVICE_BASE: u64 = 0x7f00_0000_0000;

    /// A 16-byte aligned arena of STRIPES RAID6 stripes (random data, reference P and Q) inside `backing`.
    fn arena(backing: &mut Vec<u8>) -> (usize, Vec<u8>) {
        backing.resize(STRIPES * WIDTH * LEN + 32, 0);
        let at = (16 - backing.as_ptr() as usize % 16) % 16;
        let mut seed = 0x5eed_u64;
        for byte in backing.iter_mut() {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *byte = (seed >> 56) as u8;
        }
        for stripe in backing[at..at + STRIPES * WIDTH * LEN].chunks_mut(WIDTH * LEN) {
            let (data, parity) = stripe.split_at_mut(K * LEN);
            let data: Vec<&[u8]> = data.chunks(LEN).collect();
            let (p, q) = parity.split_at_mut(LEN);
            Reference.gen_pq(&data, p, q);
        }
        let expected = backing[at..at + STRIPES * WIDTH * LEN].to_vec();
        (at, expected)
    }

    /// Stripe j's lost chunks; stripe 0 is recovered without Q (data and P only), as a rebuild does with a row
    /// whose Q it did not read.
    fn lost(j: usize) -> (Vec<usize>, bool) {
        match j {
            0 => (vec![2], false),
            1 => (vec![K], true),
            2 => (vec![K + 1], true),
            3 => (vec![1, 3], true),
            4 => (vec![0, K], true),
            _ => (vec![2, K + 1], true),
        }
    }

    #[test]
    fn a_table_of_mixed_plans_run_by_the_kernel_emulator_recovers_every_stripe() {
        let mut backing = Vec::new();
        let (at, expected) = arena(&mut backing);
        let host = backing[at..].as_ptr() as usize;
        let mut registry = Registry::default();
        registry.insert(host, STRIPES * WIDTH * LEN, DEVICE_BASE);
        let memory = &mut backing[at..at + STRIPES * WIDTH * LEN];
        for (j, stripe) in memory.chunks_mut(WIDTH * LEN).enumerate() {
            for m in lost(j).0 {
                stripe[m * LEN..(m + 1) * LEN].fill(0xee);
            }
        }
        let lists: Vec<(Vec<usize>, bool)> = (0..STRIPES).map(lost).collect();
        let mut chunks: Vec<Vec<&mut [u8]>> = memory
            .chunks_mut(WIDTH * LEN)
            .zip(&lists)
            .map(|(s, (_, has_q))| {
                s.chunks_mut(LEN)
                    .take(if *has_q { WIDTH } else { K + 1 })
                    .collect()
            })
            .collect();
        let mut batch: Vec<StripeRecover> = chunks
            .iter_mut()
            .zip(&lists)
            .map(|(chunks, (missing, has_q))| StripeRecover {
                chunks,
                has_q: *has_q,
                missing,
            })
            .collect();
        // One job per kind of loss, by the function CudaBackend::recover_in_place uses.
        let shapes: Vec<(Erasures, usize, bool)> = batch
            .iter()
            .map(|stripe| {
                let erasures = validate_recover(
                    stripe.chunks.iter().map(|c| c.len()),
                    stripe.chunks.len(),
                    stripe.has_q,
                    stripe.missing,
                )
                .expect("valid");
                (erasures, LEN, stripe.has_q)
            })
            .collect();
        let (jobs, job_of) =
            recovery_jobs(K, LEN, &shapes).expect("six kinds of loss fit one launch");
        assert_eq!(jobs.len(), STRIPES, "every stripe lost something else");
        let (table, stride) = build_table(
            &registry,
            &jobs,
            &|s| job_of[s],
            STRIPES,
            &mut RecoverIo {
                stripes: &mut batch,
            },
        )
        .expect("all registered, aligned, whole words");
        assert!(
            stride <= 1 + WIDTH,
            "a row holds no more than its stripe's chunks: {stride}"
        );
        assert_eq!(table.len(), STRIPES * stride);
        // What the kernel does with each row, through the emulator: the row's plan, its chunks by address.
        let memory = &mut backing[at..at + STRIPES * WIDTH * LEN];
        for row in table.chunks_exact(stride) {
            let plan = &jobs[row[0] as usize].plan;
            let (ins, outs) = (plan.in_chunks as usize, plan.out_chunks as usize);
            let offset = |address: u64| (address - DEVICE_BASE) as usize;
            let inputs: Vec<Vec<u8>> = row[1..1 + ins]
                .iter()
                .map(|&a| memory[offset(a)..offset(a) + LEN].to_vec())
                .collect();
            let inputs: Vec<&[u8]> = inputs.iter().map(|c| c.as_slice()).collect();
            let mut outputs = vec![vec![0u8; LEN]; outs];
            emulate(plan, &inputs, &mut outputs);
            for (&a, out) in row[1 + ins..1 + ins + outs].iter().zip(&outputs) {
                memory[offset(a)..offset(a) + LEN].copy_from_slice(out);
            }
        }
        assert!(
            memory[..] == expected[..],
            "every stripe recovered from its own plan"
        );
    }

    #[test]
    fn no_table_for_chunks_outside_registered_memory_off_boundary_or_too_many_plans() {
        let mut backing = Vec::new();
        let (at, _) = arena(&mut backing);
        let host = backing[at..].as_ptr() as usize;
        let mut registry = Registry::default();
        registry.insert(host, STRIPES * WIDTH * LEN + 16, DEVICE_BASE);
        let erasures =
            validate_recover([LEN; WIDTH].into_iter(), WIDTH, true, &[0]).expect("valid");
        let job = || Job::recover(K, true, &erasures, LEN);
        let mut outside = [0u8; LEN];
        let mut try_table = |shift: usize, outside_chunk: bool, jobs: &[Job]| {
            let memory = &mut backing[at + shift..at + shift + WIDTH * LEN];
            let mut chunks: Vec<&mut [u8]> = memory.chunks_mut(LEN).collect();
            if outside_chunk {
                chunks[1] = &mut outside[..];
            }
            let mut batch = [StripeRecover {
                chunks: &mut chunks,
                has_q: true,
                missing: &[0],
            }];
            build_table(
                &registry,
                jobs,
                &|_| 0,
                1,
                &mut RecoverIo {
                    stripes: &mut batch,
                },
            )
        };
        assert!(try_table(0, false, &[job()]).is_some(), "the control case");
        assert!(
            try_table(0, true, &[job()]).is_none(),
            "a chunk outside registered memory"
        );
        assert!(
            try_table(8, false, &[job()]).is_none(),
            "chunks off the 16-byte boundary"
        );
        let many: Vec<Job> = (0..=MAX_PLANS).map(|_| job()).collect();
        assert!(
            try_table(0, false, &many).is_none(),
            "more plans than a launch takes"
        );
        let check = Job::check(K, true, LEN);
        assert!(
            try_table(0, false, &[job(), check]).is_none(),
            "a check mixed with a recovery"
        );
    }

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
