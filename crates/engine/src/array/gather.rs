//! Write gathering: sequential partial-stripe writes that are in flight together become one full-stripe write.
//!
//! A RAID5/6 write that covers part of a stripe costs reads (old data or parity), a partial parity log record,
//! and holds the stripe's lock, so the next write into the same stripe waits for all of it. A client streaming
//! 128 KiB writes at queue depth 32 into 256 KiB stripes pays that for every request, although the two halves of
//! each stripe arrive a few microseconds apart. Here the first half waits briefly for the second; together they
//! are one full-stripe write: no reads, no log record, one lock round.
//!
//! A request is cut where stripes begin: the whole stripes it covers are written at once; its piece in its first
//! stripe and its piece in its last, where they do not cover their stripe, may gather. A piece that finds an
//! open gather for its stripe joins it (copies its bytes in, and the request waits for that gather's write before
//! it is answered). A piece that starts its stripe (and does not end it) *leads* a new gather when the request
//! continues a recent write (starts where one ended: a sequential stream), is not alone in flight (at queue
//! depth 1 the continuation cannot come before this one is answered), and its continuation has not already gone
//! ahead of it. The leader waits until the stripe is covered or `GATHER_WAIT` passed (less once every write
//! in flight is parked in a gather and none is on its way in), then writes what was gathered through the
//! ordinary write path (the whole stripe, or each covered extent) and hands every participant the outcome. So
//! a stream of 1 MiB requests into 320 KiB stripes writes only full stripes: each request's tail leads the
//! stripe the next one's head completes.
//! A stream whose gathers time out in a row leads without waiting for its next 1, 2, 4 .. 16 leads.
//!
//! Pipelined streams only, and they wait longer (stop 56). A stream leads only where its previous request was
//! still in flight when this one came (`Gatherer::stream_loads`): the client keeps several of the stream's
//! writes in flight, so the continuation is on its way, and the leader waits up to `GATHER_WAIT` for it
//! (its wait ends as soon as the stripe is covered, or soon after nothing more can come: `Gatherer::parked`). A
//! sequential writer that waits for each answer (a database's log) never leads, and never waits. Where the
//! members bound the rate (a drive at its IOPS, a cloud volume at its quota) the client's next request comes
//! only as earlier ones are answered, at the members' pace, milliseconds apart, while a write waits longer than
//! that for its turn at the members anyway: in the VM on disks held to 400 requests/s, RAID6 of five (192 KiB
//! stripes) under 1 MiB writes at QD32, 110-196 of about 700 stripes were written whole with the 500 µs wait
//! (docs/benchmarks.md, "Gathering an unaligned stream's stripes (stop 56)").

//! Continuations the frontend has seen (stop 58). Where the engine idles between a stream's requests, nothing
//! above tells the tail of one from a lone write: in the VM (an emulated CPU reading 1 MiB payloads off the NBD
//! socket at about 120 MiB/s), 269 of the about 770 unaligned stripe boundaries of a 1 MiB stream at QD32 found
//! the engine otherwise empty when the request before them came (the client's next request still in the
//! socket), led no gather, and took two log entries each. The NBD server looks at the header behind each WRITE
//! it hands on; where it is a WRITE that starts at this one's end, it says so (`Array::note_write_follows`), in
//! the client's order and before this one is served. A tail piece leads where such a continuation is known to be
//! coming, whatever the counts say, and `all_parked` holds off while one is.

//! Writes queued on a busy stripe, combined. A RAID5/6 small write holds its stripe's lock through its reads, its
//! log round and its in-place writes, and a database's page writes come many at once into its hot stripes, so
//! they queue there one behind the other (docs/benchmarks.md, "OLTP: the three consistency policies, and stripe
//! lock waits (stop 41)": in 60 % of the waits the write waited for was into another chunk of the same stripe).
//! A request that lies in one stripe, partly, and finds another partial write executing there (`Table::alone`)
//! *queues*: it opens the stripe's gather and waits, not on the stripe's lock, but for the stripe to be free.
//! Writes into the stripe that come meanwhile join the gather. Then the gather is written as one write
//! (`Array::write_now_extents`): one read-modify-write, one log entry, one lock round for all of them, while the
//! next writes queue behind it in turn (md's stripe handling). Extents two participants wrote into one chunk, apart,
//! are written by separate writes (`write::one_extent_per_chunk`).
//!
//! Why this keeps every guarantee: no participant is acknowledged before the combined write returns, so the
//! participants are concurrent writes, whose relative order a block device leaves open; the combined write goes
//! through the same path (locks, bitmap, partial parity log, degraded handling, redo on member failure) as a
//! client's own full-stripe write; bytes no participant wrote are never written (a partial gather writes only its
//! covered extents). A FLUSH covers only acknowledged writes, and none of these is until its gather is written.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Array;
use crate::buf::AlignedBuf;
use crate::error::EngineError;
use crate::layout::Level;

