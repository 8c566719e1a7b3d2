//! Stripe lock table: writes (and reconstructing reads) of one stripe are serialized, different stripes run in
//! parallel. A fixed table of mutexes indexed by stripe number modulo its size: no global lock, no allocation
//! per stripe. A request locks every bucket it needs in ascending bucket order, so two requests can never wait
//! for each other in a cycle.
//!
//! Waits are counted (`StripeLockStats`), and with them those of writes queued on a busy stripe (array/gather.rs:
//! one per queue, its leader's): a RAID5/6 small write holds its stripe through its reads, its log round
//! and its in-place writes, so writes into one stripe queue behind one another, and on a busy machine a holder
//! that loses its core holds everyone behind it. Only a wait pays for the counting (a clock read and three
//! atomic adds); an uncontended lock costs a `try_lock` as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

const BUCKETS: usize = 4096;
/// A wait at least this long is counted among the long ones.
const LONG_WAIT_US: u64 = 1000;

pub struct StripeLocks {
    buckets: Box<[Mutex<()>]>,
    waits: AtomicU64,
    wait_us: AtomicU64,
    long_waits: AtomicU64,
}

/// Requests that found a stripe they needed held by another, since assembly: how often writes (and
/// reconstructing reads, rebuild and check batches) queue behind one another in a stripe, and for how long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StripeLockStats {
    /// Lock requests that had to wait (one per request, however many of its stripes were held).
    pub waits: u64,
    /// Their waiting time summed, in microseconds.
    pub wait_us: u64,
    /// Those that waited 1 ms or longer.
    pub long_waits: u64,
}

/// Held buckets; dropping it releases them.
pub struct StripeGuard<'a> {
    _held: Vec<MutexGuard<'a, ()>>,
}

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks {
            buckets: (0..BUCKETS).map(|_| Mutex::new(())).collect(),
            waits: AtomicU64::new(0),
            wait_us: AtomicU64::new(0),
            long_waits: AtomicU64::new(0),
        }
    }

    /// The waits counted since the table was made.
    pub fn stats(&self) -> StripeLockStats {
        StripeLockStats {
            waits: self.waits.load(Ordering::Relaxed),
            wait_us: self.wait_us.load(Ordering::Relaxed),
            long_waits: self.long_waits.load(Ordering::Relaxed),
        }
    }

    /// Locks stripes `first..first + count`.
    pub fn lock(&self, first: u64, count: u64) -> StripeGuard<'_> {
        let count = count.min(BUCKETS as u64) as usize; // beyond that every bucket is held anyway
        let start = (first % BUCKETS as u64) as usize;
        // Consecutive stripes map to consecutive buckets, wrapping once at most: lock the low run first.
        let end = start + count;
        let mut held = Vec::with_capacity(count);
        let (low, high) = if end > BUCKETS {
            (0..end - BUCKETS, start..BUCKETS)
        } else {
            (0..0, start..end)
        };
        let mut waited_since: Option<Instant> = None;
        for i in low.chain(high) {
            let bucket = &self.buckets[i];
            let guard = match bucket.try_lock() {
                Ok(guard) => guard,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    waited_since.get_or_insert_with(Instant::now);
                    bucket.lock().unwrap_or_else(|e| e.into_inner())
                }
            };
            held.push(guard);
        }
        if let Some(since) = waited_since {
            self.count_wait(since);
        }
        StripeGuard { _held: held }
    }

    /// Counts a wait for a stripe that began at `since` and ends now: a lock request's, or that of a write queued on
    /// a busy stripe (array/gather.rs), which waits for the stripe outside this table.
    pub(crate) fn count_wait(&self, since: Instant) {
        let us = since.elapsed().as_micros() as u64;
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_us.fetch_add(us, Ordering::Relaxed);
        if us >= LONG_WAIT_US {
            self.long_waits.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn same_stripe_is_exclusive_and_wrapping_ranges_do_not_deadlock() {
        let locks = Arc::new(StripeLocks::new());
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let locks = locks.clone();
                let inside = inside.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        // Overlapping ranges that all hold bucket 0, most wrapping around the end of the table.
                        let first = (BUCKETS as u64 - 3) + (i + t) % 3;
                        let _g = locks.lock(first, 5);
                        assert_eq!(
                            inside.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two holders of bucket 0"
                        );
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
    }

    #[test]
    fn a_request_that_finds_its_stripe_held_is_counted_once_with_its_wait() {
        let locks = Arc::new(StripeLocks::new());
        let _free = locks.lock(10, 1);
        assert_eq!(locks.stats(), StripeLockStats::default(), "no one waited");
        let held = locks.lock(20, 2);
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || drop(locks.lock(19, 4)))
        };
        // The waiter needs stripes 20 and 21 (both held) and 19 and 22 (free): one wait, of at least the hold.
        std::thread::sleep(std::time::Duration::from_millis(30));
        drop(held);
        waiter.join().expect("waiter");
        let stats = locks.stats();
        assert_eq!((stats.waits, stats.long_waits), (1, 1), "{stats:?}");
        assert!(stats.wait_us >= 20_000, "{stats:?}");
    }
}
