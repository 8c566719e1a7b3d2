//! Partial parity log (PPL): closes the RAID5/6 write hole when a member is missing at restart.
//!
//! Before the in-place writes of a stripe write start, the *partial parity* of the stripe — P (and for RAID6 Q)
//! of the data chunks the write does not touch — is made durable in a ring on the stripe's P member and (RAID6)
//! its Q member: RAID6 splits it, PP to the P member and QP to the Q member (a parity member present alone gets
//! both), and recovery pairs the halves (`pair_halves`). After a crash, whatever state the written chunks and the
//! parity are in, parity is recomputed as `PP xor (written chunks as found)`, so a missing chunk that was not being
//! written reconstructs intact. The on-disk format is in docs/format.md ("Partial parity log"); why this design,
//! and what it costs, in docs/reliability.md ("Write hole").
//!
//! Rules that keep an entry valid until it is retired:
//! * an entry's `modified` set holds the chunks this write touches plus every chunk written to the stripe since the
//!   last flush of every member (their data may not be durable); its partial parity covers the other chunks, whose
//!   values are durable and do not change while the entry is live;
//! * a full-stripe write needs no partial parity, but if the stripe has a live entry it logs an entry without
//!   payload (every chunk modified: recovery recomputes parity from the data), so the old entry is not applied;
//! * a record is retired (ring header `retired_seq` raised) only after every write it covers completed and every
//!   member was flushed; its space is reused only after that.
//! * a client flush is a barrier (`barrier_begin`) for *borrowing* writers, those whose entries count as modified
//!   a chunk another write left not yet durable: it waits for those in flight (from the moment their entries are
//!   computed until their in-place writes are done), and none starts while it runs. Otherwise such an entry
//!   could outlive the flush that makes the chunk durable, with its own writes in flight, and a power loss
//!   tearing them would lose that chunk, acknowledged and flushed, if its member were missing at restart. A
//!   writer whose entries count as modified only the chunks it writes itself (the common case: random page
//!   writes, commit streams) neither waits for a flush nor holds one back: its partial parity carries every
//!   other chunk, whatever the flush makes durable, and the chunks it writes read back old or new.
//!
//! Stream entries: a write that changes one data chunk of a stripe whose newest entry counts only that chunk as
//! modified, over pages that cover the write, logs nothing: the entry already says what recovery must do (parity
//! = partial parity xor that chunk as found), and nothing else of the stripe changed since it was made (every
//! other write of the stripe makes a newer entry). Such a write *rides* the entry: it counts as a writer of the
//! entry's round (the round is not retired before the ride's writes are flushed), and a write continuing a
//! stream in the chunk extends its entry to the pages ahead (their partial parity read from the members), so
//! that a database's commit stream into its log pays one log write per `STREAM_PAGES` pages instead of one per
//! commit. A stream that reaches the end of a chunk continues in the next chunk of the array: the first write
//! there extends at once. Rides need every member active and the member states unchanged since the entry was made.
//!
//! Group commit: writers queue their entries; a writer that finds fewer than `ROUNDS_IN_FLIGHT` rounds being
//! written takes the whole queue as one round (one record per member, FUA) and wakes the others when it is
//! durable. Under load the queue fills while rounds are in flight, so concurrent writers share log writes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::Array;
use crate::buf::AlignedBuf;
use crate::crc32c::crc32c;
use crate::error::EngineError;
use crate::layout::{Geometry, Level, PAGE_BYTES};
use crate::member::IoReq;
use crate::uuid::Uuid;

const RING_MAGIC: [u8; 8] = *b"PARAIDPH";
const RECORD_MAGIC: [u8; 8] = *b"PARAIDPL";
/// Written by this version: RAID6 entries may be split (PP on the P member, QP on the Q member). Readers accept
/// `LOG_VERSION_WHOLE` records too (every payload whole, on both members).
const LOG_VERSION: u32 = 2;
const LOG_VERSION_WHOLE: u32 = 1;
const ENTRY_BYTES: usize = 32;
const ENTRIES_AT: usize = 64;
const CHECKSUM_AT: usize = 4092;
/// Entries one record header holds.
pub(crate) const ENTRIES_PER_RECORD: usize = (CHECKSUM_AT - ENTRIES_AT) / ENTRY_BYTES;
const FLAG_PAYLOAD: u8 = 1;
/// Version 2: which partial parities the entry's payload in this record holds (PP first, then QP).
const FLAG_PP: u8 = 2;
const FLAG_QP: u8 = 4;
/// Log rounds written at the same time: more writers than this share rounds (group commit), fewer each get
/// their own without waiting for another's log write.
const ROUNDS_IN_FLIGHT: usize = 4;
const PAGE: usize = PAGE_BYTES as usize;
/// Most pages a stream entry covers ahead of the write that makes it (its partial parity is read and logged for
/// all of them at once: a longer reach saves more log writes, and costs more when the stream stops).
const STREAM_PAGES: u64 = 16;

static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// One stripe of a write window as the log sees it (built by the write path after parity is computed).
pub(super) struct StripeView<'a> {
    pub stripe: u64,
    /// Page-aligned in-chunk range over which the write recomputes parity.
    pub r: Range<u64>,
    /// Every data chunk is overwritten whole.
    pub full: bool,
    /// Data chunks written in place (member active): index and page-aligned in-chunk range.
    pub written: Vec<(usize, Range<u64>)>,
    /// Data chunks the write changes whose member is missing: their new contents live only in the parity, so
    /// the parity changes there and an entry must say so (the chunk counts as unmodified: its new value is in
    /// the partial parity), or an older entry of the stripe would bring back its old value at recovery.
    pub changed_missing: Vec<(usize, Range<u64>)>,
    /// New contents of data chunks, by data index: the in-chunk range held and its bytes.
    pub data: Vec<Option<(Range<u64>, &'a [u8])>>,
    /// New P and Q over `r`.
    pub p: &'a [u8],
    pub q: Option<&'a [u8]>,
}

impl StripeView<'_> {
    /// The data index and pages of the one chunk this write changes, when it changes exactly one and that
    /// chunk's member is present (what a stream entry is made for and ridden by).
    fn single_chunk(&self) -> Option<(usize, &Range<u64>)> {
        match &self.written[..] {
            [(index, pages)] if !self.full && self.changed_missing.is_empty() => {
                Some((*index, pages))
            }
            _ => None,
        }
    }
}

/// One log entry: a page range of a stripe, its `modified` set and partial parity (none: every chunk modified).
struct Entry {
    stripe: u64,
    page_first: u32,
    pages: u32,
    modified: u64,
    /// PP pages, then (RAID6) QP pages.
    payload: Option<AlignedBuf>,
    /// Members whose ring gets the entry (P and Q members present).
    slots: [Option<usize>; 2],
}

impl Entry {
    fn payload_pages(&self) -> u64 {
        self.payload.as_ref().map_or(0, |p| (p.len() / PAGE) as u64)
    }

    /// The partial parities (`FLAG_PP`, `FLAG_QP`) the record on `slot` carries: RAID6 with both the P and the Q
    /// member present splits them, PP to the P member and QP to the Q member (each missing-member case needs only
    /// the half on a present member, except two data chunks missing, and then both are present); a member alone
    /// gets both. 0: no payload.
    fn parts_on(&self, slot: usize, has_q: bool) -> u8 {
        if self.payload.is_none() {
            return 0;
        }
        match self.slots {
            [Some(p), Some(_)] if has_q => {
                if slot == p {
                    FLAG_PP
                } else {
                    FLAG_QP
                }
            }
            _ if has_q => FLAG_PP | FLAG_QP,
            _ => FLAG_PP,
        }
    }

    /// The bytes of `parts` in the order a record holds them.
    fn parts_bytes(&self, parts: u8) -> impl Iterator<Item = &[u8]> {
        let payload = self.payload.as_deref().unwrap_or(&[]);
        let span = self.pages as usize * PAGE;
        [(FLAG_PP, 0usize), (FLAG_QP, 1)]
            .into_iter()
            .filter(move |(flag, _)| parts & flag != 0)
            .map(move |(_, n)| &payload[n * span..(n + 1) * span])
    }
}

/// Pages of one data chunk written (without FUA) since the last flush of every member: their contents may not
/// be durable, so a new entry must count the chunk as modified there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dirty {
    index: usize,
    /// In-chunk bytes, page-aligned.
    range: Range<u64>,
    /// The flush epoch in which the write completed: a flush that began later makes it durable.
    epoch: u64,
}

/// A stream entry (module doc): its round, the one data chunk it counts as modified, the in-chunk bytes it covers,
/// and the member states it was made under.
#[derive(Debug, Clone)]
struct Stream {
    seq: u64,
    index: usize,
    range: Range<u64>,
    health_epoch: u64,
}

/// Per stripe: the pages that are not durable, and whether a live entry exists.
#[derive(Default, Clone)]
struct StripeLog {
    dirty: Vec<Dirty>,
    /// Newest round holding an entry of this stripe (0: none).
    last_seq: u64,
    /// The stripe's newest entry if it is a stream entry (valid while `seq == last_seq`).
    stream: Option<Stream>,
}

impl StripeLog {
    /// The stream entry, if it is still the stripe's newest entry (rounds are numbered from 1, so a stripe
    /// without a live entry, `last_seq` 0, has none).
    fn newest_stream(&self) -> Option<&Stream> {
        self.stream.as_ref().filter(|s| s.seq == self.last_seq)
    }

    fn add_dirty(&mut self, index: usize, range: Range<u64>, epoch: u64) {
        let mut range = range;
        // Merge with touching ranges of the same chunk and epoch (a flush clears them together).
        self.dirty.retain(|d| {
            let mergeable = d.index == index
                && d.epoch == epoch
                && d.range.start <= range.end
                && range.start <= d.range.end;
            if mergeable {
                range = range.start.min(d.range.start)..range.end.max(d.range.end);
            }
            !mergeable
        });
        self.dirty.push(Dirty {
            index,
            range,
            epoch,
        });
    }

    /// A FUA write made these pages durable.
    fn clean(&mut self, index: usize, range: &Range<u64>) {
        let mut kept = Vec::with_capacity(self.dirty.len());
        for d in self.dirty.drain(..) {
            if d.index != index || d.range.end <= range.start || range.end <= d.range.start {
                kept.push(d);
                continue;
            }
            if d.range.start < range.start {
                kept.push(Dirty {
                    range: d.range.start..range.start,
                    ..d.clone()
                });
            }
            if range.end < d.range.end {
                kept.push(Dirty {
                    range: range.end..d.range.end,
                    ..d
                });
            }
        }
        self.dirty = kept;
    }

    /// Chunks with pages not durable anywhere in `range`.
    fn dirty_over(&self, range: &Range<u64>) -> u64 {
        self.dirty
            .iter()
            .filter(|d| d.range.start < range.end && range.start < d.range.end)
            .fold(0, |m, d| m | (1 << d.index))
    }
}

