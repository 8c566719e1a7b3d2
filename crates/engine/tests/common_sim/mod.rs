//! Helpers shared by the fault-matrix tests (tests/faults_*.rs): arrays over the fault-injecting member stack,
//! the block model, read-back checks, and the figure each row reports.
#![allow(dead_code)]

use std::sync::Arc;

#[allow(unused_imports)]
pub use paraid_engine::fault::{
    Count, CrashMembers, CrashPolicy, Fault, FaultyBackend, FaultyMembers, Injected, OpKinds,
    RowLimit, Scope, SplitMix64,
};
pub use paraid_engine::layout::{Geometry, Level};
#[allow(unused_imports)]
pub use paraid_engine::sim::audit::{audit_images, AuditReport};
pub use paraid_engine::sim::model::{BlockModel, WriteOutcome, BLOCK_BYTES};
/// The simulator's request extents: any offset, up to three stripes, half page-aligned.
pub use paraid_engine::sim::random_extent as extent;
#[allow(unused_imports)]
pub use paraid_engine::{assemble_io, create_io, Array, AssembleOptions, EngineError, SlotState};
use paraid_parity::Backend;

use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;

/// Crash-model members under the fault injector: the stack every fault test drives.
pub type Stack = FaultyMembers<CrashMembers>;

pub fn reference() -> Arc<dyn Backend> {
    Arc::new(paraid_parity::reference::Reference)
}

/// Member size for `rows` chunks of data area.
pub fn member_bytes(chunk_bytes: u64, rows: u64) -> u64 {
    DEFAULT_DATA_OFFSET_BYTES + rows * chunk_bytes
}

/// A fresh array on the stack.
pub fn new_array(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
    seed: u64,
    parity: Arc<dyn Backend>,
) -> (Arc<Stack>, Array) {
    let io = Arc::new(FaultyMembers::new(
        CrashMembers::new(members, member_bytes(chunk_bytes, rows)),
        seed,
    ));
    create_io(io.as_ref(), level, chunk_bytes, "faults").expect("create_io");
    let array = assemble_io(io.clone(), AssembleOptions::new(parity)).expect("assemble_io");
    (io, array)
}

/// Assembles member images (None = missing) on a fresh stack.
pub fn assemble_images(
    images: Vec<Option<Vec<u8>>>,
    seed: u64,
    parity: Arc<dyn Backend>,
) -> Result<(Arc<Stack>, Array), EngineError> {
    let io = Arc::new(FaultyMembers::new(CrashMembers::from_images(images), seed));
    let array = assemble_io(io.clone(), AssembleOptions::new(parity))?;
    Ok((io, array))
}

/// Writes random bytes over the whole array, flushes, and returns the model (every block settled and durable).
pub fn fill(array: &Array, rng: &mut SplitMix64) -> BlockModel {
    let mut model = BlockModel::new(array.size_bytes());
    let mut data = vec![0u8; array.size_bytes() as usize];
    rng.fill(&mut data);
    array.write(0, &data, false).expect("fill write");
    array.flush().expect("fill flush");
    model.write(0, &data, WriteOutcome::Acked { durable: true });
    model
}

/// A random write through the array, recorded in the model; returns whether it was acknowledged.
pub fn random_write(array: &Array, model: &mut BlockModel, rng: &mut SplitMix64) -> bool {
    let g = array.geometry();
    let (offset, len) = extent(rng, array.size_bytes(), g.stripe_bytes());
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    let fua = rng.one_in(4);
    let ok = array.write(offset, &data, fua).is_ok();
    model.write(
        offset,
        &data,
        if ok {
            WriteOutcome::Acked { durable: fua }
        } else {
            WriteOutcome::Failed
        },
    );
    ok
}

/// Reads the whole array in one request and checks every block (panics with `what` on wrong data).
pub fn verify_all(array: &Array, model: &mut BlockModel, what: &str) -> u64 {
    let mut all = vec![0u8; array.size_bytes() as usize];
    array
        .read(0, &mut all)
        .unwrap_or_else(|e| panic!("{what}: reading the whole array failed: {e}"));
    model
        .check_read(0, &all)
        .unwrap_or_else(|m| panic!("{what}: {m}"))
}

/// Outcome counts of reading every 4 KiB block on its own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockReads {
    pub correct: u64,
    pub failed: u64,
    pub wrong: u64,
}

/// Reads every block on its own: each must fail or be right. Returns the counts and the failed blocks.
pub fn read_each_block(array: &Array, model: &mut BlockModel) -> (BlockReads, Vec<u64>) {
    let mut counts = BlockReads::default();
    let mut failed = Vec::new();
    let mut buf = vec![0u8; BLOCK_BYTES];
    for block in 0..array.size_bytes() / BLOCK_BYTES as u64 {
        let at = block * BLOCK_BYTES as u64;
        match array.read(at, &mut buf) {
            Ok(()) => match model.check_read(at, &buf) {
                Ok(_) => counts.correct += 1,
                Err(_) => counts.wrong += 1,
            },
            Err(_) => {
                counts.failed += 1;
                failed.push(block);
            }
        }
    }
    (counts, failed)
}

