//! Real members driven by one io_uring per thread (files and devices opened and claimed in `file.rs`); members in
//! memory (tmpfs) on the calling thread.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use io_uring::{opcode, types, IoUring};

use super::file::{already_a_member, identify, MemberFile, MemberKind};
use super::{check_alignment, unsupported_kind, vectored, IoOp, IoReq, MemberIo, NewMember};
use crate::layout::MAX_MEMBERS;

/// Entries of each thread's ring; a batch larger than this is fed through it in turns.
const RING_ENTRIES: u32 = 256;
/// Largest single read/write handed to the kernel (the SQE length is 32 bits).
const MAX_OP_BYTES: u64 = 1 << 30;

/// The members at one moment: a batch uses one snapshot from start to end, so a member detached meanwhile stays
/// open until the batch is done with it.
type Snapshot = Arc<Vec<Option<Arc<MemberFile>>>>;

/// Members opened from paths; `None` slots are missing members.
pub struct UringMembers {
    members: RwLock<Snapshot>,
}

impl UringMembers {
    pub fn new(members: Vec<Option<MemberFile>>) -> UringMembers {
        UringMembers {
            members: RwLock::new(Arc::new(
                members.into_iter().map(|m| m.map(Arc::new)).collect(),
            )),
        }
    }

    fn snapshot(&self) -> Snapshot {
        self.members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn member(&self, slot: usize) -> Option<Arc<MemberFile>> {
        self.snapshot().get(slot).and_then(|m| m.clone())
    }

    /// Replaces the member table by `change` applied to a copy of it.
    fn change<R>(&self, change: impl FnOnce(&mut Vec<Option<Arc<MemberFile>>>) -> R) -> R {
        let mut guard = self.members.write().unwrap_or_else(|e| e.into_inner());
        let mut table: Vec<Option<Arc<MemberFile>>> = guard.as_ref().clone();
        let result = change(&mut table);
        *guard = Arc::new(table);
        result
    }
}

/// The member's descriptor as the ring names it.
fn ring_fd(member: &MemberFile) -> types::Fd {
    types::Fd(member.file.as_raw_fd())
}

fn member_of(snapshot: &Snapshot, slot: usize) -> Option<&MemberFile> {
    snapshot.get(slot).and_then(|m| m.as_deref())
}

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

fn is_transient(errno: i32) -> bool {
    errno == libc::EAGAIN || errno == libc::EINTR
}

impl MemberIo for UringMembers {
    fn slots(&self) -> usize {
        self.snapshot().len()
    }

    fn label(&self, slot: usize) -> String {
        match self.member(slot) {
            Some(m) => m.path.display().to_string(),
            None => format!("<missing slot {slot}>"),
        }
    }

    fn present(&self, slot: usize) -> bool {
        self.member(slot).is_some()
    }

    fn size_bytes(&self, slot: usize) -> u64 {
        self.member(slot).map_or(0, |m| m.size_bytes)
    }

    fn discard_deallocates(&self, slot: usize) -> bool {
        self.member(slot).is_some_and(|m| m.discard_deallocates)
    }

    fn hole_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        self.member(slot)
            .map_or(0, |m| m.hole_bytes(offset_bytes, len_bytes))
    }

