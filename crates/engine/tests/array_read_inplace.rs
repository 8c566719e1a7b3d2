//! Reads into page-aligned buffers, where whole-page pieces land in the caller's buffer without a bounce copy,
//! against reads of the same ranges into misaligned buffers (the bounce path): both must return the bytes
//! written, healthy, degraded, and when a direct read fails and the piece is rebuilt from the rest of its stripe.

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
        check_reads(
            &array,
            &model,
            13,
            &format!("{level}/{members}, member 1 failing"),
        );
        if level == Level::Raid6 {
            io.fail_slot(4);
            check_reads(
                &array,
                &model,
                17,
                &format!("{level}/{members}, members 1 and 4 failing"),
            );
        }
    }
}
