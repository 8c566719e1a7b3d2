//! The CUDA backend: kernels in `.cu` files compiled at run time by NVRTC and launched through
//! cudarc with dynamic loading, so this crate builds and runs where no CUDA exists.
//!
//! No driver, no GPU, a kernel that fails to compile, load or run, or a self-test mismatch: the
//! GPU is switched off with one logged warning and the work is done by the CPU backend. Never a
//! panic, never wrong output.

mod device;
mod in_place;
pub(crate) mod plan;
mod wait;

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::DriverError;

use crate::stripe::{assert_gen_geometry, validate_recover, Erasures};
use crate::{Backend, BatchCounts, CheckOutcome, HostBuf, ParityError, StripeGen, StripeRecover};
use device::{Gpu, StripeIo};
use plan::Job;

pub use device::{
    compile_kernel, compile_stripe_kernel, KERNEL_SOURCES, STRIPE_KERNEL_NAME, STRIPE_KERNEL_SOURCE,
};
pub use in_place::IN_PLACE_KERNEL_NAME;

/// Why the GPU could not be used, named after the action that failed.
#[derive(Debug, Clone)]
pub enum GpuError {
    /// libcuda could not be opened: no NVIDIA driver.
    LoadDriver,
    /// libnvrtc could not be opened (install the `nvidia-cuda-nvrtc` wheel, see scripts/nvrtc-path.sh).
    LoadNvrtc,
    InitDriver(DriverError),
    CompileKernel(String),
    LoadModule(DriverError),
    AllocatePinned(DriverError),
    AllocateDevice(DriverError),
    CreateStream(DriverError),
    CopyToDevice(DriverError),
    Launch(DriverError),
    CopyToHost(DriverError),
    Synchronize(DriverError),
    /// One stripe does not fit a pipeline slot.
    StripeTooLarge {
        bytes: usize,
    },
    /// The start-up self-test got different bytes from the GPU than from the CPU.
    SelfTest {
        op: &'static str,
    },
    /// cudarc panicked (a symbol missing from an old driver, say).
    Panicked(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::LoadDriver => write!(f, "no CUDA driver: libcuda could not be loaded"),
            GpuError::LoadNvrtc => write!(f, "no NVRTC: libnvrtc could not be loaded"),
            GpuError::InitDriver(e) => write!(f, "initialise CUDA device 0: {e}"),
            GpuError::CompileKernel(log) => {
                write!(f, "compile the parity kernel with NVRTC: {log}")
            }
            GpuError::LoadModule(e) => write!(f, "load the parity kernel: {e}"),
            GpuError::AllocatePinned(e) => write!(f, "allocate pinned host memory: {e}"),
            GpuError::AllocateDevice(e) => write!(f, "allocate device memory: {e}"),
            GpuError::CreateStream(e) => write!(f, "create a CUDA stream: {e}"),
            GpuError::CopyToDevice(e) => write!(f, "copy to the GPU: {e}"),
            GpuError::Launch(e) => write!(f, "launch the parity kernel: {e}"),
            GpuError::CopyToHost(e) => write!(f, "copy from the GPU: {e}"),
            GpuError::Synchronize(e) => write!(f, "wait for the GPU: {e}"),
            GpuError::StripeTooLarge { bytes } => write!(
                f,
                "a stripe of {bytes} bytes does not fit a {} byte GPU slot",
                device::SLOT_BYTES
            ),
            GpuError::SelfTest { op } => write!(f, "GPU self-test: {op} differs from the CPU"),
            GpuError::Panicked(what) => write!(f, "CUDA library panicked: {what}"),
        }
    }
}

impl std::error::Error for GpuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GpuError::InitDriver(e)
            | GpuError::LoadModule(e)
            | GpuError::AllocatePinned(e)
            | GpuError::AllocateDevice(e)
            | GpuError::CreateStream(e)
            | GpuError::CopyToDevice(e)
            | GpuError::Launch(e)
            | GpuError::CopyToHost(e)
            | GpuError::Synchronize(e) => Some(e),
            _ => None,
        }
    }
}

/// Whether libcuda can be loaded at all (no device is opened).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The process's one GPU (device 0), opened and self-tested on first use; the error if that failed.
fn shared_gpu() -> Result<Arc<Mutex<Gpu>>, GpuError> {
    static GPU: OnceLock<Result<Arc<Mutex<Gpu>>, GpuError>> = OnceLock::new();
    GPU.get_or_init(|| {
        let mut gpu = device::catch_panic(Gpu::open)?;
        device::catch_panic(|| self_test(&mut gpu))?;
        log::info!(
            "parity: GPU {} ready (NVRTC-compiled kernel, {} pipeline slots)",
            gpu.device_name,
            device::SLOTS
        );
        Ok(Arc::new(Mutex::new(gpu)))
    })
    .clone()
}

