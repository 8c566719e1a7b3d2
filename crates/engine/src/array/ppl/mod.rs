//! Partial parity log (PPL): closes the RAID5/6 write hole when a member is missing at restart.
//!
//! Before the in-place writes of a stripe write start, the *partial parity* of the stripe — P (and for RAID6 Q)
//! of the data chunks the write does not touch — is made durable in a ring on the stripe's P member (RAID5: or on a
//! member whose chunk the entry counts as modified, `spread`) and (RAID6) its Q member: RAID6 splits it, PP to the
//! P member and QP to the Q member (a parity member present alone gets both), and recovery pairs the halves
//! (`pair_halves`). After a crash, whatever state the written chunks and the parity are in, parity is recomputed
//! as `PP xor (written chunks as found)`, so a missing chunk that was not being written reconstructs intact. The on-disk format is in docs/format.md ("Partial parity log"); why this design,
//! and what it costs, in docs/reliability.md ("Write hole").
//!
//! Here: the types, the rules and the state shared by the parts. `entries` decides what a write logs and
//! computes its partial parity; `streams` decides which writes ride or make stream entries; `rounds` lays queued
//! entries out as records and writes them (group commit); `spread` picks each RAID5 entry's ring; `retire` covers
//! flushes and when records may be forgotten; `recovery` reads the rings back at assembly; `ring` places records
//! in a member's ring; `checksum` is the records' CRC-32C.
//!
//! Rules that keep an entry valid until it is retired:
//! * an entry's `modified` set holds the chunks this write touches plus every chunk written to the stripe since the
//!   last flush of every member (their data may not be durable); its partial parity covers the other chunks, whose
//!   values are durable and do not change while the entry is live. Journal mode excepts pages a live data entry
//!   carries (`Dirty::carried`): not counted, their new values are in the partial parity, and recovery solves
//!   with them as the data entry has them (`carried_before`), whatever the member kept; such an entry stays
//!   live while its pages are not durable (`assert_dirty_rounds_live`). Counted, they made the entry lean on a
//!   data entry a flush for ring room could retire while the writer was in flight (seed 30660306);
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
//! commit. Only a stream seen twice in a row reaches ahead (`Stream::continued`): random small writes land on
//! the page after another's too often for one continuation to say "stream". A stream that reaches the end of a
//! chunk continues in the next chunk of the array: the first write there extends at once. Rides need every member
//! active and the member states unchanged since the entry was made.
//! Journal mode has them with lone answers only, and only where no data entry is live: recovery rolls a live data
//! entry forward over the pages it holds, so a ride of those pages (which logs nothing, not even a marker) would be
//! rolled back. A window whose data the log carries makes no stream entry and rides none. A write its client
//! waits for that continues a stream (`continues_streams`) takes the log's way, not the journal's: answered once
//! written in place, it leaves no data entry that would stop the stream's next writes from riding.
//! A write window rides in all its stripes or in none: a writer holding a ride never waits for a round of its
//! own, which could be waiting for ring space that only retiring the ridden round would free.
//!
//! Group commit: writers queue their entries; a writer that finds fewer than `rounds_in_flight` rounds being
//! written takes the whole queue as one round (one record per member, FUA) and wakes the others when it is
//! durable. Under load the queue fills while rounds are in flight, so concurrent writers share log writes.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

mod checksum;
mod entries;
mod recovery;
mod retire;
mod ring;
mod rounds;
mod spread;
mod streams;

use super::Array;
use crate::buf::AlignedBuf;
use crate::crc32c::crc32c;
use crate::error::EngineError;
use crate::layout::{Geometry, Level, PAGE_BYTES};
use crate::member::IoReq;
use crate::uuid::Uuid;
use checksum::checksum_zero_tail;
pub(crate) use recovery::LogRecovery;
use ring::{Ring, RingCursor};
pub(in crate::array) use streams::StreamTouch;

const RING_MAGIC: [u8; 8] = *b"PARAIDPH";
/// Writers at work in the log (between their entries and the end of their in-place writes) from which the log
/// counts as deep (`Ppl::log_is_deep`) unless `AssembleOptions::log_deep_writers` says otherwise: a journal write
/// no longer logs its data first (`Ppl::log_data_first`), and one in a stripe without a live entry logs its
/// partial parity alone (`Ppl::parity_alone`).
pub(crate) const DEEP_WRITERS_DEFAULT: usize = 4;

/// Waited-for writes `Ppl::note_waited_for` keeps to tell a commit stream by (one per stream of several writers).
pub(crate) const WAITED_FOR_KEPT: usize = 8;

