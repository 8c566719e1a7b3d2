//! The transmission phase of one connection, leader/follower style: a pool of scoped worker threads takes turns
//! at the socket. The pool starts with one worker and grows on demand up to `Settings::workers`: a worker that
//! takes a request while no other is free to read the next one starts another (a client at queue depth 1 costs
//! one thread; one with 32 requests outstanding against slow members gets up to the limit, each request
//! waiting on its member I/O in its own thread). The worker holding the intake reads and validates the next
//! request (refusing bad ones with their error reply right there), lets the intake go, then executes the request itself and sends the reply
//! through one mutex-protected writer. No request crosses a thread: each costs one wake-up (the next worker
//! taking the intake) instead of two (reader to queue to worker), and its data stays in the cache of the core that
//! read it. A byte budget bounds what is in flight (being read or executed), so a client pipelining large
//! writes cannot make the server buffer without limit.

use std::cell::Cell;
use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread;

use crate::error::NbdError;
use crate::export::{error_code_for, Export, PayloadMemory};
use crate::handshake::{Negotiated, ALLOCATION_CONTEXT_ID};
use crate::proto::*;
use crate::reply;
use crate::request::{parse_header, validate, Command, Limits, RequestHeader};
use crate::stream::{ReadFailure, Stream, StreamReader, SHUTDOWN_POLL};

/// Every request counts at least this much against the in-flight budget, so the number of queued requests is
/// bounded too, not only their payload bytes.
pub(crate) const REQUEST_OVERHEAD_BYTES: u64 = 4096;

/// Replies queued for the sender (`ReplySink`) beyond which a worker waits for the writer instead (about 4,000
/// simple replies): the backpressure a client that stops reading must meet.
const MAX_QUEUED_REPLY_BYTES: usize = 64 << 10;

/// Workers keep their data buffers between requests up to this size; larger ones are freed after use.
const KEEP_BUFFER_BYTES: usize = 1 << 20;

/// Alignment of the data buffers: an export reading with O_DIRECT can fill them in place.
const BUFFER_ALIGN_BYTES: usize = 4096;

/// READs gathered with others (`gather_following_reads`; the ublk frontend's too) are at most this long each: a
/// large read gains nothing from company, and the batch's first answer waits for its last read...
pub const GATHER_READ_MAX_BYTES: u32 = 64 << 10;
/// ...and at most this long together (the gathering worker's buffer).
const GATHER_READS_MAX_TOTAL_BYTES: usize = 512 << 10;

/// Per-connection limits (already normalized by the server).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// The most worker threads the connection's pool grows to.
    pub workers: usize,
    pub max_request_bytes: u32,
    pub max_in_flight_bytes: u64,
    /// A refused WRITE whose payload is at most this long is read and dropped (the connection survives); a
    /// longer one ends the connection, since reading it would let a client make the server swallow gigabytes.
    pub discard_limit_bytes: u64,
    /// WRITEs that continue one another and have already arrived are merged into one export write up to this
    /// many bytes (0: never), at most `max_request_bytes`.
    pub merge_write_bytes: u32,
    /// READs that arrived together are served as one export call (`Export::read_many`), up to this many (0 or 1:
    /// never).
    pub gather_reads: usize,
}

/// Ignores poisoning: every value behind these locks stays consistent across a panic (counters, a socket).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counting semaphore over bytes in flight.
struct InFlightBudget {
    limit_bytes: u64,
    state: Mutex<BudgetState>,
    released: Condvar,
}

struct BudgetState {
    used_bytes: u64,
    /// Acquires waiting for room: a release wakes them only when there are some (a wake is a system call).
    waiters: usize,
}

impl InFlightBudget {
    fn new(limit_bytes: u64) -> Self {
        InFlightBudget {
            limit_bytes,
            state: Mutex::new(BudgetState {
                used_bytes: 0,
                waiters: 0,
            }),
            released: Condvar::new(),
        }
    }

    /// Waits until `cost_bytes` fit; `false` if the server started shutting down (or the connection broke)
    /// meanwhile.
    fn acquire(&self, cost_bytes: u64, give_up: impl Fn() -> bool) -> bool {
        debug_assert!(
            cost_bytes <= self.limit_bytes,
            "a single request must always fit the budget"
        );
        let mut state = lock(&self.state);
        while state.used_bytes + cost_bytes > self.limit_bytes {
            if give_up() {
                return false;
            }
            state.waiters += 1;
            state = self
                .released
                .wait_timeout(state, SHUTDOWN_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.waiters -= 1;
        }
        state.used_bytes += cost_bytes;
        true
    }

    /// Takes `cost_bytes` if they fit now; never waits.
    fn try_acquire(&self, cost_bytes: u64) -> bool {
        let mut state = lock(&self.state);
        if state.used_bytes + cost_bytes > self.limit_bytes {
            return false;
        }
        state.used_bytes += cost_bytes;
        true
    }

    fn release(&self, cost_bytes: u64) {
        let mut state = lock(&self.state);
        debug_assert!(state.used_bytes >= cost_bytes);
        state.used_bytes -= cost_bytes;
        if state.waiters > 0 {
            self.released.notify_all();
        }
    }
}

/// The write side of the connection. A reply is written whole under the lock, so replies never interleave.
///
/// Replies without data (writes, flushes, errors: a few bytes each) are combined: a worker appends its reply to
/// `pending` and, unless another worker is already sending the queue, becomes the sender: it sends the queue,
/// then whatever was queued meanwhile, until the queue is empty. Waiting for the writer's lock cost a sleep and
/// a wake-up per reply when many requests finish at once; now only the sender waits, and one system call
/// carries several replies. Nothing is left behind: whether a sender is active and what is queued are decided
/// under the one `pending` lock, and the sender leaves only after finding the queue empty under it.
struct ReplySink {
    writer: Mutex<Stream>,
    pending: Mutex<PendingReplies>,
    broken: AtomicBool,
    first_error: Mutex<Option<io::Error>>,
}

#[derive(Default)]
struct PendingReplies {
    bytes: Vec<u8>,
    /// A worker is sending the queue (and will send what is appended to it).
    sending: bool,
    /// An empty buffer kept for the next batch (no allocation per batch).
    spare: Vec<u8>,
}

impl ReplySink {
    fn new(writer: Stream) -> ReplySink {
        ReplySink {
            writer: Mutex::new(writer),
            pending: Mutex::new(PendingReplies::default()),
            broken: AtomicBool::new(false),
            first_error: Mutex::new(None),
        }
    }