    fn data_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        self.member(slot)
            .map_or(len_bytes, |m| m.data_bytes(offset_bytes, len_bytes))
    }

    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        let members = self.snapshot();
        // Flushes with nothing to make durable complete at once (`FlushState`); the others are marked started.
        let mut flushing: Vec<usize> = Vec::new();
        let mut skipped: Vec<usize> = Vec::new();
        for (i, req) in reqs.iter_mut().enumerate() {
            if let (IoOp::Flush, Some(member)) = (&req.op, member_of(&members, req.slot)) {
                if member.begin_flush() {
                    flushing.push(i);
                } else {
                    req.result = Ok(());
                    skipped.push(i);
                }
            }
        }
        run_batch(&members, reqs, &skipped);
        // Before the caller sees any of them complete: what they leave to make durable (once per member, not per
        // request: a window writes hundreds of pieces to each), and the flushes done.
        let mut dirty_slots = 0u64;
        for (i, req) in reqs.iter().enumerate() {
            let Some(member) = member_of(&members, req.slot) else {
                continue;
            };
            let dirties = match &req.op {
                IoOp::Write { fua: false, .. } | IoOp::Discard { .. } => true,
                // A FUA write is durable when it completes, unless it failed partway.
                IoOp::Write { fua: true, .. } => req.result.is_err(),
                IoOp::Flush if flushing.contains(&i) => {
                    member.end_flush(req.result.is_ok());
                    false
                }
                _ => false,
            };
            match (dirties, req.slot < 64) {
                (true, true) => dirty_slots |= 1 << req.slot,
                (true, false) => member.note_dirty(),
                _ => {}
            }
        }
        while dirty_slots != 0 {
            let slot = dirty_slots.trailing_zeros() as usize;
            dirty_slots &= dirty_slots - 1;
            if let Some(member) = member_of(&members, slot) {
                member.note_dirty();
            }
        }
    }

    fn attach(&self, slot: usize, member: &NewMember) -> io::Result<()> {
        let NewMember::Path(path) = member else {
            return Err(unsupported_kind(member, "file and device"));
        };
        if slot >= MAX_MEMBERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no slot {slot}"),
            ));
        }
        // A member of this array given again is named as such before opening it would find it claimed.
        if let Ok((_, identity)) = identify(path) {
            if let Some(other) = self
                .snapshot()
                .iter()
                .flatten()
                .find(|m| m.identity == identity)
            {
                return Err(already_a_member(path, &other.path));
            }
        }
        let file = Arc::new(MemberFile::open(path)?);
        self.change(|table| {
            if let Some(other) = table.iter().flatten().find(|m| m.identity == file.identity) {
                return Err(already_a_member(path, &other.path));
            }
            if table.len() <= slot {
                table.resize(slot + 1, None);
            }
            if table[slot].is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("slot {slot} is taken"),
                ));
            }
            table[slot] = Some(file);
            Ok(())
        })
    }

    fn detach(&self, slot: usize) -> bool {
        self.change(|table| table.get_mut(slot).and_then(|m| m.take()).is_some())
    }

    fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        self.change(|table| {
            if table.len() <= to {
                table.resize(to + 1, None);
            }
            let ok =
                from != to && table.get(from).is_some_and(|m| m.is_some()) && table[to].is_none();
            if !ok {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("cannot move slot {from} to {to}: source empty or target taken"),
                ));
            }
            table[to] = table[from].take();
            Ok(())
        })
    }
}

/// Runs the requests of a batch but those at `skipped` (complete already): on the ring where that pays, inline
/// where it does not.
fn run_batch(members: &Snapshot, reqs: &mut [IoReq<'_>], skipped: &[usize]) {
    // A lone request gains nothing from the ring (the thread waits for it either way) and costs a ring round
    // trip more than a plain system call.
    let lone = reqs.len() == 1;
    // Requests the ring does not take (missing members, misaligned I/O, block discards, lone requests,
    // memory-backed members) finish here.
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut block_zeroing: Vec<usize> = Vec::new();
    // Requests on members in memory that may be joined into vectored calls (`run_in_memory`); in a batch with
    // one request per member (a small write's reads or writes) each runs at once, as a lone one does.
    let mut in_memory: Vec<usize> = Vec::new();
    let joinable = vectored::may_join(reqs);
    for (i, req) in reqs.iter_mut().enumerate() {
        if skipped.contains(&i) {
            continue;
        }
        let Some(member) = member_of(members, req.slot) else {
            req.result = Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {} is missing", req.slot),
            ));
            continue;
        };
        if let Err(e) = check_alignment(&req.op) {
            req.result = Err(e);
            continue;
        }
        match req.op {
            IoOp::Discard { .. } if member.kind == MemberKind::Block => block_zeroing.push(i),
            _ if lone || (member.memory_backed && !joinable) => run_timed(member, req),
            _ if member.memory_backed => in_memory.push(i),
            _ => queue.push_back(i),
        }
    }
    run_in_memory(members, reqs, &in_memory);
    zero_block_ranges(members, reqs, &block_zeroing);
    if queue.is_empty() {
        return;
    }
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            match new_ring() {
                Ok(ring) => *slot = Some(ring),
                Err(e) => {
                    for &i in &queue {
                        reqs[i].result =
                            Err(io::Error::new(e.kind(), format!("io_uring setup: {e}")));
                    }
                    return;
                }
            }
        }
        let ring = slot.as_mut().expect("ring just created");
        drive(members, ring, reqs, queue);
    });
}

/// A ring for this thread alone. The work that completes its requests runs when the thread waits for them
/// (`DEFER_TASKRUN`, Linux 6.1+, which needs `SINGLE_ISSUER`: one thread submits), and wakes it only once as
/// many are done as it waits for (`drive`: all of a batch of writes); on a plain ring each completion's
/// interrupt queues work that wakes the thread, whatever it waits for. Every request submitted here is waited for
/// before `drive` returns, as deferred work needs. A kernel without them gets a plain ring.
fn new_ring() -> io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES)
        .or_else(|_| IoUring::new(RING_ENTRIES))
}

/// One batch in this many that could be waited for together (`waits_together`) is timed request by request all
/// the same, on each thread: the slow-member watch keeps a sample of every member's writes, taken as before.
const TIMED_WRITE_BATCH_EVERY: u32 = 8;

