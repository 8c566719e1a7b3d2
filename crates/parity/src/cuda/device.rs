//! The GPU side: context, the NVRTC-compiled kernel, and a ring of slots (stream, pinned host
//! buffers, device buffers) through which batches flow.
//!
//! A batch is cut into sub-batches that fit a slot. For each: the CPU gathers the stripes' input
//! chunks into the slot's pinned buffer, then queues copy in, kernel, copy out on the slot's stream
//! and moves on to the next slot; results are scattered to the caller's buffers when the slot comes
//! round again. So while the GPU works on one sub-batch, the CPU fills the next and empties the one
//! before, and copies in and out overlap on the two DMA engines. Caller memory is only ever touched
//! by the CPU: the DMA engines see only our pinned buffers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};

use super::in_place::{Lanes, IN_PLACE_KERNEL_NAME};
use super::plan::{Job, Plan, WORD_BYTES};
use super::GpuError;

/// Slots in the ring: one being filled, one in flight, one being emptied.
pub(crate) const SLOTS: usize = 3;
/// Input (and output) bytes per slot.
pub(crate) const SLOT_BYTES: usize = 8 << 20;
/// Most stripes per kernel launch (grid.y) and per slot.
pub(crate) const MAX_STRIPES_PER_SLOT: usize = 65535;
pub(super) const THREADS_PER_BLOCK: u32 = 256;
/// Device bytes of stripe input for the kernel-alone and device-copy benchmarks. A slot (8 MiB)
/// goes through an H100 in a few microseconds, so timing slots measures launch overhead; this much
/// makes both figures bandwidth.
const BENCH_BYTES: usize = 512 << 20;

/// The kernel source, compiled at run time by NVRTC.
pub const STRIPE_KERNEL_SOURCE: &str = include_str!("kernels/stripe.cu");
pub const STRIPE_KERNEL_NAME: &str = "paraid_stripe";

/// Page-locked host memory, so copies are true DMA and can run asynchronously.
pub(super) struct PinnedBuf {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    bytes: usize,
}

impl PinnedBuf {
    pub(super) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(GpuError::AllocatePinned)?;
        // Flags 0: cached, not write-combined; the CPU reads results back from these buffers.
        // SAFETY: plain allocation; freed in Drop.
        let ptr =
            unsafe { result::malloc_host(bytes, 0) }.map_err(GpuError::AllocatePinned)? as *mut u8;
        Ok(PinnedBuf {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }

    /// SAFETY: no copy may be writing the range (its stream was synchronized).
    pub(super) unsafe fn slice_mut(&mut self, bytes: usize) -> &mut [u8] {
        assert!(bytes <= self.bytes);
        std::slice::from_raw_parts_mut(self.ptr, bytes)
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host; every stream using it was synchronized by Gpu::drop.
            unsafe {
                let _ = result::free_host(self.ptr as *mut std::ffi::c_void);
            }
        }
    }
}

