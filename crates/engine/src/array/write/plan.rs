//! RAID5/6: how each stripe of a write window is updated (reconstruct-write, read-modify-write, or degraded),
//! decided from what the request touches, what the stripe cache holds, which members can be read, and what the
//! partial parity log needs.

use super::*;

/// The bytes of one data chunk a request writes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Touch {
    /// Data index within the stripe.
    pub(super) index: usize,
    pub(super) piece: Piece,
}

impl Touch {
    /// Touched pages: `aligned()` of the piece.
    pub(super) fn pages(&self) -> Range<u64> {
        let (lo, hi) = self.piece.aligned();
        lo..hi
    }

    /// Pages the request overwrites completely (may be empty).
    pub(super) fn full_pages(&self) -> Range<u64> {
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
pub(super) enum Mode {
    Rcw,
    Rmw,
    Degraded,
}

#[derive(Debug)]
pub(super) struct StripePlan {
    pub(super) stripe: u64,
    /// Indices into the window's touches.
    pub(super) touches: Range<usize>,
    /// Page-aligned in-chunk range over which parity is recomputed.
    pub(super) r: Range<u64>,
    pub(super) mode: Mode,
    /// Whether the plan reads from the members when it was made (what the stripe cache holds is not read): a
    /// journal write that reads nothing gains nothing from logging its data first (`write_parity`).
    pub(super) reads_members: bool,
    /// Stripe indices not read in this attempt (inactive members, members whose reads failed): fixed when
    /// planned, so that a member coming back mid-window cannot be taken for read.
    pub(super) missing: Vec<usize>,
}

impl StripePlan {
    pub(super) fn readable(&self, index: usize) -> bool {
        !self.missing.contains(&index)
    }
}

impl StripePlan {
    pub(super) fn scratch_bytes(&self, touches: &[Touch], k: usize, np: usize) -> usize {
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
pub(super) fn plan_stripe(
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

/// The partial parity log must hold every chunk an entry counts as modified: a read-modify-write that would not
/// (a chunk of the stripe written since the last flush that this write does not rewrite over all of R) becomes a
/// reconstruct-write. Decided under the stripe locks, where the log's view of the stripe cannot change. Returns
/// whether a plan changed.
pub(super) fn rmw_to_rcw_for_log(
    array: &Array,
    plans: &mut [StripePlan],
    touches: &[Touch],
) -> bool {
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
