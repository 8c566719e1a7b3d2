//! The write path.
//!
//! RAID0/1/10: each piece is widened to whole pages, its partial edge pages read from a copy, and every copy
//! written.
//!
//! RAID5/6, per stripe, over `R`, the page-aligned in-chunk range the request touches:
//! * reconstruct-write (RCW): read what the request does not overwrite of every data chunk, compute P/Q from the
//!   full data; a full-stripe write reads nothing;
//! * read-modify-write (RMW): read the old bytes of the touched chunks and the old P/Q, fold the difference in;
//! * whichever reads fewer bytes; with members missing, RCW when every missing data chunk is fully overwritten,
//!   else "degraded": read every present chunk over R, rebuild the missing ones, then as RCW.
//!
//! Every window of stripes holds its stripes' locks from the first read to the last write, so writes to one stripe
//! are serialized while other stripes proceed; all member reads of a window go out in one batch, then all writes.
//!
//! Failures: a member read that fails (after its retry) leaves that member out of the window's plan, which is
//! redone; a member write that fails evicts the member and the window is redone without it, so the survivors end
//! up with data and parity that agree (faults.md row 3). Writes also go to a slot's rebuild target below the
//! rebuild's progress (`Array::write_targets`). Nothing is acknowledged before the member states it relied on
//! are in the superblocks (`wait_durable`).

use std::ops::Range;
use std::sync::atomic::Ordering;

use paraid_parity::StripeGen;

use super::ppl::{DataPiece, DataRound, StreamTouch, StripeView};
use super::{pieces, Array, Piece, NO_TARGET, WINDOW_BYTES, WINDOW_STRIPES};
use crate::buf::{round_down, round_up, with_batch_scratch, with_scratch, Carver};
use crate::error::EngineError;
use crate::layout::{Level, PAGE_BYTES};
use crate::member::IoReq;

/// Slots as a bit set (at most 64 members).
fn bit(slot: usize) -> u64 {
    1u64 << slot
}

/// What one attempt at a window did.
enum Attempt {
    Done,
    /// Redo the window: members failed; reads failed on the slots in the mask (leave them out). `wrote_in_place`:
    /// this attempt got as far as writing in place (on some members), so the window's stripes may hold part of
    /// it in the members' caches.
    Redo {
        unreadable: u64,
        wrote_in_place: bool,
    },
}

/// Attempts per window before giving up: each redo leaves out or evicts at least one member.
fn max_attempts(array: &Array) -> usize {
    2 * array.geometry.members + 2
}

/// Runs `attempt` (given the attempt number and the slots found unreadable so far) until the window is done,
/// checking before each that the array still serves; gives up after `max_attempts`.
///
/// A window given up on after an attempt that wrote in place is flushed first. Its stripes may hold part of
/// the write, and their log entries (ppl/) count as being written the chunks of a member that failed meanwhile,
/// whose contents now live only in the parity: left in the members' caches, a later power loss could keep the
/// parity and drop a data chunk beside it, and recovery would solve the failed member's chunk from that torn
/// parity, neither old nor new, long after the write had ended (concurrent simulation, seed 9101841;
/// `faults_crash::a_write_failing_after_writing_in_place_leaves_no_torn_stripe`). Flushed, what the failed write
/// left reads back the same after a power loss.
fn retry_window(
    array: &Array,
    mut attempt: impl FnMut(usize, u64) -> Result<Attempt, EngineError>,
) -> Result<(), EngineError> {
    let mut unreadable = 0u64;
    let mut wrote_in_place = false;
    let result = (|| {
        for n in 0..max_attempts(array) {
            array.check_serving()?;
            match attempt(n, unreadable)? {
                Attempt::Done => return Ok(()),
                Attempt::Redo {
                    unreadable: more,
                    wrote_in_place: wrote,
                } => {
                    unreadable |= more;
                    wrote_in_place |= wrote;
                }
            }
        }
        Err(EngineError::RetryWindow {
            what: "write",
            attempts: max_attempts(array),
        })
    })();
    if result.is_err() && wrote_in_place && array.check_serving().is_ok() {
        flush_after_failed_window(array);
    }
    result
}

/// The flush of `retry_window` for a window given up on: every active member (one whose flush fails is evicted,
/// as always). Best effort: the write's own error is what the caller gets.
fn flush_after_failed_window(array: &Array) {
    let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
    if let Err(e) = array.run(reqs) {
        log::warn!("flushing the members after a failed write: {e}");
    }
}

/// Journal mode (ppl/, `Ppl::journal`): a write may be answered before its in-place writes, once its data is
/// durable in the log. `give` calls the hook at most once.
pub(super) struct EarlyAnswer<'a> {
    hook: &'a dyn Fn(),
    given: std::cell::Cell<bool>,
    /// The round that logged the write's data before it read anything (`Ppl::log_data_first`), if one did: held
    /// until the write is done (dropped with this, after the window's own entries).
    data_round: std::cell::RefCell<Option<DataRound<'a>>>,
    /// The write continues the one its client waited for before (`Ppl::note_waited_for`): a commit stream.
    sequential: bool,
}

