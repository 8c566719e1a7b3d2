//! Degraded mode: members failed by the admin or by I/O errors while the array runs. Reads are reconstructed
//! (RAID5: any one slot; RAID6: any two, P and Q included), writes keep the survivors' parity right, the
//! eviction is in the superblocks before anything relying on it is acknowledged, transient errors never evict,
//! persistent ones do past the threshold, and beyond tolerance every request fails: never wrong data.

mod common;
mod resilience_common;

use common::{data_areas, filled, random_writes_and_reads, reference, verify_members};
use paraid_engine::layout::{Geometry, Level};
use paraid_engine::superblock::{Superblock, DEFAULT_DATA_OFFSET_BYTES};
use paraid_engine::{assemble_io, create_io, Array, AssembleOptions, EngineError, SlotState};
use resilience_common::{assemble_flaky, Flaky};

fn read_all(array: &Array) -> Result<Vec<u8>, EngineError> {
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).map(|_| all)
}

/// Random writes and reads against the model; then every byte, and the survivors' images.
fn exercise(array: &Array, io: &Flaky, model: &mut [u8], gone: &[usize], seed: u64, what: &str) {
    let g = array.geometry();
    random_writes_and_reads(array, model, seed, 30, what);
    assert!(
        read_all(array).expect("read") == model,
        "{what}: whole array"
    );
    let images: Vec<Option<Vec<u8>>> = (0..g.members)
        .map(|s| {
            if gone.contains(&s) {
                None
            } else {
                io.inner.image(s)
            }
        })
        .collect();
    verify_members(
        &g,
        &data_areas(&images, array.data_offset_bytes(), &g),
        model,
    );
}

/// The slot table a surviving member holds now.
fn recorded(io: &Flaky, slot: usize) -> Superblock {
    let image = io.inner.image(slot).expect("member");
    Superblock::decode(&image[..4096]).expect("superblock")
}

#[test]
fn raid5_fail_member_every_slot_against_model() {
    for (members, chunk) in [(3usize, 4096u64), (4, 16384), (5, 8192)] {
        let (images, model) = filled(Level::Raid5, members, chunk, 8, members as u64);
        for slot in 0..members {
            let (io, array) = assemble_flaky(&images);
            let events = recorded(&io, 0).events;
            array.fail_member(slot).expect("fail");
            assert_eq!(array.slot_state(slot), SlotState::Faulty);
            // Durable before fail_member returned: every survivor records it, with events bumped.
            for other in (0..members).filter(|s| *s != slot) {
                let sb = recorded(&io, other);
                assert_eq!(sb.slots[slot].state, SlotState::Faulty, "on slot {other}");
                assert!(sb.events > events);
            }
            let mut model = model.clone();
            assert!(
                read_all(&array).expect("read") == model,
                "reconstructed read"
            );
            exercise(
                &array,
                &io,
                &mut model,
                &[slot],
                slot as u64,
                &format!("raid5/{members} without {slot}"),
            );
            // Failing a second member would leave RAID5 beyond tolerance: refused.
            let other = (slot + 1) % members;
            assert!(matches!(
                array.fail_member(other),
                Err(EngineError::ChangeMember { .. })
            ));
        }
    }
}

/// Stripe index roles of two slots in one stripe: both parity chunks, data and P, data and Q, or two data.
fn roles(g: &Geometry, stripe: u64, a: usize, b: usize) -> &'static str {
    let k = g.data_per_stripe();
    let mut r = [g.stripe_index(stripe, a), g.stripe_index(stripe, b)];
    r.sort_unstable();
    match (r[0] >= k, r[1] >= k, r[1] == k + 1) {
        (true, true, _) => "P+Q",
        (false, true, true) => "D+Q",
        (false, true, false) => "D+P",
        _ => "D+D",
    }
}

#[test]
fn raid6_fail_every_pair_incl_p_and_q_against_model() {
    let mut combos = std::collections::BTreeSet::new();
    let mut pairs = 0;
    for (members, chunk) in [(4usize, 4096u64), (6, 8192)] {
        let (images, model) = filled(
            Level::Raid6,
            members,
            chunk,
            members as u64,
            60 + members as u64,
        );
        for a in 0..members {
            for b in a + 1..members {
                let (io, array) = assemble_flaky(&images);
                let g = array.geometry();
                for stripe in 0..g.stripes() {
                    combos.insert(roles(&g, stripe, a, b));
                }
                array.fail_member(a).expect("fail a");
                array.fail_member(b).expect("fail b");
                let mut model = model.clone();
                assert!(read_all(&array).expect("read") == model, "without {a},{b}");
                exercise(
                    &array,
                    &io,
                    &mut model,
                    &[a, b],
                    (a * 10 + b) as u64,
                    &format!("raid6/{members} without {a},{b}"),
                );
                let third = (0..members).find(|s| *s != a && *s != b).expect("a third");
                assert!(matches!(
                    array.fail_member(third),
                    Err(EngineError::ChangeMember { .. })
                ));
                pairs += 1;
            }
        }
    }
    assert_eq!(pairs, 6 + 15);
    assert_eq!(
        combos.into_iter().collect::<Vec<_>>(),
        vec!["D+D", "D+P", "D+Q", "P+Q"],
        "every pair of stripe roles was lost"
    );
}

