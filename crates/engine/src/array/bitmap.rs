//! Write-intent bitmap: one bit per region (a power-of-two number of stripes) saying "stripes here may be being
//! written: their parity may not match after a crash". Kept in memory and in the bitmap area of every active
//! member (docs/format.md, "Write-intent bitmap").
//!
//! * Before the first write into a clean region its bit is set and the bitmap page holding it written with FUA to
//!   every active member; the write waits for that only then (fast path: the bit is already set, no I/O).
//! * Bits are cleared lazily by a background tick: a region idle for `IDLE_CLEAR` with no write in flight, after a
//!   flush of every member that started after its last write. A lost clear only costs a needless resync.
//! * A clean stop clears every bit. After an unclean stop the set bits name the regions to resync.
//!
//! Setting races with clearing only through two SeqCst steps: a writer counts itself in flight, then looks at the
//! bit; the tick clears the bit, then looks at the in-flight count (and puts the bit back if a writer came). One of
//! the two always sees the other, so a writer never proceeds with its bit cleared on disk.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Array;
use crate::buf::{round_up, AlignedBuf};
use crate::error::EngineError;
use crate::layout::{Geometry, Level, PAGE_BYTES};
use crate::member::IoReq;
use crate::superblock::BITMAP_OFFSET_BYTES;

/// Array bytes one bit covers at most (md's default bitmap chunk is of this order).
const REGION_TARGET_BYTES: u64 = 64 << 20;
/// Small arrays get smaller regions, down to one stripe, so that at least this many regions exist.
const MIN_REGIONS: u64 = 64;
/// A region must have been idle this long before its bit is cleared.
pub(crate) const IDLE_CLEAR: Duration = Duration::from_secs(5);
/// Bits per bitmap page.
const PAGE_BITS: u64 = PAGE_BYTES * 8;
/// Smallest partial parity log ring worth keeping: its header page and a record of a few pages.
pub(crate) const MIN_PPL_BYTES: u64 = 16 * PAGE_BYTES;

/// Where the bitmap and the partial parity log live on each member, and what a bit covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntegrityLayout {
    pub bitmap_chunk_bytes: u64,
    pub bitmap_bytes: u64,
    pub ppl_offset_bytes: u64,
    pub ppl_bytes: u64,
}

/// The version 2 layout of the area between the superblock page pair and the data: the bitmap first (whole pages,
/// a bit per region), then for RAID5/6 the partial parity log ring in the rest. RAID0 has nothing to resync and
/// keeps neither.
pub(crate) fn integrity_layout(geometry: &Geometry, data_offset_bytes: u64) -> IntegrityLayout {
    let area_bytes = data_offset_bytes.saturating_sub(BITMAP_OFFSET_BYTES);
    if geometry.level == Level::Raid0 || area_bytes < PAGE_BYTES {
        return IntegrityLayout {
            bitmap_chunk_bytes: 0,
            bitmap_bytes: area_bytes,
            ppl_offset_bytes: 0,
            ppl_bytes: 0,
        };
    }
    let stripes = geometry.stripes();
    let stripe_bytes = geometry.stripe_bytes();
    let mut region_stripes = 1u64;
    while region_stripes * 2 * stripe_bytes <= REGION_TARGET_BYTES
        && stripes / (region_stripes * 2) >= MIN_REGIONS
    {
        region_stripes *= 2;
    }
    // The bitmap takes at most a quarter of the area (it needs far less for any real size).
    let bitmap_bytes =
        |region_stripes: u64| round_up(stripes.div_ceil(region_stripes).div_ceil(8), PAGE_BYTES);
    while bitmap_bytes(region_stripes) > (area_bytes / 4).max(PAGE_BYTES) {
        region_stripes *= 2;
    }
    let bitmap = bitmap_bytes(region_stripes);
    let ppl_offset_bytes = BITMAP_OFFSET_BYTES + bitmap;
    let ppl_bytes = data_offset_bytes.saturating_sub(ppl_offset_bytes) / PAGE_BYTES * PAGE_BYTES;
    let keep_ppl = geometry.level.has_parity() && ppl_bytes >= MIN_PPL_BYTES;
    IntegrityLayout {
        bitmap_chunk_bytes: region_stripes * stripe_bytes,
        bitmap_bytes: bitmap,
        ppl_offset_bytes: if keep_ppl { ppl_offset_bytes } else { 0 },
        ppl_bytes: if keep_ppl { ppl_bytes } else { 0 },
    }
}

