//! Members held in memory: for tests and for the simulator. Enforces the same alignment rules as O_DIRECT.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{check_alignment, unsupported_kind, IoOp, IoReq, MemberIo, NewMember};
use crate::layout::MAX_MEMBERS;

/// The slot table shared by the in-memory member sets (`MemMembers`, and the crash model's `CrashMembers`): slot
/// `i` holds an item (or nothing); every slot up to `MAX_MEMBERS` exists so that spares can be attached beyond the
/// members given at construction.
pub(crate) struct MemSlots<T> {
    items: Vec<Mutex<Option<T>>>,
    /// Labels of attached members (None: the set's default name).
    labels: Mutex<Vec<Option<String>>>,
    /// Slots in use: those given at construction, grown by `attach` and `move_member` beyond them.
    slots: AtomicUsize,
}

impl<T> MemSlots<T> {
    pub(crate) fn new(items: Vec<Option<T>>) -> MemSlots<T> {
        let slots = items.len();
        assert!(
            slots <= MAX_MEMBERS,
            "{slots} member images, at most {MAX_MEMBERS}"
        );
        let mut items: Vec<Mutex<Option<T>>> = items.into_iter().map(Mutex::new).collect();
        items.resize_with(MAX_MEMBERS, || Mutex::new(None));
        MemSlots {
            items,
            labels: Mutex::new(vec![None; MAX_MEMBERS]),
            slots: AtomicUsize::new(slots),
        }
    }

    /// Every slot that exists (in use or not).
    pub(crate) fn capacity(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn slots_in_use(&self) -> usize {
        self.slots.load(Ordering::Acquire)
    }

    pub(crate) fn lock(&self, slot: usize) -> std::sync::MutexGuard<'_, Option<T>> {
        self.items[slot].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_labels(&self) -> std::sync::MutexGuard<'_, Vec<Option<String>>> {
        self.labels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The attached member's label, or `{default_prefix}{slot}`.
    pub(crate) fn label(&self, slot: usize, default_prefix: &str) -> String {
        match self.lock_labels().get(slot) {
            Some(Some(label)) => label.clone(),
            _ => format!("{default_prefix}{slot}"),
        }
    }

    pub(crate) fn present(&self, slot: usize) -> bool {
        slot < self.items.len() && self.lock(slot).is_some()
    }

    /// Puts `item` (made only once the slot is known to be free) into an empty slot.
    pub(crate) fn attach(
        &self,
        slot: usize,
        label: &str,
        item: impl FnOnce() -> T,
    ) -> io::Result<()> {
        if slot >= self.items.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no slot {slot}"),
            ));
        }
        let mut guard = self.lock(slot);
        if guard.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("slot {slot} is taken"),
            ));
        }
        *guard = Some(item());
        self.lock_labels()[slot] = Some(label.to_string());
        self.slots.fetch_max(slot + 1, Ordering::AcqRel);
        Ok(())
    }

    pub(crate) fn detach(&self, slot: usize) -> bool {
        if slot >= self.items.len() {
            return false;
        }
        self.lock_labels()[slot] = None;
        self.lock(slot).take().is_some()
    }

    pub(crate) fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        if from >= self.items.len() || to >= self.items.len() || from == to {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot move slot {from} to {to}"),
            ));
        }
        // Both slots locked in index order: a request to either sees the member in one place or the other.
        let (lo, hi) = (from.min(to), from.max(to));
        let mut a = self.lock(lo);
        let mut b = self.lock(hi);
        let (src, dst) = if from < to {
            (&mut *a, &mut *b)
        } else {
            (&mut *b, &mut *a)
        };
        if dst.is_some() || src.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot move slot {from} to {to}: source empty or target taken"),
            ));
        }
        *dst = src.take();
        let mut labels = self.lock_labels();
        labels[to] = labels[from].take();
        self.slots.fetch_max(to + 1, Ordering::AcqRel);
        Ok(())
    }

    /// Every item of the slots in use, consuming the table.
    pub(crate) fn into_items(self) -> Vec<Option<T>> {
        let slots = self.slots_in_use();
        self.items
            .into_iter()
            .take(slots)
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }
}

/// The error for I/O to an empty slot.
pub(crate) fn member_missing(slot: usize) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("member {slot} is missing"))
}

