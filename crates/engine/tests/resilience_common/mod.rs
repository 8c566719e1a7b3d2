//! Helpers of the resilience tests: in-memory members with simple, exact faults (dead members, unreadable member
//! byte ranges, transient errors) that also attach, detach and move members like the real ones.
#![allow(dead_code)]

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::common::{forward_member_io, reference};
use paraid_engine::{assemble_io, Array, AssembleOptions, IoOp, IoReq, MemMembers, MemberIo};

#[derive(Default)]
struct Faults {
    /// Every I/O of these slots fails.
    dead: Vec<usize>,
    /// Reads overlapping these member byte ranges of a slot fail (latent sector errors).
    bad_reads: Vec<(usize, Range<u64>)>,
    /// The next `n` I/Os of the slot each fail once (transient errors).
    fail_next: Vec<(usize, u32)>,
    /// Writes of these slots fail.
    bad_writes: Vec<usize>,
    /// I/Os that failed, per slot.
    failed: Vec<u64>,
}

/// `MemMembers` with faults.
pub struct Flaky {
    pub inner: MemMembers,
    faults: Mutex<Faults>,
}

fn span(op: &IoOp<'_>) -> Option<Range<u64>> {
    match op {
        IoOp::Read { offset_bytes, buf } => Some(*offset_bytes..*offset_bytes + buf.len() as u64),
        IoOp::Write {
            offset_bytes, buf, ..
        } => Some(*offset_bytes..*offset_bytes + buf.len() as u64),
        IoOp::Discard {
            offset_bytes,
            len_bytes,
        } => Some(*offset_bytes..*offset_bytes + *len_bytes),
        IoOp::Flush => None,
    }
}

impl Flaky {
    pub fn new(images: Vec<Option<Vec<u8>>>) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: MemMembers::from_images(images),
            faults: Mutex::new(Faults {
                failed: vec![0; 64],
                ..Faults::default()
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().expect("faults")
    }

    pub fn kill(&self, slot: usize) {
        self.lock().dead.push(slot);
    }

    pub fn bad_reads(&self, slot: usize, range: Range<u64>) {
        self.lock().bad_reads.push((slot, range));
    }

    pub fn bad_writes(&self, slot: usize) {
        self.lock().bad_writes.push(slot);
    }

    /// The next `n` I/Os of `slot` fail (each once); replaces what was still pending for the slot.
    pub fn fail_next(&self, slot: usize, n: u32) {
        let mut f = self.lock();
        f.fail_next.retain(|(s, _)| *s != slot);
        f.fail_next.push((slot, n));
    }

    pub fn heal(&self) {
        let mut f = self.lock();
        f.dead.clear();
        f.bad_reads.clear();
        f.fail_next.clear();
        f.bad_writes.clear();
    }

    pub fn failed(&self, slot: usize) -> u64 {
        self.lock().failed[slot]
    }

    fn fails(&self, slot: usize, op: &IoOp<'_>) -> bool {
        let mut f = self.lock();
        let mut fail = f.dead.contains(&slot);
        if let (IoOp::Read { .. }, Some(s)) = (op, span(op)) {
            fail |= f
                .bad_reads
                .iter()
                .any(|(b, r)| *b == slot && r.start < s.end && s.start < r.end);
        }
        if matches!(op, IoOp::Write { .. }) {
            fail |= f.bad_writes.contains(&slot);
        }
        if let Some(entry) = f.fail_next.iter_mut().find(|(s, n)| *s == slot && *n > 0) {
            entry.1 -= 1;
            fail = true;
        }
        if fail {
            f.failed[slot] += 1;
        }
        fail
    }
}

impl MemberIo for Flaky {
    forward_member_io!(inner, attach);
    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        for req in reqs.iter_mut() {
            if self.fails(req.slot, &req.op) {
                req.result = Err(io::Error::from_raw_os_error(libc_eio()));
            } else {
                self.inner.submit(std::slice::from_mut(req));
            }
        }
    }
}

fn libc_eio() -> i32 {
    5 // EIO
}

/// Assembles an array over `Flaky` members holding `images`.
pub fn assemble_flaky(images: &[Option<Vec<u8>>]) -> (Arc<Flaky>, Array) {
    let io = Flaky::new(images.to_vec());
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
    (io, array)
}