pub(super) struct DeviceBuf {
    ctx: Arc<CudaContext>,
    pub(super) ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuf {
    pub(super) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(GpuError::AllocateDevice)?;
        // SAFETY: plain allocation; freed in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(GpuError::AllocateDevice)?;
        Ok(DeviceBuf {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync; streams synchronized by Gpu::drop.
            unsafe {
                let _ = result::free_sync(self.ptr);
            }
        }
    }
}

struct Slot {
    stream: Arc<CudaStream>,
    host_plan: PinnedBuf,
    dev_plan: DeviceBuf,
    host_in: PinnedBuf,
    host_out: PinnedBuf,
    host_bad: PinnedBuf,
    dev_in: DeviceBuf,
    dev_out: DeviceBuf,
    dev_bad: DeviceBuf,
}

// SAFETY: the raw pointers are owned allocations; Gpu is only used behind a Mutex.
unsafe impl Send for Slot {}

/// The device buffers one launch reads and writes.
#[derive(Clone, Copy)]
struct Region {
    plan: sys::CUdeviceptr,
    input: sys::CUdeviceptr,
    output: sys::CUdeviceptr,
    bad: sys::CUdeviceptr,
}

/// Where a pipeline reads its stripes' chunks and writes its results (stripe indices as in the
/// crate: data 0..k, P = k, Q = k + 1).
pub(crate) trait StripeIo {
    fn input(&self, stripe: usize, index: usize) -> &[u8];
    fn output(&mut self, stripe: usize, index: usize) -> &mut [u8];
    /// For check jobs: whether the stripe's syndromes were non-zero.
    fn flag(&mut self, stripe: usize, bad: bool);
}

pub(crate) struct Gpu {
    // Field order is drop order: buffers and streams before the module and the context.
    slots: Vec<Slot>,
    /// The in-place path, shared with the batches that run on it outside this Gpu's lock.
    pub(super) in_place: Arc<Lanes>,
    func: CudaFunction,
    _module: Arc<CudaModule>,
    ctx: Arc<CudaContext>,
    pub device_name: String,
}

/// Every kernel source file, by name: what CI compiles with NVRTC.
pub const KERNEL_SOURCES: &[(&str, &str)] = &[("stripe.cu", STRIPE_KERNEL_SOURCE)];

/// Compiles the kernel for `arch` (e.g. "compute_90"), or for NVRTC's default target when None.
pub fn compile_stripe_kernel(arch: Option<&str>) -> Result<cudarc::nvrtc::Ptx, GpuError> {
    compile_kernel("stripe.cu", STRIPE_KERNEL_SOURCE, arch)
}

/// Compiles one kernel source with NVRTC for `arch`, or NVRTC's default target when None.
pub fn compile_kernel(
    name: &str,
    source: &str,
    arch: Option<&str>,
) -> Result<cudarc::nvrtc::Ptx, GpuError> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::LoadNvrtc);
    }
    let mut options = cudarc::nvrtc::CompileOptions {
        name: Some(name.into()),
        ..Default::default()
    };
    if let Some(arch) = arch {
        options.options.push(format!("--gpu-architecture={arch}"));
    }
    options.options.push("--std=c++17".into());
    catch_panic(|| {
        cudarc::nvrtc::compile_ptx_with_opts(source, options)
            .map_err(|e| GpuError::CompileKernel(compile_error_text(&e)))
    })
}

fn compile_error_text(error: &cudarc::nvrtc::CompileError) -> String {
    match error {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            format!("{nvrtc:?}: {}", log.to_string_lossy().trim())
        }
        other => format!("{other:?}"),
    }
}

/// Runs `f`, turning a panic inside cudarc (a missing driver symbol, say) into an error.
pub(crate) fn catch_panic<T>(f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(GpuError::Panicked(what))
        }
    }
}