/// Turns the journal's data-first rounds off ("0", "off", "false", "no"): `Ppl::log_data_first`.
pub const DATA_FIRST_ENV: &str = "PARAID_JOURNAL_DATA_FIRST";
/// Turns off ("0", "off", "false", "no") that a journal write where the log is deep logs its partial parity alone
/// (`Ppl::parity_alone`) instead of its data.
pub const PARITY_ALONE_ENV: &str = "PARAID_JOURNAL_PARITY_ALONE";
/// Turns lone answers on ("1", "on", "true", "yes") in journal mode: only a write that no other awaits an answer
/// beside is answered from the log (`Ppl::await_answer`); "auto" too, and only while the machine has CPU to spare
/// (`spare_cpu.rs`, `AssembleOptions::gate_answers_on_spare_cpu`).
pub const LONE_ANSWERS_ENV: &str = "PARAID_JOURNAL_LONE";

/// Whether `PARAID_JOURNAL_LONE` says "auto" (any case): lone answers gated on the machine's idle CPU.
pub fn lone_answers_auto_by_env() -> bool {
    std::env::var(LONE_ANSWERS_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("auto"))
}
/// Turns off ("0", "off", "false", "no") that RAID5 entries may go to the ring of a member whose chunk they count
/// as modified instead of the P member's (`spread.rs`): to measure against.
pub const SPREAD_ENV: &str = "PARAID_PPL_SPREAD";
const RECORD_MAGIC: [u8; 8] = *b"PARAIDPL";
/// Written by this version: RAID6 entries may be split (PP on the P member, QP on the Q member). Readers accept
/// `LOG_VERSION_WHOLE` records too (every payload whole, on both members).
const LOG_VERSION: u32 = 2;
const LOG_VERSION_WHOLE: u32 = 1;
/// Version 3: the record also holds data entries (`FLAG_DATA`, journal mode). Records without them are written as
/// version 2, so an array that never ran in journal mode keeps the version 2 format.
const LOG_VERSION_DATA: u32 = 3;
const ENTRY_BYTES: usize = 32;
const ENTRIES_AT: usize = 64;
const CHECKSUM_AT: usize = 4092;
/// Entries one record header holds.
pub(crate) const ENTRIES_PER_RECORD: usize = (CHECKSUM_AT - ENTRIES_AT) / ENTRY_BYTES;
const FLAG_PAYLOAD: u8 = 1;
/// Version 2: which partial parities the entry's payload in this record holds (PP first, then QP).
const FLAG_PP: u8 = 2;
const FLAG_QP: u8 = 4;
/// Version 3: a data entry (journal mode): the new contents of one data chunk (index in the `modified` field) over
/// the entry's pages, or with no payload a marker that the chunk's pages hold whatever they hold (written by a
/// write whose data the log does not carry). At recovery, per chunk page, the newest data entry decides: its
/// contents are written in place before parity is recomputed (roll forward), a marker leaves the page as found.
const FLAG_DATA: u8 = 8;
/// Environment variable that sets the log rounds written at the same time (1 to 16), overriding
/// `default_log_rounds_in_flight`: for measuring group commit.
pub const PPL_ROUNDS_ENV: &str = "PARAID_PPL_ROUNDS";

/// What `PARAID_PPL_ROUNDS` says, if it is set to a number from 1 to 16 (anything else is ignored, with a warning).
pub fn log_rounds_in_flight_from_env() -> Option<usize> {
    count_from_env(PPL_ROUNDS_ENV, 1..=16)
}

/// The number the environment variable `name` holds, if it is set to one within `allowed`; anything else is
/// ignored, with a warning (these settings are for measuring: a typo must not stop a server).
fn count_from_env(name: &str, allowed: std::ops::RangeInclusive<usize>) -> Option<usize> {
    let text = std::env::var(name).ok()?;
    match text.trim().parse::<usize>() {
        Ok(n) if allowed.contains(&n) => Some(n),
        _ => {
            log::warn!(
                "{name}={text:?} is not a number from {} to {}; using the default",
                allowed.start(),
                allowed.end()
            );
            None
        }
    }
}

/// Environment variable that sets the writers at work from which the log counts as deep (0 to 64: 0, always deep;
/// `DEEP_WRITERS_DEFAULT` otherwise), overriding it: for measuring journal mode's data-first rounds.
pub const DEEP_WRITERS_ENV: &str = "PARAID_LOG_DEEP_WRITERS";

/// What `PARAID_LOG_DEEP_WRITERS` says, if it is set to a number from 0 to 64 (anything else is ignored, with a
/// warning).
pub fn log_deep_writers_from_env() -> Option<usize> {
    count_from_env(DEEP_WRITERS_ENV, 0..=64)
}

/// Log rounds written at the same time when none was asked for. More writers than this share rounds (group
/// commit); fewer each write their own. On members that are drives, one: the writers that arrive while a round is
/// written go out together in the next, so a small write costs its stripe's members fewer log requests (on disks
/// at their IOPS limit, RAID5 of five: 0.65 record writes per write instead of 0.8, the log's cost -9.6 % instead
/// of -15 %; docs/reliability.md, "Stop 20"), for at most one log write's wait. On members in memory (tmpfs) a
/// log write is a copy the writer makes itself, so the CPU is the limit and rounds side by side use it: four
/// (one there made random 4 KiB writes from four threads 20-40 % slower).
pub fn default_log_rounds_in_flight(members_in_memory: bool) -> usize {
    if members_in_memory {
        4
    } else {
        1
    }
}
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