/// A member's ring: where the next record goes and the records not yet retired (seq, first page, pages).
#[derive(Default)]
struct Ring {
    head: u64,
    live: VecDeque<(u64, u64, u64)>,
}

impl Ring {
    fn cursor(&self) -> RingCursor {
        RingCursor {
            head: self.head,
            tail: self.live.front().map(|&(_, start, _)| start),
        }
    }
}

/// Where the next record of a ring goes, and where its oldest live record starts: enough to place records.
#[derive(Clone, Copy)]
struct RingCursor {
    head: u64,
    tail: Option<u64>,
}

impl RingCursor {
    /// Places a record of `pages` contiguous pages (of the record space), if they are free.
    fn place(&mut self, pages: u64, ring_pages: u64) -> Option<u64> {
        if pages > ring_pages {
            return None;
        }
        let start = match self.tail {
            None if self.head + pages <= ring_pages => self.head,
            None => 0,
            Some(tail) if self.head > tail => {
                if self.head + pages <= ring_pages {
                    self.head
                } else if pages <= tail {
                    0
                } else {
                    return None;
                }
            }
            Some(tail) if self.head + pages <= tail => self.head,
            Some(_) => return None,
        };
        self.tail.get_or_insert(start);
        self.head = start + pages;
        Some(start)
    }
}

/// CRC-32C of `bytes`, with the SSE4.2 instruction where the CPU has it (the log checksums every record it
/// writes and scans; the table version in `crc32c` is for single superblocks).
fn checksum(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2.
        return unsafe { crc32c_sse42(bytes) };
    }
    crc32c(bytes)
}

/// `checksum(bytes)` for `bytes` whose bytes from `used` on are all zero, without reading them: CRC-32C is linear,
/// so running the register over n zero bytes is a fixed GF(2) operator, applied here as the product of the
/// operators for the powers of two that make up n.
fn checksum_zero_tail(bytes: &[u8], used: usize) -> u32 {
    // (Not asserted here: reading the tail is what this avoids. The caller zeroed the page; a unit test checks
    // the result against reading it.)
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        let skips = zero_skip_columns();
        // SAFETY: the CPU has SSE4.2.
        let mut register = unsafe { crc_register_sse42(!0, &bytes[..used]) };
        let mut zeros = bytes.len() - used;
        let mut power = 0;
        while zeros > 0 {
            if zeros & 1 != 0 {
                register = crc_skip(register, &skips[power]);
            }
            zeros >>= 1;
            power += 1;
        }
        return !register;
    }
    checksum(bytes)
}

/// Zero-byte operators of `zero_skip_columns`: 2^0 .. 2^(ZERO_SKIP_POWERS - 1) bytes (a header page at most).
#[cfg(target_arch = "x86_64")]
const ZERO_SKIP_POWERS: usize = 13;

/// For each power of two p < 2^ZERO_SKIP_POWERS, the CRC-32C register operator for p zero bytes (as columns).
#[cfg(target_arch = "x86_64")]
fn zero_skip_columns() -> &'static [[u32; 32]; ZERO_SKIP_POWERS] {
    static COLUMNS: std::sync::OnceLock<[[u32; 32]; ZERO_SKIP_POWERS]> = std::sync::OnceLock::new();
    COLUMNS.get_or_init(|| {
        let zeros = [0u8; 1 << (ZERO_SKIP_POWERS - 1)];
        let mut ops = [[0u32; 32]; ZERO_SKIP_POWERS];
        for (power, op) in ops.iter_mut().enumerate() {
            for (bit, col) in op.iter_mut().enumerate() {
                // SAFETY: only reached from checksum_zero_tail, i.e. on a CPU with SSE4.2.
                *col = unsafe { crc_register_sse42(1 << bit, &zeros[..1 << power]) };
            }
        }
        ops
    })
}

/// Bytes each of the three interleaved CRC streams takes per block: the `crc32` instruction has a latency of
/// three cycles and a throughput of one, so three independent streams run about three times as fast as one;
/// their registers are joined with the "N zero bytes" operator below.
#[cfg(target_arch = "x86_64")]
const CRC_STREAM_BYTES: usize = 1024;

/// The CRC-32C register operator for `CRC_STREAM_BYTES` zero bytes, as 32 columns (GF(2) matrix): the register
/// after those bytes from register `r` is the XOR of the columns of `r`'s set bits (the CRC is linear).
#[cfg(target_arch = "x86_64")]
fn crc_skip_columns() -> &'static [u32; 32] {
    static COLUMNS: std::sync::OnceLock<[u32; 32]> = std::sync::OnceLock::new();
    COLUMNS.get_or_init(|| {
        let mut cols = [0u32; 32];
        for (bit, col) in cols.iter_mut().enumerate() {
            // SAFETY: only reached from crc32c_sse42, i.e. on a CPU with SSE4.2.
            *col = unsafe { crc_register_sse42(1 << bit, &[0u8; CRC_STREAM_BYTES]) };
        }
        cols
    })
}

#[cfg(target_arch = "x86_64")]
fn crc_skip(register: u32, columns: &[u32; 32]) -> u32 {
    // Branch-free: the register's bits are random, and a mispredicted branch per bit cost more than the XORs.
    let mut out = 0;
    for (bit, col) in columns.iter().enumerate() {
        out ^= col & ((register >> bit) & 1).wrapping_neg();
    }
    out
}

/// The raw CRC-32C register after `bytes`, from `register` (no initial or final inversion).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc_register_sse42(register: u32, bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut words = bytes.chunks_exact(8);
    let mut crc = register as u64;
    for w in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut crc = crc as u32;
    for &b in words.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    crc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::_mm_crc32_u64;
    const N: usize = CRC_STREAM_BYTES;
    // SAFETY (the reads below): `at + 8 <= N` and every stream slice holds N bytes.
    let word = |b: &[u8], at: usize| {
        u64::from_le(std::ptr::read_unaligned(b.as_ptr().add(at).cast::<u64>()))
    };
    let mut register = !0u32;
    let mut blocks = bytes.chunks_exact(3 * N);
    if bytes.len() >= 3 * N {
        let columns = crc_skip_columns();
        for block in &mut blocks {
            let (a, rest) = block.split_at(N);
            let (b, c) = rest.split_at(N);
            let (mut ra, mut rb, mut rc) = (register as u64, 0u64, 0u64);
            let mut at = 0;
            while at < N {
                ra = _mm_crc32_u64(ra, word(a, at));
                rb = _mm_crc32_u64(rb, word(b, at));
                rc = _mm_crc32_u64(rc, word(c, at));
                at += 8;
            }
            // reg(r, A|B|C) = skip(skip(reg(r, A)) ^ reg(0, B)) ^ reg(0, C).
            register = crc_skip(crc_skip(ra as u32, columns) ^ rb as u32, columns) ^ rc as u32;
        }
    }
    !crc_register_sse42(register, blocks.remainder())
}

struct Submission {
    id: u64,
    entries: Vec<Entry>,
}

impl Drop for Logged<'_> {
    fn drop(&mut self) {
        self.ppl.complete(self);
    }
}

/// A failed log write, kept for the writers of its round.
#[derive(Clone)]
struct LogFailure {
    slot: Option<usize>,
    path: String,
    kind: io::ErrorKind,
    message: String,
}

struct LogState {
    queue: VecDeque<Submission>,
    next_submission: u64,
    /// Finished submissions: the round they went out in, or why they failed.
    done: HashMap<u64, Result<u64, LogFailure>>,
    /// Threads waiting on `changed`.
    waiters: usize,
    /// Rounds being written now (at most `ROUNDS_IN_FLIGHT`).
    rounds_writing: usize,
    /// A retirement (flush, ring header writes) is under way: one at a time.
    retiring: bool,
    next_seq: u64,
    /// Records below this are void on every member (the ring headers say so).
    retired_seq: u64,
    /// Every write of a round below this completed before a flush of every member that has completed.
    flushed_seq: u64,
    /// Writes that completed in this flush epoch or earlier are durable (a flush that began after them is done).
    flushed_epoch: u64,
    /// Rounds with writers that have not completed their in-place writes: round -> writers (rides included).
    inflight: BTreeMap<u64, usize>,
    /// Rounds ridden by writes that completed, and the latest flush epoch such a write completed in: a flush that
    /// began before then does not cover them, so it cannot let the round be retired.
    ridden: BTreeMap<u64, u64>,
    /// Writers waiting for ring space: no write rides an old entry meanwhile (it would keep its round live).
    wanting_room: usize,
    rings: Vec<Ring>,
    stripes: HashMap<u64, StripeLog>,
    /// No round may start (a ring is being handed over to a replacement member).
    paused: bool,
    /// Client flushes under way (`barrier_begin`): no borrowing writer starts while any is.
    barriers: usize,
    /// Borrowing writers (module doc) from the moment their entries were computed until their in-place writes
    /// are done: a client flush waits for them.
    borrowing: usize,
    /// (slot, io index): records written to the slot's ring also go to its replacement, whose ring was copied
    /// from the slot's, until the replacement takes the slot over.
    mirror: Option<(usize, usize)>,
}

/// Log figures (for tests and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Commit rounds (each one FUA write per member involved).
    pub rounds: u64,
    /// Entries logged (partial stripes and invalidations), and their payload bytes.
    pub entries: u64,
    pub payload_bytes: u64,
    /// Record writes issued (one per member per round, more when a round spans records).
    pub record_writes: u64,
    /// Retirements (ring header writes) and the flushes they needed.
    pub retirements: u64,
    pub retire_flushes: u64,
    /// Flushes a FUA write needed first (other chunks of its stripe not yet durable).
    pub fua_flushes: u64,
    /// Read-modify-writes done as reconstruct-writes because another chunk of the stripe was not yet durable
    /// (its current contents must be taken out of the partial parity, and RMW does not read it).
    pub rmw_to_rcw: u64,
    /// Stripes of writes that logged nothing, riding a stream entry; stream entries extended ahead of their write.
    pub rides: u64,
    pub stream_extensions: u64,
}

pub(crate) struct Ppl {
    geometry: Geometry,
    uuid: Uuid,
    /// Member byte offset of the ring area; page 0 is the ring header.
    offset_bytes: u64,
    /// Pages for records (the area less its header page).
    ring_pages: u64,
    /// Most payload pages one round may put on one member (half the ring: a round always fits once the ring is
    /// empty, and the next can be written while the previous one's writes run).
    round_budget_pages: u64,
    /// Writing new entries (recovery of existing ones happens regardless).
    enabled: bool,
    /// Stream entries and rides (module doc).
    streams: bool,
    state: Mutex<LogState>,
    changed: Condvar,
    flush_epoch: AtomicU64,
    stats: Mutex<LogStats>,
}

/// An entry as one record holds it: the entry and the partial parities (`FLAG_PP`, `FLAG_QP`) of its payload there.
type RecordEntry<'a> = (&'a Entry, u8);