impl<'a> EarlyAnswer<'a> {
    pub(super) fn new(hook: &'a dyn Fn(), sequential: bool) -> EarlyAnswer<'a> {
        EarlyAnswer {
            hook,
            given: std::cell::Cell::new(false),
            data_round: std::cell::RefCell::new(None),
            sequential,
        }
    }

    fn give(&self) {
        if !self.given.replace(true) {
            (self.hook)();
        }
    }
}

pub(super) fn write<'a>(
    array: &'a Array,
    offset_bytes: u64,
    buf: &[u8],
    fua: bool,
    answer: Option<&EarlyAnswer<'a>>,
) -> Result<(), EngineError> {
    if buf.is_empty() {
        return Ok(());
    }
    if array.geometry.level.has_parity() {
        let whole = 0..buf.len();
        write_parity(
            array,
            offset_bytes,
            buf,
            std::slice::from_ref(&whole),
            fua,
            answer,
        )?;
    } else {
        write_copies(array, offset_bytes, buf, fua)?;
    }
    array.wait_durable()
}

/// Writes the `extents` of `buf` (byte ranges within it, sorted, apart) at `offset_bytes + extent.start`, as one
/// write of a RAID5/6 array: writes that queued on one stripe, combined (gather.rs). Each data chunk holds at most
/// one extent (`one_extent_per_chunk`): an extent's touch of a chunk is merged with the chunk's old bytes page by
/// page, so two in one chunk would each bring back the other's old bytes. The stripes are locked, read, logged and
/// written once for all of them: one read-modify-write with one log entry where each would have had its own.
pub(super) fn write_extents(
    array: &Array,
    offset_bytes: u64,
    buf: &[u8],
    extents: &[Range<usize>],
) -> Result<(), EngineError> {
    assert!(
        array.geometry.level.has_parity(),
        "only RAID5/6 writes combine extents"
    );
    assert!(
        one_extent_per_chunk(array.geometry.chunk_bytes, offset_bytes, extents),
        "extents {extents:?} at {offset_bytes} share a chunk"
    );
    write_parity(array, offset_bytes, buf, extents, false, None)?;
    array.wait_durable()
}

/// Whether `extents` (sorted, apart, relative to `offset_bytes`) touch every chunk at most once, so
/// `write_extents` may write them together.
pub(super) fn one_extent_per_chunk(
    chunk_bytes: u64,
    offset_bytes: u64,
    extents: &[Range<usize>],
) -> bool {
    extents.windows(2).all(|w| {
        debug_assert!(w[0].end < w[1].start, "extents sorted and apart: {w:?}");
        starts_in_a_later_chunk(
            chunk_bytes,
            offset_bytes + w[0].end as u64,
            offset_bytes + w[1].start as u64,
        )
    })
}

/// Whether an extent starting at byte `later_start` lies in a later chunk than the last byte of one ending at
/// `earlier_end` (exclusive): the rule of `one_extent_per_chunk`, for one pair.
pub(super) fn starts_in_a_later_chunk(
    chunk_bytes: u64,
    earlier_end: u64,
    later_start: u64,
) -> bool {
    (earlier_end - 1) / chunk_bytes < later_start / chunk_bytes
}

fn page_len(range: &Range<u64>) -> usize {
    (range.end - range.start) as usize
}

// ---------------------------------------------------------------------------------------------------------
// RAID0 / RAID1 / RAID10

fn write_copies(
    array: &Array,
    offset_bytes: u64,
    buf: &[u8],
    fua: bool,
) -> Result<(), EngineError> {
    let g = array.geometry;
    let per_stripe = g.data_per_stripe() as u64;
    let mut all = pieces(g.chunk_bytes, offset_bytes, buf.len() as u64).peekable();
    let mut window: Vec<Piece> = Vec::new();
    while let Some(first) = all.peek().copied() {
        window.clear();
        let mut window_bytes = 0usize;
        let first_stripe = first.chunk / per_stripe;
        while let Some(piece) = all.peek().copied() {
            let (lo, hi) = piece.aligned();
            let need = (hi - lo) as usize;
            let stripes = piece.chunk / per_stripe - first_stripe + 1;
            if !window.is_empty()
                && (window_bytes + need > WINDOW_BYTES || stripes > WINDOW_STRIPES)
            {
                break;
            }
            all.next();
            window_bytes += need;
            window.push(piece);
        }
        let last_stripe = window[window.len() - 1].chunk / per_stripe;
        let _guard = array
            .locks
            .lock(first_stripe, last_stripe - first_stripe + 1);
        retry_window(array, |_, unreadable| {
            with_scratch(window_bytes, |scratch| {
                write_copies_window(array, &window, buf, fua, scratch, unreadable)
            })
        })?;
    }
    Ok(())
}