/// One log entry: a page range of a stripe, its `modified` set and partial parity (none: every chunk modified); or
/// (`data_index`) a data entry: the new contents of one data chunk over the range (none: a marker, see
/// `FLAG_DATA`).
struct Entry {
    stripe: u64,
    page_first: u32,
    pages: u32,
    modified: u64,
    /// PP pages, then (RAID6) QP pages; for a data entry, the chunk's pages.
    payload: Option<AlignedBuf>,
    /// Members whose ring gets the entry (P and Q members present; a data entry also the chunk's own member).
    /// RAID5: `spread_round` may move it from the P member to a member whose chunk `modified` holds.
    slots: [Option<usize>; 3],
    /// A data entry of this data chunk.
    data_index: Option<usize>,
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
        if self.data_index.is_some() {
            // The whole payload on every member that gets it: any member missing leaves a copy.
            return FLAG_DATA
                | if self.payload.is_some() {
                    FLAG_PAYLOAD
                } else {
                    0
                };
        }
        if self.payload.is_none() {
            return 0;
        }
        match self.slots {
            [Some(p), Some(_), _] if has_q => {
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
        let data = (parts & FLAG_DATA != 0 && parts & FLAG_PAYLOAD != 0).then_some(payload);
        [(FLAG_PP, 0usize), (FLAG_QP, 1)]
            .into_iter()
            .filter(move |(flag, _)| parts & FLAG_DATA == 0 && parts & flag != 0)
            .map(move |(_, n)| &payload[n * span..(n + 1) * span])
            .chain(data)
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
    /// The oldest round whose records the write relied on (its own round, or one it rode), if any: that round
    /// must stay live until a flush makes the pages durable (`assert_dirty_rounds_live`).
    round: Option<u64>,
    /// Journal mode: that round's data entries carry these pages (the write was answerable from the log), so
    /// recovery rolls them forward whatever the member kept: a later entry of the stripe need not count the
    /// chunk as modified there (`dirty_over`).
    carried: bool,
}

/// A stream entry (module doc): its round, the one data chunk it counts as modified, the in-chunk bytes it covers,
/// the member states it was made under, and whether the write that made it continued a stream itself.
#[derive(Debug, Clone)]
struct Stream {
    seq: u64,
    index: usize,
    range: Range<u64>,
    health_epoch: u64,
    continued: bool,
}

/// A stream entry a window logs (`Ppl::stream_entry`), remembered as its stripe's `Stream` once its round is
/// known.
pub(super) struct NewStream {
    stripe: u64,
    index: usize,
    range: Range<u64>,
    /// The write continued a stream (`Stream::continued`).
    continued: bool,
}

/// Per stripe: the pages that are not durable, and whether a live entry exists.
#[derive(Default, Clone)]
struct StripeLog {
    dirty: Vec<Dirty>,
    /// Newest round holding an entry of this stripe (0: none).
    last_seq: u64,
    /// Journal mode: newest round holding a data entry that carried this stripe's data (0: none): a data entry
    /// recovery would roll forward (`has_live_data_entry`).
    last_data_seq: u64,
    /// The stripe's newest entry if it is a stream entry (valid while `seq == last_seq`).
    stream: Option<Stream>,
    /// Newest round whose only entries of this stripe were whole markers (every chunk modified, every page, no
    /// payload: recovery recomputes the stripe's parity from its data); while it is `last_seq`, a full-stripe
    /// write there logs nothing (`entries_for`).
    last_whole_seq: u64,
}

impl StripeLog {
    /// The stream entry, if it is still the stripe's newest entry (rounds are numbered from 1, so a stripe
    /// without a live entry, `last_seq` 0, has none).
    fn newest_stream(&self) -> Option<&Stream> {
        self.stream.as_ref().filter(|s| s.seq == self.last_seq)
    }

    /// Whether the stripe has a live entry: a newest round not retired below `retired`.
    fn has_live_entry(&self, retired: u64) -> bool {
        self.last_seq != 0 && self.last_seq >= retired
    }

    /// Journal mode: whether the stripe has a live data entry that carried data (recovery would roll it
    /// forward over the pages it holds, unless newer data entries or markers void it).
    fn has_live_data_entry(&self, retired: u64) -> bool {
        self.last_data_seq != 0 && self.last_data_seq >= retired
    }

    /// Whether the log must remember the stripe: it has pages not yet durable, or a live entry (its newest round
    /// is not retired below `retired`).
    fn remembered(&self, retired: u64) -> bool {
        !self.dirty.is_empty() || self.last_seq >= retired
    }

    fn add_dirty(
        &mut self,
        index: usize,
        range: Range<u64>,
        epoch: u64,
        mut round: Option<u64>,
        carried: bool,
    ) {
        let mut range = range;
        // Where this write overlaps pages an earlier one left the other way (carried by a data entry, or not),
        // this write decides: its data entry rolls them forward, or its markers void the older entry. Merged into
        // one range counted as not carried, the carried pages of a write answered from the log made the stripe's
        // next entry count their chunk as modified; a flush making room in the ring then retired that data entry
        // while the next write was in flight, and recovery solved the chunk from parity the write tore (seed
        // 30826522, `journal::carried_pages_stay_carried_beside_pages_a_write_left_out_of_the_log`).
        self.cut(index, &range, |d| d.carried != carried);
        // Merge with touching ranges of the same chunk, epoch and kind (a flush clears them together).
        self.dirty.retain(|d| {
            let mergeable = d.index == index
                && d.epoch == epoch
                && d.carried == carried
                && d.range.start <= range.end
                && range.start <= d.range.end;
            if mergeable {
                range = range.start.min(d.range.start)..range.end.max(d.range.end);
                round = match (round, d.round) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            !mergeable
        });
        self.dirty.push(Dirty {
            index,
            range,
            epoch,
            round,
            carried,
        });
    }

    /// A FUA write made these pages durable.
    fn clean(&mut self, index: usize, range: &Range<u64>) {
        self.cut(index, range, |_| true);
    }

    /// Takes `range` of chunk `index` out of the ranges `which` picks.
    fn cut(&mut self, index: usize, range: &Range<u64>, which: impl Fn(&Dirty) -> bool) {
        let mut kept = Vec::with_capacity(self.dirty.len() + 1);
        for d in self.dirty.drain(..) {
            if d.index != index
                || d.range.end <= range.start
                || range.end <= d.range.start
                || !which(&d)
            {
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

    /// Chunks with pages not durable anywhere in `range`; with `skip_carried`, leaving out pages a live data
    /// entry carries (journal mode): recovery rolls those forward, so the partial parity may hold their values.
    fn dirty_over(&self, range: &Range<u64>, skip_carried: bool) -> u64 {
        self.dirty
            .iter()
            .filter(|d| d.range.start < range.end && range.start < d.range.end)
            .filter(|d| !(skip_carried && d.carried))
            .fold(0, |m, d| m | (1 << d.index))
    }
}

struct Submission {
    id: u64,
    entries: Vec<Entry>,
    /// Pages to set aside in the round per member's ring (by slot; empty: none), for records the submitter
    /// writes later with the round's sequence number (`commit_reserving`).
    reserve: Vec<u64>,
}

/// Ring space set aside in a round for records written later with its sequence number: (slot, first page,
/// pages).
pub(super) type Reserved = Vec<(usize, u64, u64)>;

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
    /// Finished submissions' ring space set aside (`Submission::reserve`).
    reserved: HashMap<u64, Reserved>,
    /// Threads waiting on `changed`.
    waiters: usize,
    /// Writers parked in group commit (`Ppl::wait_for_round`): their submission and thread, so that a round's end
    /// wakes those it concerns (`Ppl::wake_after_round`) and a rarer change all of them (`Ppl::wake_everyone`).
    round_waiters: Vec<(u64, std::thread::Thread)>,
    /// Rounds being written now (at most `Ppl::rounds_in_flight`).
    rounds_writing: usize,
    /// Records being written into space a round set aside (`Ppl::write_reserved`): not rounds (group commit does
    /// not wait for them), but log writes all the same (`LogState::log_writes_busy`).
    reserved_writing: usize,
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
    /// Journal mode with lone answers: the array bytes of the last writes a client waited for, oldest first, at
    /// most `WAITED_FOR_KEPT` (`note_waited_for`).
    recent_waited_for: VecDeque<Range<u64>>,
    rings: Vec<Ring>,
    stripes: HashMap<u64, StripeLog>,
    /// The stripes of `stripes` whose `dirty` is not empty: all a flush has to clean (the map also holds every
    /// stripe with a live entry, far more under load, and a client flush comes with every database commit).
    dirty_stripes: HashSet<u64>,
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
    /// RAID5 with `Ppl::spread`: per stripe, the rings that may hold its live entries (`spread.rs`).
    placed: HashMap<u64, spread::Placed>,
}

impl LogState {
    /// Whether any log record is being written (a round, or into space a round set aside): a ring copied to a
    /// replacement, or retired as a whole, waits until none is.
    fn log_writes_busy(&self) -> bool {
        self.rounds_writing > 0 || self.reserved_writing > 0
    }
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
    /// Flushes of every member the background tick made because chunks were still not durable (which is what
    /// turns read-modify-writes into reconstruct-writes).
    pub tick_flushes: u64,
    /// Stripes of writes that logged nothing, riding a stream entry; stream entries extended ahead of their write.
    pub rides: u64,
    pub stream_extensions: u64,
    /// Journal mode: rounds of data entries logged before a write read anything (`log_data_first`).
    pub data_first: u64,
    /// Journal mode: windows that logged their partial parity alone, the log being deep or the write not lone
    /// (`parity_alone`).
    pub parity_alone: u64,
    /// Journal mode with lone answers: writes through `Array::write_answering` that found another awaiting its
    /// answer and took the log's own way (`await_answer`).
    pub not_lone: u64,
    /// Full-stripe writes that logged no marker, the stripe's newest live entry being a whole marker already
    /// (`StripeLog::last_whole_seq`).
    pub markers_skipped: u64,
    /// Journal mode with a gate on spare CPU (`AssembleOptions::spare_cpu`): writes through
    /// `Array::write_answering` that found the CPU busy and took the log's own way.
    pub cpu_busy: u64,
    /// Journal mode gated on spare CPU: writes the CPU allowed an answer from the log beside others awaiting
    /// theirs, which took the log's own way because the members queue requests (array/queueing.rs).
    pub members_queue: u64,
    /// Borrowing writers (module doc): windows whose entries count as modified a chunk another write left not yet
    /// durable; those that waited for a client flush under way, and the time they waited (µs).
    pub borrowing: u64,
    pub borrowing_waits: u64,
    pub borrowing_wait_us: u64,
    /// Client flushes that waited for borrowing writers in flight (`barrier_begin`), and the time they waited (µs).
    pub barrier_waits: u64,
    pub barrier_wait_us: u64,
    /// RAID5: stripes whose entries a round put on a written chunk's member's ring, not the P member's
    /// (`spread.rs`).
    pub entries_off_parity: u64,
}

/// A write awaiting its answer (`Ppl::await_answer`): counted until `answered` or dropped.
pub(crate) struct AwaitedAnswer<'a> {
    awaited: &'a AtomicUsize,
    answered: AtomicBool,
    may_answer: bool,
}

impl AwaitedAnswer<'_> {
    /// Whether the write may be answered from the log.
    pub(crate) fn may_answer(&self) -> bool {
        self.may_answer
    }

    /// The write was answered: it no longer counts (once, however often this is called).
    pub(crate) fn answered(&self) {
        if !self.answered.swap(true, Ordering::SeqCst) {
            self.awaited.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for AwaitedAnswer<'_> {
    fn drop(&mut self) {
        self.answered();
    }
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
    /// Journal mode (`AssembleOptions::journal`): partial-stripe writes log their new data too (data entries), and
    /// a write whose data the log carries may be answered once its round is durable (`Logged::answerable`).
    journal: bool,
    /// Journal mode: small page-aligned writes log their data before they read (`log_data_first`); on unless
    /// `PARAID_JOURNAL_DATA_FIRST` says off (to measure against).
    data_first: bool,
    /// Journal mode: a write where the log is deep may log its partial parity alone (`parity_alone`).
    parity_alone_on: bool,
    /// Journal mode: only a lone write is answered from the log (`await_answer`; `AssembleOptions::journal_lone_answers`;
    /// implies `journal`).
    lone_answers: bool,
    /// Writes through `Array::write_answering` not yet answered (`await_answer`).
    answers_awaited: AtomicUsize,
    /// `LogStats::cpu_busy`, counted apart from `stats`: it is counted per write where the CPU is the limit, and
    /// the stats' lock is shared by every writer.
    cpu_busy: AtomicU64,
    /// `LogStats::members_queue`, counted apart for the same reason.
    members_queue: AtomicU64,
    /// Writers at work from which the log counts as deep (`log_is_deep`).
    deep_writers: usize,
    /// Rounds written at the same time (`default_log_rounds_in_flight`).
    rounds_in_flight: usize,
    /// RAID5: partial parity entries may go to a written chunk's member's ring (`spread.rs`).
    spread: bool,
    state: Mutex<LogState>,
    /// Any change a waiter may wait for, but those of group commit's queue.
    changed: Condvar,
    flush_epoch: AtomicU64,
    stats: Mutex<LogStats>,
}

/// An entry as one record holds it: the entry and the partial parities (`FLAG_PP`, `FLAG_QP`) of its payload there.
type RecordEntry<'a> = (&'a Entry, u8);

fn record_entry_pages(&(e, parts): &RecordEntry<'_>) -> u64 {
    if parts & FLAG_DATA != 0 {
        return if parts & FLAG_PAYLOAD != 0 {
            u64::from(e.pages)
        } else {
            0
        };
    }
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
    /// Stream entries of `round`.
    streams: Vec<NewStream>,
    /// The member states the entries were made under.
    health_epoch: u64,
    /// Counted among `LogState::borrowing` until `complete`.
    borrowing: bool,
    /// Journal mode: the round holds the new contents of every byte the window writes, so the write is durable
    /// (recovery rolls it forward) before its in-place writes.
    pub answerable: bool,
    /// Journal mode: the round that carried the window's data before it read anything (`log_data_first`), held
    /// by the writer's `DataRound` until after this is dropped.
    data_round: Option<u64>,
    /// Stripes whose only entry in `round` is a whole marker (`StripeLog::last_whole_seq`).
    whole_markers: Vec<u64>,
    /// Journal mode: the window's data went into the log (its own round or `data_round`): its stripes then have
    /// a live data entry (`StripeLog::last_data_seq`).
    carried_data: bool,
}

/// Journal mode: new bytes of one data chunk for `Ppl::log_data_first`: in-chunk pages (page-aligned) and their
/// contents.
pub(in crate::array) struct DataPiece<'b> {
    pub stripe: u64,
    pub index: usize,
    pub pages: Range<u64>,
    pub bytes: &'b [u8],
}

/// Journal mode: a round of data entries logged before the write read anything (`Ppl::log_data_first`). The
/// writer counts among the round's writers until this is dropped, after the window's `Logged`: the round is not
/// taken as flushed, nor retired, while the write's pages may not be durable in place.
pub(in crate::array) struct DataRound<'a> {
    ppl: &'a Ppl,
    pub seq: u64,
    /// Ring space the round set aside for the window's partial parity (`Ppl::write_reserved`).
    reserved: Reserved,
}

impl Drop for DataRound<'_> {
    fn drop(&mut self) {
        let mut st = self.ppl.lock();
        writer_done(&mut st, self.seq);
        self.ppl.wake(st);
    }
}

/// Taken before a flush of every member, handed to `flush_done` after.
#[derive(Clone, Copy, Debug)]
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

/// The most ring pages one request's records take on one member: it logs at most two partial stripes, a member
/// may hold the parity of both (RAID6: P of one, Q of the next), each entry PP and QP over a whole chunk, plus
/// record headers. A ring of fewer than twice this is not used.
pub(crate) fn one_request_pages(level: Level, chunk_bytes: u64) -> u64 {
    let np = level.parity_chunks() as u64;
    2 * np * (chunk_bytes / PAGE_BYTES) + 4
}

/// How the log runs (from `AssembleOptions`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogOptions {
    /// Writing new entries (recovery of existing ones happens regardless).
    pub enabled: bool,
    /// Stream entries and rides.
    pub streams: bool,
    /// Journal mode (data entries, answers from the log).
    pub journal: bool,
    /// Rounds written at the same time.
    pub rounds_in_flight: usize,
    /// Writers at work from which the log counts as deep (`DEEP_WRITERS_DEFAULT`; 0: always).
    pub deep_writers: usize,
    /// Journal mode: a write where the log is deep may log its partial parity alone (`Ppl::parity_alone`).
    pub parity_alone: bool,
    /// Journal mode: only a write that no other write awaits an answer beside is answered from the log; the
    /// others take the log's own way (`Ppl::await_answer`).
    pub lone_answers: bool,
    /// RAID5 without the journal: entries may leave the P member's ring (`spread.rs`).
    pub spread: bool,
}