fn record_entry_pages(&(e, parts): &RecordEntry<'_>) -> u64 {
    u64::from(parts.count_ones()) * u64::from(e.pages)
}

/// Per stripe of a write (by stripe number), the data chunks written in place: data index and page-aligned
/// in-chunk range, as in `StripeView::written`.
type WrittenInPlace = Vec<(u64, Vec<(usize, Range<u64>)>)>;

/// What a write got from `log_window`: dropping it (after the in-place writes, whether they succeeded or not)
/// records them as done.
pub(super) struct Logged<'a> {
    ppl: &'a Ppl,
    round: Option<u64>,
    /// Per stripe, the data chunks written in place and their in-chunk ranges.
    written: WrittenInPlace,
    fua: bool,
    /// Rounds of the stream entries this write rides (one per riding stripe).
    rides: Vec<u64>,
    /// Stream entries of `round`: stripe, data index, in-chunk bytes covered.
    streams: Vec<(u64, usize, Range<u64>)>,
    /// The member states the entries were made under.
    health_epoch: u64,
    /// Counted among `LogState::borrowing` until `complete`.
    borrowing: bool,
}

/// Taken before a flush of every member, handed to `flush_done` after.
#[derive(Clone, Copy)]
pub(crate) struct FlushMark {
    epoch: u64,
    seq: u64,
}

fn all_data(k: usize) -> u64 {
    if k >= 64 {
        u64::MAX
    } else {
        (1u64 << k) - 1
    }
}

