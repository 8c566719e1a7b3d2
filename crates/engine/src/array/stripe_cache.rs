//! Stripe cache: what the write path last wrote to a stripe's chunks, kept so that the next read-modify-write of
//! the same pages reads nothing.
//!
//! A RAID5/6 read-modify-write of a few pages reads the old data, P and Q over them before it can compute the new
//! parity: three member reads (and on a drive, a whole device round trip) ahead of every small write. Databases
//! rewrite the same hot pages again and again, so the bytes those reads fetch are, most of the time, the bytes
//! the previous write of the same pages put there. md keeps them in its stripe cache for the same reason.
//!
//! What an entry means: the *logical* contents of stripe index `i` (data chunks `0..k`, then P and Q),
//! page by page, as the array last wrote them. Keyed by stripe and index rather than by member, an entry stays true
//! when the member holding the chunk fails or is rebuilt (the chunk's value lives on in the parity; a rebuild
//! writes the same value back), so membership changes need not touch the cache.
//!
//! Rules that keep every entry equal to what a read of the chunk would return:
//! * Only the RAID5/6 write path stores, under the window's stripe locks, once every in-place write of the window
//!   succeeded: the data pages a small write wrote and the parity over its range, what a read-modify-write of
//!   the same pages reads. Before the in-place writes are submitted the
//!   cache forgets the pages they cover, so a write that fails leaves nothing behind. Degraded stripes and long
//!   writes (streams: they read nothing and would only push hot pages out) store nothing.
//! * The write path plans with it: a read-modify-write whose old data and parity are all held reads nothing, so
//!   it wins over a reconstruct-write that would read the other chunks (and the other way round).
//! * Every other writer of the data area that changes what a chunk holds forgets the stripes first, under the
//!   same stripe locks: check and resync repairs (`begin_internal_write`), discard, and the log's recovery at
//!   assembly. Writers that put back the value a chunk already logically holds (a rebuild onto a new member, a
//!   read that writes a reconstructed block back over an unreadable one) leave entries alone.
//! * Consistency checks read the members themselves, never the cache: what they verify is the media.
//! * The cache lives in memory only; after a crash the array starts with an empty one.
//!
//! Off by default for arrays whose members all live in memory (tmpfs): there a member read is a page-cache copy,
//! as cheap as the cache's own, and the bookkeeping costs more than it saves (`default_stripe_cache_bytes`).
//!
//! Bounded by a byte budget split over shards (stripe number modulo the shard count); a shard over its budget
//! drops its least recently used stripes. While the cache serves almost none of the lookups (random writes over
//! far more than it holds) it keeps the pages of only one write in sixteen: storing costs a copy per page, and
//! the sample is enough to notice when rewrites begin.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::layout::PAGE_BYTES;

/// Environment variable that sizes the cache in MiB (0 turns it off): for measuring what it gains.
pub const STRIPE_CACHE_ENV: &str = "PARAID_STRIPE_CACHE_MIB";
/// Default budget: 64 MiB holds the data and parity pages of about 5,000 hot 4 KiB RAID6 writes of a 6-member
/// array; an administrator with a larger working set raises it.
pub const DEFAULT_STRIPE_CACHE_BYTES: usize = 64 << 20;

const SHARDS: usize = 16;

/// The budget the environment sets (`PARAID_STRIPE_CACHE_MIB`); None when unset or unreadable (the default
/// then applies: `default_stripe_cache_bytes`).
pub fn stripe_cache_bytes_from_env() -> Option<usize> {
    let v = std::env::var(STRIPE_CACHE_ENV).ok()?;
    match v.trim().parse::<usize>() {
        Ok(mib) => Some(mib.saturating_mul(1 << 20)),
        Err(_) => {
            log::warn!("{STRIPE_CACHE_ENV}={v:?} is not a number of MiB; using the default");
            None
        }
    }
}

/// The budget when none was asked for: `DEFAULT_STRIPE_CACHE_BYTES`, but none when every member lives in memory
/// (tmpfs, ramfs). The cache saves member reads; reading such a member is a copy from the page cache, as cheap as
/// the cache's own copy, and the cache's bookkeeping then costs 5-20 % of small random writes
/// (docs/benchmarks.md, "The stripe cache").
pub fn default_stripe_cache_bytes(members_in_memory: bool) -> usize {
    if members_in_memory {
        0
    } else {
        DEFAULT_STRIPE_CACHE_BYTES
    }
}