    /// Sends a reply without data (combined with others, see the type's doc).
    fn send(&self, bytes: &[u8]) {
        if self.is_broken() {
            return;
        }
        let mut pending = lock(&self.pending);
        if pending.sending && pending.bytes.len() >= MAX_QUEUED_REPLY_BYTES {
            // The sender is stuck on a client that does not read its replies: wait for the writer like a reply
            // with data, so that the workers stop taking requests instead of queueing replies without bound.
            drop(pending);
            self.send_parts(bytes, &[]);
            return;
        }
        pending.bytes.extend_from_slice(bytes);
        if pending.sending {
            return; // the sender sends it
        }
        pending.sending = true;
        loop {
            if pending.bytes.is_empty() {
                pending.sending = false;
                return;
            }
            let spare = std::mem::take(&mut pending.spare);
            let mut batch = std::mem::replace(&mut pending.bytes, spare);
            drop(pending);
            if !self.is_broken() {
                let mut writer = lock(&self.writer);
                if let Err(error) = write_all_vectored(&mut writer, &batch, &[]) {
                    self.fail(&mut writer, error);
                }
            }
            batch.clear();
            pending = lock(&self.pending);
            pending.spare = batch;
        }
    }

    /// Sends `head` then `body` as one reply, in one system call when the socket takes it all.
    fn send_parts(&self, head: &[u8], body: &[u8]) {
        if self.is_broken() {
            return;
        }
        let mut writer = lock(&self.writer);
        if let Err(error) = write_all_vectored(&mut writer, head, body) {
            self.fail(&mut writer, error);
        }
    }

    /// Sends replies, each `head` then `body`, together: in one system call when the socket takes them all.
    fn send_many_parts(&self, parts: &[(&[u8], &[u8])]) {
        if self.is_broken() || parts.is_empty() {
            return;
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() * 2);
        for (head, body) in parts {
            slices.push(IoSlice::new(head));
            slices.push(IoSlice::new(body));
        }
        let mut writer = lock(&self.writer);
        if let Err(error) = write_all_slices(&mut writer, &mut slices) {
            self.fail(&mut writer, error);
        }
    }