impl Ppl {
    /// The log of an array whose superblock places the ring at `offset_bytes .. + bytes`. `None` when there is no
    /// ring (RAID0/1/10, version 1 before its upgrade).
    pub(crate) fn new(
        geometry: &Geometry,
        uuid: Uuid,
        offset_bytes: u64,
        bytes: u64,
        enabled: bool,
        streams: bool,
    ) -> Option<Ppl> {
        if !geometry.level.has_parity() || bytes < 2 * PAGE_BYTES {
            return None;
        }
        let ring_pages = bytes / PAGE_BYTES - 1;
        let chunk_pages = geometry.chunk_bytes / PAGE_BYTES;
        // One request logs at most two partial stripes; a member may hold the parity of both (RAID6: P of one,
        // Q of the next), each entry PP and QP over a whole chunk, plus record headers.
        let np = geometry.level.parity_chunks() as u64;
        let one_request = 2 * np * chunk_pages + 4;
        let mut enabled = enabled;
        if enabled && 2 * one_request > ring_pages {
            log::warn!(
                "the partial parity log ring ({} KiB) is too small for {} KiB chunks: writes are not logged, \
                 the write hole with a member missing at restart stays open",
                bytes >> 10,
                geometry.chunk_bytes >> 10
            );
            enabled = false;
        }
        Some(Ppl {
            geometry: *geometry,
            uuid,
            offset_bytes,
            ring_pages,
            round_budget_pages: (ring_pages / 2).max(one_request),
            enabled,
            streams,
            state: Mutex::new(LogState {
                queue: VecDeque::new(),
                next_submission: 0,
                done: HashMap::new(),
                waiters: 0,
                rounds_writing: 0,
                retiring: false,
                paused: false,
                barriers: 0,
                borrowing: 0,
                mirror: None,
                next_seq: 1,
                retired_seq: 0,
                flushed_seq: 0,
                flushed_epoch: 0,
                inflight: BTreeMap::new(),
                ridden: BTreeMap::new(),
                wanting_room: 0,
                rings: (0..geometry.members).map(|_| Ring::default()).collect(),
                stripes: HashMap::new(),
            }),
            changed: Condvar::new(),
            flush_epoch: AtomicU64::new(1),
            stats: Mutex::new(LogStats::default()),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn stats(&self) -> LogStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, mut guard: MutexGuard<'a, LogState>) -> MutexGuard<'a, LogState> {
        guard.waiters += 1;
        let mut guard = self.changed.wait(guard).unwrap_or_else(|e| e.into_inner());
        guard.waiters -= 1;
        guard
    }

    /// Wakes the waiters, if any (a wake-up with nobody waiting would still cost a system call per write).
    fn wake(&self, st: MutexGuard<'_, LogState>) {
        let anyone = st.waiters > 0;
        drop(st);
        if anyone {
            self.changed.notify_all();
        }
    }

    fn add_stats(&self, f: impl FnOnce(&mut LogStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    // -----------------------------------------------------------------------------------------------------
    // The write path

    /// Whether a read-modify-write of `stripe` can compute its partial parity from what it reads: every chunk
    /// written since the last flush must be among the chunks this write rewrites over all of `r` (otherwise the
    /// write reads the whole stripe: reconstruct-write).
    pub(super) fn rmw_allowed(
        &self,
        stripe: u64,
        touches: &[(usize, Range<u64>)],
        r: &Range<u64>,
    ) -> bool {
        if !self.enabled {
            return true;
        }
        let dirty = self
            .lock()
            .stripes
            .get(&stripe)
            .map_or(0, |s| s.dirty_over(r));
        let allowed = (0..64).filter(|i| dirty & (1 << i) != 0).all(|i| {
            touches
                .iter()
                .any(|(index, pages)| *index == i && pages == r)
        });
        if !allowed {
            self.add_stats(|s| s.rmw_to_rcw += 1);
        }
        allowed
    }

    /// Makes the entries for the stripes of one write window durable before it writes in place.
    pub(super) fn log_window(
        &self,
        array: &Array,
        views: &[StripeView<'_>],
        fua: bool,
    ) -> Result<Logged<'_>, EngineError> {
        let written: WrittenInPlace = views
            .iter()
            .map(|v| (v.stripe, v.written.clone()))
            .collect();
        let mut logged = Logged {
            ppl: self,
            round: None,
            written,
            fua,
            rides: Vec::new(),
            streams: Vec::new(),
            health_epoch: array.health.epoch.load(Ordering::SeqCst),
            borrowing: false,
        };
        if !self.enabled {
            return Ok(logged);
        }
        if fua && self.parity_leans_on_unflushed(views) {
            // A FUA write is durable on return, and so must be what its parity is computed from: the new parity
            // also covers chunks other writes left in the members' caches. Lose one of those and the member
            // holding this write, and the write could not be rebuilt. Make them durable first.
            let mark = self.flush_begin();
            let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
            array.run(reqs)?;
            self.flush_done(mark);
            self.add_stats(|s| s.fua_flushes += 1);
        }
        let all_active = self.streams && (0..self.geometry.members).all(|m| array.is_active(m));
        let riding = self.take_rides(views, all_active, &mut logged);
        let (entries, streams) = self.entries_for(array, views, &riding, all_active, &mut logged);
        if entries.is_empty() {
            return Ok(logged);
        }
        logged.round = Some(self.commit(array, entries)?);
        logged.streams = streams;
        Ok(logged)
    }

    /// Which stripes of the window ride a stream entry (module doc); each such round counts the write as one of
    /// its writers until `complete`, and is no longer taken as flushed.
    fn take_rides(
        &self,
        views: &[StripeView<'_>],
        all_active: bool,
        logged: &mut Logged<'_>,
    ) -> Vec<bool> {
        let mut riding = vec![false; views.len()];
        if !all_active {
            return riding;
        }
        let mut st = self.lock();
        if st.retiring || st.wanting_room > 0 {
            return riding; // a retirement must not find a round it is retiring ridden again
        }
        for (n, v) in views.iter().enumerate() {
            let Some((index, _)) = v.single_chunk() else {
                continue;
            };
            let Some(log) = st.stripes.get(&v.stripe) else {
                continue;
            };
            let Some(stream) = log.newest_stream() else {
                continue;
            };
            let rides = stream.seq >= st.retired_seq
                && stream.health_epoch == logged.health_epoch
                && stream.index == index
                && stream.range.start <= v.r.start
                && v.r.end <= stream.range.end
                && log.dirty_over(&stream.range) & !(1u64 << index) == 0;
            if !rides {
                continue;
            }
            let seq = stream.seq;
            *st.inflight.entry(seq).or_insert(0) += 1;
            st.flushed_seq = st.flushed_seq.min(seq);
            logged.rides.push(seq);
            riding[n] = true;
        }
        drop(st);
        if !logged.rides.is_empty() {
            let n = logged.rides.len() as u64;
            self.add_stats(|s| s.rides += n);
        }
        riding
    }

    /// Counts `logged` as a borrowing writer (module doc) once no client flush is under way; waits for those
    /// under way first. The caller holds the log's lock, and decided under it that the writer borrows.
    fn begin_borrowing<'a>(
        &self,
        mut st: MutexGuard<'a, LogState>,
        logged: &mut Logged<'_>,
    ) -> MutexGuard<'a, LogState> {
        while st.barriers > 0 {
            st = self.wait(st);
        }
        st.borrowing += 1;
        logged.borrowing = true;
        st
    }

    /// Whether a stripe of the window has pages not yet durable, under its new parity, that this write does not
    /// overwrite.
    fn parity_leans_on_unflushed(&self, views: &[StripeView<'_>]) -> bool {
        let st = self.lock();
        views.iter().any(|v| leans_on_unflushed(&st, v))
    }

    /// Whole stripes about to be overwritten without the write path (deallocated by a discard): a live entry of
    /// theirs is voided by an entry that counts every chunk as modified, and their chunks count as written.
    pub(super) fn log_overwrite(
        &self,
        array: &Array,
        stripes: Range<u64>,
    ) -> Result<Logged<'_>, EngineError> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let all = all_data(k);
        let mut logged = Logged {
            ppl: self,
            round: None,
            // Only chunks of present members are written (a missing member's chunk is never dirty: its value is
            // in the parity, and every entry's partial parity carries it).
            written: stripes
                .clone()
                .map(|s| {
                    let present = (0..k).filter(|i| array.is_active(g.stripe_member(s, *i)));
                    (s, present.map(|i| (i, 0..g.chunk_bytes)).collect())
                })
                .collect(),
            fua: false,
            rides: Vec::new(),
            streams: Vec::new(),
            health_epoch: array.health.epoch.load(Ordering::SeqCst),
            borrowing: false,
        };
        if !self.enabled || !g.level.has_parity() {
            return Ok(logged);
        }
        let live: Vec<u64> = {
            // Its entries count every chunk as modified, a missing member's too: taken as borrowing (rare).
            let st = self.begin_borrowing(self.lock(), &mut logged);
            stripes
                .filter(|s| {
                    st.stripes
                        .get(s)
                        .is_some_and(|l| l.last_seq != 0 && l.last_seq >= st.retired_seq)
                })
                .collect()
        };
        let has_q = g.level == Level::Raid6;
        let entries: Vec<Entry> = live
            .into_iter()
            .filter_map(|stripe| {
                let p = g.stripe_member(stripe, k);
                let q = has_q.then(|| g.stripe_member(stripe, k + 1));
                let slots = [
                    array.is_active(p).then_some(p),
                    q.filter(|q| array.is_active(*q)),
                ];
                slots.iter().any(|s| s.is_some()).then_some(Entry {
                    stripe,
                    page_first: 0,
                    pages: (g.chunk_bytes / PAGE_BYTES) as u32,
                    modified: all,
                    payload: None,
                    slots,
                })
            })
            .collect();
        if !entries.is_empty() {
            logged.round = Some(self.commit(array, entries)?);
        }
        Ok(logged)
    }

    /// Records the in-place writes of a logged window as done (dropping `Logged` calls it).
    fn complete(&self, logged: &Logged<'_>) {
        if !self.enabled {
            return;
        }
        // The epoch now, after the writes completed: a flush with this epoch or later began after them.
        let epoch = self.flush_epoch.load(Ordering::SeqCst);
        let mut st = self.lock();
        if logged.borrowing {
            st.borrowing -= 1;
        }
        let durable = logged.fua || epoch <= st.flushed_epoch;
        for (stripe, written) in &logged.written {
            let known = st.stripes.contains_key(stripe);
            if logged.fua && logged.round.is_none() && !known {
                continue; // durable already, nothing logged, nothing dirty: nothing to remember
            }
            let s = st.stripes.entry(*stripe).or_default();
            for (index, range) in written {
                if durable {
                    s.clean(*index, range);
                } else {
                    s.add_dirty(*index, range.clone(), epoch);
                }
            }
            if let Some(round) = logged.round {
                s.last_seq = s.last_seq.max(round);
            }
        }
        if let Some(round) = logged.round {
            for (stripe, index, range) in &logged.streams {
                if let Some(s) = st.stripes.get_mut(stripe) {
                    s.stream = Some(Stream {
                        seq: round,
                        index: *index,
                        range: range.clone(),
                        health_epoch: logged.health_epoch,
                    });
                }
            }
        }
        for &seq in &logged.rides {
            writer_done(&mut st, seq);
            let latest = st.ridden.entry(seq).or_insert(epoch);
            *latest = (*latest).max(epoch);
        }
        if let Some(round) = logged.round {
            writer_done(&mut st, round);
        }
        if logged.round.is_some() || !logged.rides.is_empty() || logged.borrowing {
            self.wake(st);
        }
    }

    /// The entries for `views` (stripes that ride a stream entry have none): per stripe, per stretch of pages with
    /// the same set of written chunks; a write of one chunk makes a stream entry. Returns them and the stream
    /// entries among them (stripe, data index, in-chunk bytes).
    #[allow(clippy::type_complexity)]
    fn entries_for(
        &self,
        array: &Array,
        views: &[StripeView<'_>],
        riding: &[bool],
        all_active: bool,
        logged: &mut Logged<'_>,
    ) -> (Vec<Entry>, Vec<(u64, usize, Range<u64>)>) {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let has_q = g.level == Level::Raid6;
        let all = all_data(k);
        let mut entries = Vec::new();
        let mut streams = Vec::new();
        let (logs, after_streams): (Vec<StripeLog>, Vec<bool>) = {
            let mut st = self.lock();
            let borrows = views
                .iter()
                .zip(riding)
                .any(|(v, rides)| !rides && leans_on_unflushed(&st, v));
            if borrows {
                // A flush that ends meanwhile may make the chunks durable: the entries are computed after it.
                st = self.begin_borrowing(st, logged);
            }
            views
                .iter()
                .map(|v| {
                    let mut s = st.stripes.get(&v.stripe).cloned().unwrap_or_default();
                    if s.last_seq < st.retired_seq {
                        s.last_seq = 0;
                    }
                    (s, self.follows_a_stream(&st, v))
                })
                .unzip()
        };
        for (((v, log), &rides), &after_stream) in
            views.iter().zip(&logs).zip(riding).zip(&after_streams)
        {
            if rides {
                continue;
            }
            let slots = {
                let p = g.stripe_member(v.stripe, k);
                let q = has_q.then(|| g.stripe_member(v.stripe, k + 1));
                [
                    array.is_active(p).then_some(p),
                    q.filter(|q| array.is_active(*q)),
                ]
            };
            if slots.iter().all(|s| s.is_none()) {
                continue; // no parity written: nothing can disagree with the data
            }
            // A full-stripe write needs no partial parity, unless a data chunk's member is missing: its new
            // contents then live only in the parity, and the log keeps them for a torn write.
            let missing_mask = (0..k)
                .filter(|i| !array.is_active(g.stripe_member(v.stripe, *i)))
                .fold(0u64, |m, i| m | (1 << i));
            if v.full && missing_mask == 0 {
                if log.last_seq != 0 {
                    entries.push(Entry {
                        stripe: v.stripe,
                        page_first: 0,
                        pages: (g.chunk_bytes / PAGE_BYTES) as u32,
                        modified: all,
                        payload: None,
                        slots,
                    });
                }
                continue;
            }
            if all_active {
                if let Some((entry, range)) = self.stream_entry(array, v, log, after_stream, slots)
                {
                    streams.push((v.stripe, entry.modified.trailing_zeros() as usize, range));
                    entries.push(entry);
                    continue;
                }
            }
            // Cut R wherever the set of written or not-durable chunks changes.
            let mut cuts: Vec<u64> = vec![v.r.start, v.r.end];
            for (_, pages) in v.written.iter().chain(&v.changed_missing) {
                cuts.push(pages.start.clamp(v.r.start, v.r.end));
                cuts.push(pages.end.clamp(v.r.start, v.r.end));
            }
            for d in &log.dirty {
                cuts.push(d.range.start.clamp(v.r.start, v.r.end));
                cuts.push(d.range.end.clamp(v.r.start, v.r.end));
            }
            cuts.sort_unstable();
            cuts.dedup();
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                let covering = v
                    .written
                    .iter()
                    .filter(|(_, p)| p.start <= a && p.end >= b)
                    .fold(0u64, |m, (i, _)| m | (1 << i));
                let changes_missing = v
                    .changed_missing
                    .iter()
                    .any(|(_, p)| p.start <= a && p.end >= b);
                if covering == 0 && !changes_missing {
                    continue; // parity rewritten with its old value there: nothing changes
                }
                // A missing member's chunk is never modified: its value (reconstructed by the write path, or
                // the new one) is in the new parity, and so stays in the partial parity. Pages it had not made
                // durable before it went missing count for nothing now.
                let modified = (covering | log.dirty_over(&(a..b))) & !missing_mask;
                let pages = ((b - a) / PAGE_BYTES) as u32;
                let payload = if modified & all == all {
                    None
                } else {
                    Some(self.partial_parity(array, v, modified, a..b))
                };
                entries.push(Entry {
                    stripe: v.stripe,
                    page_first: (a / PAGE_BYTES) as u32,
                    pages,
                    modified,
                    payload,
                    slots,
                });
            }
        }
        (entries, streams)
    }

    /// Whether `v` writes the start of a data chunk whose predecessor in the array (the chunk before it in array
    /// order) ends in a stream entry that reached its end: a stream crossing into the next chunk, which then
    /// extends at once instead of logging its first pages on their own.
    fn follows_a_stream(&self, st: &LogState, v: &StripeView<'_>) -> bool {
        let g = self.geometry;
        let k = g.data_per_stripe() as u64;
        let Some((index, pages)) = v.single_chunk() else {
            return false;
        };
        let chunk = v.stripe * k + index as u64;
        if pages.start != 0 || chunk == 0 {
            return false;
        }
        let (stripe, index) = ((chunk - 1) / k, ((chunk - 1) % k) as usize);
        st.stripes.get(&stripe).is_some_and(|log| {
            log.newest_stream()
                .is_some_and(|s| s.index == index && s.range.end == g.chunk_bytes)
        })
    }

    /// The stream entry for `v` if the write changes one data chunk and no other chunk of the stripe has pages
    /// not yet durable: over R, or (the write continues a stream: the stripe's newest entry is a stream entry of
    /// the same chunk that this write continues, or `after_stream`, see `follows_a_stream`) from R up to
    /// `STREAM_PAGES` pages ahead, the partial parity there read from the members. Not in regions awaiting resync
    /// (their parity may not match the data it would be read against).
    fn stream_entry(
        &self,
        array: &Array,
        v: &StripeView<'_>,
        log: &StripeLog,
        after_stream: bool,
        slots: [Option<usize>; 2],
    ) -> Option<(Entry, Range<u64>)> {
        let g = self.geometry;
        let (index, pages) = v.single_chunk()?;
        let chunk = 0..g.chunk_bytes;
        if *pages != v.r
            || log.dirty_over(&chunk) & !(1u64 << index) != 0
            || array.integrity.awaits_resync(v.stripe)
        {
            return None;
        }
        let continues = after_stream
            || log.newest_stream().is_some_and(|s| {
                s.index == index && s.range.start <= v.r.start && v.r.start <= s.range.end
            });
        let ahead_end = (v.r.end + STREAM_PAGES * PAGE_BYTES).min(g.chunk_bytes);
        let ahead = if continues && v.r.end < ahead_end {
            self.stream_ahead(array, v.stripe, index, v.r.end..ahead_end)
        } else {
            None
        };
        let own = self.partial_parity(array, v, 1u64 << index, v.r.clone());
        let (range, payload) = match ahead {
            None => (v.r.clone(), own),
            Some(ahead) => {
                // PP over R then ahead, and (RAID6) QP over R then ahead.
                let np = g.level.parity_chunks();
                let (own_len, ahead_len) = (own.len() / np, ahead.len() / np);
                let mut payload = AlignedBuf::zeroed(own.len() + ahead.len());
                for part in 0..np {
                    let at = part * (own_len + ahead_len);
                    payload[at..at + own_len]
                        .copy_from_slice(&own[part * own_len..(part + 1) * own_len]);
                    payload[at + own_len..at + own_len + ahead_len]
                        .copy_from_slice(&ahead[part * ahead_len..(part + 1) * ahead_len]);
                }
                self.add_stats(|s| s.stream_extensions += 1);
                (v.r.start..ahead_end, payload)
            }
        };
        let entry = Entry {
            stripe: v.stripe,
            page_first: (range.start / PAGE_BYTES) as u32,
            pages: ((range.end - range.start) / PAGE_BYTES) as u32,
            modified: 1u64 << index,
            payload: Some(payload),
            slots,
        };
        Some((entry, range))
    }

    /// PP (and QP) of `stripe` over the in-chunk bytes `ahead` with data chunk `index` taken out, from the parity
    /// and the chunk as the members hold them (the caller holds the stripe's lock; every member is active and no
    /// other chunk has pages not yet durable there). None if a read fails (the entry then covers R only).
    fn stream_ahead(
        &self,
        array: &Array,
        stripe: u64,
        index: usize,
        ahead: Range<u64>,
    ) -> Option<AlignedBuf> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks();
        let len = (ahead.end - ahead.start) as usize;
        let at = array.member_offset(stripe, ahead.start);
        let mut parity = AlignedBuf::zeroed(np * len);
        let mut chunk = AlignedBuf::zeroed(len);
        {
            // Under the stripe's lock, before the window's in-place writes: the stripe cache holds what the
            // members hold (stripe_cache.rs).
            let cache = &array.stripe_cache;
            let mut reqs: Vec<IoReq<'_>> = parity
                .chunks_mut(len)
                .enumerate()
                .filter_map(|(i, b)| {
                    (!cache.fill(stripe, k + i, ahead.start, b))
                        .then(|| IoReq::read(g.stripe_member(stripe, k + i), at, b))
                })
                .collect();
            if !cache.fill(stripe, index, ahead.start, &mut chunk) {
                reqs.push(IoReq::read(g.stripe_member(stripe, index), at, &mut chunk));
            }
            array.run(reqs).ok()?;
        }
        let (pp, qp) = parity.split_at_mut(len);
        take_out(array, index, &chunk, pp, (np == 2).then_some(qp));
        Some(parity)
    }

    /// PP (and QP) over `range` of `v`: the new parity with the contribution of every chunk in `modified` taken
    /// out again.
    fn partial_parity(
        &self,
        array: &Array,
        v: &StripeView<'_>,
        modified: u64,
        range: Range<u64>,
    ) -> AlignedBuf {
        let len = (range.end - range.start) as usize;
        let np = self.geometry.level.parity_chunks();
        // Every byte is written below: PP from P, QP (RAID6) from Q.
        let mut payload = AlignedBuf::for_overwrite(np * len);
        let at = (range.start - v.r.start) as usize;
        let (pp, qp) = payload.split_at_mut(len);
        pp.copy_from_slice(&v.p[at..at + len]);
        match v.q {
            Some(q) => qp.copy_from_slice(&q[at..at + len]),
            None => debug_assert!(qp.is_empty()),
        }
        for i in (0..self.geometry.data_per_stripe()).filter(|i| modified & (1 << i) != 0) {
            let (held, bytes) = v.data[i]
                .as_ref()
                .expect("the write path holds every chunk a log entry counts as modified");
            assert!(
                held.start <= range.start && held.end >= range.end,
                "chunk {i} of stripe {} held over {held:?}, needed over {range:?}",
                v.stripe
            );
            let from = (range.start - held.start) as usize;
            take_out(
                array,
                i,
                &bytes[from..from + len],
                pp,
                (np == 2).then_some(&mut *qp),
            );
        }
        payload
    }

    /// Queues `entries` and returns once they are durable (the round they went out in).
    fn commit(&self, array: &Array, entries: Vec<Entry>) -> Result<u64, EngineError> {
        let mut st = self.lock();
        let id = st.next_submission;
        st.next_submission += 1;
        st.queue.push_back(Submission { id, entries });
        loop {
            if let Some(done) = st.done.remove(&id) {
                return done.map_err(LogFailure::into_error);
            }
            // Lead a round if one may start; otherwise the queue waits for the next free one (group commit).
            if st.rounds_writing < ROUNDS_IN_FLIGHT && !st.queue.is_empty() && !st.paused {
                st.rounds_writing += 1;
                st = self.lead(array, st);
                st.rounds_writing -= 1;
                if st.waiters > 0 {
                    self.changed.notify_all();
                }
                continue;
            }
            st = self.wait(st);
        }
    }

    /// Writes one round of queued submissions: takes them (within the budget), lays them out as records, gets
    /// ring space and the round's sequence number together, and writes the records with FUA.
    fn lead<'a>(
        &'a self,
        array: &Array,
        mut st: MutexGuard<'a, LogState>,
    ) -> MutexGuard<'a, LogState> {
        // Take submissions in order while every member's share stays within the budget.
        let has_q = self.geometry.level == Level::Raid6;
        let mut taken: Vec<Submission> = Vec::new();
        let mut pages = vec![0u64; self.geometry.members];
        while let Some(sub) = st.queue.front() {
            let mut add = vec![0u64; self.geometry.members];
            for e in &sub.entries {
                for slot in e.slots.iter().flatten() {
                    add[*slot] += record_entry_pages(&(e, e.parts_on(*slot, has_q)));
                }
            }
            let fits = pages
                .iter()
                .zip(&add)
                .all(|(have, more)| have + more <= self.round_budget_pages);
            if !taken.is_empty() && !fits {
                break;
            }
            for (have, more) in pages.iter_mut().zip(&add) {
                *have += more;
            }
            let sub = st.queue.pop_front().expect("front exists");
            taken.push(sub);
        }
        let (mut st, result) = self.write_round(array, &taken, st);
        match result {
            Ok(round) => {
                for sub in &taken {
                    st.done.insert(sub.id, Ok(round));
                }
            }
            Err((round, failure)) => {
                for sub in &taken {
                    st.done.insert(sub.id, Err(failure.clone()));
                }
                // Those writers will not write in place; they do not hold the round back.
                if let Some(round) = round {
                    st.inflight.remove(&round);
                }
            }
        }
        st
    }

    /// Lays the round out as records, finds ring space (retiring old records if needed), takes the round's
    /// sequence number with it, and writes the records with FUA. Returns the round, or the failure (and the
    /// round if it had one).
    #[allow(clippy::type_complexity)]
    fn write_round<'a>(
        &'a self,
        array: &Array,
        taken: &[Submission],
        mut st: MutexGuard<'a, LogState>,
    ) -> (
        MutexGuard<'a, LogState>,
        Result<u64, (Option<u64>, LogFailure)>,
    ) {
        // Per member, the entries it holds (and which of their partial parities), cut into records.
        let has_q = self.geometry.level == Level::Raid6;
        let mut per_slot: Vec<Vec<RecordEntry<'_>>> = vec![Vec::new(); self.geometry.members];
        for e in taken.iter().flat_map(|s| &s.entries) {
            for slot in e.slots.iter().flatten() {
                per_slot[*slot].push((e, e.parts_on(*slot, has_q)));
            }
        }
        let mut records: Vec<(usize, Vec<RecordEntry<'_>>)> = Vec::new();
        for (slot, entries) in per_slot.into_iter().enumerate() {
            let mut current: Vec<RecordEntry<'_>> = Vec::new();
            let mut current_pages = 0;
            for (e, parts) in entries {
                let pages = record_entry_pages(&(e, parts));
                if current.len() == ENTRIES_PER_RECORD
                    || (!current.is_empty() && 1 + current_pages + pages > self.round_budget_pages)
                {
                    records.push((slot, std::mem::take(&mut current)));
                    current_pages = 0;
                }
                current_pages += pages;
                current.push((e, parts));
            }
            if !current.is_empty() {
                records.push((slot, current));
            }
        }
        // Ring space for every record, all or nothing; the sequence number goes with it, so that rings fill in
        // sequence order and a round waiting for space never holds one back that could free it.
        let mut placed: Vec<u64> = Vec::with_capacity(records.len());
        let record_pages: Vec<u64> = records
            .iter()
            .map(|(_, entries)| 1 + entries.iter().map(record_entry_pages).sum::<u64>())
            .collect();
        let round = loop {
            placed.clear();
            let mut cursors: Vec<RingCursor> = st.rings.iter().map(|r| r.cursor()).collect();
            for ((slot, _), &pages) in records.iter().zip(&record_pages) {
                match cursors[*slot].place(pages, self.ring_pages) {
                    Some(start) => placed.push(start),
                    None => break,
                }
            }
            if placed.len() == records.len() {
                let round = st.next_seq;
                st.next_seq += 1;
                *st.inflight.entry(round).or_insert(0) += taken.len();
                if log::log_enabled!(log::Level::Trace) {
                    for e in taken.iter().flat_map(|s| &s.entries) {
                        log::trace!(
                            "partial parity log: round {round}: stripe {} pages {}+{} modified {:#b}{}",
                            e.stripe,
                            e.page_first,
                            e.pages,
                            e.modified,
                            if e.payload.is_some() { "" } else { " (no payload)" }
                        );
                    }
                }
                for (((slot, _), &pages), &start) in records.iter().zip(&record_pages).zip(&placed)
                {
                    let ring = &mut st.rings[*slot];
                    ring.head = start + pages;
                    ring.live.push_back((round, start, pages));
                }
                break round;
            }
            // Out of space: retire what can be retired, waiting for earlier writers to complete if needed.
            st.wanting_room += 1;
            let (mut guard, result) = self.make_room(array, st);
            guard.wanting_room -= 1;
            st = guard;
            if let Err(failure) = result {
                return (st, Err((None, failure)));
            }
        };
        // The replacement of a slot gets the slot's records too (see `hand_over_ring`), until it took the slot
        // over (then it is no longer the slot's rebuild target).
        let mirror = st
            .mirror
            .filter(|&(slot, io)| array.write_targets(slot, 0)[1] == io);
        if mirror.is_none() {
            st.mirror = None;
        }
        drop(st);
        // A record identical to an earlier one of the round (same entries and parts, same order: RAID6 entries of
        // stripes whose P or Q member is missing go whole to the other) is encoded and checksummed once.
        let mut encoded: Vec<AlignedBuf> = Vec::with_capacity(records.len());
        let mut source: Vec<usize> = Vec::with_capacity(records.len());
        for (n, (_, entries)) in records.iter().enumerate() {
            let same = records[..n].iter().position(|(_, earlier)| {
                earlier.len() == entries.len()
                    && earlier
                        .iter()
                        .zip(entries)
                        .all(|(a, b)| std::ptr::eq(a.0, b.0) && a.1 == b.1)
            });
            match same {
                Some(m) => source.push(source[m]),
                None => {
                    source.push(encoded.len());
                    encoded.push(self.encode_record(round, entries));
                }
            }
        }
        let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(records.len() + 1);
        for (((slot, _), start), &buf) in records.iter().zip(&placed).zip(&source) {
            reqs.push(IoReq::write(
                *slot,
                self.record_offset(*start),
                &encoded[buf],
                true,
            ));
            if let Some((_, io)) = mirror.filter(|(s, _)| s == slot) {
                reqs.push(IoReq::write(
                    io,
                    self.record_offset(*start),
                    &encoded[buf],
                    true,
                ));
            }
        }
        let record_writes = reqs.len() as u64;
        let result = self.run_log_io(array, reqs);
        self.add_stats(|s| {
            s.rounds += 1;
            s.entries += taken.iter().map(|t| t.entries.len() as u64).sum::<u64>();
            s.payload_bytes += taken
                .iter()
                .flat_map(|t| &t.entries)
                .map(|e| e.payload_pages() * PAGE_BYTES)
                .sum::<u64>();
            s.record_writes += record_writes;
        });
        (
            self.lock(),
            result.map(|()| round).map_err(|f| (Some(round), f)),
        )
    }

    fn record_offset(&self, start_page: u64) -> u64 {
        self.offset_bytes + (1 + start_page) * PAGE_BYTES
    }

    fn encode_record(&self, seq: u64, entries: &[RecordEntry<'_>]) -> AlignedBuf {
        let payload_pages: u64 = entries.iter().map(record_entry_pages).sum();
        // The header page is cleared (its unused bytes are zero on disk); the entries' parts fill the payload.
        let mut buf = AlignedBuf::for_overwrite((1 + payload_pages as usize) * PAGE);
        let (header, payload) = buf.split_at_mut(PAGE);
        header.fill(0);
        header[0..8].copy_from_slice(&RECORD_MAGIC);
        put_u32(header, 8, LOG_VERSION);
        put_u32(header, 12, entries.len() as u32);
        header[16..32].copy_from_slice(&self.uuid.0);
        put_u64(header, 32, seq);
        put_u32(header, 40, payload_pages as u32);
        let mut at_page = 0u64;
        for (n, &(e, parts)) in entries.iter().enumerate() {
            let at = ENTRIES_AT + n * ENTRY_BYTES;
            put_u64(header, at, e.stripe);
            put_u32(header, at + 8, e.page_first);
            put_u32(header, at + 12, e.pages);
            put_u64(header, at + 16, e.modified);
            put_u32(header, at + 24, at_page as u32);
            if parts != 0 {
                header[at + 28] = FLAG_PAYLOAD | parts;
                for part in e.parts_bytes(parts) {
                    let from = at_page as usize * PAGE;
                    payload[from..from + part.len()].copy_from_slice(part);
                    at_page += (part.len() / PAGE) as u64;
                }
            }
        }
        assert_eq!(
            at_page, payload_pages,
            "the entries' parts fill the payload"
        );
        let payload_crc = checksum(payload);
        put_u32(header, 44, payload_crc);
        // The header is mostly zeros past its entries: their share of the CRC is computed, not read.
        let used = ENTRIES_AT + entries.len() * ENTRY_BYTES;
        let crc = checksum_zero_tail(&header[..CHECKSUM_AT], used);
        put_u32(header, CHECKSUM_AT, crc);
        buf
    }

    fn encode_ring_header(&self, retired_seq: u64) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(PAGE);
        buf[0..8].copy_from_slice(&RING_MAGIC);
        put_u32(&mut buf, 8, LOG_VERSION);
        buf[16..32].copy_from_slice(&self.uuid.0);
        put_u64(&mut buf, 32, retired_seq);
        let crc = checksum(&buf[..CHECKSUM_AT]);
        put_u32(&mut buf, CHECKSUM_AT, crc);
        buf
    }

    fn run_log_io(&self, array: &Array, reqs: Vec<IoReq<'_>>) -> Result<(), LogFailure> {
        array.run(reqs).map_err(LogFailure::from_error)
    }

    // -----------------------------------------------------------------------------------------------------
    // Flushes and retirement

    /// Called before a flush of every member starts.
    pub(crate) fn flush_begin(&self) -> FlushMark {
        let epoch = self.flush_epoch.fetch_add(1, Ordering::SeqCst);
        let st = self.lock();
        FlushMark {
            epoch,
            seq: oldest_unfinished(&st),
        }
    }

    /// A client's flush: waits for the borrowing writers in flight (module doc) to finish their in-place writes,
    /// and no writer starts borrowing until `barrier_done` (the members' flushes then cover the borrowed chunks
    /// and the borrowers' writes alike). Why: a borrowing entry has no partial parity for the chunk it borrows.
    /// Were that entry's own writes still in flight when the flush made the chunk durable, a power loss tearing
    /// them, with the chunk's member missing at restart, would leave the chunk (acknowledged, and flushed) to be
    /// solved from torn parity (concurrent simulation, seed 107350; `faults_crash::flush_waits_for_logged_writes_in_flight`).
    /// Borrowing entries made meanwhile would make the same claims about chunks the flush is making durable
    /// (seed 106395; `faults_crash::log_entries_wait_for_a_flush_under_way`). Writers that borrow nothing go on
    /// (`faults_crash::a_flush_does_not_wait_for_a_write_that_borrows_nothing`).
    pub(crate) fn barrier_begin(&self) -> FlushMark {
        if self.enabled {
            let mut st = self.lock();
            st.barriers += 1;
            while st.borrowing > 0 {
                st = self.wait(st);
            }
        }
        self.flush_begin()
    }

    /// Ends a client's flush (`barrier_begin`): `completed` when every member's flush succeeded.
    pub(crate) fn barrier_done(&self, mark: FlushMark, completed: bool) {
        let mut st = self.lock();
        if completed {
            flush_done_locked(&mut st, mark);
        }
        if self.enabled {
            st.barriers -= 1;
            drop(st);
            self.changed.notify_all();
        }
    }

    /// Called after a flush of every member completed: writes completed before it began are durable.
    pub(crate) fn flush_done(&self, mark: FlushMark) {
        let mut st = self.lock();
        flush_done_locked(&mut st, mark);
    }

    /// Retires what the flushes allow (the background tick); returns whether anything was retired.
    pub(crate) fn retire_flushed(&self, array: &Array) -> Result<bool, EngineError> {
        if !self.enabled {
            return Ok(false);
        }
        let mut st = self.lock();
        if st.retiring || st.flushed_seq <= st.retired_seq {
            return Ok(false);
        }
        st.retiring = true;
        let target = st.flushed_seq;
        let (mut st, result) = self.write_retired(array, st, target);
        st.retiring = false;
        drop(st);
        self.changed.notify_all();
        result.map(|()| true).map_err(LogFailure::into_error)
    }

    /// Retires every record (clean stop, after the final flush; or at assembly after recovery): nothing is in
    /// flight. Returns the first sequence number not retired.
    pub(crate) fn retire_all(&self, array: &Array) -> Result<u64, EngineError> {
        let mut st = self.lock();
        while st.retiring || st.rounds_writing > 0 {
            st = self.wait(st);
        }
        st.retiring = true;
        let target = st.next_seq;
        st.flushed_seq = st.flushed_seq.max(target);
        let (mut st, result) = self.write_retired(array, st, target);
        st.retiring = false;
        drop(st);
        self.changed.notify_all();
        result.map_err(LogFailure::into_error)?;
        Ok(target)
    }

    /// Short of ring space for a round: retires every record whose writes completed, flushing every member
    /// first if needed; waits for a writer to complete (or for another retirement) when nothing can be retired
    /// yet.
    fn make_room<'a>(
        &'a self,
        array: &Array,
        mut st: MutexGuard<'a, LogState>,
    ) -> (MutexGuard<'a, LogState>, Result<(), LogFailure>) {
        if st.retiring {
            return (self.wait(st), Ok(()));
        }
        let target = oldest_unfinished(&st);
        if target <= st.retired_seq {
            if st.inflight.is_empty() {
                // Nothing older to wait for: the round alone does not fit (the ring was sized to prevent this).
                return (
                    st,
                    Err(LogFailure {
                        slot: None,
                        path: String::new(),
                        kind: io::ErrorKind::OutOfMemory,
                        message: "a log round does not fit in the partial parity log ring"
                            .to_string(),
                    }),
                );
            }
            // Everything retirable is retired: earlier writers are still writing in place. Wait for one.
            return (self.wait(st), Ok(()));
        }
        st.retiring = true;
        if st.flushed_seq < target {
            drop(st);
            let mark = self.flush_begin();
            let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
            let flushed = self.run_log_io(array, reqs);
            self.add_stats(|s| s.retire_flushes += 1);
            st = self.lock();
            if let Err(failure) = flushed {
                st.retiring = false;
                self.changed.notify_all();
                return (st, Err(failure));
            }
            flush_done_locked(&mut st, mark);
        }
        let to = st.flushed_seq;
        let (mut st, result) = if to > st.retired_seq {
            self.write_retired(array, st, to)
        } else {
            (st, Ok(()))
        };
        st.retiring = false;
        self.changed.notify_all();
        (st, result)
    }