impl Gpu {
    /// Opens device 0, compiles and loads the kernel, allocates the slots.
    pub fn open() -> Result<Gpu, GpuError> {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::LoadDriver);
        }
        let ctx = CudaContext::new(0).map_err(GpuError::InitDriver)?;
        let device_name = ctx.name().map_err(GpuError::InitDriver)?;
        let (major, minor) = ctx.compute_capability().map_err(GpuError::InitDriver)?;
        let ptx = compile_stripe_kernel(Some(&format!("compute_{major}{minor}")))?;
        let module = ctx.load_module(ptx).map_err(GpuError::LoadModule)?;
        let func = module
            .load_function(STRIPE_KERNEL_NAME)
            .map_err(GpuError::LoadModule)?;
        let in_place_func = module
            .load_function(IN_PLACE_KERNEL_NAME)
            .map_err(GpuError::LoadModule)?;
        let in_place = Arc::new(Lanes::new(&ctx, &in_place_func)?);
        let mut slots = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            slots.push(Slot {
                stream: ctx.new_stream().map_err(GpuError::CreateStream)?,
                host_plan: PinnedBuf::new(&ctx, std::mem::size_of::<Plan>())?,
                dev_plan: DeviceBuf::new(&ctx, std::mem::size_of::<Plan>())?,
                host_in: PinnedBuf::new(&ctx, SLOT_BYTES)?,
                host_out: PinnedBuf::new(&ctx, SLOT_BYTES)?,
                host_bad: PinnedBuf::new(&ctx, MAX_STRIPES_PER_SLOT * 4)?,
                dev_in: DeviceBuf::new(&ctx, SLOT_BYTES)?,
                dev_out: DeviceBuf::new(&ctx, SLOT_BYTES)?,
                dev_bad: DeviceBuf::new(&ctx, MAX_STRIPES_PER_SLOT * 4)?,
            });
        }
        Ok(Gpu {
            slots,
            in_place,
            func,
            _module: module,
            ctx,
            device_name: format!("{device_name} (sm_{major}{minor})"),
        })
    }

    /// How many stripes of `job` one slot holds; zero if a single stripe is too big.
    pub fn stripes_per_slot(job: &Job) -> usize {
        let by_in = SLOT_BYTES / job.in_row_bytes().max(1);
        let by_out = SLOT_BYTES / job.out_row_bytes().max(1);
        by_in.min(by_out).min(MAX_STRIPES_PER_SLOT)
    }

    /// Queues the copy of `plan` into the slot's device plan buffer.
    fn upload_plan(slot: &mut Slot, plan: &Plan) -> Result<(), GpuError> {
        let bytes = plan.as_bytes();
        // SAFETY: the slot's stream was synchronized (or never used), so no copy reads host_plan.
        let host_plan = unsafe { slot.host_plan.slice_mut(bytes.len()) };
        host_plan.copy_from_slice(bytes);
        // SAFETY: both buffers are size_of::<Plan>() bytes; host_plan is pinned and left alone
        // until the stream is synchronized.
        unsafe {
            result::memcpy_htod_async(slot.dev_plan.ptr, &*host_plan, slot.stream.cu_stream())
        }
        .map_err(GpuError::CopyToDevice)
    }

    fn launch(&self, slot: &Slot, plan: &Plan, stripes: usize) -> Result<(), GpuError> {
        let region = Region {
            plan: slot.dev_plan.ptr,
            input: slot.dev_in.ptr,
            output: slot.dev_out.ptr,
            bad: slot.dev_bad.ptr,
        };
        // SAFETY: dev_plan holds `plan` (queued earlier on this stream) and the slot's buffers
        // hold `stripes` rows of input, output and flags (stripes <= stripes_per_slot).
        unsafe { self.launch_on(&slot.stream, region, plan, stripes) }
    }

    /// SAFETY: `region.plan` holds `plan` (or will, by stream order) and the other buffers hold
    /// `stripes` input rows, output rows and 4-byte flags of `plan`'s geometry.
    unsafe fn launch_on(
        &self,
        stream: &CudaStream,
        region: Region,
        plan: &Plan,
        stripes: usize,
    ) -> Result<(), GpuError> {
        let blocks_x = (plan.pitch_words as u32).div_ceil(THREADS_PER_BLOCK);
        let config = LaunchConfig {
            grid_dim: (blocks_x.max(1), stripes as u32, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let stripes = stripes as i32;
        let mut builder = stream.launch_builder(&self.func);
        builder
            .arg(&region.plan)
            .arg(&region.input)
            .arg(&region.output)
            .arg(&region.bad)
            .arg(&stripes);
        // SAFETY: the caller vouches for the buffers; arguments match the kernel's signature.
        unsafe { builder.launch(config) }.map_err(GpuError::Launch)?;
        Ok(())
    }

    /// Runs `job` over `stripes` stripes. With `io` None the pinned buffers are used as they are
    /// (benchmarks of the copies and kernel alone).
    pub fn run(
        &mut self,
        job: &Job,
        stripes: usize,
        mut io: Option<&mut dyn StripeIo>,
    ) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::InitDriver)?;
        let per_slot = Self::stripes_per_slot(job);
        if per_slot == 0 {
            return Err(GpuError::StripeTooLarge {
                bytes: job.in_row_bytes(),
            });
        }
        let result = self.run_slots(job, stripes, per_slot, &mut io);
        if result.is_err() {
            // Leave no copy running into our buffers before anyone reuses them.
            for slot in &self.slots {
                let _ = slot.stream.synchronize();
            }
        }
        result
    }

    fn run_slots(
        &mut self,
        job: &Job,
        stripes: usize,
        per_slot: usize,
        io: &mut Option<&mut dyn StripeIo>,
    ) -> Result<(), GpuError> {
        let sub_batches = stripes.div_ceil(per_slot);
        let mut pending: [Option<std::ops::Range<usize>>; SLOTS] = Default::default();
        for sub in 0..sub_batches {
            let s = sub % SLOTS;
            if let Some(done) = pending[s].take() {
                self.finish(s, job, done, io)?;
            }
            let range = sub * per_slot..((sub + 1) * per_slot).min(stripes);
            self.start(s, job, range.clone(), io)?;
            pending[s] = Some(range);
        }
        // Drain in submission order.
        for sub in sub_batches.saturating_sub(SLOTS)..sub_batches {
            let s = sub % SLOTS;
            if let Some(done) = pending[s].take() {
                self.finish(s, job, done, io)?;
            }
        }
        Ok(())
    }

    fn start(
        &mut self,
        s: usize,
        job: &Job,
        range: std::ops::Range<usize>,
        io: &mut Option<&mut dyn StripeIo>,
    ) -> Result<(), GpuError> {
        let n = range.len();
        let in_row = job.in_row_bytes();
        let pitch = job.pitch_bytes();
        let len = job.chunk_bytes;
        let is_check = job.plan.flags & super::plan::FLAG_CHECK != 0;
        let slot = &mut self.slots[s];
        Self::upload_plan(slot, &job.plan)?;
        // SAFETY: this slot's stream was synchronized in finish() (or never used), so no copy
        // reads the buffer while the CPU fills it.
        let host_in = unsafe { slot.host_in.slice_mut(n * in_row) };
        if let Some(io) = io.as_deref() {
            for (row, stripe) in host_in.chunks_exact_mut(in_row).zip(range.clone()) {
                for (dst, index) in row.chunks_exact_mut(pitch).zip(job.input_indices()) {
                    let src = io.input(stripe, index);
                    debug_assert_eq!(src.len(), len);
                    dst[..len].copy_from_slice(src);
                    // Padding is zero so it can never raise a check flag.
                    dst[len..].fill(0);
                }
            }
        }
        debug_assert!(
            n * in_row <= slot.dev_in.bytes && n * job.out_row_bytes() <= slot.dev_out.bytes
        );
        debug_assert!(n * 4 <= slot.dev_bad.bytes);
        let stream = slot.stream.cu_stream();
        // SAFETY: sizes are within the slot's allocations (n <= stripes_per_slot); the host
        // buffers are pinned and stay alive and untouched by the CPU until finish() syncs.
        unsafe {
            result::memcpy_htod_async(slot.dev_in.ptr, &*host_in, stream)
                .map_err(GpuError::CopyToDevice)?;
            if is_check {
                result::memset_d8_async(slot.dev_bad.ptr, 0, n * 4, stream)
                    .map_err(GpuError::CopyToDevice)?;
            }
        }
        let slot = &self.slots[s];
        self.launch(slot, &job.plan, n)?;
        let slot = &mut self.slots[s];
        // SAFETY: as above.
        unsafe {
            if is_check {
                let host_bad = slot.host_bad.slice_mut(n * 4);
                result::memcpy_dtoh_async(host_bad, slot.dev_bad.ptr, stream)
                    .map_err(GpuError::CopyToHost)?;
            } else if job.out_row_bytes() > 0 {
                let host_out = slot.host_out.slice_mut(n * job.out_row_bytes());
                result::memcpy_dtoh_async(host_out, slot.dev_out.ptr, stream)
                    .map_err(GpuError::CopyToHost)?;
            }
        }
        Ok(())
    }

    fn finish(
        &mut self,
        s: usize,
        job: &Job,
        range: std::ops::Range<usize>,
        io: &mut Option<&mut dyn StripeIo>,
    ) -> Result<(), GpuError> {
        let slot = &mut self.slots[s];
        slot.stream.synchronize().map_err(GpuError::Synchronize)?;
        let Some(io) = io.as_deref_mut() else {
            return Ok(());
        };
        let n = range.len();
        let len = job.chunk_bytes;
        if job.plan.flags & super::plan::FLAG_CHECK != 0 {
            // SAFETY: the stream is synchronized: the copy into host_bad is complete.
            let host_bad = unsafe { slot.host_bad.slice_mut(n * 4) };
            for (flag, stripe) in host_bad.chunks_exact(4).zip(range) {
                io.flag(stripe, flag != [0, 0, 0, 0]);
            }
            return Ok(());
        }
        let out_row = job.out_row_bytes();
        if out_row == 0 {
            return Ok(());
        }
        // SAFETY: as above.
        let host_out = unsafe { slot.host_out.slice_mut(n * out_row) };
        for (row, stripe) in host_out.chunks_exact(out_row).zip(range) {
            for (src, index) in row
                .chunks_exact(job.pitch_bytes())
                .zip(job.output_indices())
            {
                io.output(stripe, index).copy_from_slice(&src[..len]);
            }
        }
        Ok(())
    }

    /// Kernel alone on data already in device memory (about BENCH_BYTES of stripes per launch):
    /// GB/s of stripe data (k chunks per stripe).
    pub fn bench_kernel(&mut self, job: &Job, seconds: f64) -> Result<f64, GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::InitDriver)?;
        let in_row = job.in_row_bytes().max(1);
        let n = (BENCH_BYTES / in_row).min(MAX_STRIPES_PER_SLOT);
        if n == 0 {
            return Err(GpuError::StripeTooLarge { bytes: in_row });
        }
        let input = DeviceBuf::new(&self.ctx, n * in_row)?;
        let output = DeviceBuf::new(&self.ctx, (n * job.out_row_bytes()).max(WORD_BYTES))?;
        let bad = DeviceBuf::new(&self.ctx, n * 4)?;
        Self::upload_plan(&mut self.slots[0], &job.plan)?;
        let slot = &self.slots[0];
        let region = Region {
            plan: slot.dev_plan.ptr,
            input: input.ptr,
            output: output.ptr,
            bad: bad.ptr,
        };
        let data_bytes = n * job.plan.k as usize * job.chunk_bytes;
        let result = timed(
            seconds,
            data_bytes,
            // SAFETY: the plan was queued on this stream; the buffers hold n rows of the job.
            || unsafe { self.launch_on(&slot.stream, region, &job.plan, n) },
            || slot.stream.synchronize().map_err(GpuError::Synchronize),
        );
        // The buffers are freed on return: nothing may still be running into them.
        slot.stream.synchronize().map_err(GpuError::Synchronize)?;
        result
    }

    /// Device-to-device copy of BENCH_BYTES: GB/s copied.
    pub fn bench_device_memcpy(&mut self, seconds: f64) -> Result<f64, GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::InitDriver)?;
        let from = DeviceBuf::new(&self.ctx, BENCH_BYTES)?;
        let to = DeviceBuf::new(&self.ctx, BENCH_BYTES)?;
        let slot = &self.slots[0];
        let stream = slot.stream.cu_stream();
        let result = timed(
            seconds,
            BENCH_BYTES,
            // SAFETY: both device buffers are BENCH_BYTES long.
            || {
                unsafe { result::memcpy_dtod_async(to.ptr, from.ptr, BENCH_BYTES, stream) }
                    .map_err(GpuError::CopyToDevice)
            },
            || slot.stream.synchronize().map_err(GpuError::Synchronize),
        );
        slot.stream.synchronize().map_err(GpuError::Synchronize)?;
        result
    }

    /// Pinned host to device copy of one slot: GB/s copied.
    pub fn bench_pinned_to_device(&mut self, seconds: f64) -> Result<f64, GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::InitDriver)?;
        let slot = &mut self.slots[0];
        let stream = slot.stream.cu_stream();
        let dev_in = slot.dev_in.ptr;
        // SAFETY: nothing else uses this slot during the benchmark.
        let host_in: &[u8] = unsafe { slot.host_in.slice_mut(SLOT_BYTES) };
        let stream_ref = slot.stream.clone();
        timed(
            seconds,
            SLOT_BYTES,
            // SAFETY: SLOT_BYTES of pinned memory into SLOT_BYTES of device memory.
            || {
                unsafe { result::memcpy_htod_async(dev_in, host_in, stream) }
                    .map_err(GpuError::CopyToDevice)
            },
            || stream_ref.synchronize().map_err(GpuError::Synchronize),
        )
    }

    /// The whole pipeline from pinned buffers to pinned buffers (no gather or scatter):
    /// GB/s of stripe data.
    pub fn bench_pinned_roundtrip(
        &mut self,
        job: &Job,
        stripes: usize,
        seconds: f64,
    ) -> Result<f64, GpuError> {
        let data_bytes = stripes * job.plan.k as usize * job.chunk_bytes;
        let start = Instant::now();
        let mut rounds = 0u64;
        while start.elapsed() < Duration::from_secs_f64(seconds) || rounds == 0 {
            self.run(job, stripes, None)?;
            rounds += 1;
        }
        Ok(rounds as f64 * data_bytes as f64 / start.elapsed().as_secs_f64() / 1e9)
    }
}

/// Queues `step` repeatedly for about `seconds`, waiting with `sync` every few steps so the queue
/// stays short; returns GB/s for `bytes` per step.
fn timed(
    seconds: f64,
    bytes: usize,
    mut step: impl FnMut() -> Result<(), GpuError>,
    mut sync: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    step()?;
    sync()?;
    let start = Instant::now();
    let mut steps = 0u64;
    while start.elapsed() < Duration::from_secs_f64(seconds) || steps == 0 {
        for _ in 0..8 {
            step()?;
        }
        sync()?;
        steps += 8;
    }
    Ok(steps as f64 * bytes as f64 / start.elapsed().as_secs_f64() / 1e9)
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            for slot in &self.slots {
                let _ = slot.stream.synchronize();
            }
        }
    }
}