fn write_copies_window(
    array: &Array,
    window: &[Piece],
    buf: &[u8],
    fua: bool,
    scratch: &mut [u8],
    unreadable: u64,
) -> Result<Attempt, EngineError> {
    let g = array.geometry;
    let page = PAGE_BYTES as usize;
    let mut carver = Carver::new(scratch);
    let mut bounce: Vec<&mut [u8]> = window
        .iter()
        .map(|p| {
            let (lo, hi) = p.aligned();
            carver.take((hi - lo) as usize)
        })
        .collect();

    // Partial edge pages: their other bytes come from a present copy.
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    for (piece, b) in window.iter().zip(bounce.iter_mut()) {
        let (lo, hi) = piece.aligned();
        let head_partial = piece.lo != lo;
        let tail_partial = piece.hi != hi;
        if !head_partial && !tail_partial {
            continue;
        }
        let readable = (0..g.copies())
            .map(|copy| g.chunk_copy(piece.chunk, copy))
            .find(|a| array.is_active(a.member) && unreadable & bit(a.member) == 0);
        let Some(addr) = readable else {
            let slot = g.chunk_copy(piece.chunk, 0).member;
            return Err(EngineError::ReachMember {
                slot,
                path: array.io.label(slot),
            });
        };
        if b.len() == page {
            reqs.push(IoReq::read(
                addr.member,
                array.member_offset(addr.row, lo),
                b,
            ));
            continue;
        }
        let (head, rest) = b.split_at_mut(page);
        let tail_at = rest.len() - page;
        let tail = &mut rest[tail_at..];
        if head_partial {
            reqs.push(IoReq::read(
                addr.member,
                array.member_offset(addr.row, lo),
                head,
            ));
        }
        if tail_partial {
            reqs.push(IoReq::read(
                addr.member,
                array.member_offset(addr.row, hi - PAGE_BYTES),
                tail,
            ));
        }
    }
    let failures = array.submit_tolerant(reqs);
    if !failures.is_empty() {
        return Ok(Attempt::Redo {
            unreadable: failures.iter().fold(0, |m, f| m | bit(f.slot)),
            wrote_in_place: false,
        });
    }

    for (piece, b) in window.iter().zip(bounce.iter_mut()) {
        let skip = (piece.lo - piece.aligned().0) as usize;
        b[skip..skip + piece.len()].copy_from_slice(&buf[piece.buf_at..piece.buf_at + piece.len()]);
    }

    let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(window.len() * g.copies());
    for (piece, b) in window.iter().zip(bounce.iter()) {
        let before = reqs.len();
        let mut copies_written = 0;
        for copy in 0..g.copies() {
            let addr = g.chunk_copy(piece.chunk, copy);
            copies_written += array.is_active(addr.member) as usize;
            for dest in array.write_targets(addr.member, addr.row) {
                if dest != NO_TARGET {
                    reqs.push(IoReq::write(
                        dest,
                        array.member_offset(addr.row, piece.aligned().0),
                        b,
                        fua,
                    ));
                }
            }
        }
        if copies_written == 0 || reqs.len() == before {
            let slot = g.chunk_copy(piece.chunk, 0).member;
            return Err(EngineError::ReachMember {
                slot,
                path: array.io.label(slot),
            });
        }
    }
    if array.submit_tolerant(reqs).is_empty() {
        Ok(Attempt::Done)
    } else {
        Ok(Attempt::Redo {
            unreadable: 0,
            wrote_in_place: true,
        })
    }
}

// ---------------------------------------------------------------------------------------------------------
// RAID5 / RAID6

/// The bytes of one data chunk a request writes.
#[derive(Debug, Clone, Copy)]
struct Touch {
    /// Data index within the stripe.
    index: usize,
    piece: Piece,
}

impl Touch {
    /// Touched pages: `aligned()` of the piece.
    fn pages(&self) -> Range<u64> {
        let (lo, hi) = self.piece.aligned();
        lo..hi
    }