    /// As the one retiring: writes every active member's ring header with `retired_seq = to` (FUA), then forgets
    /// the records below it.
    fn write_retired<'a>(
        &'a self,
        array: &Array,
        st: MutexGuard<'a, LogState>,
        to: u64,
    ) -> (MutexGuard<'a, LogState>, Result<(), LogFailure>) {
        debug_assert!(st.retiring);
        drop(st);
        log::trace!("partial parity log: retiring rounds below {to}");
        let header = self.encode_ring_header(to);
        let reqs: Vec<IoReq<'_>> = array
            .active_slots()
            .map(|slot| IoReq::write(slot, self.offset_bytes, &header, true))
            .collect();
        let result = self.run_log_io(array, reqs);
        let mut st = self.lock();
        if result.is_ok() {
            st.retired_seq = st.retired_seq.max(to);
            let retired = st.retired_seq;
            for ring in st.rings.iter_mut() {
                while ring.live.front().is_some_and(|(seq, _, _)| *seq < retired) {
                    ring.live.pop_front();
                }
            }
            st.stripes
                .retain(|_, s| !s.dirty.is_empty() || s.last_seq >= retired);
            self.add_stats(|s| s.retirements += 1);
        }
        (st, result)
    }

    /// Voids whatever an old ring on `slot` holds (a member that joins: its ring may hold records of an earlier
    /// life that newer writes made wrong).
    /// A replacement (io index `to`) is about to take over `from`, which is active and holds live records: the
    /// replacement gets a copy of `from`'s ring, taken while no round is written, and every record written to
    /// `from` from then on until it took over. (An empty ring would lose the live entries of stripes whose P
    /// or Q `from` is: a power loss after the replacement, with another member missing at restart, would then
    /// reconstruct that member's chunks from torn parity.)
    pub(crate) fn hand_over_ring(
        &self,
        array: &Array,
        from: usize,
        to: usize,
    ) -> Result<(), EngineError> {
        log::trace!(
            "partial parity log: ring of slot {from} copied to io {to} (a live replacement)"
        );
        let mut st = self.lock();
        while st.paused || st.rounds_writing > 0 {
            st = self.wait(st);
        }
        st.paused = true;
        drop(st);
        let mut area = AlignedBuf::zeroed((self.ring_pages as usize + 1) * PAGE);
        let copied = array
            .run(vec![IoReq::read(from, self.offset_bytes, &mut area)])
            .and_then(|()| array.run(vec![IoReq::write(to, self.offset_bytes, &area, true)]));
        let mut st = self.lock();
        st.paused = false;
        if copied.is_ok() {
            st.mirror = Some((from, to));
        }
        drop(st);
        self.changed.notify_all();
        copied
    }

    /// A member rebuilt into its slot starts with an empty ring: every page of the ring zeroed, then a header.
    /// A header alone would not do: the member may hold records of an earlier life whose sequence numbers the
    /// array reuses (assembly numbers on from the highest record of the members active then, and a member
    /// re-added or missing then was not among them), and such a record would pass for live (concurrent
    /// simulation, seed 110269: before this, only the header was written).
    pub(crate) fn reset_member(&self, array: &Array, slot: usize) -> Result<(), EngineError> {
        log::trace!("partial parity log: ring of io {slot} emptied (a member joins)");
        let body_bytes = self.ring_pages * PAGE_BYTES;
        // Member I/O wants page-aligned buffers.
        let zeros = AlignedBuf::zeroed(body_bytes.min(1 << 20) as usize);
        let mut at = 0u64;
        while at < body_bytes {
            let n = (body_bytes - at).min(zeros.len() as u64) as usize;
            let offset = self.offset_bytes + PAGE_BYTES + at;
            array.run(vec![IoReq::write(slot, offset, &zeros[..n], false)])?;
            at += n as u64;
        }
        // The zeros durable before the header that says the ring is empty.
        array.run(vec![IoReq::flush(slot)])?;
        let retired = self.lock().retired_seq.max(1);
        let header = self.encode_ring_header(retired);
        array.run(vec![IoReq::write(slot, self.offset_bytes, &header, true)])
    }
}

