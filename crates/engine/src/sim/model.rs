//! What the array may return, per 4 KiB block: the oracle of the simulator and the fault tests.
//!
//! Every block keeps two sets of allowed contents:
//! * `now`: what a read may return at this moment: the last acknowledged value, plus the values of writes that
//!   failed (their outcome is unknown: old or new may be on the members). A successful read narrows the set to
//!   what was read (reading a value back settles it; a later read returning an older one is a violation).
//! * `crash`: what the block may hold after a power loss: the value made durable last (by a completed flush or
//!   FUA write) and every value written since, acknowledged or not.
//!
//! `now` is always a subset of `crash`. Values are whole blocks: a write that covers part of a block patches
//! every allowed value of that block.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

pub const BLOCK_BYTES: usize = 4096;

type Value = Arc<[u8]>;
/// Part of one write inside one block: the range in the block, and the bytes.
type InBlockPart<'a> = (Range<usize>, &'a [u8]);

#[derive(Clone)]
struct Block {
    now: Vec<Value>,
    crash: Vec<Value>,
    /// Written since the last flush or FUA write covering it, even if with the value it held (a crash may then
    /// catch the write in flight although `crash` holds one value).
    in_flight: bool,
}

/// How an array write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Acknowledged; `durable` when it was FUA (or followed by its own flush).
    Acked { durable: bool },
    /// Failed: each touched block holds the old or the new value.
    Failed,
}

/// A read that returned what no allowed value holds.
#[derive(Debug, Clone)]
pub struct Mismatch {
    pub block: u64,
    pub offset_bytes: u64,
    /// Bytes of the block compared.
    pub len_bytes: usize,
    /// Allowed values at the time.
    pub allowed: usize,
    /// What the bytes read look like.
    pub looks_like: &'static str,
    /// First byte (offset in the block) where the read differs from the newest allowed value.
    pub first_diff: usize,
    pub got_hash: u64,
    pub allowed_hashes: Vec<u64>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block {} (array bytes {}..{}): read {} ({:016x}), none of the {} allowed values {:016x?}; \
             first differing byte +{} of the newest",
            self.block,
            self.offset_bytes,
            self.offset_bytes + self.len_bytes as u64,
            self.looks_like,
            self.got_hash,
            self.allowed,
            self.allowed_hashes,
            self.first_diff
        )
    }
}

/// FNV-1a: a short name for block contents in messages.
pub fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[derive(Clone)]
pub struct BlockModel {
    blocks: Vec<Block>,
}

fn push_unique(set: &mut Vec<Value>, v: Value) {
    if !set.iter().any(|x| **x == *v) {
        set.push(v);
    }
}

impl BlockModel {
    /// A model of `array_bytes` (a multiple of 4096) of zeros, durable.
    pub fn new(array_bytes: u64) -> BlockModel {
        assert_eq!(array_bytes % BLOCK_BYTES as u64, 0);
        let zero: Value = Arc::from(vec![0u8; BLOCK_BYTES]);
        let block = Block {
            now: vec![zero.clone()],
            crash: vec![zero],
            in_flight: false,
        };
        BlockModel {
            blocks: vec![block; (array_bytes / BLOCK_BYTES as u64) as usize],
        }
    }

    pub fn array_bytes(&self) -> u64 {
        (self.blocks.len() * BLOCK_BYTES) as u64
    }

