//! Several threads writing disjoint and overlapping stripes at once: every block ends as one whole write of one
//! thread (never torn, never lost in a disjoint region), and every stripe's parity matches its data.

mod common;

use std::sync::Arc;

use common::{
    data_areas, mem_array, read_files, reference, verify_array_members, verify_members, Rng,
    TempDir,
};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{assemble, create, Array, AssembleOptions, CreateOptions};

/// Records are 1 KiB blocks that say who wrote them: thread, sequence, then a pattern derived from both.
const RECORD: usize = 1024;
const THREADS: u64 = 4;

fn record(thread: u64, seq: u64) -> Vec<u8> {
    let mut rec = vec![0u8; RECORD];
    rec[..8].copy_from_slice(&(thread + 1).to_le_bytes());
    rec[8..16].copy_from_slice(&seq.to_le_bytes());
    let mut rng = Rng::new(thread << 32 | seq);
    rng.fill(&mut rec[16..]);
    rec
}

fn is_whole_record(block: &[u8]) -> bool {
    let thread = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
    let seq = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
    (1..=THREADS).contains(&thread) && block == &record(thread - 1, seq)[..]
}

/// Thread t owns records t, t+THREADS, ... of the first half (disjoint) and shares the second half (overlap).
/// Writes are runs of 1..4 records at odd record offsets (not page aligned), some FUA.
fn hammer(array: &Arc<Array>) -> Vec<u8> {
    let records = array.size_bytes() as usize / RECORD;
    let half = records / 2;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let array = array.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 99);
                let mut mine: Vec<Option<u64>> = vec![None; half]; // last sequence written per owned record
                for seq in 0..300u64 {
                    if seq % 2 == 0 {
                        // Disjoint: one of this thread's records.
                        let slot = (rng.below((half as u64) / THREADS) * THREADS + t) as usize;
                        array
                            .write((slot * RECORD) as u64, &record(t, seq), seq % 11 == 0)
                            .expect("write");
                        mine[slot] = Some(seq);
                    } else {
                        // Overlapping: a run in the shared half.
                        let run = 1 + rng.below(4) as usize;
                        let first = half + rng.below((records - half - run) as u64) as usize;
                        let bytes: Vec<u8> = (0..run).flat_map(|_| record(t, seq)).collect();
                        array
                            .write((first * RECORD) as u64, &bytes, false)
                            .expect("write");
                    }
                }
                (t, mine)
            })
        })
        .collect();
    let mut expect_disjoint: Vec<Option<(u64, u64)>> = vec![None; half];
    for h in handles {
        let (t, mine) = h.join().expect("writer thread");
        for (slot, seq) in mine.into_iter().enumerate() {
            if let Some(seq) = seq {
                expect_disjoint[slot] = Some((t, seq));
            }
        }
    }
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read");
    for (slot, expect) in expect_disjoint.iter().enumerate() {
        let block = &all[slot * RECORD..(slot + 1) * RECORD];
        match expect {
            Some((t, seq)) => assert!(
                block == &record(*t, *seq)[..],
                "owned record {slot} lost its last write"
            ),
            None => assert!(
                block.iter().all(|b| *b == 0),
                "unwritten record {slot} changed"
            ),
        }
    }
    for slot in half..records {
        let block = &all[slot * RECORD..(slot + 1) * RECORD];
        assert!(
            block.iter().all(|b| *b == 0) || is_whole_record(block),
            "shared record {slot} torn"
        );
    }
    all
}

#[test]
fn concurrent_writers_in_memory() {
    for (level, members, chunk) in [
        (Level::Raid6, 6, 4096u64),
        (Level::Raid5, 5, 16384),
        (Level::Raid10, 3, 4096),
        (Level::Raid1, 3, 4096),
    ] {
        let (io, array) = mem_array(level, members, chunk, 16);
        let array = Arc::new(array);
        let model = hammer(&array);
        verify_array_members(&io, &array, &model);
    }
}

/// The same on member files: several threads, each with its own io_uring.
#[test]
fn concurrent_writers_on_files() {
    let dir = TempDir::new("concurrency");
    let paths = dir.members(4);
    create(&CreateOptions {
        force: false,
        level: Level::Raid5,
        chunk_bytes: 4096,
        name: "conc".to_string(),
        size_bytes: Some(DEFAULT_DATA_OFFSET_BYTES + (256 << 10)),
        members: paths.clone(),
    })
    .expect("create");
    let array = Arc::new(assemble(&paths, AssembleOptions::new(reference())).expect("assemble"));
    let model = hammer(&array);
    let g = array.geometry();
    array.flush().expect("flush");
    verify_members(
        &g,
        &data_areas(&read_files(&paths), DEFAULT_DATA_OFFSET_BYTES, &g),
        &model,
    );
    let array = Arc::try_unwrap(array).unwrap_or_else(|_| panic!("array still shared"));
    array.stop().expect("stop");
}