/// How long a leader waits for the rest of its stripe. Every leader leads a pipelined stream (module doc), whose
/// continuation is on its way: on an idle machine read off the client's socket within tens of microseconds, on a
/// loaded one or behind members at their rate milliseconds later (500 µs until stop 56: in the VM, members held
/// to 400 requests/s, most gathers of a 1 MiB stream timed out). The wait ends as soon as the stripe is covered,
/// or soon after nothing more can come (`Gatherer::parked`).
const GATHER_WAIT: Duration = Duration::from_millis(20);
/// Once every write in flight is parked in a gather, leaders wait at most this much longer: the time for a
/// client to answer the replies it just got with new requests.
const PARKED_GRACE: Duration = Duration::from_micros(100);
/// After gathers that timed out in a row, the stream's next leads do not wait: 1, 2, 4, ... up to this many.
const MAX_SKIP: u32 = 16;
/// Recent write ends remembered to recognize sequential streams.
const STREAMS: usize = 16;
/// `Gatherer::stream_loads`: a slot's generation above these bits, its requests in flight in them.
const STREAM_COUNT_BITS: u32 = 32;
const STREAM_COUNT_MASK: u64 = (1 << STREAM_COUNT_BITS) - 1;
/// Stripe buffers kept for reuse (each `stripe data bytes` long): at least this many,
const SPARE_BUFFERS: usize = 4;
/// and as many more as fit in this many bytes: writes queued on busy stripes keep a gather open in many stripes
/// at once, and a fresh buffer is a zeroed allocation of a whole stripe.
const SPARE_BUFFER_BYTES: usize = 16 << 20;

/// Counters for tests and status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GatherStats {
    /// Gathers whose stripe was covered and written as one full-stripe write.
    pub full_stripes: u64,
    /// Gathers that timed out and wrote their covered extents separately.
    pub timed_out: u64,
    /// Writes that joined another write's gather.
    pub joined: u64,
    /// Gathers opened by a write that found its stripe busy (queued), written once it was free.
    pub queued: u64,
    /// Pieces that start their stripe and were written alone although a continuation could have covered the
    /// rest, by why they led no gather: the request continued no stream seen so far,
    pub alone_no_stream: u64,
    /// its stream had none of its other requests in flight (or nothing else was in flight),
    pub alone_not_pipelined: u64,
    /// its continuation had already reached the engine (it overtook this request on its way here),
    pub alone_overtaken: u64,
    /// another partial write was at work in the stripe,
    pub alone_busy: u64,
    /// or its stream's gathers had timed out just before (it skips some leads).
    pub alone_skipped: u64,
    /// Gathers led because the frontend had the continuation in hand (`Array::note_write_follows`).
    pub led_for_follower: u64,
}

#[derive(Clone, Copy, Default)]
struct Stream {
    /// Where the stream's latest write started and ended (array bytes).
    start_bytes: u64,
    end_bytes: u64,
    /// Recency, for replacing the least recent stream (0: unused).
    last_use: u64,
    /// Leads left that do not wait (after a gather that timed out).
    skip: u32,
    /// Gathers of this stream that timed out in a row.
    misses: u32,
}

struct Streams {
    slots: [Stream; STREAMS],
    clock: u64,
}

impl Streams {
    /// Records a write of `range`; returns the slot it now holds, and whether it continues that slot's stream
    /// (otherwise the least recent slot was taken over for a new stream).
    fn note(&mut self, range: &Range<u64>) -> (usize, bool) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| s.last_use != 0 && s.end_bytes == range.start)
        {
            self.slots[i].start_bytes = range.start;
            self.slots[i].end_bytes = range.end;
            self.slots[i].last_use = clock;
            return (i, true);
        }
        let oldest = (0..STREAMS)
            .min_by_key(|&i| self.slots[i].last_use)
            .expect("STREAMS > 0");
        self.slots[oldest] = Stream {
            start_bytes: range.start,
            end_bytes: range.end,
            last_use: clock,
            skip: 0,
            misses: 0,
        };
        (oldest, false)
    }

    /// Whether a write that starts where `range` ends was seen already (it overtook this one on its way here).
    fn followed(&self, range: &Range<u64>) -> bool {
        self.slots
            .iter()
            .any(|s| s.last_use != 0 && s.start_bytes == range.end)
    }
}

/// One stripe's gather.
struct Gather {
    state: Mutex<GatherState>,
    /// Signalled when the stripe is covered (to the leader) and when the outcome is set (to the joiners).
    changed: Condvar,
}

struct GatherState {
    /// The stripe's data bytes as the participants wrote them (only `covered` is meaningful); taken by the
    /// leader when it closes the gather.
    buf: Option<AlignedBuf>,
    /// Covered byte ranges within the stripe, sorted and merged.
    covered: Vec<Range<u64>>,
    /// The leader took the buffer: nobody joins any more.
    closed: bool,
    /// The combined write's outcome, for the joiners: `None` until written, then `Ok` or the error's text.
    outcome: Option<Result<(), String>>,
    /// Opened by a write queued on its busy stripe: the leader waits for the stripe to be free, not for the rest
    /// of a stream.
    queued: bool,
}

