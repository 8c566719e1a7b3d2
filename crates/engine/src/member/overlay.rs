//! Members seen through an in-memory overlay: reads come from the members, patched with the pages written to the
//! overlay (page-aligned, as every member I/O); writes land in the overlay and never reach a member. An array
//! served read-only runs over one, so that what it must compute before it can serve (the partial parity log's
//! recovery of the stripes being written at a crash) is applied in memory: its reads then solve missing chunks
//! from consistent parity, exactly as a read-write start would, while the members stay byte for byte as they were.
//!
//! The overlay only grows by what recovery writes (the parity of the stripes the log's live records name, and
//! the log's ring headers): the read-only array refuses every other write before it gets here.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use super::{check_alignment, IoOp, IoReq, MemberIo, NewMember};
use crate::buf::AlignedBuf;
use crate::layout::PAGE_BYTES;

const PAGE: usize = PAGE_BYTES as usize;

pub struct OverlayMembers {
    inner: Arc<dyn MemberIo>,
    /// Pages written, by (slot, member page index).
    pages: Mutex<BTreeMap<(usize, u64), AlignedBuf>>,
}

impl OverlayMembers {
    pub fn new(inner: Arc<dyn MemberIo>) -> OverlayMembers {
        OverlayMembers {
            inner,
            pages: Mutex::new(BTreeMap::new()),
        }
    }

    /// Pages held in memory.
    pub fn pages_held(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(usize, u64), AlignedBuf>> {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies the overlay's pages over what was read from the member at `offset_bytes`.
    fn patch(&self, slot: usize, offset_bytes: u64, buf: &mut [u8]) {
        let end = offset_bytes + buf.len() as u64;
        let pages = self.lock();
        let first = offset_bytes / PAGE_BYTES;
        let last = end.div_ceil(PAGE_BYTES);
        for (&(_, page), bytes) in pages.range((slot, first)..(slot, last)) {
            let page_at = page * PAGE_BYTES;
            let from = page_at.max(offset_bytes);
            let to = (page_at + PAGE_BYTES).min(end);
            buf[(from - offset_bytes) as usize..(to - offset_bytes) as usize]
                .copy_from_slice(&bytes[(from - page_at) as usize..(to - page_at) as usize]);
        }
    }

    /// Stores `buf` at `offset_bytes` of `slot` in the overlay, page by page (both page-aligned, as every
    /// member I/O must be: `check_alignment`).
    fn store(&self, slot: usize, offset_bytes: u64, buf: &[u8]) {
        let mut pages = self.lock();
        for (i, bytes) in buf.chunks(PAGE).enumerate() {
            let mut page = AlignedBuf::zeroed(PAGE);
            page.copy_from_slice(bytes);
            pages.insert((slot, offset_bytes / PAGE_BYTES + i as u64), page);
        }
    }
}

impl MemberIo for OverlayMembers {
    crate::forward_member_io!(inner);

    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        // The reads go to the members in one batch (their ops lent out and put back); the rest stays here.
        let mut read_at: Vec<usize> = Vec::new();
        let mut inner_reqs: Vec<IoReq<'_>> = Vec::new();
        for (i, req) in reqs.iter_mut().enumerate() {
            if matches!(req.op, IoOp::Read { .. }) {
                let op = std::mem::replace(&mut req.op, IoOp::Flush);
                inner_reqs.push(IoReq::new(req.slot, op));
                read_at.push(i);
            }
        }
        self.inner.submit(&mut inner_reqs);
        for (req, i) in inner_reqs.into_iter().zip(read_at) {
            let IoReq {
                slot,
                mut op,
                result,
                latency_ns,
                timed,
            } = req;
            if result.is_ok() {
                if let IoOp::Read { offset_bytes, buf } = &mut op {
                    self.patch(slot, *offset_bytes, buf);
                }
            }
            reqs[i].op = op;
            reqs[i].result = result;
            reqs[i].latency_ns = latency_ns;
            reqs[i].timed = timed;
        }
        for req in reqs.iter_mut() {
            if matches!(req.op, IoOp::Read { .. }) {
                continue; // answered by the members above
            }
            if let Err(e) = check_alignment(&req.op) {
                req.result = Err(e);
                continue;
            }
            req.result = match &req.op {
                IoOp::Write {
                    offset_bytes, buf, ..
                } => {
                    self.store(req.slot, *offset_bytes, buf);
                    Ok(())
                }
                // Nothing here is volatile, and the members hold nothing of ours to flush.
                IoOp::Flush => Ok(()),
                IoOp::Discard {
                    offset_bytes,
                    len_bytes,
                } => {
                    self.store(req.slot, *offset_bytes, &vec![0u8; *len_bytes as usize]);
                    Ok(())
                }
                IoOp::Read { .. } => unreachable!("reads are answered by the members"),
            };
        }
    }

    fn hole_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        let hole = self.inner.hole_bytes(slot, offset_bytes, len_bytes);
        // A hole ends where the overlay holds a page.
        let first = offset_bytes / PAGE_BYTES;
        let last = (offset_bytes + hole).div_ceil(PAGE_BYTES);
        match self.lock().range((slot, first)..(slot, last)).next() {
            Some((&(_, page), _)) => (page * PAGE_BYTES).saturating_sub(offset_bytes).min(hole),
            None => hole,
        }
    }