thread_local! {
    /// Batches this thread could have waited for together so far (`waits_together`).
    static WRITE_BATCHES: Cell<u32> = const { Cell::new(0) };
}

/// Whether `drive` waits for the requests at `queue` together rather than one completion at a time: a batch of
/// three or more with no read in it (`is_write_batch`), but one in `TIMED_WRITE_BATCH_EVERY` on each thread.
/// Its thread is then woken once for the batch instead of about once per request (a 1 MiB RAID6 write is seven or
/// more member writes; on a plain ring each completion wakes it whatever it waits for, hence `new_ring`).
///
/// Its requests carry no time (`IoReq::timed`): each would be the time of the batch's last completion, and a
/// peer's time counted as a healthy member's raises the averages a slow member is measured against (array/slow.rs;
/// stop 60's rings stamped a batch's requests with its next-to-last completion, and the VM's slow member was found
/// later). The batches timed one by one keep every member's write averages fed with its own times, unbiased: a
/// slow member is still found under writes alone (timing only the last of each batch, which is the slow member's,
/// would leave the peers' averages unfed, and a member found slow against peers' averages from before a burst).
/// Reads, which a slow member makes clients wait for and which steering measures, are always timed one by one.
fn waits_together(reqs: &[IoReq<'_>], queue: &VecDeque<usize>) -> bool {
    is_write_batch(reqs, queue)
        && WRITE_BATCHES.with(|count| {
            let n = count.get().wrapping_add(1);
            count.set(n);
            !n.is_multiple_of(TIMED_WRITE_BATCH_EVERY)
        })
}

/// Three or more requests queued for the ring, none of them a read (a stripe's member writes, a flush of every
/// member): what `drive` may wait for together.
fn is_write_batch(reqs: &[IoReq<'_>], queue: &VecDeque<usize>) -> bool {
    queue.len() >= 3
        && queue
            .iter()
            .all(|&i| !matches!(reqs[i].op, IoOp::Read { .. }))
}

/// Runs the requests at `indices` (on members in memory) on this thread, those that continue one another on a
/// member as one vectored call (`vectored`), and the rest one by one.
fn run_in_memory(members: &Snapshot, reqs: &mut [IoReq<'_>], indices: &[usize]) {
    for run in vectored::runs(reqs, indices) {
        let member = member_of(members, reqs[run[0]].slot).expect("present: checked by run_batch");
        if run.len() >= 2 && vectored::run_joined(&member.file, reqs, &run).is_ok() {
            for &i in &run {
                reqs[i].result = Ok(());
                reqs[i].latency_ns = 0; // in memory: see `run_timed`
            }
            continue;
        }
        for &i in &run {
            run_timed(member, &mut reqs[i]);
        }
    }
}

/// Runs `req` on this thread (`run_inline`), its latency measured, except on a member in memory: there the time
/// is this thread's copy and whatever preempted it, not a device's, and it reports 0 as `MemMembers` does
/// (`IoReq::latency_ns`). Measured, a busy machine made a tmpfs member "slow" at a 1 ms average or at one read of
/// 1.6 ms against its peers' 0.001 ms, and RAID6 then solved that member's chunks from five others: random 4 KiB
/// reads over NBD fell from 223-249k to 159-181k IOPS in six runs of fourteen (stop 63).
fn run_timed(member: &MemberFile, req: &mut IoReq<'_>) {
    if member.memory_backed {
        req.result = run_inline(member, &mut req.op);
        req.latency_ns = 0;
        return;
    }
    let started = Instant::now();
    req.result = run_inline(member, &mut req.op);
    req.latency_ns = started.elapsed().as_nanos() as u64;
}

/// Runs the block-device discards at `indices` (ioctls, synchronous), one thread per request when there are
/// several: zeroing whole devices at create time takes as long as the slowest member, not their sum.
fn zero_block_ranges(members: &Snapshot, reqs: &mut [IoReq<'_>], indices: &[usize]) {
    let run = |req: &IoReq<'_>| match (member_of(members, req.slot), &req.op) {
        (
            Some(member),
            IoOp::Discard {
                offset_bytes,
                len_bytes,
            },
        ) => member.zero_block_range(*offset_bytes, *len_bytes),
        _ => Err(io::Error::other("not a block discard")),
    };
    if indices.len() == 1 {
        let req = &mut reqs[indices[0]];
        req.result = run(req);
        return;
    }
    let results: Vec<io::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = indices
            .iter()
            .map(|&i| {
                let req = &reqs[i];
                scope.spawn(move || run(req))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("zeroing thread panicked")))
            })
            .collect()
    });
    for (&i, result) in indices.iter().zip(results) {
        reqs[i].result = result;
    }
}