    /// The client is gone or stalled past the write timeout. Shutting the socket down also wakes the worker
    /// reading requests, which then ends the connection.
    fn fail(&self, writer: &mut Stream, error: io::Error) {
        self.broken.store(true, Ordering::Relaxed);
        let _ = writer.shutdown(Shutdown::Both);
        lock(&self.first_error).get_or_insert(error);
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    fn take_error(&self) -> Option<io::Error> {
        lock(&self.first_error).take()
    }
}

/// `write_all` of two buffers through `writev`.
fn write_all_vectored(writer: &mut Stream, head: &[u8], body: &[u8]) -> io::Result<()> {
    write_all_slices(writer, &mut [IoSlice::new(head), IoSlice::new(body)])
}

/// `write_all` of buffers through `writev` (as many as one call takes, then the rest).
fn write_all_slices(writer: &mut Stream, storage: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut parts: &mut [IoSlice<'_>] = storage;
    IoSlice::advance_slices(&mut parts, 0); // drops empty leading slices
    while !parts.is_empty() {
        match writer.write_vectored(parts) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// A reusable data buffer whose bytes start on a `BUFFER_ALIGN_BYTES` boundary: from the heap, or memory the
/// export lent (`Export::payload_memory`, asked for when a lender is given and the buffer must grow).
#[derive(Default)]
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    /// Lent memory in use instead of `storage` (which is then empty).
    lent: Option<PayloadMemory>,
}

impl AlignedBuffer {
    /// Every byte the buffer holds now, from its aligned start.
    fn held(&mut self) -> &mut [u8] {
        match self.lent.as_mut() {
            Some(lent) => &mut lent[..],
            None => {
                let start = self.start.min(self.storage.len());
                &mut self.storage[start..]
            }
        }
    }

    /// `len_bytes` bytes at an aligned address; contents unspecified (stale bytes of earlier requests). When it
    /// must grow, memory from `lender` if it lends some (aligned), else from the heap.
    fn get(&mut self, lender: Option<&dyn Export>, len_bytes: usize) -> &mut [u8] {
        if self.held().len() < len_bytes {
            *self = AlignedBuffer::default();
            // Not for a buffer freed after its one request (`trim`): lent memory may be costly to make (a GPU
            // registers it), so it is asked for only where it is kept.
            let lender = lender.filter(|_| len_bytes <= KEEP_BUFFER_BYTES);
            match lender.and_then(|export| export.payload_memory(len_bytes)) {
                Some(lent)
                    if lent.len() >= len_bytes
                        && (lent.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN_BYTES) =>
                {
                    self.lent = Some(lent);
                }
                _ => {
                    // A fresh buffer comes zeroed from the allocator (no memset of pages a read overwrites
                    // anyway).
                    self.storage = vec![0u8; len_bytes + BUFFER_ALIGN_BYTES];
                    let misalignment = self.storage.as_ptr() as usize % BUFFER_ALIGN_BYTES;
                    self.start = (BUFFER_ALIGN_BYTES - misalignment) % BUFFER_ALIGN_BYTES;
                }
            }
        }
        &mut self.held()[..len_bytes]
    }

    /// `len_bytes` bytes at an aligned address whose first `kept_bytes` are those the buffer held there before;
    /// grows to at least `reserve_bytes` when it must grow (so that a run of merges reallocates once).
    fn get_keeping(
        &mut self,
        lender: Option<&dyn Export>,
        kept_bytes: usize,
        len_bytes: usize,
        reserve_bytes: usize,
    ) -> &mut [u8] {
        debug_assert!(kept_bytes <= len_bytes);
        if self.held().len() < len_bytes {
            let mut grown = AlignedBuffer::default();
            grown.get(lender, len_bytes.max(reserve_bytes))[..kept_bytes]
                .copy_from_slice(&self.held()[..kept_bytes]);
            *self = grown;
        }
        &mut self.held()[..len_bytes]
    }

    /// Frees a buffer grown for an unusually large request.
    fn trim(&mut self) {
        if self.held().len() > KEEP_BUFFER_BYTES + BUFFER_ALIGN_BYTES {
            *self = AlignedBuffer::default();
        }
    }
}

/// One accepted request; a WRITE's payload is in the buffer of the worker that read it.
struct Job {
    handle: u64,
    /// The WRITEs merged into this one (`merge_following_writes`), answered with it, in the order they came.
    merged_handles: Vec<u64>,
    /// The READs gathered behind this one (`gather_following_reads`), served with it, each answered on its own.
    gathered_reads: Vec<GatheredRead>,
    command: Command,
    cost_bytes: u64,
    /// A WRITE that may go to `Export::write_answering`: any, unless the export answers early only writes
    /// whose client waits for them (`Export::answers_early_only_when_waited_for`); then one that, when it was
    /// read, found no other request of the connection unanswered and none arrived behind it.
    answer_early: bool,
    /// A WRITE told to the export as arriving (`Export::write_arriving`) when its payload began to be read; told
    /// handed on just before it is served.
    arriving: bool,
}

/// A READ served with the one before it (`Job::gathered_reads`).
#[derive(Debug, Clone, Copy)]
struct GatheredRead {
    handle: u64,
    offset_bytes: u64,
    length_bytes: u32,
}

impl Job {
    /// Every request this job answers: its own, then the merged or gathered ones.
    fn handles(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.handle)
            .chain(self.merged_handles.iter().copied())
            .chain(self.gathered_reads.iter().map(|read| read.handle))
    }
}

/// The socket's reading half, held by one worker at a time.
struct Intake<'r> {
    reader: StreamReader<'r>,
    /// Reading ended (client gone, NBD_CMD_DISC, protocol error, shutdown): workers exit once their own request
    /// is answered.
    ended: bool,
}

/// Everything the workers share.
struct Shared<'a, 'r> {
    export: &'a dyn Export,
    sink: ReplySink,
    budget: InFlightBudget,
    structured_replies: bool,
    limits: Limits,
    settings: Settings,
    shutdown: &'a AtomicBool,
    intake: Mutex<Intake<'r>>,
    /// Why reading ended, when that was an error.
    read_error: Mutex<Option<NbdError>>,
    /// Workers started so far (at most `settings.workers`).
    started: AtomicUsize,
    /// Workers not executing a request: waiting for the intake or reading from it. When the one that takes a
    /// request leaves none behind, nobody would read the next request until some request finishes.
    free: AtomicUsize,
    /// Requests taken from the intake whose reply has not gone out (`Job::answer_early`).
    unanswered: AtomicUsize,
}

impl Shared<'_, '_> {
    fn send_error(&self, handle: u64, code: ErrorCode, message: &str) {
        self.sink.send(&reply::error(
            self.structured_replies,
            handle,
            code,
            message,
        ));
    }