impl Ppl {
    /// The log of an array whose superblock places the ring at `offset_bytes .. + bytes`. `None` when there is no
    /// ring (RAID0/1/10, version 1 before its upgrade).
    pub(crate) fn new(
        geometry: &Geometry,
        uuid: Uuid,
        offset_bytes: u64,
        bytes: u64,
        options: LogOptions,
    ) -> Option<Ppl> {
        let LogOptions {
            enabled,
            streams,
            journal,
            rounds_in_flight,
            deep_writers,
            parity_alone: parity_alone_on,
            lone_answers,
            spread,
        } = options;
        if !geometry.level.has_parity() || bytes < 2 * PAGE_BYTES {
            return None;
        }
        let ring_pages = bytes / PAGE_BYTES - 1;
        let one_request = one_request_pages(geometry.level, geometry.chunk_bytes);
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
            // A write riding a stream entry logs nothing, so its data is not in the log: in journal mode only with
            // lone answers, where writes log their partial parity alone unless answered from the log, and only
            // in stripes without a live data entry (`continues_streams`, `take_rides`).
            streams: streams && (!journal || lone_answers),
            journal: journal && enabled,
            data_first: super::switch_on_by_env(DATA_FIRST_ENV),
            parity_alone_on,
            lone_answers: lone_answers && journal && enabled,
            answers_awaited: AtomicUsize::new(0),
            cpu_busy: AtomicU64::new(0),
            members_queue: AtomicU64::new(0),
            deep_writers,
            rounds_in_flight: rounds_in_flight.max(1),
            spread: spread && geometry.level == Level::Raid5,
            state: Mutex::new(LogState {
                queue: VecDeque::new(),
                next_submission: 0,
                done: HashMap::new(),
                reserved: HashMap::new(),
                waiters: 0,
                round_waiters: Vec::new(),
                rounds_writing: 0,
                reserved_writing: 0,
                retiring: false,
                paused: false,
                barriers: 0,
                borrowing: 0,
                mirror: None,
                placed: HashMap::new(),
                next_seq: 1,
                retired_seq: 0,
                flushed_seq: 0,
                flushed_epoch: 0,
                inflight: BTreeMap::new(),
                ridden: BTreeMap::new(),
                wanting_room: 0,
                recent_waited_for: VecDeque::with_capacity(WAITED_FOR_KEPT),
                rings: (0..geometry.members).map(|_| Ring::default()).collect(),
                stripes: HashMap::new(),
                dirty_stripes: HashSet::new(),
            }),
            changed: Condvar::new(),
            flush_epoch: AtomicU64::new(1),
            stats: Mutex::new(LogStats::default()),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn journal(&self) -> bool {
        self.journal
    }

    /// Journal mode with lone answers (`LogOptions::lone_answers`).
    pub(crate) fn lone_answers(&self) -> bool {
        self.lone_answers
    }

    /// Journal mode: counts a write through `Array::write_answering` as awaiting its answer until the returned
    /// guard is answered or dropped, and says whether it may be answered from the log. With lone answers on
    /// (`LogOptions::lone_answers`) only a write that found no other awaiting its answer may; the others take
    /// the log's own way (partial parity alone where their stripes have no live entry, answered once in place).
    /// Why: a write that waits alone saves a device round trip by its early answer (the client waits for each),
    /// while writes that wait beside others share the rounds anyway and pay the data entries' bytes and CPU for
    /// it (docs/reliability.md, "Lone answers"). `spare_cpu`: the caller's gate on spare CPU
    /// (`AssembleOptions::spare_cpu`) said `Spare::ForAll`, which lifts the lone rule: where the CPU idles that
    /// much, an early answer at depth lets a client waiting on the members' latency send its next write a round
    /// trip sooner, for CPU nothing else wanted (spare_cpu.rs).
    pub(crate) fn await_answer(&self, spare_cpu: bool) -> AwaitedAnswer<'_> {
        let before = self.answers_awaited.fetch_add(1, Ordering::SeqCst);
        let may_answer = !self.lone_answers || spare_cpu || before == 0;
        if !may_answer {
            self.add_stats(|s| s.not_lone += 1);
        }
        AwaitedAnswer {
            awaited: &self.answers_awaited,
            answered: AtomicBool::new(false),
            may_answer,
        }
    }

