//! The read path: direct reads of each piece from a member holding it, batched per window; pieces whose member
//! is missing are rebuilt from the rest of their stripe (RAID5/6) or read from another copy (RAID1/10).
//!
//! A direct read that fails (after its retry) is served the same way, with the failing member left out, and the
//! recovered pages are written back to it while it is still active (md's read-error correction: a drive remaps
//! an unreadable sector when it is written). Reconstruction that meets another failing member leaves that one out
//! too, until the level cannot cover what is missing: then the request fails; it never returns guessed bytes.

use super::members::Failure;
use super::{pieces, Array, Piece, WINDOW_BYTES};
use crate::buf::{with_scratch, Carver};
use crate::error::EngineError;
use crate::layout::{ChunkAddr, Level, PAGE_BYTES};
use crate::member::IoReq;

/// Slots as a bit set (at most 64 members).
fn bit(slot: usize) -> u64 {
    1u64 << slot
}

pub(super) fn read(array: &Array, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
    let mut all = pieces(array.geometry.chunk_bytes, offset_bytes, buf.len() as u64).peekable();
    let mut direct: Vec<(Piece, ChunkAddr)> = Vec::new();
    let mut rebuild: Vec<Piece> = Vec::new();
    let mut steered: Vec<(Piece, usize)> = Vec::new();
    while all.peek().is_some() {
        direct.clear();
        rebuild.clear();
        steered.clear();
        let mut window_bytes = 0usize;
        while let Some(piece) = all.peek().copied() {
            let (lo, hi) = piece.aligned();
            let need = (hi - lo) as usize;
            if window_bytes > 0 && window_bytes + need > WINDOW_BYTES {
                break;
            }
            all.next();
            match array.readable_copy(piece.chunk) {
                Some(addr) => {
                    let way = if array.slow_slot() == Some(addr.member) {
                        around(array, &piece, addr).filter(|_| !array.probe_slow_member())
                    } else if array.returning_slot() == Some(addr.member) {
                        // Asked only of reads that can go around it: the share counts those.
                        around(array, &piece, addr).filter(|_| array.returning_steers(addr.member))
                    } else {
                        None
                    };
                    let read_at = match way {
                        Some(Around::Solve) => {
                            steered.push((piece, addr.member));
                            continue;
                        }
                        Some(Around::Copy(other)) => {
                            array.count_steered_read();
                            other
                        }
                        None => addr,
                    };
                    window_bytes += need;
                    direct.push((piece, read_at));
                }
                None if array.geometry.level.has_parity() => rebuild.push(piece),
                None => {
                    let slot = array.geometry.chunk_copy(piece.chunk, 0).member;
                    return Err(EngineError::ReachMember {
                        slot,
                        path: array.io.label(slot),
                    });
                }
            }
        }
        let k = array.geometry.data_per_stripe() as u64;
        if !rebuild.is_empty() {
            absorb_into_rebuilds(k, &mut direct, &mut rebuild);
        }
        let failed = read_direct(array, &direct, buf, window_bytes)?;
        for (piece, addr) in failed {
            if array.geometry.level.has_parity() {
                reconstruct(array, &[piece], buf, bit(addr.member), 0)?;
            } else {
                let out = &mut buf[piece.buf_at..piece.buf_at + piece.len()];
                read_other_copy(array, &piece, addr, out)?;
            }
        }
        // One reconstruction per stripe: its pieces come together in buffer order.
        for stripe_pieces in rebuild.chunk_by(|a, b| a.chunk / k == b.chunk / k) {
            reconstruct(array, stripe_pieces, buf, 0, 0)?;
        }
        for (piece, slow) in &steered {
            reconstruct(array, &[*piece], buf, 0, bit(*slow))?;
        }
    }
    Ok(())
}