type Page = Box<[u8]>;

struct CachedStripe {
    /// By stripe index (data chunks, then P, then Q), then by page within the chunk.
    pages: Vec<Option<Page>>,
    /// Pages held.
    held: usize,
    /// Stamp of its latest use (matches its newest `Shard::order` item).
    used: u64,
}

#[derive(Default)]
struct Shard {
    stripes: HashMap<u64, CachedStripe>,
    /// (stripe, stamp) in order of use; an item whose stamp is no longer its stripe's `used` is stale.
    order: VecDeque<(u64, u64)>,
    next_stamp: u64,
    /// Pages held by all its stripes.
    held: usize,
    /// Pages of evicted and forgotten stripes, for the next stores (a full cache replaces pages all the time; an
    /// allocation and a free per page cost as much as the copy).
    spare: Vec<Page>,
}

/// Spare pages a shard keeps at most.
const SPARE_PAGES: usize = 256;

impl Shard {
    fn touch(&mut self, stripe: u64) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(entry) = self.stripes.get_mut(&stripe) {
            entry.used = stamp;
            self.order.push_back((stripe, stamp));
        }
        // Stale items accumulate with repeated use of the same stripes: drop them once they dominate.
        if self.order.len() > 4 * self.stripes.len() + 64 {
            let stripes = &self.stripes;
            self.order
                .retain(|(s, stamp)| stripes.get(s).is_some_and(|e| e.used == *stamp));
        }
    }

    fn remove(&mut self, stripe: u64, present: &[AtomicU32]) {
        if let Some(entry) = self.stripes.remove(&stripe) {
            present[presence_slot(stripe)].fetch_sub(1, Ordering::Relaxed);
            self.held -= entry.held;
            for page in entry.pages.into_iter().flatten() {
                self.recycle(page);
            }
        }
    }

    fn recycle(&mut self, page: Page) {
        if self.spare.len() < SPARE_PAGES {
            self.spare.push(page);
        }
    }

    fn evict_to(&mut self, budget_pages: usize, present: &[AtomicU32]) {
        while self.held > budget_pages {
            let Some((stripe, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.stripes.get(&stripe).is_some_and(|e| e.used == stamp) {
                self.remove(stripe, present);
            }
        }
    }
}

pub(crate) struct StripeCache {
    shards: Box<[Mutex<Shard>]>,
    shard_budget_pages: usize,
    /// Chunks per stripe (data and parity), and pages per chunk.
    width: usize,
    chunk_pages: usize,
    /// Per stripe number modulo `PRESENCE_SLOTS`: how many stripes the cache holds there. Zero means "none":
    /// the lookups of a write whose stripe the cache does not hold (random writes over far more than it
    /// holds: nearly all of them) end there, without a lock.
    present: Box<[AtomicU32]>,
    /// Counters and admission, per shard (one shared counter would bounce between cores on every lookup).
    counters: Box<[ShardCounters]>,
}

/// Slots of `StripeCache::present`.
const PRESENCE_SLOTS: usize = 1 << 16;

fn presence_slot(stripe: u64) -> usize {
    (stripe % PRESENCE_SLOTS as u64) as usize
}

#[derive(Default)]
#[repr(align(128))]
struct ShardCounters {
    /// Member reads the cache served, and those it could not.
    hits: AtomicU64,
    misses: AtomicU64,
    /// Admission: a window of the latest lookups (hits in the high half, lookups in the low half), and one
    /// write in how many whose pages are kept (`ADMIT_SPARSE` while the cache serves almost nothing).
    window: AtomicU64,
    admit_every: AtomicU64,
    admissions: AtomicU64,
}

/// Lookups per admission window, over all shards.
const WINDOW_LOOKUPS: u64 = 4096;
/// Lookups per admission window of one shard (each shard judges its own).
const SHARD_WINDOW_LOOKUPS: u64 = WINDOW_LOOKUPS / SHARDS as u64;
/// Below this share of hits in a window (1 in 32) the workload is not rewriting what the cache holds (random
/// writes over far more than it can hold): keeping every write's pages would cost a copy per page and evict
/// what little is hot, so only one write in `ADMIT_SPARSE` is kept, enough to notice when rewrites start.
const SPARSE_HIT_SHARE: u64 = 32;
const ADMIT_SPARSE: u64 = 16;

/// What the stripe cache holds and did since assembly (`Array::detail`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StripeCacheStats {
    pub budget_bytes: u64,
    pub held_bytes: u64,
    /// Reads of the write path served from the cache (one per chunk range: old data, P, Q, other data).
    pub hits: u64,
    /// Reads of the write path that went to the members.
    pub misses: u64,
}