/// Every member image as reads see it now.
pub fn images(io: &Stack) -> Vec<Option<Vec<u8>>> {
    io.inner().images()
}

/// Prints a row's figure in a form the reliability report collects (`grep '^FIGURE'`).
pub fn figure(row: &str, test: &str, text: &str) {
    println!("FIGURE {row} | {test} | {text}");
}

/// Array configurations the row tests sweep: (level, members, chunk bytes, rows).
pub fn redundant_configs() -> Vec<(Level, usize, u64, u64)> {
    vec![
        (Level::Raid1, 2, 4096, 8),
        (Level::Raid1, 3, 16384, 4),
        (Level::Raid5, 3, 4096, 8),
        (Level::Raid5, 4, 16384, 4),
        (Level::Raid5, 6, 65536, 2),
        (Level::Raid6, 4, 4096, 8),
        (Level::Raid6, 5, 16384, 4),
        (Level::Raid6, 7, 8192, 4),
        (Level::Raid10, 2, 4096, 8),
        (Level::Raid10, 3, 8192, 6),
        (Level::Raid10, 4, 16384, 4),
    ]
}

/// Slots whose loss together `g` survives, for every single slot.
pub fn missing(members: usize, gone: &[usize]) -> Vec<bool> {
    (0..members).map(|s| gone.contains(&s)).collect()
}

/// Re-assembles crash `images` with member `missing` left out and checks the whole array against `model`. The
/// missing member's blocks that were being written at the power loss may come back as neither old nor new (the
/// partial parity log's documented limit); every other block is exact. Returns the blocks forgiven.
pub fn check_with_a_member_missing(
    mut images: Vec<Option<Vec<u8>>>,
    missing: usize,
    model: &mut BlockModel,
    what: &str,
) -> u64 {
    images[missing] = None;
    let (_io, array) =
        assemble_images(images, 0, reference()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read");
    let g = array.geometry();
    let forgive = |block: u64| g.map(block * BLOCK_BYTES as u64, 0).member == missing;
    let (_, forgiven) = model
        .check_after_crash_forgiving(&all, forgive)
        .unwrap_or_else(|m| panic!("{what}: {m}"));
    forgiven
}

/// Members that share read-only base images and keep their own writes in a page overlay: many arrays can start
/// from one filled image set without copying megabytes per assembly.
pub struct CowMembers {
    base: Arc<Vec<Option<Vec<u8>>>>,
    present: Vec<bool>,
    overlay: Vec<std::sync::Mutex<std::collections::HashMap<u64, Box<[u8]>>>>,
}

impl CowMembers {
    /// `base` with the slots in `gone` missing.
    pub fn new(base: Arc<Vec<Option<Vec<u8>>>>, gone: &[usize]) -> CowMembers {
        let present = (0..base.len())
            .map(|s| base[s].is_some() && !gone.contains(&s))
            .collect();
        let overlay = (0..base.len()).map(|_| Default::default()).collect();
        CowMembers {
            base,
            present,
            overlay,
        }
    }

    /// The member's bytes now (None if missing).
    pub fn image(&self, slot: usize) -> Option<Vec<u8>> {
        if !self.present[slot] {
            return None;
        }
        let mut bytes = self.base[slot].clone()?;
        let overlay = self.overlay[slot].lock().unwrap();
        for (page, data) in overlay.iter() {
            let at = (*page * 4096) as usize;
            bytes[at..at + 4096].copy_from_slice(data);
        }
        Some(bytes)
    }

    pub fn images(&self) -> Vec<Option<Vec<u8>>> {
        (0..self.base.len()).map(|s| self.image(s)).collect()
    }

    fn run(&self, slot: usize, op: &mut paraid_engine::IoOp<'_>) -> std::io::Result<()> {
        use paraid_engine::IoOp;
        let missing = || std::io::Error::new(std::io::ErrorKind::NotFound, "member missing");
        if slot >= self.present.len() || !self.present[slot] {
            return Err(missing());
        }
        let base = self.base[slot].as_ref().ok_or_else(missing)?;
        let mut overlay = self.overlay[slot].lock().unwrap();
        let check = |offset: u64, len: u64| {
            if !offset.is_multiple_of(4096)
                || !len.is_multiple_of(4096)
                || offset + len > base.len() as u64
            {
                Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "unaligned or beyond the end",
                ))
            } else {
                Ok(())
            }
        };
        match op {
            IoOp::Read { offset_bytes, buf } => {
                check(*offset_bytes, buf.len() as u64)?;
                for (i, out) in buf.chunks_mut(4096).enumerate() {
                    let page = *offset_bytes / 4096 + i as u64;
                    match overlay.get(&page) {
                        Some(p) => out.copy_from_slice(p),
                        None => {
                            let at = (page * 4096) as usize;
                            out.copy_from_slice(&base[at..at + 4096]);
                        }
                    }
                }
            }
            IoOp::Write {
                offset_bytes, buf, ..
            } => {
                check(*offset_bytes, buf.len() as u64)?;
                for (i, data) in buf.chunks(4096).enumerate() {
                    overlay.insert(*offset_bytes / 4096 + i as u64, data.into());
                }
            }
            IoOp::Flush => {}
            IoOp::Discard {
                offset_bytes,
                len_bytes,
            } => {
                check(*offset_bytes, *len_bytes)?;
                for page in *offset_bytes / 4096..(*offset_bytes + *len_bytes) / 4096 {
                    overlay.insert(page, vec![0u8; 4096].into());
                }
            }
        }
        Ok(())
    }
}

