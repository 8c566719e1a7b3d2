//! Members held in memory: for tests and for the simulator. Enforces the same alignment rules as O_DIRECT.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{check_alignment, unsupported_kind, IoOp, IoReq, MemberIo, NewMember};
use crate::layout::MAX_MEMBERS;

/// Slot `i` holds an image (or nothing); every slot up to `MAX_MEMBERS` exists so that spares can be attached
/// beyond the members given at construction.
pub struct MemMembers {
    images: Vec<Mutex<Option<Vec<u8>>>>,
    /// Labels of attached members (None: `mem{slot}`).
    labels: Mutex<Vec<Option<String>>>,
    /// Slots in use: those given at construction, grown by `attach` beyond them.
    slots: AtomicUsize,
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
        let slots = images.len();
        assert!(
            slots <= MAX_MEMBERS,
            "{slots} member images, at most {MAX_MEMBERS}"
        );
        let mut images: Vec<Mutex<Option<Vec<u8>>>> = images.into_iter().map(Mutex::new).collect();
        images.resize_with(MAX_MEMBERS, || Mutex::new(None));
        MemMembers {
            images,
            labels: Mutex::new(vec![None; MAX_MEMBERS]),
            slots: AtomicUsize::new(slots),
        }
    }

    /// A copy of the member's bytes (None if missing).
    pub fn image(&self, slot: usize) -> Option<Vec<u8>> {
        self.lock(slot).clone()
    }

    /// Every image (of the slots in use), consuming the member set.
    pub fn into_images(self) -> Vec<Option<Vec<u8>>> {
        let slots = self.slots.load(Ordering::Acquire);
        self.images
            .into_iter()
            .take(slots)
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    fn lock_labels(&self) -> std::sync::MutexGuard<'_, Vec<Option<String>>> {
        self.labels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes the member in `slot` (later I/O to it fails), returning its bytes.
    pub fn remove(&self, slot: usize) -> Option<Vec<u8>> {
        self.lock(slot).take()
    }

    /// Overwrites member bytes directly, bypassing the array (to plant corruption in tests).
    pub fn poke(&self, slot: usize, offset_bytes: u64, bytes: &[u8]) {
        let mut image = self.lock(slot);
        let image = image.as_mut().expect("poke into a missing member");
        let at = offset_bytes as usize;
        image[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn lock(&self, slot: usize) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.images[slot].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self, slot: usize, op: &mut IoOp<'_>) -> io::Result<()> {
        check_alignment(op)?;
        if slot >= self.images.len() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no slot {slot}"),
            ));
        }
        let mut guard = self.lock(slot);
        let image = guard.as_mut().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("member {slot} is missing"))
        })?;
        let range = |offset: u64, len: u64| -> io::Result<std::ops::Range<usize>> {
            let end = offset
                .checked_add(len)
                .filter(|end| *end <= image.len() as u64);
            match end {
                Some(end) => Ok(offset as usize..end as usize),
                None => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "beyond the end of the member",
                )),
            }
        };
        match op {
            IoOp::Read { offset_bytes, buf } => {
                let r = range(*offset_bytes, buf.len() as u64)?;
                buf.copy_from_slice(&image[r]);
            }
            IoOp::Write {
                offset_bytes, buf, ..
            } => {
                let r = range(*offset_bytes, buf.len() as u64)?;
                image[r].copy_from_slice(buf);
            }
            IoOp::Flush => {}
            IoOp::Discard {
                offset_bytes,
                len_bytes,
            } => {
                let r = range(*offset_bytes, *len_bytes)?;
                image[r].fill(0);
            }
        }
        Ok(())
    }
}

impl MemberIo for MemMembers {
    fn slots(&self) -> usize {
        self.slots.load(Ordering::Acquire)
    }

    fn label(&self, slot: usize) -> String {
        match self.lock_labels().get(slot) {
            Some(Some(label)) => label.clone(),
            _ => format!("mem{slot}"),
        }
    }

    fn present(&self, slot: usize) -> bool {
        slot < self.images.len() && self.lock(slot).is_some()
    }

    fn attach(&self, slot: usize, member: &NewMember) -> io::Result<()> {
        let NewMember::Image { label, size_bytes } = member else {
            return Err(unsupported_kind(member, "in-memory"));
        };
        if slot >= self.images.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no slot {slot}"),
            ));
        }
        let mut image = self.lock(slot);
        if image.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("slot {slot} is taken"),
            ));
        }
        *image = Some(vec![0u8; *size_bytes as usize]);
        self.lock_labels()[slot] = Some(label.clone());
        self.slots.fetch_max(slot + 1, Ordering::AcqRel);
        Ok(())
    }

    fn detach(&self, slot: usize) -> bool {
        if slot >= self.images.len() {
            return false;
        }
        self.lock_labels()[slot] = None;
        self.lock(slot).take().is_some()
    }

    fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        if from >= self.images.len() || to >= self.images.len() || from == to {
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

    fn size_bytes(&self, slot: usize) -> u64 {
        self.lock(slot)
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
