//! Write-back's held writes, kept where a kill of paraid cannot take them.
//!
//! Why: write-back (write_back.rs) answers a small write once it holds it, before any member has it. A kill of
//! the process (kill -9, the OOM killer, a crash of paraid) took those writes with it, though nothing else a kill
//! does loses an answered write: the members' writes that completed sit in the kernel's cache or on the drives.
//! And a client does not see a kill the way it sees a power loss: a ublk device taken over by the next paraid, or
//! an NBD client that reconnects, goes on as if the writes were there, and the file system above never learns
//! that they are gone. Kept in shared memory as well (a file on /dev/shm), they outlive the process and die only
//! with the machine, as the page cache and a drive's volatile cache do; the next `serve` writes them before it
//! serves anything (`replay`).
//!
//! Fault model, and what survives it:
//! * A kill at any instant. A slot is filled data first, its header last (the magic word stored with release
//!   ordering after the rest), before the write is answered; it is cleared (magic zero) only once the write is in
//!   place, before its pages are let go. A slot with its magic and a matching checksum holds a write that was
//!   answered or about to be; one cut in the middle of filling has no magic and was never answered.
//! * A power loss, a reboot: /dev/shm is gone and the held writes with it, as the block device contract allows for
//!   writes no flush covered (a flush waits for every held write to be in place: write_back.rs).
//! * Held writes never overlap (write_back.rs) and none is cleared before it is in place, so writing them again in
//!   any order, over whatever part of them reached the members, leaves every page as it was answered.
//! * A store left behind by a serve after which the array was served again (on another machine, or here without
//!   looking at it): its writes are older than what the members hold. Every read-write start of an array writes a
//!   random serve nonce into each superblock it writes (`Superblock::serve_nonce`), and the store records its
//!   serve's: it is replayed only into the array it belongs to, found dirty at assembly with the newest superblock
//!   written by that same serve. Any other start drops it, with a warning. (A first version compared the events
//!   counter, refreshed at each held write taken and written: the simulator found a member evicted while a held
//!   write waited, its superblock update ahead of the store, and the held writes not written after the kill that
//!   followed, seeds 57500016, 57500307, 57500310, 57500319; a count refreshed after each superblock write still
//!   missed one torn by the kill. A count cannot tell a torn update of this serve from another serve's start.)
//!
//! Layout of the region: a header page (magic, array UUID, serve nonce, slots, bytes per slot), then per slot a header
//! page (magic, sequence number, array offset, length, CRC32C) and its data pages.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Array;
use crate::buf::round_up;
use crate::crc32c::crc32c;
use crate::error::EngineError;
use crate::layout::PAGE_BYTES;

const PAGE: usize = PAGE_BYTES as usize;
const REGION_MAGIC: u64 = u64::from_le_bytes(*b"PRDHELD1");
const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"PRDSLOT1");
// Region header fields (byte offsets).
const R_MAGIC: usize = 0;
const R_UUID: usize = 8;
const R_NONCE: usize = 24;
const R_SLOTS: usize = 32;
const R_SLOT_BYTES: usize = 40;
// Slot header fields.
const S_MAGIC: usize = 0;
const S_SEQ: usize = 8;
const S_OFFSET: usize = 16;
const S_LEN: usize = 24;
const S_CRC: usize = 32;

/// Bytes that outlive the process: a file mapped shared (`map_file`), or memory the simulator keeps across the
/// kills it plays (`in_memory`). Written through raw pointers: each slot is filled and cleared by the one thread
/// that holds its write (write_back.rs hands slots out under its lock), the header's words are atomics.
pub struct HeldRegion {
    ptr: *mut u8,
    len: usize,
    backing: Backing,
}