    /// Ends reading for every worker, keeping the first error.
    fn end_intake(&self, intake: &mut Intake<'_>, result: Result<(), NbdError>) {
        intake.ended = true;
        if let Err(error) = result {
            lock(&self.read_error).get_or_insert(error);
        }
    }
}

/// Serves requests until the client disconnects (or breaks the protocol) or `shutdown` is raised; in every case
/// the requests already accepted are executed and answered before this returns.
pub(crate) fn serve(
    export: &dyn Export,
    reader: StreamReader<'_>,
    writer: Stream,
    negotiated: Negotiated,
    settings: Settings,
    shutdown: &AtomicBool,
) -> Result<(), NbdError> {
    debug_assert!(
        settings.max_in_flight_bytes
            >= u64::from(settings.max_request_bytes) + REQUEST_OVERHEAD_BYTES
    );
    let shared = Shared {
        export,
        sink: ReplySink::new(writer),
        budget: InFlightBudget::new(settings.max_in_flight_bytes),
        structured_replies: negotiated.structured_replies,
        limits: Limits {
            size_bytes: export.size_bytes(),
            max_request_bytes: settings.max_request_bytes,
            read_only: export.read_only(),
            structured_replies: negotiated.structured_replies,
            block_status: negotiated.block_status,
        },
        settings,
        shutdown,
        intake: Mutex::new(Intake {
            reader,
            ended: false,
        }),
        read_error: Mutex::new(None),
        // This thread is the first worker.
        started: AtomicUsize::new(1),
        free: AtomicUsize::new(1),
        unanswered: AtomicUsize::new(0),
    };

    thread::scope(|scope| run_worker(&shared, scope));

    let _ = lock(&shared.sink.writer).shutdown(Shutdown::Both);
    if let Some(error) = lock(&shared.read_error).take() {
        return Err(error);
    }
    match shared.sink.take_error() {
        Some(error) => Err(NbdError::SendReply(error)),
        None => Ok(()),
    }
}

fn cost_of(header: &RequestHeader) -> u64 {
    match header.kind {
        CMD_READ | CMD_WRITE => REQUEST_OVERHEAD_BYTES + u64::from(header.length_bytes),
        _ => REQUEST_OVERHEAD_BYTES,
    }
}

/// Starts one more worker unless the pool is at its limit. The new worker counts as free from the start, so
/// two workers taking requests at once do not both start one for the same gap.
fn grow<'scope, 'env>(shared: &'env Shared<'_, '_>, scope: &'scope thread::Scope<'scope, 'env>) {
    let limit = shared.settings.workers.max(1);
    let claimed = shared
        .started
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        });
    let Ok(index) = claimed else {
        return;
    };
    shared.free.fetch_add(1, Ordering::AcqRel);
    let spawned = thread::Builder::new()
        .name(format!("nbd-worker-{index}"))
        .spawn_scoped(scope, move || run_worker(shared, scope));
    if let Err(error) = spawned {
        // Fewer workers only cost concurrency: the ones running go on serving.
        shared.free.fetch_sub(1, Ordering::AcqRel);
        shared.started.fetch_sub(1, Ordering::AcqRel);
        log::warn!(
            "NBD: cannot start worker {index}: {}",
            NbdError::SpawnThread(error)
        );
    }
}

/// One worker: take the intake, read the next request, let the intake go, execute, reply; until reading ends.
/// It counts as free (`Shared::free`) except while it executes a request.
fn run_worker<'scope, 'env>(
    shared: &'env Shared<'_, '_>,
    scope: &'scope thread::Scope<'scope, 'env>,
) {
    let mut read_buffer = AlignedBuffer::default();
    let mut payload_buffer = AlignedBuffer::default();
    loop {
        let (job, none_free) = {
            let mut intake = lock(&shared.intake);
            if intake.ended {
                return;
            }
            match next_request(&mut intake.reader, shared, &mut payload_buffer) {
                // Counted busy before the intake is let go, so the next worker to take it sees the pool as is.
                Ok(Some(mut job)) => {
                    let mut behind = Behind::NotLooked;
                    if let Err(ending) = merge_following_writes(
                        &mut intake.reader,
                        shared,
                        &mut payload_buffer,
                        &mut job,
                        &mut behind,
                    ) {
                        // Reading ended inside a merged request: what was merged before it is served.
                        shared.end_intake(&mut intake, ending);
                    }
                    gather_following_reads(&mut intake.reader, shared, &mut job);
                    tell_following_write(&mut intake.reader, shared, &job, behind);
                    let others_unanswered = shared.unanswered.fetch_add(1, Ordering::AcqRel);
                    if matches!(job.command, Command::Write { .. }) {
                        let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
                        job.answer_early = !shared.export.answers_early_only_when_waited_for()
                            || (others_unanswered == 0
                                && !intake.ended
                                && !intake.reader.peek_arrived(&mut header_bytes));
                    }
                    (job, shared.free.fetch_sub(1, Ordering::AcqRel) == 1)
                }
                Ok(None) => return shared.end_intake(&mut intake, Ok(())),
                Err(error) => return shared.end_intake(&mut intake, Err(error)),
            }
        };
        if job.arriving {
            shared.export.write_arriving(false);
        }
        if none_free {
            // Started outside the intake's lock: the next request need not wait for a thread to start.
            grow(shared, scope);
        }
        let cost_bytes = job.cost_bytes;
        // The worker counts as free again just before its reply goes out: the client may answer that reply with
        // its next request at once, and the worker holding the intake must not find the pool busy then and start
        // another thread (at queue depth 1 the pool grew by one every few hundred requests, up to the limit).
        let freed = Cell::new(false);
        let answered = Cell::new(false);
        let count_answered = || {
            if !answered.replace(true) {
                shared.unanswered.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let free_again = || {
            count_answered();
            if !freed.replace(true) {
                shared.free.fetch_add(1, Ordering::AcqRel);
            }
        };
        if !shared.sink.is_broken() {
            // An export that panics fails its request with EIO instead of taking the connection (and the
            // process) down; the buffers are dropped in case they were left half-filled.
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                execute(
                    shared,
                    &job,
                    &mut read_buffer,
                    &mut payload_buffer,
                    &free_again,
                    &count_answered,
                )
            }));
            if outcome.is_err() {
                log::error!("NBD export panicked while serving a request; answering EIO");
                read_buffer = AlignedBuffer::default();
                payload_buffer = AlignedBuffer::default();
                for handle in job.handles() {
                    shared.send_error(handle, ErrorCode::Io, "the export panicked");
                }
            }
        }
        shared.budget.release(cost_bytes);
        read_buffer.trim();
        payload_buffer.trim();
        free_again(); // no reply was sent (the reply side broke, or the export panicked)
    }
}