    /// Pages the request overwrites completely (may be empty).
    fn full_pages(&self) -> Range<u64> {
        let lo = round_up(self.piece.lo, PAGE_BYTES);
        let hi = round_down(self.piece.hi, PAGE_BYTES);
        if lo < hi {
            lo..hi
        } else {
            lo..lo
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rcw,
    Rmw,
    Degraded,
}

#[derive(Debug)]
struct StripePlan {
    stripe: u64,
    /// Indices into the window's touches.
    touches: Range<usize>,
    /// Page-aligned in-chunk range over which parity is recomputed.
    r: Range<u64>,
    mode: Mode,
    /// Whether the plan reads from the members when it was made (what the stripe cache holds is not read): a
    /// journal write that reads nothing gains nothing from logging its data first (`write_parity`).
    reads_members: bool,
    /// Stripe indices not read in this attempt (inactive members, members whose reads failed): fixed when
    /// planned, so that a member coming back mid-window cannot be taken for read.
    missing: Vec<usize>,
}

impl StripePlan {
    fn readable(&self, index: usize) -> bool {
        !self.missing.contains(&index)
    }
}

impl StripePlan {
    fn scratch_bytes(&self, touches: &[Touch], k: usize, np: usize) -> usize {
        let r = page_len(&self.r);
        match self.mode {
            Mode::Rcw | Mode::Degraded => (k + np) * r,
            Mode::Rmw => {
                np * r
                    + touches[self.touches.clone()]
                        .iter()
                        .map(|t| 2 * page_len(&t.pages()))
                        .sum::<usize>()
            }
        }
    }
}

/// Decides how to update one stripe, leaving out inactive members and those in `unreadable`.
fn plan_stripe(
    array: &Array,
    stripe: u64,
    touches: &[Touch],
    range: Range<usize>,
    unreadable: u64,
) -> StripePlan {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let np = g.level.parity_chunks();
    let mine = &touches[range.clone()];
    let r_lo = mine
        .iter()
        .map(|t| t.pages().start)
        .min()
        .expect("a stripe plan has touches");
    let r_hi = mine
        .iter()
        .map(|t| t.pages().end)
        .max()
        .expect("a stripe plan has touches");
    let r = r_lo..r_hi;
    let covers_r = |t: &Touch| {
        let full = t.full_pages();
        full.start <= r_lo && full.end >= r_hi
    };
    let touch_of = |index: usize| mine.iter().find(|t| t.index == index);

    let mut any_missing = false;
    let mut must_rebuild = false;
    let mut missing = Vec::new();
    for index in 0..k + np {
        let member = g.stripe_member(stripe, index);
        if array.is_active(member) && unreadable & bit(member) == 0 {
            continue;
        }
        missing.push(index);
        any_missing = true;
        if index < k && !touch_of(index).is_some_and(covers_r) {
            must_rebuild = true;
        }
    }
    let (mode, reads_members) = if must_rebuild {
        (Mode::Degraded, true)
    } else if any_missing || array.integrity.awaits_resync(stripe) {
        (Mode::Rcw, true)
    } else {
        // Bytes each way would read from the members; what the stripe cache holds costs nothing.
        let cache = &array.stripe_cache;
        let uncached = |index: usize, range: Range<u64>| {
            let len = range.end - range.start;
            if cache.holds(stripe, index, range.start, len) {
                0
            } else {
                len
            }
        };
        // Bytes a reconstruct-write reads of data chunk `index`: what the write does not cover of `r`.
        let rcw_read = |index: usize| match touch_of(index) {
            Some(t) => {
                let full = t.full_pages();
                if full.is_empty() {
                    uncached(index, r.clone())
                } else {
                    uncached(index, r_lo..full.start) + uncached(index, full.end..r_hi)
                }
            }
            None => uncached(index, r.clone()),
        };
        // Bytes a read-modify-write reads of chunk `index`: the parity over `r`, the old data it overwrites.
        let rmw_read = |index: usize| {
            if index >= k {
                uncached(index, r.clone())
            } else {
                touch_of(index).map_or(0, |t| uncached(index, t.pages()))
            }
        };
        let rcw_bytes: u64 = (0..k).map(rcw_read).sum();
        // (A reconstruct-write that reads nothing, a full stripe's, needs no comparison and no cache probes.)
        let rmw_bytes: u64 = if rcw_bytes == 0 {
            0
        } else {
            (0..k + np).map(rmw_read).sum()
        };
        // A read from the slow member (slow.rs) makes the write wait for it: the two ways read disjoint chunks,
        // so the one that leaves it alone wins whatever the bytes.
        let slow_index = array
            .slow_slot()
            .and_then(|slot| (0..k + np).find(|&i| g.stripe_member(stripe, i) == slot));
        let reads_slow = slow_index.map(|i| ((i < k && rcw_read(i) > 0), rmw_read(i) > 0));
        let mode = match reads_slow {
            _ if rcw_bytes == 0 => Mode::Rcw,
            Some((true, false)) => Mode::Rmw,
            Some((false, true)) => Mode::Rcw,
            _ if rcw_bytes <= rmw_bytes => Mode::Rcw,
            _ => Mode::Rmw,
        };
        let read_bytes = match mode {
            Mode::Rmw => rmw_bytes,
            _ => rcw_bytes,
        };
        (mode, read_bytes > 0)
    };
    StripePlan {
        stripe,
        touches: range,
        r,
        mode,
        reads_members,
        missing,
    }
}

/// Writes `extents` of `buf` (one: all of it; more: `write_extents`) at `offset_bytes` plus their starts.
fn write_parity<'a>(
    array: &'a Array,
    offset_bytes: u64,
    buf: &[u8],
    extents: &[Range<usize>],
    fua: bool,
    answer: Option<&EarlyAnswer<'a>>,
) -> Result<(), EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let np = g.level.parity_chunks();
    let mut all = extents
        .iter()
        .flat_map(|e| {
            pieces(g.chunk_bytes, offset_bytes + e.start as u64, e.len() as u64).map(move |piece| {
                Piece {
                    buf_at: piece.buf_at + e.start,
                    ..piece
                }
            })
        })
        .map(|piece| Touch {
            index: (piece.chunk % k as u64) as usize,
            piece,
        })
        .peekable();
    let mut touches: Vec<Touch> = Vec::new();
    let mut plans: Vec<StripePlan> = Vec::new();
    let mut first_window = true;
    while all.peek().is_some() {
        touches.clear();
        plans.clear();
        let mut window_bytes = 0usize;
        // The member states the plans are made against (bumped by every state change).
        let mut planned_epoch = array.health.epoch.load(Ordering::SeqCst);
        // Gather whole stripes until the window is full.
        while let Some(first) = all.peek().copied() {
            let stripe = first.piece.chunk / k as u64;
            let start = touches.len();
            while let Some(t) = all.peek().copied() {
                if t.piece.chunk / k as u64 != stripe {
                    break;
                }
                touches.push(t);
                all.next();
            }
            let plan = plan_stripe(array, stripe, &touches, start..touches.len(), 0);
            window_bytes += plan.scratch_bytes(&touches, k, np);
            plans.push(plan);
            if window_bytes >= WINDOW_BYTES || plans.len() as u64 >= WINDOW_STRIPES {
                break;
            }
        }
        // Only a write of one window can be answered from the log: its log round holds all of it.
        let early = answer.filter(|_| first_window && all.peek().is_none());
        first_window = false;
        let first_stripe = plans[0].stripe;
        let stripes = plans[plans.len() - 1].stripe - first_stripe + 1;
        let _guard = array.locks.lock(first_stripe, stripes);
        // Journal mode: the data logged before anything is read, and the writer answered once it is durable
        // (ppl/entries.rs, `log_data_first`). Not where the plans read nothing (the stripe cache holds what they
        // need): the partial parity is then at hand, and one round with both costs a record less for the same
        // single round trip before the answer.
        // Nor where the window continues stream entries (lone answers): it rides or extends them instead, as
        // with the log (`Ppl::continues_streams`).
        if let (Some(answer), Some(ppl)) = (early, array.integrity.ppl()) {
            let reads_members = plans.iter().any(|p| p.reads_members);
            let pieces = (!fua
                && reads_members
                && !ppl.continues_streams(
                    array,
                    &stream_touches(&plans, &touches),
                    answer.sequential,
                ))
            .then(|| data_first_pieces(array, &plans, &touches, buf))
            .flatten();
            if let Some(round) = pieces
                .map(|p| ppl.log_data_first(array, &p))
                .transpose()?
                .flatten()
            {
                *answer.data_round.borrow_mut() = Some(round);
                array.wait_durable()?;
                answer.give();
            }
        }
        retry_window(array, |attempt, unreadable| {
            // The plans were made before the stripes' locks were taken. A write that held them meanwhile may
            // have failed on a member and evicted it: that member's chunks of these stripes then miss that
            // write (its new bytes live only in the parity), so a plan that still reads them would compute
            // parity from stale bytes and write it before anything notices (a redo cannot take that back: it
            // would reconstruct the stale bytes from that parity). Under the locks no write to these stripes
            // fails unnoticed any more, so plans made now read only chunks that hold every acknowledged byte
            // (faults_members::row03_write_queued_behind_a_member_failure_reads_no_stale_chunk, sim seed 218289).
            if attempt > 0 || array.health.epoch.load(Ordering::SeqCst) != planned_epoch {
                // Re-plan with the members as they are now.
                planned_epoch = array.health.epoch.load(Ordering::SeqCst);
                for plan in plans.iter_mut() {
                    *plan = plan_stripe(
                        array,
                        plan.stripe,
                        &touches,
                        plan.touches.clone(),
                        unreadable,
                    );
                }
                window_bytes = plans.iter().map(|p| p.scratch_bytes(&touches, k, np)).sum();
            }
            if rmw_to_rcw_for_log(array, &mut plans, &touches) {
                window_bytes = plans.iter().map(|p| p.scratch_bytes(&touches, k, np)).sum();
            }
            let window = |scratch: &mut [u8]| {
                write_parity_window(array, &plans, &touches, buf, fua, early, scratch)
            };
            // Parity computed in the backend's memory where it lends some: with the request's own bytes in such
            // memory too (`Array::payload_memory`), a GPU serves whole stripes in place.
            let outcome = if array.parity_lends_memory {
                with_batch_scratch(array.parity.as_ref(), window_bytes, window)
            } else {
                with_scratch(window_bytes, window)
            }?;
            if matches!(outcome, Attempt::Done)
                && array.health.epoch.load(Ordering::SeqCst) != planned_epoch
            {
                // A member left while the window was logged or written (its log write failed, say): the
                // window's log entries count the chunks it held as written in place, yet their new contents
                // live only in the parity now. Done again against the members as they are, the window logs
                // entries that keep those contents in the partial parity (sim seeds 4911, 5980, 6017).
                return Ok(Attempt::Redo {
                    unreadable: 0,
                    wrote_in_place: true,
                });
            }
            Ok(outcome)
        })?;
    }
    Ok(())
}