/// When the backend sends a batch to the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuPolicy {
    /// Every stripe operation except `update` (`--parity-backend gpu`).
    Always,
    /// Batches of at least `min_batch_bytes` of stripe data (`--parity-backend auto`), and batches served in
    /// place (every chunk in a buffer from [`Backend::alloc_host`]) of at least `in_place_min_batch_bytes`.
    FromBytes {
        min_batch_bytes: usize,
        in_place_min_batch_bytes: usize,
    },
}

/// The GPU backend, with a CPU backend for what the GPU does not do and for fallback.
pub struct CudaBackend {
    cpu: Arc<dyn Backend>,
    gpu: Mutex<Option<Arc<Mutex<Gpu>>>>,
    /// The GPU's in-place path, taken once here: its batches and registrations never need the Gpu's lock,
    /// which a batch through the slots holds for as long as it runs.
    lanes: Arc<in_place::Lanes>,
    policy: GpuPolicy,
    device_name: String,
    batches_gpu: std::sync::atomic::AtomicU64,
    batches_cpu: std::sync::atomic::AtomicU64,
    /// Of batches_gpu, those served in place (no staging copy).
    batches_in_place: std::sync::atomic::AtomicU64,
}

impl CudaBackend {
    /// Opens the GPU (once per process). Errors say why there is no GPU; the caller falls back.
    pub fn new(cpu: Arc<dyn Backend>, policy: GpuPolicy) -> Result<CudaBackend, GpuError> {
        let gpu = shared_gpu()?;
        let (device_name, lanes) = match gpu.lock() {
            Ok(g) => (g.device_name.clone(), g.in_place.clone()),
            Err(poisoned) => ("GPU".into(), poisoned.into_inner().in_place.clone()),
        };
        Ok(CudaBackend {
            cpu,
            gpu: Mutex::new(Some(gpu)),
            lanes,
            policy,
            device_name,
            batches_gpu: Default::default(),
            batches_cpu: Default::default(),
            batches_in_place: Default::default(),
        })
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn policy(&self) -> GpuPolicy {
        self.policy
    }

    /// Whether the GPU is still in use (false after a failure switched it off).
    pub fn gpu_enabled(&self) -> bool {
        self.gpu.lock().map(|g| g.is_some()).unwrap_or(false)
    }

    /// Batches run so far: (on the GPU, on the CPU).
    pub fn batches(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.batches_gpu.load(Relaxed),
            self.batches_cpu.load(Relaxed),
        )
    }

