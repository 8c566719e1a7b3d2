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
//!
//! Here: retries, early answers and the entry points; `copies` writes RAID0/1/10, `plan` decides how each RAID5/6
//! stripe of a window is updated, `parity` reads, computes, logs and writes a RAID5/6 window.

use std::ops::Range;
use std::sync::atomic::Ordering;

use paraid_parity::StripeGen;

use super::ppl::{DataPiece, DataRound, StreamTouch, StripeView};
use super::{pieces, Array, Piece, NO_TARGET, WINDOW_BYTES, WINDOW_STRIPES};
use crate::buf::{round_down, round_up, with_batch_scratch, with_scratch, Carver};
use crate::error::EngineError;
use crate::layout::{Level, PAGE_BYTES};
use crate::member::IoReq;

mod copies;
mod parity;
mod plan;

use copies::*;
use parity::*;
use plan::*;

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

/// Runs a window's reads (before anything is written in place); where one fails, the attempt to make instead: the
/// window redone without the members whose reads failed.
fn read_window(array: &Array, reqs: Vec<IoReq<'_>>) -> Option<Attempt> {
    let failures = array.submit_tolerant(reqs);
    (!failures.is_empty()).then(|| Attempt::Redo {
        unreadable: failures.iter().fold(0, |m, f| m | bit(f.slot)),
        wrote_in_place: false,
    })
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