/// Buffers of one stripe, carved from the window's scratch.
struct StripeBufs<'s> {
    /// RCW/degraded: every data chunk over R, then (degraded) P and Q over R, in stripe index order.
    /// RMW: the new bytes of each touch over its pages.
    chunks: Vec<&'s mut [u8]>,
    /// RMW: the old bytes of each touch over its pages.
    old: Vec<&'s mut [u8]>,
    /// RCW/RMW: P (and Q) over R. Degraded keeps them at the end of `chunks`.
    parity: Vec<&'s mut [u8]>,
    /// RCW, by data index: the request's own bytes where it overwrites the chunk over all of R from a
    /// page-aligned address (its `chunks` entry is then empty): parity is computed from them and they are
    /// written from there, without a copy into scratch (a sequential writer's whole payload).
    direct: Vec<Option<&'s [u8]>>,
}

/// The request's bytes for data index `index` of `plan` if it overwrites the chunk over all of R from a
/// page-aligned address (O_DIRECT members need one), else None.
fn direct_bytes<'b>(
    plan: &StripePlan,
    touches: &[Touch],
    index: usize,
    buf: &'b [u8],
) -> Option<&'b [u8]> {
    let t = touches[plan.touches.clone()]
        .iter()
        .find(|t| t.index == index)?;
    let covers_r = t.piece.lo == plan.r.start && t.piece.hi == plan.r.end;
    let bytes = &buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()];
    (covers_r && (bytes.as_ptr() as u64).is_multiple_of(PAGE_BYTES)).then_some(bytes)
}

impl StripeBufs<'_> {
    /// Data chunk `index` over R (RCW and degraded, once merged).
    fn data(&self, index: usize) -> &[u8] {
        match self.direct.get(index).copied().flatten() {
            Some(bytes) => bytes,
            None => &self.chunks[index][..],
        }
    }
}

