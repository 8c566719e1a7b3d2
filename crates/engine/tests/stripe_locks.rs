//! Stripe lock waits as the array reports them (`ArrayDetail::stripe_locks`): a small write into a stripe another
//! write holds waits for it, and is counted with its wait; a write into another stripe does not wait.

use std::sync::Arc;
use std::time::Duration;

use paraid_engine::fault::{CrashMembers, Fault, FaultyMembers, OpKinds, Scope};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{assemble_io, create_io, AssembleOptions, StripeLockStats};

#[test]
fn a_write_into_a_held_stripe_is_counted_with_its_wait_and_one_elsewhere_is_not() {
    const CHUNK: u64 = 4096;
    let rows = 16;
    let io = Arc::new(FaultyMembers::new(
        CrashMembers::new(4, DEFAULT_DATA_OFFSET_BYTES + rows * CHUNK),
        41,
    ));
    create_io(io.as_ref(), Level::Raid5, CHUNK, "locks").expect("create");
    let opts = AssembleOptions {
        stripe_cache_bytes: Some(0),
        ..AssembleOptions::new(Arc::new(paraid_parity::reference::Reference))
    };
    let array = assemble_io(io.clone(), opts).expect("assemble");
    array.set_integrity_tick(false);
    let stripe = array.geometry().stripe_bytes();
    let data: Vec<u8> = (0..array.size_bytes()).map(|i| (i % 251) as u8).collect();
    array.write(0, &data, false).expect("fill");
    array.flush().expect("flush");
    assert_eq!(
        array.detail().stripe_locks,
        StripeLockStats::default(),
        "one writer at a time waits for no one"
    );
    // From now on every member write sleeps 150 ms: a small write holds its stripe for its log record and its
    // in-place writes, 300 ms or more.
    io.add(
        Scope::all().ops(OpKinds::WRITE),
        Fault::Delay {
            delay: Duration::from_millis(150),
            one_in: 1,
            sleep: true,
        },
    );
    let page = vec![0xa5u8; 4096];
    std::thread::scope(|t| {
        let holder = t.spawn(|| array.write(2 * stripe, &page, false));
        std::thread::sleep(Duration::from_millis(50));
        // Chunk 1 of the same stripe, and chunk 0 of stripe 5.
        let same = t.spawn(|| array.write(2 * stripe + CHUNK, &page, false));
        let other = t.spawn(|| array.write(5 * stripe, &page, false));
        for writer in [holder, same, other] {
            writer.join().expect("writer").expect("write");
        }
    });
    let stats = array.detail().stripe_locks;
    assert_eq!(
        (stats.waits, stats.long_waits),
        (1, 1),
        "only the write into the held stripe waited: {stats:?}"
    );
    assert!(
        stats.wait_us >= 100_000,
        "it waited for the holder's member writes: {stats:?}"
    );
}
