//! Helpers of the integrity tests (write-intent bitmap, partial parity log, check): arrays on crash-model members,
//! a per-block model of what may be read back after a crash, and a parity audit of member images.
#![allow(dead_code)]

use std::sync::Arc;

#[allow(unused_imports)]
pub use paraid_engine::fault::{CrashMembers, CrashPolicy, SplitMix64};
pub use paraid_engine::layout::{Geometry, Level};
/// The simulator's request extents: any offset, up to three stripes, half page-aligned.
#[allow(unused_imports)]
pub use paraid_engine::sim::random_extent as extent;
pub use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
pub use paraid_engine::{assemble_io, create_io, Array, AssembleOptions, MemMembers, MemberIo};
use paraid_parity::reference::Reference;
use paraid_parity::{Backend, CheckOutcome};

pub const BLOCK: usize = 4096;

pub fn reference() -> Arc<dyn Backend> {
    Arc::new(Reference)
}

pub fn options(log: bool) -> AssembleOptions {
    let mut opts = AssembleOptions::new(reference());
    opts.write_hole_log = log;
    opts
}

pub fn member_bytes(chunk_bytes: u64, rows: u64) -> u64 {
    DEFAULT_DATA_OFFSET_BYTES + rows * chunk_bytes
}

/// A fresh array on crash-model members.
pub fn crash_array(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
    log: bool,
) -> (Arc<CrashMembers>, Array) {
    crash_array_at(
        level,
        members,
        chunk_bytes,
        rows,
        log,
        DEFAULT_DATA_OFFSET_BYTES,
    )
}

/// The same with the data area at `data_offset` (`small_ring_data_offset_bytes`: the smallest log ring, which
/// fills, retires and wraps within a few writes).
pub fn crash_array_at(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
    log: bool,
    data_offset: u64,
) -> (Arc<CrashMembers>, Array) {
    let io = Arc::new(CrashMembers::new(members, data_offset + rows * chunk_bytes));
    paraid_engine::create_io_with_data_offset(
        io.as_ref(),
        level,
        chunk_bytes,
        "integrity",
        data_offset,
    )
    .expect("create_io");
    let array = assemble_io(io.clone(), options(log)).expect("assemble_io");
    (io, array)
}

/// Assembles member images (None: missing) on fresh crash-model members.
pub fn reassemble(images: Vec<Option<Vec<u8>>>, log: bool) -> (Arc<CrashMembers>, Array) {
    let io = Arc::new(CrashMembers::from_images(images));
    let array = assemble_io(io.clone(), options(log)).expect("re-assembly");
    (io, array)
}

/// A fresh array on in-memory members (no cache model): for check/repair and bitmap tests.
pub fn mem_array(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
) -> (Arc<MemMembers>, Array) {
    let io = Arc::new(MemMembers::new(members, member_bytes(chunk_bytes, rows)));
    create_io(io.as_ref(), level, chunk_bytes, "integrity").expect("create_io");
    let array = assemble_io(io.clone(), options(true)).expect("assemble_io");
    (io, array)
}

/// Writes the whole array with bytes from `rng` and flushes them; returns what it holds.
pub fn fill_flushed(array: &Array, rng: &mut SplitMix64) -> Vec<u8> {
    let mut data = vec![0u8; array.size_bytes() as usize];
    rng.fill(&mut data);
    array.write(0, &data, false).expect("fill");
    array.flush().expect("flush");
    data
}

pub fn mem_images(io: &MemMembers) -> Vec<Option<Vec<u8>>> {
    (0..io.slots()).map(|s| io.image(s)).collect()
}