fn write_parity_window(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    buf: &[u8],
    fua: bool,
    answer: Option<&EarlyAnswer<'_>>,
    scratch: &mut [u8],
) -> Result<Attempt, EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let np = g.level.parity_chunks();
    let has_q = g.level == Level::Raid6;
    let mut carver = Carver::new(scratch);
    let mut bufs: Vec<StripeBufs<'_>> = plans
        .iter()
        .map(|plan| {
            let r = page_len(&plan.r);
            match plan.mode {
                Mode::Rcw => {
                    let direct: Vec<Option<&[u8]>> = (0..k)
                        .map(|i| direct_bytes(plan, touches, i, buf))
                        .collect();
                    StripeBufs {
                        chunks: direct
                            .iter()
                            .map(|d| carver.take(if d.is_some() { 0 } else { r }))
                            .collect(),
                        old: Vec::new(),
                        parity: (0..np).map(|_| carver.take(r)).collect(),
                        direct,
                    }
                }
                Mode::Degraded => StripeBufs {
                    chunks: (0..k + np).map(|_| carver.take(r)).collect(),
                    old: Vec::new(),
                    parity: Vec::new(),
                    direct: Vec::new(),
                },
                Mode::Rmw => {
                    let mine = &touches[plan.touches.clone()];
                    StripeBufs {
                        chunks: mine
                            .iter()
                            .map(|t| carver.take(page_len(&t.pages())))
                            .collect(),
                        old: mine
                            .iter()
                            .map(|t| carver.take(page_len(&t.pages())))
                            .collect(),
                        parity: (0..np).map(|_| carver.take(r)).collect(),
                        direct: Vec::new(),
                    }
                }
            }
        })
        .collect();

    // Phase 1: every read of the window in one batch. What an earlier write left in the stripe cache is what the
    // members hold (stripe_cache.rs): those bytes are not read. Degraded stripes read everything they can.
    let cache = &array.stripe_cache;
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    for (plan, b) in plans.iter().zip(bufs.iter_mut()) {
        let s = plan.stripe;
        let mine = &touches[plan.touches.clone()];
        let member_at = |index: usize, in_chunk: u64| {
            (g.stripe_member(s, index), array.member_offset(s, in_chunk))
        };
        match plan.mode {
            Mode::Rcw => {
                for (index, chunk) in b.chunks.iter_mut().enumerate() {
                    if b.direct[index].is_some() {
                        continue; // overwritten whole from the request's bytes: nothing to read
                    }
                    let (member, at) = member_at(index, plan.r.start);
                    let full = match mine.iter().find(|t| t.index == index) {
                        Some(t) => t.full_pages(),
                        None => plan.r.start..plan.r.start,
                    };
                    if full.is_empty() {
                        if plan.readable(index) && !cache.fill(s, index, plan.r.start, chunk) {
                            reqs.push(IoReq::read(member, at, chunk));
                        }
                        continue;
                    }
                    if !plan.readable(index) {
                        // A missing chunk is planned RCW only when the request covers all of R.
                        debug_assert!(full.start == plan.r.start && full.end == plan.r.end);
                        continue;
                    }
                    // Read around the fully overwritten pages.
                    let left = (full.start - plan.r.start) as usize;
                    let right = (full.end - plan.r.start) as usize;
                    let (head, rest) = chunk.split_at_mut(left);
                    let tail = &mut rest[right - left..];
                    if !head.is_empty() && !cache.fill(s, index, plan.r.start, head) {
                        reqs.push(IoReq::read(member, at, head));
                    }
                    if !tail.is_empty() && !cache.fill(s, index, full.end, tail) {
                        reqs.push(IoReq::read(member, array.member_offset(s, full.end), tail));
                    }
                }
            }
            Mode::Degraded => {
                for (index, chunk) in b.chunks.iter_mut().enumerate() {
                    let (member, at) = member_at(index, plan.r.start);
                    if plan.readable(index) {
                        reqs.push(IoReq::read(member, at, chunk));
                    }
                }
            }
            Mode::Rmw => {
                for (t, old) in mine.iter().zip(b.old.iter_mut()) {
                    if cache.fill(s, t.index, t.pages().start, old) {
                        continue;
                    }
                    let (member, at) = member_at(t.index, t.pages().start);
                    reqs.push(IoReq::read(member, at, old));
                }
                for (i, p) in b.parity.iter_mut().enumerate() {
                    if cache.fill(s, k + i, plan.r.start, p) {
                        continue;
                    }
                    let (member, at) = member_at(k + i, plan.r.start);
                    reqs.push(IoReq::read(member, at, p));
                }
            }
        }
    }
    let failures = array.submit_tolerant(reqs);
    if !failures.is_empty() {
        return Ok(Attempt::Redo {
            unreadable: failures.iter().fold(0, |m, f| m | bit(f.slot)),
            wrote_in_place: false,
        });
    }

    // Phase 2: merge the new data and compute parity.
    for (plan, b) in plans.iter().zip(bufs.iter_mut()) {
        let mine = &touches[plan.touches.clone()];
        if plan.mode == Mode::Degraded {
            let missing = &plan.missing;
            if missing.iter().any(|i| *i < k) {
                array
                    .parity
                    .recover(&mut b.chunks, has_q, missing)
                    .map_err(|source| EngineError::ReconstructStripe {
                        stripe: plan.stripe,
                        source,
                    })?;
            }
            // From here on the degraded stripe is an RCW stripe whose parity sits after its data.
            let parity = b.chunks.split_off(k);
            b.parity = parity;
        }
        match plan.mode {
            Mode::Rcw | Mode::Degraded => {
                for t in mine {
                    if b.direct.get(t.index).copied().flatten().is_some() {
                        continue;
                    }
                    let at = (t.piece.lo - plan.r.start) as usize;
                    b.chunks[t.index][at..at + t.piece.len()]
                        .copy_from_slice(&buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()]);
                }
            }
            Mode::Rmw => {
                for (j, t) in mine.iter().enumerate() {
                    let pages = t.pages();
                    let new = &mut b.chunks[j];
                    new.copy_from_slice(b.old[j]);
                    let at = (t.piece.lo - pages.start) as usize;
                    new[at..at + t.piece.len()]
                        .copy_from_slice(&buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()]);
                    let sub =
                        (pages.start - plan.r.start) as usize..(pages.end - plan.r.start) as usize;
                    let (p, q) = b.parity.split_at_mut(1);
                    array.parity.update(
                        t.index,
                        b.old[j],
                        b.chunks[j],
                        &mut p[0][sub.clone()],
                        q.first_mut().map(|q| &mut q[sub]),
                    );
                }
            }
        }
    }
    // Full parity generation for every RCW (and degraded) stripe of the window in one backend call.
    {
        let mut data_refs: Vec<Vec<&[u8]>> = Vec::new();
        let mut parity_refs: Vec<&mut Vec<&mut [u8]>> = Vec::new();
        for (plan, b) in plans.iter().zip(bufs.iter_mut()) {
            if plan.mode == Mode::Rmw {
                continue;
            }
            let StripeBufs {
                chunks,
                parity,
                direct,
                ..
            } = b;
            data_refs.push(
                chunks
                    .iter()
                    .enumerate()
                    .map(|(i, c)| direct.get(i).copied().flatten().unwrap_or(&**c))
                    .collect(),
            );
            parity_refs.push(parity);
        }
        let mut gens: Vec<StripeGen<'_>> = data_refs
            .iter()
            .zip(parity_refs.iter_mut())
            .map(|(data, parity)| {
                let (p, q) = parity.split_at_mut(1);
                StripeGen {
                    data,
                    p: &mut *p[0],
                    q: q.first_mut().map(|q| &mut **q),
                }
            })
            .collect();
        if !gens.is_empty() {
            array.parity.gen_batch(&mut gens);
        }
    }

    // The stripes' partial parity durable before anything is written in place (ppl/).
    let logged = match array.integrity.ppl() {
        Some(ppl) => Some(
            ppl.log_window(
                array,
                &log_views(array, plans, touches, &bufs),
                fua,
                answer
                    .map(|a| a.data_round.borrow())
                    .as_deref()
                    .and_then(|d| d.as_ref()),
                answer.is_some(),
                answer.is_some_and(|a| a.sequential),
            )?,
        ),
        None => None,
    };
    if let (Some(answer), Some(logged)) = (answer, &logged) {
        if logged.answerable {
            // Durable in the log (recovery rolls it forward), and the member states the entries were made
            // against are on record: the writer may go on while the window writes in place.
            array.wait_durable()?;
            answer.give();
        }
    }

    // Phase 3: every write of the window in one batch. The stripe cache forgets what the window writes first: from
    // here until the writes succeed, what the members hold there is not known (stripe_cache.rs).
    for plan in plans {
        for t in &touches[plan.touches.clone()] {
            array
                .stripe_cache
                .forget_range(plan.stripe, t.index, t.pages());
        }
        for i in 0..np {
            array
                .stripe_cache
                .forget_range(plan.stripe, k + i, plan.r.clone());
        }
    }
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    for (plan, b) in plans.iter().zip(bufs.iter()) {
        let s = plan.stripe;
        let mine = &touches[plan.touches.clone()];
        for (j, t) in mine.iter().enumerate() {
            let member = g.stripe_member(s, t.index);
            let dests = array.write_targets(member, s);
            if dests == [NO_TARGET; 2] {
                continue;
            }
            let pages = t.pages();
            let bytes = match plan.mode {
                Mode::Rmw => &b.chunks[j][..],
                Mode::Rcw | Mode::Degraded => &b.data(t.index)
                    [(pages.start - plan.r.start) as usize..(pages.end - plan.r.start) as usize],
            };
            for dest in dests.into_iter().filter(|d| *d != NO_TARGET) {
                reqs.push(IoReq::write(
                    dest,
                    array.member_offset(s, pages.start),
                    bytes,
                    fua,
                ));
            }
        }
        for (i, p) in b.parity.iter().enumerate() {
            let member = g.stripe_member(s, k + i);
            for dest in array.write_targets(member, s) {
                if dest != NO_TARGET {
                    reqs.push(IoReq::write(
                        dest,
                        array.member_offset(s, plan.r.start),
                        p,
                        fua,
                    ));
                }
            }
        }
    }
    // Nothing is written in place once the array failed: the targets above leave out a member that left, whose
    // chunks a forced start would trust again (ppl/entries.rs, `log_window`).
    array.check_serving()?;
    let failed = array.submit_tolerant(reqs);
    drop(logged); // the in-place writes are done (ppl/)
    if failed.is_empty() {
        store_in_cache(array, plans, touches, &bufs);
        Ok(Attempt::Done)
    } else {
        Ok(Attempt::Redo {
            unreadable: 0,
            wrote_in_place: true,
        })
    }
}

