//! A running array: the read, write, flush and discard paths over `MemberIo`.

#[allow(dead_code)] // wired in step by step (issue 4)
mod bitmap;
mod discard;
mod read;
mod resync;
pub mod state;
mod write;

pub(crate) use resync::set_integrity_layout;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use state::Jobs;
pub use state::Progress;

use crate::buf::{round_down, round_up};
use crate::create::write_superblocks;
use crate::error::{EngineError, MemberOp};
use crate::layout::{Geometry, Layout, Level, PAGE_BYTES};
use crate::lock::StripeLocks;
use crate::member::{IoReq, MemberIo};
use crate::superblock::{now_unix, ArrayState, SlotState, Superblock};

/// A running array. Cheap handles to the same array are shared with its background jobs (rebuild, check):
/// the handle returned by `assemble` owns it, and dropping that one stops the jobs.
pub struct Array {
    core: Arc<ArrayCore>,
    /// The handle given to the caller (not a job's): dropping it ends the background jobs.
    owner: bool,
}

/// Everything a running array holds; `Array` dereferences to it.
#[doc(hidden)]
pub struct ArrayCore {
    io: Arc<dyn MemberIo>,
    geometry: Geometry,
    data_offset_bytes: u64,
    parity: Arc<dyn paraid_parity::Backend>,
    /// Per-slot state (`SlotState::code`); only `Active` slots take I/O.
    slot_states: Vec<AtomicU8>,
    /// The superblock contents kept on every member (events, state, slot table); updates are serialized here.
    meta: Mutex<Superblock>,
    locks: StripeLocks,
    jobs: Jobs,
}

impl std::ops::Deref for Array {
    type Target = ArrayCore;
    fn deref(&self) -> &ArrayCore {
        &self.core
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if self.owner {
            self.jobs.stop_all();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberDetail {
    pub slot: usize,
    pub path: String,
    pub state: SlotState,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArrayDetail {
    pub uuid: String,
    pub name: String,
    pub level: Level,
    pub layout: Layout,
    pub chunk_bytes: u64,
    pub size_bytes: u64,
    pub state: ArrayState,
    pub events: u64,
    pub members: Vec<MemberDetail>,
    pub parity_backend: String,
    /// Hot spares (their paths or labels).
    pub spares: Vec<String>,
    /// The running background job (rebuild, check, resync), if any.
    pub progress: Option<Progress>,
    /// Beyond tolerance: the array serves nothing any more.
    pub failed: bool,
    pub sync_speed_min_bytes_per_s: u64,
    pub sync_speed_max_bytes_per_s: u64,
}

/// Scratch bytes one window of a request may use; larger requests are cut into windows of whole pieces.
const WINDOW_BYTES: usize = 8 << 20;
/// Stripes one window may lock (well below the lock table size, so a window never waits on itself).
const WINDOW_STRIPES: u64 = 256;

/// The part of a request that falls in one data chunk: in-chunk bytes `lo..hi`, at `buf_at` in the caller's
/// buffer.
#[derive(Debug, Clone, Copy)]
struct Piece {
    chunk: u64,
    lo: u64,
    hi: u64,
    buf_at: usize,
}

impl Piece {
    /// The piece widened to whole pages (what member I/O can address).
    fn aligned(&self) -> (u64, u64) {
        (
            round_down(self.lo, PAGE_BYTES),
            round_up(self.hi, PAGE_BYTES),
        )
    }

    fn len(&self) -> usize {
        (self.hi - self.lo) as usize
    }
}

/// Cuts `offset_bytes..offset_bytes + len_bytes` at chunk boundaries.
fn pieces(chunk_bytes: u64, offset_bytes: u64, len_bytes: u64) -> impl Iterator<Item = Piece> {
    let end = offset_bytes + len_bytes;
    let mut at = offset_bytes;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let chunk = at / chunk_bytes;
        let lo = at % chunk_bytes;
        let hi = (end - chunk * chunk_bytes).min(chunk_bytes);
        let piece = Piece {
            chunk,
            lo,
            hi,
            buf_at: (at - offset_bytes) as usize,
        };
        at = chunk * chunk_bytes + hi;
        Some(piece)
    })
}

impl Array {
    /// Member byte offset of in-chunk byte `in_chunk` of `row`.
    fn member_offset(&self, row: u64, in_chunk: u64) -> u64 {
        debug_assert!(row < self.geometry.rows && in_chunk <= self.geometry.chunk_bytes);
        self.data_offset_bytes + row * self.geometry.chunk_bytes + in_chunk
    }

    /// Starts an array over `io` (slots in order) described by `newest`: marks present slots active and absent
    /// ones missing, and writes the dirty superblock (events + 1) to every present member.
    pub(crate) fn start(
        io: Arc<dyn MemberIo>,
        newest: Superblock,
        parity: Arc<dyn paraid_parity::Backend>,
    ) -> Result<Array, EngineError> {
        let geometry = newest.geometry();
        if newest.state == ArrayState::Dirty {
            log::warn!(
                "array {} was not stopped cleanly: stripes being written then may have stale parity \
                 (resync is not implemented in this version)",
                newest.uuid
            );
        }
        let mut meta = newest;
        let slot_states: Vec<AtomicU8> = (0..geometry.members)
            .map(|slot| {
                let state = if io.present(slot) {
                    SlotState::Active
                } else {
                    SlotState::Missing
                };
                meta.slots[slot].state = state;
                AtomicU8::new(state.code())
            })
            .collect();
        let array = Array {
            core: Arc::new(ArrayCore {
                io,
                geometry,
                data_offset_bytes: meta.data_offset_bytes,
                parity,
                slot_states,
                meta: Mutex::new(meta),
                locks: StripeLocks::new(),
                jobs: Jobs::new(),
            }),
            owner: true,
        };
        array.update_superblocks(ArrayState::Dirty)?;
        Ok(array)
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_bytes()
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn data_offset_bytes(&self) -> u64 {
        self.data_offset_bytes
    }

    /// The member I/O layer (for tests and tools that inspect members directly).
    pub fn members(&self) -> &Arc<dyn MemberIo> {
        &self.io
    }

    /// Reads `buf.len()` bytes at any byte offset.
    pub fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        self.check_range(offset_bytes, buf.len() as u64)?;
        read::read(self, offset_bytes, buf)
    }

    /// Writes `buf` at any byte offset; with `fua` the data is durable on return.
    pub fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        self.check_range(offset_bytes, buf.len() as u64)?;
        write::write(self, offset_bytes, buf, fua)
    }

    /// Makes every write acknowledged so far durable on every member.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        let reqs: Vec<IoReq<'_>> = self.active_slots().map(IoReq::flush).collect();
        self.run(reqs)
    }