/// Runs one request with plain system calls on this thread (what the ring would do, without the ring).
fn run_inline(member: &MemberFile, op: &mut IoOp<'_>) -> io::Result<()> {
    match op {
        IoOp::Read { offset_bytes, buf } => {
            member
                .file
                .read_exact_at(buf, *offset_bytes)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end of the member",
                    ),
                    _ => e,
                })
        }
        IoOp::Write {
            offset_bytes,
            buf,
            fua,
        } => {
            if *fua {
                write_all_dsync(&member.file, buf, *offset_bytes)
            } else {
                member.file.write_all_at(buf, *offset_bytes)
            }
        }
        IoOp::Flush => member.file.sync_data(),
        IoOp::Discard {
            offset_bytes,
            len_bytes,
        } => {
            debug_assert_eq!(member.kind, MemberKind::File, "block discards are ioctls");
            // SAFETY: a valid descriptor; fallocate takes plain integers.
            let rc = unsafe {
                libc::fallocate(
                    member.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    *offset_bytes as libc::off_t,
                    *len_bytes as libc::off_t,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
                member.write_zeros(*offset_bytes, *len_bytes)
            } else {
                Err(error)
            }
        }
    }
}

/// `write_all_at` with RWF_DSYNC: the data is durable when this returns, like a FUA write through the ring.
fn write_all_dsync(file: &File, mut buf: &[u8], mut offset_bytes: u64) -> io::Result<()> {
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len().min(MAX_OP_BYTES as usize),
        };
        // SAFETY: one iovec over live bytes of `buf`; the kernel only reads them.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                &iov,
                1,
                offset_bytes as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "member accepted no bytes",
            ));
        }
        buf = &buf[n as usize..];
        offset_bytes += n as u64;
    }
    Ok(())
}

/// Feeds `queue` (indices into `reqs`) through the ring until every request has a result.
fn drive(
    members: &Snapshot,
    ring: &mut IoUring,
    reqs: &mut [IoReq<'_>],
    mut queue: VecDeque<usize>,
) {
    let mut done_bytes = vec![0u64; reqs.len()];
    // When each request was first handed to the ring: its latency runs from there to its last completion.
    let mut started: Vec<Option<Instant>> = vec![None; reqs.len()];
    let mut in_flight = 0usize;
    let together = waits_together(reqs, &queue);
    loop {
        {
            let mut sq = ring.submission();
            while !sq.is_full() {
                let Some(i) = queue.pop_front() else { break };
                started[i].get_or_insert_with(Instant::now);
                let entry = build_entry(members, &mut reqs[i], done_bytes[i]).user_data(i as u64);
                // SAFETY: the buffers the entry points at live in `reqs`, which stays borrowed (and so
                // unmoved) until every in-flight entry has completed below.
                unsafe { sq.push(&entry).expect("submission queue has room") };
                in_flight += 1;
            }
        }
        if in_flight == 0 {
            break;
        }
        // Together: for all in flight once nothing waits for room in the ring (a request still queued is
        // submitted as soon as one completes).
        let wait_for = if together && queue.is_empty() {
            in_flight
        } else {
            1
        };
        match ring.submit_and_wait(wait_for) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                panic!("io_uring_enter failed with {in_flight} operations in flight: {e}")
            }
        }
        let completions: Vec<(usize, i32)> = ring
            .completion()
            .map(|cqe| (cqe.user_data() as usize, cqe.result()))
            .collect();
        let now = Instant::now();
        for (i, res) in completions {
            in_flight -= 1;
            let req = &mut reqs[i];
            req.latency_ns = started[i].map_or(0, |t| now.duration_since(t).as_nanos() as u64);
            req.timed = !together;
            if res < 0 && is_transient(-res) {
                queue.push_back(i);
                continue;
            }
            if res < 0 {
                req.result = match req.op {
                    IoOp::Discard {
                        offset_bytes,
                        len_bytes,
                    } if -res == libc::EOPNOTSUPP => member_of(members, req.slot)
                        .map_or(Err(io::Error::from_raw_os_error(libc::ENODEV)), |m| {
                            m.write_zeros(offset_bytes, len_bytes)
                        }),
                    _ => Err(io::Error::from_raw_os_error(-res)),
                };
                continue;
            }
            let total = match &req.op {
                IoOp::Read { buf, .. } => buf.len() as u64,
                IoOp::Write { buf, .. } => buf.len() as u64,
                IoOp::Flush | IoOp::Discard { .. } => {
                    req.result = Ok(());
                    continue;
                }
            };
            if res == 0 {
                req.result = Err(match req.op {
                    IoOp::Read { .. } => io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end of the member",
                    ),
                    _ => io::Error::new(io::ErrorKind::WriteZero, "member accepted no bytes"),
                });
                continue;
            }
            done_bytes[i] += res as u64;
            if done_bytes[i] < total {
                queue.push_back(i); // short transfer: continue where it stopped
            } else {
                req.result = Ok(());
            }
        }
    }
}

