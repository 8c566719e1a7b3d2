//! Members bound by their request rate: `RateMembers` wraps a member set so that each read or write occupies its
//! member for a fixed time after the requests queued there before it, as a drive at its IOPS limit serves one
//! request after another. Where `Fault::Delay` makes every batch take a time (members bound by their latency,
//! batches side by side), this makes requests wait for one another per member, so the array's extra requests
//! (a log record, a flush) cost what they cost a drive that is busy.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::member::{IoOp, IoReq, MemberIo};

/// A member set whose members each serve one request per `per_request` (module comment).
pub struct RateMembers<M> {
    inner: M,
    per_request: Duration,
    /// Flushes occupy their member too (a drive whose cache flush costs a request); off, they pass at once.
    flushes_count: bool,
    /// Per slot, when its member is free again.
    free_at: Vec<Mutex<Instant>>,
}

impl<M: MemberIo> RateMembers<M> {
    /// `inner`'s members, each serving one read or write per `per_request`.
    pub fn new(inner: M, per_request: Duration) -> RateMembers<M> {
        let free_at = (0..inner.slots())
            .map(|_| Mutex::new(Instant::now()))
            .collect();
        RateMembers {
            inner,
            per_request,
            flushes_count: false,
            free_at,
        }
    }

    /// Flushes occupy their member for `per_request` too.
    pub fn with_flushes_counted(mut self) -> RateMembers<M> {
        self.flushes_count = true;
        self
    }
}

impl<M: MemberIo> MemberIo for RateMembers<M> {
    crate::forward_member_io!(inner, holes);

    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        let now = Instant::now();
        let mut done = now;
        for req in reqs.iter() {
            let occupies = match req.op {
                IoOp::Read { .. } | IoOp::Write { .. } => true,
                IoOp::Flush => self.flushes_count,
                IoOp::Discard { .. } => false,
            };
            let Some(free_at) = self.free_at.get(req.slot).filter(|_| occupies) else {
                continue;
            };
            let mut free_at = free_at.lock().unwrap_or_else(|e| e.into_inner());
            *free_at = (*free_at).max(now) + self.per_request;
            done = done.max(*free_at);
        }
        let wait = done.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        self.inner.submit(reqs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemMembers;

    /// How long a batch of two 4 KiB reads takes, the first at `first` (slot, offset), the second at `second`.
    fn two_reads(members: &dyn MemberIo, first: (usize, u64), second: (usize, u64)) -> Duration {
        let (mut a, mut b) = (
            crate::buf::AlignedBuf::zeroed(4096),
            crate::buf::AlignedBuf::zeroed(4096),
        );
        let read = |(slot, offset_bytes): (usize, u64), buf| {
            IoReq::new(slot, IoOp::Read { offset_bytes, buf })
        };
        let mut reqs = [read(first, &mut a[..]), read(second, &mut b[..])];
        let started = Instant::now();
        members.submit(&mut reqs);
        assert!(reqs.iter().all(|r| r.result.is_ok()));
        started.elapsed()
    }

    #[test]
    fn requests_to_one_member_wait_for_one_another_and_members_serve_side_by_side() {
        let per_request = Duration::from_millis(20);
        let members = RateMembers::new(MemMembers::new(2, 1 << 20), per_request);
        // Two reads of one member: one after the other.
        let one_member = two_reads(&members, (0, 0), (0, 4096));
        assert!(one_member >= 2 * per_request, "{one_member:?}");
        // One read on each of two members: side by side.
        let two_members = two_reads(&members, (0, 0), (1, 0));
        assert!(two_members >= per_request, "{two_members:?}");
        assert!(
            two_members < one_member,
            "{two_members:?} against {one_member:?}"
        );
        // A flush passes at once unless flushes are counted.
        let started = Instant::now();
        members.submit(&mut [IoReq::flush(0)]);
        assert!(started.elapsed() < per_request);
        let counted = members.with_flushes_counted();
        let started = Instant::now();
        counted.submit(&mut [IoReq::flush(0)]);
        assert!(started.elapsed() >= per_request);
    }
}
