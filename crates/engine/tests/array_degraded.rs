//! Degraded arrays: members missing at assembly are served by reconstruction (RAID5/6) or the other copy
//! (RAID1/10); writes keep the survivors' parity right; discard and write-zeroes keep parity right.

mod common;

use std::sync::Arc;

use common::{
    data_areas, filled, mem_array, random_extent, random_writes_and_reads, reference,
    verify_array_members, verify_members, Rng,
};
use paraid_engine::layout::Level;
use paraid_engine::{assemble_io, AssembleOptions, EngineError, MemMembers, SlotState};

/// Assembles `images` without the slots in `gone`, checks every byte, writes some more, checks members.
fn degraded_round_trip(
    level: Level,
    images: &[Option<Vec<u8>>],
    model: &[u8],
    gone: &[usize],
    seed: u64,
) {
    let mut images = images.to_vec();
    for &slot in gone {
        images[slot] = None;
    }
    let io = Arc::new(MemMembers::from_images(images));
    let array =
        assemble_io(io.clone(), AssembleOptions::new(reference())).expect("degraded assembly");
    for &slot in gone {
        assert_eq!(array.slot_state(slot), SlotState::Missing);
    }
    let mut model = model.to_vec();
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("degraded read");
    assert!(all == model, "{level} without {gone:?}: full read differs");

    random_writes_and_reads(
        &array,
        &mut model,
        seed,
        24,
        &format!("{level} without {gone:?}"),
    );
    array.read(0, &mut all).expect("degraded read");
    assert!(
        all == model,
        "{level} without {gone:?}: full read after writes"
    );
    verify_array_members(&io, &array, &model);
    array.stop().expect("stop");
}

#[test]
fn raid5_each_member_missing() {
    for (members, chunk) in [(3, 4096u64), (4, 16384), (6, 65536)] {
        let (images, model) = filled(Level::Raid5, members, chunk, 4, 55 + members as u64);
        for gone in 0..members {
            degraded_round_trip(Level::Raid5, &images, &model, &[gone], gone as u64);
        }
    }
}

#[test]
fn raid6_each_pair_and_each_member_missing() {
    for (members, chunk) in [(4, 4096u64), (5, 16384), (7, 4096)] {
        let (images, model) = filled(Level::Raid6, members, chunk, 4, 66 + members as u64);
        for a in 0..members {
            degraded_round_trip(Level::Raid6, &images, &model, &[a], a as u64);
            for b in a + 1..members {
                degraded_round_trip(Level::Raid6, &images, &model, &[a, b], (a * 16 + b) as u64);
            }
        }
    }
}

#[test]
fn raid1_all_but_one_missing() {
    let members = 3;
    let (images, model) = filled(Level::Raid1, members, 4096, 4, 11);
    for keep in 0..members {
        let gone: Vec<usize> = (0..members).filter(|s| *s != keep).collect();
        degraded_round_trip(Level::Raid1, &images, &model, &gone, keep as u64);
    }
}

#[test]
fn raid10_each_member_and_surviving_pairs_missing() {
    for members in [2usize, 3, 4, 5] {
        let (images, model) = filled(Level::Raid10, members, 4096, 4, 1010 + members as u64);
        for a in 0..members {
            degraded_round_trip(Level::Raid10, &images, &model, &[a], a as u64);
        }
        if members == 4 {
            // Near-2 on 4 members mirrors (0,1) and (2,3): losing one of each pair is survivable.
            degraded_round_trip(Level::Raid10, &images, &model, &[0, 2], 7);
            degraded_round_trip(Level::Raid10, &images, &model, &[1, 3], 8);
        }
    }
}

fn assemble_err(images: Vec<Option<Vec<u8>>>) -> EngineError {
    match assemble_io(
        Arc::new(MemMembers::from_images(images)),
        AssembleOptions::new(reference()),
    ) {
        Ok(_) => panic!("assembly should have been refused"),
        Err(e) => e,
    }
}

#[test]
fn beyond_tolerance_refused() {
    let cases: [(Level, usize, &[usize]); 5] = [
        (Level::Raid0, 3, &[1]),
        (Level::Raid5, 4, &[0, 3]),
        (Level::Raid6, 5, &[0, 2, 4]),
        (Level::Raid10, 4, &[0, 1]),
        (Level::Raid10, 5, &[4, 0]), // odd count: members 4 and 0 share chunk 2
    ];
    for (level, members, gone) in cases {
        let (mut images, _) = filled(level, members, 4096, 4, 3);
        for &slot in gone {
            images[slot] = None;
        }
        let err = assemble_err(images);
        assert!(
            matches!(err, EngineError::AssembleDegraded { .. }),
            "{level} without {gone:?}: {err}"
        );
        assert!(err.to_string().contains("cannot run"), "{err}");
    }
}