/// What each 4 KiB block may hold after a crash: its durable value (flushed or FUA) and every value written
/// since, in order (a write of part of a block writes the whole block with the bytes it had then).
pub struct Model {
    durable: Vec<Vec<u8>>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Model {
    pub fn new(array_bytes: u64) -> Model {
        let blocks = array_bytes as usize / BLOCK;
        Model {
            durable: vec![vec![0u8; BLOCK]; blocks],
            since: vec![Vec::new(); blocks],
        }
    }

    /// The newest value of block `b` (what the array serves until a crash).
    pub fn latest(&self, b: usize) -> &[u8] {
        self.since[b].last().unwrap_or(&self.durable[b])
    }

    /// A write of `data` at `offset`: acknowledged (`durable` when FUA) or failed (`None`: it may or may not
    /// have reached the members).
    pub fn write(&mut self, offset: u64, data: &[u8], durable: Option<bool>) {
        let end = offset as usize + data.len();
        let mut at = offset as usize;
        while at < end {
            let b = at / BLOCK;
            let lo = at % BLOCK;
            let hi = (end - b * BLOCK).min(BLOCK);
            let mut value = self.latest(b).to_vec();
            value[lo..hi]
                .copy_from_slice(&data[at - offset as usize..at - offset as usize + hi - lo]);
            if durable == Some(true) {
                self.durable[b] = value;
                self.since[b].clear();
            } else {
                self.since[b].push(value);
            }
            at = b * BLOCK + hi;
        }
    }

    /// A flush completed.
    pub fn flushed(&mut self) {
        for b in 0..self.durable.len() {
            if let Some(v) = self.since[b].pop() {
                self.durable[b] = v;
                self.since[b].clear();
            }
        }
    }

    pub fn blocks(&self) -> usize {
        self.durable.len()
    }

    /// Whether block `b` was written since its last durable point.
    pub fn in_flight(&self, b: usize) -> bool {
        !self.since[b].is_empty()
    }

    /// Checks what the array reads after a crash. Blocks not written since they became durable must read exactly
    /// that; blocks written since must read one of their values, unless `lost(b)` (the block's member is missing:
    /// a write in flight to a lost member has no promise). Returns (durable blocks checked, violations).
    pub fn check_after_crash(
        &self,
        got: &[u8],
        lost: impl Fn(usize) -> bool,
    ) -> (u64, Vec<String>) {
        let mut durable = 0;
        let mut violations = Vec::new();
        for b in 0..self.blocks() {
            let read = &got[b * BLOCK..(b + 1) * BLOCK];
            if self.since[b].is_empty() {
                durable += 1;
                if read != &self.durable[b][..] {
                    violations.push(format!("block {b}: durable data lost"));
                }
            } else if !lost(b)
                && read != &self.durable[b][..]
                && !self.since[b].iter().any(|v| &v[..] == read)
            {
                violations.push(format!("block {b}: neither its durable nor a newer value"));
            }
        }
        (durable, violations)
    }

    /// After a resync that nothing has written over: the contents every block now has (for checking member
    /// images directly). None if a block is not settled.
    pub fn durable_bytes(&self) -> Vec<u8> {
        self.durable.concat()
    }
}

/// The member holding array block `b` (copy 0).
pub fn member_of_block(g: &Geometry, b: usize) -> usize {
    g.chunk_copy(b as u64 * BLOCK as u64 / g.chunk_bytes, 0)
        .member
}

/// Stripes (RAID5/6) whose parity does not match their data, or chunks (RAID1/10) whose copies differ, read
/// from member images with the reference implementation. Members given as None are skipped (their stripes are
/// not judged).
pub fn inconsistent_stripes(
    g: &Geometry,
    data_offset: u64,
    images: &[Option<Vec<u8>>],
) -> Vec<u64> {
    let cb = g.chunk_bytes as usize;
    let cell = |member: usize, row: u64| -> Option<&[u8]> {
        images[member].as_ref().map(|img| {
            let at = data_offset as usize + row as usize * cb;
            &img[at..at + cb]
        })
    };
    let mut bad = Vec::new();
    if g.level.has_parity() {
        let width = g.data_per_stripe() + g.level.parity_chunks();
        for s in 0..g.stripes() {
            let cells: Option<Vec<&[u8]>> =
                (0..width).map(|i| cell(g.stripe_member(s, i), s)).collect();
            if let Some(cells) = cells {
                if Reference.check(&cells, g.level == Level::Raid6) != CheckOutcome::Consistent {
                    bad.push(s);
                }
            }
        }
    } else if g.copies() > 1 {
        for c in 0..g.data_chunks() {
            let copies: Vec<&[u8]> = (0..g.copies())
                .filter_map(|k| {
                    let a = g.chunk_copy(c, k);
                    cell(a.member, a.row)
                })
                .collect();
            if copies.windows(2).any(|w| w[0] != w[1]) {
                bad.push(c);
            }
        }
    }
    bad
}

/// RAID6 re-assembled with one member missing: every stripe must still be consistent, that is its present P and
/// Q must both agree with what the array reads (the missing chunk solved from P). Otherwise a second failure, or
/// the rebuild, would solve the stripe from the parity that disagrees and return other bytes. Judged from member
/// images by the simulator's audit against `read_back`, the whole array as read; returns one line per problem.
pub fn degraded_parity_problems(
    g: &Geometry,
    data_offset: u64,
    images: &[Option<Vec<u8>>],
    read_back: &[u8],
) -> Vec<String> {
    let report = paraid_engine::sim::audit::audit_images(g, data_offset, images, Some(read_back));
    let mut problems: Vec<String> = report
        .bad_stripes
        .iter()
        .map(|(s, o)| format!("stripe {s}: {o:?}"))
        .collect();
    problems.extend(report.problems);
    problems
}

/// Prints a figure line the report collects.
pub fn figure(test: &str, text: &str) {
    println!("FIGURE integrity {test}: {text}");
}