enum Backing {
    Mapped,
    Memory(#[allow(dead_code)] Box<[AtomicU64]>),
}

// SAFETY: the region is plain memory; concurrent access follows the slot discipline above, and every word two
// threads may touch at once is accessed as an atomic.
unsafe impl Send for HeldRegion {}
unsafe impl Sync for HeldRegion {}

impl Drop for HeldRegion {
    fn drop(&mut self) {
        if let Backing::Mapped = self.backing {
            // SAFETY: mapped in `map`, with this length, and not used after.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

impl HeldRegion {
    /// Zeroed memory of `len` bytes (rounded up to whole pages).
    pub fn in_memory(len: usize) -> HeldRegion {
        let len = round_up(len as u64, PAGE_BYTES) as usize;
        let words: Box<[AtomicU64]> = (0..len / 8).map(|_| AtomicU64::new(0)).collect();
        let ptr = words.as_ptr() as *mut u8;
        HeldRegion {
            ptr,
            len,
            backing: Backing::Memory(words),
        }
    }

    /// The file at `path`, made `len` bytes (whole pages) and zeroed, mapped shared.
    pub fn create_file(path: &Path, len: usize) -> io::Result<HeldRegion> {
        let len = round_up(len as u64, PAGE_BYTES) as usize;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode_0600()
            .open(path)?;
        file.set_len(len as u64)?;
        HeldRegion::map(&file, len)
    }

    /// The file at `path` as it is, mapped shared; None where there is none (or it is empty).
    pub fn open_file(path: &Path) -> io::Result<Option<HeldRegion>> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len() as usize;
        if len < PAGE {
            return Ok(None);
        }
        HeldRegion::map(&file, len - len % PAGE).map(Some)
    }

    fn map(file: &File, len: usize) -> io::Result<HeldRegion> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file we hold open for its length; unmapped on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(HeldRegion {
            ptr: ptr.cast(),
            len,
            backing: Backing::Mapped,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at.is_multiple_of(8) && at + 8 <= self.len);
        // SAFETY: in bounds and 8-aligned (the region starts on a page); AtomicU64 has u64's layout.
        unsafe { &*(self.ptr.add(at) as *const AtomicU64) }
    }

    /// Copies `bytes` in at `at` (a slot's data: only its holder writes there).
    fn put_bytes(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len);
        // SAFETY: in bounds; the slot discipline keeps other threads out of these bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) };
    }

    fn bytes(&self, at: usize, len: usize) -> Vec<u8> {
        assert!(at + len <= self.len);
        let mut out = vec![0u8; len];
        // SAFETY: in bounds; read while no slot is being filled (`leftover` runs before write-back starts).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), out.as_mut_ptr(), len) };
        out
    }
}

trait ModeExt {
    fn mode_0600(&mut self) -> &mut Self;
}

impl ModeExt for OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

/// A write found in a store (`leftover`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldWrite {
    pub seq: u64,
    pub offset_bytes: u64,
    pub data: Vec<u8>,
}

/// What a store held when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub uuid: [u8; 16],
    /// The serve nonce of the serve that held them (`Superblock::serve_nonce`).
    pub serve_nonce: u64,
    /// In the order they were taken.
    pub writes: Vec<HeldWrite>,
}

/// Write-back's held writes in a `HeldRegion` (module doc).
pub struct HeldStore {
    region: std::sync::Arc<HeldRegion>,
    slots: usize,
    slot_data_bytes: usize,
}

/// Bytes from one slot's start to the next: its header page and its data pages.
fn slot_stride(slot_data_bytes: usize) -> usize {
    PAGE + round_up(slot_data_bytes as u64, PAGE_BYTES) as usize
}

fn checksum(seq: u64, offset_bytes: u64, data: &[u8]) -> u32 {
    let mut head = [0u8; 20];
    head[..8].copy_from_slice(&seq.to_le_bytes());
    head[8..16].copy_from_slice(&offset_bytes.to_le_bytes());
    head[16..].copy_from_slice(&(data.len() as u32).to_le_bytes());
    crc32c(&head) ^ crc32c(data).rotate_left(1)
}

impl HeldStore {
    /// Bytes a region needs for `slots` writes of up to `slot_data_bytes` each.
    pub fn region_bytes(slots: usize, slot_data_bytes: usize) -> usize {
        PAGE + slots * slot_stride(slot_data_bytes)
    }