/// A member that errors on every I/O while the array runs is evicted, and the array serves on (RAID5, RAID6,
/// RAID1, RAID10): nothing read wrong, nothing failed.
#[test]
fn member_dying_while_running_is_evicted_and_served_around() {
    for (level, members) in [
        (Level::Raid5, 4usize),
        (Level::Raid6, 5),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
    ] {
        let (images, model) = filled(level, members, 8192, 8, 90);
        for slot in 0..members {
            let (io, array) = assemble_flaky(&images);
            io.kill(slot);
            let mut model = model.clone();
            // Block by block: the first reads of the dead member are served by reconstruction or another copy.
            let mut block = vec![0u8; 4096];
            for at in (0..array.size_bytes()).step_by(4096) {
                array
                    .read(at, &mut block)
                    .expect("read around a dying member");
                assert!(
                    block == model[at as usize..at as usize + 4096],
                    "{level}: block at {at}"
                );
            }
            assert_eq!(
                array.slot_state(slot),
                SlotState::Faulty,
                "{level}: evicted"
            );
            assert_eq!(
                recorded(&io, (slot + 1) % members).slots[slot].state,
                SlotState::Faulty
            );
            exercise(
                &array,
                &io,
                &mut model,
                &[slot],
                3,
                &format!("{level} after slot {slot} died"),
            );
        }
    }
}

/// Transient errors (each I/O fails once) are retried: no eviction, no error counted, every request succeeds.
/// Persistent read errors on one spot (a latent sector error whose rewrite succeeds) count once per failed
/// read and evict at the threshold, not before.
#[test]
fn transient_errors_never_evict_persistent_ones_do_at_the_threshold() {
    let (images, model) = filled(Level::Raid5, 4, 8192, 8, 120);
    let (io, array) = assemble_flaky(&images);
    for slot in 0..4 {
        for _ in 0..20 {
            io.fail_next(slot, 1);
            let mut got = vec![0u8; 30_000];
            array.read(1000, &mut got).expect("transient read");
            assert!(got == model[1000..31_000]);
            io.fail_next(slot, 1);
            array
                .write(5000, &model[5000..9000], false)
                .expect("transient write");
        }
        assert!(io.failed(slot) >= 20, "faults were injected");
        assert_eq!(
            array.slot_state(slot),
            SlotState::Active,
            "slot {slot}: false eviction"
        );
        assert_eq!(array.slot_errors(slot), 0);
    }
    assert!(read_all(&array).expect("read") == model);

    // One unreadable page of slot 2 (its rewrite works, but the fault stays: a drive that keeps failing there).
    let data_offset = DEFAULT_DATA_OFFSET_BYTES;
    let (io, array) = assemble_flaky(&images);
    array.set_error_threshold(3);
    let g = array.geometry();
    // The first page of the first three data chunks on slot 2 becomes unreadable.
    let chunks: Vec<u64> = (0..g.data_chunks())
        .filter(|c| g.chunk_copy(*c, 0).member == 2)
        .take(3)
        .collect();
    for &chunk in &chunks {
        let page = data_offset + g.chunk_copy(chunk, 0).row * g.chunk_bytes;
        io.bad_reads(2, page..page + 4096);
    }
    let mut got = vec![0u8; 4096];
    for (n, &chunk) in chunks.iter().enumerate() {
        let at = chunk * g.chunk_bytes;
        // Read twice: a known bad spot counts once.
        for _ in 0..2 {
            array.read(at, &mut got).expect("served by reconstruction");
            assert!(got == model[at as usize..at as usize + 4096]);
        }
        let n = n as u32 + 1;
        assert_eq!(array.slot_errors(2), n);
        let expect = if n < 3 {
            SlotState::Active
        } else {
            SlotState::Faulty
        };
        assert_eq!(array.slot_state(2), expect, "after {n} bad spots");
    }
    assert!(read_all(&array).expect("read") == model);
}

