//! The read path: direct reads of each piece from a member holding it, batched per window; pieces whose member
//! is missing are rebuilt from the rest of their stripe (RAID5/6) or read from another copy (RAID1/10).

use super::{pieces, Array, Piece, WINDOW_BYTES};
use crate::buf::{with_scratch, Carver};
use crate::error::EngineError;
use crate::layout::{ChunkAddr, Level};
use crate::member::IoReq;

pub(super) fn read(array: &Array, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
    let mut all = pieces(array.geometry.chunk_bytes, offset_bytes, buf.len() as u64).peekable();
    let mut direct: Vec<(Piece, ChunkAddr)> = Vec::new();
    let mut rebuild: Vec<Piece> = Vec::new();
    while all.peek().is_some() {
        direct.clear();
        rebuild.clear();
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
                    window_bytes += need;
                    direct.push((piece, addr));
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
        read_direct(array, &direct, buf, window_bytes)?;
        for piece in &rebuild {
            let out = &mut buf[piece.buf_at..piece.buf_at + piece.len()];
            reconstruct(array, piece, out)?;
        }
    }
    Ok(())
}

/// Reads pieces from the members holding them, all in one batch.
fn read_direct(
    array: &Array,
    direct: &[(Piece, ChunkAddr)],
    buf: &mut [u8],
    window_bytes: usize,
) -> Result<(), EngineError> {
    if direct.is_empty() {
        return Ok(());
    }
    with_scratch(window_bytes, |scratch| {
        let mut carver = Carver::new(scratch);
        let mut bounce: Vec<&mut [u8]> = direct
            .iter()
            .map(|(piece, _)| {
                let (lo, hi) = piece.aligned();
                carver.take((hi - lo) as usize)
            })
            .collect();
        let reqs: Vec<IoReq<'_>> = direct
            .iter()
            .zip(bounce.iter_mut())
            .map(|((piece, addr), b)| {
                IoReq::read(
                    addr.member,
                    array.member_offset(addr.row, piece.aligned().0),
                    b,
                )
            })
            .collect();
        array.run(reqs)?;
        for ((piece, _), b) in direct.iter().zip(bounce.iter()) {
            let skip = (piece.lo - piece.aligned().0) as usize;
            buf[piece.buf_at..piece.buf_at + piece.len()]
                .copy_from_slice(&b[skip..skip + piece.len()]);
        }
        Ok(())
    })
}

/// Rebuilds one piece of a missing RAID5/6 member from the same bytes of every other member of its stripe.
fn reconstruct(array: &Array, piece: &Piece, out: &mut [u8]) -> Result<(), EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe() as u64;
    let stripe = piece.chunk / k;
    let index = (piece.chunk % k) as usize;
    let chunks = g.data_per_stripe() + g.level.parity_chunks();
    let (lo, hi) = piece.aligned();
    let len = (hi - lo) as usize;
    // A write to this stripe between our member reads would hand us a mix of old and new chunks.
    let _guard = array.locks.lock(stripe, 1);
    with_scratch(chunks * len, |scratch| {
        let mut carver = Carver::new(scratch);
        let mut bufs: Vec<&mut [u8]> = (0..chunks).map(|_| carver.take(len)).collect();
        let mut missing: Vec<usize> = Vec::with_capacity(2);
        let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(chunks);
        for (i, b) in bufs.iter_mut().enumerate() {
            let member = g.stripe_member(stripe, i);
            if array.is_active(member) {
                reqs.push(IoReq::read(member, array.member_offset(stripe, lo), b));
            } else {
                missing.push(i);
            }
        }
        debug_assert!(missing.contains(&index));
        array.run(reqs)?;
        array
            .parity
            .recover(&mut bufs, g.level == Level::Raid6, &missing)
            .map_err(|source| EngineError::ReconstructStripe { stripe, source })?;
        let skip = (piece.lo - lo) as usize;
        out.copy_from_slice(&bufs[index][skip..skip + piece.len()]);
        Ok(())
    })
}

impl Array {
    /// An active member holding data chunk `chunk`, spreading mirror reads over the copies.
    pub(super) fn readable_copy(&self, chunk: u64) -> Option<ChunkAddr> {
        let copies = self.geometry.copies();
        // RAID1: rotate by chunk so sequential reads use every member; RAID10: chunk pairs alternate copies.
        let first = (chunk % copies as u64) as usize;
        (0..copies)
            .map(|i| self.geometry.chunk_copy(chunk, (first + i) % copies))
            .find(|addr| self.is_active(addr.member))
    }
}
