//! The stripe cache (engine array/stripe_cache.rs): rewrites of hot pages are served from it without changing a
//! byte of what reaches the members, and the writers that change chunks behind the write path's back (discard,
//! check repair) make it forget, so that a later read-modify-write does not compute parity from bytes the members
//! no longer hold.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{data_areas, reference, verify_members, Rng};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{assemble_io, create_io, Array, AssembleOptions, MemMembers};

const CHUNK: u64 = 64 << 10;
const ROWS: u64 = 8;

fn array(level: Level, members: usize, cache_bytes: usize) -> (Arc<MemMembers>, Array) {
    let io = Arc::new(MemMembers::new(
        members,
        DEFAULT_DATA_OFFSET_BYTES + ROWS * CHUNK,
    ));
    create_io(io.as_ref(), level, CHUNK, "cache").expect("create");
    let opts = AssembleOptions {
        stripe_cache_bytes: Some(cache_bytes),
        ..AssembleOptions::new(reference())
    };
    (io.clone(), assemble_io(io, opts).expect("assemble"))
}

fn fill(array: &Array, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; array.size_bytes() as usize];
    Rng::new(seed).fill(&mut model);
    array.write(0, &model, false).expect("fill");
    array.flush().expect("flush");
    model
}

/// Writes `data` at `offset` and into `model`.
fn write(array: &Array, model: &mut [u8], offset: u64, data: &[u8]) {
    array.write(offset, data, false).expect("write");
    model[offset as usize..offset as usize + data.len()].copy_from_slice(data);
}

fn assert_reads(array: &Array, model: &[u8], what: &str) {
    let mut got = vec![0u8; model.len()];
    array.read(0, &mut got).expect("read");
    assert!(got == model, "{what}: the array reads back other bytes");
}

/// Two rewrites of the first page of `stripe`'s first chunk (random bytes from `seed` and `seed + 1`): the second
/// is served from the cache, which then holds that page and its parity. Returns the stripe's array offset.
fn rewrite_first_page_twice(array: &Array, model: &mut [u8], stripe: u64, seed: u64) -> u64 {
    let stripe_at = stripe * array.geometry().stripe_bytes();
    for seed in [seed, seed + 1] {
        let mut page = vec![0u8; 4096];
        Rng::new(seed).fill(&mut page);
        write(array, model, stripe_at, &page);
    }
    assert!(array.detail().stripe_cache.hits > 0);
    stripe_at
}

/// Rewrites of a few hot extents (page-sized and smaller, some flushed), the same sequence on an array with the
/// cache and one without: the cache serves most of the read-modify-write reads, and the member images end up
/// byte for byte the same.
#[test]
fn hot_rewrites_are_served_from_the_cache_and_leave_the_same_member_bytes() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6), (Level::Raid6, 8)] {
        let (io_off, off) = array(level, members, 0);
        let (io_on, on) = array(level, members, 8 << 20);
        let mut model = fill(&off, 1);
        assert_eq!(fill(&on, 1), model);
        let hot: Vec<u64> = {
            let mut rng = Rng::new(2);
            (0..6)
                .map(|_| rng.below(on.size_bytes() / 4096 - 4) * 4096)
                .collect()
        };
        let mut rng = Rng::new(3);
        let mut model_on = model.clone();
        for op in 0..600u64 {
            let at = hot[rng.below(hot.len() as u64) as usize] + rng.below(3) * 4096;
            let len = match rng.below(3) {
                0 => 4096,
                1 => 8192,
                _ => 1 + rng.below(4096) as usize, // a piece of a page: the rest of it comes from the old bytes
            };
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            write(&off, &mut model, at, &data);
            write(&on, &mut model_on, at, &data);
            if op % 7 == 0 {
                off.flush().expect("flush");
                on.flush().expect("flush");
            }
        }
        assert_reads(&on, &model, &format!("{level} with the cache"));
        let stats = on.detail().stripe_cache;
        assert!(
            stats.hits > stats.misses,
            "{level} x{members}: the hot pages should mostly be served from the cache: {stats:?}"
        );
        assert!(stats.held_bytes > 0 && stats.held_bytes <= stats.budget_bytes);
        assert_eq!(
            off.detail().stripe_cache.hits,
            0,
            "cache off serves nothing"
        );
        let (g, data_offset) = (on.geometry(), on.data_offset_bytes());
        off.stop().expect("stop");
        on.stop().expect("stop");
        // Data and parity; the log rings differ (a read-modify-write logs other records than a
        // reconstruct-write, and the cache changes which one a write makes).
        let images = |io: &MemMembers| (0..members).map(|s| io.image(s)).collect::<Vec<_>>();
        let areas_off = data_areas(&images(&io_off), data_offset, &g);
        let areas_on = data_areas(&images(&io_on), data_offset, &g);
        for slot in 0..members {
            assert!(
                areas_off[slot] == areas_on[slot],
                "{level} x{members}: member {slot}'s data area differs with the cache on"
            );
        }
        verify_members(&g, &areas_on, &model);
    }
}