/// A member write failing in the middle of array writes: the member is evicted (its bytes are stale) before
/// the write is acknowledged, and every acknowledged block reads back from the others.
#[test]
fn failed_member_write_evicts_durably_before_the_ack() {
    for level in [Level::Raid5, Level::Raid6, Level::Raid1, Level::Raid10] {
        let (images, model) = filled(level, 4, 8192, 24, 130);
        let (io, array) = assemble_flaky(&images);
        io.bad_writes(1);
        let mut model = model.clone();
        let data = vec![0xc3u8; 100_000];
        array.write(3000, &data, false).expect("acknowledged");
        model[3000..3000 + data.len()].copy_from_slice(&data);
        assert_eq!(array.slot_state(1), SlotState::Faulty, "{level}");
        assert_eq!(
            recorded(&io, 0).slots[1].state,
            SlotState::Faulty,
            "{level}: durable"
        );
        io.heal();
        assert!(
            read_all(&array).expect("read") == model,
            "{level}: acknowledged data"
        );
        // After a restart without the stale member, the same.
        array.stop().expect("stop");
        let mut images: Vec<Option<Vec<u8>>> = (0..4).map(|s| io.inner.image(s)).collect();
        let stale = images[1].take();
        let (_, array) = assemble_flaky(&images);
        assert!(
            read_all(&array).expect("read") == model,
            "{level}: after restart"
        );
        // Offered back, the stale member is refused.
        images[1] = stale;
        match assemble_io(Flaky::new(images), AssembleOptions::new(reference())) {
            Err(EngineError::TrustStaleMember { slot: 1, .. }) => {}
            Err(e) => panic!("{level}: {e}"),
            Ok(_) => panic!("{level}: evicted member trusted"),
        }
    }
}

/// Beyond tolerance the array stops serving: every request fails, none returns data, with a clear error.
#[test]
fn beyond_tolerance_every_request_fails() {
    for (level, members, dead) in [
        (Level::Raid5, 4usize, vec![0usize, 2]),
        (Level::Raid6, 5, vec![1, 2, 4]),
        (Level::Raid1, 2, vec![0, 1]),
        (Level::Raid10, 4, vec![0, 1]),
        (Level::Raid0, 3, vec![1]),
    ] {
        let (images, model) = filled(level, members, 8192, 8, 140);
        let (io, array) = assemble_flaky(&images);
        for &slot in &dead {
            io.kill(slot);
        }
        let mut wrong = 0;
        let mut block = vec![0u8; 4096];
        for at in (0..array.size_bytes()).step_by(4096) {
            if array.read(at, &mut block).is_ok() && block != model[at as usize..at as usize + 4096]
            {
                wrong += 1;
            }
        }
        assert_eq!(wrong, 0, "{level}: wrong reads");
        // Once it knows, it serves nothing.
        let _ = array.write(0, &[1u8; 4096], false);
        assert!(array.detail().failed, "{level}: failed");
        for at in (0..array.size_bytes()).step_by(4096) {
            let err = array.read(at, &mut block).expect_err("nothing is served");
            assert!(
                matches!(err, EngineError::ServeRequest { .. }),
                "{level}: {err}"
            );
        }
        let err = array.write(0, &[1u8; 10], false).expect_err("no writes");
        assert!(err.to_string().contains("beyond its tolerance"), "{err}");
        assert!(array.flush().is_err());
        assert!(array.discard(0, 8192).is_err());
        assert!(
            array.stop().is_err(),
            "{level}: a failed array is not marked clean"
        );
    }
}

/// An array stopped cleanly with a member missing starts degraded (within tolerance), and the create-time
/// helpers agree on the member count (sanity of the in-memory setup used above).
#[test]
fn missing_member_at_start_starts_degraded() {
    let (images, model) = filled(Level::Raid6, 5, 8192, 8, 150);
    let mut partial = images.clone();
    partial[3] = None;
    partial[0] = None;
    let (_, array) = assemble_flaky(&partial);
    assert_eq!(array.slot_state(0), SlotState::Missing);
    assert_eq!(array.slot_state(3), SlotState::Missing);
    assert!(read_all(&array).expect("read") == model);
    partial[1] = None;
    assert!(matches!(
        assemble_io(Flaky::new(partial), AssembleOptions::new(reference())),
        Err(EngineError::AssembleDegraded { .. })
    ));
    let io = Flaky::new(vec![
        Some(vec![
            0u8;
            (DEFAULT_DATA_OFFSET_BYTES + 8 * 8192)
                as usize
        ]);
        3
    ]);
    create_io(io.as_ref(), Level::Raid5, 8192, "x").expect("create");
}