/// Reads that the members serve together (`Array::read_many`). The pieces of every read that lies on active
/// members, whole pages at page-aligned places of its buffer, and on no member steered around, go out as one
/// batch of member reads: on drives one ring submission (one system call and one doorbell per member) for all of
/// them, where read by read each costs its own, and each wakes its own waiting thread. A piece whose member read
/// fails (after its retry) is solved as `read` solves it; every other read goes through `read` itself. One result
/// per read, in order.
pub(super) fn read_many(
    array: &Array,
    reads: &mut [(u64, &mut [u8])],
) -> Vec<Result<(), EngineError>> {
    let mut results: Vec<Result<(), EngineError>> = (0..reads.len()).map(|_| Ok(())).collect();
    // Per read: its pieces and where each is read from, when it can be read directly; None: through `read`.
    let mut batch_bytes = 0usize;
    let plans: Vec<Option<Vec<(Piece, ChunkAddr)>>> = reads
        .iter()
        .map(|(offset_bytes, buf)| {
            let plan = direct_plan(array, *offset_bytes, buf)?;
            let bytes = buf.len();
            (batch_bytes + bytes <= WINDOW_BYTES).then(|| {
                batch_bytes += bytes;
                plan
            })
        })
        .collect();
    // (read, piece) of each member read in the batch, in the batch's order.
    let mut owners: Vec<(usize, Piece, ChunkAddr)> = Vec::new();
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    for (i, ((_, buf), plan)) in reads.iter_mut().zip(&plans).enumerate() {
        let Some(plan) = plan else { continue };
        for ((piece, addr), out) in plan
            .iter()
            .zip(piece_slices(buf, plan.iter().map(|(p, _)| p)))
        {
            reqs.push(IoReq::read(
                addr.member,
                array.member_offset(addr.row, piece.lo),
                out,
            ));
            owners.push((i, *piece, *addr));
        }
    }
    let failures = array.submit_tolerant(reqs);
    for failure in failures {
        let (i, piece, addr) = owners[failure.index];
        if results[i].is_err() {
            continue;
        }
        let buf = &mut *reads[i].1;
        results[i] = if array.geometry.level.has_parity() {
            reconstruct(array, &[piece], buf, bit(addr.member), 0)
        } else {
            read_other_copy(
                array,
                &piece,
                addr,
                &mut buf[piece.buf_at..piece.buf_at + piece.len()],
            )
        };
    }
    for ((offset_bytes, buf), (plan, result)) in
        reads.iter_mut().zip(plans.iter().zip(&mut results))
    {
        if plan.is_none() {
            *result = read(array, *offset_bytes, buf);
        }
    }
    results
}

/// The member reads that serve a read of `buf.len()` bytes at `offset_bytes` straight into `buf`, when there are
/// such (`read_many`): every piece on an active member that is not the slow one, whole pages at a page-aligned place
/// of `buf`. None otherwise, and for an empty read.
fn direct_plan(array: &Array, offset_bytes: u64, buf: &[u8]) -> Option<Vec<(Piece, ChunkAddr)>> {
    if buf.is_empty() {
        return None;
    }
    let buf_addr = buf.as_ptr() as u64;
    pieces(array.geometry.chunk_bytes, offset_bytes, buf.len() as u64)
        .map(|piece| {
            let in_place = piece.aligned() == (piece.lo, piece.hi)
                && (buf_addr + piece.buf_at as u64).is_multiple_of(PAGE_BYTES);
            let addr = array.readable_copy(piece.chunk)?;
            // A piece on the slow member (or one returning from it) takes `read`'s way, which decides whether it
            // is steered or probes it (or is of its share): deciding here too would count each such read twice.
            let decided_by_read = array.slow_slot() == Some(addr.member)
                || array.returning_slot() == Some(addr.member);
            (in_place && !decided_by_read).then_some((piece, addr))
        })
        .collect()
}

/// Moves to `rebuild` the pieces of `direct` that a reconstruction reads anyway: those of a stripe with a piece
/// to rebuild, within the pages it rebuilds (it reads every present chunk of the stripe over them). A degraded
/// sequential read read such stripes twice, once for its direct pieces and once to solve the missing one.
/// Keeps `rebuild` in buffer order.
fn absorb_into_rebuilds(k: u64, direct: &mut Vec<(Piece, ChunkAddr)>, rebuild: &mut Vec<Piece>) {
    // Per stripe with pieces to rebuild: the hull of their pages (the window's stripes are few).
    let mut hulls: Vec<(u64, u64, u64)> = Vec::new();
    for piece in rebuild.iter() {
        let stripe = piece.chunk / k;
        let (lo, hi) = piece.aligned();
        match hulls.iter_mut().find(|h| h.0 == stripe) {
            Some(hull) => *hull = (stripe, hull.1.min(lo), hull.2.max(hi)),
            None => hulls.push((stripe, lo, hi)),
        }
    }
    let before = rebuild.len();
    direct.retain(|(piece, _)| {
        let (lo, hi) = piece.aligned();
        let covered = hulls
            .iter()
            .any(|&(stripe, h_lo, h_hi)| stripe == piece.chunk / k && h_lo <= lo && hi <= h_hi);
        if covered {
            rebuild.push(*piece);
        }
        !covered
    });
    if rebuild.len() > before {
        rebuild.sort_by_key(|piece| piece.buf_at);
    }
}

