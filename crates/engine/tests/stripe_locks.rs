//! Stripe lock waits as the array reports them (`ArrayDetail::stripe_locks`): a small write into a stripe another
//! write holds waits for it (queued in a gather, array/gather.rs, or on the lock with combining off), and is counted
//! with its wait; a write into another stripe does not wait.

mod common_sim;

use std::time::Duration;

use common_sim::*;
use paraid_engine::StripeLockStats;

#[test]
fn a_write_into_a_held_stripe_is_counted_with_its_wait_and_one_elsewhere_is_not() {
    const CHUNK: u64 = 4096;
    let (io, array) = new_array(Level::Raid5, 4, CHUNK, 16, 41, reference());
    array.set_integrity_tick(false);
    let stripe = array.geometry().stripe_bytes();
    fill(&array, &mut SplitMix64::new(41));
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