    /// Of the batches run on the GPU, how many were served in place (chunks read and written where they lie).
    pub fn batches_in_place(&self) -> u64 {
        self.batches_in_place
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn wants_gpu(&self, batch_bytes: usize) -> bool {
        match self.policy {
            GpuPolicy::Always => true,
            GpuPolicy::FromBytes {
                min_batch_bytes, ..
            } => batch_bytes >= min_batch_bytes,
        }
    }

    fn wants_in_place(&self, batch_bytes: usize) -> bool {
        match self.policy {
            GpuPolicy::Always => true,
            GpuPolicy::FromBytes {
                in_place_min_batch_bytes,
                ..
            } => batch_bytes >= in_place_min_batch_bytes,
        }
    }

    /// The GPU while it is on.
    fn live_gpu(&self) -> Option<Arc<Mutex<Gpu>>> {
        self.gpu.lock().ok().and_then(|g| g.clone())
    }

    /// Switches the GPU off for good after a failure (logged once per backend).
    fn switch_off(&self, e: GpuError) {
        log::warn!(
            "parity: GPU failed ({e}); switching to CPU backend {} for good",
            self.cpu.name()
        );
        if let Ok(mut guard) = self.gpu.lock() {
            *guard = None;
        }
    }

    /// Runs the batch in place, stripe `s` with `jobs[job_of(s)]`, when every chunk of it lies in registered host
    /// memory. False: not all of it does (the GPU stays on), or the GPU failed (switched off); the caller goes on
    /// another way.
    fn try_in_place(
        &self,
        jobs: &[Job],
        job_of: &dyn Fn(usize) -> usize,
        stripes: usize,
        io: &mut dyn StripeIo,
    ) -> bool {
        if self.live_gpu().is_none() {
            return false;
        }
        // The lanes run outside the Gpu's lock, so that batches from several threads overlap.
        // SAFETY: the batch's chunks are borrowed by `io`, alive and untouched by anyone else until this returns.
        let result =
            device::catch_panic(|| unsafe { self.lanes.run_batch(jobs, job_of, stripes, io) });
        match result {
            Ok(done) => {
                if done {
                    use std::sync::atomic::Ordering::Relaxed;
                    self.batches_gpu.fetch_add(1, Relaxed);
                    self.batches_in_place.fetch_add(1, Relaxed);
                }
                done
            }
            Err(e) => {
                self.switch_off(e);
                false
            }
        }
    }

    /// A batch of `batch_bytes` of stripe data on the GPU if the policy wants it there: in place when its
    /// chunks allow, else through the slots. False: the caller does it on the CPU.
    fn try_gpu_batch(
        &self,
        batch_bytes: usize,
        chunk_bytes: usize,
        make: impl Fn(usize) -> Job,
        stripes: usize,
        io: &mut dyn StripeIo,
    ) -> bool {
        if self.wants_in_place(batch_bytes)
            && self.try_in_place(&[make(chunk_bytes)], &|_| 0, stripes, io)
        {
            return true;
        }
        self.wants_gpu(batch_bytes) && self.try_gpu(chunk_bytes, make, stripes, io)
    }

    /// Runs the job that `make` builds for `chunk_bytes` on the GPU over `stripes` stripes, each cut into
    /// column slices when it is too large for a slot. Returns false when the caller must do the batch on the
    /// CPU: no cut fits (the GPU stays on), or the GPU failed (it is switched off, logged once).
    fn try_gpu(
        &self,
        chunk_bytes: usize,
        make: impl Fn(usize) -> Job,
        stripes: usize,
        io: &mut dyn StripeIo,
    ) -> bool {
        let Some((job, parts)) = column_cut(chunk_bytes, make) else {
            log::debug!("parity: a stripe of {chunk_bytes}-byte chunks cannot be cut to fit a GPU slot: CPU");
            return false;
        };
        if parts == 1 {
            return self.run_on_gpu(&job, stripes, io);
        }
        let mut columns = Columns {
            inner: io,
            parts,
            part_bytes: chunk_bytes / parts,
            bad_so_far: false,
            flagged: 0,
        };
        self.run_on_gpu(&job, stripes * parts, &mut columns)
    }

    /// Runs `job` on the GPU; on any failure switches the GPU off (logged once) and returns false
    /// so the caller redoes the whole batch on the CPU.
    fn run_on_gpu(&self, job: &Job, stripes: usize, io: &mut dyn StripeIo) -> bool {
        let Some(gpu) = self.live_gpu() else {
            return false;
        };
        let result = device::catch_panic(|| match gpu.lock() {
            Ok(mut gpu) => gpu.run(job, stripes, Some(io)),
            Err(_) => Err(GpuError::Panicked(
                "GPU state poisoned by an earlier panic".into(),
            )),
        });
        match result {
            Ok(()) => {
                self.batches_gpu
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.switch_off(e);
                false
            }
        }
    }

    fn count_cpu(&self) {
        self.batches_cpu
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Benchmarks of the device alone (see bench/parity): gen and 2-data recover kernel GB/s on
    /// device-resident data, device memcpy GB/s, pinned host-to-device GB/s, and pinned-to-pinned pipeline GB/s.
    pub fn bench_device(
        &self,
        k: usize,
        chunk_bytes: usize,
        stripes: usize,
        seconds: f64,
    ) -> Result<DeviceFigures, GpuError> {
        let gpu = self
            .gpu
            .lock()
            .ok()
            .and_then(|g| g.clone())
            .ok_or(GpuError::LoadDriver)?;
        let mut gpu = gpu
            .lock()
            .map_err(|_| GpuError::Panicked("GPU state poisoned".into()))?;
        let job = Job::gen(k, true, chunk_bytes);
        // The pinned round trip goes through the slots, so a stripe too large for one is cut as a batch is.
        let (slot_job, parts) = column_cut(chunk_bytes, |bytes| Job::gen(k, true, bytes)).ok_or(
            GpuError::StripeTooLarge {
                bytes: job.in_row_bytes(),
            },
        )?;
        // Two data chunks lost (data 0 and the last): the hardest recovery, loading P and Q.
        let recover = (k >= 2).then(|| {
            let lost_data = Erasures {
                k,
                count: 2,
                index: [0, k - 1],
            };
            Job::recover(k, true, &lost_data, chunk_bytes)
        });
        device::catch_panic(|| {
            Ok(DeviceFigures {
                kernel_gbps: gpu.bench_kernel(&job, seconds)?,
                recover_kernel_gbps: match &recover {
                    Some(job) => Some(gpu.bench_kernel(job, seconds)?),
                    None => None,
                },
                device_memcpy_gbps: gpu.bench_device_memcpy(seconds)?,
                pinned_roundtrip_gbps: gpu.bench_pinned_roundtrip(
                    &slot_job,
                    stripes * parts,
                    seconds,
                )?,
                pinned_to_device_gbps: gpu.bench_pinned_to_device(seconds)?,
            })
        })
    }
}

/// What [`CudaBackend::bench_device`] measured.
#[derive(Debug, Clone, Copy)]
pub struct DeviceFigures {
    /// RAID6 gen on data already in device memory, GB/s of data.
    pub kernel_gbps: f64,
    /// RAID6 recovery of two data chunks on data already in device memory, GB/s of stripe data
    /// (None for k = 1, which has no two data chunks).
    pub recover_kernel_gbps: Option<f64>,
    /// cuMemcpyDtoD, GB/s copied.
    pub device_memcpy_gbps: f64,
    /// Pinned host → GPU → pinned host, copies and kernel overlapped, GB/s of data.
    pub pinned_roundtrip_gbps: f64,
    /// cuMemcpyHtoD from pinned memory, GB/s copied.
    pub pinned_to_device_gbps: f64,
}

// ---- Stripe I/O adapters: how each batched call's buffers look to the pipeline. ----

struct GenIo<'s, 'a> {
    stripes: &'s mut [StripeGen<'a>],
    k: usize,
}

impl StripeIo for GenIo<'_, '_> {
    fn input(&self, stripe: usize, index: usize) -> &[u8] {
        self.stripes[stripe].data[index]
    }