/// Each piece's bytes in `buf` as a slice of its own (pieces in buffer order, apart).
fn piece_slices<'b, 'p>(
    buf: &'b mut [u8],
    pieces: impl Iterator<Item = &'p Piece>,
) -> Vec<&'b mut [u8]> {
    let mut rest: &mut [u8] = buf;
    let mut rest_at = 0usize;
    let mut slices = Vec::new();
    for piece in pieces {
        debug_assert!(piece.buf_at >= rest_at, "pieces come in buffer order");
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(piece.buf_at - rest_at);
        let (out, tail) = tail.split_at_mut(piece.len());
        rest = tail;
        rest_at = piece.buf_at + piece.len();
        slices.push(out);
    }
    slices
}

/// Reads pieces from the members holding them, all in one batch. A piece whose bytes are whole pages at a
/// page-aligned place of `buf` is read straight into it; the others through scratch pages. Returns the pieces
/// whose read failed (after its retry), for the caller to serve another way.
fn read_direct(
    array: &Array,
    direct: &[(Piece, ChunkAddr)],
    buf: &mut [u8],
    window_bytes: usize,
) -> Result<Vec<(Piece, ChunkAddr)>, EngineError> {
    if direct.is_empty() {
        return Ok(Vec::new());
    }
    let buf_addr = buf.as_ptr() as u64;
    let in_place = |piece: &Piece| {
        piece.aligned() == (piece.lo, piece.hi)
            && (buf_addr + piece.buf_at as u64).is_multiple_of(PAGE_BYTES)
    };
    let bounce_bytes: usize = direct
        .iter()
        .filter(|(piece, _)| !in_place(piece))
        .map(|(piece, _)| {
            let (lo, hi) = piece.aligned();
            (hi - lo) as usize
        })
        .sum();
    debug_assert!(bounce_bytes <= window_bytes);
    with_scratch(bounce_bytes, |scratch| {
        let mut carver = Carver::new(scratch);
        // Per piece: where its member read lands, and where that must be copied to when it is scratch.
        let outs = piece_slices(buf, direct.iter().map(|(piece, _)| piece));
        let mut landing: Vec<(&mut [u8], Option<&mut [u8]>)> = Vec::with_capacity(direct.len());
        for ((piece, _), out) in direct.iter().zip(outs) {
            if in_place(piece) {
                landing.push((out, None));
            } else {
                let (lo, hi) = piece.aligned();
                landing.push((carver.take((hi - lo) as usize), Some(out)));
            }
        }
        let reqs: Vec<IoReq<'_>> = direct
            .iter()
            .zip(landing.iter_mut())
            .map(|((piece, addr), (into, _))| {
                IoReq::read(
                    addr.member,
                    array.member_offset(addr.row, piece.aligned().0),
                    into,
                )
            })
            .collect();
        let failures: Vec<Failure> = array.submit_tolerant(reqs);
        let mut failed = Vec::with_capacity(failures.len());
        for (i, ((piece, addr), (into, out))) in direct.iter().zip(landing).enumerate() {
            if failures.iter().any(|f| f.index == i) {
                failed.push((*piece, *addr));
                continue;
            }
            if let Some(out) = out {
                let skip = (piece.lo - piece.aligned().0) as usize;
                out.copy_from_slice(&into[skip..skip + piece.len()]);
            }
        }
        Ok(failed)
    })
}

/// How a read of a piece on the slow member can be served around it (slow.rs says which may be).
enum Around {
    /// From this other copy (RAID1/10).
    Copy(ChunkAddr),
    /// Solved from the rest of its stripe and checked against both parities (RAID6).
    Solve,
}

/// Whether, and how, the piece `addr` holds can be read without its member: another active copy, or a RAID6
/// stripe whose other members are all active (one erasure, checked by the second parity) and whose parity is
/// known to match its data (no resync pending). Otherwise the read goes to the slow member.
fn around(array: &Array, piece: &Piece, addr: ChunkAddr) -> Option<Around> {
    let g = &array.geometry;
    match g.level {
        Level::Raid1 | Level::Raid10 => {
            if array.integrity.awaits_resync(piece.chunk) {
                return None; // until the resync, reads keep to the copy it copies from
            }
            (0..g.copies())
                .map(|copy| g.chunk_copy(piece.chunk, copy))
                .find(|other| other.member != addr.member && array.is_active(other.member))
                .map(Around::Copy)
        }
        Level::Raid6 => {
            let stripe = piece.chunk / g.data_per_stripe() as u64;
            let chunks = g.data_per_stripe() + 2;
            let others_active = (0..chunks)
                .map(|i| g.stripe_member(stripe, i))
                .all(|member| member == addr.member || array.is_active(member));
            (others_active && !array.integrity.awaits_resync(stripe)).then_some(Around::Solve)
        }
        Level::Raid0 | Level::Raid5 => None,
    }
}

