//! Data plane: one thread per hardware queue owns the queue's io_uring and its tags; a pool of workers serves
//! the requests against the export.
//!
//! A tag belongs to one party at a time: the kernel (a FETCH or COMMIT_AND_FETCH is pending), or the queue
//! thread and then one worker (a request arrived). The tag's buffer is touched only by its owner, so handing it
//! to a worker needs no lock. The kernel insists that every command of a queue comes from the task that
//! fetched first, so workers never submit: they push (tag, result) and wake the queue thread through an
//! eventfd that the ring itself reads.

use std::alloc::{self, Layout};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};

use io_uring::{opcode, types, IoUring};
use paraid_nbd::{Export, PayloadMemory};

use crate::error::UblkError;
use crate::merge::{self, Job};
use crate::sys::{self, IoCmd, IoDesc};

/// What a queue is asked to be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueSpec {
    pub q_id: u16,
    pub depth: u16,
    pub buf_bytes: usize,
    pub workers: usize,
    /// A request that arrives alone into an idle queue is served on the queue thread (see `serve`).
    pub serve_inline_when_idle: bool,
    /// WRITEs that continue one another and arrived together are served as one export write up to this many
    /// bytes (crate::merge); 0: never.
    pub merge_write_bytes: u32,
    /// The write the export serves best whole (a RAID stripe), for merging; 0: unknown.
    pub whole_write_bytes: u64,
    /// READs that arrived together are served as one export call (crate::merge), up to this many; 0 or 1: never.
    pub gather_reads: usize,
}

/// What a queue did, reported when it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub requests: u64,
    pub failed_requests: u64,
    /// Requests served on the queue thread itself (they arrived alone into an idle queue).
    pub served_inline: u64,
    /// WRITEs served as part of a merged run (crate::merge).
    pub merged_writes: u64,
}

impl QueueStats {
    /// Adds another queue's counts (a device's are its queues' summed).
    pub fn add(&mut self, other: &QueueStats) {
        self.requests += other.requests;
        self.failed_requests += other.failed_requests;
        self.served_inline += other.served_inline;
        self.merged_writes += other.merged_writes;
    }
}

/// How the queue thread is woken from outside its ring: workers with results, the device with a stop.
struct Wake {
    eventfd: OwnedFd,
    stop: AtomicBool,
}

impl Wake {
    fn new() -> io::Result<Wake> {
        // SAFETY: eventfd has no memory arguments; the descriptor is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Wake {
            // SAFETY: fd is a fresh descriptor nothing else owns.
            eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
            stop: AtomicBool::new(false),
        })
    }

    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. An eventfd write only fails when the counter would overflow,
        // and then the reader has a wakeup pending anyway.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

pub(crate) struct QueueHandle {
    wake: Arc<Wake>,
    thread: Option<JoinHandle<Result<QueueStats, UblkError>>>,
}

impl QueueHandle {
    /// Asks the queue to end once no request is at a worker (after STOP_DEV nothing new arrives).
    pub fn request_stop(&self) {
        self.wake.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
    }

    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    pub fn join(&mut self, q_id: u16) -> Result<QueueStats, UblkError> {
        match self.thread.take() {
            None => Ok(QueueStats::default()),
            Some(thread) => thread.join().unwrap_or_else(|_| {
                Err(UblkError::Queue {
                    queue: q_id,
                    source: io::Error::other("the queue thread panicked"),
                })
            }),
        }
    }
}

/// The queue's request descriptors, mapped read-only from the character device.
struct Descriptors {
    ptr: *const IoDesc,
    map_bytes: usize,
    depth: u16,
}

// SAFETY: the mapping is read-only shared memory the kernel writes; only the queue thread reads it.
unsafe impl Send for Descriptors {}

impl Descriptors {
    fn map(cdev: &File, q_id: u16, depth: u16) -> io::Result<Descriptors> {
        let map_bytes = (depth as usize * std::mem::size_of::<IoDesc>()).div_ceil(sys::PAGE_BYTES)
            * sys::PAGE_BYTES;
        let offset = q_id as usize * sys::MAX_CMD_BUF_BYTES;
        // SAFETY: a fresh shared read-only mapping of the device's descriptor area for this queue.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_bytes,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                cdev.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Descriptors {
            ptr: ptr.cast(),
            map_bytes,
            depth,
        })
    }

    /// The request at `tag`; valid once the kernel completed that tag's FETCH with IO_RES_OK.
    fn get(&self, tag: u16) -> IoDesc {
        assert!(
            tag < self.depth,
            "tag {tag} beyond the queue depth {}",
            self.depth
        );
        // SAFETY: tag < depth, so the descriptor lies inside the mapping; volatile because the kernel writes it.
        unsafe { std::ptr::read_volatile(self.ptr.add(tag as usize)) }
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_bytes) };
    }
}