    /// A write through `Array::write_answering` found the CPU busy and takes the log's own way.
    pub(crate) fn note_cpu_busy(&self) {
        self.cpu_busy.fetch_add(1, Ordering::Relaxed);
    }

    /// A write the CPU allowed an early answer at depth took the log's own way: the members queue requests.
    pub(crate) fn note_members_queue(&self) {
        self.members_queue.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> LogStats {
        LogStats {
            cpu_busy: self.cpu_busy.load(Ordering::Relaxed),
            members_queue: self.members_queue.load(Ordering::Relaxed),
            ..*self.stats.lock().unwrap_or_else(|e| e.into_inner())
        }
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

    /// Group commit: the writer of submission `id` waits, parked, until a round's end concerns it (its submission
    /// is done, or it may lead the next round: `wake_after_round`) or something rarer changed (`wake_everyone`).
    /// Why not a condition variable: a round's end would wake every queued writer (with four rounds in flight
    /// and 32 writers, most of them for a round still being written) to sleep again, each wake-up a system call
    /// and a contended lock; parked, a writer is woken by name (docs/benchmarks.md, "Group commit wakes writers
    /// by name (stop 55)"). A wake-up that comes before the park is kept by the thread (`Thread::unpark`), and
    /// the caller checks its condition again on return, so neither a lost nor a spurious one matters.
    fn wait_for_round<'a>(
        &'a self,
        mut guard: MutexGuard<'a, LogState>,
        id: u64,
    ) -> MutexGuard<'a, LogState> {
        guard.round_waiters.push((id, std::thread::current()));
        drop(guard);
        std::thread::park();
        let mut guard = self.lock();
        guard.round_waiters.retain(|(waiting, _)| *waiting != id);
        guard
    }