/// Serves `pieces` (of one RAID5/6 stripe, in buffer order) into `buf` by solving the stripe over the hull of
/// their pages from the other members (one read of each), leaving out inactive
/// members and those in `avoid` (reads failed there). Members left out for a failed read and still active get
/// the recovered pages written back. `steered` (RAID6) is the slow member left out for speed (read.rs `around`):
/// the piece solved without it is taken only if the whole stripe then checks out against P and Q, and it is read
/// from the slow member after all when it does not, or when another member's read fails; nothing is written back
/// to it.
fn reconstruct(
    array: &Array,
    pieces: &[Piece],
    buf: &mut [u8],
    mut avoid: u64,
    mut steered: u64,
) -> Result<(), EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe() as u64;
    let stripe = pieces[0].chunk / k;
    debug_assert!(pieces.iter().all(|p| p.chunk / k == stripe));
    let index_of = |piece: &Piece| (piece.chunk % k) as usize;
    let chunks = g.data_per_stripe() + g.level.parity_chunks();
    // Every piece's pages: the hull of their ranges in the chunk.
    let lo = pieces.iter().map(|p| p.aligned().0).min().expect("a piece");
    let hi = pieces.iter().map(|p| p.aligned().1).max().expect("a piece");
    let len = (hi - lo) as usize;
    if array.read_only && array.integrity.awaits_resync(stripe) {
        // Read-only after an unclean stop without the log, this stripe's parity may not match its data (nothing
        // made it consistent, and nothing is resynced): a chunk solved from it could be wrong, and a wrong byte is
        // worse than an error. (With the log, its recovery ran into the overlay and no region awaits this.)
        return Err(EngineError::ChangeReadOnly {
            action: "solving a chunk of a stripe not resynced since an unclean stop",
        });
    }
    // A write to this stripe between our member reads would hand us a mix of old and new chunks.
    let _guard = array.locks.lock(stripe, 1);
    with_scratch(chunks * len, |scratch| {
        let mut carver = Carver::new(scratch);
        // A piece that spans all of `lo..hi` at a page-aligned place of `buf` is read (or solved) right there;
        // the others land in scratch and are copied out (`outs`).
        let buf_addr = buf.as_ptr() as u64;
        let mut landing: Vec<Option<&mut [u8]>> = (0..chunks).map(|_| None).collect();
        let mut outs: Vec<(&Piece, &mut [u8])> = Vec::with_capacity(pieces.len());
        for (piece, out) in pieces.iter().zip(piece_slices(buf, pieces.iter())) {
            if (piece.lo, piece.hi) == (lo, hi)
                && (buf_addr + piece.buf_at as u64).is_multiple_of(PAGE_BYTES)
            {
                landing[index_of(piece)] = Some(out);
            } else {
                outs.push((piece, out));
            }
        }
        let mut bufs: Vec<&mut [u8]> = landing
            .into_iter()
            .map(|at| match at {
                Some(out) => out,
                None => carver.take(len),
            })
            .collect();
        let copy_out = |outs: &mut [(&Piece, &mut [u8])], bufs: &[&mut [u8]]| {
            for (piece, out) in outs.iter_mut() {
                let skip = (piece.lo - lo) as usize;
                out.copy_from_slice(&bufs[index_of(piece)][skip..skip + piece.len()]);
            }
        };
        // Each round leaves out at least one more member, so this ends.
        loop {
            let missing: Vec<usize> = (0..chunks)
                .filter(|i| {
                    let member = g.stripe_member(stripe, *i);
                    !array.is_active(member) || (avoid | steered) & bit(member) != 0
                })
                .collect();
            if steered != 0 && missing.len() > 1 {
                // Something else is missing too: no second parity left to check with.
                steered = 0;
                continue;
            }
            // A piece's chunk is usually missing; if its member became active meanwhile (its rebuild ended), it
            // was read like the others: nothing to recover.
            let to_solve = pieces.iter().any(|p| missing.contains(&index_of(p)));
            if to_solve && missing.len() > g.level.parity_chunks() {
                return Err(EngineError::ReconstructStripe {
                    stripe,
                    source: paraid_parity::ParityError::TooManyMissing {
                        missing: missing.len(),
                        tolerated: g.level.parity_chunks(),
                    },
                });
            }
            let reqs: Vec<IoReq<'_>> = bufs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| !missing.contains(i))
                .map(|(i, b)| {
                    IoReq::read(
                        g.stripe_member(stripe, i),
                        array.member_offset(stripe, lo),
                        b,
                    )
                })
                .collect();
            let failures = array.submit_tolerant(reqs);
            if !failures.is_empty() {
                for f in failures {
                    avoid |= bit(f.slot);
                }
                continue;
            }
            if !to_solve {
                copy_out(&mut outs, &bufs);
                return Ok(());
            }
            array
                .parity
                .recover(&mut bufs, g.level == Level::Raid6, &missing)
                .map_err(|source| EngineError::ReconstructStripe { stripe, source })?;
            if steered != 0 {
                let all: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
                if array.parity.check(&all, true) != paraid_parity::CheckOutcome::Consistent {
                    // A chunk read (or the parity) does not agree: the slow member's own bytes, then.
                    log::info!(
                        "stripe {stripe}: a read served around the slow member did not check out against P \
                         and Q; read from the member itself"
                    );
                    steered = 0;
                    continue;
                }
                array.count_steered_read();
            }
            copy_out(&mut outs, &bufs);
            // Read-error correction: rewrite what could not be read, while we still hold the stripe (not when
            // served read-only).
            let fixes: Vec<IoReq<'_>> = missing
                .iter()
                .map(|&i| (i, g.stripe_member(stripe, i)))
                .filter(|_| !array.read_only)
                .filter(|&(_, member)| avoid & bit(member) != 0 && array.is_active(member))
                .map(|(i, member)| {
                    IoReq::write(member, array.member_offset(stripe, lo), &*bufs[i], false)
                })
                .collect();
            array.submit_tolerant(fixes);
            return Ok(());
        }
    })
}