/// Reads requests off the socket until one is accepted (bad ones are refused with their error reply here).
/// `Ok(None)`: reading ended cleanly (disconnect, shutdown, the reply side broke). A WRITE's payload is left in
/// `payload_buffer`.
fn next_request(
    reader: &mut StreamReader<'_>,
    shared: &Shared<'_, '_>,
    payload_buffer: &mut AlignedBuffer,
) -> Result<Option<Job>, NbdError> {
    let give_up = || shared.shutdown.load(Ordering::Relaxed) || shared.sink.is_broken();
    let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
    loop {
        if shared.sink.is_broken() {
            return Ok(None); // the send error is reported by the caller
        }
        match reader.read_exact(&mut header_bytes) {
            Ok(()) => {}
            Err(ReadFailure::Closed { at_boundary: true }) | Err(ReadFailure::ShuttingDown) => {
                return Ok(None)
            }
            Err(failure) => return ended_by(failure, shared),
        }
        let header =
            parse_header(&header_bytes).map_err(|magic| NbdError::RequestMagic { magic })?;
        let verdict = validate(&header, &shared.limits);
        if header.kind != CMD_WRITE {
            match verdict {
                Ok(Command::Disconnect) => return Ok(None),
                Ok(command) => {
                    let cost_bytes = cost_of(&header);
                    if !shared.budget.acquire(cost_bytes, give_up) {
                        return Ok(None);
                    }
                    return Ok(Some(Job {
                        handle: header.handle,
                        merged_handles: Vec::new(),
                        gathered_reads: Vec::new(),
                        command,
                        cost_bytes,
                        answer_early: false,
                        arriving: false,
                    }));
                }
                Err(code) => {
                    shared.send_error(header.handle, code, &refusal_message(&header, code))
                }
            }
            continue;
        }

        // A WRITE: its payload follows the header whatever the verdict, and must leave the socket.
        let length_bytes = header.length_bytes;
        match verdict {
            Ok(command) => {
                let cost_bytes = cost_of(&header);
                if !shared.budget.acquire(cost_bytes, give_up) {
                    return Ok(None);
                }
                let payload = payload_buffer.get(Some(shared.export), length_bytes as usize);
                shared.export.write_arriving(true);
                if let Err(failure) = reader.read_exact(payload) {
                    shared.export.write_arriving(false);
                    shared.budget.release(cost_bytes);
                    return match failure {
                        ReadFailure::ShuttingDown => Ok(None),
                        ReadFailure::Closed { .. } => {
                            ended_by(ReadFailure::Closed { at_boundary: false }, shared)
                        }
                        other => ended_by(other, shared),
                    };
                }
                return Ok(Some(Job {
                    handle: header.handle,
                    merged_handles: Vec::new(),
                    gathered_reads: Vec::new(),
                    command,
                    cost_bytes,
                    answer_early: false,
                    arriving: true,
                }));
            }
            Err(code) => {
                if u64::from(length_bytes) > shared.settings.discard_limit_bytes {
                    return Err(NbdError::WritePayloadTooLarge { length_bytes });
                }
                match reader.discard(u64::from(length_bytes)) {
                    Ok(()) => {
                        shared.send_error(header.handle, code, &refusal_message(&header, code))
                    }
                    Err(ReadFailure::ShuttingDown) => return Ok(None),
                    Err(failure) => return ended_by(failure, shared),
                }
            }
        }
    }
}

/// Merges into `job`, a WRITE just read, the WRITEs that continue it and have already arrived (header in the
/// socket), with the same flags, up to `Settings::merge_write_bytes` in all: their payloads follow the first in
/// `payload_buffer`, and the export gets one write. A client writing sequentially in pieces smaller than a stripe
/// (FUSE sends at most 128 KiB; fio and qemu send what they are given) then costs one stripe write instead of
/// several partial ones that must find each other, and one wake-up instead of one per piece. Requests are
/// independent in NBD (the client orders them by waiting for replies), so serving them together changes nothing
/// they may observe; each still gets its own reply, and an error fails every merged one (each covers part of the
/// range the export reports failed). Stops at the first request that does not qualify or has not arrived, or
/// when the in-flight budget is used up: it never waits. `Err`: reading ended inside a merged request (with the
/// error, if it was one); `job` holds what was merged before it. `behind`: what it saw behind the last request it
/// took, where it looked.
fn merge_following_writes(
    reader: &mut StreamReader<'_>,
    shared: &Shared<'_, '_>,
    payload_buffer: &mut AlignedBuffer,
    job: &mut Job,
    behind: &mut Behind,
) -> Result<(), Result<(), NbdError>> {
    let limit_bytes = u64::from(shared.settings.merge_write_bytes);
    let Command::Write {
        offset_bytes,
        length_bytes,
        fua,
    } = &mut job.command
    else {
        return Ok(());
    };
    if *length_bytes == 0 {
        return Ok(());
    }
    let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
    loop {
        let held_bytes = u64::from(*length_bytes);
        if held_bytes >= limit_bytes {
            *behind = Behind::NotLooked;
            return Ok(());
        }
        if !reader.peek_arrived(&mut header_bytes) {
            *behind = Behind::Nothing;
            return Ok(());
        }
        *behind = Behind::Header(header_bytes);
        let Ok(header) = parse_header(&header_bytes) else {
            return Ok(()); // next_request reports it
        };
        let continues = header.kind == CMD_WRITE
            && header.length_bytes > 0
            && header.offset_bytes == *offset_bytes + held_bytes
            && held_bytes + u64::from(header.length_bytes) <= limit_bytes
            && matches!(validate(&header, &shared.limits), Ok(Command::Write { fua: same, .. }) if same == *fua);
        if !continues {
            return Ok(());
        }
        let cost_bytes = cost_of(&header);
        if !shared.budget.try_acquire(cost_bytes) {
            return Ok(());
        }
        let held = held_bytes as usize;
        let merged = held + header.length_bytes as usize;
        let read = reader.read_exact(&mut header_bytes).and_then(|()| {
            let payload =
                payload_buffer.get_keeping(Some(shared.export), held, merged, limit_bytes as usize);
            reader.read_exact(&mut payload[held..])
        });
        if let Err(failure) = read {
            shared.budget.release(cost_bytes);
            // The header looked at was taken and its request cut short: nothing follows `job` now.
            *behind = Behind::Nothing;
            return Err(match failure {
                ReadFailure::ShuttingDown => Ok(()),
                ReadFailure::Closed { .. } => {
                    ended_by(ReadFailure::Closed { at_boundary: false }, shared).map(|_| ())
                }
                other => ended_by(other, shared).map(|_| ()),
            });
        }
        *length_bytes = merged as u32;
        job.cost_bytes += cost_bytes;
        job.merged_handles.push(header.handle);
    }
}

