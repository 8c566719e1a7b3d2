//! Consistency check and repair: every injected corruption (bit flips in at most as many chunks of a stripe as
//! the level has redundancy) is found; RAID6 names the bad member of a stripe with one bad chunk and repair
//! rewrites just that chunk; RAID5 repair rewrites P; RAID1/10 repair copies the first copy over the others.

mod integrity_common;

use std::sync::Arc;
use std::time::Duration;

use integrity_common::*;
use paraid_engine::CheckFinding;
use paraid_parity::reference::Reference;
use paraid_parity::Backend;

const WAIT: Duration = Duration::from_secs(30);

/// Fills the array with random data (flushed) and returns it.
fn fill(array: &Array, rng: &mut SplitMix64) -> Vec<u8> {
    let mut data = vec![0u8; array.size_bytes() as usize];
    rng.fill(&mut data);
    array.write(0, &data, false).expect("fill");
    array.flush().expect("flush");
    data
}

/// Flips one bit of the cell of `member` at `row`, at an offset drawn from `rng`.
fn flip(io: &MemMembers, array: &Array, member: usize, row: u64, rng: &mut SplitMix64) {
    let g = array.geometry();
    let at = array.data_offset_bytes() + row * g.chunk_bytes + rng.below(g.chunk_bytes);
    let mut byte = [0u8; 1];
    byte[0] = io.image(member).expect("present")[at as usize] ^ (1 << rng.below(8));
    io.poke(member, at, &byte);
}

fn run(array: &Array, repair: bool) -> paraid_engine::Progress {
    array.start_check(repair).expect("start check");
    assert!(array.wait_idle(WAIT), "check finished");
    let result = array.last_result().expect("a result");
    assert_eq!(result.kind, if repair { "repair" } else { "check" });
    assert_eq!(result.outcome.as_deref(), Some("completed"));
    assert_eq!(result.done_bytes, array.size_bytes());
    result
}

/// One injected corruption: the stripe (RAID1/10: chunk) and the members whose cells were flipped.
struct Injected {
    stripe: u64,
    members: Vec<usize>,
}