/// Parity ranges up to this size are kept in the stripe cache: small writes, the ones that read before they
/// write. Longer ones are mostly sequential streams, which would only push hot pages out.
const CACHE_STORE_MAX_BYTES: u64 = 64 << 10;

/// Keeps what the small partial-stripe writes of a window wrote (their data pages, and the parity) in the stripe
/// cache, once every in-place write succeeded: what the next read-modify-write of the
/// same pages reads. Degraded stripes are left out (their chunks are not all where the write put them).
fn store_in_cache(array: &Array, plans: &[StripePlan], touches: &[Touch], bufs: &[StripeBufs<'_>]) {
    let cache = &array.stripe_cache;
    if !cache.enabled() {
        return;
    }
    let k = array.geometry.data_per_stripe();
    for (plan, b) in plans.iter().zip(bufs) {
        let whole = |index: usize| {
            touches[plan.touches.clone()]
                .iter()
                .any(|t| t.index == index && t.full_pages() == plan.r)
        };
        if plan.mode == Mode::Degraded
            || plan.r.end - plan.r.start > CACHE_STORE_MAX_BYTES
            || (0..k).all(whole)
        {
            continue; // degraded, long, or written whole over R (it read nothing: a stream's)
        }
        if !cache.admit(plan.stripe) {
            continue;
        }
        // What a read-modify-write of the same pages reads: the written data pages and the parity. (A
        // reconstruct-write also knows the other data chunks over R; keeping them would halve how many hot pages
        // the cache holds, for the rarer rewrites the log turns into reconstruct-writes.)
        for (j, t) in touches[plan.touches.clone()].iter().enumerate() {
            let pages = t.pages();
            let bytes = match plan.mode {
                Mode::Rmw => &b.chunks[j][..],
                _ => &b.data(t.index)
                    [(pages.start - plan.r.start) as usize..(pages.end - plan.r.start) as usize],
            };
            cache.store(plan.stripe, t.index, pages.start, bytes);
        }
        for (i, p) in b.parity.iter().enumerate() {
            cache.store(plan.stripe, k + i, plan.r.start, p);
        }
    }
}

/// The partial parity log must hold every chunk an entry counts as modified: a read-modify-write that would not
/// (a chunk of the stripe written since the last flush that this write does not rewrite over all of R) becomes a
/// reconstruct-write. Decided under the stripe locks, where the log's view of the stripe cannot change. Returns
/// whether a plan changed.
fn rmw_to_rcw_for_log(array: &Array, plans: &mut [StripePlan], touches: &[Touch]) -> bool {
    let Some(ppl) = array.integrity.ppl() else {
        return false;
    };
    let mut changed = false;
    for plan in plans.iter_mut().filter(|p| p.mode == Mode::Rmw) {
        let written: Vec<(usize, Range<u64>)> = touches[plan.touches.clone()]
            .iter()
            .map(|t| (t.index, t.pages()))
            .collect();
        if !ppl.rmw_allowed(plan.stripe, &written, &plan.r) {
            plan.mode = Mode::Rcw;
            changed = true;
        }
    }
    changed
}

/// Per stripe of a window, the one data chunk it changes there and the pages (`Ppl::continues_streams`).
fn stream_touches(plans: &[StripePlan], touches: &[Touch]) -> Vec<StreamTouch> {
    plans
        .iter()
        .map(|plan| {
            let mine = &touches[plan.touches.clone()];
            let one = match mine {
                [first, rest @ ..] if rest.iter().all(|t| t.index == first.index) => {
                    let pages = rest.iter().fold(first.pages(), |a, t| {
                        let b = t.pages();
                        a.start.min(b.start)..a.end.max(b.end)
                    });
                    Some((first.index, pages))
                }
                _ => None,
            };
            (plan.stripe, one)
        })
        .collect()
}

/// Journal mode: the pieces of a window `Ppl::log_data_first` may log before anything is read (stripe, data
/// index, in-chunk pages, their new bytes): every piece covers whole pages (its bytes are the pages' contents
/// without a read) and no stripe is written whole (those are not answered from the log). None otherwise.
fn data_first_pieces<'b>(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    buf: &'b [u8],
) -> Option<Vec<DataPiece<'b>>> {
    let k = array.geometry.data_per_stripe();
    let whole = 0..array.geometry.chunk_bytes;
    let mut pieces = Vec::new();
    for plan in plans {
        let mine = &touches[plan.touches.clone()];
        if (0..k).all(|i| mine.iter().any(|t| t.index == i && t.full_pages() == whole)) {
            return None;
        }
        for t in mine {
            let pages = t.pages();
            if t.piece.lo != pages.start || t.piece.hi != pages.end {
                return None;
            }
            let bytes = &buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()];
            pieces.push(DataPiece {
                stripe: plan.stripe,
                index: t.index,
                pages,
                bytes,
            });
        }
    }
    Some(pieces)
}