/// A member left out of a degraded run is behind on events: assembling it back is refused, naming it.
#[test]
fn stale_member_refused() {
    let (images, _) = filled(Level::Raid5, 4, 4096, 4, 9);
    let mut degraded = images.clone();
    degraded[2] = None;
    let io = Arc::new(MemMembers::from_images(degraded));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("degraded");
    array.write(5, b"newer data", false).expect("write");
    array.stop().expect("stop");
    let mut back: Vec<Option<Vec<u8>>> = (0..4).map(|s| io.image(s)).collect();
    back[2] = images[2].clone();
    let err = assemble_err(back);
    match &err {
        EngineError::TrustStaleMember { slot, .. } => assert_eq!(*slot, 2),
        other => panic!("expected a stale member error, got {other}"),
    }
    assert!(err.to_string().contains("mem2"), "{err}");
}

/// Random writes, discards and write-zeroes against the model; parity checked from raw member bytes.
#[test]
fn discard_and_write_zeroes_keep_parity() {
    for (level, members, chunk) in [
        (Level::Raid0, 3, 4096u64),
        (Level::Raid1, 2, 4096),
        (Level::Raid5, 4, 4096),
        (Level::Raid5, 5, 65536),
        (Level::Raid6, 6, 16384),
        (Level::Raid10, 3, 4096),
        (Level::Raid10, 4, 16384),
    ] {
        let (io, array) = mem_array(level, members, chunk, 8);
        let g = array.geometry();
        let mut model = vec![0u8; array.size_bytes() as usize];
        let mut rng = Rng::new(members as u64 * 31 + chunk);
        for op in 0..80 {
            let (offset, len) = random_extent(&mut rng, array.size_bytes(), g.stripe_bytes());
            let range = offset as usize..offset as usize + len;
            match rng.below(3) {
                0 => {
                    let mut data = vec![0u8; len];
                    rng.fill(&mut data);
                    array.write(offset, &data, false).expect("write");
                    model[range].copy_from_slice(&data);
                }
                1 => {
                    array.discard(offset, len as u64).expect("discard");
                    model[range].fill(0);
                }
                _ => {
                    array
                        .write_zeroes(offset, len as u64, op % 2 == 0)
                        .expect("write_zeroes");
                    model[range].fill(0);
                }
            }
        }
        // A discard of the whole array, then more data on part of it.
        let mut all = vec![0u8; model.len()];
        array.read(0, &mut all).expect("read");
        assert!(
            all == model,
            "{level} n={members}: model differs after discards"
        );
        verify_array_members(&io, &array, &model);

        array.discard(0, array.size_bytes()).expect("discard all");
        array.read(0, &mut all).expect("read");
        assert!(
            all.iter().all(|b| *b == 0),
            "{level}: discard of everything left data"
        );
        let images: Vec<Option<Vec<u8>>> = (0..members).map(|s| io.image(s)).collect();
        for image in data_areas(&images, array.data_offset_bytes(), &g)
            .into_iter()
            .flatten()
        {
            assert!(
                image.iter().all(|b| *b == 0),
                "{level}: a member cell kept data after discard of all"
            );
        }
    }
}

/// Discard on a degraded array: whole stripes on the survivors only, and reconstruction still gives zeros.
#[test]
fn degraded_discard_reads_zeros() {
    let (mut images, mut model) = filled(Level::Raid6, 5, 4096, 4, 77);
    images[1] = None;
    images[3] = None;
    let io = Arc::new(MemMembers::from_images(images));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("degraded");
    let (offset, len) = (1000u64, 2 * 3 * 4096u64 + 500); // partial, whole, partial stripe
    array.discard(offset, len).expect("discard");
    model[offset as usize..(offset + len) as usize].fill(0);
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model);
    let g = array.geometry();
    let images: Vec<Option<Vec<u8>>> = (0..5).map(|s| io.image(s)).collect();
    verify_members(
        &g,
        &data_areas(&images, array.data_offset_bytes(), &g),
        &model,
    );
}