    fn data_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        // Pages of the overlay hold data: a data run ends no earlier than the last one it reaches.
        let data = self.inner.data_bytes(slot, offset_bytes, len_bytes);
        let end = offset_bytes + len_bytes;
        let mut reach = offset_bytes + data;
        for (&(_, page), _) in self
            .lock()
            .range((slot, reach / PAGE_BYTES)..(slot, end.div_ceil(PAGE_BYTES)))
        {
            if page * PAGE_BYTES > reach {
                break;
            }
            reach = reach.max((page + 1) * PAGE_BYTES);
        }
        reach.min(end) - offset_bytes
    }

    fn attach(&self, _slot: usize, _member: &NewMember) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "members served read-only take no new member",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemMembers;

    fn member_bytes(io: &dyn MemberIo, slot: usize) -> Vec<u8> {
        let mut all = AlignedBuf::zeroed(io.size_bytes(slot) as usize);
        let mut reqs = [IoReq::read(slot, 0, &mut all)];
        io.submit(&mut reqs);
        let [req] = reqs;
        req.result.expect("read");
        all.to_vec()
    }

    /// Writes (whole pages, parts of pages, discards) read back through the overlay and never reach the members;
    /// flushes succeed; block status ends a member's hole where the overlay holds a page.
    #[test]
    fn writes_stay_in_memory_and_reads_see_them() {
        let inner = Arc::new(MemMembers::new(2, 16 * PAGE_BYTES));
        {
            let mut fill = AlignedBuf::zeroed(4 * PAGE);
            fill.fill(0x11);
            let mut reqs = [IoReq::write(1, 4 * PAGE_BYTES, &fill, false)];
            inner.submit(&mut reqs);
            let [req] = reqs;
            req.result.expect("fill");
        }
        let before = [
            member_bytes(inner.as_ref(), 0),
            member_bytes(inner.as_ref(), 1),
        ];
        let overlay = OverlayMembers::new(inner.clone());
        let mut page = AlignedBuf::zeroed(PAGE);
        page.fill(0xAB);
        let mut other = AlignedBuf::zeroed(PAGE);
        other.fill(0xCD);
        let mut reqs = vec![
            IoReq::write(0, PAGE_BYTES, &page, true),
            IoReq::write(1, 5 * PAGE_BYTES, &other, false),
            IoReq::discard(1, 6 * PAGE_BYTES, PAGE_BYTES),
            IoReq::flush(0),
        ];
        overlay.submit(&mut reqs);
        assert!(reqs.iter().all(|r| r.result.is_ok()));
        drop(reqs);
        assert_eq!(overlay.pages_held(), 3);

        let mut expect1 = before[1].clone();
        expect1[5 * PAGE..6 * PAGE].fill(0xCD);
        expect1[6 * PAGE..7 * PAGE].fill(0);
        let mut expect0 = before[0].clone();
        expect0[PAGE..2 * PAGE].fill(0xAB);
        assert!(
            member_bytes(&overlay, 0) == expect0,
            "slot 0 through the overlay"
        );
        assert!(
            member_bytes(&overlay, 1) == expect1,
            "slot 1 through the overlay"
        );
        // Reads around overlay pages, of both slots in one batch.
        let mut a = AlignedBuf::zeroed(3 * PAGE);
        let mut b = AlignedBuf::zeroed(2 * PAGE);
        let mut reqs = vec![
            IoReq::read(1, 4 * PAGE_BYTES, &mut a),
            IoReq::read(0, 0, &mut b),
        ];
        overlay.submit(&mut reqs);
        assert!(reqs.iter().all(|r| r.result.is_ok()));
        drop(reqs);
        assert!(a[..] == expect1[4 * PAGE..7 * PAGE]);
        assert!(b[..] == expect0[..2 * PAGE]);
        // Unaligned, as a member refuses it.
        let mut reqs = [IoReq::write(1, 10, &page, false)];
        overlay.submit(&mut reqs);
        let [req] = reqs;
        assert_eq!(req.result.unwrap_err().kind(), io::ErrorKind::InvalidInput);

        assert!(
            member_bytes(inner.as_ref(), 0) == before[0],
            "a write reached slot 0"
        );
        assert!(
            member_bytes(inner.as_ref(), 1) == before[1],
            "a write reached slot 1"
        );
        // Slot 0 is all hole below the data written at page 1 of the overlay.
        let hole = inner.hole_bytes(0, 0, 8 * PAGE_BYTES);
        assert_eq!(
            overlay.hole_bytes(0, 0, 8 * PAGE_BYTES),
            hole.min(PAGE_BYTES)
        );
    }
}
