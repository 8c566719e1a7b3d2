//! The transmission phase of one connection: a reader (the connection's own thread) parses and validates
//! requests, a pool of scoped worker threads executes them against the export, and every reply goes out whole
//! through one mutex-protected writer. A byte budget bounds what is in flight (queued or executing), so a client
//! pipelining large writes cannot make the server buffer without limit.

use std::io::{self, Write};
use std::net::Shutdown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread;

use crate::error::NbdError;
use crate::export::{error_code_for, Export};
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::reply;
use crate::request::{parse_header, validate, Command, Limits, RequestHeader};
use crate::stream::{ReadFailure, Stream, StreamReader, SHUTDOWN_POLL};

/// Every request counts at least this much against the in-flight budget, so the number of queued requests is
/// bounded too, not only their payload bytes.
pub(crate) const REQUEST_OVERHEAD_BYTES: u64 = 4096;

/// Workers keep their read buffer between requests up to this size; larger ones are freed after use.
const KEEP_READ_BUFFER_BYTES: usize = 1 << 20;

/// Per-connection limits (already normalized by the server).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub workers: usize,
    pub max_request_bytes: u32,
    pub max_in_flight_bytes: u64,
    /// A refused WRITE whose payload is at most this long is read and dropped (the connection survives); a
    /// longer one ends the connection, since reading it would let a client make the server swallow gigabytes.
    pub discard_limit_bytes: u64,
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
    used_bytes: Mutex<u64>,
    released: Condvar,
}