/// What `merge_following_writes` saw behind the request it stopped after.
#[derive(Clone, Copy)]
enum Behind {
    /// It did not look (not a WRITE, or merged up to the limit).
    NotLooked,
    /// Nothing had arrived.
    Nothing,
    /// This header had arrived (and was not merged).
    Header([u8; REQUEST_HEADER_BYTES]),
}

/// Tells the export (`Export::write_follows`) when the request that arrived behind `job`, a WRITE just read, is a
/// WRITE that starts where `job` ends, not FUA: a client streaming writes whose requests could not be merged here
/// (each as long as `Settings::merge_write_bytes` allows). Only what has arrived: it never waits.
fn tell_following_write(
    reader: &mut StreamReader<'_>,
    shared: &Shared<'_, '_>,
    job: &Job,
    behind: Behind,
) {
    let Command::Write {
        offset_bytes,
        length_bytes,
        ..
    } = job.command
    else {
        return;
    };
    if length_bytes == 0 {
        return;
    }
    // Where merging looked already, its look serves (a peek that finds the buffer empty is a system call).
    let header_bytes = match behind {
        Behind::Header(header_bytes) => header_bytes,
        Behind::Nothing => return,
        Behind::NotLooked => {
            let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
            if !reader.peek_arrived(&mut header_bytes) {
                return;
            }
            header_bytes
        }
    };
    let end_bytes = offset_bytes + u64::from(length_bytes);
    let follows = parse_header(&header_bytes).is_ok_and(|header| {
        header.kind == CMD_WRITE
            && header.offset_bytes == end_bytes
            && matches!(
                validate(&header, &shared.limits),
                Ok(Command::Write { fua: false, .. })
            )
    });
    if follows {
        shared.export.write_follows(end_bytes);
    }
}

/// Gathers behind `job`, a READ just read, the READs that have already arrived (header in the socket), up to
/// `Settings::gather_reads` in all: the export serves them in one call (`Export::read_many`), which on drives
/// submits their member reads together, and one worker's wake-up serves them all where each would cost its own.
/// Requests are independent in NBD, so serving them together changes nothing a client may observe; each gets its
/// own reply. Only READs of at most `GATHER_READ_MAX_BYTES`, `GATHER_READS_MAX_TOTAL_BYTES` in all: a large read
/// gains nothing from company, and the first reply waits for the last read. Stops at the first request that does
/// not qualify or has not arrived, or when the in-flight budget is used up: it never waits.
fn gather_following_reads(reader: &mut StreamReader<'_>, shared: &Shared<'_, '_>, job: &mut Job) {
    let gathers = |length_bytes: u32| (1..=GATHER_READ_MAX_BYTES).contains(&length_bytes);
    let Command::Read { length_bytes, .. } = job.command else {
        return;
    };
    if !gathers(length_bytes) {
        return;
    }
    let mut total_bytes = gathered_bytes(length_bytes);
    let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
    while job.gathered_reads.len() + 1 < shared.settings.gather_reads
        && reader.peek_arrived(&mut header_bytes)
    {
        let Ok(header) = parse_header(&header_bytes) else {
            return; // next_request reports it
        };
        let Ok(Command::Read {
            offset_bytes,
            length_bytes,
        }) = validate(&header, &shared.limits)
        else {
            return;
        };
        if header.kind != CMD_READ
            || !gathers(length_bytes)
            || total_bytes + gathered_bytes(length_bytes) > GATHER_READS_MAX_TOTAL_BYTES
        {
            return;
        }
        let cost_bytes = cost_of(&header);
        if !shared.budget.try_acquire(cost_bytes) {
            return;
        }
        if reader.read_exact(&mut header_bytes).is_err() {
            // Peeked whole: only a shutdown ends this read. The gathered READs are served; the intake's next
            // read meets the shutdown.
            shared.budget.release(cost_bytes);
            return;
        }
        total_bytes += gathered_bytes(length_bytes);
        job.cost_bytes += cost_bytes;
        job.gathered_reads.push(GatheredRead {
            handle: header.handle,
            offset_bytes,
            length_bytes,
        });
    }
}

/// A gathered READ's room in the worker's buffer: whole pages, so that each read's data starts page-aligned
/// (an export reading with O_DIRECT fills it in place).
fn gathered_bytes(length_bytes: u32) -> usize {
    (length_bytes as usize).next_multiple_of(BUFFER_ALIGN_BYTES)
}

