//! RAID0/1/10 writes: each piece widened to whole pages, its partial edge pages read from a copy, and every copy
//! written.

use super::*;

pub(super) fn write_copies(
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

pub(super) fn write_copies_window(
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
    if let Some(redo) = read_window(array, reqs) {
        return Ok(redo);
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