/// An entry found in a ring at assembly.
#[derive(Debug, Clone)]
struct FoundEntry {
    seq: u64,
    stripe: u64,
    page_first: u64,
    pages: u64,
    modified: u64,
    /// Whether the entry has a payload (none: every chunk modified, the partial parity is zero).
    payload: bool,
    /// Its partial parities found (`pages` pages each): RAID6 entries may be split between the rings of the P and
    /// the Q member, and recovery pairs the halves (`pair_halves`).
    pp: Option<Vec<u8>>,
    qp: Option<Vec<u8>>,
}

impl FoundEntry {
    /// Entries of one round are told apart by what they cover (stripe writes of one round do not overlap).
    fn key(&self) -> (u64, u64, u64, u64, u64) {
        (
            self.seq,
            self.stripe,
            self.page_first,
            self.pages,
            self.modified,
        )
    }
}

/// What assembly found in the rings and what recovering it did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogRecovery {
    /// Records that counted (checksums, UUID and sequence number right), entries in them.
    pub records: u64,
    pub entries: u64,
    /// Stripes whose parity was recomputed, and how many pages of them.
    pub stripes: u64,
    pub pages: u64,
    /// Chunks of members missing at restart solved from partial parity (they were not being written).
    pub solved_from_log: u64,
    /// The highest sequence number seen (the log continues above it).
    pub max_seq: u64,
}