/// The bytes `offset_bytes..offset_bytes + len_bytes` of a member of `size_bytes`, or the error for I/O beyond
/// its end.
pub(crate) fn image_range(
    size_bytes: u64,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<std::ops::Range<usize>> {
    match offset_bytes
        .checked_add(len_bytes)
        .filter(|end| *end <= size_bytes)
    {
        Some(end) => Ok(offset_bytes as usize..end as usize),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "beyond the end of the member",
        )),
    }
}

/// Members held as plain byte images.
pub struct MemMembers {
    slots: MemSlots<Vec<u8>>,
}

impl MemMembers {
    /// `slots` zero-filled members of `size_bytes` each.
    pub fn new(slots: usize, size_bytes: u64) -> MemMembers {
        MemMembers::from_images(
            (0..slots)
                .map(|_| Some(vec![0u8; size_bytes as usize]))
                .collect(),
        )
    }

    /// Members with the given contents; `None` is a missing member.
    pub fn from_images(images: Vec<Option<Vec<u8>>>) -> MemMembers {
        MemMembers {
            slots: MemSlots::new(images),
        }
    }

    /// A copy of the member's bytes (None if missing).
    pub fn image(&self, slot: usize) -> Option<Vec<u8>> {
        self.slots.lock(slot).clone()
    }

    /// Every image (of the slots in use), consuming the member set.
    pub fn into_images(self) -> Vec<Option<Vec<u8>>> {
        self.slots.into_items()
    }

    /// Removes the member in `slot` (later I/O to it fails), returning its bytes.
    pub fn remove(&self, slot: usize) -> Option<Vec<u8>> {
        self.slots.lock(slot).take()
    }

    /// Overwrites member bytes directly, bypassing the array (to plant corruption in tests).
    pub fn poke(&self, slot: usize, offset_bytes: u64, bytes: &[u8]) {
        let mut image = self.slots.lock(slot);
        let image = image.as_mut().expect("poke into a missing member");
        let at = offset_bytes as usize;
        image[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn run(&self, slot: usize, op: &mut IoOp<'_>) -> io::Result<()> {
        check_alignment(op)?;
        if slot >= self.slots.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no slot {slot}"),
            ));
        }
        let mut guard = self.slots.lock(slot);
        let image = guard.as_mut().ok_or_else(|| member_missing(slot))?;
        let size_bytes = image.len() as u64;
        match op {
            IoOp::Read { offset_bytes, buf } => {
                let r = image_range(size_bytes, *offset_bytes, buf.len() as u64)?;
                buf.copy_from_slice(&image[r]);
            }
            IoOp::Write {
                offset_bytes, buf, ..
            } => {
                let r = image_range(size_bytes, *offset_bytes, buf.len() as u64)?;
                image[r].copy_from_slice(buf);
            }
            IoOp::Flush => {}
            IoOp::Discard {
                offset_bytes,
                len_bytes,
            } => {
                let r = image_range(size_bytes, *offset_bytes, *len_bytes)?;
                image[r].fill(0);
            }
        }
        Ok(())
    }
}

impl MemberIo for MemMembers {
    fn slots(&self) -> usize {
        self.slots.slots_in_use()
    }

    fn label(&self, slot: usize) -> String {
        self.slots.label(slot, "mem")
    }

    fn present(&self, slot: usize) -> bool {
        self.slots.present(slot)
    }

    fn attach(&self, slot: usize, member: &NewMember) -> io::Result<()> {
        let NewMember::Image { label, size_bytes } = member else {
            return Err(unsupported_kind(member, "in-memory"));
        };
        self.slots
            .attach(slot, label, || vec![0u8; *size_bytes as usize])
    }

    fn detach(&self, slot: usize) -> bool {
        self.slots.detach(slot)
    }

    fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        self.slots.move_member(from, to)
    }

    fn size_bytes(&self, slot: usize) -> u64 {
        self.slots
            .lock(slot)
            .as_ref()
            .map_or(0, |image| image.len() as u64)
    }

    fn discard_deallocates(&self, _slot: usize) -> bool {
        true
    }

    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        for req in reqs.iter_mut() {
            req.result = self.run(req.slot, &mut req.op);
        }
    }
}
