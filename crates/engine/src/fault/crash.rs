//! A crash model: in-memory members with a volatile write cache each, and power loss.
//!
//! A write completes into the cache: reads see it at once, but it is *unflushed* until a later Flush of its member
//! completes, unless it was written with FUA (durable when it completes). `crash` decides for every unflushed
//! write whether the power loss kept it, dropped it, or tore it (some of its 4 KiB pages kept, others not: pages
//! are the atomic unit, as with NVMe's atomic write unit of one logical block), and returns the member images the
//! array would find after the power comes back. Discards are cached like writes of zeros.
//!
//! Power can also be cut in the middle of a batch (`cut_power_after_writes`): the first `n` member writes
//! complete, everything after fails with EIO and changes nothing, as if the machine died between two member
//! writes of one array request.

use std::io;
use std::sync::Mutex;

use super::rng::SplitMix64;
use crate::layout::PAGE_BYTES;
use crate::member::{
    check_alignment, image_range, member_missing, IoOp, IoReq, MemSlots, MemberIo, NewMember,
};

/// How `crash` treats each unflushed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPolicy {
    /// Each unflushed write independently: kept, dropped or torn (a third each); a torn write keeps each of its
    /// pages with probability one half.
    Random,
    /// Every completed write survives: the process died, the kernel still had every completed write.
    KeepAll,
    /// Every unflushed write is lost.
    DropAll,
}

/// The member images after a crash, and what the crash did.
#[derive(Debug, Clone, Default)]
pub struct CrashReport {
    pub images: Vec<Option<Vec<u8>>>,
    /// Unflushed writes (and discards) kept whole, dropped whole, and torn.
    pub writes_kept: u64,
    pub writes_dropped: u64,
    pub writes_torn: u64,
    /// Pages of unflushed writes that reached the medium, and pages lost.
    pub pages_kept: u64,
    pub pages_lost: u64,
}

/// One completed, unflushed write (or discard) of a member.
struct Pending {
    offset_bytes: u64,
    len_bytes: u64,
    /// None: a discard (zeros).
    data: Option<Vec<u8>>,
    /// Per page: whether a later FUA write has not superseded it (a superseded page cannot be written back over
    /// the newer, durable one).
    live: Vec<bool>,
}

struct Member {
    /// What reads see: the medium with the cache on top.
    current: Vec<u8>,
    /// What the medium holds durably.
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

impl Member {
    fn new(image: Vec<u8>) -> Member {
        Member {
            durable: image.clone(),
            current: image,
            pending: Vec::new(),
        }
    }

    /// Marks pages of earlier unflushed writes that `offset..offset+len` overwrote durably.
    fn supersede(&mut self, offset_bytes: u64, len_bytes: u64) {
        let end = offset_bytes + len_bytes;
        for p in &mut self.pending {
            let p_end = p.offset_bytes + p.len_bytes;
            if p.offset_bytes >= end || offset_bytes >= p_end {
                continue;
            }
            let lo = offset_bytes.max(p.offset_bytes);
            let hi = end.min(p_end);
            for page in (lo - p.offset_bytes) / PAGE_BYTES..(hi - p.offset_bytes) / PAGE_BYTES {
                p.live[page as usize] = false;
            }
        }
        self.pending.retain(|p| p.live.iter().any(|l| *l));
    }

    fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for p in pending {
            apply(&mut self.durable, &p, |page| p.live[page]);
        }
    }
}

/// Copies the pages of `p` for which `keep(page)` holds into `image`.
fn apply(image: &mut [u8], p: &Pending, mut keep: impl FnMut(usize) -> bool) -> (u64, u64) {
    let page_bytes = PAGE_BYTES as usize;
    let (mut kept, mut lost) = (0, 0);
    for page in 0..p.live.len() {
        if !p.live[page] {
            continue;
        }
        if !keep(page) {
            lost += 1;
            continue;
        }
        kept += 1;
        let at = p.offset_bytes as usize + page * page_bytes;
        let dst = &mut image[at..at + page_bytes];
        match &p.data {
            Some(data) => dst.copy_from_slice(&data[page * page_bytes..(page + 1) * page_bytes]),
            None => dst.fill(0),
        }
    }
    (kept, lost)
}