impl Ppl {
    /// Reads the ring header of every active member: the log continues above the highest `retired_seq` (a clean
    /// array has nothing live in its rings).
    pub(crate) fn resume(&self, array: &Array) -> Result<(), EngineError> {
        let slots: Vec<usize> = array.active_slots().collect();
        let mut headers = AlignedBuf::zeroed(PAGE * slots.len().max(1));
        let reqs: Vec<IoReq<'_>> = headers
            .chunks_mut(PAGE)
            .zip(&slots)
            .map(|(b, &slot)| IoReq::read(slot, self.offset_bytes, b))
            .collect();
        array.run(reqs)?;
        let retired = headers
            .chunks(PAGE)
            .take(slots.len())
            .map(|h| self.decode_ring_header(h))
            .max()
            .unwrap_or(0);
        self.continue_after(retired.max(1) - 1, retired);
        Ok(())
    }

    /// The log continues with sequence numbers above `max_seq`; records below `retired` are void.
    fn continue_after(&self, max_seq: u64, retired: u64) {
        let mut st = self.lock();
        st.next_seq = max_seq + 1;
        st.retired_seq = retired;
        st.flushed_seq = retired;
    }

    fn decode_ring_header(&self, page: &[u8]) -> u64 {
        let version = get_u32(page, 8);
        let valid = page[0..8] == RING_MAGIC
            && (version == LOG_VERSION || version == LOG_VERSION_WHOLE)
            && page[16..32] == self.uuid.0
            && get_u32(page, CHECKSUM_AT) == checksum(&page[..CHECKSUM_AT]);
        if valid {
            get_u64(page, 32)
        } else {
            0
        }
    }

    /// Assembly of a dirty array: reads every active member's ring and recomputes the parity of every stripe
    /// that a live entry names (from the log where a member is missing, from the data otherwise), flushes, and
    /// retires the whole log. Runs before the array serves anything.
    pub(crate) fn recover(&self, array: &Array) -> Result<LogRecovery, EngineError> {
        let g = self.geometry;
        let slots: Vec<usize> = array.active_slots().collect();
        let ring_bytes = (self.ring_pages as usize + 1) * PAGE;
        let mut found: Vec<FoundEntry> = Vec::new();
        let mut report = LogRecovery::default();
        let mut retired = 0u64;
        for &slot in &slots {
            let mut area = AlignedBuf::zeroed(ring_bytes);
            array.run(vec![IoReq::read(slot, self.offset_bytes, &mut area)])?;
            retired = retired.max(self.decode_ring_header(&area[..PAGE]));
            let before = found.len();
            let (records, entries) = self.parse_ring(&area, &mut found);
            log::trace!(
                "partial parity log recovery: slot {slot} (ring retired below {}): rounds {:?}",
                self.decode_ring_header(&area[..PAGE]),
                found[before..]
                    .iter()
                    .map(|e| (e.seq, e.stripe))
                    .collect::<Vec<_>>()
            );
            report.records += records;
            report.entries += entries;
        }
        report.max_seq = found.iter().map(|e| e.seq).max().unwrap_or(0).max(retired);
        // Records below the highest retired_seq of any member are void everywhere (retirement is global).
        found.retain(|e| e.seq >= retired);
        let found = self.pair_halves(array, found);
        for e in &found {
            log::trace!(
                "partial parity log recovery: live entry of round {} (retired below {retired}): stripe {} pages {}+{} \
                 modified {:#b}",
                e.seq,
                e.stripe,
                e.page_first,
                e.pages,
                e.modified
            );
        }
        let mut by_stripe: BTreeMap<u64, Vec<FoundEntry>> = BTreeMap::new();
        for e in found {
            by_stripe.entry(e.stripe).or_default().push(e);
        }
        let chunk_pages = g.chunk_bytes / PAGE_BYTES;
        for (stripe, entries) in &by_stripe {
            // Per page, the newest entry covering it decides.
            let mut winner: Vec<Option<usize>> = vec![None; chunk_pages as usize];
            for (i, e) in entries.iter().enumerate() {
                for page in e.page_first..e.page_first + e.pages {
                    let w = &mut winner[page as usize];
                    if w.is_none_or(|j| entries[j].seq < e.seq) {
                        *w = Some(i);
                    }
                }
            }
            let mut page = 0u64;
            while page < chunk_pages {
                let Some(i) = winner[page as usize] else {
                    page += 1;
                    continue;
                };
                let mut end = page + 1;
                while end < chunk_pages && winner[end as usize] == Some(i) {
                    end += 1;
                }
                report.solved_from_log +=
                    self.recover_run(array, *stripe, page..end, &entries[i])?;
                report.pages += end - page;
                page = end;
            }
            report.stripes += 1;
        }
        let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
        array.run(reqs)?;
        self.continue_after(report.max_seq, retired);
        self.retire_all(array)?;
        Ok(report)
    }