/// One page-aligned buffer per tag, in one allocation: memory the export lends where it lends some
/// (`Export::payload_memory`: a RAID array's parity backend memory, which a GPU computes on in place), else the
/// heap.
struct TagBuffers {
    ptr: *mut u8,
    /// The heap allocation's layout (None: the memory is `lent`).
    layout: Option<Layout>,
    /// Lent memory, which `ptr` points into; kept alive as long as the buffers.
    lent: Option<PayloadMemory>,
    buf_bytes: usize,
}

// SAFETY: each tag's slice is used by one owner at a time (see the module comment).
unsafe impl Send for TagBuffers {}
unsafe impl Sync for TagBuffers {}

impl TagBuffers {
    fn new(depth: u16, buf_bytes: usize, lender: &dyn Export) -> io::Result<TagBuffers> {
        let total_bytes = depth as usize * buf_bytes;
        if let Some(mut lent) = lender.payload_memory(total_bytes) {
            let ptr = lent.as_mut_ptr();
            if lent.len() >= total_bytes && (ptr as usize).is_multiple_of(sys::PAGE_BYTES) {
                return Ok(TagBuffers {
                    ptr,
                    layout: None,
                    lent: Some(lent),
                    buf_bytes,
                });
            }
        }
        let layout = Layout::from_size_align(total_bytes, sys::PAGE_BYTES)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size (depth and buf_bytes are checked non-zero by the config).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(TagBuffers {
            ptr,
            layout: Some(layout),
            lent: None,
            buf_bytes,
        })
    }

    /// Whether the buffers are memory the export lent.
    fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    fn addr(&self, tag: u16) -> u64 {
        self.ptr as u64 + tag as u64 * self.buf_bytes as u64
    }

    /// The first `len` bytes of the tag's buffer.
    ///
    /// # Safety
    /// The caller owns the tag (no one else touches its buffer until the tag is committed).
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, tag: u16, len: usize) -> &mut [u8] {
        assert!(
            len <= self.buf_bytes,
            "{len} bytes do not fit a {}-byte buffer",
            self.buf_bytes
        );
        std::slice::from_raw_parts_mut(self.ptr.add(tag as usize * self.buf_bytes), len)
    }
}

impl Drop for TagBuffers {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: frees the allocation made in `new` with its layout.
            unsafe { alloc::dealloc(self.ptr, layout) };
        }
        // Lent memory goes back to the export when `lent` drops.
    }
}

/// The queue thread's hand-off to its workers, and the workers' results back.
struct Pool {
    jobs: Mutex<PoolJobs>,
    job_ready: Condvar,
    done: Mutex<Vec<(u16, i32)>>,
}

struct PoolJobs {
    queue: VecDeque<Job>,
    closed: bool,
}

const KIND_IO: u64 = 1 << 32;
const KIND_WAKE: u64 = 2 << 32;

/// Maps the descriptors, allocates the buffers and the ring here (errors come back at once), then starts the
/// queue thread, which fetches every tag and reports on `ready`.
pub(crate) fn spawn(
    spec: QueueSpec,
    cdev: Arc<File>,
    export: Arc<dyn Export>,
    ready: mpsc::Sender<(u16, io::Result<()>)>,
) -> Result<QueueHandle, UblkError> {
    let q_id = spec.q_id;
    let descriptors =
        Descriptors::map(&cdev, q_id, spec.depth).map_err(|source| UblkError::MapDescriptors {
            queue: q_id,
            source,
        })?;
    let queue_error = |source| UblkError::Queue {
        queue: q_id,
        source,
    };
    let buffers = Arc::new(
        TagBuffers::new(spec.depth, spec.buf_bytes, export.as_ref()).map_err(queue_error)?,
    );
    if buffers.is_lent() {
        log::debug!("ublk queue {q_id}: request buffers in memory the export lent");
    }
    // Every tag has at most one command in flight, plus the eventfd read.
    let ring = IoUring::new((spec.depth as u32 + 1).next_power_of_two()).map_err(|source| {
        UblkError::SetupRing {
            purpose: "a ublk queue",
            source,
        }
    })?;
    let wake = Arc::new(Wake::new().map_err(queue_error)?);
    let thread_wake = wake.clone();
    let thread = thread::Builder::new()
        .name(format!("ublk-q{q_id}"))
        .spawn(move || {
            let mut queue = Queue {
                spec,
                cdev,
                export,
                descriptors,
                buffers,
                ring,
                wake: thread_wake,
                stats: QueueStats::default(),
            };
            queue.run(ready)
        })
        .map_err(queue_error)?;
    Ok(QueueHandle {
        wake,
        thread: Some(thread),
    })
}

