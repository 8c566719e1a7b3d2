//! Which parts of the array are allocated: holes that read as zeros without being stored, for
//! NBD_CMD_BLOCK_STATUS ("base:allocation"), so that a client copying the array (nbdcopy, qemu-img convert,
//! a backup) skips what was never written or was trimmed.
//!
//! A byte is reported as a hole only when the read path would return zero for it without doubt: every member cell
//! the read depends on is a hole of its member (`MemberIo::hole_bytes`). Those are the copies of its data chunk
//! on active members (RAID1/10: each copy still in; RAID0/5/6: the one), and, for a RAID5/6 chunk whose member is
//! missing or being rebuilt, every active member's cell of its row: the read solves the chunk from them, and zeros
//! solve to zeros (a copy of a degraded array, made before a second failure, skips the holes too). Anything else
//! is reported allocated, which is always true enough: a member that cannot tell (a block device), a member
//! between the check and a write racing with it (the reply describes the array at one moment; a client that
//! writes while it asks gets the answer NBD allows). A healthy array's parity is never consulted: reads of data
//! chunks go to the data members alone.

use super::{pieces, Array};
use crate::error::EngineError;
use crate::layout::PAGE_BYTES;

/// Pieces (array ranges inside one chunk) examined per call at most: an answer may cover less than asked
/// (NBD lets a server describe a prefix), and a dense terabyte would otherwise cost a system call per chunk.
const MAX_PIECES_PER_CALL: usize = 8192;

/// A run of array bytes with one allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationExtent {
    pub len_bytes: u64,
    /// A hole on every member holding it: reads as zeros, and nothing is stored.
    pub hole: bool,
}

/// What is known to be a hole on one member: `until` bytes from `from` (member offsets). Chunks of one member are
/// visited in increasing order, so one SEEK_DATA answers for every later chunk inside a long hole.
#[derive(Clone, Copy, Default)]
struct KnownHole {
    from: u64,
    until: u64,
}

impl Array {
    /// The allocation of `[offset_bytes, offset_bytes + len_bytes)` as extents in order from `offset_bytes`,
    /// adjacent extents of one state merged. They cover the range, or a prefix of it when it spans more than
    /// `MAX_PIECES_PER_CALL` chunks; never beyond it, and at least one byte when `len_bytes > 0`.
    pub fn allocation(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<AllocationExtent>, EngineError> {
        self.check_range(offset_bytes, len_bytes)?;
        // Members stay where they are while the answer is made (no replacement or spare takeover midway).
        let _shared = self.shared()?;
        let g = &self.geometry;
        let mut known = vec![KnownHole::default(); self.slots.len()];
        let mut extents: Vec<AllocationExtent> = Vec::new();
        let mut push = |len_bytes: u64, hole: bool| {
            if len_bytes == 0 {
                return;
            }
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.len_bytes += len_bytes,
                _ => extents.push(AllocationExtent { len_bytes, hole }),
            }
        };
        let mut cells: Vec<(usize, u64)> = Vec::with_capacity(g.members);
        for piece in pieces(g.chunk_bytes, offset_bytes, len_bytes).take(MAX_PIECES_PER_CALL) {
            let piece_bytes = piece.len() as u64;
            // The member cells a read of the piece depends on: each copy on an active member (RAID1/10 read any
            // of them; a copy out is not read); for a chunk whose member is out (RAID5/6), every active member's
            // cell of its row, which the read solves it from, and holes there solve to zeros.
            cells.clear();
            for copy in 0..g.copies() {
                let addr = g.chunk_copy(piece.chunk, copy);
                if self.is_active(addr.member) {
                    cells.push((addr.member, addr.row));
                } else if g.level.has_parity() {
                    cells.extend(
                        (0..g.members)
                            .filter(|&m| self.is_active(m))
                            .map(|m| (m, addr.row)),
                    );
                }
            }
            // Holes and data alternate inside the piece: a hole is where every cell is one (the shortest of
            // their holes from here); data runs to the furthest end of the cells' data runs, and the next turn
            // looks again (a cell that was a hole here may hold data further on).
            let piece_at = piece.chunk * g.chunk_bytes + piece.lo;
            let mut done = 0u64;
            while done < piece_bytes {
                let left = piece_bytes - done;
                let mut hole_bytes = if cells.is_empty() { 0 } else { left };
                for &(member, row) in &cells {
                    let member_at = self.member_offset(row, piece.lo + done);
                    hole_bytes = hole_bytes.min(self.member_hole_bytes(
                        &mut known[member],
                        member,
                        member_at,
                        left,
                    ));
                    if hole_bytes == 0 {
                        break;
                    }
                }
                // A hole that ends inside the piece ends at a page boundary of the array (the page it ends in
                // holds data), whatever page the piece starts in: the same bytes are described alike however
                // asked.
                let at = piece_at + done;
                if hole_bytes < left {
                    hole_bytes = ((at + hole_bytes) / PAGE_BYTES * PAGE_BYTES).saturating_sub(at);
                }
                if hole_bytes > 0 {
                    push(hole_bytes, true);
                    done += hole_bytes;
                    continue;
                }
                // Data from here, at least to the end of this page, and ending on a page boundary of the array.
                let mut data_bytes = 0;
                for &(member, row) in &cells {
                    let member_at = self.member_offset(row, piece.lo + done);
                    data_bytes = data_bytes.max(self.io.data_bytes(member, member_at, left));
                }
                if cells.is_empty() {
                    data_bytes = left;
                }
                let end = (at + data_bytes.max(1))
                    .next_multiple_of(PAGE_BYTES)
                    .min(at + left);
                push(end - at, false);
                done += end - at;
            }
        }
        debug_assert!(len_bytes == 0 || !extents.is_empty());
        debug_assert!(extents.iter().map(|e| e.len_bytes).sum::<u64>() <= len_bytes);
        Ok(extents)
    }

    /// `MemberIo::hole_bytes`, answered from what an earlier call on this member found where it can.
    fn member_hole_bytes(&self, known: &mut KnownHole, slot: usize, at: u64, len: u64) -> u64 {
        if at >= known.from && at < known.until {
            return (known.until - at).min(len);
        }
        // Ask for more than this piece, so that the answer covers the chunks of this member that follow.
        let ask = self.io.size_bytes(slot).saturating_sub(at);
        let hole = self.io.hole_bytes(slot, at, ask);
        *known = KnownHole {
            from: at,
            until: at + hole,
        };
        hole.min(len)
    }
}
