//! `Array::allocation` (NBD_CMD_BLOCK_STATUS) on sparse member files, every level: what is reported as a hole
//! reads as zeros, what was written is never reported as a hole, a whole-stripe discard makes a hole again, and a
//! chunk whose member is out is a hole only where the cells its read is solved from are (degraded reads check it).

mod common;

use std::path::PathBuf;

use common::{reference, Rng, TempDir};
use paraid_engine::layout::Level;
use paraid_engine::{assemble, AllocationExtent, Array, AssembleOptions};

const MIB: u64 = 1 << 20;
const CHUNK_BYTES: u64 = 64 << 10;

fn create_array(dir: &TempDir, level: Level, members: usize) -> (Array, Vec<PathBuf>) {
    let paths = dir.create_array(level, members, CHUNK_BYTES, 6 * MIB);
    let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble");
    (array, paths)
}

/// The extents as (offset, length, hole) from `offset_bytes`, checking that they are non-empty and in range.
fn mapped(array: &Array, offset_bytes: u64, len_bytes: u64) -> Vec<(u64, u64, bool)> {
    let extents = array
        .allocation(offset_bytes, len_bytes)
        .expect("allocation");
    assert!(!extents.is_empty(), "no extent for {len_bytes} bytes");
    let mut at = offset_bytes;
    let mut out = Vec::new();
    for AllocationExtent {
        len_bytes: len,
        hole,
    } in extents
    {
        assert!(len > 0, "an empty extent");
        out.push((at, len, hole));
        at += len;
    }
    assert!(at <= offset_bytes + len_bytes, "extents run past the range");
    out
}

/// Every hole reads as zeros; every byte written since the last whole-stripe discard lies outside the holes.
fn check_map(array: &Array, written: &[(u64, u64)], what: &str) -> (u64, u64) {
    let size = array.size_bytes();
    let map = mapped(array, 0, size);
    let covered: u64 = map.iter().map(|(_, len, _)| len).sum();
    assert_eq!(covered, size, "{what}: the map covers the whole array");
    let mut contents = vec![0u8; size as usize];
    array.read(0, &mut contents).expect("read");
    let mut hole_bytes = 0;
    for (at, len, hole) in &map {
        if !hole {
            continue;
        }
        hole_bytes += len;
        let range = *at as usize..(*at + *len) as usize;
        assert!(
            contents[range].iter().all(|b| *b == 0),
            "{what}: a hole at {at} (+{len}) reads nonzero bytes"
        );
        for (w_at, w_len) in written {
            assert!(
                *w_at + *w_len <= *at || *w_at >= *at + *len,
                "{what}: written bytes {w_at} (+{w_len}) reported inside the hole {at} (+{len})"
            );
        }
    }
    (hole_bytes, size - hole_bytes)
}

#[test]
fn holes_read_as_zeros_and_writes_are_never_holes_on_every_level() {
    for (level, members) in [
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid10, 3),
    ] {
        let dir = TempDir::new("allocation");
        let (array, _paths) = create_array(&dir, level, members);
        let size = array.size_bytes();
        let what = format!("{level} of {members}");

        // Freshly created: the members were discarded, the whole array is one hole.
        assert_eq!(mapped(&array, 0, size), vec![(0, size, true)], "{what}");

        // Writes of any size at any offset, some unaligned.
        let mut rng = Rng::new(level as u64 + 7);
        let mut written = Vec::new();
        for _ in 0..12 {
            let len = 1 + rng.below(3 * CHUNK_BYTES);
            let at = rng.below(size - len);
            let mut data = vec![0u8; len as usize];
            rng.fill(&mut data);
            array.write(at, &data, false).expect("write");
            written.push((at, len));
        }
        array.flush().expect("flush");
        let (holes, data) = check_map(&array, &written, &what);
        assert!(
            holes > 0 && data > 0,
            "{what}: {holes} hole bytes, {data} data"
        );

        // A sub-range, unaligned at both ends, describes the same bytes the same way.
        let (from, len) = (CHUNK_BYTES / 3, size / 2 + 4097);
        let whole = mapped(&array, 0, size);
        for (at, piece_len, hole) in mapped(&array, from, len) {
            let same = whole.iter().any(|(w_at, w_len, w_hole)| {
                *w_hole == hole && *w_at <= at && at + piece_len <= w_at + w_len
            });
            assert!(same, "{what}: sub-range extent {at} (+{piece_len}) hole {hole} disagrees with the whole map");
        }

        // A discard of whole stripes deallocates them: a hole again.
        let stripe = array.geometry().stripe_bytes();
        let (w_at, w_len) = written[0];
        let discard_at = w_at / stripe * stripe;
        let discard_len = ((w_at + w_len).div_ceil(stripe) * stripe).min(size) - discard_at;
        array.discard(discard_at, discard_len).expect("discard");
        array.flush().expect("flush");
        let still: Vec<(u64, u64)> = written
            .iter()
            .copied()
            .filter(|(at, len)| at + len <= discard_at || *at >= discard_at + discard_len)
            .collect();
        check_map(&array, &still, &format!("{what} after a discard"));
        let after = mapped(&array, discard_at, discard_len);
        assert_eq!(
            after,
            vec![(discard_at, discard_len, true)],
            "{what}: the discarded stripes are a hole"
        );

        // A member out: a chunk it holds is a hole where the cells its read depends on are (the row's other
        // members for RAID5/6, the other copy for RAID1/10), and every hole still reads as zeros, which
        // `check_map` reads back through the degraded read path.
        if level != Level::Raid0 {
            array.fail_member(1).expect("fail a member");
            check_map(&array, &still, &format!("{what}, member 1 out"));
            let g = array.geometry();
            let on_member_1 =
                |chunk: u64| (0..g.copies()).any(|copy| g.chunk_copy(chunk, copy).member == 1);
            let holes_on_member_1 = mapped(&array, 0, size)
                .iter()
                .filter(|(_, _, hole)| *hole)
                .flat_map(|(at, len, _)| (at / CHUNK_BYTES)..(at + len) / CHUNK_BYTES)
                .filter(|&chunk| on_member_1(chunk))
                .count();
            assert!(
                holes_on_member_1 > 0,
                "{what}: no chunk of the failed member reported as a hole"
            );
        }
    }
}