#[test]
fn check_finds_every_corruption_and_repair_fixes_it() {
    let mut injected_total = 0u64;
    let mut named = 0u64;
    for (level, members) in [
        (Level::Raid5, 5usize),
        (Level::Raid6, 6),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        let mut rng = SplitMix64::new(level.code() as u64 * 31 + members as u64);
        let (io, array) = mem_array(level, members, 4096, 64);
        let g = array.geometry();
        let data = fill(&array, &mut rng);
        // Corrupt every fifth stripe: RAID6 one chunk or two, the others one (RAID1/10: never the first copy, so
        // that repair restores the data).
        let mut injected: Vec<Injected> = Vec::new();
        for stripe in (3..g.stripes()).step_by(5) {
            let cells: Vec<(usize, u64)> = if g.level.has_parity() {
                let width = g.data_per_stripe() + g.level.parity_chunks();
                let bad = if level == Level::Raid6 && stripe % 2 == 0 {
                    2
                } else {
                    1
                };
                let first = rng.below(width as u64) as usize;
                (0..bad)
                    .map(|j| (g.stripe_member(stripe, (first + j) % width), stripe))
                    .collect()
            } else {
                let copy = 1 + rng.below(g.copies() as u64 - 1) as usize;
                let a = g.chunk_copy(stripe, copy);
                vec![(a.member, a.row)]
            };
            for &(member, row) in &cells {
                flip(&io, &array, member, row, &mut rng);
            }
            injected.push(Injected {
                stripe,
                members: cells.iter().map(|c| c.0).collect(),
            });
        }
        let found = run(&array, false);
        assert_eq!(
            found.mismatches,
            injected.len() as u64,
            "{level}: every corruption found"
        );
        assert_eq!(found.repaired, 0, "{level}: a check repairs nothing");
        let findings: Vec<CheckFinding> = array.check_findings();
        assert_eq!(
            findings.iter().map(|f| f.stripe).collect::<Vec<_>>(),
            injected.iter().map(|i| i.stripe).collect::<Vec<_>>(),
            "{level}: the stripes found are the stripes corrupted"
        );
        for (f, i) in findings.iter().zip(&injected) {
            match (level, i.members.len()) {
                (Level::Raid6, 1) => {
                    assert_eq!(f.kind, "bad chunk", "{level} stripe {}", f.stripe);
                    assert_eq!(f.slot, Some(i.members[0]), "RAID6 names the bad member");
                    named += 1;
                }
                (Level::Raid1 | Level::Raid10, _) => {
                    assert_eq!(f.slot, Some(i.members[0]), "{level}: the differing copy");
                }
                _ => assert_eq!(f.kind, "parity mismatch"),
            }
        }
        let repaired = run(&array, true);
        assert_eq!(repaired.mismatches, injected.len() as u64);
        assert_eq!(
            repaired.repaired,
            injected.len() as u64,
            "{level}: every stripe rewritten"
        );
        let again = run(&array, false);
        assert_eq!(again.mismatches, 0, "{level}: consistent after repair");
        assert!(inconsistent_stripes(&g, array.data_offset_bytes(), &mem_images(&io)).is_empty());
        // Data is back wherever the repair could know it: RAID6 single bad chunks, RAID1/10 copies, parity
        // cells; a corrupted data cell of a parity stripe without a name keeps its (wrong) bytes.
        let mut all = vec![0u8; data.len()];
        array.read(0, &mut all).expect("read");
        let sb = g.stripe_bytes() as usize;
        for i in &injected {
            let s = i.stripe as usize;
            // RAID5, and RAID6 with two bad chunks, rewrite parity from the data as it is.
            let data_hit = g.level.has_parity()
                && (level == Level::Raid5 || i.members.len() > 1)
                && i.members
                    .iter()
                    .any(|m| g.stripe_index(i.stripe, *m) < g.data_per_stripe());
            let range = if g.level.has_parity() {
                s * sb..(s + 1) * sb
            } else {
                s * g.chunk_bytes as usize..(s + 1) * g.chunk_bytes as usize
            };
            if !data_hit {
                assert!(
                    all[range.clone()] == data[range],
                    "{level}: stripe {s} data restored"
                );
            }
        }
        injected_total += injected.len() as u64;
        array.stop().expect("stop");
    }
    figure(
        "check_finds_every_corruption",
        &format!(
            "{injected_total} corrupted stripes over RAID5/6/1/10, {injected_total} found, {named} RAID6 bad \
             members named, {injected_total} repaired, 0 left after repair"
        ),
    );
}

#[test]
fn raid5_repair_rewrites_parity_from_the_data() {
    let mut rng = SplitMix64::new(5);
    let (io, array) = mem_array(Level::Raid5, 4, 4096, 16);
    let g = array.geometry();
    fill(&array, &mut rng);
    // A data cell of stripe 2 and the P cell of stripe 7 go bad.
    let data_member = g.stripe_member(2, 1);
    flip(&io, &array, data_member, 2, &mut rng);
    flip(&io, &array, g.stripe_member(7, 3), 7, &mut rng);
    let corrupted_cell = {
        let image = io.image(data_member).expect("present");
        let at = (array.data_offset_bytes() + 2 * g.chunk_bytes) as usize;
        image[at..at + g.chunk_bytes as usize].to_vec()
    };
    let repaired = run(&array, true);
    assert_eq!((repaired.mismatches, repaired.repaired), (2, 2));
    let images = mem_images(&io);
    assert!(inconsistent_stripes(&g, array.data_offset_bytes(), &images).is_empty());
    // RAID5 cannot tell which chunk is wrong: it kept the data and recomputed P from it.
    let image = images[data_member].as_ref().expect("present");
    let at = (array.data_offset_bytes() + 2 * g.chunk_bytes) as usize;
    assert!(
        image[at..at + g.chunk_bytes as usize] == corrupted_cell[..],
        "data untouched"
    );
    let cells: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let m = images[g.stripe_member(2, i)].as_ref().expect("present");
            m[at..at + g.chunk_bytes as usize].to_vec()
        })
        .collect();
    let mut p = vec![0u8; g.chunk_bytes as usize];
    let refs: Vec<&[u8]> = cells.iter().map(|c| &c[..]).collect();
    Reference.gen_p(&refs, &mut p);
    let on_disk = images[g.stripe_member(2, 3)].as_ref().expect("present");
    assert!(
        on_disk[at..at + g.chunk_bytes as usize] == p[..],
        "P rewritten from the data"
    );
}

