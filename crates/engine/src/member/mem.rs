//! Members held in memory: for tests and for the simulator. Enforces the same alignment rules as O_DIRECT.

use std::io;
use std::sync::Mutex;

use super::{check_alignment, IoOp, IoReq, MemberIo};

pub struct MemMembers {
    images: Vec<Mutex<Option<Vec<u8>>>>,
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
            images: images.into_iter().map(Mutex::new).collect(),
        }
    }

    /// A copy of the member's bytes (None if missing).
    pub fn image(&self, slot: usize) -> Option<Vec<u8>> {
        self.lock(slot).clone()
    }

    /// Every image, consuming the member set.
    pub fn into_images(self) -> Vec<Option<Vec<u8>>> {
        self.images
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect()
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
        self.images.len()
    }

    fn label(&self, slot: usize) -> String {
        format!("mem{slot}")
    }

    fn present(&self, slot: usize) -> bool {
        slot < self.images.len() && self.lock(slot).is_some()
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