/// Serves a RAID1/10 piece whose read failed on `failed` from another active copy, and writes it back to the
/// failed copy while that one is still active.
fn read_other_copy(
    array: &Array,
    piece: &Piece,
    failed: ChunkAddr,
    out: &mut [u8],
) -> Result<(), EngineError> {
    let g = array.geometry;
    if g.copies() < 2 {
        // RAID0: nothing else holds these bytes.
        return Err(EngineError::ReachMember {
            slot: failed.member,
            path: array.io.label(failed.member),
        });
    }
    let (lo, hi) = piece.aligned();
    let len = (hi - lo) as usize;
    // Hold the chunk so that a concurrent write cannot land between our read and the correcting rewrite.
    let _guard = array.locks.lock(piece.chunk, 1);
    let mut avoid = bit(failed.member);
    with_scratch(len, |b| loop {
        let Some(addr) = (0..g.copies())
            .map(|copy| g.chunk_copy(piece.chunk, copy))
            .find(|a| array.is_active(a.member) && avoid & bit(a.member) == 0)
        else {
            return Err(EngineError::ReachMember {
                slot: failed.member,
                path: array.io.label(failed.member),
            });
        };
        let reqs = vec![IoReq::read(
            addr.member,
            array.member_offset(addr.row, lo),
            &mut *b,
        )];
        if !array.submit_tolerant(reqs).is_empty() {
            avoid |= bit(addr.member);
            continue;
        }
        let skip = (piece.lo - lo) as usize;
        out.copy_from_slice(&b[skip..skip + piece.len()]);
        let fixes: Vec<IoReq<'_>> = (0..g.copies())
            .map(|copy| g.chunk_copy(piece.chunk, copy))
            .filter(|a| !array.read_only && avoid & bit(a.member) != 0 && array.is_active(a.member))
            .map(|a| IoReq::write(a.member, array.member_offset(a.row, lo), &*b, false))
            .collect();
        array.submit_tolerant(fixes);
        return Ok(());
    })
}

impl Array {
    /// An active member holding data chunk `chunk`, spreading mirror reads over the copies.
    pub(super) fn readable_copy(&self, chunk: u64) -> Option<ChunkAddr> {
        let g = &self.geometry;
        let copies = g.copies();
        // RAID1: rotate by chunk so sequential reads use every member. RAID10: alternate the copy by chunk, except
        // with a multiple of 4 members, where chunk parity lines up with member parity (half the members would
        // never be read): there alternate by row.
        let turn = if g.level == Level::Raid10 && g.members.is_multiple_of(4) {
            2 * chunk / g.members as u64
        } else {
            chunk
        };
        // Until a resync after an unclean stop has made the copies equal, read the one it copies from, so that
        // what a read returns stays (resync.rs).
        let first = if self.integrity.awaits_resync(chunk) {
            0
        } else {
            (turn % copies as u64) as usize
        };
        (0..copies)
            .map(|i| self.geometry.chunk_copy(chunk, (first + i) % copies))
            .find(|addr| self.is_active(addr.member))
    }
}