/// The in-memory bitmap of a running array.
pub(crate) struct Bitmap {
    /// Stripes per region (a power of two).
    region_stripes: u64,
    regions: u64,
    /// Member byte offset of the bitmap area.
    offset_bytes: u64,
    /// Bits as they are on the members (set: the region may hold stripes being written).
    bits: Vec<AtomicU64>,
    /// Regions waiting for a resync after an unclean stop: their bits stay set until it is done.
    resync_pending: Vec<AtomicU64>,
    /// Writes in flight per region.
    inflight: Vec<AtomicU32>,
    /// When the last write of each region ended (ms since `epoch`).
    last_write_ms: Vec<AtomicU64>,
    /// Start (ms since `epoch`, + 1) of the last flush of every member that completed.
    flushed_ms: AtomicU64,
    /// How long a region must be idle before its bit is cleared (ms).
    idle_clear_ms: AtomicU64,
    epoch: Instant,
    /// Serializes bit changes that need I/O and the page writes that persist them.
    persist: Mutex<()>,
    /// Bitmap pages written (for tests and the report).
    pages_written: AtomicU64,
}

fn words(bits: u64) -> Vec<AtomicU64> {
    (0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect()
}

fn test_bit(words: &[AtomicU64], bit: u64) -> bool {
    words[(bit / 64) as usize].load(Ordering::SeqCst) & (1 << (bit % 64)) != 0
}

impl Bitmap {
    /// A bitmap with `bitmap_chunk_bytes` array bytes per bit, starting with the bits in `on_disk` (the union of
    /// the members' bitmap areas; regions beyond the array are ignored).
    pub(crate) fn new(
        geometry: &Geometry,
        bitmap_offset_bytes: u64,
        bitmap_chunk_bytes: u64,
        on_disk: &[u8],
    ) -> Bitmap {
        let region_stripes = bitmap_chunk_bytes / geometry.stripe_bytes();
        debug_assert!(region_stripes.is_power_of_two());
        let regions = geometry.stripes().div_ceil(region_stripes);
        let bitmap = Bitmap {
            region_stripes,
            regions,
            offset_bytes: bitmap_offset_bytes,
            bits: words(regions),
            resync_pending: words(regions),
            inflight: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            last_write_ms: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            flushed_ms: AtomicU64::new(0),
            idle_clear_ms: AtomicU64::new(IDLE_CLEAR.as_millis() as u64),
            epoch: Instant::now(),
            persist: Mutex::new(()),
            pages_written: AtomicU64::new(0),
        };
        bitmap.load(on_disk);
        bitmap
    }

    /// Sets the bits that `on_disk` (bitmap area bytes) has set.
    pub(crate) fn load(&self, on_disk: &[u8]) {
        for region in 0..self.regions {
            let byte = on_disk.get((region / 8) as usize).copied().unwrap_or(0);
            if byte & (1 << (region % 8)) != 0 {
                self.bits[(region / 64) as usize].fetch_or(1 << (region % 64), Ordering::SeqCst);
            }
        }
    }

    pub(crate) fn set_idle_clear(&self, idle: Duration) {
        self.idle_clear_ms
            .store(idle.as_millis() as u64, Ordering::SeqCst);
    }

    pub(crate) fn region_stripes(&self) -> u64 {
        self.region_stripes
    }

    pub(crate) fn regions(&self) -> u64 {
        self.regions
    }

    /// Regions whose bit is set.
    pub(crate) fn dirty_regions(&self) -> Vec<u64> {
        (0..self.regions)
            .filter(|r| test_bit(&self.bits, *r))
            .collect()
    }

    /// Whether `region` waits for a resync.
    pub(crate) fn resync_pending(&self, region: u64) -> bool {
        region < self.regions && test_bit(&self.resync_pending, region)
    }

    pub(crate) fn pages_written(&self) -> u64 {
        self.pages_written.load(Ordering::Relaxed)
    }

    /// Marks `regions` as waiting for a resync (their bits are kept until `resync_done`).
    pub(crate) fn set_resync_pending(&self, regions: &[u64]) {
        for &r in regions {
            self.resync_pending[(r / 64) as usize].fetch_or(1 << (r % 64), Ordering::SeqCst);
        }
    }

    pub(crate) fn resync_done(&self, region: u64) {
        self.resync_pending[(region / 64) as usize]
            .fetch_and(!(1 << (region % 64)), Ordering::SeqCst);
        // The resync wrote parity there just now: let the region idle before its bit goes.
        self.last_write_ms[region as usize].store(self.now_ms(), Ordering::SeqCst);
    }

    /// Whether any region in `regions` is marked written.
    pub(crate) fn any_set(&self, regions: std::ops::Range<u64>) -> bool {
        regions.into_iter().any(|r| test_bit(&self.bits, r))
    }

    pub(crate) fn any_resync_pending(&self) -> bool {
        self.resync_pending
            .iter()
            .any(|w| w.load(Ordering::SeqCst) != 0)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Regions holding stripes `first..first + count`.
    pub(crate) fn regions_of(&self, first_stripe: u64, stripes: u64) -> std::ops::Range<u64> {
        let last = (first_stripe + stripes.max(1) - 1).min(self.regions * self.region_stripes - 1);
        first_stripe / self.region_stripes..last / self.region_stripes + 1
    }

    /// Counts a write into `regions` in flight and makes sure their bits are set on every active member before it
    /// returns. The caller must call `end` with the same regions (also when this fails).
    pub(crate) fn begin(
        &self,
        array: &Array,
        regions: std::ops::Range<u64>,
    ) -> Result<(), EngineError> {
        let mut clean = false;
        for r in regions.clone() {
            self.inflight[r as usize].fetch_add(1, Ordering::SeqCst);
            clean |= !test_bit(&self.bits, r);
        }
        if !clean {
            return Ok(());
        }
        let _persist = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        // A bit another writer set while we waited was persisted under this lock already.
        let to_set: Vec<u64> = regions.filter(|r| !test_bit(&self.bits, *r)).collect();
        let mut pages: Vec<u64> = to_set.iter().map(|r| r / PAGE_BITS).collect();
        pages.dedup();
        self.write_pages(array, &pages, &to_set)?;
        // Only now may other writers take the fast path on these bits.
        for r in to_set {
            self.bits[(r / 64) as usize].fetch_or(1 << (r % 64), Ordering::SeqCst);
        }
        Ok(())
    }

    /// Ends a write counted by `begin`.
    pub(crate) fn end(&self, regions: std::ops::Range<u64>) {
        let now = self.now_ms();
        for r in regions {
            self.last_write_ms[r as usize].store(now, Ordering::SeqCst);
            let before = self.inflight[r as usize].fetch_sub(1, Ordering::SeqCst);
            debug_assert!(before > 0, "bitmap region {r}: end without begin");
        }
    }

    /// Called before a flush of every member starts; hand the value to `flushed` once it completed.
    pub(crate) fn flush_started(&self) -> u64 {
        self.now_ms()
    }

    pub(crate) fn flushed(&self, started_ms: u64) {
        self.flushed_ms.fetch_max(started_ms, Ordering::SeqCst);
    }

    /// Regions whose bits may be cleared now: set, no resync pending, nothing in flight, idle long enough.
    fn idle_regions(&self, now_ms: u64) -> Vec<u64> {
        let idle_ms = self.idle_clear_ms.load(Ordering::SeqCst);
        (0..self.regions)
            .filter(|&r| {
                test_bit(&self.bits, r)
                    && !test_bit(&self.resync_pending, r)
                    && self.inflight[r as usize].load(Ordering::SeqCst) == 0
                    && now_ms.saturating_sub(self.last_write_ms[r as usize].load(Ordering::SeqCst))
                        >= idle_ms
            })
            .collect()
    }

    /// The lazy clear (the background tick): flushes every member if a candidate region was written after the
    /// last flush, then clears the bits of idle regions and writes their pages. Returns the regions cleared.
    ///
    /// Only while every slot is active (md does the same): while one is not, the bits mark every region written
    /// since it left, so that the member, re-added, is rebuilt only there (`Superblock::bitmap_kept_since_events`,
    /// rebuild.rs). A member that leaves during a tick bumps the health epoch, and the tick then clears nothing:
    /// a clear needs a flush that the departed member took part in.
    pub(crate) fn tick(&self, array: &Array) -> Result<u64, EngineError> {
        let epoch = array.health.epoch.load(Ordering::SeqCst);
        if !array.all_in_sync() {
            return Ok(0);
        }
        let candidates = self.idle_regions(self.now_ms());
        if candidates.is_empty() {
            return Ok(0);
        }
        let newest_write = candidates
            .iter()
            .map(|&r| self.last_write_ms[r as usize].load(Ordering::SeqCst))
            .max()
            .unwrap_or(0);
        if self.flushed_ms.load(Ordering::SeqCst) <= newest_write {
            let started = self.flush_started();
            let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
            array.run(reqs)?;
            self.flushed(started);
        }
        let flushed_ms = self.flushed_ms.load(Ordering::SeqCst);
        let _persist = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        if array.health.epoch.load(Ordering::SeqCst) != epoch || !array.all_in_sync() {
            return Ok(0);
        }
        let mut pages: Vec<u64> = Vec::new();
        let mut cleared = 0;
        for r in candidates {
            if self.last_write_ms[r as usize].load(Ordering::SeqCst) >= flushed_ms {
                continue; // written again since the flush
            }
            let mask = 1u64 << (r % 64);
            let word = &self.bits[(r / 64) as usize];
            word.fetch_and(!mask, Ordering::SeqCst);
            if self.inflight[r as usize].load(Ordering::SeqCst) != 0 {
                // A writer arrived: it may already rely on the bit being set.
                word.fetch_or(mask, Ordering::SeqCst);
                continue;
            }
            cleared += 1;
            if pages.last() != Some(&(r / PAGE_BITS)) {
                pages.push(r / PAGE_BITS);
            }
        }
        self.write_pages(array, &pages, &[])?;
        Ok(cleared)
    }

    /// After `load` at assembly: writes every page holding a set bit to every member. The bits loaded are the
    /// union of the members' bitmaps, and a member may lack some (a power cut in the middle of setting a bit on
    /// all of them); writers then take the fast path on those bits, so without this a later crash with the member
    /// that had them missing would resync nothing there (sim seed 18930).
    pub(crate) fn persist_loaded(&self, array: &Array) -> Result<(), EngineError> {
        let _persist = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        let words_per_page = (PAGE_BITS / 64) as usize;
        let pages: Vec<u64> = self
            .bits
            .chunks(words_per_page)
            .enumerate()
            .filter(|(_, words)| words.iter().any(|w| w.load(Ordering::SeqCst) != 0))
            .map(|(page, _)| page as u64)
            .collect();
        self.write_pages(array, &pages, &[])
    }

    /// Clears every bit and writes the whole bitmap (a clean stop, after the final flush).
    pub(crate) fn clear_all(&self, array: &Array) -> Result<(), EngineError> {
        let _persist = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        for w in &self.bits {
            w.store(0, Ordering::SeqCst);
        }
        let pages: Vec<u64> = (0..self.regions.div_ceil(PAGE_BITS)).collect();
        self.write_pages(array, &pages, &[])
    }

    /// Writes the whole bitmap to `slot` (a member that joins: its bitmap area holds nothing of this array's
    /// life; the bits in memory may have been set long before).
    pub(crate) fn write_all_to(&self, array: &Array, slot: usize) -> Result<(), EngineError> {
        let _persist = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        let pages: Vec<u64> = (0..self.regions.div_ceil(PAGE_BITS)).collect();
        self.write_pages_to(array, &pages, &[], &[slot])
    }

    /// Writes bitmap pages `pages` (indices into the bitmap area) with FUA to every member that holds data
    /// (active members and rebuild targets): the bits in memory plus the regions in `also_set`.
    fn write_pages(
        &self,
        array: &Array,
        pages: &[u64],
        also_set: &[u64],
    ) -> Result<(), EngineError> {
        let slots: Vec<usize> = (0..array.io.slots().max(array.geometry.members))
            .filter(|&i| array.holds_data(i))
            .collect();
        self.write_pages_to(array, pages, also_set, &slots)
    }

    fn write_pages_to(
        &self,
        array: &Array,
        pages: &[u64],
        also_set: &[u64],
        slots: &[usize],
    ) -> Result<(), EngineError> {
        if pages.is_empty() {
            return Ok(());
        }
        let page_bytes = PAGE_BYTES as usize;
        let mut images = AlignedBuf::zeroed(pages.len() * page_bytes);
        for (image, &page) in images.chunks_mut(page_bytes).zip(pages) {
            let first_word = (page * PAGE_BITS / 64) as usize;
            for (i, bytes) in image.chunks_mut(8).enumerate() {
                if let Some(w) = self.bits.get(first_word + i) {
                    bytes.copy_from_slice(&w.load(Ordering::SeqCst).to_le_bytes());
                }
            }
            for &r in also_set.iter().filter(|r| *r / PAGE_BITS == page) {
                let bit = r % PAGE_BITS;
                image[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(slots.len() * pages.len());
        for &slot in slots {
            for (image, &page) in images.chunks(page_bytes).zip(pages) {
                reqs.push(IoReq::write(
                    slot,
                    self.offset_bytes + page * PAGE_BYTES,
                    image,
                    true,
                ));
            }
        }
        self.pages_written
            .fetch_add(reqs.len() as u64, Ordering::Relaxed);
        array.run(reqs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_regions_are_power_of_two_stripes_and_fit() {
        for (level, members, chunk, rows) in [
            (Level::Raid5, 4, 65536u64, 1u64 << 20),
            (Level::Raid6, 6, 4096, 100),
            (Level::Raid1, 2, 65536, 1 << 24),
            (Level::Raid10, 5, 524288, 1000),
            (Level::Raid5, 3, 4096, 6),
        ] {
            let g = Geometry::new(level, members, chunk, rows * chunk).expect("geometry");
            let data_offset = 4 << 20;
            let l = integrity_layout(&g, data_offset);
            let per_bit = l.bitmap_chunk_bytes / g.stripe_bytes();
            assert!(per_bit.is_power_of_two(), "{level} {l:?}");
            assert!(l.bitmap_chunk_bytes <= REGION_TARGET_BYTES.max(g.stripe_bytes()));
            assert!(l.bitmap_bytes * 8 >= g.stripes().div_ceil(per_bit));
            if level.has_parity() {
                assert_eq!(l.ppl_offset_bytes, BITMAP_OFFSET_BYTES + l.bitmap_bytes);
                assert_eq!(l.ppl_offset_bytes + l.ppl_bytes, data_offset);
            } else {
                assert_eq!((l.ppl_offset_bytes, l.ppl_bytes), (0, 0));
            }
        }
        // Small arrays get per-stripe bits; big ones 64 MiB per bit.
        let small = Geometry::new(Level::Raid5, 4, 4096, 6 * 4096).expect("geometry");
        assert_eq!(
            integrity_layout(&small, 4 << 20).bitmap_chunk_bytes,
            small.stripe_bytes()
        );
        let big = Geometry::new(Level::Raid6, 6, 65536, 1 << 40).expect("geometry");
        let per_bit = integrity_layout(&big, 4 << 20).bitmap_chunk_bytes;
        assert!(per_bit <= 64 << 20 && per_bit * 2 > 64 << 20, "{per_bit}");
        let none = Geometry::new(Level::Raid0, 3, 4096, 1 << 20).expect("geometry");
        assert_eq!(integrity_layout(&none, 4 << 20).bitmap_chunk_bytes, 0);
    }
}