impl InFlightBudget {
    fn new(limit_bytes: u64) -> Self {
        InFlightBudget {
            limit_bytes,
            used_bytes: Mutex::new(0),
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
        let mut used = lock(&self.used_bytes);
        while *used + cost_bytes > self.limit_bytes {
            if give_up() {
                return false;
            }
            used = self
                .released
                .wait_timeout(used, SHUTDOWN_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *used += cost_bytes;
        true
    }

    fn release(&self, cost_bytes: u64) {
        let mut used = lock(&self.used_bytes);
        debug_assert!(*used >= cost_bytes);
        *used -= cost_bytes;
        self.released.notify_all();
    }
}

/// The write side of the connection. A reply is written whole under the lock, so replies never interleave.
struct ReplySink {
    writer: Mutex<Stream>,
    broken: AtomicBool,
    first_error: Mutex<Option<io::Error>>,
}

impl ReplySink {
    fn send(&self, bytes: &[u8]) {
        if self.is_broken() {
            return;
        }
        let mut writer = lock(&self.writer);
        if let Err(error) = writer.write_all(bytes) {
            // The client is gone or stalled past the write timeout. Shutting the socket down also wakes the
            // reader, which then ends the connection.
            self.broken.store(true, Ordering::Relaxed);
            let _ = writer.shutdown(Shutdown::Both);
            lock(&self.first_error).get_or_insert(error);
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    fn take_error(&self) -> Option<io::Error> {
        lock(&self.first_error).take()
    }
}

struct Job {
    handle: u64,
    command: Command,
    /// WRITE data (empty for other commands).
    payload: Vec<u8>,
    cost_bytes: u64,
}

/// Everything the reader and the workers share.
struct Shared<'a> {
    export: &'a dyn Export,
    sink: ReplySink,
    budget: InFlightBudget,
    structured_replies: bool,
}

impl Shared<'_> {
    fn send_error(&self, handle: u64, code: ErrorCode, message: &str) {
        self.sink.send(&reply::error(
            self.structured_replies,
            handle,
            code,
            message,
        ));
    }
}

/// Serves requests until the client disconnects (or breaks the protocol) or `shutdown` is raised; in every case
/// the requests already accepted are executed and answered before this returns.
pub(crate) fn serve(
    export: &dyn Export,
    mut reader: StreamReader<'_>,
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
        sink: ReplySink {
            writer: Mutex::new(writer),
            broken: AtomicBool::new(false),
            first_error: Mutex::new(None),
        },
        budget: InFlightBudget::new(settings.max_in_flight_bytes),
        structured_replies: negotiated.structured_replies,
    };
    let limits = Limits {
        size_bytes: export.size_bytes(),
        max_request_bytes: settings.max_request_bytes,
        read_only: export.read_only(),
        structured_replies: negotiated.structured_replies,
    };
    let (jobs, queue) = channel::<Job>();
    let queue = Mutex::new(queue);

    let read_result = thread::scope(|scope| {
        for index in 0..settings.workers.max(1) {
            let spawned = thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn_scoped(scope, || run_worker(&shared, &queue));
            if let Err(error) = spawned {
                // Dropping the sender lets the workers already started finish and exit.
                drop(jobs);
                return Err(NbdError::SpawnThread(error));
            }
        }
        // `jobs` is moved in here and dropped when reading ends, which lets the workers drain and exit.
        read_requests(&mut reader, jobs, &shared, &limits, &settings, shutdown)
    });

    let _ = lock(&shared.sink.writer).shutdown(Shutdown::Both);
    read_result?;
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

/// The reader: one request at a time off the socket, validated, then queued for the workers (or refused with
/// its error reply right here).
fn read_requests(
    reader: &mut StreamReader<'_>,
    jobs: Sender<Job>,
    shared: &Shared<'_>,
    limits: &Limits,
    settings: &Settings,
    shutdown: &AtomicBool,
) -> Result<(), NbdError> {
    let give_up = || shutdown.load(Ordering::Relaxed) || shared.sink.is_broken();
    let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
    loop {
        if shared.sink.is_broken() {
            return Ok(()); // the send error is reported by the caller
        }
        match reader.read_exact(&mut header_bytes) {
            Ok(()) => {}
            Err(ReadFailure::Closed { at_boundary: true }) | Err(ReadFailure::ShuttingDown) => {
                return Ok(())
            }
            Err(failure) => return ended_by(failure, shared),
        }
        let header =
            parse_header(&header_bytes).map_err(|magic| NbdError::RequestMagic { magic })?;
        let verdict = validate(&header, limits);
        if header.kind != CMD_WRITE {
            match verdict {
                Ok(Command::Disconnect) => return Ok(()),
                Ok(command) => {
                    let cost_bytes = cost_of(&header);
                    if !shared.budget.acquire(cost_bytes, give_up) {
                        return Ok(());
                    }
                    let job = Job {
                        handle: header.handle,
                        command,
                        payload: Vec::new(),
                        cost_bytes,
                    };
                    if jobs.send(job).is_err() {
                        shared.budget.release(cost_bytes);
                        return Ok(()); // no worker left (cannot happen while `jobs` lives, but never hang)
                    }
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
                    return Ok(());
                }
                let mut payload = vec![0u8; length_bytes as usize];
                if let Err(failure) = reader.read_exact(&mut payload) {
                    shared.budget.release(cost_bytes);
                    return match failure {
                        ReadFailure::ShuttingDown => Ok(()),
                        ReadFailure::Closed { .. } => {
                            ended_by(ReadFailure::Closed { at_boundary: false }, shared)
                        }
                        other => ended_by(other, shared),
                    };
                }
                let job = Job {
                    handle: header.handle,
                    command,
                    payload,
                    cost_bytes,
                };
                if jobs.send(job).is_err() {
                    shared.budget.release(cost_bytes);
                    return Ok(());
                }
            }
            Err(code) => {
                if u64::from(length_bytes) > settings.discard_limit_bytes {
                    return Err(NbdError::WritePayloadTooLarge { length_bytes });
                }
                match reader.discard(u64::from(length_bytes)) {
                    Ok(()) => {
                        shared.send_error(header.handle, code, &refusal_message(&header, code))
                    }
                    Err(ReadFailure::ShuttingDown) => return Ok(()),
                    Err(failure) => return ended_by(failure, shared),
                }
            }
        }
    }
}

/// A read that failed mid-message. If the reply side broke first, that is the real cause (reported by the
/// caller); otherwise the client vanished or the socket failed.
fn ended_by(failure: ReadFailure, shared: &Shared<'_>) -> Result<(), NbdError> {
    if shared.sink.is_broken() {
        return Ok(());
    }
    Err(NbdError::ReadRequest(failure.into_io()))
}

fn refusal_message(header: &RequestHeader, code: ErrorCode) -> String {
    format!(
        "request type {} flags {:#x} offset {} length {} refused: {code}",
        header.kind, header.flags, header.offset_bytes, header.length_bytes
    )
}

fn run_worker(shared: &Shared<'_>, queue: &Mutex<Receiver<Job>>) {
    let mut read_buffer = Vec::new();
    loop {
        let received = lock(queue).recv();
        let Ok(job) = received else {
            return; // the reader ended and the queue is drained
        };
        let handle = job.handle;
        let cost_bytes = job.cost_bytes;
        if !shared.sink.is_broken() {
            // An export that panics fails its request with EIO instead of taking the connection (and the
            // process) down; the buffer is dropped in case it was left half-filled.
            let outcome = catch_unwind(AssertUnwindSafe(|| execute(shared, job, &mut read_buffer)));
            if outcome.is_err() {
                log::error!("NBD export panicked while serving a request; answering EIO");
                read_buffer = Vec::new();
                shared.send_error(handle, ErrorCode::Io, "the export panicked");
            }
        }
        shared.budget.release(cost_bytes);
    }
}

/// Runs one validated request against the export and sends its reply.
fn execute(shared: &Shared<'_>, job: Job, read_buffer: &mut Vec<u8>) {
    let export = shared.export;
    let handle = job.handle;
    let result = match job.command {
        Command::Read {
            offset_bytes,
            length_bytes,
        } => {
            let prefix_bytes = reply::read_prefix_bytes(shared.structured_replies);
            let total_bytes = prefix_bytes + length_bytes as usize;
            // Stale bytes from an earlier read are fine: a successful read overwrites all of them, and a failed
            // read sends none of them.
            // A fresh large buffer comes zeroed from the allocator (no memset of pages the read overwrites anyway).
            if read_buffer.capacity() < total_bytes {
                *read_buffer = vec![0u8; total_bytes];
            } else {
                read_buffer.resize(total_bytes, 0);
            }
            let (prefix, data) = read_buffer.split_at_mut(prefix_bytes);
            let result = if data.is_empty() {
                Ok(())
            } else {
                export.read(offset_bytes, data)
            };
            if result.is_ok() {
                reply::put_read_prefix(
                    prefix,
                    shared.structured_replies,
                    handle,
                    offset_bytes,
                    length_bytes,
                );
                shared.sink.send(read_buffer);
            }
            if read_buffer.capacity() > KEEP_READ_BUFFER_BYTES {
                *read_buffer = Vec::new();
            }
            match result {
                Ok(()) => return,
                Err(error) => Err(("read", offset_bytes, error)),
            }
        }
        Command::Write {
            offset_bytes,
            length_bytes,
            fua,
        } => {
            debug_assert_eq!(job.payload.len(), length_bytes as usize);
            if job.payload.is_empty() {
                Ok(())
            } else {
                export
                    .write(offset_bytes, &job.payload, fua)
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
        Command::Disconnect => {
            debug_assert!(false, "the reader handles NBD_CMD_DISC itself");
            Ok(())
        }
    };
    match result {
        Ok(()) => shared.sink.send(&reply::success(handle)),
        Err((action, offset_bytes, error)) => {
            let code = error_code_for(&error);
            log::debug!("NBD {action} at offset {offset_bytes} failed: {error} (replying {code})");
            shared.send_error(
                handle,
                code,
                &format!("{action} at offset {offset_bytes}: {error}"),
            );
        }
    }
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
        assert_eq!(*lock(&budget.used_bytes), 6_000);
    }
}
