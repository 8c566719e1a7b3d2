//! Power loss during a rebuild (fault matrix rows 4 and 12): the checkpoint a restart resumes from must never
//! name rows the new member's write cache lost. The rebuild writes rows without FUA and checkpoints them in the
//! superblocks (FUA) every 64 MiB or second; until stop 29 nothing flushed the new member in between, so a power
//! loss right after a checkpoint dropped rows below it, the restarted rebuild resumed past them, and the member
//! became active holding zeros there.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{reference, Rng};
use paraid_engine::fault::{CrashMembers, CrashPolicy};
use paraid_engine::layout::Level;
use paraid_engine::superblock::{Superblock, DEFAULT_DATA_OFFSET_BYTES};
use paraid_engine::{assemble_io, create_io, AssembleOptions, NewMember, SlotState};

const CHUNK_BYTES: u64 = 65536;
const ROWS: u64 = 160; // 10 MiB per member

/// The checkpoint of `slot` the members' durable superblocks hold (slot 0's).
fn durable_checkpoint(io: &CrashMembers, slot: usize) -> u64 {
    let image = io.durable_image(0).expect("slot 0");
    let sb = Superblock::decode(&image[..4096]).expect("superblock");
    match sb.slots[slot].state {
        SlotState::Rebuilding => sb.slots[slot].recovery_offset_bytes,
        _ => 0,
    }
}

#[test]
fn a_power_loss_after_a_rebuild_checkpoint_loses_no_row_below_it() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let member_bytes = DEFAULT_DATA_OFFSET_BYTES + ROWS * CHUNK_BYTES;
        let io = Arc::new(CrashMembers::new(members, member_bytes));
        create_io(io.as_ref(), level, CHUNK_BYTES, "t").expect("create");
        let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
        let mut model = vec![0u8; array.size_bytes() as usize];
        Rng::new(5).fill(&mut model);
        for (i, piece) in model.chunks(1 << 20).enumerate() {
            array.write((i << 20) as u64, piece, false).expect("fill");
        }
        array.flush().expect("flush");
        array.fail_member(1).expect("fail");
        array.remove_member(1).expect("remove");
        // 4 MiB/s: the 10 MiB rebuild writes its first checkpoints after a second or two.
        array.set_sync_speed(4 << 20, 4 << 20);
        array
            .add_member(NewMember::Image {
                label: "new".into(),
                size_bytes: member_bytes,
            })
            .expect("add");
        // The power goes as soon as a checkpoint is durable: rows the target still caches are dropped.
        let started = Instant::now();
        while durable_checkpoint(&io, 1) == 0 {
            assert!(started.elapsed() < Duration::from_secs(30), "{level}: no checkpoint");
            std::thread::sleep(Duration::from_millis(2));
        }
        io.cut_power();
        let report = io.crash(1, CrashPolicy::DropAll);
        drop(array);
        let checkpoint = durable_checkpoint(&io, 1);

        let io = Arc::new(CrashMembers::from_images(report.images));
        let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("reassemble");
        assert!(array.wait_idle(Duration::from_secs(60)), "{level}: the resumed rebuild ends");
        assert_eq!(array.slot_state(1), SlotState::Active, "{level}");
        // Slot 0 out: slot 1's rows below the checkpoint serve its own chunks and, with the others, slot 0's.
        array.fail_member(0).expect("fail slot 0");
        let mut back = vec![0u8; model.len()];
        array.read(0, &mut back).expect("read");
        let wrong = back
            .chunks(4096)
            .zip(model.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            wrong, 0,
            "{level}: {wrong} pages wrong after a power loss at checkpoint {checkpoint} and the resumed rebuild"
        );
    }
}