    fn output(&mut self, stripe: usize, index: usize) -> &mut [u8] {
        let stripe = &mut self.stripes[stripe];
        if index == self.k {
            &mut *stripe.p
        } else {
            stripe
                .q
                .as_deref_mut()
                .expect("a Q output only in RAID6 plans")
        }
    }

    fn flag(&mut self, _stripe: usize, _bad: bool) {}
}

struct RecoverIo<'s, 'a> {
    stripes: &'s mut [StripeRecover<'a>],
}

impl StripeIo for RecoverIo<'_, '_> {
    fn input(&self, stripe: usize, index: usize) -> &[u8] {
        &self.stripes[stripe].chunks[index][..]
    }

    fn output(&mut self, stripe: usize, index: usize) -> &mut [u8] {
        &mut self.stripes[stripe].chunks[index][..]
    }

    fn flag(&mut self, _stripe: usize, _bad: bool) {}
}

struct OneRecoverIo<'s, 'a> {
    chunks: &'s mut [&'a mut [u8]],
}

impl StripeIo for OneRecoverIo<'_, '_> {
    fn input(&self, _stripe: usize, index: usize) -> &[u8] {
        &self.chunks[index][..]
    }

    fn output(&mut self, _stripe: usize, index: usize) -> &mut [u8] {
        &mut self.chunks[index][..]
    }

    fn flag(&mut self, _stripe: usize, _bad: bool) {}
}

struct CheckIo<'s, 'a> {
    stripes: &'s [&'a [&'a [u8]]],
    bad: &'s mut [CheckOutcome],
}

impl StripeIo for CheckIo<'_, '_> {
    fn input(&self, stripe: usize, index: usize) -> &[u8] {
        self.stripes[stripe][index]
    }

    fn output(&mut self, _stripe: usize, _index: usize) -> &mut [u8] {
        unreachable!("check plans have no outputs")
    }

    fn flag(&mut self, stripe: usize, bad: bool) {
        // Mismatch marks "look closer"; the CPU names the bad chunk afterwards.
        self.bad[stripe] = if bad {
            CheckOutcome::Mismatch
        } else {
            CheckOutcome::Consistent
        };
    }
}

/// A batch whose stripes are too large for one GPU slot, seen as `parts` times as many stripes: virtual
/// stripe `s` is column slice `s % parts` (of `part_bytes`) of every chunk of stripe `s / parts`. The
/// arithmetic is bytewise, so each slice is a stripe of its own; a stripe is flagged bad if any slice is.
struct Columns<'s> {
    inner: &'s mut dyn StripeIo,
    parts: usize,
    part_bytes: usize,
    /// Whether an earlier slice of the stripe now being flagged was bad: flags arrive in stripe order (the
    /// pipeline finishes its sub-batches in order), which `flagged` checks.
    bad_so_far: bool,
    flagged: usize,
}

impl StripeIo for Columns<'_> {
    fn input(&self, stripe: usize, index: usize) -> &[u8] {
        let at = (stripe % self.parts) * self.part_bytes;
        &self.inner.input(stripe / self.parts, index)[at..at + self.part_bytes]
    }

    fn output(&mut self, stripe: usize, index: usize) -> &mut [u8] {
        let at = (stripe % self.parts) * self.part_bytes;
        &mut self.inner.output(stripe / self.parts, index)[at..at + self.part_bytes]
    }

    fn flag(&mut self, stripe: usize, bad: bool) {
        debug_assert_eq!(stripe, self.flagged, "column slices flagged out of order");
        self.flagged += 1;
        self.bad_so_far |= bad;
        if stripe % self.parts == self.parts - 1 {
            self.inner.flag(stripe / self.parts, self.bad_so_far);
            self.bad_so_far = false;
        }
    }
}

/// Most column slices one stripe is cut into; a stripe needing more goes to the CPU.
const MAX_COLUMN_PARTS: usize = 4096;

/// The job for stripes of `chunk_bytes` chunks (`make` builds a job for a chunk length) and how many column
/// slices each stripe is cut into so that one slice fits a GPU slot: 1 when the stripe fits whole. None when
/// no equal cut of at most MAX_COLUMN_PARTS fits.
fn column_cut(chunk_bytes: usize, make: impl Fn(usize) -> Job) -> Option<(Job, usize)> {
    (1..=chunk_bytes.min(MAX_COLUMN_PARTS))
        .filter(|parts| chunk_bytes.is_multiple_of(*parts))
        .map(|parts| (make(chunk_bytes / parts), parts))
        .find(|(job, _)| Gpu::stripes_per_slot(job) > 0)
}

