//! Reads into page-aligned buffers, where whole-page pieces land in the caller's buffer without a bounce copy,
//! against reads of the same ranges into misaligned buffers (the bounce path): both must return the bytes
//! written, healthy, degraded, and when a direct read fails and the piece is rebuilt from the rest of its stripe.
//! The same for reads served together (`Array::read_many`), whose direct pieces go out as one batch.

mod common;

use std::sync::Arc;

use common::{mem_array, reference, Rng};
use paraid_engine::buf::AlignedBuf;
use paraid_engine::fault::FaultyMembers;
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{assemble_io, create_io, Array, AssembleOptions, MemMembers};

const PAGE: u64 = 4096;

/// Reads `len` bytes at `offset` into a buffer starting `misalign` bytes after a page boundary.
fn read_at(array: &Array, offset: u64, len: usize, misalign: usize) -> Vec<u8> {
    let mut backing = AlignedBuf::zeroed(len + misalign);
    let buf = &mut backing[misalign..misalign + len];
    buf.fill(0xee); // stale bytes must all be overwritten
    array.read(offset, buf).expect("read");
    buf.to_vec()
}

/// Page-aligned and odd ranges, each read in place (aligned buffer) and through the bounce path.
fn check_reads(array: &Array, model: &[u8], seed: u64, what: &str) {
    let size = model.len() as u64;
    let chunk = array.geometry().chunk_bytes;
    let mut rng = Rng::new(seed);
    for i in 0..80 {
        let (offset, len) = if i % 2 == 0 {
            // Whole pages, up to a few chunks: the in-place case.
            let pages = size / PAGE;
            let first = rng.below(pages);
            let count = 1 + rng.below((pages - first).min(3 * chunk / PAGE));
            (first * PAGE, (count * PAGE) as usize)
        } else {
            let offset = rng.below(size - 1);
            (
                offset,
                1 + rng.below((size - offset).min(2 * chunk)) as usize,
            )
        };
        let want = &model[offset as usize..offset as usize + len];
        for misalign in [0usize, 512, 1] {
            let got = read_at(array, offset, len, misalign);
            assert!(
                got == want,
                "{what}: read of {len} bytes at {offset} into a buffer {misalign} bytes past a page differs"
            );
        }
    }
}

/// Batches of 1 to 12 reads through `Array::read_many`: whole pages at page-aligned places (served together) and
/// odd ranges or misaligned places (served one by one), each checked against the model; now and then a read past
/// the end, which fails alone.
fn check_read_many(array: &Array, model: &[u8], seed: u64, what: &str) {
    let size = model.len() as u64;
    let chunk = array.geometry().chunk_bytes;
    let mut rng = Rng::new(seed);
    for round in 0..40 {
        let count = 1 + rng.below(12) as usize;
        let ranges: Vec<(u64, usize, usize)> = (0..count)
            .map(|_| {
                if rng.below(4) > 0 {
                    let pages = size / PAGE;
                    let first = rng.below(pages);
                    let n = 1 + rng.below((pages - first).min(2 * chunk / PAGE));
                    (first * PAGE, (n * PAGE) as usize, 0)
                } else {
                    let offset = rng.below(size - 1);
                    let len = 1 + rng.below((size - offset).min(chunk)) as usize;
                    (offset, len, [0usize, 512, 1][rng.below(3) as usize])
                }
            })
            .collect();
        let past_end = round % 10 == 9;
        // Each read's room starts on a page, then `misalign` bytes in.
        let rooms: Vec<usize> = ranges
            .iter()
            .map(|&(_, len, misalign)| (len + misalign).next_multiple_of(PAGE as usize))
            .collect();
        let mut backing = AlignedBuf::zeroed(rooms.iter().sum::<usize>() + PAGE as usize);
        backing.fill(0xee);
        let mut rest: &mut [u8] = &mut backing[..];
        let mut reads: Vec<(u64, &mut [u8])> = Vec::new();
        for (&(offset, len, misalign), &room) in ranges.iter().zip(&rooms) {
            let (this, tail) = std::mem::take(&mut rest).split_at_mut(room);
            rest = tail;
            reads.push((offset, &mut this[misalign..misalign + len]));
        }
        if past_end {
            reads.push((size - 100, &mut rest[..PAGE as usize]));
        }
        let results = array.read_many(&mut reads);
        assert_eq!(results.len(), reads.len());
        for (i, ((offset, got), result)) in reads.iter().zip(&results).enumerate() {
            if past_end && i == ranges.len() {
                assert!(result.is_err(), "{what}: a read past the end succeeded");
                continue;
            }
            result
                .as_ref()
                .unwrap_or_else(|e| panic!("{what}: read {i} failed: {e}"));
            let want = &model[*offset as usize..*offset as usize + got.len()];
            assert!(
                *got == want,
                "{what}: round {round}, read {i} of {} bytes at {offset} differs",
                got.len()
            );
        }
    }
}

fn filled(array: &Array, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; array.size_bytes() as usize];
    Rng::new(seed).fill(&mut model);
    array.write(0, &model, false).expect("fill");
    model
}

#[test]
fn aligned_and_misaligned_buffers_read_the_same_bytes() {
    for (level, members) in [
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Raid5, 4),
        (Level::Raid6, 6),
        (Level::Raid10, 4),
    ] {
        for chunk in [4096u64, 16384] {
            let (_io, array) = mem_array(level, members, chunk, 8);
            let model = filled(&array, chunk + members as u64);
            check_reads(
                &array,
                &model,
                7,
                &format!("{level}/{members} chunk {chunk}"),
            );
            check_read_many(
                &array,
                &model,
                8,
                &format!("{level}/{members} chunk {chunk}, read_many"),
            );
        }
    }
}

#[test]
fn degraded_and_failing_members_read_the_same_bytes() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid1, 3)] {
        let chunk = 16384;
        let member_bytes = DEFAULT_DATA_OFFSET_BYTES + 8 * chunk;
        let io = Arc::new(FaultyMembers::new(
            MemMembers::new(members, member_bytes),
            3,
        ));
        create_io(io.as_ref(), level, chunk, "inplace").expect("create_io");
        let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
        let model = filled(&array, 11);
        // Member 1's reads fail from now on: direct reads of its pieces fail (in place too) and are rebuilt or
        // read from another copy, until the errors evict it; then it is simply missing.
        io.fail_slot(1);
        check_read_many(
            &array,
            &model,
            12,
            &format!("{level}/{members}, member 1 failing, read_many"),
        );
        check_reads(
            &array,
            &model,
            13,
            &format!("{level}/{members}, member 1 failing"),
        );
        if level == Level::Raid6 {
            io.fail_slot(4);
            check_read_many(
                &array,
                &model,
                16,
                &format!("{level}/{members}, members 1 and 4 failing, read_many"),
            );
            check_reads(
                &array,
                &model,
                17,
                &format!("{level}/{members}, members 1 and 4 failing"),
            );
        }
    }
}