#[test]
fn a_large_range_is_described_in_part_and_never_beyond() {
    let dir = TempDir::new("allocation-large");
    // 4 KiB chunks: the array's 48 MiB hold more chunks than one call describes.
    let paths = dir.create_array(Level::Raid5, 4, 4096, 16 * MIB);
    let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble");
    let size = array.size_bytes();
    // Every other chunk written: no two neighbours merge, so the answer is cut by the piece limit.
    let data = vec![0x5au8; 4096];
    for chunk in (0..size / 4096).step_by(2) {
        array.write(chunk * 4096, &data, false).expect("write");
    }
    let map = mapped(&array, 0, size);
    let covered: u64 = map.iter().map(|(_, len, _)| len).sum();
    assert!(covered > 0 && covered < size, "covered {covered} of {size}");
    assert!(map
        .iter()
        .step_by(2)
        .all(|(_, len, hole)| !hole && *len == 4096));
    assert!(map
        .iter()
        .skip(1)
        .step_by(2)
        .all(|(_, len, hole)| *hole && *len == 4096));
    // The rest is described when asked from where the answer ended.
    let rest = mapped(&array, covered, size - covered);
    assert_eq!(rest[0].0, covered);
}

/// Inside a chunk, holes after data are found too: a page written in the middle of a fresh chunk is described as
/// hole, data, hole (not as a leading hole and data to the chunk's end), on every level, healthy and with a
/// member out (RAID5/6 then consult every cell of the row: the written page's parity makes it data there too).
#[test]
fn a_page_in_the_middle_of_a_chunk_has_holes_on_both_sides() {
    for (level, members) in [
        (Level::Raid0, 2),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
    ] {
        let dir = TempDir::new("allocation-middle");
        let (array, _paths) = create_array(&dir, level, members);
        let page = vec![0x77u8; 4096];
        let at = 3 * CHUNK_BYTES + 32 * 1024;
        array.write(at, &page, false).expect("write");
        array.write(at + 12 * 1024, &page, false).expect("write");
        let map = mapped(&array, 3 * CHUNK_BYTES, CHUNK_BYTES);
        let expected = vec![
            (3 * CHUNK_BYTES, 32 * 1024, true),
            (at, 4096, false),
            (at + 4096, 8192, true),
            (at + 12 * 1024, 4096, false),
            (at + 16 * 1024, 16 * 1024, true),
        ];
        assert_eq!(map, expected, "{level}");
        // Asked from inside a hole or inside the data, the same boundaries.
        assert_eq!(
            mapped(&array, at + 100, 8192),
            vec![(at + 100, 4096 - 100, false), (at + 4096, 4196, true)],
            "{level}"
        );
        if level.has_parity() {
            // Slot of chunk 3 out: its bytes are solved from the row, which holds the page's parity.
            let chunk_member = array.geometry().chunk_copy(3, 0).member;
            array.fail_member(chunk_member).expect("fail");
            let map = mapped(&array, 3 * CHUNK_BYTES, CHUNK_BYTES);
            assert!(
                map.iter().any(|(_, _, hole)| *hole) && map.iter().any(|(_, _, hole)| !hole),
                "{level} degraded: {map:?}"
            );
            for (offset, len, hole) in map {
                let mut bytes = vec![1u8; len as usize];
                array.read(offset, &mut bytes).expect("read");
                if hole {
                    assert!(
                        bytes.iter().all(|b| *b == 0),
                        "{level} degraded: a hole at {offset} holds data"
                    );
                }
            }
        }
    }
}