/// One recovery job per kind of loss among `shapes` (its erasures, and whether the stripe brings Q), and each
/// stripe's job; None beyond `in_place::MAX_PLANS` kinds (one launch takes no more).
fn recovery_jobs(
    k: usize,
    chunk_bytes: usize,
    shapes: &[(Erasures, usize, bool)],
) -> Option<(Vec<Job>, Vec<usize>)> {
    let mut kinds: Vec<(Erasures, bool)> = Vec::new();
    let mut job_of: Vec<usize> = Vec::with_capacity(shapes.len());
    for &(erasures, _, has_q) in shapes {
        let index = match kinds.iter().position(|kind| *kind == (erasures, has_q)) {
            Some(index) => index,
            None if kinds.len() == in_place::MAX_PLANS => return None,
            None => {
                kinds.push((erasures, has_q));
                kinds.len() - 1
            }
        };
        job_of.push(index);
    }
    let jobs = kinds
        .iter()
        .map(|(erasures, has_q)| Job::recover(k, *has_q, erasures, chunk_bytes))
        .collect();
    Some((jobs, job_of))
}

fn bytes_or_never(bytes: usize) -> String {
    if bytes == usize::MAX {
        "never (the CPU is faster here)".to_string()
    } else {
        format!("{bytes} data bytes")
    }
}

/// A single stripe's `StripeGen` from the single-stripe call's arguments.
fn one_gen<'a>(
    data: &'a [&'a [u8]],
    p: &'a mut [u8],
    q: Option<&'a mut [u8]>,
) -> [StripeGen<'a>; 1] {
    [StripeGen { data, p, q }]
}

impl CudaBackend {
    /// Groups of consecutive stripes with the same shape.
    fn runs<T: PartialEq>(shapes: &[T]) -> Vec<std::ops::Range<usize>> {
        let mut runs = Vec::new();
        let mut start = 0;
        while start < shapes.len() {
            let mut end = start + 1;
            while end < shapes.len() && shapes[end] == shapes[start] {
                end += 1;
            }
            runs.push(start..end);
            start = end;
        }
        runs
    }

