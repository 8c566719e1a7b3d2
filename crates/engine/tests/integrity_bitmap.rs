//! The write-intent bitmap: a region's bit is on every member before the first write into it (and costs nothing
//! after), idle regions are cleared lazily, a resync after an unclean stop covers exactly the dirty regions, and
//! a version 1 array is upgraded in place at assembly.

mod integrity_common;

use std::sync::Arc;
use std::time::Duration;

use integrity_common::*;
use paraid_engine::superblock::{Superblock, BITMAP_OFFSET_BYTES, SUPERBLOCK_BYTES};

/// Bit `region` of the bitmap area of every present member (docs/format.md: byte r/8, bit r mod 8).
fn bits_on_members(io: &MemMembers, region: u64) -> Vec<bool> {
    (0..io.slots())
        .filter_map(|s| io.image(s))
        .map(|image| {
            let byte = image[BITMAP_OFFSET_BYTES as usize + (region / 8) as usize];
            byte & (1 << (region % 8)) != 0
        })
        .collect()
}

#[test]
fn first_write_of_a_region_sets_its_bit_on_every_member_then_costs_nothing() {
    let (io, array) = mem_array(Level::Raid5, 4, 4096, 512);
    let report = array.integrity();
    let region_bytes = report.region_bytes;
    assert_eq!(
        report.bitmap_regions, 64,
        "small arrays get at least 64 regions"
    );
    assert_eq!(region_bytes % array.geometry().stripe_bytes(), 0);
    assert_eq!(report.dirty_regions, 0);
    let pages = |a: &Array| a.integrity().bitmap_pages_written;
    array.write(100, &[1u8; 10], false).expect("write");
    assert_eq!(pages(&array), 4, "one bitmap page per member");
    assert_eq!(bits_on_members(&io, 0), vec![true; 4]);
    assert_eq!(bits_on_members(&io, 5), vec![false; 4]);
    for i in 0..20 {
        array
            .write(i * 4096 % region_bytes, &[2u8; 4096], i % 2 == 0)
            .expect("write");
    }
    assert_eq!(
        pages(&array),
        4,
        "writes into a dirty region: no bitmap I/O"
    );
    array
        .write(5 * region_bytes + 7, &[3u8; 100], false)
        .expect("write");
    assert_eq!(pages(&array), 8);
    assert_eq!(bits_on_members(&io, 5), vec![true; 4]);
    // A write spanning two clean regions sets both with one page write per member.
    array
        .write(9 * region_bytes - 50, &[4u8; 100], false)
        .expect("write");
    assert_eq!(pages(&array), 12);
    assert_eq!(bits_on_members(&io, 8), vec![true; 4]);
    assert_eq!(bits_on_members(&io, 9), vec![true; 4]);
    assert_eq!(bits_on_members(&io, 10), vec![false; 4]);
    assert_eq!(array.integrity().dirty_regions, 4);
}

#[test]
fn idle_regions_are_cleared_lazily() {
    let (io, array) = mem_array(Level::Raid6, 6, 4096, 256);
    let region_bytes = array.integrity().region_bytes;
    array.write(0, &[1u8; 4096], false).expect("write");
    array
        .write(3 * region_bytes, &[1u8; 4096], false)
        .expect("write");
    assert_eq!(array.integrity().dirty_regions, 2);
    // Not idle long enough: the (default 5 s) tick leaves them.
    array.run_integrity_tick().expect("tick");
    assert_eq!(array.integrity().dirty_regions, 2);
    array.set_bitmap_idle_clear(Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(60));
    array.run_integrity_tick().expect("tick");
    assert_eq!(
        array.integrity().dirty_regions,
        0,
        "idle and flushed: cleared"
    );
    assert_eq!(bits_on_members(&io, 0), vec![false; 6]);
    assert_eq!(bits_on_members(&io, 3), vec![false; 6]);
    // Written again: set again.
    array
        .write(3 * region_bytes + 5, &[2u8; 5], false)
        .expect("write");
    assert_eq!(bits_on_members(&io, 3), vec![true; 6]);
    // The background tick does it by itself (it runs every second).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        array.integrity().dirty_regions,
        0,
        "the background tick cleared it"
    );
    assert_eq!(bits_on_members(&io, 3), vec![false; 6]);
}