    /// Joins the halves of split RAID6 entries (PP from the P member's ring, QP from the Q member's) and keeps
    /// what recovery can use. An entry missing a half whose member is missing at restart is whole enough: every
    /// case with that parity member gone needs only the other half. One missing a half whose member is present
    /// belongs to a round whose records were not all written when the power went (a ring that lost a live half
    /// otherwise, a member joining with an empty one, is emptied only after every round was retired: see
    /// `member_joined`), so its in-place writes never started: with at most one unmodified data chunk missing
    /// its half still solves the stripe (the entry is valid from the moment it was made); with two it cannot, and
    /// it is dropped, leaving the stripe to the older entries it did not get to replace.
    fn pair_halves(&self, array: &Array, found: Vec<FoundEntry>) -> Vec<FoundEntry> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        if g.level != Level::Raid6 {
            return found;
        }
        let mut by_key: BTreeMap<(u64, u64, u64, u64, u64), FoundEntry> = BTreeMap::new();
        for e in found {
            match by_key.get_mut(&e.key()) {
                Some(have) => {
                    have.pp = have.pp.take().or(e.pp);
                    have.qp = have.qp.take().or(e.qp);
                }
                None => {
                    by_key.insert(e.key(), e);
                }
            }
        }
        by_key
            .into_values()
            .filter_map(|e| {
                if !e.payload || (e.pp.is_some() && e.qp.is_some()) {
                    return Some(e);
                }
                let absent_parity = if e.pp.is_none() { k } else { k + 1 };
                if !array.is_active(g.stripe_member(e.stripe, absent_parity)) {
                    return Some(e);
                }
                let unmodified_missing = (0..k)
                    .filter(|&i| {
                        e.modified & (1 << i) == 0 && !array.is_active(g.stripe_member(e.stripe, i))
                    })
                    .count();
                if unmodified_missing <= 1 {
                    return Some(e);
                }
                log::warn!(
                    "partial parity log: round {} wrote only half of stripe {}'s entry (pages {}+{}) before it \
                     stopped, and two of its data chunks are missing: the stripe is left to its older entries",
                    e.seq,
                    e.stripe,
                    e.page_first,
                    e.pages
                );
                None
            })
            .collect()
    }

    /// Collects the counting records of one ring into `found`; returns (records, entries).
    fn parse_ring(&self, area: &[u8], found: &mut Vec<FoundEntry>) -> (u64, u64) {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks() as u64;
        let chunk_pages = g.chunk_bytes / PAGE_BYTES;
        let pages_total = (area.len() / PAGE) as u64;
        let (mut records, mut entries) = (0, 0);
        let mut page = 1u64;
        while page < pages_total {
            let header = &area[page as usize * PAGE..(page as usize + 1) * PAGE];
            let payload_pages = get_u32(header, 40) as u64;
            let n = get_u32(header, 12) as usize;
            let version = get_u32(header, 8);
            let plausible = header[0..8] == RECORD_MAGIC
                && (version == LOG_VERSION || version == LOG_VERSION_WHOLE)
                && header[16..32] == self.uuid.0
                && n <= ENTRIES_PER_RECORD
                && page + 1 + payload_pages <= pages_total
                && get_u32(header, CHECKSUM_AT) == checksum(&header[..CHECKSUM_AT]);
            if !plausible {
                page += 1;
                continue;
            }
            let from = (page + 1) as usize * PAGE;
            let record_payload = &area[from..from + payload_pages as usize * PAGE];
            if get_u32(header, 44) != checksum(record_payload) {
                page += 1; // torn: its writes never started
                continue;
            }
            let seq = get_u64(header, 32);
            for e in 0..n {
                let at = ENTRIES_AT + e * ENTRY_BYTES;
                let entry = FoundEntry {
                    seq,
                    stripe: get_u64(header, at),
                    page_first: get_u32(header, at + 8) as u64,
                    pages: get_u32(header, at + 12) as u64,
                    modified: get_u64(header, at + 16),
                    payload: false,
                    pp: None,
                    qp: None,
                };
                let payload_page = get_u32(header, at + 24) as u64;
                let flags = header[at + 28];
                let has_payload = flags & FLAG_PAYLOAD != 0;
                // Version 1 holds every payload whole.
                let parts = match (has_payload, version) {
                    (false, _) => 0,
                    (true, LOG_VERSION_WHOLE) if np == 2 => FLAG_PP | FLAG_QP,
                    (true, LOG_VERSION_WHOLE) => FLAG_PP,
                    (true, _) => flags & (FLAG_PP | FLAG_QP),
                };
                let part_count = u64::from(parts.count_ones());
                let sane = entry.stripe < g.stripes()
                    && entry.pages > 0
                    && entry.page_first + entry.pages <= chunk_pages
                    && entry.modified & !all_data(k) == 0
                    && (!has_payload
                        || (part_count > 0
                            && (np == 2 || parts == FLAG_PP)
                            && payload_page + part_count * entry.pages <= payload_pages));
                if !sane {
                    log::warn!(
                        "partial parity log: entry {e} of record {seq} is out of range; ignored"
                    );
                    continue;
                }
                let span = entry.pages as usize * PAGE;
                let mut at = payload_page as usize * PAGE;
                let mut take = |flag: u8| {
                    (parts & flag != 0).then(|| {
                        at += span;
                        record_payload[at - span..at].to_vec()
                    })
                };
                let (pp, qp) = (take(FLAG_PP), take(FLAG_QP));
                found.push(FoundEntry {
                    payload: has_payload,
                    pp,
                    qp,
                    ..entry
                });
                entries += 1;
            }
            records += 1;
            page += 1 + payload_pages;
        }
        (records, entries)
    }

    /// Makes pages `pages` of `stripe` consistent following `entry`; returns the chunks solved from the log.
    fn recover_run(
        &self,
        array: &Array,
        stripe: u64,
        pages: Range<u64>,
        entry: &FoundEntry,
    ) -> Result<u64, EngineError> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks();
        let has_q = np == 2;
        let len = ((pages.end - pages.start) * PAGE_BYTES) as usize;
        let lo = pages.start * PAGE_BYTES;
        let at = array.member_offset(stripe, lo);
        let mut bufs: Vec<AlignedBuf> = (0..k + np).map(|_| AlignedBuf::zeroed(len)).collect();
        let members: Vec<usize> = (0..k + np).map(|i| g.stripe_member(stripe, i)).collect();
        let missing: Vec<usize> = (0..k + np)
            .filter(|i| !array.is_active(members[*i]))
            .collect();
        {
            let reqs: Vec<IoReq<'_>> = bufs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| !missing.contains(i))
                .map(|(i, b)| IoReq::read(members[i], at, b))
                .collect();
            array.run(reqs)?;
        }
        let modified = |i: usize| entry.modified & (1 << i) != 0;
        let unmodified_missing: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|i| *i < k && !modified(*i))
            .collect();
        let modified_missing: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|i| *i < k && modified(*i))
            .collect();
        let fail = |source| EngineError::ReconstructStripe { stripe, source };
        if !unmodified_missing.is_empty() {
            // A stripe whose modified chunks are zero and whose parity is PP/QP is consistent: solve it (from the
            // halves there are: `pair_halves` kept only entries whose halves suffice).
            assert!(
                entry.payload,
                "an entry without payload counts every chunk as modified"
            );
            let from = ((lo / PAGE_BYTES - entry.page_first) * PAGE_BYTES) as usize;
            let halves = [&entry.pp, &entry.qp];
            let mut solve = unmodified_missing.clone();
            solve.extend((k..k + np).filter(|i| halves[i - k].is_none()));
            assert!(
                solve.len() <= np,
                "stripe {stripe}: more unknowns than partial parities"
            );
            let mut virt: Vec<Vec<u8>> = (0..k + np)
                .map(|i| match (i >= k).then(|| halves[i - k]) {
                    Some(Some(half)) => half[from..from + len].to_vec(),
                    Some(None) => vec![0u8; len],
                    None if modified(i) || missing.contains(&i) => vec![0u8; len],
                    None => bufs[i].to_vec(),
                })
                .collect();
            let mut refs: Vec<&mut [u8]> = virt.iter_mut().map(|v| &mut v[..]).collect();
            array
                .parity
                .recover(&mut refs, has_q, &solve)
                .map_err(fail)?;
            for &i in &unmodified_missing {
                bufs[i].copy_from_slice(&virt[i]);
            }
        }
        if !modified_missing.is_empty() {
            // Being written when the power went and now missing: whatever the parity on the members says.
            let mut solve: Vec<usize> = modified_missing.clone();
            solve.extend(missing.iter().copied().filter(|i| *i >= k));
            let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            array
                .parity
                .recover(&mut refs, has_q, &solve)
                .map_err(fail)?;
        }
        {
            let (data, parity) = bufs.split_at_mut(k);
            let data: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
            let (p, q) = parity.split_at_mut(1);
            match q.first_mut() {
                Some(q) => array.parity.gen_pq(&data, &mut p[0], q),
                None => array.parity.gen_p(&data, &mut p[0]),
            }
        }
        let reqs: Vec<IoReq<'_>> = (k..k + np)
            .filter(|i| !missing.contains(i))
            .map(|i| IoReq::write(members[i], at, &bufs[i], false))
            .collect();
        array.stripe_cache.forget(stripe, 1); // new parity (stripe_cache.rs)
        array.run(reqs)?;
        Ok(unmodified_missing.len() as u64)
    }
}

/// Takes data chunk `index` (its bytes `chunk`) out of parity: P ^= D_i, and Q ^= g^i * D_i where there is a Q.
fn take_out(array: &Array, index: usize, chunk: &[u8], pp: &mut [u8], mut qp: Option<&mut [u8]>) {
    let len = chunk.len();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZEROS.len());
        let q = qp.as_deref_mut().map(|q| &mut q[done..done + n]);
        array.parity.update(
            index,
            &chunk[done..done + n],
            &ZEROS[..n],
            &mut pp[done..done + n],
            q,
        );
        done += n;
    }
}

/// Whether the new parity of `v`'s stripe leans on pages not yet durable that the write does not overwrite: its
/// entries would count their chunks as modified (the writer borrows, module doc).
fn leans_on_unflushed(st: &LogState, v: &StripeView<'_>) -> bool {
    st.stripes.get(&v.stripe).is_some_and(|log| {
        log.dirty.iter().any(|d| {
            let lo = d.range.start.max(v.r.start);
            let hi = d.range.end.min(v.r.end);
            lo < hi
                && !v
                    .written
                    .iter()
                    .any(|(i, w)| *i == d.index && w.start <= lo && w.end >= hi)
        })
    })
}

/// One writer of `round` is done with its in-place writes.
fn writer_done(st: &mut LogState, round: u64) {
    if let Some(n) = st.inflight.get_mut(&round) {
        *n -= 1;
        if *n == 0 {
            st.inflight.remove(&round);
        }
    }
}

/// The oldest round with writers still writing in place (or the next round when none).
fn oldest_unfinished(st: &LogState) -> u64 {
    st.inflight
        .keys()
        .next()
        .copied()
        .unwrap_or(st.next_seq)
        .min(st.next_seq)
}

fn flush_done_locked(st: &mut LogState, mark: FlushMark) {
    // A write that rode an older round after this flush began (still writing, or completed too late to be
    // covered) keeps that round unflushed.
    st.ridden.retain(|_, epoch| *epoch > mark.epoch);
    let mut seq = mark.seq;
    if let Some(&ridden) = st.ridden.keys().next() {
        seq = seq.min(ridden);
    }
    if let Some(&writing) = st.inflight.keys().next() {
        seq = seq.min(writing);
    }
    st.flushed_seq = st.flushed_seq.max(seq);
    st.flushed_epoch = st.flushed_epoch.max(mark.epoch);
    let retired = st.retired_seq;
    st.stripes.retain(|_, s| {
        s.dirty.retain(|d| d.epoch > mark.epoch);
        !s.dirty.is_empty() || s.last_seq >= retired
    });
}

impl LogFailure {
    fn from_error(e: EngineError) -> LogFailure {
        match e {
            EngineError::AccessMember {
                slot, path, source, ..
            } => LogFailure {
                slot: Some(slot),
                path,
                kind: source.kind(),
                message: source.to_string(),
            },
            other => LogFailure {
                slot: None,
                path: String::new(),
                kind: io::ErrorKind::Other,
                message: other.to_string(),
            },
        }
    }

    fn into_error(self) -> EngineError {
        EngineError::LogPartialParity {
            slot: self.slot,
            path: self.path,
            source: io::Error::new(self.kind, self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_crc32c() {
        let mut x = 1u64;
        for len in [
            0usize, 1, 7, 8, 9, 3071, 3072, 3073, 4092, 4096, 6144, 8192, 9221, 12345,
        ] {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            assert_eq!(checksum(&bytes), crc32c(&bytes), "{len} bytes");
        }
        assert_eq!(checksum(b"123456789"), 0xE306_9283);
        // A header with a zero tail: the computed share of the zeros matches reading them.
        let mut page = vec![0u8; CHECKSUM_AT];
        for used in [0usize, 1, 64, 96, 1000, 4091, CHECKSUM_AT] {
            page.iter_mut()
                .take(used)
                .enumerate()
                .for_each(|(i, b)| *b = (i * 7 + 3) as u8);
            page[used..].fill(0);
            assert_eq!(
                checksum_zero_tail(&page, used),
                crc32c(&page),
                "{used} bytes used"
            );
        }
    }

    #[test]
    fn ring_places_records_contiguously_and_wraps_only_into_free_space() {
        let ring_pages = 10;
        let mut ring = Ring::default();
        let mut c = ring.cursor();
        assert_eq!(c.place(4, ring_pages), Some(0));
        assert_eq!(c.place(4, ring_pages), Some(4));
        // 2 pages left at the end, the start is taken: a 3-page record does not fit.
        assert_eq!(c.place(3, ring_pages), None);
        assert_eq!(c.place(11, ring_pages), None);
        ring.live.push_back((1, 0, 4));
        ring.live.push_back((2, 4, 4));
        ring.head = 8;
        // The first record retired: its 4 pages at the start are free; a record never wraps around the end.
        ring.live.pop_front();
        let mut c = ring.cursor();
        assert_eq!(c.place(3, ring_pages), Some(0));
        assert_eq!(c.place(1, ring_pages), Some(3));
        assert_eq!(
            c.place(1, ring_pages),
            None,
            "up to the oldest live record at 4"
        );
        // Everything retired: the ring starts wherever it is, wrapping when the record does not fit before the end.
        ring.live.clear();
        let mut c = ring.cursor();
        assert_eq!(c.place(2, ring_pages), Some(8));
        let mut c = ring.cursor();
        assert_eq!(c.place(3, ring_pages), Some(0));
    }
}