/// Pages `bytes_at..bytes_at + len` of a chunk (both page-aligned: the write path reads and writes whole pages).
fn page_span(bytes_at: u64, len: usize) -> Range<usize> {
    debug_assert!(bytes_at.is_multiple_of(PAGE_BYTES) && (len as u64).is_multiple_of(PAGE_BYTES));
    let first = (bytes_at / PAGE_BYTES) as usize;
    first..first + len / PAGE_BYTES as usize
}

impl StripeCache {
    /// A cache of at most `budget_bytes` (0: off) for stripes of `width` chunks of `chunk_bytes`.
    pub(crate) fn new(budget_bytes: usize, width: usize, chunk_bytes: u64) -> StripeCache {
        StripeCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_budget_pages: budget_bytes / SHARDS / PAGE_BYTES as usize,
            width,
            chunk_pages: (chunk_bytes / PAGE_BYTES) as usize,
            present: (0..PRESENCE_SLOTS).map(|_| AtomicU32::new(0)).collect(),
            counters: (0..SHARDS)
                .map(|_| ShardCounters {
                    admit_every: AtomicU64::new(1),
                    ..ShardCounters::default()
                })
                .collect(),
        }
    }

    fn counters(&self, stripe: u64) -> &ShardCounters {
        &self.counters[(stripe % SHARDS as u64) as usize]
    }

    /// False when the cache certainly holds nothing of `stripe` (no lock taken). Entries of a stripe are made and
    /// dropped under its stripe lock, or dropped by eviction: a caller holding the lock sees every entry made.
    fn maybe_holds(&self, stripe: u64) -> bool {
        self.present[presence_slot(stripe)].load(Ordering::Relaxed) != 0
    }

    /// Counts a lookup in its shard's admission window; at the window's end, sets how many writes are kept.
    fn note_lookup(&self, stripe: u64, hit: bool) {
        let counters = self.counters(stripe);
        if hit {
            counters.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            counters.misses.fetch_add(1, Ordering::Relaxed);
        }
        let add = 1 + if hit { 1 << 32 } else { 0 };
        let window = counters.window.fetch_add(add, Ordering::Relaxed) + add;
        if window & 0xffff_ffff == SHARD_WINDOW_LOOKUPS {
            counters.window.store(0, Ordering::Relaxed);
            let hits = window >> 32;
            let every = if hits * SPARSE_HIT_SHARE < SHARD_WINDOW_LOOKUPS {
                ADMIT_SPARSE
            } else {
                1
            };
            counters.admit_every.store(every, Ordering::Relaxed);
        }
    }

    /// Whether the pages of a write to `stripe` are to be kept (see `SPARSE_HIT_SHARE`).
    pub(crate) fn admit(&self, stripe: u64) -> bool {
        let counters = self.counters(stripe);
        let every = counters.admit_every.load(Ordering::Relaxed);
        every == 1
            || counters
                .admissions
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(every)
    }

    pub(crate) fn enabled(&self) -> bool {
        self.shard_budget_pages > 0
    }

    fn shard(&self, stripe: u64) -> MutexGuard<'_, Shard> {
        self.shards[(stripe % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the cache holds stripe index `index`'s bytes `bytes_at..bytes_at + len` (for planning: the bytes
    /// may be gone by the time they are wanted, and are then read from the members).
    pub(crate) fn holds(&self, stripe: u64, index: usize, bytes_at: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        if !self.enabled() || !self.maybe_holds(stripe) {
            return false;
        }
        let span = page_span(bytes_at, len as usize);
        let at = index * self.chunk_pages;
        let shard = self.shard(stripe);
        shard.stripes.get(&stripe).is_some_and(|e| {
            e.pages[at + span.start..at + span.end]
                .iter()
                .all(Option::is_some)
        })
    }

    /// Copies stripe index `index`'s bytes at in-chunk offset `bytes_at` into `out` if the cache holds all of
    /// them; returns whether it did.
    pub(crate) fn fill(&self, stripe: u64, index: usize, bytes_at: u64, out: &mut [u8]) -> bool {
        if !self.enabled() || out.is_empty() {
            return false;
        }
        if !self.maybe_holds(stripe) {
            self.note_lookup(stripe, false);
            return false;
        }
        let span = page_span(bytes_at, out.len());
        let at = index * self.chunk_pages;
        let mut shard = self.shard(stripe);
        let hit = match shard.stripes.get(&stripe) {
            Some(entry) => {
                let pages = &entry.pages[at + span.start..at + span.end];
                let all = pages.iter().all(Option::is_some);
                if all {
                    for (dst, page) in out
                        .chunks_mut(PAGE_BYTES as usize)
                        .zip(pages.iter().flatten())
                    {
                        dst.copy_from_slice(page);
                    }
                }
                all
            }
            None => false,
        };
        if hit {
            shard.touch(stripe);
        }
        drop(shard);
        self.note_lookup(stripe, hit);
        hit
    }

    /// Records that stripe index `index` now holds `bytes` at in-chunk offset `bytes_at`.
    pub(crate) fn store(&self, stripe: u64, index: usize, bytes_at: u64, bytes: &[u8]) {
        if !self.enabled() || bytes.is_empty() {
            return;
        }
        let span = page_span(bytes_at, bytes.len());
        let at = index * self.chunk_pages;
        let slots = self.width * self.chunk_pages;
        let mut shard = self.shard(stripe);
        let Shard { stripes, spare, .. } = &mut *shard;
        let present = &self.present;
        let entry = stripes.entry(stripe).or_insert_with(|| {
            present[presence_slot(stripe)].fetch_add(1, Ordering::Relaxed);
            CachedStripe {
                pages: (0..slots).map(|_| None).collect(),
                held: 0,
                used: 0,
            }
        });
        let mut added = 0;
        for (slot, src) in entry.pages[at + span.start..at + span.end]
            .iter_mut()
            .zip(bytes.chunks(PAGE_BYTES as usize))
        {
            match slot {
                Some(page) => page.copy_from_slice(src),
                None => {
                    *slot = Some(match spare.pop() {
                        Some(mut page) => {
                            page.copy_from_slice(src);
                            page
                        }
                        None => src.into(),
                    });
                    added += 1;
                }
            }
        }
        entry.held += added;
        shard.held += added;
        shard.touch(stripe);
        shard.evict_to(self.shard_budget_pages, &self.present);
    }

    /// Drops what the cache holds of stripe index `index` over in-chunk bytes `range` (about to be written).
    pub(crate) fn forget_range(&self, stripe: u64, index: usize, range: Range<u64>) {
        if !self.enabled() || range.is_empty() || !self.maybe_holds(stripe) {
            return;
        }
        let span = page_span(range.start, (range.end - range.start) as usize);
        let at = index * self.chunk_pages;
        let mut shard = self.shard(stripe);
        let Shard {
            stripes,
            spare,
            held,
            ..
        } = &mut *shard;
        let Some(entry) = stripes.get_mut(&stripe) else {
            return;
        };
        for slot in &mut entry.pages[at + span.start..at + span.end] {
            if let Some(page) = slot.take() {
                entry.held -= 1;
                *held -= 1;
                if spare.len() < SPARE_PAGES {
                    spare.push(page);
                }
            }
        }
        if entry.held == 0 {
            shard.remove(stripe, &self.present);
        }
    }

    /// Drops everything held of stripes `first..first + count`.
    pub(crate) fn forget(&self, first: u64, count: u64) {
        if !self.enabled() {
            return;
        }
        if count <= 1024 {
            for stripe in first..first + count {
                if self.maybe_holds(stripe) {
                    self.shard(stripe).remove(stripe, &self.present);
                }
            }
            return;
        }
        let range: Range<u64> = first..first.saturating_add(count);
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let doomed: Vec<u64> = shard
                .stripes
                .keys()
                .copied()
                .filter(|s| range.contains(s))
                .collect();
            for stripe in doomed {
                shard.remove(stripe, &self.present);
            }
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).held)
            .sum::<usize>()
            * PAGE_BYTES as usize
    }

    pub(crate) fn stats(&self) -> StripeCacheStats {
        StripeCacheStats {
            budget_bytes: (self.shard_budget_pages * SHARDS) as u64 * PAGE_BYTES,
            held_bytes: self.bytes() as u64,
            hits: self
                .counters
                .iter()
                .map(|c| c.hits.load(Ordering::Relaxed))
                .sum(),
            misses: self
                .counters
                .iter()
                .map(|c| c.misses.load(Ordering::Relaxed))
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u64 = 64 << 10;

    fn page(v: u8) -> Vec<u8> {
        vec![v; 4096]
    }

    #[test]
    fn stored_pages_fill_reads_of_them_and_nothing_else() {
        let cache = StripeCache::new(1 << 20, 6, CHUNK);
        let mut two = page(1);
        two.extend(page(2));
        cache.store(7, 4, 8192, &two);
        let mut out = page(0);
        assert!(cache.holds(7, 4, 8192, 8192));
        assert!(!cache.holds(7, 4, 8192, 12288));
        assert!(cache.fill(7, 4, 12288, &mut out));
        assert_eq!(out, page(2));
        assert!(!cache.fill(7, 4, 4096, &mut out), "before them");
        let mut wide = vec![0u8; 8192];
        assert!(!cache.fill(7, 4, 12288, &mut wide), "past their end");
        assert!(!cache.fill(7, 5, 8192, &mut out), "another index");
        assert!(!cache.fill(8, 4, 8192, &mut out), "another stripe");
        cache.store(7, 4, 40960, &page(3)); // apart from the others: both kept
        assert!(cache.fill(7, 4, 8192, &mut out) && out == page(1));
        assert!(cache.fill(7, 4, 40960, &mut out) && out == page(3));
        cache.store(7, 4, 8192, &page(4)); // over a held page: replaced
        assert!(cache.fill(7, 4, 8192, &mut out) && out == page(4));
        assert_eq!(cache.bytes(), 3 * 4096);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses), (4, 4));
    }

    #[test]
    fn forget_range_drops_the_written_pages_only() {
        let cache = StripeCache::new(1 << 20, 2, CHUNK);
        let mut four = Vec::new();
        for v in 1..=4 {
            four.extend(page(v));
        }
        let mut out = page(0);
        cache.store(0, 0, 0, &four);
        cache.store(0, 1, 0, &page(9));
        cache.forget_range(0, 0, 4096..12288);
        assert!(cache.fill(0, 0, 0, &mut out) && out == page(1));
        assert!(cache.fill(0, 0, 12288, &mut out) && out == page(4));
        assert!(!cache.holds(0, 0, 4096, 4096) && !cache.holds(0, 0, 8192, 4096));
        assert!(
            cache.fill(0, 1, 0, &mut out) && out == page(9),
            "another index"
        );
        assert_eq!(cache.bytes(), 3 * 4096);
        cache.forget_range(0, 0, 0..CHUNK);
        cache.forget_range(0, 1, 0..4096);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn forget_drops_the_named_stripes_only() {
        let cache = StripeCache::new(64 << 20, 2, CHUNK);
        for stripe in 0..200 {
            cache.store(stripe, 1, 0, &page(stripe as u8));
        }
        cache.forget(10, 3);
        cache.forget(100, 90);
        cache.forget(1000, 5000); // the scan path
        let mut out = page(0);
        for stripe in 0..200u64 {
            let held = !(10..13).contains(&stripe) && !(100..190).contains(&stripe);
            assert_eq!(cache.fill(stripe, 1, 0, &mut out), held, "stripe {stripe}");
            if held {
                assert_eq!(out, page(stripe as u8));
            }
        }
        assert_eq!(cache.bytes(), (200 - 3 - 90) * 4096);
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_go_first() {
        // One shard's budget: 4 pages.
        let cache = StripeCache::new(SHARDS * 4 * 4096, 1, CHUNK);
        let stripes: Vec<u64> = (0..6).map(|i| i * SHARDS as u64).collect(); // all in shard 0
        for &s in &stripes[..4] {
            cache.store(s, 0, 0, &page(s as u8));
        }
        let mut out = page(0);
        assert!(cache.fill(stripes[0], 0, 0, &mut out)); // the oldest, used again
        cache.store(stripes[4], 0, 0, &page(9));
        cache.store(stripes[5], 0, 0, &page(9));
        assert!(cache.bytes() <= 4 * 4096);
        assert!(
            cache.fill(stripes[0], 0, 0, &mut out),
            "recently used: kept"
        );
        assert!(
            !cache.fill(stripes[1], 0, 0, &mut out),
            "least recently used: evicted"
        );
        assert!(
            !cache.fill(stripes[2], 0, 0, &mut out),
            "next least recently used: evicted"
        );
        assert!(cache.fill(stripes[5], 0, 0, &mut out));
        assert_eq!(out, page(9), "a recycled page holds what was stored in it");
        cache.forget_range(stripes[5], 0, 0..4096);
        cache.store(stripes[5], 0, 4096, &page(7));
        assert!(cache.fill(stripes[5], 0, 4096, &mut out) && out == page(7));
        assert!(!cache.holds(stripes[5], 0, 0, 4096));
    }

    #[test]
    fn admission_thins_out_while_nothing_is_rewritten_and_recovers_when_it_is() {
        let cache = StripeCache::new(64 << 20, 1, CHUNK);
        let mut out = page(0);
        assert!(
            (0..10).all(|_| cache.admit(5)),
            "every write is kept at first"
        );
        for stripe in 0..WINDOW_LOOKUPS {
            assert!(!cache.fill(1 << 20 | stripe, 0, 0, &mut out)); // random writes: every lookup misses
        }
        let kept = (0..160).filter(|_| cache.admit(5)).count();
        assert_eq!(kept, (160 / ADMIT_SPARSE) as usize);
        cache.store(5, 0, 0, &page(5));
        for _ in 0..SHARD_WINDOW_LOOKUPS {
            assert!(cache.fill(5, 0, 0, &mut out)); // rewrites of what is held
        }
        assert!((0..10).all(|_| cache.admit(5)), "every write is kept again");
        assert_eq!(cache.stats().hits, SHARD_WINDOW_LOOKUPS);
        assert_eq!(cache.stats().misses, WINDOW_LOOKUPS);
    }

    #[test]
    fn the_presence_count_follows_every_way_an_entry_goes() {
        let cache = StripeCache::new(SHARDS * 2 * 4096, 1, CHUNK); // two pages per shard
        let held = |stripe: u64| cache.maybe_holds(stripe);
        cache.store(3, 0, 0, &page(1));
        assert!(held(3) && !held(4));
        cache.forget_range(3, 0, 0..4096); // its last page: the entry goes
        assert!(!held(3));
        cache.store(3, 0, 0, &page(1));
        cache.forget(3, 1);
        assert!(!held(3));
        for i in 0..3 {
            cache.store(3 + i * SHARDS as u64, 0, 0, &page(1)); // the third evicts the first
        }
        assert!(!held(3) && held(3 + SHARDS as u64) && held(3 + 2 * SHARDS as u64));
        // Stripes that share a presence slot: one going leaves the other found.
        let twin = 3 + SHARDS as u64 + PRESENCE_SLOTS as u64;
        cache.store(twin, 0, 0, &page(2));
        cache.forget(3 + SHARDS as u64, 1);
        assert!(held(twin));
        assert!(cache.fill(twin, 0, 0, &mut page(0)));
    }

    #[test]
    fn a_zero_budget_holds_nothing() {
        let cache = StripeCache::new(0, 3, CHUNK);
        cache.store(0, 0, 0, &page(1));
        let mut out = page(0);
        assert!(!cache.fill(0, 0, 0, &mut out));
        assert_eq!(cache.bytes(), 0);
    }
}