/// What the partial parity log needs of each stripe of the window: the chunks written in place, the new data it
/// holds and the new parity.
fn log_views<'a>(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    bufs: &'a [StripeBufs<'_>],
) -> Vec<StripeView<'a>> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let whole = 0..g.chunk_bytes;
    plans
        .iter()
        .zip(bufs)
        .map(|(plan, b)| {
            let mine = &touches[plan.touches.clone()];
            let full = (0..k).all(|i| mine.iter().any(|t| t.index == i && t.full_pages() == whole));
            let (written, changed_missing) = mine
                .iter()
                .map(|t| (t.index, t.pages()))
                .partition(|(i, _)| array.is_active(g.stripe_member(plan.stripe, *i)));
            let data = match plan.mode {
                Mode::Rmw => {
                    let mut data = vec![None; k];
                    for (j, t) in mine.iter().enumerate() {
                        data[t.index] = Some((t.pages(), &*b.chunks[j]));
                    }
                    data
                }
                Mode::Rcw | Mode::Degraded => {
                    (0..k).map(|i| Some((plan.r.clone(), b.data(i)))).collect()
                }
            };
            StripeView {
                stripe: plan.stripe,
                r: plan.r.clone(),
                full,
                written,
                changed_missing,
                data,
                p: b.parity[0],
                q: b.parity.get(1).map(|q| &**q),
            }
        })
        .collect()
}