/// A discard deallocates whole stripes (they read back as zeros). A read-modify-write of a page of such a stripe
/// afterwards must compute its parity from the zeros, not from what the cache held before the discard:
/// otherwise a chunk of that stripe reconstructed later (its member failed) comes back with its old bytes.
#[test]
fn a_discarded_stripe_is_forgotten() {
    let (_io, array) = array(Level::Raid5, 4, 64 << 20);
    let g = array.geometry();
    let mut model = fill(&array, 4);
    let stripe = 2u64;
    let stripe_at = rewrite_first_page_twice(&array, &mut model, stripe, 5);
    array.discard(stripe_at, g.stripe_bytes()).expect("discard");
    model[stripe_at as usize..(stripe_at + g.stripe_bytes()) as usize].fill(0);
    let mut page = vec![0u8; 4096];
    Rng::new(7).fill(&mut page);
    write(&array, &mut model, stripe_at, &page);
    // The member of the stripe's second data chunk fails: that chunk is now computed from the parity.
    array.fail_member(g.stripe_member(stripe, 1)).expect("fail");
    assert_reads(
        &array,
        &model,
        "after discard, rewrite and a member failure",
    );
}

/// A RAID5 repair rewrites P from the data as found, silent corruption included (RAID5 cannot tell which chunk
/// is wrong): from then on the corrupted bytes are what the array holds. A read-modify-write of another chunk of
/// that stripe afterwards must start from the repaired P, not the cached one: otherwise the corrupted chunk,
/// reconstructed after its member fails, changes under a reader that saw it before.
#[test]
fn a_repaired_stripe_is_forgotten() {
    let (io, array) = array(Level::Raid5, 4, 64 << 20);
    let g = array.geometry();
    let mut model = fill(&array, 8);
    let stripe = 3u64;
    let stripe_at = rewrite_first_page_twice(&array, &mut model, stripe, 9);
    array.flush().expect("flush");
    // Flip a byte of the stripe's second data chunk on its member.
    let victim = g.stripe_member(stripe, 1);
    let at = array.data_offset_bytes() + stripe * CHUNK + 100;
    let byte = io.image(victim).expect("present")[at as usize] ^ 0x5a;
    io.poke(victim, at, &[byte]);
    array.start_check(true).expect("repair");
    assert!(array.wait_idle(Duration::from_secs(30)));
    let mut seen = vec![0u8; model.len()];
    array.read(0, &mut seen).expect("read");
    let flipped = (stripe_at + CHUNK + 100) as usize;
    assert_eq!(
        seen[flipped],
        model[flipped] ^ 0x5a,
        "RAID5 keeps the data as found"
    );
    let mut page = vec![0u8; 4096];
    Rng::new(11).fill(&mut page);
    array.write(stripe_at, &page, false).expect("write");
    seen[stripe_at as usize..stripe_at as usize + 4096].copy_from_slice(&page);
    array.fail_member(victim).expect("fail");
    assert_reads(&array, &seen, "after repair, rewrite and a member failure");
}
