//! Discard and write-zeroes. Whole stripes are deallocated on every member: an all-zero stripe has zero parity
//! (P = XOR of zeros, Q = sum of g^i * 0), so zeros everywhere are consistent. The partial stripes at either end
//! go through the normal write path as zeros, which keeps their parity right. Member `Discard` guarantees the
//! range reads back as zeros (it writes zeros on a device that cannot deallocate with that promise).

use super::{write, Array, NO_TARGET};
use crate::buf::round_down;
use crate::error::EngineError;
use crate::layout::{Level, PAGE_BYTES};
use crate::member::IoReq;

/// Stripes deallocated under one hold of the stripe locks.
const DISCARD_WINDOW_STRIPES: u64 = 1024;

static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

pub(super) fn discard(
    array: &Array,
    offset_bytes: u64,
    len_bytes: u64,
    fua: bool,
) -> Result<(), EngineError> {
    if len_bytes == 0 {
        return Ok(());
    }
    let unit = array.geometry.stripe_bytes();
    let end = offset_bytes + len_bytes;
    let first_whole = offset_bytes.div_ceil(unit);
    let end_whole = end / unit;
    if first_whole >= end_whole || zero_through_write_path(array) {
        return write_zeros(array, offset_bytes, len_bytes, fua);
    }
    write_zeros(array, offset_bytes, first_whole * unit - offset_bytes, fua)?;
    deallocate_stripes(array, first_whole, end_whole)?;
    write_zeros(array, end_whole * unit, end - end_whole * unit, fua)?;
    if fua {
        // Hole punches become durable with the members' next sync (the caller holds the membership lock).
        array.flush_shared()?;
    }
    Ok(())
}

/// A degraded RAID5/6 array with the partial parity log writes zeros through the write path instead of
/// deallocating: a missing data member's chunk then lives only in the parity, and a power loss that keeps some
/// of the stripe's hole punches and drops others would leave it neither old nor zero. The write path logs its
/// partial parity first (ppl/); a deallocation has no such ordering point.
fn zero_through_write_path(array: &Array) -> bool {
    let g = array.geometry;
    g.level.has_parity()
        && array.integrity.ppl().is_some()
        && array.active_slots().count() < g.members
}

fn write_zeros(
    array: &Array,
    offset_bytes: u64,
    len_bytes: u64,
    fua: bool,
) -> Result<(), EngineError> {
    let mut done = 0;
    while done < len_bytes {
        let mut n = (len_bytes - done).min(ZEROS.len() as u64);
        if done + n < len_bytes {
            // Slices end on a page boundary: a page written by two calls (the first merging zeros into the old
            // bytes, the second zeroing the rest) could be left half old, half zero by a power loss that keeps
            // only the first, and a block must come back old or new (sim seed 7404).
            n = round_down(offset_bytes + done + n, PAGE_BYTES) - (offset_bytes + done);
        }
        debug_assert!(n > 0);
        write::write(array, offset_bytes + done, &ZEROS[..n as usize], fua, None)?;
        done += n;
    }
    Ok(())
}

/// Deallocates every member cell of stripes `first..end` (stripe = row for RAID0/5/6, chunk for RAID1/10), on
/// the active members and on rebuild targets below their progress. A member whose discard fails is evicted and
/// the window redone without it.
fn deallocate_stripes(array: &Array, first: u64, end: u64) -> Result<(), EngineError> {
    let mut s = first;
    'windows: while s < end {
        if zero_through_write_path(array) {
            // The array went degraded since the discard began (a member failed in its head or an earlier
            // window): the rest is zeroed through the logged write path, as a degraded discard is.
            let unit = array.geometry.stripe_bytes();
            return write_zeros(array, s * unit, (end - s) * unit, false);
        }
        let e = end.min(s + DISCARD_WINDOW_STRIPES);
        let guard = array.locks.lock(s, e - s);
        if zero_through_write_path(array) {
            // A write that held these stripes evicted a member while this discard waited for them (the same
            // race the write path re-plans for): back to the top, now through the write path.
            drop(guard);
            continue 'windows;
        }
        // Deallocated chunks read back as zeros from here on (stripe_cache.rs).
        array.stripe_cache.forget(s, e - s);
        // Void a live partial parity log entry of these stripes first (ppl/); done when dropped.
        let _logged = match array.integrity.ppl() {
            Some(ppl) if array.geometry.level.has_parity() => Some(ppl.log_overwrite(array, s..e)?),
            _ => None,
        };
        let mut attempts = 0;
        while !deallocate_window(array, s, e) {
            array.check_serving()?;
            if zero_through_write_path(array) {
                // A member failed mid-discard and the parity array runs degraded now: its chunks live only in
                // the parity, and hole punches kept or dropped unevenly by a power loss would tear them (sim
                // seed 43020). Back to the top (locks and log entry released): the rest, this window included,
                // is zeroed through the logged write path there.
                continue 'windows;
            }
            attempts += 1;
            if attempts > 2 * array.geometry.members {
                return Err(EngineError::RetryWindow {
                    what: "discard",
                    attempts,
                });
            }
        }
        array.check_serving()?;
        s = e;
    }
    Ok(())
}