    /// Deallocates a range; it reads back as zeros afterwards and parity stays right.
    pub fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        self.check_range(offset_bytes, len_bytes)?;
        discard::discard(self, offset_bytes, len_bytes, false)
    }

    /// Writes zeros over a range (deallocating whole stripes where members can).
    pub fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        self.check_range(offset_bytes, len_bytes)?;
        discard::discard(self, offset_bytes, len_bytes, fua)
    }

    pub fn detail(&self) -> ArrayDetail {
        let meta = self.lock_meta();
        ArrayDetail {
            uuid: meta.uuid.to_string(),
            name: meta.name.clone(),
            level: meta.level,
            layout: meta.layout,
            chunk_bytes: meta.chunk_bytes,
            size_bytes: self.size_bytes(),
            state: meta.state,
            events: meta.events,
            members: (0..self.geometry.members)
                .map(|slot| MemberDetail {
                    slot,
                    path: self.io.label(slot),
                    state: self.slot_state(slot),
                })
                .collect(),
            parity_backend: self.parity.name().to_string(),
            spares: Vec::new(),
            progress: self.progress(),
            failed: false,
            sync_speed_min_bytes_per_s: self.sync_speed().0,
            sync_speed_max_bytes_per_s: self.sync_speed().1,
        }
    }

    /// Another handle to this array, for a background job.
    fn handle(&self) -> Array {
        Array {
            core: self.core.clone(),
            owner: false,
        }
    }

    /// Flushes, then marks the array clean (events + 1) on every member.
    pub fn stop(self) -> Result<(), EngineError> {
        self.jobs.stop_all();
        self.flush()?;
        self.update_superblocks(ArrayState::Clean)
    }

    fn lock_meta(&self) -> std::sync::MutexGuard<'_, Superblock> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bumps the event counter, records `state` and the slot table, and writes the superblock to every active
    /// member durably.
    fn update_superblocks(&self, state: ArrayState) -> Result<(), EngineError> {
        let mut meta = self.lock_meta();
        meta.events += 1;
        meta.state = state;
        meta.updated_unix = now_unix();
        for slot in 0..self.geometry.members {
            meta.slots[slot].state = self.slot_state(slot);
        }
        let slots: Vec<usize> = self.active_slots().collect();
        write_superblocks(self.io.as_ref(), &meta, &slots)
    }

    pub fn slot_state(&self, slot: usize) -> SlotState {
        SlotState::from_code(self.slot_states[slot].load(Ordering::Acquire))
            .unwrap_or(SlotState::Faulty)
    }

    fn is_active(&self, slot: usize) -> bool {
        self.slot_states[slot].load(Ordering::Acquire) == SlotState::Active.code()
    }

    fn active_slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.geometry.members).filter(|s| self.is_active(*s))
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        let array_bytes = self.size_bytes();
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= array_bytes => Ok(()),
            _ => Err(EngineError::CheckRange {
                offset_bytes,
                len_bytes,
                array_bytes,
            }),
        }
    }

    /// Submits `reqs` as one batch (nothing when empty) and turns the first failure into an error.
    fn run(&self, mut reqs: Vec<IoReq<'_>>) -> Result<(), EngineError> {
        if reqs.is_empty() {
            return Ok(());
        }
        self.io.submit(&mut reqs);
        self.check_results(reqs)
    }

    /// Turns the first failed request into an error naming its member.
    fn check_results<'a>(
        &self,
        reqs: impl IntoIterator<Item = IoReq<'a>>,
    ) -> Result<(), EngineError> {
        for req in reqs {
            if let Err(source) = req.result {
                let op: MemberOp = req.op.kind();
                return Err(EngineError::AccessMember {
                    op,
                    slot: req.slot,
                    path: self.io.label(req.slot),
                    source,
                });
            }
        }
        Ok(())
    }
}

// The array is shared by every connection thread.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Array>();
};
