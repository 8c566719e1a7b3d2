//! A parity backend that disagrees with the reference: for differential tests (fault matrix row 14) and to prove
//! that the simulator's parity audit catches a wrong backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use paraid_parity::{Backend, CheckOutcome, ParityError};

/// Wraps a backend and, from its `nth` parity generation on (1-based, counting `gen_p`, `gen_pq` and `update`
/// calls, one per stripe of a batch), flips one bit of every `every`-th P it computes.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    nth: u64,
    every: u64,
    calls: AtomicU64,
    corrupted: AtomicU64,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn Backend>, nth: u64, every: u64) -> FaultyBackend {
        FaultyBackend {
            inner,
            nth: nth.max(1),
            every: every.max(1),
            calls: AtomicU64::new(0),
            corrupted: AtomicU64::new(0),
        }
    }

    /// Parity outputs corrupted so far.
    pub fn corrupted(&self) -> u64 {
        self.corrupted.load(Ordering::Relaxed)
    }

    fn maybe_corrupt(&self, p: &mut [u8]) {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if call >= self.nth && (call - self.nth).is_multiple_of(self.every) && !p.is_empty() {
            let at = (call as usize * 131) % p.len();
            p[at] ^= 0x10;
            self.corrupted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Backend for FaultyBackend {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        self.inner.gen_p(data, p);
        self.maybe_corrupt(p);
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        self.inner.gen_pq(data, p, q);
        self.maybe_corrupt(p);
    }

    fn update(&self, index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: Option<&mut [u8]>) {
        self.inner.update(index, old, new, p, q);
        self.maybe_corrupt(p);
    }

    fn recover(
        &self,
        chunks: &mut [&mut [u8]],
        has_q: bool,
        missing: &[usize],
    ) -> Result<(), ParityError> {
        self.inner.recover(chunks, has_q, missing)
    }

    fn check(&self, chunks: &[&[u8]], has_q: bool) -> CheckOutcome {
        self.inner.check(chunks, has_q)
    }
}