    fn gen_run(&self, stripes: &mut [StripeGen<'_>]) {
        let k = stripes[0].data.len();
        let has_q = stripes[0].q.is_some();
        let chunk_bytes = stripes[0].p.len();
        for stripe in stripes.iter() {
            assert_gen_geometry(stripe.data, stripe.p.len(), has_q);
            if let Some(q) = stripe.q.as_deref() {
                assert_eq!(q.len(), chunk_bytes, "parity: P and Q differ in length");
            }
        }
        let batch_bytes = stripes.len() * k * chunk_bytes;
        if chunk_bytes > 0 && plan::fits(k) {
            let make = |bytes| Job::gen(k, has_q, bytes);
            let n = stripes.len();
            let io = &mut GenIo { stripes, k };
            if self.try_gpu_batch(batch_bytes, chunk_bytes, make, n, io) {
                return;
            }
        }
        self.count_cpu();
        self.cpu.gen_batch(stripes);
    }

    fn recover_run(&self, stripes: &mut [StripeRecover<'_>], erasures: &Erasures) {
        let k = erasures.k;
        let has_q = stripes[0].has_q;
        let chunk_bytes = stripes[0].chunks[0].len();
        let batch_bytes = stripes.len() * k * chunk_bytes;
        if chunk_bytes > 0 && erasures.count > 0 && plan::fits(k) {
            let make = |bytes| Job::recover(k, has_q, erasures, bytes);
            let n = stripes.len();
            let io = &mut RecoverIo { stripes };
            if self.try_gpu_batch(batch_bytes, chunk_bytes, make, n, io) {
                return;
            }
        }
        self.count_cpu();
        for stripe in stripes.iter_mut() {
            let result = self
                .cpu
                .recover(stripe.chunks, stripe.has_q, stripe.missing);
            debug_assert!(result.is_ok(), "stripes were validated before the run");
        }
    }

    /// Recovers every stripe of the batch in one go in place, each with its own erasures, when the batch is large
    /// enough, all of it lies in registered memory, and the stripes differ only in what they lost and whether they
    /// bring Q (at most MAX_PLANS ways: a RAID6 rebuild recovers the rows whose Q it did not read from the data
    /// and P alone). False: nothing was done.
    fn recover_in_place(
        &self,
        stripes: &mut [StripeRecover<'_>],
        shapes: &[(Erasures, usize, bool)],
    ) -> bool {
        let Some(&(first, chunk_bytes, _)) = shapes.first() else {
            return false;
        };
        let batch_bytes = stripes.len() * first.k * chunk_bytes;
        if chunk_bytes == 0
            || !plan::fits(first.k)
            || !self.wants_in_place(batch_bytes)
            || shapes.iter().any(|(erasures, bytes, _)| {
                erasures.k != first.k || erasures.count == 0 || *bytes != chunk_bytes
            })
        {
            return false;
        }
        let Some((jobs, job_of)) = recovery_jobs(first.k, chunk_bytes, shapes) else {
            return false;
        };
        let n = stripes.len();
        self.try_in_place(&jobs, &|s| job_of[s], n, &mut RecoverIo { stripes })
    }

    fn check_run(&self, stripes: &[&[&[u8]]], has_q: bool, out: &mut [CheckOutcome]) {
        let parity_chunks = if has_q { 2 } else { 1 };
        let chunks = stripes[0].len();
        assert!(
            chunks > parity_chunks,
            "parity check: a stripe needs at least one data chunk"
        );
        let k = chunks - parity_chunks;
        let chunk_bytes = stripes[0][0].len();
        for stripe in stripes {
            assert_eq!(stripe.len(), chunks);
            assert_gen_geometry(&stripe[..k], chunk_bytes, has_q);
            assert!(
                stripe[k..].iter().all(|c| c.len() == chunk_bytes),
                "parity check: parity length differs"
            );
        }
        let batch_bytes = stripes.len() * k * chunk_bytes;
        if chunk_bytes > 0 && plan::fits(k) {
            let make = |bytes| Job::check(k, has_q, bytes);
            let io = &mut CheckIo { stripes, bad: out };
            if self.try_gpu_batch(batch_bytes, chunk_bytes, make, stripes.len(), io) {
                // The GPU flags; the CPU names the bad chunk of each flagged stripe.
                for (stripe, outcome) in stripes.iter().zip(out.iter_mut()) {
                    if *outcome != CheckOutcome::Consistent {
                        *outcome = self.cpu.check(stripe, has_q);
                    }
                }
                return;
            }
        }
        self.count_cpu();
        self.cpu.check_batch(stripes, has_q, out);
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        match self.policy {
            GpuPolicy::Always => "cuda",
            GpuPolicy::FromBytes { .. } => "auto",
        }
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        let mut batch = one_gen(data, p, None);
        self.gen_batch(&mut batch);
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        let mut batch = one_gen(data, p, Some(q));
        self.gen_batch(&mut batch);
    }

    fn update(&self, index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: Option<&mut [u8]>) {
        // One chunk's read-modify-write moves too little to pay for a transfer.
        self.cpu.update(index, old, new, p, q)
    }

    fn recover(
        &self,
        chunks: &mut [&mut [u8]],
        has_q: bool,
        missing: &[usize],
    ) -> Result<(), ParityError> {
        let erasures =
            validate_recover(chunks.iter().map(|c| c.len()), chunks.len(), has_q, missing)?;
        let chunk_bytes = chunks[0].len();
        if chunk_bytes > 0 && erasures.count > 0 && plan::fits(erasures.k) {
            let make = |bytes| Job::recover(erasures.k, has_q, &erasures, bytes);
            let io = &mut OneRecoverIo { chunks };
            if self.try_gpu_batch(erasures.k * chunk_bytes, chunk_bytes, make, 1, io) {
                return Ok(());
            }
        }
        self.count_cpu();
        self.cpu.recover(chunks, has_q, missing)
    }

    fn check(&self, chunks: &[&[u8]], has_q: bool) -> CheckOutcome {
        let mut out = [CheckOutcome::Consistent];
        self.check_batch(&[chunks], has_q, &mut out);
        out[0]
    }

    fn gen_batch(&self, stripes: &mut [StripeGen<'_>]) {
        if stripes.is_empty() {
            return;
        }
        let shapes: Vec<(usize, usize, bool)> = stripes
            .iter()
            .map(|s| (s.data.len(), s.p.len(), s.q.is_some()))
            .collect();
        let runs = Self::runs(&shapes);
        for run in runs {
            self.gen_run(&mut stripes[run]);
        }
    }

    fn recover_batch(&self, stripes: &mut [StripeRecover<'_>]) -> Result<(), ParityError> {
        // Validate everything first; recover the stripes before the first bad one, as the
        // single-stripe loop would, then report it.
        let mut shapes = Vec::with_capacity(stripes.len());
        let mut first_error = None;
        for stripe in stripes.iter() {
            match validate_recover(
                stripe.chunks.iter().map(|c| c.len()),
                stripe.chunks.len(),
                stripe.has_q,
                stripe.missing,
            ) {
                Ok(erasures) => shapes.push((erasures, stripe.chunks[0].len(), stripe.has_q)),
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            }
        }
        let valid = shapes.len();
        if self.recover_in_place(&mut stripes[..valid], &shapes) {
            return first_error.map_or(Ok(()), Err);
        }
        let runs = Self::runs(&shapes);
        for run in runs {
            let erasures = shapes[run.start].0;
            self.recover_run(&mut stripes[run], &erasures);
        }
        debug_assert!(first_error.is_none() || valid < stripes.len());
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn check_batch(&self, stripes: &[&[&[u8]]], has_q: bool, out: &mut [CheckOutcome]) {
        assert_eq!(
            stripes.len(),
            out.len(),
            "check_batch: one outcome per stripe"
        );
        if stripes.is_empty() {
            return;
        }
        let shapes: Vec<(usize, usize)> = stripes
            .iter()
            .map(|s| (s.len(), s.first().map_or(0, |c| c.len())))
            .collect();
        let runs = Self::runs(&shapes);
        for run in runs {
            self.check_run(&stripes[run.clone()], has_q, &mut out[run]);
        }
    }

    fn batch_counts(&self) -> Option<BatchCounts> {
        let (on_gpu, on_cpu) = self.batches();
        let in_place = self.batches_in_place();
        Some(BatchCounts {
            gpu_staged: on_gpu.saturating_sub(in_place),
            gpu_in_place: in_place,
            cpu: on_cpu,
        })
    }

    fn alloc_host(&self, bytes: usize) -> Option<HostBuf> {
        self.live_gpu()?;
        let mut buf = HostBuf::zeroed(bytes);
        let (host, len) = (buf.as_mut_ptr(), buf.len());
        let lanes = self.lanes.clone();
        // SAFETY: `buf` is a live allocation of `len` bytes; its release hook unregisters it before it is freed.
        let registered = device::catch_panic(|| unsafe { lanes.register(host, len) });
        match registered {
            Ok(_) => {
                buf.set_release(Box::new(move |host, _len| {
                    // SAFETY: registered above; the buffer is being dropped, so no batch uses it.
                    unsafe { lanes.unregister(host) };
                }));
                Some(buf)
            }
            Err(e) => {
                log::warn!("parity: {len} bytes of host memory could not be registered with the GPU ({e}): ordinary memory instead");
                None
            }
        }
    }

    fn describe(&self) -> String {
        let gpu = if self.gpu_enabled() {
            self.device_name.clone()
        } else {
            format!("{} (switched off after a failure)", self.device_name)
        };
        let policy = match self.policy {
            GpuPolicy::Always => "every batch".to_string(),
            GpuPolicy::FromBytes {
                min_batch_bytes,
                in_place_min_batch_bytes,
            } => format!(
                "batches from {}, batches in place from {}",
                bytes_or_never(min_batch_bytes),
                bytes_or_never(in_place_min_batch_bytes)
            ),
        };
        format!(
            "{}: GPU {gpu} for {policy}, CPU {} otherwise; batches so far: {} GPU ({} in place), {} CPU",
            self.name(),
            self.cpu.name(),
            self.batches_gpu.load(std::sync::atomic::Ordering::Relaxed),
            self.batches_in_place(),
            self.batches_cpu.load(std::sync::atomic::Ordering::Relaxed)
        )
    }
}

/// Start-up self-test: a gen, a double-data recovery and a check on the GPU, compared with the
/// reference. A GPU that gets any byte wrong is never used.
fn self_test(gpu: &mut Gpu) -> Result<(), GpuError> {
    use crate::reference::Reference;
    let (k, len, stripes) = (5usize, 4096 + 48 + 5, 3usize);
    let mut seed = 0x5eed_u64;
    let data: Vec<Vec<Vec<u8>>> = (0..stripes)
        .map(|_| {
            (0..k)
                .map(|_| {
                    (0..len)
                        .map(|_| {
                            seed = seed
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            (seed >> 56) as u8
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut expected = vec![(vec![0u8; len], vec![0u8; len]); stripes];
    for (d, (p, q)) in data.iter().zip(expected.iter_mut()) {
        let d: Vec<&[u8]> = d.iter().map(|c| c.as_slice()).collect();
        Reference.gen_pq(&d, p, q);
    }

    // gen
    let mut got = vec![(vec![0u8; len], vec![0u8; len]); stripes];
    {
        let slices: Vec<Vec<&[u8]>> = data
            .iter()
            .map(|d| d.iter().map(|c| c.as_slice()).collect())
            .collect();
        let mut batch: Vec<StripeGen> = slices
            .iter()
            .zip(got.iter_mut())
            .map(|(d, (p, q))| StripeGen {
                data: d,
                p,
                q: Some(q),
            })
            .collect();
        gpu.run(
            &Job::gen(k, true, len),
            stripes,
            Some(&mut GenIo {
                stripes: &mut batch,
                k,
            }),
        )?;
    }
    if got != expected {
        return Err(GpuError::SelfTest { op: "gen" });
    }

    // recover data 1 and 3 of every stripe
    let mut whole: Vec<Vec<Vec<u8>>> = data
        .iter()
        .zip(&expected)
        .map(|(d, (p, q))| {
            let mut chunks = d.clone();
            chunks.push(p.clone());
            chunks.push(q.clone());
            chunks
        })
        .collect();
    for chunks in whole.iter_mut() {
        chunks[1].fill(0);
        chunks[3].fill(0);
    }
    let erasures = validate_recover(std::iter::repeat_n(len, k + 2), k + 2, true, &[1, 3])
        .map_err(|_| GpuError::SelfTest { op: "recover plan" })?;
    {
        let mut chunk_lists: Vec<Vec<&mut [u8]>> = whole
            .iter_mut()
            .map(|c| c.iter_mut().map(|c| c.as_mut_slice()).collect())
            .collect();
        let mut batch: Vec<StripeRecover> = chunk_lists
            .iter_mut()
            .map(|c| StripeRecover {
                chunks: c,
                has_q: true,
                missing: &[1, 3],
            })
            .collect();
        gpu.run(
            &Job::recover(k, true, &erasures, len),
            stripes,
            Some(&mut RecoverIo {
                stripes: &mut batch,
            }),
        )?;
    }
    if whole
        .iter()
        .zip(&data)
        .any(|(w, d)| w[1] != d[1] || w[3] != d[3])
    {
        return Err(GpuError::SelfTest { op: "recover" });
    }

    // check: stripe 1 corrupted, the others whole
    whole[1][2][100] ^= 0x21;
    let views: Vec<Vec<&[u8]>> = whole
        .iter()
        .map(|c| c.iter().map(|c| c.as_slice()).collect())
        .collect();
    let refs: Vec<&[&[u8]]> = views.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![CheckOutcome::Consistent; stripes];
    gpu.run(
        &Job::check(k, true, len),
        stripes,
        Some(&mut CheckIo {
            stripes: &refs,
            bad: &mut out,
        }),
    )?;
    if out
        != [
            CheckOutcome::Consistent,
            CheckOutcome::Mismatch,
            CheckOutcome::Consistent,
        ]
    {
        return Err(GpuError::SelfTest { op: "check" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_into_runs_of_one_shape() {
        assert_eq!(
            CudaBackend::runs::<u8>(&[]),
            Vec::<std::ops::Range<usize>>::new()
        );
        assert_eq!(
            CudaBackend::runs(&[1, 1, 2, 2, 2, 1]),
            vec![0..2, 2..5, 5..6]
        );
        assert_eq!(CudaBackend::runs(&[(3, 64), (3, 64)]), vec![0..2]);
    }

    #[test]
    fn stripes_too_large_for_a_slot_are_cut_into_equal_columns() {
        let gen = |k: usize| move |bytes| Job::gen(k, true, bytes);
        let parts = |k: usize, chunk_bytes: usize| column_cut(chunk_bytes, gen(k)).map(|c| c.1);
        assert_eq!(parts(10, 64 << 10), Some(1), "fits whole");
        assert_eq!(parts(10, 1 << 20), Some(2), "10 MiB in two halves");
        assert_eq!(parts(253, 16 << 20), Some(512), "a 4 GiB stripe");
        assert_eq!(parts(6, (3 << 20) + 64), Some(4));
        // 2^22 - 3 is prime: its only cuts are one part (too large) or one byte each (too many).
        assert_eq!(parts(3, (1 << 22) - 3), None);
        let (job, n) = column_cut(1 << 20, gen(10)).expect("a cut");
        assert_eq!((job.chunk_bytes, n), (512 << 10, 2));
    }

    /// A StripeIo over plain vectors that records the flags it is given.
    struct Vectors {
        inputs: Vec<Vec<Vec<u8>>>,
        outputs: Vec<Vec<Vec<u8>>>,
        flags: Vec<(usize, bool)>,
    }

    impl StripeIo for Vectors {
        fn input(&self, stripe: usize, index: usize) -> &[u8] {
            &self.inputs[stripe][index]
        }

        fn output(&mut self, stripe: usize, index: usize) -> &mut [u8] {
            &mut self.outputs[stripe][index]
        }

        fn flag(&mut self, stripe: usize, bad: bool) {
            self.flags.push((stripe, bad));
        }
    }

    #[test]
    fn column_slices_map_to_their_stripes_bytes_and_flags() {
        let inputs: Vec<Vec<Vec<u8>>> = (0..2u8)
            .map(|s| {
                (0..2u8)
                    .map(|i| (0..12u8).map(|b| s * 100 + i * 20 + b).collect())
                    .collect()
            })
            .collect();
        let mut inner = Vectors {
            outputs: vec![vec![vec![0u8; 12]; 1]; 2],
            inputs,
            flags: Vec::new(),
        };
        let mut columns = Columns {
            inner: &mut inner,
            parts: 3,
            part_bytes: 4,
            bad_so_far: false,
            flagged: 0,
        };
        // Virtual stripe 4 is slice 1 (bytes 4..8) of stripe 1.
        assert_eq!(columns.input(4, 1), &[124, 125, 126, 127]);
        columns.output(5, 0).copy_from_slice(&[9, 9, 9, 9]);
        for (stripe, bad) in [
            (0, false),
            (1, true),
            (2, false),
            (3, false),
            (4, false),
            (5, false),
        ] {
            columns.flag(stripe, bad);
        }
        assert_eq!(inner.outputs[1][0], [0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9]);
        assert_eq!(
            inner.flags,
            vec![(0, true), (1, false)],
            "one flag per stripe, bad if any slice is"
        );
    }

    #[test]
    fn gpu_errors_say_what_failed() {
        assert!(GpuError::LoadDriver.to_string().contains("no CUDA driver"));
        assert!(GpuError::SelfTest { op: "gen" }
            .to_string()
            .contains("gen differs"));
        assert!(GpuError::StripeTooLarge { bytes: 9 }
            .to_string()
            .contains("9 bytes"));
    }
}