/// A check runs while the array serves writes: the stripe locks keep it from seeing half-written stripes.
#[test]
fn check_runs_online_without_false_mismatches() {
    let (io, array) = mem_array(Level::Raid6, 6, 4096, 256);
    let array = Arc::new(array);
    let mut rng = SplitMix64::new(77);
    fill(&array, &mut rng);
    // About half a second of checking, so that the writer overlaps it.
    array.set_sync_speed(8 << 20, 8 << 20);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let array = array.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut rng = SplitMix64::new(78);
            let g = array.geometry();
            let mut writes = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let (offset, len) = extent(&mut rng, array.size_bytes(), g.stripe_bytes());
                let mut buf = vec![0u8; len];
                rng.fill(&mut buf);
                array.write(offset, &buf, false).expect("write");
                writes += 1;
            }
            writes
        })
    };
    array.start_check(false).expect("start");
    assert!(array.wait_idle(WAIT));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = writer.join().expect("writer");
    let result = array.last_result().expect("result");
    assert_eq!(
        result.mismatches, 0,
        "no false mismatches with {writes} concurrent writes"
    );
    assert!(
        writes > 100,
        "the writer ran alongside the check ({writes} writes)"
    );
    assert!(inconsistent_stripes(
        &array.geometry(),
        array.data_offset_bytes(),
        &mem_images(&io)
    )
    .is_empty());
    figure(
        "check_online",
        &format!(
            "check of {} stripes with {writes} concurrent writes: 0 false mismatches",
            array.geometry().stripes()
        ),
    );
}

#[test]
fn check_is_refused_without_redundancy_or_when_degraded() {
    let (_io, raid0) = mem_array(Level::Raid0, 3, 4096, 8);
    assert!(raid0.start_check(false).is_err());
    let (io, array) = mem_array(Level::Raid5, 4, 4096, 8);
    let mut images = mem_images(&io);
    drop(array);
    images[2] = None;
    let io = Arc::new(MemMembers::from_images(images));
    let degraded = assemble_io(io, options(true)).expect("degraded");
    let err = degraded.start_check(true).expect_err("refused");
    assert!(err.to_string().contains("slot 2"), "{err}");
}

/// A check or repair under way refuses another (it would only repeat the first); once it is done, a new one starts.
#[test]
fn a_second_check_is_refused_while_one_is_under_way() {
    let (_io, array) = mem_array(Level::Raid6, 6, 4096, 64);
    // Slow enough that the first is still running when the second is asked for.
    array.set_sync_speed(64 << 10, 64 << 10);
    array.start_check(true).expect("start a repair");
    for repair in [false, true] {
        let err = array
            .start_check(repair)
            .expect_err("a second one is refused");
        assert!(
            err.to_string().contains("a repair is already under way"),
            "{err}"
        );
    }
    array.set_sync_speed(0, 0);
    assert!(array.wait_idle(WAIT), "the repair finished");
    assert_eq!(array.last_result().expect("result").kind, "repair");
    array.start_check(false).expect("a check after it starts");
    assert!(array.wait_idle(WAIT));
    assert_eq!(array.last_result().expect("result").kind, "check");
}