struct Power {
    on: bool,
    /// Member writes (and discards) still allowed before the power goes; None: no cut planned.
    writes_left: Option<u64>,
    /// Member writes and discards completed so far.
    writes_done: u64,
}

/// In-memory members with volatile write caches (see the module comment). Every slot up to `MAX_MEMBERS` exists,
/// so that spares and replacements can be attached beyond the members given at construction.
pub struct CrashMembers {
    members: MemSlots<Member>,
    power: Mutex<Power>,
}

fn power_lost() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl CrashMembers {
    /// `slots` zero-filled members of `size_bytes`, nothing cached.
    pub fn new(slots: usize, size_bytes: u64) -> CrashMembers {
        CrashMembers::from_images(
            (0..slots)
                .map(|_| Some(vec![0u8; size_bytes as usize]))
                .collect(),
        )
    }

    /// Members whose durable contents are `images` (None: missing), nothing cached.
    pub fn from_images(images: Vec<Option<Vec<u8>>>) -> CrashMembers {
        CrashMembers {
            members: MemSlots::new(images.into_iter().map(|i| i.map(Member::new)).collect()),
            power: Mutex::new(Power {
                on: true,
                writes_left: None,
                writes_done: 0,
            }),
        }
    }

    fn lock(&self, slot: usize) -> std::sync::MutexGuard<'_, Option<Member>> {
        self.members.lock(slot)
    }

    fn lock_power(&self) -> std::sync::MutexGuard<'_, Power> {
        self.power.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a read of the whole member sees now (None if missing).
    pub fn image(&self, slot: usize) -> Option<Vec<u8>> {
        self.lock(slot).as_ref().map(|m| m.current.clone())
    }

    /// What would survive if every unflushed write were lost.
    pub fn durable_image(&self, slot: usize) -> Option<Vec<u8>> {
        self.lock(slot).as_ref().map(|m| m.durable.clone())
    }

    /// Every member (of the slots in use) as reads see it now: a process that stops without a crash leaves this
    /// behind.
    pub fn images(&self) -> Vec<Option<Vec<u8>>> {
        (0..self.slots_in_use()).map(|s| self.image(s)).collect()
    }

    fn slots_in_use(&self) -> usize {
        self.members.slots_in_use()
    }

    /// Completed writes and discards not yet durable, over every member.
    pub fn unflushed_writes(&self) -> usize {
        (0..self.members.capacity())
            .map(|s| self.lock(s).as_ref().map_or(0, |m| m.pending.len()))
            .sum()
    }

    /// Member writes and discards completed since creation.
    pub fn writes_done(&self) -> u64 {
        self.lock_power().writes_done
    }

    /// Changes the medium directly, bypassing the cache (planting corruption).
    pub fn poke(&self, slot: usize, offset_bytes: u64, bytes: &[u8]) {
        let mut guard = self.lock(slot);
        let m = guard.as_mut().expect("poke into a missing member");
        let at = offset_bytes as usize;
        m.current[at..at + bytes.len()].copy_from_slice(bytes);
        m.durable[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Takes the member out (later I/O to it fails), returning what it held durably.
    pub fn remove(&self, slot: usize) -> Option<Vec<u8>> {
        self.lock(slot).take().map(|m| m.durable)
    }

    /// Lets `writes` more member writes (or discards) complete, then cuts the power: the next one and every
    /// I/O after it fail without effect.
    pub fn cut_power_after_writes(&self, writes: u64) {
        let mut power = self.lock_power();
        if writes == 0 {
            power.on = false;
        }
        power.writes_left = Some(writes);
    }

    /// Cuts the power now.
    pub fn cut_power(&self) {
        self.cut_power_after_writes(0);
    }

    pub fn power_on(&self) -> bool {
        self.lock_power().on
    }

    /// The member images after a crash now: every unflushed write kept, dropped or torn as `policy` says, the
    /// choices drawn from `seed`. Does not change the members (several crashes can be drawn from one state).
    pub fn crash(&self, seed: u64, policy: CrashPolicy) -> CrashReport {
        let mut rng = SplitMix64::derive(seed, 0xC4A5);
        let mut report = CrashReport::default();
        for slot in 0..self.slots_in_use() {
            let guard = self.lock(slot);
            let Some(m) = guard.as_ref() else {
                report.images.push(None);
                continue;
            };
            let mut image = m.durable.clone();
            for p in &m.pending {
                let choice = match policy {
                    CrashPolicy::KeepAll => 0,
                    CrashPolicy::DropAll => 1,
                    CrashPolicy::Random => rng.below(3),
                };
                let (kept, lost) = match choice {
                    0 => apply(&mut image, p, |_| true),
                    1 => apply(&mut image, p, |_| false),
                    _ => apply(&mut image, p, |_| rng.one_in(2)),
                };
                log::trace!(
                    "crash: slot {slot} unflushed {} at {}+{}: {kept} pages kept, {lost} lost",
                    if p.data.is_some() { "write" } else { "discard" },
                    p.offset_bytes,
                    p.len_bytes
                );
                match (kept, lost) {
                    (_, 0) => report.writes_kept += 1,
                    (0, _) => report.writes_dropped += 1,
                    _ => report.writes_torn += 1,
                }
                report.pages_kept += kept;
                report.pages_lost += lost;
            }
            report.images.push(Some(image));
        }
        report
    }

    /// Runs a write, flush or discard (alignment and slot already checked).
    fn run(&self, slot: usize, op: &IoOp<'_>) -> io::Result<()> {
        {
            let mut power = self.lock_power();
            if !power.on {
                return Err(power_lost());
            }
            if matches!(op, IoOp::Write { .. } | IoOp::Discard { .. }) {
                if power.writes_left == Some(0) {
                    power.on = false;
                    return Err(power_lost());
                }
                if let Some(left) = power.writes_left.as_mut() {
                    *left -= 1;
                }
                power.writes_done += 1;
            }
        }
        let mut guard = self.lock(slot);
        let m = guard.as_mut().ok_or_else(|| member_missing(slot))?;
        let size_bytes = m.current.len() as u64;
        let range = |offset: u64, len: u64| image_range(size_bytes, offset, len);
        match op {
            IoOp::Read { .. } => unreachable!("reads are served in submit"),
            IoOp::Write {
                offset_bytes,
                buf,
                fua,
            } => {
                let r = range(*offset_bytes, buf.len() as u64)?;
                m.current[r.clone()].copy_from_slice(buf);
                if *fua {
                    m.durable[r].copy_from_slice(buf);
                    m.supersede(*offset_bytes, buf.len() as u64);
                } else {
                    m.pending.push(Pending {
                        offset_bytes: *offset_bytes,
                        len_bytes: buf.len() as u64,
                        data: Some(buf.to_vec()),
                        live: vec![true; buf.len() / PAGE_BYTES as usize],
                    });
                }
            }
            IoOp::Flush => m.flush(),
            IoOp::Discard {
                offset_bytes,
                len_bytes,
            } => {
                let r = range(*offset_bytes, *len_bytes)?;
                m.current[r].fill(0);
                m.pending.push(Pending {
                    offset_bytes: *offset_bytes,
                    len_bytes: *len_bytes,
                    data: None,
                    live: vec![true; (*len_bytes / PAGE_BYTES) as usize],
                });
            }
        }
        Ok(())
    }

    fn read(&self, slot: usize, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        if !self.lock_power().on {
            return Err(power_lost());
        }
        let guard = self.lock(slot);
        let m = guard.as_ref().ok_or_else(|| member_missing(slot))?;
        let r = image_range(m.current.len() as u64, offset_bytes, buf.len() as u64)?;
        buf.copy_from_slice(&m.current[r]);
        Ok(())
    }
}

impl MemberIo for CrashMembers {
    fn slots(&self) -> usize {
        self.slots_in_use()
    }

    fn label(&self, slot: usize) -> String {
        self.members.label(slot, "crash")
    }

    /// A blank in-memory member (zeros, durably), or one holding a given image (durably), in an empty slot.
    fn attach(&self, slot: usize, member: &NewMember) -> io::Result<()> {
        if !self.lock_power().on {
            return Err(io::Error::other("the power is off"));
        }
        match member {
            NewMember::Image { label, size_bytes } => self
                .members
                .attach(slot, label, || Member::new(vec![0u8; *size_bytes as usize])),
            NewMember::Existing { label, image } => self
                .members
                .attach(slot, label, || Member::new(image.as_ref().clone())),
            NewMember::Path(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{member}: crash-model members are in-memory images only"),
            )),
        }
    }

    /// Without power nothing changes: a server that goes on after the cut (the simulator's does, until it is
    /// dropped) cannot pull the device whose I/O failed, and the crash must see it with its cache.
    fn detach(&self, slot: usize) -> bool {
        if !self.lock_power().on {
            return false;
        }
        self.members.detach(slot)
    }

    fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        if !self.lock_power().on {
            return Err(io::Error::other("the power is off"));
        }
        self.members.move_member(from, to)
    }

    fn present(&self, slot: usize) -> bool {
        self.members.present(slot)
    }

    fn size_bytes(&self, slot: usize) -> u64 {
        self.lock(slot)
            .as_ref()
            .map_or(0, |m| m.current.len() as u64)
    }

    fn discard_deallocates(&self, _slot: usize) -> bool {
        true
    }

    /// Zero bytes read as a hole does: what a read returns now (`current`, the cache over the medium) is zeros
    /// for that many bytes. Nothing while the power is off (reads fail then).
    fn hole_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        if !self.lock_power().on {
            return 0;
        }
        let guard = self.lock(slot);
        let Some(m) = guard.as_ref() else {
            return 0;
        };
        let size = m.current.len() as u64;
        let end = offset_bytes.saturating_add(len_bytes).min(size);
        if offset_bytes >= end {
            return 0;
        }
        let bytes = &m.current[offset_bytes as usize..end as usize];
        bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len()) as u64
    }

    /// Up to the first page (4 KiB, aligned) of zeros: the granularity a file system's holes come in.
    fn data_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        if !self.lock_power().on {
            return len_bytes;
        }
        let guard = self.lock(slot);
        let Some(m) = guard.as_ref() else {
            return len_bytes;
        };
        let end = offset_bytes
            .saturating_add(len_bytes)
            .min(m.current.len() as u64);
        let page = PAGE_BYTES;
        let mut at = offset_bytes.next_multiple_of(page);
        while at + page <= end {
            if m.current[at as usize..(at + page) as usize]
                .iter()
                .all(|b| *b == 0)
            {
                return at - offset_bytes;
            }
            at += page;
        }
        len_bytes
    }

    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        for req in reqs.iter_mut() {
            let slot = req.slot;
            req.result = match check_alignment(&req.op) {
                Err(e) => Err(e),
                Ok(()) if slot >= self.members.capacity() => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no slot {slot}"),
                )),
                Ok(()) => match &mut req.op {
                    IoOp::Read { offset_bytes, buf } => self.read(slot, *offset_bytes, buf),
                    op => self.run(slot, op),
                },
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;

    fn page(fill: u8, pages: usize) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(4096 * pages);
        b.fill(fill);
        b
    }

    fn submit(io: &CrashMembers, req: IoReq<'_>) -> io::Result<()> {
        let mut reqs = [req];
        io.submit(&mut reqs);
        let [req] = reqs;
        req.result
    }

    fn page_of(image: &[u8], page: usize) -> u8 {
        let bytes = &image[page * 4096..(page + 1) * 4096];
        assert!(bytes.iter().all(|b| *b == bytes[0]), "page {page} uniform");
        bytes[0]
    }

    #[test]
    fn unflushed_write_is_lost_flushed_and_fua_survive() {
        let io = CrashMembers::new(1, 8 * 4096);
        let a = page(1, 1);
        submit(&io, IoReq::write(0, 0, &a, false)).expect("write");
        submit(&io, IoReq::flush(0)).expect("flush");
        let b = page(2, 1);
        submit(&io, IoReq::write(0, 4096, &b, true)).expect("fua write");
        let c = page(3, 1);
        submit(&io, IoReq::write(0, 8192, &c, false)).expect("write");
        assert_eq!(
            page_of(&io.image(0).expect("present"), 2),
            3,
            "reads see the cache"
        );
        let after = io.crash(1, CrashPolicy::DropAll);
        let image = after.images[0].as_ref().expect("present");
        assert_eq!(
            (page_of(image, 0), page_of(image, 1), page_of(image, 2)),
            (1, 2, 0)
        );
        assert_eq!(after.writes_dropped, 1);
        let kept = io.crash(1, CrashPolicy::KeepAll);
        assert_eq!(page_of(kept.images[0].as_ref().expect("present"), 2), 3);
    }

    #[test]
    fn fua_write_is_not_undone_by_an_older_cached_write() {
        let io = CrashMembers::new(1, 8 * 4096);
        let old = page(1, 2);
        submit(&io, IoReq::write(0, 0, &old, false)).expect("write");
        let new = page(2, 1);
        submit(&io, IoReq::write(0, 4096, &new, true)).expect("fua");
        for seed in 0..20 {
            let after = io.crash(seed, CrashPolicy::KeepAll);
            let image = after.images[0].as_ref().expect("present");
            assert_eq!(page_of(image, 1), 2, "seed {seed}");
        }
    }

    #[test]
    fn torn_writes_are_page_granular_and_seeded() {
        let io = CrashMembers::new(1, 64 * 4096);
        let data = page(9, 32);
        submit(&io, IoReq::write(0, 0, &data, false)).expect("write");
        let mut torn_seen = false;
        for seed in 0..30 {
            let r = io.crash(seed, CrashPolicy::Random);
            assert_eq!(r.pages_kept + r.pages_lost, 32);
            let image = r.images[0].as_ref().expect("present");
            for p in 0..32 {
                let v = page_of(image, p);
                assert!(v == 0 || v == 9);
            }
            torn_seen |= r.writes_torn == 1;
            let again = io.crash(seed, CrashPolicy::Random);
            assert_eq!(again.images, r.images, "seed {seed} replays");
        }
        assert!(torn_seen, "some seed tears the write");
    }

    #[test]
    fn power_cut_between_writes() {
        let io = CrashMembers::new(3, 4 * 4096);
        let data = page(5, 1);
        io.cut_power_after_writes(2);
        let mut reqs: Vec<IoReq<'_>> = (0..3).map(|s| IoReq::write(s, 0, &data, true)).collect();
        io.submit(&mut reqs);
        let ok: Vec<bool> = reqs.iter().map(|r| r.result.is_ok()).collect();
        assert_eq!(ok, vec![true, true, false]);
        assert!(!io.power_on());
        let mut b = page(0, 1);
        assert!(
            submit(&io, IoReq::read(0, 0, &mut b)).is_err(),
            "no I/O after the cut"
        );
        let after = io.crash(0, CrashPolicy::KeepAll);
        let firsts: Vec<u8> = after
            .images
            .iter()
            .map(|i| page_of(i.as_ref().expect("present"), 0))
            .collect();
        assert_eq!(firsts, vec![5, 5, 0]);
    }
}