    /// A store for `array`'s held writes in `region`, emptied: every slot clear. The region must be
    /// `region_bytes(slots, slot_data_bytes)` long at least.
    pub fn format(
        region: std::sync::Arc<HeldRegion>,
        array: &Array,
        slots: usize,
        slot_data_bytes: usize,
    ) -> HeldStore {
        assert!(region.len() >= HeldStore::region_bytes(slots, slot_data_bytes));
        let store = HeldStore {
            region,
            slots,
            slot_data_bytes,
        };
        let r = &store.region;
        r.word(R_MAGIC).store(0, Ordering::SeqCst);
        for slot in 0..slots {
            r.word(store.slot_at(slot) + S_MAGIC)
                .store(0, Ordering::SeqCst);
        }
        r.put_bytes(R_UUID, &array.uuid().0);
        r.word(R_NONCE).store(array.serve_nonce(), Ordering::SeqCst);
        r.word(R_SLOTS).store(slots as u64, Ordering::SeqCst);
        r.word(R_SLOT_BYTES)
            .store(slot_data_bytes as u64, Ordering::SeqCst);
        r.word(R_MAGIC).store(REGION_MAGIC, Ordering::SeqCst);
        store
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn slot_data_bytes(&self) -> usize {
        self.slot_data_bytes
    }

    fn slot_at(&self, slot: usize) -> usize {
        PAGE + slot * slot_stride(self.slot_data_bytes)
    }

    /// Keeps a held write in `slot` (clear: the caller took it from the free ones): data, then header, the magic
    /// last. Returns once it would survive a kill.
    pub fn put(&self, slot: usize, seq: u64, offset_bytes: u64, data: &[u8]) {
        assert!(slot < self.slots && data.len() <= self.slot_data_bytes);
        let at = self.slot_at(slot);
        let r = &self.region;
        debug_assert_eq!(r.word(at + S_MAGIC).load(Ordering::Acquire), 0);
        r.put_bytes(at + PAGE, data);
        r.word(at + S_SEQ).store(seq, Ordering::Relaxed);
        r.word(at + S_OFFSET).store(offset_bytes, Ordering::Relaxed);
        r.word(at + S_LEN)
            .store(data.len() as u64, Ordering::Relaxed);
        r.word(at + S_CRC)
            .store(checksum(seq, offset_bytes, data) as u64, Ordering::Relaxed);
        r.word(at + S_MAGIC).store(SLOT_MAGIC, Ordering::Release);
    }

    /// The write in `slot` is in place: forget it.
    pub fn clear(&self, slot: usize) {
        self.region
            .word(self.slot_at(slot) + S_MAGIC)
            .store(0, Ordering::Release);
    }

    /// Writes held in `region` by the store that last used it (whatever its geometry), or None where the region
    /// holds no store.
    pub fn leftover(region: &HeldRegion) -> Option<Leftover> {
        if region.len() < PAGE || region.word(R_MAGIC).load(Ordering::Acquire) != REGION_MAGIC {
            return None;
        }
        let slots = region.word(R_SLOTS).load(Ordering::Acquire) as usize;
        let slot_data_bytes = region.word(R_SLOT_BYTES).load(Ordering::Acquire) as usize;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&region.bytes(R_UUID, 16));
        let serve_nonce = region.word(R_NONCE).load(Ordering::Acquire);
        let stride = slot_stride(slot_data_bytes);
        let mut writes = Vec::new();
        for slot in 0..slots {
            let at = PAGE + slot * stride;
            if at + stride > region.len() {
                break;
            }
            if region.word(at + S_MAGIC).load(Ordering::Acquire) != SLOT_MAGIC {
                continue;
            }
            let seq = region.word(at + S_SEQ).load(Ordering::Relaxed);
            let offset_bytes = region.word(at + S_OFFSET).load(Ordering::Relaxed);
            let len = region.word(at + S_LEN).load(Ordering::Relaxed) as usize;
            let crc = region.word(at + S_CRC).load(Ordering::Relaxed) as u32;
            if len > slot_data_bytes {
                continue;
            }
            let data = region.bytes(at + PAGE, len);
            if checksum(seq, offset_bytes, &data) != crc {
                continue;
            }
            writes.push(HeldWrite {
                seq,
                offset_bytes,
                data,
            });
        }
        writes.sort_by_key(|w| w.seq);
        Some(Leftover {
            uuid,
            serve_nonce,
            writes,
        })
    }
}

/// What `replay` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Held writes written into the array.
    pub written: usize,
    /// Held writes found but not written, and why (module doc).
    pub dropped: usize,
    pub why_dropped: Option<String>,
}