    /// Blocks a crash may not change: one value allowed now and after a crash (flushed or FUA-written since their
    /// last write).
    pub fn durable_blocks(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| b.crash.len() == 1 && b.now.len() == 1)
            .count()
    }

    /// Blocks whose contents are not settled (more than one value allowed now).
    pub fn unsettled_blocks(&self) -> usize {
        self.blocks.iter().filter(|b| b.now.len() > 1).count()
    }

    /// Splits `offset..offset+len` into (block, in-block range, range in the request).
    fn spans(
        offset_bytes: u64,
        len: usize,
    ) -> impl Iterator<Item = (usize, std::ops::Range<usize>, std::ops::Range<usize>)> {
        let end = offset_bytes + len as u64;
        let bb = BLOCK_BYTES as u64;
        let first = offset_bytes / bb;
        let last = if len == 0 { first } else { (end - 1) / bb + 1 };
        (first..last).map(move |b| {
            let lo = (b * bb).max(offset_bytes);
            let hi = ((b + 1) * bb).min(end);
            (
                b as usize,
                (lo - b * bb) as usize..(hi - b * bb) as usize,
                (lo - offset_bytes) as usize..(hi - offset_bytes) as usize,
            )
        })
    }

    /// Records an array write of `data` at `offset_bytes`.
    pub fn write(&mut self, offset_bytes: u64, data: &[u8], outcome: WriteOutcome) {
        for (b, in_block, in_req) in BlockModel::spans(offset_bytes, data.len()) {
            let block = &mut self.blocks[b];
            let mut patched: Vec<Value> = Vec::with_capacity(block.now.len());
            for v in &block.now {
                let mut bytes = v.to_vec();
                bytes[in_block.clone()].copy_from_slice(&data[in_req.clone()]);
                push_unique(&mut patched, Arc::from(bytes));
            }
            match outcome {
                WriteOutcome::Acked { durable: true } => {
                    block.crash = patched.clone();
                    block.now = patched;
                    block.in_flight = false;
                }
                WriteOutcome::Acked { durable: false } => {
                    for v in &patched {
                        push_unique(&mut block.crash, v.clone());
                    }
                    block.now = patched;
                    block.in_flight = true;
                }
                WriteOutcome::Failed => {
                    block.in_flight = true;
                    for v in patched {
                        push_unique(&mut block.crash, v.clone());
                        push_unique(&mut block.now, v);
                    }
                }
            }
        }
    }

    /// Writes that were in flight together, not made durable by a flush since `before` (the model when they were
    /// issued), touching disjoint bytes of shared blocks: the engine may have written such a block's page for any
    /// of them first, so a crash may leave any subset of their bytes over any value the block could hold after a
    /// crash at `before`. (`write` in completion order knows only the subsets a sequential order leaves: a later
    /// write's page carries the earlier one's bytes.) Blocks one write touches alone are left as they are.
    pub fn written_together(&mut self, before: &BlockModel, writes: &[(u64, &[u8])]) {
        // Per block: the in-block range and bytes of each write that touches it.
        let mut parts: BTreeMap<usize, Vec<InBlockPart>> = BTreeMap::new();
        for (offset_bytes, data) in writes {
            for (b, in_block, in_req) in BlockModel::spans(*offset_bytes, data.len()) {
                parts.entry(b).or_default().push((in_block, &data[in_req]));
            }
        }
        for (b, parts) in parts.into_iter().filter(|(_, p)| p.len() > 1) {
            let mut values = before.blocks[b].crash.clone();
            for (range, part) in parts {
                for v in values.clone() {
                    let mut bytes = v.to_vec();
                    bytes[range.clone()].copy_from_slice(part);
                    push_unique(&mut values, Arc::from(bytes));
                }
            }
            let block = &mut self.blocks[b];
            for v in values {
                push_unique(&mut block.crash, v);
            }
            block.in_flight = true;
        }
    }

    /// A flush completed: everything allowed now is what a crash may leave.
    pub fn flushed(&mut self) {
        for block in &mut self.blocks {
            block.crash = block.now.clone();
            block.in_flight = false;
        }
    }

    fn mismatch(
        b: usize,
        in_block: &std::ops::Range<usize>,
        got: &[u8],
        allowed: &[Value],
        durable: &[Value],
    ) -> Mismatch {
        let newest = allowed.last().expect("a block always has an allowed value");
        let expect = &newest[in_block.clone()];
        let first_diff = got
            .iter()
            .zip(expect)
            .position(|(a, b)| a != b)
            .unwrap_or(0)
            + in_block.start;
        let looks_like = if got.iter().all(|x| *x == 0) {
            "zeros"
        } else if durable.iter().any(|v| &v[in_block.clone()] == got) {
            "an older value (lost or stale data)"
        } else {
            "bytes never written there (garbage)"
        };
        Mismatch {
            block: b as u64,
            offset_bytes: (b * BLOCK_BYTES + in_block.start) as u64,
            len_bytes: in_block.len(),
            allowed: allowed.len(),
            looks_like,
            first_diff,
            got_hash: hash(got),
            allowed_hashes: allowed.iter().map(|v| hash(&v[in_block.clone()])).collect(),
        }
    }

    /// Checks a successful read of `got` at `offset_bytes` and settles what it read.
    pub fn check_read(&mut self, offset_bytes: u64, got: &[u8]) -> Result<u64, Mismatch> {
        let mut blocks = 0;
        for (b, in_block, in_req) in BlockModel::spans(offset_bytes, got.len()) {
            let block = &mut self.blocks[b];
            let part = &got[in_req];
            let keep: Vec<Value> = block
                .now
                .iter()
                .filter(|v| &v[in_block.clone()] == part)
                .cloned()
                .collect();
            if keep.is_empty() {
                return Err(BlockModel::mismatch(
                    b,
                    &in_block,
                    part,
                    &block.now,
                    &block.crash,
                ));
            }
            block.now = keep;
            blocks += 1;
        }
        Ok(blocks)
    }

    /// Checks a read of the whole array after a crash and re-assembly: every block must hold a value a crash may
    /// leave; that value is then settled and durable (the members hold nothing else).
    pub fn check_after_crash(&mut self, got: &[u8]) -> Result<u64, Mismatch> {
        assert_eq!(got.len() as u64, self.array_bytes());
        for (b, block) in self.blocks.iter_mut().enumerate() {
            let part = &got[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
            match block.crash.iter().find(|v| &v[..] == part) {
                Some(v) => {
                    let v = v.clone();
                    block.now = vec![v.clone()];
                    block.crash = vec![v];
                    block.in_flight = false;
                }
                None => {
                    return Err(BlockModel::mismatch(
                        b,
                        &(0..BLOCK_BYTES),
                        part,
                        &block.crash,
                        &[],
                    ))
                }
            }
        }
        Ok(self.blocks.len() as u64)
    }

    /// As `check_after_crash`, but a block for which `forgive(block)` holds and which was written since the last
    /// flush (more than one value allowed, or written with the value it held) may hold anything: the partial parity log's limit for the chunk of a
    /// member missing at restart that a write in flight was changing (its new data was never logged). Returns the
    /// blocks verified and the blocks forgiven; both are settled on what was read.
    pub fn check_after_crash_forgiving(
        &mut self,
        got: &[u8],
        forgive: impl Fn(u64) -> bool,
    ) -> Result<(u64, u64), Mismatch> {
        assert_eq!(got.len() as u64, self.array_bytes());
        let mut forgiven = 0;
        for (b, block) in self.blocks.iter_mut().enumerate() {
            let part = &got[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
            let value: Value = match block.crash.iter().find(|v| &v[..] == part) {
                Some(v) => v.clone(),
                None if (block.crash.len() > 1 || block.in_flight) && forgive(b as u64) => {
                    forgiven += 1;
                    Arc::from(part.to_vec())
                }
                None => {
                    return Err(BlockModel::mismatch(
                        b,
                        &(0..BLOCK_BYTES),
                        part,
                        &block.crash,
                        &[],
                    ))
                }
            };
            block.now = vec![value.clone()];
            block.crash = vec![value];
            block.in_flight = false;
        }
        Ok((self.blocks.len() as u64, forgiven))
    }

    /// Checks a read of the whole array after a kill of the process (or a clean stop) and re-assembly: every block
    /// must hold a value a read could have returned just before (`now`: the last acknowledged value, or one of a
    /// write that failed or was cut short), not merely one a power loss may leave: a kill loses no member write
    /// that completed, so nothing answered may be lost, flushed or not. A block for which `forgive(block)` holds and
    /// which was written since the last flush may hold anything, as in `check_after_crash_forgiving`: the partial
    /// parity log's limit for a member missing at restart, whose recovery treats an unflushed write as one in
    /// flight (a power loss may have dropped it), kill or not. Returns the blocks verified and forgiven; both are
    /// settled on what was read.
    pub fn check_after_kill_forgiving(
        &mut self,
        got: &[u8],
        forgive: impl Fn(u64) -> bool,
    ) -> Result<(u64, u64), Mismatch> {
        assert_eq!(got.len() as u64, self.array_bytes());
        let mut forgiven = 0;
        for (b, block) in self.blocks.iter_mut().enumerate() {
            let part = &got[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
            let value: Value = match block.now.iter().find(|v| &v[..] == part) {
                Some(v) => v.clone(),
                None if (block.now.len() > 1 || block.in_flight) && forgive(b as u64) => {
                    forgiven += 1;
                    Arc::from(part.to_vec())
                }
                None => {
                    return Err(BlockModel::mismatch(
                        b,
                        &(0..BLOCK_BYTES),
                        part,
                        &block.now,
                        &block.crash,
                    ))
                }
            };
            block.now = vec![value.clone()];
            block.crash = vec![value];
            block.in_flight = false;
        }
        Ok((self.blocks.len() as u64, forgiven))
    }

    /// The array contents when every block is settled.
    pub fn settled_bytes(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(self.blocks.len() * BLOCK_BYTES);
        for block in &self.blocks {
            if block.now.len() != 1 {
                return None;
            }
            out.extend_from_slice(&block.now[0]);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledged_write_is_the_only_value() {
        let mut m = BlockModel::new(3 * 4096);
        m.write(100, &[7u8; 5000], WriteOutcome::Acked { durable: false });
        let mut expect = vec![0u8; 3 * 4096];
        expect[100..5100].fill(7);
        assert_eq!(m.check_read(0, &expect).expect("matches"), 3);
        expect[200] = 0;
        let err = m
            .check_read(0, &expect)
            .expect_err("old byte inside the write");
        assert_eq!((err.block, err.first_diff), (0, 200));
    }

    #[test]
    fn failed_write_allows_old_or_new_until_read() {
        let mut m = BlockModel::new(4096);
        m.write(0, &[1u8; 4096], WriteOutcome::Acked { durable: true });
        m.write(0, &[2u8; 4096], WriteOutcome::Failed);
        m.check_read(0, &[1u8; 4096]).expect("old allowed");
        // Settled on the old value: the new one may no longer appear.
        assert!(m.check_read(0, &[2u8; 4096]).is_err());
    }

    #[test]
    fn writes_in_flight_together_may_leave_any_subset_in_a_shared_block() {
        let mut m = BlockModel::new(4096);
        let before = m.clone();
        let (a, c) = ([1u8; 100], [3u8; 100]);
        m.write(0, &a, WriteOutcome::Acked { durable: false });
        m.write(200, &c, WriteOutcome::Acked { durable: false });
        let mut only_c = vec![0u8; 4096];
        only_c[200..300].copy_from_slice(&c);
        // In completion order alone, "c landed, a did not" is refused: a's page write would precede c's.
        assert!(m.clone().check_after_crash(&only_c).is_err());
        m.written_together(&before, &[(0, &a[..]), (200, &c[..])]);
        assert!(m.clone().check_after_crash(&only_c).is_ok());
        let mut neither_nor = vec![0u8; 4096];
        neither_nor[200] = 9;
        assert!(m.check_after_crash(&neither_nor).is_err());
    }

    #[test]
    fn crash_allows_durable_or_newer_never_older() {
        let mut m = BlockModel::new(4096);
        m.write(0, &[1u8; 4096], WriteOutcome::Acked { durable: false });
        m.flushed();
        m.write(0, &[2u8; 4096], WriteOutcome::Acked { durable: false });
        m.write(0, &[3u8; 4096], WriteOutcome::Acked { durable: false });
        for v in [1u8, 2, 3] {
            let mut copy = BlockModel {
                blocks: m.blocks.clone(),
            };
            copy.check_after_crash(&[v; 4096])
                .expect("durable or newer");
        }
        let err = m
            .check_after_crash(&[0u8; 4096])
            .expect_err("older than durable");
        assert_eq!(err.looks_like, "zeros");
        m.write(0, &[4u8; 4096], WriteOutcome::Acked { durable: true });
        assert!(
            m.check_after_crash(&[3u8; 4096]).is_err(),
            "FUA write is durable"
        );
    }

    #[test]
    fn a_kill_loses_nothing_answered_flushed_or_not() {
        let mut m = BlockModel::new(2 * 4096);
        m.write(0, &[1u8; 8192], WriteOutcome::Acked { durable: true });
        m.write(0, &[2u8; 8192], WriteOutcome::Acked { durable: false });
        // Block 1's write was cut short by the kill: old or new.
        m.write(4096, &[3u8; 4096], WriteOutcome::Failed);
        let mut read = vec![2u8; 8192];
        read[4096..].fill(3);
        m.clone()
            .check_after_kill_forgiving(&read, |_| false)
            .expect("answered, and the cut write's new value");
        read[4096..].fill(2);
        m.clone()
            .check_after_kill_forgiving(&read, |_| false)
            .expect("the cut write's old value");
        // The flushed value a power loss could leave is not what a kill may leave.
        read[..4096].fill(1);
        let err = m
            .clone()
            .check_after_kill_forgiving(&read, |_| false)
            .expect_err("an answered write lost");
        assert_eq!(
            (err.block, err.looks_like),
            (0, "an older value (lost or stale data)")
        );
        assert!(
            m.clone().check_after_crash(&read).is_ok(),
            "a power loss may"
        );
        // Garbage is forgiven only in a block written since the last flush, and only where asked (a member
        // missing at restart).
        let mut garbage = vec![2u8; 8192];
        garbage[4096..].fill(9);
        assert!(m
            .clone()
            .check_after_kill_forgiving(&garbage, |_| false)
            .is_err());
        assert_eq!(
            m.clone()
                .check_after_kill_forgiving(&garbage, |b| b == 1)
                .map_err(|e| e.block),
            Ok((2, 1))
        );
        // Block 0 answered, unflushed: forgiven on a missing member; once flushed, not.
        let mut garbage = vec![9u8; 8192];
        garbage[4096..].fill(3);
        assert_eq!(
            m.clone()
                .check_after_kill_forgiving(&garbage, |b| b == 0)
                .map_err(|e| e.block),
            Ok((2, 1))
        );
        m.flushed();
        assert_eq!(
            m.check_after_kill_forgiving(&garbage, |b| b == 0)
                .map_err(|e| e.block),
            Err(0),
            "flushed: nothing to forgive"
        );
    }
}