impl paraid_engine::MemberIo for CowMembers {
    fn slots(&self) -> usize {
        self.base.len()
    }

    fn label(&self, slot: usize) -> String {
        format!("cow{slot}")
    }

    fn present(&self, slot: usize) -> bool {
        slot < self.present.len() && self.present[slot]
    }

    fn size_bytes(&self, slot: usize) -> u64 {
        if self.present(slot) {
            self.base[slot].as_ref().map_or(0, |b| b.len() as u64)
        } else {
            0
        }
    }

    fn discard_deallocates(&self, _slot: usize) -> bool {
        true
    }

    fn submit(&self, reqs: &mut [paraid_engine::IoReq<'_>]) {
        for req in reqs.iter_mut() {
            req.result = self.run(req.slot, &mut req.op);
        }
    }
}

pub type CowStack = FaultyMembers<CowMembers>;

/// Assembles `base` without the slots in `gone`, copy-on-write.
pub fn assemble_cow(
    base: &Arc<Vec<Option<Vec<u8>>>>,
    gone: &[usize],
    seed: u64,
    parity: Arc<dyn Backend>,
) -> Result<(Arc<CowStack>, Array), EngineError> {
    let io = Arc::new(FaultyMembers::new(
        CowMembers::new(base.clone(), gone),
        seed,
    ));
    let array = assemble_io(io.clone(), AssembleOptions::new(parity))?;
    Ok((io, array))
}

/// A filled, cleanly stopped array: its member images (shared) and contents.
pub struct Filled {
    pub base: Arc<Vec<Option<Vec<u8>>>>,
    pub contents: Vec<u8>,
    pub geometry: Geometry,
    pub data_offset_bytes: u64,
}

impl Filled {
    pub fn new(level: Level, members: usize, chunk_bytes: u64, rows: u64, seed: u64) -> Filled {
        let (io, array) = new_array(level, members, chunk_bytes, rows, seed, reference());
        let mut rng = SplitMix64::new(seed ^ 0xF111);
        let mut model = fill(&array, &mut rng);
        for _ in 0..16 {
            assert!(random_write(&array, &mut model, &mut rng), "write");
        }
        let geometry = array.geometry();
        let data_offset_bytes = array.data_offset_bytes();
        array.stop().expect("stop");
        Filled {
            base: Arc::new(images(&io)),
            contents: model.settled_bytes().expect("every write acknowledged"),
            geometry,
            data_offset_bytes,
        }
    }

    /// A model whose every block holds the filled contents, durably.
    pub fn model(&self) -> BlockModel {
        let mut model = BlockModel::new(self.contents.len() as u64);
        model.write(0, &self.contents, WriteOutcome::Acked { durable: true });
        model
    }
}

/// Holds back every I/O `scope` matches by `ms` milliseconds (the submitting thread sleeps): how a test places
/// one request's member I/O after another's.
pub fn hold_back(io: &Stack, scope: Scope, ms: u64) {
    io.add(
        scope,
        Fault::Delay {
            delay: std::time::Duration::from_millis(ms),
            one_in: 1,
            sleep: true,
        },
    );
}

/// Compares a whole-array read with `expected` and names the first differing block.
pub fn first_wrong_block(got: &[u8], expected: &[u8]) -> Option<usize> {
    got.chunks(BLOCK_BYTES)
        .zip(expected.chunks(BLOCK_BYTES))
        .position(|(a, b)| a != b)
}

/// Every member write of `io` takes `ms` longer (its submitting thread sleeps): held writes stay held a while.
pub fn slow_writes(io: &Stack, ms: u64) -> paraid_engine::fault::RuleId {
    io.add(
        Scope::all().ops(OpKinds::WRITE),
        Fault::Delay {
            delay: std::time::Duration::from_millis(ms),
            one_in: 1,
            sleep: true,
        },
    )
}

/// `len` random bytes.
pub fn random_bytes(rng: &mut SplitMix64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    data
}

/// A page-aligned extent of 1-4 pages anywhere in the array.
pub fn small_extent(rng: &mut SplitMix64, array_bytes: u64) -> (u64, usize) {
    let pages = array_bytes / 4096;
    let len = 1 + rng.below(4).min(pages - 1);
    let first = rng.below(pages - len + 1);
    (first * 4096, (len * 4096) as usize)
}