/// Serves `job`'s READ and those gathered behind it (`gather_following_reads`) in one `Export::read_many`, then
/// sends every reply with data in one system call where the socket takes it, and each failure on its own.
fn execute_gathered_reads(
    shared: &Shared<'_, '_>,
    job: &Job,
    offset_bytes: u64,
    length_bytes: u32,
    read_buffer: &mut AlignedBuffer,
    before_reply: &dyn Fn(),
) {
    let first = GatheredRead {
        handle: job.handle,
        offset_bytes,
        length_bytes,
    };
    let reads: Vec<GatheredRead> = std::iter::once(first)
        .chain(job.gathered_reads.iter().copied())
        .collect();
    let total_bytes: usize = reads.iter().map(|r| gathered_bytes(r.length_bytes)).sum();
    let mut rest = read_buffer.get(None, total_bytes);
    let mut targets: Vec<(u64, &mut [u8])> = Vec::with_capacity(reads.len());
    for read in &reads {
        let (room, tail) =
            std::mem::take(&mut rest).split_at_mut(gathered_bytes(read.length_bytes));
        rest = tail;
        targets.push((read.offset_bytes, &mut room[..read.length_bytes as usize]));
    }
    let results = shared.export.read_many(&mut targets);
    debug_assert_eq!(results.len(), reads.len());
    // Per read served: its place in `reads` and its reply's prefix.
    let mut served: Vec<(usize, [u8; STRUCTURED_REPLY_HEADER_BYTES + 8], usize)> =
        Vec::with_capacity(reads.len());
    let mut failed: Vec<(u64, u64, io::Error)> = Vec::new();
    for (i, (read, result)) in reads.iter().zip(results).enumerate() {
        match result {
            Ok(()) => {
                let (prefix, len) =
                    read_reply_prefix(shared, read.handle, read.offset_bytes, read.length_bytes);
                served.push((i, prefix, len));
            }
            Err(error) => failed.push((read.handle, read.offset_bytes, error)),
        }
    }
    before_reply();
    let parts: Vec<(&[u8], &[u8])> = served
        .iter()
        .map(|(i, prefix, len)| (&prefix[..*len], &*targets[*i].1))
        .collect();
    shared.sink.send_many_parts(&parts);
    for (handle, offset_bytes, error) in failed {
        send_failure(
            shared,
            std::iter::once(handle),
            "read",
            offset_bytes,
            &error,
        );
    }
}

/// The bytes that go before a READ's data in its reply (simple or structured), and how many of them there are.
fn read_reply_prefix(
    shared: &Shared<'_, '_>,
    handle: u64,
    offset_bytes: u64,
    length_bytes: u32,
) -> ([u8; STRUCTURED_REPLY_HEADER_BYTES + 8], usize) {
    let mut prefix = [0u8; STRUCTURED_REPLY_HEADER_BYTES + 8];
    let len = reply::read_prefix_bytes(shared.structured_replies, length_bytes);
    reply::put_read_prefix(
        &mut prefix[..len],
        shared.structured_replies,
        handle,
        offset_bytes,
        length_bytes,
    );
    (prefix, len)
}

/// Answers `handles` with the error of an `action` at `offset_bytes` that failed (logged once).
fn send_failure(
    shared: &Shared<'_, '_>,
    handles: impl Iterator<Item = u64>,
    action: &str,
    offset_bytes: u64,
    error: &io::Error,
) {
    let code = error_code_for(error);
    log::debug!("NBD {action} at offset {offset_bytes} failed: {error} (replying {code})");
    let message = format!("{action} at offset {offset_bytes}: {error}");
    for handle in handles {
        shared.send_error(handle, code, &message);
    }
}

/// A read that failed mid-message. If the reply side broke first, that is the real cause (reported by the
/// caller); otherwise the client vanished or the socket failed.
fn ended_by(failure: ReadFailure, shared: &Shared<'_, '_>) -> Result<Option<Job>, NbdError> {
    if shared.sink.is_broken() {
        return Ok(None);
    }
    Err(NbdError::ReadRequest(failure.into_io()))
}

fn refusal_message(header: &RequestHeader, code: ErrorCode) -> String {
    format!(
        "request type {} flags {:#x} offset {} length {} refused: {code}",
        header.kind, header.flags, header.offset_bytes, header.length_bytes
    )
}

