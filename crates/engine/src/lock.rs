//! Stripe lock table: writes (and reconstructing reads) of one stripe are serialized, different stripes run in
//! parallel. A fixed table of mutexes indexed by stripe number modulo its size: no global lock, no allocation
//! per stripe. A request locks every bucket it needs in ascending bucket order, so two requests can never wait
//! for each other in a cycle.

use std::sync::{Mutex, MutexGuard};

const BUCKETS: usize = 4096;

pub struct StripeLocks {
    buckets: Box<[Mutex<()>]>,
}

/// Held buckets; dropping it releases them.
pub struct StripeGuard<'a> {
    _held: Vec<MutexGuard<'a, ()>>,
}

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks {
            buckets: (0..BUCKETS).map(|_| Mutex::new(())).collect(),
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
        for i in low.chain(high) {
            held.push(self.buckets[i].lock().unwrap_or_else(|e| e.into_inner()));
        }
        StripeGuard { _held: held }
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
}