impl GatherState {
    fn cover(&mut self, range: Range<u64>) {
        self.covered.push(range);
        self.covered.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(self.covered.len());
        for r in self.covered.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        self.covered = merged;
    }

    fn is_full(&self, stripe_bytes: u64) -> bool {
        matches!(self.covered.as_slice(), [r] if r.start == 0 && r.end == stripe_bytes)
    }
}

/// The array's gathering state.
pub(super) struct Gatherer {
    enabled: bool,
    /// Writes queued on a busy stripe are combined (`COMBINE_ENV`).
    combine: bool,
    /// Writes inside `Array::write` now (gathered or not).
    in_flight: AtomicUsize,
    /// Of those, the ones with a piece in a gather (leading or joined), counted once each from when their pieces
    /// are placed until they return. When every write in flight, and every write the frontend is still reading
    /// (`arriving`), is parked, no continuation is on its way: the client waits for an answer before sending
    /// more (it drained its queue, or waits for this very write), so leaders stop waiting soon. (Until stop 56
    /// each piece counted, and writes being read did not: a request that joined one gather with its head and led
    /// the next with its tail, as every request of an unaligned stream does, counted twice, and a 1 MiB
    /// continuation being read off the socket not at all, so leaders stopped waiting while their
    /// continuations were on their way.)
    parked: AtomicUsize,
    /// WRITEs the frontend has begun reading and not yet handed to `Array::write` (`Array::note_write_arriving`).
    arriving: AtomicUsize,
    table: Mutex<Table>,
    /// Per stream slot: its generation (bumped when the slot is taken over by a new stream) above
    /// `STREAM_COUNT_BITS`, and the requests of the stream in flight below. Counted up under the table's lock,
    /// down without it (`StreamLoad`), by a request of the same generation only.
    stream_loads: [AtomicU64; STREAMS],
    full_stripes: AtomicU64,
    timed_out: AtomicU64,
    joined: AtomicU64,
    queued: AtomicU64,
    alone_no_stream: AtomicU64,
    alone_not_pipelined: AtomicU64,
    alone_overtaken: AtomicU64,
    alone_busy: AtomicU64,
    alone_skipped: AtomicU64,
    led_for_follower: AtomicU64,
    /// Entries in `Table::following`, read without the table's lock by `all_parked`.
    following: AtomicUsize,
}

struct Table {
    open: HashMap<u64, Arc<Gather>>,
    /// Partial single-stripe writes executing alone now, per stripe. A write that would lead a gather for a
    /// stripe where one runs does not wait: its continuation already arrived and went ahead of it.
    alone: HashMap<u64, u32>,
    streams: Streams,
    spare_buffers: Vec<AlignedBuf>,
    /// Where writes the frontend holds, right behind the write it handed on last, start; and when it said so
    /// (`Array::note_write_follows`). Each leaves when a write that starts there comes, or after `GATHER_WAIT`.
    following: Vec<(u64, Instant)>,
}

impl Table {
    /// Forgets the continuation told at `start_bytes`, if any (`None`: none, just the stale ones), and the ones
    /// told longer ago than a gather waits (their writes went elsewhere: a connection that ended).
    fn forget_following(&mut self, start_bytes: Option<u64>, counted: &AtomicUsize) {
        let now = Instant::now();
        if let Some(at) = start_bytes.and_then(|s| self.following.iter().position(|f| f.0 == s)) {
            self.following.swap_remove(at);
        }
        self.following
            .retain(|&(_, told)| now.duration_since(told) < GATHER_WAIT);
        counted.store(self.following.len(), Ordering::Release);
    }
}

/// Counts a request in its stream's slot of `Gatherer::stream_loads` for as long as it lives.
struct StreamLoad<'g> {
    gatherer: &'g Gatherer,
    slot: usize,
    generation: u64,
}

impl Drop for StreamLoad<'_> {
    fn drop(&mut self) {
        let load = &self.gatherer.stream_loads[self.slot];
        let mut now = load.load(Ordering::Acquire);
        // Taken over meanwhile: the new stream's count is not this request's to lower.
        while now >> STREAM_COUNT_BITS == self.generation && now & STREAM_COUNT_MASK > 0 {
            match load.compare_exchange_weak(now, now - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
    }
}

/// Counts a write with a piece in a gather as parked (`Gatherer::parked`) for as long as it lives. Dropped before
/// the request's `InFlight`, so that one sees the write gone from both counts.
struct Parked<'g>(&'g Gatherer);