/// After an unclean stop, the resync reads exactly the stripes of the dirty regions: a wrong parity in a dirty
/// region is fixed, one planted in a clean region is left for a check to find.
#[test]
fn resync_is_limited_to_dirty_regions() {
    let (io, array) = mem_array(Level::Raid6, 6, 4096, 512);
    let g = array.geometry();
    let report = array.integrity();
    let region_stripes = report.region_bytes / g.stripe_bytes();
    assert!(region_stripes > 1, "regions of several stripes");
    let dirty = [2u64, 17, 40];
    for r in dirty {
        array
            .write(r * report.region_bytes + 4096, &[7u8; 8192], false)
            .expect("write");
    }
    drop(array); // killed: the array stays dirty
                 // Wrong parity in a dirty region's stripe and in a clean region's stripe.
    let data_offset = DEFAULT_DATA_OFFSET_BYTES;
    let plant = |stripe: u64| {
        let p = g.stripe_member(stripe, g.data_per_stripe());
        io.poke(p, data_offset + stripe * g.chunk_bytes + 100, &[0xA5; 1]);
    };
    let in_dirty = 17 * region_stripes + 1;
    let in_clean = 30 * region_stripes + 2;
    plant(in_dirty);
    plant(in_clean);
    let images = mem_images(&io);
    let io = Arc::new(MemMembers::from_images(images));
    let array = assemble_io(io.clone(), options(true)).expect("assemble dirty");
    assert!(array.wait_idle(Duration::from_secs(30)));
    let result = array.last_result().expect("resync result");
    assert_eq!(result.kind, "resync");
    assert_eq!(result.outcome.as_deref(), Some("completed"));
    let resynced = array.integrity().resync_stripes;
    assert_eq!(
        resynced,
        dirty.len() as u64 * region_stripes,
        "only the dirty regions"
    );
    assert_eq!(result.total_bytes, resynced * g.stripe_bytes());
    assert_eq!(
        (result.mismatches, result.repaired),
        (1, 1),
        "the dirty region's bad parity"
    );
    let bad = inconsistent_stripes(&g, data_offset, &mem_images(&io));
    assert_eq!(bad, vec![in_clean], "the clean region was not read");
    array.start_check(false).expect("check");
    assert!(array.wait_idle(Duration::from_secs(30)));
    assert_eq!(array.last_result().expect("check").mismatches, 1);
    figure(
        "resync_is_limited",
        &format!(
            "3 dirty regions of {} ({} stripes each): {resynced} of {} stripes resynced",
            g.stripes().div_ceil(region_stripes),
            region_stripes,
            g.stripes()
        ),
    );
}

#[test]
fn version_1_array_is_upgraded_at_assembly() {
    let (io, array) = mem_array(Level::Raid5, 4, 8192, 16);
    array.write(0, &[9u8; 20000], true).expect("write");
    array.stop().expect("stop");
    // Rewrite every superblock as version 1 wrote it: no bitmap, no log, the area after the superblock zero.
    for slot in 0..4 {
        let image = io.image(slot).expect("present");
        let mut sb = Superblock::decode(&image).expect("decode");
        sb.format_version = 1;
        sb.bitmap_chunk_bytes = 0;
        sb.bitmap_bytes = sb.data_offset_bytes - BITMAP_OFFSET_BYTES;
        sb.ppl_offset_bytes = 0;
        sb.ppl_bytes = 0;
        io.poke(slot, 0, &sb.encode());
        let zeros = vec![0u8; (sb.data_offset_bytes as usize) - SUPERBLOCK_BYTES];
        io.poke(slot, SUPERBLOCK_BYTES as u64, &zeros);
        assert_eq!(
            Superblock::decode(&io.image(slot).expect("present")).map(|s| s.format_version),
            Ok(1)
        );
    }
    let io2 = Arc::new(MemMembers::from_images(mem_images(&io)));
    let array = assemble_io(io2.clone(), options(true)).expect("assemble v1");
    let mut back = vec![0u8; 20000];
    array.read(0, &mut back).expect("read");
    assert!(back.iter().all(|b| *b == 9));
    for slot in 0..4 {
        let sb = Superblock::decode(&io2.image(slot).expect("present")).expect("decode");
        assert_eq!(sb.format_version, 2);
        assert_ne!(sb.bitmap_chunk_bytes, 0);
        assert!(sb.ppl_bytes > 0 && sb.ppl_offset_bytes >= BITMAP_OFFSET_BYTES + sb.bitmap_bytes);
    }
    assert!(array.integrity().log_enabled);
    array.write(8192, &[1u8; 100], false).expect("write");
    assert_eq!(
        array.integrity().log_entries,
        1,
        "the upgraded array logs partial writes"
    );
    array.stop().expect("stop");
}