thread_local! {
    /// This thread is inside `deallocate_window` (holding the dealloc gate shared).
    static DEALLOCATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is deallocating stripes: an eviction from its own hole punches must not wait for the
/// dealloc gate it holds.
pub(super) fn deallocating_here() -> bool {
    DEALLOCATING.with(|d| d.get())
}

/// Clears `DEALLOCATING` however the window ends.
struct Deallocating;

impl Deallocating {
    fn enter() -> Deallocating {
        DEALLOCATING.with(|d| d.set(true));
        Deallocating
    }
}

impl Drop for Deallocating {
    fn drop(&mut self) {
        DEALLOCATING.with(|d| d.set(false));
    }
}

/// One attempt at deallocating stripes `s..e` (their locks held); false if a member failed, or (RAID5/6) if a
/// member left before it began: the caller then goes through the write path.
fn deallocate_window(array: &Array, s: u64, e: u64) -> bool {
    let g = array.geometry;
    // RAID5/6: no member may leave between the check that all are in and the end of the hole punches
    // (`ArrayCore::dealloc_gate`); every change of member states waits for the window, and one caused by the
    // window's own punches goes ahead (this thread holds the gate) and flushes the survivors before the window is
    // redone.
    let _gate = g
        .level
        .has_parity()
        .then(|| array.dealloc_gate.read().unwrap_or_else(|e| e.into_inner()));
    let _deallocating = Deallocating::enter();
    if g.level.has_parity() && zero_through_write_path(array) {
        return false;
    }
    // Every other thread's state change waits for the gate; one made on this thread (its own punch failing, a
    // superblock write failing in the eviction that follows) shows in the health epoch and counts as a failed
    // punch.
    let epoch = array.health.epoch.load(std::sync::atomic::Ordering::SeqCst);
    let chunk_bytes = g.chunk_bytes;
    let slots = array
        .io
        .slots()
        .max(g.members)
        .max(crate::layout::MAX_MEMBERS);
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    let mut runs: Vec<Option<(u64, u64)>> = vec![None; slots];
    if g.level == Level::Raid10 {
        // Copies of consecutive chunks climb the rows of each member: merge them into runs per member.
        let push_run = |reqs: &mut Vec<IoReq<'_>>, member: usize, run: (u64, u64)| {
            let at = array.member_offset(run.0, 0);
            reqs.push(IoReq::discard(member, at, (run.1 - run.0) * chunk_bytes));
        };
        for chunk in s..e {
            for copy in 0..2 {
                let addr = g.chunk_copy(chunk, copy);
                for dest in array.write_targets(addr.member, addr.row) {
                    if dest == NO_TARGET {
                        continue;
                    }
                    match &mut runs[dest] {
                        Some(run) if run.1 == addr.row => run.1 += 1,
                        slot => {
                            if let Some(run) = slot.take() {
                                push_run(&mut reqs, dest, run);
                            }
                            *slot = Some((addr.row, addr.row + 1));
                        }
                    }
                }
            }
        }
        for (member, run) in runs.iter_mut().enumerate() {
            if let Some(run) = run.take() {
                push_run(&mut reqs, member, run);
            }
        }
    } else {
        for member in 0..g.members {
            if array.is_active(member) {
                reqs.push(IoReq::discard(
                    member,
                    array.member_offset(s, 0),
                    (e - s) * chunk_bytes,
                ));
            }
            // A rebuild target takes the part below its progress; the rest it rebuilds (as zeros) later.
            let (target, rows) = array.target_below(member, e);
            if target != NO_TARGET && rows > s {
                reqs.push(IoReq::discard(
                    target,
                    array.member_offset(s, 0),
                    (rows - s) * chunk_bytes,
                ));
            }
        }
    }
    let punched = array.submit_tolerant(reqs).is_empty()
        && array.health.epoch.load(std::sync::atomic::Ordering::SeqCst) == epoch;
    if !punched && g.level.has_parity() {
        // What the other members punched must be durable before the window is redone through the write path:
        // `evict` flushes the survivors, but not for a member a failed superblock write marked faulty.
        for (slot, source) in array.flush_survivors() {
            array.evict(slot, &format!("flush failed after a retry: {source}"));
        }
    }
    punched
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::fault::{CrashMembers, Fault, FaultyMembers, OpKinds, Scope};
    use crate::layout::Level;
    use crate::superblock::{SlotState, DEFAULT_DATA_OFFSET_BYTES};
    use crate::{assemble_io, create_io, AssembleOptions};

    /// A member marked faulty because its superblock write failed (not through `evict`) waits, like an eviction,
    /// for a window of hole punches to end: leaving in the middle would leave the window's stripes deallocated
    /// on the survivors only, not yet durable, its chunks living in parity a power loss can tear.
    #[test]
    fn a_failed_superblock_write_waits_for_a_window_of_hole_punches() {
        const CHUNK: u64 = 4096;
        let rows = 16;
        let io = Arc::new(FaultyMembers::new(
            CrashMembers::new(4, DEFAULT_DATA_OFFSET_BYTES + rows * CHUNK),
            7,
        ));
        create_io(io.as_ref(), Level::Raid5, CHUNK, "gate").expect("create");
        let parity = Arc::new(paraid_parity::reference::Reference);
        let array = assemble_io(io.clone(), AssembleOptions::new(parity)).expect("assemble");
        let stripe = array.geometry().stripe_bytes();
        let data: Vec<u8> = (0..array.size_bytes()).map(|i| (i % 251) as u8).collect();
        array.write(0, &data, false).expect("fill");
        array.flush().expect("flush");
        // The window's punches sleep 400 ms; slot 2's superblock writes fail from now on.
        io.add(
            Scope::slot(0).ops(OpKinds::DISCARD),
            Fault::Delay {
                delay: Duration::from_millis(400),
                one_in: 1,
                sleep: true,
            },
        );
        io.add(
            Scope::slot(2).ops(OpKinds::WRITE).range(0..4096),
            Fault::FailFrom {
                nth: 1,
                count: crate::fault::Count::Global,
            },
        );
        let state_mid_window = std::thread::scope(|t| {
            let discard = t.spawn(|| array.discard(2 * stripe, 6 * stripe));
            std::thread::sleep(Duration::from_millis(100));
            let persist = t.spawn(|| array.persist_now());
            std::thread::sleep(Duration::from_millis(200));
            let mid = array.slot_state(2);
            discard.join().expect("discard thread").expect("discard");
            let _ = persist.join().expect("persist thread");
            mid
        });
        assert_eq!(
            state_mid_window,
            SlotState::Active,
            "slot 2 left the array while the discard punched holes"
        );
        assert_eq!(array.slot_state(2), SlotState::Faulty, "after the window");
        let mut back = vec![0u8; array.size_bytes() as usize];
        array.read(0, &mut back).expect("read degraded");
        for (i, (got, old)) in back.iter().zip(&data).enumerate() {
            let discarded = (2 * stripe..8 * stripe).contains(&(i as u64));
            assert!(
                *got == if discarded { 0 } else { *old },
                "byte {i}: {got}, expected {}",
                if discarded { 0 } else { *old }
            );
        }
    }
}