    /// Wakes the waiters on `changed`, if any (a wake-up with nobody waiting would still cost a system call per
    /// write); not the writers queued in group commit.
    fn wake(&self, st: MutexGuard<'_, LogState>) {
        let anyone = st.waiters > 0;
        drop(st);
        if anyone {
            self.changed.notify_all();
        }
    }

    /// Wakes every waiter, those parked in group commit too: after rarer changes (retirement, a pause) where
    /// sparing them is not worth a case.
    fn wake_everyone(&self, st: &LogState) {
        if st.waiters > 0 {
            self.changed.notify_all();
        }
        for (_, thread) in &st.round_waiters {
            thread.unpark();
        }
    }

    /// After a round's end (or a leader that gave its round up): wakes the waiters on `changed`, the writers
    /// parked in group commit whose submission is done, and, while rounds may start and submissions are queued,
    /// as many parked writers of queued submissions (the first queued first) as rounds may start, to lead them.
    /// No other parked writer's condition changed: theirs went out in a round still being written.
    fn wake_after_round(&self, st: &LogState) {
        if st.waiters > 0 {
            self.changed.notify_all();
        }
        let mut leaders = if st.paused {
            0
        } else {
            self.rounds_in_flight.saturating_sub(st.rounds_writing)
        };
        for sub in &st.queue {
            if leaders == 0 {
                break;
            }
            if let Some((_, thread)) = st.round_waiters.iter().find(|(id, _)| *id == sub.id) {
                thread.unpark();
                leaders -= 1;
            }
        }
        for (id, thread) in &st.round_waiters {
            if st.done.contains_key(id) {
                thread.unpark();
            }
        }
    }