struct Queue {
    spec: QueueSpec,
    cdev: Arc<File>,
    export: Arc<dyn Export>,
    descriptors: Descriptors,
    buffers: Arc<TagBuffers>,
    ring: IoUring,
    wake: Arc<Wake>,
    stats: QueueStats,
}

impl Queue {
    fn run(&mut self, ready: mpsc::Sender<(u16, io::Result<()>)>) -> Result<QueueStats, UblkError> {
        let q_id = self.spec.q_id;
        let pool = Arc::new(Pool {
            jobs: Mutex::new(PoolJobs {
                queue: VecDeque::new(),
                closed: false,
            }),
            job_ready: Condvar::new(),
            done: Mutex::new(Vec::new()),
        });
        let workers = self.start_workers(&pool);
        let mut wake_word = Box::new(0u64);
        let fetched = (0..self.spec.depth)
            .try_for_each(|tag| self.push_io(sys::IO_FETCH_REQ, tag, 0))
            .and_then(|()| self.push_wake_read(&mut wake_word))
            .and_then(|()| self.ring.submit().map(|_| ()));
        let served = match fetched {
            Err(e) => {
                let _ = ready.send((q_id, Err(e)));
                Ok(())
            }
            Ok(()) => {
                let _ = ready.send((q_id, Ok(())));
                self.serve(&pool, &mut wake_word)
            }
        };
        {
            let mut jobs = pool.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.closed = true;
        }
        pool.job_ready.notify_all();
        for worker in workers {
            let _ = worker.join();
        }
        served.map_err(|source| UblkError::Queue {
            queue: q_id,
            source,
        })?;
        Ok(self.stats)
    }

    fn start_workers(&self, pool: &Arc<Pool>) -> Vec<JoinHandle<()>> {
        (0..self.spec.workers)
            .filter_map(|n| {
                let pool = pool.clone();
                let export = self.export.clone();
                let buffers = self.buffers.clone();
                let wake = self.wake.clone();
                thread::Builder::new()
                    .name(format!("ublk-q{}-w{n}", self.spec.q_id))
                    .spawn(move || work(&pool, export.as_ref(), &buffers, &wake))
                    .map_err(|e| log::warn!("ublk: starting a worker: {e}"))
                    .ok()
            })
            .collect()
    }

    /// FETCH or COMMIT_AND_FETCH for one tag, with the tag's buffer for the next request.
    fn push_io(&mut self, nr: u8, tag: u16, result: i32) -> io::Result<()> {
        let cmd = IoCmd {
            q_id: self.spec.q_id,
            tag,
            result,
            addr: self.buffers.addr(tag),
        };
        let sqe = opcode::UringCmd16::new(types::Fd(self.cdev.as_raw_fd()), sys::io_op(nr))
            .cmd(sys::command_bytes(&cmd))
            .build()
            .user_data(KIND_IO | tag as u64);
        // SAFETY: the command refers to the tag's buffer, which lives as long as the queue.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("the queue's submission ring is full"))
    }

    /// Answers a served request (and fetches the tag's next one), counting it if it failed.
    fn commit(&mut self, tag: u16, result: i32) -> io::Result<()> {
        if result < 0 {
            self.stats.failed_requests += 1;
        }
        self.push_io(sys::IO_COMMIT_AND_FETCH_REQ, tag, result)
    }