/// Runs one validated request against the export and sends its reply, calling `before_reply` just before the
/// reply goes out (`before_early_reply` before a write's reply sent while the export still writes).
fn execute(
    shared: &Shared<'_, '_>,
    job: &Job,
    read_buffer: &mut AlignedBuffer,
    payload_buffer: &mut AlignedBuffer,
    before_reply: &dyn Fn(),
    before_early_reply: &dyn Fn(),
) {
    let export = shared.export;
    let handle = job.handle;
    let result = match job.command {
        Command::Read {
            offset_bytes,
            length_bytes,
        } if !job.gathered_reads.is_empty() => {
            execute_gathered_reads(
                shared,
                job,
                offset_bytes,
                length_bytes,
                read_buffer,
                before_reply,
            );
            return;
        }
        Command::Read {
            offset_bytes,
            length_bytes,
        } => {
            // Stale bytes from an earlier read are fine: a successful read overwrites all of them, and a failed
            // read sends none of them.
            let data = read_buffer.get(None, length_bytes as usize);
            let result = if data.is_empty() {
                Ok(())
            } else {
                export.read(offset_bytes, data)
            };
            match result {
                Ok(()) => {
                    let (prefix, len) =
                        read_reply_prefix(shared, handle, offset_bytes, length_bytes);
                    before_reply();
                    shared.sink.send_parts(&prefix[..len], data);
                    return;
                }
                Err(error) => Err(("read", offset_bytes, error)),
            }
        }
        Command::Write {
            offset_bytes,
            length_bytes,
            fua,
        } => {
            if length_bytes == 0 {
                Ok(())
            } else if job.merged_handles.is_empty() && job.answer_early {
                // The worker read the payload into this buffer just before (`next_request`). The export may
                // answer before the write is done (`Export::write_answering`): the reply goes out then, and the
                // worker counts as busy until the write returns.
                let payload = payload_buffer.get(Some(shared.export), length_bytes as usize);
                let replied = Cell::new(false);
                let answered = || {
                    if !replied.replace(true) {
                        before_early_reply();
                        shared.sink.send(&reply::success(handle));
                    }
                };
                let result = export.write_answering(offset_bytes, payload, fua, &answered);
                if replied.get() {
                    if let Err(error) = result {
                        log::warn!(
                            "NBD write at offset {offset_bytes}, answered before it was done, failed: {error}"
                        );
                    }
                    return;
                }
                result.map_err(|e| ("write", offset_bytes, e))
            } else {
                let payload = payload_buffer.get(Some(shared.export), length_bytes as usize);
                export
                    .write(offset_bytes, payload, fua)
                    .map_err(|e| ("write", offset_bytes, e))
            }
        }
        Command::Flush => export.flush().map_err(|e| ("flush", 0, e)),
        Command::Trim {
            offset_bytes,
            length_bytes,
            fua,
        } => trim(export, offset_bytes, length_bytes, fua),
        Command::WriteZeroes {
            offset_bytes,
            length_bytes,
            fua,
        } => {
            if length_bytes == 0 {
                Ok(())
            } else {
                export
                    .write_zeroes(offset_bytes, u64::from(length_bytes), fua)
                    .map_err(|e| ("write zeroes", offset_bytes, e))
            }
        }
        Command::BlockStatus {
            offset_bytes,
            length_bytes,
            req_one,
        } => match block_status(export, offset_bytes, length_bytes, req_one) {
            Ok(descriptors) => {
                before_reply();
                shared.sink.send(&reply::block_status(
                    handle,
                    ALLOCATION_CONTEXT_ID,
                    &descriptors,
                ));
                return;
            }
            Err(error) => Err(("block status", offset_bytes, error)),
        },
        Command::Disconnect => {
            debug_assert!(false, "the reader handles NBD_CMD_DISC itself");
            Ok(())
        }
    };
    before_reply();
    match result {
        Ok(()) if job.merged_handles.is_empty() => shared.sink.send(&reply::success(handle)),
        Ok(()) => {
            // Merged writes: every reply in one send.
            let replies: Vec<u8> = job.handles().flat_map(reply::success).collect();
            shared.sink.send(&replies);
        }
        Err((action, offset_bytes, error)) => {
            send_failure(shared, job.handles(), action, offset_bytes, &error)
        }
    }
}

/// The export's allocation of the range as "base:allocation" descriptors: at least one, none past the range (the
/// export promises both; an export that breaks the promise gets EIO, never a reply that misleads the client),
/// adjacent ones of equal flags merged, only the first with `req_one`.
fn block_status(
    export: &dyn Export,
    offset_bytes: u64,
    length_bytes: u32,
    req_one: bool,
) -> io::Result<Vec<(u32, u32)>> {
    let extents = export.allocation(offset_bytes, u64::from(length_bytes))?;
    let mut descriptors: Vec<(u32, u32)> = Vec::with_capacity(extents.len());
    let mut described = 0u64;
    for extent in extents {
        described += extent.len_bytes;
        if extent.len_bytes == 0 || described > u64::from(length_bytes) {
            return Err(io::Error::other(format!(
                "the export described {described} bytes for a block status request of {length_bytes}, \
                 or an empty extent"
            )));
        }
        let flags =
            if extent.hole { STATE_HOLE } else { 0 } | if extent.zero { STATE_ZERO } else { 0 };
        match descriptors.last_mut() {
            Some((len, last_flags)) if *last_flags == flags => *len += extent.len_bytes as u32,
            _ => descriptors.push((extent.len_bytes as u32, flags)),
        }
    }
    if descriptors.is_empty() {
        return Err(io::Error::other("the export described no extent"));
    }
    if req_one {
        descriptors.truncate(1);
    }
    Ok(descriptors)
}

/// TRIM is only a hint: an export that cannot discard has done all it was asked. With FUA, whatever the trim
/// changed is flushed before the reply.
fn trim(
    export: &dyn Export,
    offset_bytes: u64,
    length_bytes: u32,
    fua: bool,
) -> Result<(), (&'static str, u64, io::Error)> {
    if length_bytes == 0 {
        return Ok(());
    }
    match export.trim(offset_bytes, u64::from(length_bytes)) {
        Ok(()) => {}
        Err(error) if error_code_for(&error) == ErrorCode::NotSup => return Ok(()),
        Err(error) => return Err(("trim", offset_bytes, error)),
    }
    if fua {
        export
            .flush()
            .map_err(|e| ("flush after trim", offset_bytes, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn budget_blocks_until_released_and_gives_up_on_request() {
        let budget = Arc::new(InFlightBudget::new(10_000));
        assert!(budget.acquire(6_000, || false));
        let started = Instant::now();
        assert!(!budget.acquire(6_000, || started.elapsed() > Duration::from_millis(150)));
        let releaser = {
            let budget = budget.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                budget.release(6_000);
            })
        };
        assert!(budget.acquire(6_000, || false));
        releaser.join().unwrap();
        assert_eq!(lock(&budget.state).used_bytes, 6_000);
    }
}