/// Writes what `region` holds for `array` (module doc) and flushes; call before anything else writes to or reads
/// from the array. The region is left as it was: the caller formats it anew (`HeldStore::format`) or removes it.
pub fn replay(array: &Array, region: &HeldRegion) -> Result<Replayed, EngineError> {
    let Some(left) = HeldStore::leftover(region) else {
        return Ok(Replayed::default());
    };
    if left.writes.is_empty() {
        return Ok(Replayed::default());
    }
    let found = array.found_at_assembly();
    let why_not = if left.uuid != array.uuid().0 {
        Some("they belong to another array".to_string())
    } else if !found.dirty {
        Some("the array was stopped cleanly since they were taken".to_string())
    } else if left.serve_nonce == 0 || left.serve_nonce != found.serve_nonce {
        Some(format!(
            "the array was served since they were taken (its newest superblock, events {}, is another serve's)",
            found.events
        ))
    } else {
        None
    };
    if let Some(why) = why_not {
        log::warn!(
            "write-back: {} writes held when paraid last stopped are not written: {why}",
            left.writes.len()
        );
        return Ok(Replayed {
            written: 0,
            dropped: left.writes.len(),
            why_dropped: Some(why),
        });
    }
    for w in &left.writes {
        array.write(w.offset_bytes, &w.data, false)?;
    }
    array.flush()?;
    log::info!(
        "write-back: wrote {} writes held when paraid was last killed",
        left.writes.len()
    );
    Ok(Replayed {
        written: left.writes.len(),
        dropped: 0,
        why_dropped: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region_with(slots: usize, slot_data_bytes: usize) -> HeldRegion {
        HeldRegion::in_memory(HeldStore::region_bytes(slots, slot_data_bytes))
    }

    #[test]
    fn a_slot_counts_once_whole_and_not_once_cleared() {
        let region = std::sync::Arc::new(region_with(3, 8192));
        let store = HeldStore {
            region: region.clone(),
            slots: 3,
            slot_data_bytes: 8192,
        };
        // As `format` does, without an array.
        region.word(R_SLOTS).store(3, Ordering::SeqCst);
        region.word(R_SLOT_BYTES).store(8192, Ordering::SeqCst);
        region.put_bytes(R_UUID, &[7u8; 16]);
        region.word(R_MAGIC).store(REGION_MAGIC, Ordering::SeqCst);
        region.word(R_NONCE).store(41, Ordering::SeqCst);
        store.put(2, 9, 4096, &[1u8; 8192]);
        store.put(0, 10, 65536, &[2u8; 512]);
        store.put(1, 8, 0, &[3u8; 4096]);
        store.clear(1);
        let left = HeldStore::leftover(&region).expect("a store");
        assert_eq!((left.uuid, left.serve_nonce), ([7u8; 16], 41));
        let seqs: Vec<u64> = left.writes.iter().map(|w| w.seq).collect();
        assert_eq!(
            seqs,
            vec![9, 10],
            "in the order taken; the cleared one gone"
        );
        assert_eq!(left.writes[0].offset_bytes, 4096);
        assert_eq!(left.writes[1].data, vec![2u8; 512]);
        // A slot whose data no longer matches its checksum (cut while being filled again) is not a write.
        region.put_bytes(store.slot_at(2) + PAGE + 100, &[9u8]);
        let left = HeldStore::leftover(&region).expect("a store");
        assert_eq!(left.writes.len(), 1);
        // No region magic: no store at all.
        region.word(R_MAGIC).store(0, Ordering::SeqCst);
        assert_eq!(HeldStore::leftover(&region), None);
    }

    #[test]
    fn a_file_region_keeps_its_bytes_after_it_is_unmapped() {
        let dir = std::env::temp_dir().join(format!("paraid-held-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.held");
        {
            let region = HeldRegion::create_file(&path, 3 * PAGE).unwrap();
            region.put_bytes(PAGE, b"kept");
            region.word(0).store(REGION_MAGIC, Ordering::SeqCst);
        }
        let region = HeldRegion::open_file(&path).unwrap().expect("the file");
        assert_eq!(region.len(), 3 * PAGE);
        assert_eq!(region.bytes(PAGE, 4), b"kept");
        assert_eq!(region.word(0).load(Ordering::SeqCst), REGION_MAGIC);
        assert!(HeldRegion::open_file(&dir.join("none")).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