    fn add_stats(&self, f: impl FnOnce(&mut LogStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
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
///
/// With `skip_carried` (journal mode, for borrowing), pages a live data entry carries do not count: the entry
/// counts them as unmodified, its partial parity holds their values, and recovery rolls them forward from the
/// data entry while it is live (it is, while they are not durable: `assert_dirty_rounds_live`).
fn leans_on_unflushed(st: &LogState, v: &StripeView<'_>, skip_carried: bool) -> bool {
    st.stripes.get(&v.stripe).is_some_and(|log| {
        log.dirty
            .iter()
            .filter(|d| !(skip_carried && d.carried))
            .any(|d| {
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

/// The log's bookkeeping agrees with itself: no page still counted as not durable was written under a round
/// below `live_from` (flushed, so about to be retired). Were one, its round's records (a data entry in journal
/// mode) would go while the stripe's next entry still counted the page as being written, and recovery with the
/// chunk's member missing would solve it from parity that entry's write tore (seed 30660306).
fn assert_dirty_rounds_live(st: &LogState, live_from: u64) {
    if cfg!(debug_assertions) {
        for stripe in &st.dirty_stripes {
            for d in st.stripes.get(stripe).map_or(&[][..], |s| &s.dirty[..]) {
                assert!(
                    d.round.is_none_or(|r| r >= live_from),
                    "stripe {stripe}: pages {:?} of chunk {} not durable (epoch {}), written under round {:?}, \
                     counted flushed below round {live_from}",
                    d.range,
                    d.index,
                    d.epoch,
                    d.round
                );
            }
        }
    }
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
    let LogState {
        stripes,
        dirty_stripes,
        ..
    } = st;
    dirty_stripes.retain(|stripe| {
        let Some(s) = stripes.get_mut(stripe) else {
            debug_assert!(false, "dirty stripe {stripe} not in the map");
            return false;
        };
        s.dirty.retain(|d| d.epoch > mark.epoch);
        if !s.dirty.is_empty() {
            return true;
        }
        if !s.remembered(retired) {
            stripes.remove(stripe);
        }
        false
    });
    assert_dirty_rounds_live(st, st.flushed_seq);
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

    /// Where a write overlaps pages not yet durable that an earlier write left the other way, the newer write
    /// decides whether they are carried by a data entry; ranges of one kind merge, of two kinds never.
    #[test]
    fn the_newest_write_decides_whether_its_pages_are_carried() {
        let mut log = StripeLog::default();
        let page = PAGE_BYTES;
        // Partial parity alone over pages 0-1, then a write answered from the log over pages 1-3 (one epoch).
        log.add_dirty(0, 0..2 * page, 1, Some(10), false);
        log.add_dirty(0, page..4 * page, 1, Some(11), true);
        assert_eq!(log.dirty_over(&(page..4 * page), true), 0);
        assert_eq!(log.dirty_over(&(0..page), true), 1);
        assert_eq!(log.dirty_over(&(page..4 * page), false), 1);
        // Markers over page 2: not carried there any more, still carried on pages 1 and 3.
        log.add_dirty(0, 2 * page..3 * page, 1, Some(12), false);
        assert_eq!(log.dirty_over(&(2 * page..3 * page), true), 1);
        assert_eq!(log.dirty_over(&(page..2 * page), true), 0);
        assert_eq!(log.dirty_over(&(3 * page..4 * page), true), 0);
        // Touching ranges of one kind and epoch merge, keeping the oldest round.
        log.add_dirty(1, 0..page, 1, Some(13), true);
        log.add_dirty(1, page..2 * page, 1, Some(14), true);
        let chunk_1: Vec<&Dirty> = log.dirty.iter().filter(|d| d.index == 1).collect();
        assert_eq!(chunk_1.len(), 1);
        assert_eq!(
            (chunk_1[0].range.clone(), chunk_1[0].round),
            (0..2 * page, Some(13))
        );
    }
}