impl<'g> Parked<'g> {
    fn new(g: &'g Gatherer) -> Parked<'g> {
        g.parked.fetch_add(1, Ordering::AcqRel);
        Parked(g)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.parked.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a write in flight for as long as it lives.
struct InFlight<'g>(&'g Gatherer);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let g = self.0;
        let left = g.in_flight.fetch_sub(1, Ordering::AcqRel) - 1;
        if left > 0 && left <= g.parked.load(Ordering::Acquire) {
            g.wake_leaders();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gatherer {
    pub(super) fn new(level: Level, enabled: bool, combine: bool) -> Gatherer {
        let enabled = enabled && matches!(level, Level::Raid5 | Level::Raid6);
        Gatherer {
            enabled,
            combine: enabled && combine,
            in_flight: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            arriving: AtomicUsize::new(0),
            table: Mutex::new(Table {
                open: HashMap::new(),
                alone: HashMap::new(),
                streams: Streams {
                    slots: [Stream::default(); STREAMS],
                    clock: 0,
                },
                spare_buffers: Vec::new(),
                following: Vec::new(),
            }),
            stream_loads: std::array::from_fn(|_| AtomicU64::new(0)),
            full_stripes: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            alone_no_stream: AtomicU64::new(0),
            alone_not_pipelined: AtomicU64::new(0),
            alone_overtaken: AtomicU64::new(0),
            alone_busy: AtomicU64::new(0),
            alone_skipped: AtomicU64::new(0),
            led_for_follower: AtomicU64::new(0),
            following: AtomicUsize::new(0),
        }
    }

    /// Wakes every open gather's leader to look at the counts again. Each gather's lock is taken around the
    /// notification, so a leader between its check and its wait cannot miss it.
    fn wake_leaders(&self) {
        let table = lock(&self.table);
        for gather in table.open.values() {
            let _state = lock(&gather.state);
            gather.changed.notify_all();
        }
    }

    /// Whether every write in flight is parked in a gather and none is arriving or known to follow (see
    /// `parked`, `Table::following`).
    fn all_parked(&self) -> bool {
        self.arriving.load(Ordering::Acquire) == 0
            && self.following.load(Ordering::Acquire) == 0
            && self.in_flight.load(Ordering::Acquire) <= self.parked.load(Ordering::Acquire)
    }

    /// See `Array::note_write_follows`.
    pub(super) fn note_follows(&self, start_bytes: u64) {
        if !self.enabled {
            return;
        }
        let mut table = lock(&self.table);
        table.following.push((start_bytes, Instant::now()));
        table.forget_following(None, &self.following);
    }

    /// A WRITE the frontend began reading (`true`) or handed on or dropped (`false`): see `arriving`.
    pub(super) fn note_arriving(&self, arriving: bool) {
        if arriving {
            self.arriving.fetch_add(1, Ordering::AcqRel);
        } else {
            // Never below zero, whatever a frontend does.
            let _ = self
                .arriving
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    pub(super) fn stats(&self) -> GatherStats {
        GatherStats {
            full_stripes: self.full_stripes.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            joined: self.joined.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            alone_no_stream: self.alone_no_stream.load(Ordering::Relaxed),
            alone_not_pipelined: self.alone_not_pipelined.load(Ordering::Relaxed),
            alone_overtaken: self.alone_overtaken.load(Ordering::Relaxed),
            alone_busy: self.alone_busy.load(Ordering::Relaxed),
            alone_skipped: self.alone_skipped.load(Ordering::Relaxed),
            led_for_follower: self.led_for_follower.load(Ordering::Relaxed),
        }
    }
}

/// Environment variable that turns write gathering off: for measuring what it gains.
pub const GATHER_ENV: &str = "PARAID_GATHER";
/// Environment variable that turns combining writes queued on a busy stripe off (with gathering on): for
/// measuring what it gains.
pub const COMBINE_ENV: &str = "PARAID_COMBINE";

/// What a partial-stripe piece of a request does.
enum Plan {
    /// Adds its bytes to another write's open gather of the stripe, then waits for that write.
    Join(Arc<Gather>),
    /// Opens the stripe's gather (already in the table) and writes it; the stream it continues, or none for a
    /// write queued on its busy stripe.
    Lead(Arc<Gather>, Option<usize>),
    /// Written by itself (counted in `Table::alone` while it runs).
    Alone,
}

/// The part of a request in its first or last stripe that does not cover that stripe.
struct Piece {
    /// Array bytes.
    range: Range<u64>,
    stripe: u64,
    plan: Plan,
}

/// `Array::write` past its range check: its partial-stripe pieces gathered with other writes where that pays,
/// the rest written at once.
pub(super) fn write(
    array: &Array,
    offset_bytes: u64,
    buf: &[u8],
    fua: bool,
) -> Result<(), EngineError> {
    let g = &array.gather;
    let others_in_flight = g.in_flight.fetch_add(1, Ordering::AcqRel);
    let _in_flight = InFlight(g);
    if !g.enabled || buf.is_empty() || fua {
        if g.following.load(Ordering::Acquire) > 0 {
            lock(&g.table).forget_following(Some(offset_bytes), &g.following);
        }
        return array.write_now(offset_bytes, buf, fua, None);
    }
    let stripe_bytes = array.geometry.stripe_bytes();
    let range = offset_bytes..offset_bytes + buf.len() as u64;
    let first = range.start / stripe_bytes;
    let last = (range.end - 1) / stripe_bytes;
    // The request's piece in its first stripe, and (when it spans more) in its last, where not whole.
    let mut partial: Vec<(u64, Range<u64>)> = Vec::with_capacity(2);
    let head = range.start..range.end.min((first + 1) * stripe_bytes);
    if head.start > first * stripe_bytes || head.end < (first + 1) * stripe_bytes {
        partial.push((first, head));
    }
    if last != first && range.end < (last + 1) * stripe_bytes {
        partial.push((last, last * stripe_bytes..range.end));
    }
    let mut table = lock(&g.table);
    if g.following.load(Ordering::Acquire) > 0 {
        table.forget_following(Some(range.start), &g.following);
    }
    // The frontend holds this request's continuation (module doc, "Continuations the frontend has seen").
    let follower_coming = table.following.iter().any(|f| f.0 == range.end);
    let (slot, continues) = table.streams.note(&range);
    let stream = continues.then_some(slot);
    let load = &g.stream_loads[slot];
    if !continues {
        let generation = (load.load(Ordering::Acquire) >> STREAM_COUNT_BITS) + 1;
        load.store(generation << STREAM_COUNT_BITS, Ordering::Release);
    }
    // The stream's earlier requests still in flight: it is pipelined (module doc).
    let before = load.fetch_add(1, Ordering::AcqRel);
    let pipelined = continues && before & STREAM_COUNT_MASK > 0;
    let _stream_load = StreamLoad {
        gatherer: g,
        slot,
        generation: before >> STREAM_COUNT_BITS,
    };
    if partial.is_empty() {
        drop(table);
        return array.write_now(offset_bytes, buf, false, None);
    }
    let followed = table.streams.followed(&range);
    let mut pieces: Vec<Piece> = Vec::with_capacity(partial.len());
    let mut alone: Vec<Alone<'_>> = Vec::new();
    for (stripe, piece) in partial {
        let plan = if let Some(gather) = table.open.get(&stripe) {
            Plan::Join(Arc::clone(gather))
        } else if follower_coming
            && piece.start == stripe * stripe_bytes
            && piece.end == range.end
            && !table.alone.contains_key(&stripe)
        {
            g.led_for_follower.fetch_add(1, Ordering::Relaxed);
            Plan::Lead(open(&mut table, stripe, stripe_bytes, false), Some(slot))
        } else if let Some(stream) = stream.filter(|_| {
            // Lead only where a continuation can cover the rest of the stripe (the piece starts the stripe and
            // the request continues a stream), with company in flight (at queue depth 1 the continuation cannot
            // come before this write is answered), the stream's own among it (pipelined: module doc), and not
            // where the continuation already came (running or done: it overtook this write between the client's
            // socket and here).
            piece.start == stripe * stripe_bytes
                && others_in_flight > 0
                && pipelined
                && !followed
                && !table.alone.contains_key(&stripe)
        }) {
            if table.streams.slots[stream].skip > 0 {
                table.streams.slots[stream].skip -= 1;
                g.alone_skipped.fetch_add(1, Ordering::Relaxed);
                Plan::Alone
            } else {
                Plan::Lead(open(&mut table, stripe, stripe_bytes, false), Some(stream))
            }
        } else if g.combine && piece == range && table.alone.contains_key(&stripe) {
            // The whole request lies in a stripe another partial write is at work in: queue for it, with
            // whatever else comes for the stripe meanwhile.
            Plan::Lead(open(&mut table, stripe, stripe_bytes, true), None)
        } else {
            if piece.start == stripe * stripe_bytes
                && (piece.start > range.start || stream.is_some())
            {
                // A piece a continuation could have completed (the tail of a longer request, or a request that
                // continues a stream): why it did not lead.
                let why = if stream.is_none() {
                    &g.alone_no_stream
                } else if others_in_flight == 0 || !pipelined {
                    &g.alone_not_pipelined
                } else if followed {
                    &g.alone_overtaken
                } else {
                    &g.alone_busy
                };
                why.fetch_add(1, Ordering::Relaxed);
                log::trace!(
                    "gather: {range:?} leads no gather in stripe {stripe}: continues {continues}, stream's in \
                     flight {}, others in flight {others_in_flight}, overtaken {followed}",
                    before & STREAM_COUNT_MASK
                );
            }
            Plan::Alone
        };
        if matches!(plan, Plan::Alone) {
            *table.alone.entry(stripe).or_insert(0) += 1;
            alone.push(Alone {
                gatherer: g,
                stripe,
            });
        }
        pieces.push(Piece {
            range: piece,
            stripe,
            plan,
        });
    }
    drop(table);
    let bytes =
        |r: &Range<u64>| &buf[(r.start - offset_bytes) as usize..(r.end - offset_bytes) as usize];
    // Bytes go into the gathers first: their leaders may be waiting for exactly these.
    for piece in &mut pieces {
        let within = piece.range.start - piece.stripe * stripe_bytes
            ..piece.range.end - piece.stripe * stripe_bytes;
        match &piece.plan {
            Plan::Join(gather) => {
                if !add_to(array, gather, within, bytes(&piece.range), stripe_bytes) {
                    piece.plan = Plan::Alone; // closed before this write got in
                }
            }
            Plan::Lead(gather, _) => {
                let mut state = lock(&gather.state);
                state.buf.as_mut().expect("open")[within.start as usize..within.end as usize]
                    .copy_from_slice(bytes(&piece.range));
                state.cover(within);
            }
            Plan::Alone => {}
        }
    }
    let _parked = pieces
        .iter()
        .any(|p| !matches!(p.plan, Plan::Alone))
        .then(|| Parked::new(g));
    // Then what this request writes by itself, in one call as a request that gathers nothing always was: the
    // range between its gathered pieces (they can only be at its ends). A lead waits last, giving its
    // continuation the most time to arrive.
    let mut result: Result<(), EngineError> = Ok(());
    let keep_first = |result: &mut Result<(), EngineError>, r: Result<(), EngineError>| {
        if result.is_ok() {
            *result = r;
        }
    };
    let gathered = |p: &&Piece| !matches!(p.plan, Plan::Alone);
    let own_start = pieces
        .iter()
        .filter(gathered)
        .find(|p| p.range.start == range.start)
        .map_or(range.start, |p| p.range.end);
    let own_end = pieces
        .iter()
        .filter(gathered)
        .find(|p| p.range.end == range.end)
        .map_or(range.end, |p| p.range.start);
    if own_start < own_end {
        let own = own_start..own_end;
        keep_first(
            &mut result,
            array.write_now(own.start, bytes(&own), false, None),
        );
    }
    drop(alone);
    for piece in &pieces {
        if let Plan::Lead(gather, stream) = &piece.plan {
            let r = lead(
                array,
                gather,
                piece.stripe,
                piece.stripe * stripe_bytes,
                stripe_bytes,
                *stream,
            );
            keep_first(&mut result, r);
        }
    }
    for piece in &pieces {
        if let Plan::Join(gather) = &piece.plan {
            keep_first(&mut result, wait_for(gather, piece.range.start));
        }
    }
    result
}

/// Opens a gather of `stripe` in the table. Opened empty: the leader's own bytes go
/// in after the table's lock is let go (joiners wait for the gather's lock meanwhile; other writes do not wait for
/// the copy).
fn open(table: &mut Table, stripe: u64, stripe_bytes: u64, queued: bool) -> Arc<Gather> {
    let stripe_buf = table
        .spare_buffers
        .pop()
        .unwrap_or_else(|| AlignedBuf::zeroed(stripe_bytes as usize));
    debug_assert_eq!(stripe_buf.len() as u64, stripe_bytes);
    let gather = Arc::new(Gather {
        state: Mutex::new(GatherState {
            buf: Some(stripe_buf),
            covered: Vec::new(),
            closed: false,
            outcome: None,
            queued,
        }),
        changed: Condvar::new(),
    });
    table.open.insert(stripe, Arc::clone(&gather));
    gather
}

/// Counts a partial write executing alone in its stripe for as long as it lives (and a gather's write while it
/// is written: the stripe is busy, so writes into it queue).
struct Alone<'g> {
    gatherer: &'g Gatherer,
    stripe: u64,
}

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        let mut table = lock(&self.gatherer.table);
        if let Some(n) = table.alone.get_mut(&self.stripe) {
            *n -= 1;
            if *n == 0 {
                table.alone.remove(&self.stripe);
                // A write queued on the stripe may go now. Notified under the gather's lock, so a leader between
                // its look at `alone` and its wait cannot miss it.
                if let Some(gather) = table.open.get(&self.stripe) {
                    let _state = lock(&gather.state);
                    gather.changed.notify_all();
                }
            }
        }
    }
}

/// Adds a piece's bytes to an open gather (it becomes a participant); `false` if the gather closed first.
fn add_to(
    array: &Array,
    gather: &Gather,
    within: Range<u64>,
    bytes: &[u8],
    stripe_bytes: u64,
) -> bool {
    let mut state = lock(&gather.state);
    if state.closed {
        return false;
    }
    let stripe_buf = state.buf.as_mut().expect("an open gather has its buffer");
    stripe_buf[within.start as usize..within.end as usize].copy_from_slice(bytes);
    state.cover(within);
    array.gather.joined.fetch_add(1, Ordering::Relaxed);
    if state.is_full(stripe_bytes) {
        gather.changed.notify_all();
    }
    true
}

/// Waits for the outcome of a gather this request joined.
fn wait_for(gather: &Gather, offset_bytes: u64) -> Result<(), EngineError> {
    let mut state = lock(&gather.state);
    while state.outcome.is_none() {
        state = gather
            .changed
            .wait(state)
            .unwrap_or_else(|e| e.into_inner());
    }
    match state.outcome.clone().expect("set") {
        Ok(()) => Ok(()),
        Err(why) => Err(EngineError::WriteGathered { offset_bytes, why }),
    }
}

/// How often a write queued on a busy stripe looks again without being told (it is told when the stripe is free).
const QUEUED_RECHECK: Duration = Duration::from_millis(2);

/// Waits for the stripe to be covered (or the wait to pass; a queued gather: for the stripe to be free), closes
/// the gather, writes it, and hands the outcome to the joiners.
fn lead(
    array: &Array,
    gather: &Gather,
    stripe: u64,
    stripe_start: u64,
    stripe_bytes: u64,
    stream: Option<usize>,
) -> Result<(), EngineError> {
    let opened = Instant::now();
    // (A write queued on its busy stripe waits for the stripe, not for this.)
    let mut deadline = opened + GATHER_WAIT;
    let mut state = lock(&gather.state);
    let mut grace_given = false;
    let mut waited_for_stripe = false;
    loop {
        if state.is_full(stripe_bytes) {
            break;
        }
        if state.queued {
            // Looked at under the table's lock, then waited for under the gather's, taken before the table's is let
            // go: the write that frees the stripe notifies under both (`Alone`).
            drop(state);
            let table = lock(&array.gather.table);
            let busy = table.alone.contains_key(&stripe);
            state = lock(&gather.state);
            drop(table);
            if !busy {
                break;
            }
            waited_for_stripe = true;
            state = gather
                .changed
                .wait_timeout(state, QUEUED_RECHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            continue;
        }
        let now = Instant::now();
        if !grace_given && array.gather.all_parked() {
            // The client has every answer but ours: it may be sending more right now (it just got replies), or
            // waiting for this write. Give it the time to react, not the whole wait.
            grace_given = true;
            deadline = deadline.min(now + PARKED_GRACE);
        }
        if now >= deadline {
            break;
        }
        state = gather
            .changed
            .wait_timeout(state, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    drop(state);
    if waited_for_stripe {
        // Counted with the stripe locks' waits: the time a write waits for its stripe, whichever way it waits.
        array.locks.count_wait(opened);
    }
    // Closed under the table's lock, so no write finds the gather open after this.
    let mut table = lock(&array.gather.table);
    table.open.remove(&stripe);
    let mut state = lock(&gather.state);
    state.closed = true;
    let full = state.is_full(stripe_bytes);
    if let Some(stream) = stream {
        let slot = &mut table.streams.slots[stream];
        if full {
            slot.misses = 0;
        } else {
            slot.misses += 1;
            slot.skip = (1u32 << (slot.misses - 1).min(4)).min(MAX_SKIP);
        }
    }
    // Busy while written: the writes that come for the stripe meanwhile queue for the next gather.
    *table.alone.entry(stripe).or_insert(0) += 1;
    drop(table);
    let _busy = Alone {
        gatherer: &array.gather,
        stripe,
    };
    let buf = state.buf.take().expect("only the leader closes");
    let covered = std::mem::take(&mut state.covered); // closed: nobody reads it again
    drop(state);
    let counter = if stream.is_none() {
        &array.gather.queued
    } else if full {
        &array.gather.full_stripes
    } else {
        &array.gather.timed_out
    };
    counter.fetch_add(1, Ordering::Relaxed);
    // A panic below must still release the joiners: they get an error instead of waiting forever.
    let mut outcome_guard = Outcome {
        gather,
        outcome: Some(Err("the gathering write panicked".to_string())),
    };
    let mut result = Ok(());
    for extents in combinable(&covered, array.geometry.chunk_bytes) {
        result = array.write_now_extents(stripe_start, &buf, &extents);
        if result.is_err() {
            break;
        }
    }
    outcome_guard.outcome = Some(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    drop(outcome_guard);
    let mut table = lock(&array.gather.table);
    if table.spare_buffers.len() < SPARE_BUFFERS.max(SPARE_BUFFER_BYTES / buf.len().max(1)) {
        table.spare_buffers.push(buf);
    }
    result
}

/// The covered extents of a gather (sorted, apart, within one stripe) cut into runs that one write can write
/// (`write::one_extent_per_chunk`): a run ends where the next extent starts in the chunk the run's last ends in.
fn combinable(covered: &[Range<u64>], chunk_bytes: u64) -> Vec<Vec<Range<usize>>> {
    let mut runs: Vec<Vec<Range<usize>>> = Vec::new();
    for r in covered {
        let extent = r.start as usize..r.end as usize;
        match runs.last_mut() {
            Some(run)
                if super::write::starts_in_a_later_chunk(
                    chunk_bytes,
                    run[run.len() - 1].end as u64,
                    r.start,
                ) =>
            {
                run.push(extent)
            }
            _ => runs.push(vec![extent]),
        }
    }
    runs
}

/// Publishes the outcome to the joiners when dropped (also while unwinding).
struct Outcome<'a> {
    gather: &'a Gather,
    outcome: Option<Result<(), String>>,
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.gather.state);
        state.outcome = self.outcome.take();
        drop(state);
        self.gather.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_recognize_continuations_and_forget_the_oldest() {
        let mut s = Streams {
            slots: [Stream::default(); STREAMS],
            clock: 0,
        };
        assert_eq!(s.note(&(0..100)), (0, false));
        assert_eq!(s.note(&(100..200)), (0, true));
        assert_eq!(
            s.note(&(100..200)),
            (1, false),
            "a rewrite of the same range starts a new stream"
        );
        // Fill every slot with unrelated writes: the first stream (least recent) is forgotten.
        for i in 0..STREAMS as u64 {
            s.note(&(10_000 + i * 1000..10_000 + i * 1000 + 1));
        }
        assert!(!s.note(&(200..300)).1, "forgotten: a new stream");
    }

    #[test]
    fn writes_being_read_by_the_frontend_keep_leaders_waiting() {
        let g = Gatherer::new(Level::Raid6, true, true);
        // One write in flight, parked in a gather: nothing else can come from inside.
        g.in_flight.fetch_add(1, Ordering::AcqRel);
        let parked = Parked::new(&g);
        assert!(g.all_parked());
        g.note_arriving(true);
        assert!(!g.all_parked(), "a write on its way");
        g.note_arriving(false);
        assert!(g.all_parked());
        // A `false` too many does not go below zero.
        g.note_arriving(false);
        g.note_arriving(true);
        assert!(!g.all_parked());
        g.note_arriving(false);
        drop(parked);
        assert!(!g.all_parked(), "the write in flight is no longer parked");
    }

    #[test]
    fn a_stream_slot_counts_its_own_generation_only() {
        let g = Gatherer::new(Level::Raid5, true, true);
        let load = |n: u64, generation: u64| (generation << STREAM_COUNT_BITS) | n;
        g.stream_loads[3].store(load(2, 5), Ordering::Release);
        let old = StreamLoad {
            gatherer: &g,
            slot: 3,
            generation: 4,
        };
        drop(old);
        assert_eq!(
            g.stream_loads[3].load(Ordering::Acquire),
            load(2, 5),
            "a request of the slot's earlier stream leaves the new one's count alone"
        );
        let current = StreamLoad {
            gatherer: &g,
            slot: 3,
            generation: 5,
        };
        drop(current);
        assert_eq!(g.stream_loads[3].load(Ordering::Acquire), load(1, 5));
    }

    #[test]
    fn covered_extents_are_cut_where_two_would_share_a_chunk() {
        const CHUNK: u64 = 16 << 10;
        // One extent per chunk, in chunks 0, 1 and 3: one write.
        let apart = [0..4096, CHUNK + 8192..2 * CHUNK, 3 * CHUNK..3 * CHUNK + 512];
        assert_eq!(
            combinable(&apart, CHUNK),
            vec![vec![0..4096usize, 16384 + 8192..32768, 49152..49152 + 512]]
        );
        // The second and third extents share chunk 1; an extent ending at a chunk's end does not reach the next.
        let shared = [
            0..CHUNK - 512,
            CHUNK..CHUNK + 4096,
            CHUNK + 8192..CHUNK + 12288,
            2 * CHUNK..2 * CHUNK + 1,
        ];
        assert_eq!(
            combinable(&shared, CHUNK),
            vec![
                vec![0..16384 - 512usize, 16384..16384 + 4096],
                vec![16384 + 8192..16384 + 12288, 32768..32769],
            ]
        );
        for runs in [combinable(&apart, CHUNK), combinable(&shared, CHUNK)] {
            for run in runs {
                assert!(
                    super::super::write::one_extent_per_chunk(CHUNK, 0, &run),
                    "{run:?}"
                );
            }
        }
        assert!(combinable(&[], CHUNK).is_empty());
    }

    #[test]
    fn coverage_merges_touching_and_overlapping_ranges() {
        let mut st = GatherState {
            buf: None,
            covered: Vec::new(),
            closed: false,
            outcome: None,
            queued: false,
        };
        st.cover(0..10);
        st.cover(20..30);
        assert!(!st.is_full(30));
        st.cover(5..20);
        assert_eq!(st.covered, vec![0..30]);
        assert!(st.is_full(30));
        assert!(!st.is_full(31));
    }
}