fn build_entry(
    members: &Snapshot,
    req: &mut IoReq<'_>,
    done_bytes: u64,
) -> io_uring::squeue::Entry {
    let member = member_of(members, req.slot).expect("only present members are queued");
    let fd = ring_fd(member);
    match &mut req.op {
        IoOp::Read { offset_bytes, buf } => {
            let len = (buf.len() as u64 - done_bytes).min(MAX_OP_BYTES) as u32;
            // SAFETY: done_bytes < buf.len(), so the pointer stays inside the buffer.
            let ptr = unsafe { buf.as_mut_ptr().add(done_bytes as usize) };
            opcode::Read::new(fd, ptr, len)
                .offset(*offset_bytes + done_bytes)
                .build()
        }
        IoOp::Write {
            offset_bytes,
            buf,
            fua,
        } => {
            let len = (buf.len() as u64 - done_bytes).min(MAX_OP_BYTES) as u32;
            // SAFETY: as for reads.
            let ptr = unsafe { buf.as_ptr().add(done_bytes as usize) };
            let rw_flags = if *fua { libc::RWF_DSYNC } else { 0 };
            opcode::Write::new(fd, ptr, len)
                .offset(*offset_bytes + done_bytes)
                .rw_flags(rw_flags)
                .build()
        }
        IoOp::Flush => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        IoOp::Discard {
            offset_bytes,
            len_bytes,
        } => opcode::Fallocate::new(fd, *len_bytes)
            .offset(*offset_bytes)
            .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
            .build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;
    use std::path::Path;

    const PAGE: usize = 4096;

    fn member_in(dir: &Path, name: &str, size_bytes: u64) -> MemberFile {
        let path = dir.join(format!("paraid-uring-{}-{name}", std::process::id()));
        let file = File::create(&path).unwrap();
        file.set_len(size_bytes).unwrap();
        drop(file);
        let member = MemberFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap(); // the open descriptor keeps it alive
        member
    }

    fn filled(byte: u8, len: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(len);
        buf.fill(byte);
        buf
    }

    /// Writes (plain and FUA), a discard, a flush and reads, as batches of several requests and as lone
    /// requests: whichever way `submit` runs them (ring or inline), the bytes read back are the ones written.
    fn batches_round_trip(members: &UringMembers) {
        let (a, b) = (filled(0xa5, 2 * PAGE), filled(0x5a, PAGE));
        let mut batch = vec![
            IoReq::write(0, 0, &a, false),
            IoReq::write(0, 4 * PAGE as u64, &b, true),
            IoReq::write(1, PAGE as u64, &b, false),
        ];
        members.submit(&mut batch);
        assert!(batch.iter().all(|r| r.result.is_ok()));
        let mut lone = vec![IoReq::discard(0, PAGE as u64, PAGE as u64)];
        members.submit(&mut lone);
        assert!(lone[0].result.is_ok());
        let mut flush = vec![IoReq::flush(0), IoReq::flush(1)];
        members.submit(&mut flush);
        assert!(flush.iter().all(|r| r.result.is_ok()));

        let (mut r0, mut r1) = (filled(1, 5 * PAGE), filled(1, 2 * PAGE));
        let mut reads = vec![IoReq::read(0, 0, &mut r0), IoReq::read(1, 0, &mut r1)];
        members.submit(&mut reads);
        assert!(reads.iter().all(|r| r.result.is_ok()));
        drop(reads);
        assert!(r0[..PAGE].iter().all(|&x| x == 0xa5));
        assert!(
            r0[PAGE..4 * PAGE].iter().all(|&x| x == 0),
            "discarded page and hole read as zeros"
        );
        assert!(r0[4 * PAGE..].iter().all(|&x| x == 0x5a));
        assert!(r1[..PAGE].iter().all(|&x| x == 0));
        assert!(r1[PAGE..].iter().all(|&x| x == 0x5a));

        let mut page = filled(1, PAGE);
        let mut lone = vec![IoReq::read(1, PAGE as u64, &mut page)];
        members.submit(&mut lone);
        assert!(lone[0].result.is_ok());
        drop(lone);
        assert!(page.iter().all(|&x| x == 0x5a));

        // Past the end: an error, never a short success, on either path.
        let mut tail = filled(0, 2 * PAGE);
        let mut lone = vec![IoReq::read(1, 7 * PAGE as u64, &mut tail)];
        members.submit(&mut lone);
        assert!(
            lone[0].result.is_err(),
            "a lone read past the end succeeded"
        );
        let mut tail2 = filled(0, 2 * PAGE);
        let mut two = vec![
            IoReq::read(0, 7 * PAGE as u64, &mut tail),
            IoReq::read(1, 0, &mut tail2),
        ];
        members.submit(&mut two);
        assert!(
            two[0].result.is_err(),
            "a batched read past the end succeeded"
        );
        assert!(two[1].result.is_ok());
    }

    #[test]
    fn disk_files_round_trip_through_ring_and_inline_paths() {
        let dir = std::env::temp_dir();
        let m0 = member_in(&dir, "disk0", 8 * PAGE as u64);
        let m1 = member_in(&dir, "disk1", 8 * PAGE as u64);
        batches_round_trip(&UringMembers::new(vec![Some(m0), Some(m1)]));
    }

    /// Large batches through the ring: every request of a batch of 96 gets its own result and latency, the bytes
    /// land where they were sent, and one failing request among many fails alone. Several threads at once, each
    /// with its own ring.
    #[test]
    fn large_batches_through_the_ring_complete_every_request() {
        // /var/tmp is on a disk where /tmp may be tmpfs (whose members skip the ring).
        let var_tmp = Path::new("/var/tmp");
        let dir = if var_tmp.is_dir() {
            var_tmp.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        const MEMBERS: usize = 4;
        const PAGES: usize = 32;
        let members: Vec<Option<MemberFile>> = (0..MEMBERS)
            .map(|m| Some(member_in(&dir, &format!("large{m}"), (PAGES * PAGE) as u64)))
            .collect();
        if members.iter().flatten().any(|m| m.memory_backed) {
            println!(
                "skipped: {} is in memory, and members there do not use the ring",
                dir.display()
            );
            return;
        }
        let members = UringMembers::new(members);
        std::thread::scope(|scope| {
            for t in 0..4u8 {
                let members = &members;
                scope.spawn(move || {
                    // Each thread its own pages: page p of every member, p % 4 == t.
                    let pages: Vec<usize> = (0..PAGES).filter(|p| p % 4 == t as usize).collect();
                    for round in 0..3u8 {
                        let tag = |m: usize, p: usize| (m * 31 + p * 7) as u8 ^ round ^ (t << 5);
                        let bufs: Vec<(usize, usize, AlignedBuf)> = (0..MEMBERS)
                            .flat_map(|m| pages.iter().map(move |&p| (m, p)))
                            .map(|(m, p)| (m, p, filled(tag(m, p), PAGE)))
                            .collect();
                        let mut writes: Vec<IoReq<'_>> = bufs
                            .iter()
                            .map(|(m, p, b)| IoReq::write(*m, (p * PAGE) as u64, b, round == 2))
                            .collect();
                        members.submit(&mut writes);
                        assert!(
                            writes.iter().all(|r| r.result.is_ok()),
                            "thread {t} round {round}"
                        );
                        // Waited for together (`waits_together`; the thread's first batches are): none carries a
                        // time of its own.
                        assert!(
                            writes.iter().all(|r| !r.timed),
                            "thread {t} round {round}: a write of a batch waited for together is timed"
                        );
                        drop(writes);
                        let mut back: Vec<(usize, usize, AlignedBuf)> = bufs
                            .iter()
                            .map(|(m, p, _)| (*m, *p, filled(0, PAGE)))
                            .collect();
                        // One read past the end among them fails alone.
                        let mut past = filled(0, PAGE);
                        let mut reads: Vec<IoReq<'_>> = back
                            .iter_mut()
                            .map(|(m, p, b)| IoReq::read(*m, (*p * PAGE) as u64, b))
                            .collect();
                        reads.insert(5, IoReq::read(0, (PAGES * PAGE) as u64, &mut past));
                        members.submit(&mut reads);
                        assert!(reads[5].result.is_err(), "a read past the end succeeded");
                        for (i, r) in reads.iter().enumerate().filter(|(i, _)| *i != 5) {
                            assert!(r.result.is_ok(), "thread {t} round {round} read {i}");
                            assert!(r.latency_ns > 0 && r.timed, "read {i} not timed");
                        }
                        drop(reads);
                        for (m, p, b) in &back {
                            assert!(
                                b.iter().all(|&x| x == tag(*m, *p)),
                                "thread {t} round {round}: member {m} page {p}"
                            );
                        }
                    }
                });
            }
        });
    }

    /// Only batches of three or more requests without a read may be waited for together: reads and small batches
    /// keep a time per request, which the slow-member watch needs.
    #[test]
    fn only_batches_of_three_or_more_without_a_read_are_write_batches() {
        let page = filled(1, PAGE);
        let mut into = [filled(0, PAGE), filled(0, PAGE)];
        let [a, b] = &mut into;
        let writes = |n: usize| -> Vec<IoReq<'_>> {
            (0..n).map(|m| IoReq::write(m, 0, &page, false)).collect()
        };
        let all = |reqs: &[IoReq<'_>]| (0..reqs.len()).collect::<VecDeque<usize>>();
        let three = writes(3);
        assert!(is_write_batch(&three, &all(&three)));
        let two = writes(2);
        assert!(!is_write_batch(&two, &all(&two)));
        let flushes: Vec<IoReq<'_>> = (0..4).map(|m| IoReq::new(m, IoOp::Flush)).collect();
        assert!(is_write_batch(&flushes, &all(&flushes)));
        let mut mixed = writes(3);
        mixed.push(IoReq::read(3, 0, a));
        assert!(!is_write_batch(&mixed, &all(&mixed)));
        // Only what is queued for the ring counts: a read that ran elsewhere leaves a batch of writes.
        assert!(is_write_batch(&mixed, &(0..3).collect()));
        let reads = vec![IoReq::read(0, 0, b)];
        assert!(!is_write_batch(&reads, &all(&reads)));
    }

    /// One write batch in `TIMED_WRITE_BATCH_EVERY` on a thread is timed request by request, the rest waited for
    /// together; reads never are.
    #[test]
    fn one_write_batch_in_eight_on_each_thread_is_timed_one_by_one() {
        std::thread::spawn(|| {
            let page = filled(1, PAGE);
            let writes: Vec<IoReq<'_>> = (0..6).map(|m| IoReq::write(m, 0, &page, false)).collect();
            let queue: VecDeque<usize> = (0..writes.len()).collect();
            let together: Vec<bool> = (0..3 * TIMED_WRITE_BATCH_EVERY)
                .map(|_| waits_together(&writes, &queue))
                .collect();
            for (i, &t) in together.iter().enumerate() {
                assert_eq!(
                    t,
                    (i + 1) % TIMED_WRITE_BATCH_EVERY as usize != 0,
                    "batch {i}"
                );
            }
            let mut buf = filled(0, PAGE);
            let reads = vec![IoReq::read(0, 0, &mut buf[..])];
            assert!(!waits_together(&reads, &(0..1).collect()));
        })
        .join()
        .expect("thread");
    }

    /// A flush reaches a member's device only when a plain write or a discard completed there since its last
    /// flush started (or it was just opened): FUA writes are durable already, and a member nobody wrote to has
    /// nothing to make durable. Lone flushes (inline) and batches (ring) alike.
    #[test]
    fn flushes_reach_only_members_with_something_to_make_durable() {
        let dir = std::env::temp_dir();
        let members = UringMembers::new(vec![
            Some(member_in(&dir, "flush0", 8 * PAGE as u64)),
            Some(member_in(&dir, "flush1", 8 * PAGE as u64)),
        ]);
        let issued = |slot: usize| members.member(slot).unwrap().flushes_issued();
        let flush_both = || {
            let mut reqs = vec![IoReq::flush(0), IoReq::flush(1)];
            members.submit(&mut reqs);
            assert!(reqs.iter().all(|r| r.result.is_ok()));
        };
        flush_both();
        assert_eq!((issued(0), issued(1)), (1, 1), "opened: not known durable");
        flush_both();
        assert_eq!((issued(0), issued(1)), (1, 1), "nothing written since");
        let page = filled(7, PAGE);
        let mut write = vec![IoReq::write(0, 0, &page, false)];
        members.submit(&mut write);
        assert!(write[0].result.is_ok());
        flush_both();
        assert_eq!((issued(0), issued(1)), (2, 1), "only the member written");
        let mut fua = vec![IoReq::write(1, 0, &page, true)];
        members.submit(&mut fua);
        flush_both();
        assert_eq!(issued(1), 1, "a FUA write is durable by itself");
        let mut discard = vec![IoReq::discard(1, 0, PAGE as u64)];
        members.submit(&mut discard);
        let mut lone = vec![IoReq::flush(1)];
        members.submit(&mut lone);
        assert!(lone[0].result.is_ok());
        assert_eq!(issued(1), 2, "a hole punch is not durable until flushed");
        let mut missing = vec![IoReq::flush(5)];
        members.submit(&mut missing);
        assert!(
            missing[0].result.is_err(),
            "a flush of a missing member fails"
        );
    }

    /// A member of 8 pages on /dev/shm, if it can be made there and is in memory (says why not otherwise).
    fn shm_member(name: &str) -> Option<MemberFile> {
        let dir = Path::new("/dev/shm");
        let Ok(member) = std::panic::catch_unwind(|| member_in(dir, name, 8 * PAGE as u64)) else {
            println!("skipped: cannot create an O_DIRECT file in /dev/shm");
            return None;
        };
        if !member.memory_backed {
            println!("skipped: /dev/shm is not tmpfs here");
            return None;
        }
        Some(member)
    }

    #[test]
    fn memory_backed_files_run_inline_and_round_trip() {
        let Some(m0) = shm_member("shm0") else {
            return;
        };
        let m1 = member_in(Path::new("/dev/shm"), "shm1", 8 * PAGE as u64);
        assert!(m1.memory_backed);
        batches_round_trip(&UringMembers::new(vec![Some(m0), Some(m1)]));
    }

    /// Requests on members in memory report no latency (`run_timed`): lone, one per member, and joined into a
    /// vectored call, reads and writes.
    #[test]
    fn memory_backed_requests_report_no_latency() {
        let Some(m0) = shm_member("lat0") else {
            return;
        };
        let m1 = member_in(Path::new("/dev/shm"), "lat1", 8 * PAGE as u64);
        let members = UringMembers::new(vec![Some(m0), Some(m1)]);
        let pages: Vec<AlignedBuf> = (0..4u8).map(|n| filled(0x30 + n, PAGE)).collect();
        // Lone; one per member; two runs of two pages on each member (joined).
        let shapes: [&[(usize, usize)]; 3] = [
            &[(0, 1)],
            &[(0, 2), (1, 2)],
            &[(0, 0), (0, 1), (1, 2), (1, 3)],
        ];
        for shape in shapes {
            let mut writes: Vec<IoReq<'_>> = shape
                .iter()
                .map(|&(slot, page)| IoReq::write(slot, (page * PAGE) as u64, &pages[page], false))
                .collect();
            members.submit(&mut writes);
            assert!(writes
                .iter()
                .all(|r| r.result.is_ok() && r.latency_ns == 0 && r.timed));
            let mut backs: Vec<AlignedBuf> = shape.iter().map(|_| filled(0, PAGE)).collect();
            let mut reads: Vec<IoReq<'_>> = shape
                .iter()
                .zip(backs.iter_mut())
                .map(|(&(slot, page), back)| IoReq::read(slot, (page * PAGE) as u64, back))
                .collect();
            members.submit(&mut reads);
            assert!(reads
                .iter()
                .all(|r| r.result.is_ok() && r.latency_ns == 0 && r.timed));
            drop(reads);
            for (&(_, page), back) in shape.iter().zip(&backs) {
                assert_eq!(back[..], pages[page][..], "page {page} read back");
            }
        }
    }

    /// On members in memory, requests that continue one another go as one vectored call (member/vectored.rs):
    /// their bytes land where each says; a run that goes past the end is run again one by one, so the requests
    /// inside the member succeed and only the one past it fails.
    #[test]
    fn joined_runs_on_memory_members_land_and_fail_one_by_one() {
        let Some(m0) = shm_member("join0") else {
            return;
        };
        let members = UringMembers::new(vec![Some(m0)]);
        let pages: Vec<AlignedBuf> = (0..4u8).map(|n| filled(0x10 + n, PAGE)).collect();
        // Out of order in the batch, back to back on the member: pages 2, 0, 3, 1.
        let mut batch: Vec<IoReq<'_>> = [2usize, 0, 3, 1]
            .iter()
            .map(|&n| IoReq::write(0, (n * PAGE) as u64, &pages[n], false))
            .collect();
        members.submit(&mut batch);
        assert!(batch.iter().all(|r| r.result.is_ok()));
        let mut back = filled(0, 4 * PAGE);
        let mut read = vec![IoReq::read(0, 0, &mut back)];
        members.submit(&mut read);
        assert!(read[0].result.is_ok());
        drop(read);
        for n in 0..4 {
            assert!(
                back[n * PAGE..(n + 1) * PAGE]
                    .iter()
                    .all(|&x| x == 0x10 + n as u8),
                "page {n}"
            );
        }
        // Pages 6 and 7 are in the member, page 8 is past its end.
        let (mut six, mut seven, mut eight) = (filled(1, PAGE), filled(1, PAGE), filled(1, PAGE));
        let mut reads = vec![
            IoReq::read(0, 6 * PAGE as u64, &mut six),
            IoReq::read(0, 7 * PAGE as u64, &mut seven),
            IoReq::read(0, 8 * PAGE as u64, &mut eight),
        ];
        members.submit(&mut reads);
        assert!(
            reads[0].result.is_ok() && reads[1].result.is_ok(),
            "inside the member"
        );
        assert!(reads[2].result.is_err(), "past its end");
        drop(reads);
        assert!(
            six.iter().chain(seven.iter()).all(|&x| x == 0),
            "a hole reads as zeros"
        );
    }
}