    fn push_wake_read(&mut self, word: &mut u64) -> io::Result<()> {
        let sqe = opcode::Read::new(
            types::Fd(self.wake.eventfd.as_raw_fd()),
            (word as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(KIND_WAKE);
        // SAFETY: `word` is boxed by the caller and outlives the ring's use of it.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("the queue's submission ring is full"))
    }

    fn serve(&mut self, pool: &Pool, wake_word: &mut u64) -> io::Result<()> {
        let depth = self.spec.depth;
        let mut at_workers: usize = 0;
        let mut aborted: usize = 0;
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(depth as usize + 1);
        let mut arrived: Vec<(u16, IoDesc)> = Vec::with_capacity(depth as usize);
        let mut planned: Vec<Job> = Vec::new();
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            completions.clear();
            completions.extend(
                self.ring
                    .completion()
                    .map(|cqe| (cqe.user_data(), cqe.result())),
            );
            let mut wake_fired = false;
            arrived.clear();
            for &(user_data, result) in &completions {
                if user_data == KIND_WAKE {
                    wake_fired = true;
                    continue;
                }
                let tag = (user_data & 0xffff) as u16;
                match result {
                    sys::IO_RES_OK => {
                        arrived.push((tag, self.descriptors.get(tag)));
                        self.stats.requests += 1;
                    }
                    sys::IO_RES_ABORT => aborted += 1,
                    errno => {
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                }
            }
            if self.spec.serve_inline_when_idle && arrived.len() == 1 && at_workers == 0 {
                // One request into an idle queue (queue depth 1, a lone commit): served here. Handing it to a
                // worker would add a wakeup there and an eventfd round trip back, a good part of a small
                // request's time. Requests that arrive together, or while workers are busy, go to the pool.
                let (tag, desc) = arrived[0];
                let buffers = &self.buffers;
                let result = serve_request(self.export.as_ref(), &desc, |len| {
                    // SAFETY: the queue thread owns the tag until it commits it just below.
                    unsafe { buffers.slice(tag, len) }
                });
                self.stats.served_inline += 1;
                self.commit(tag, result)?;
            } else if !arrived.is_empty() {
                planned.clear();
                merge::plan_jobs(
                    &arrived,
                    self.spec.merge_write_bytes as u64,
                    self.spec.whole_write_bytes,
                    self.spec.gather_reads,
                    &mut planned,
                );
                self.stats.merged_writes += planned
                    .iter()
                    .filter(|job| job.len() > 1)
                    .map(|job| job.len() as u64)
                    .sum::<u64>();
                let job_count = planned.len();
                pool.jobs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .queue
                    .extend(planned.drain(..));
                at_workers += arrived.len();
                if job_count == 1 {
                    pool.job_ready.notify_one();
                } else {
                    pool.job_ready.notify_all();
                }
            }
            if wake_fired {
                let done =
                    std::mem::take(&mut *pool.done.lock().unwrap_or_else(|e| e.into_inner()));
                for (tag, result) in done {
                    self.commit(tag, result)?;
                    at_workers -= 1;
                }
                self.push_wake_read(wake_word)?;
            }
            if aborted == depth as usize {
                return Ok(());
            }
            if self.wake.stop.load(Ordering::SeqCst) && at_workers == 0 {
                return Ok(());
            }
        }
    }
}

/// A worker: takes requests until the queue closes, serves each against the export, hands back the result.
fn work(pool: &Pool, export: &dyn Export, buffers: &TagBuffers, wake: &Wake) {
    let mut merged: Vec<u8> = Vec::new();
    let mut results: Vec<(u16, i32)> = Vec::new();
    loop {
        let job = {
            let mut jobs = pool.jobs.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(job) = jobs.queue.pop_front() {
                    break job;
                }
                if jobs.closed {
                    return;
                }
                jobs = pool.job_ready.wait(jobs).unwrap_or_else(|e| e.into_inner());
            }
        };
        results.clear();
        if let [(tag, desc)] = job[..] {
            let result = serve_request(export, &desc, |len| {
                // SAFETY: this worker owns the tag until its result is committed by the queue thread.
                unsafe { buffers.slice(tag, len) }
            });
            results.push((tag, result));
        } else if job[0].1.op() == sys::IO_OP_READ {
            let buffer = |tag: u16, len: usize| -> &mut [u8] {
                // SAFETY: this worker owns every tag of the batch until their results are committed, and each
                // tag's buffer is its own.
                unsafe { buffers.slice(tag, len) }
            };
            merge::serve_read_batch(export, &job, buffer, &mut results);
        } else {
            let data = |tag: u16, len: usize| -> &[u8] {
                // SAFETY: as above, for every tag of the run.
                unsafe { buffers.slice(tag, len) }
            };
            merge::serve_write_run(export, &job, data, &mut merged, &mut results);
        }
        let first = {
            let mut done = pool.done.lock().unwrap_or_else(|e| e.into_inner());
            let was_empty = done.is_empty();
            done.extend(results.iter().copied());
            was_empty
        };
        // Results pushed after one that is not yet collected ride on that one's wakeup.
        if first {
            wake.notify();
        }
    }
}

/// Whether `desc`'s range ends past the export (logged: the kernel never sends such a request to a device of the
/// size it was told).
pub(crate) fn ends_past_the_device(export: &dyn Export, desc: &IoDesc) -> bool {
    let (offset_bytes, len_bytes) = (desc.offset_bytes(), desc.len_bytes());
    let past = offset_bytes.saturating_add(len_bytes) > export.size_bytes();
    if past {
        log::error!(
            "ublk: request op {} of {len_bytes} bytes at {offset_bytes} ends past the device ({} bytes)",
            desc.op(),
            export.size_bytes()
        );
    }
    past
}

/// Serves one request; the result is what COMMIT_AND_FETCH reports: the bytes moved for a READ or WRITE, 0 for
/// the others, or a negative errno.
pub(crate) fn serve_request<'b>(
    export: &dyn Export,
    desc: &IoDesc,
    buffer: impl FnOnce(usize) -> &'b mut [u8],
) -> i32 {
    let op = desc.op();
    let fua = desc.fua();
    let offset_bytes = desc.offset_bytes();
    let len_bytes = desc.len_bytes();
    if op != sys::IO_OP_FLUSH && ends_past_the_device(export, desc) {
        return -libc::EINVAL;
    }
    let served = match op {
        sys::IO_OP_READ => export.read(offset_bytes, buffer(len_bytes as usize)),
        sys::IO_OP_WRITE => export.write(offset_bytes, buffer(len_bytes as usize), fua),
        sys::IO_OP_FLUSH => export.flush(),
        sys::IO_OP_DISCARD => export.trim(offset_bytes, len_bytes),
        sys::IO_OP_WRITE_ZEROES => export.write_zeroes(offset_bytes, len_bytes, fua),
        _ => return -libc::EOPNOTSUPP,
    };
    match served {
        Ok(()) if op == sys::IO_OP_READ || op == sys::IO_OP_WRITE => len_bytes as i32,
        Ok(()) => 0,
        Err(e) => sys::negative_errno(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paraid_nbd::MemoryExport;

    fn desc(op: u8, flags: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: op as u32 | flags,
            nr_sectors,
            start_sector,
            addr: 0,
        }
    }

    /// An export whose every call fails with one OS error.
    struct FailingExport(i32);

    impl Export for FailingExport {
        fn size_bytes(&self) -> u64 {
            1 << 20
        }
        fn read(&self, _: u64, _: &mut [u8]) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(self.0))
        }
        fn write(&self, _: u64, _: &[u8], _: bool) -> io::Result<()> {
            Err(io::Error::other("no errno"))
        }
        fn flush(&self) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(self.0))
        }
        fn trim(&self, _: u64, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn writes_then_reads_return_the_bytes_and_land_at_their_sector() {
        let export = MemoryExport::new(1 << 20);
        let mut buf = vec![0xabu8; 8192];
        let written = serve_request(
            &export,
            &desc(sys::IO_OP_WRITE, sys::IO_F_FUA, 8, 16),
            |len| &mut buf[..len],
        );
        assert_eq!(written, 8192);
        let contents = export.contents();
        assert!(contents[..4096].iter().all(|&b| b == 0));
        assert!(contents[4096..4096 + 8192].iter().all(|&b| b == 0xab));
        assert!(contents[4096 + 8192..].iter().all(|&b| b == 0));
        let mut back = vec![0u8; 4096];
        let read = serve_request(&export, &desc(sys::IO_OP_READ, 0, 10, 8), |len| {
            &mut back[..len]
        });
        assert_eq!(read, 4096);
        assert!(back.iter().all(|&b| b == 0xab));
    }

    #[test]
    fn flush_discard_and_write_zeroes_answer_zero() {
        let export = MemoryExport::with_contents(vec![0x55; 1 << 16], false);
        let no_buffer = |_: usize| -> &'static mut [u8] { panic!("no data for this op") };
        assert_eq!(
            serve_request(&export, &desc(sys::IO_OP_FLUSH, 0, 0, 0), no_buffer),
            0
        );
        assert_eq!(
            serve_request(&export, &desc(sys::IO_OP_WRITE_ZEROES, 0, 16, 8), no_buffer),
            0
        );
        let contents = export.contents();
        assert!(contents[8192..12288].iter().all(|&b| b == 0));
        assert!(contents[..8192].iter().all(|&b| b == 0x55));
        assert_eq!(
            serve_request(&export, &desc(sys::IO_OP_DISCARD, 0, 0, 8), no_buffer),
            0
        );
    }

    #[test]
    fn out_of_range_and_unknown_requests_are_refused_without_touching_the_export() {
        let export = MemoryExport::new(1 << 16);
        let no_buffer = |_: usize| -> &'static mut [u8] { panic!("must not be served") };
        let past_end = desc(sys::IO_OP_WRITE, 0, (1 << 16) / 512 - 4, 8);
        assert_eq!(serve_request(&export, &past_end, no_buffer), -libc::EINVAL);
        let overflow = desc(sys::IO_OP_READ, 0, u64::MAX / 512, 8);
        assert_eq!(serve_request(&export, &overflow, no_buffer), -libc::EINVAL);
        let write_same = desc(sys::IO_OP_WRITE_SAME, 0, 0, 8);
        assert_eq!(
            serve_request(&export, &write_same, no_buffer),
            -libc::EOPNOTSUPP
        );
    }

    #[test]
    fn export_errors_reach_the_kernel_as_negative_errnos() {
        let export = FailingExport(libc::ENOSPC);
        let mut buf = vec![0u8; 4096];
        assert_eq!(
            serve_request(&export, &desc(sys::IO_OP_READ, 0, 0, 8), |len| &mut buf
                [..len]),
            -libc::ENOSPC
        );
        // An error without an errno (the engine's) is EIO, never success.
        assert_eq!(
            serve_request(&export, &desc(sys::IO_OP_WRITE, 0, 0, 8), |len| &mut buf
                [..len]),
            -libc::EIO
        );
        assert_eq!(
            serve_request(
                &export,
                &desc(sys::IO_OP_FLUSH, 0, 0, 0),
                |_| unreachable!()
            ),
            -libc::ENOSPC
        );
    }

    /// Heap memory `skew` bytes past a page boundary, lent by `Lender`.
    struct Skewed {
        bytes: Vec<u8>,
        at: usize,
        len: usize,
    }

    impl std::ops::Deref for Skewed {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            &self.bytes[self.at..self.at + self.len]
        }
    }

    impl std::ops::DerefMut for Skewed {
        fn deref_mut(&mut self) -> &mut [u8] {
            &mut self.bytes[self.at..self.at + self.len]
        }
    }

    /// An export that lends memory `skew` bytes past a page boundary.
    struct Lender {
        inner: MemoryExport,
        skew: usize,
    }

    impl Export for Lender {
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
            self.inner.write(offset, buf, fua)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn trim(&self, _: u64, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool) -> io::Result<()> {
            Ok(())
        }
        fn payload_memory(&self, len: usize) -> Option<PayloadMemory> {
            let bytes = vec![0u8; len + 2 * sys::PAGE_BYTES];
            let to_page =
                (sys::PAGE_BYTES - bytes.as_ptr() as usize % sys::PAGE_BYTES) % sys::PAGE_BYTES;
            Some(Box::new(Skewed {
                bytes,
                at: to_page + self.skew,
                len,
            }))
        }
    }

    #[test]
    fn tag_buffers_are_memory_the_export_lends_when_page_aligned() {
        for (skew, lent) in [(0, true), (512, false)] {
            let export = Lender {
                inner: MemoryExport::new(4096),
                skew,
            };
            let buffers = TagBuffers::new(4, 64 * 1024, &export).unwrap();
            assert_eq!(buffers.is_lent(), lent, "memory {skew} bytes past a page");
            for tag in 0..4u16 {
                assert_eq!(buffers.addr(tag) % sys::PAGE_BYTES as u64, 0);
            }
            // SAFETY: the test owns every tag.
            let last = unsafe { buffers.slice(3, 64 * 1024) };
            last.fill(9);
            assert!(unsafe { buffers.slice(0, 64 * 1024) }
                .iter()
                .all(|&b| b == 0));
        }
    }

    #[test]
    fn tag_buffers_are_page_aligned_and_apart() {
        let buffers = TagBuffers::new(4, 64 * 1024, &MemoryExport::new(4096)).unwrap();
        assert!(!buffers.is_lent());
        for tag in 0..4u16 {
            assert_eq!(buffers.addr(tag) % sys::PAGE_BYTES as u64, 0);
            assert_eq!(buffers.addr(tag) - buffers.addr(0), tag as u64 * 64 * 1024);
        }
        // SAFETY: the test owns every tag.
        let last = unsafe { buffers.slice(3, 64 * 1024) };
        last.fill(7);
        assert!(unsafe { buffers.slice(2, 64 * 1024) }
            .iter()
            .all(|&b| b == 0));
    }
}
