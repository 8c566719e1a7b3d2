//! What the write path asks of the members: RMW or RCW, whichever reads less; a full-stripe write reads
//! nothing; all member operations of a request go out in one batch. What a degraded read asks: each survivor's
//! chunk of a stripe once.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{forward_member_io, reference};
use paraid_engine::layout::Level;
use paraid_engine::{
    assemble_io, create_io, Array, AssembleOptions, IoOp, IoReq, MemMembers, MemberIo,
};

/// Counts what passes through to in-memory members' data areas (the write-intent bitmap and the partial parity log
/// before the data area have tests of their own: integrity_*.rs).
struct Counting {
    inner: MemMembers,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    batches: AtomicU64,
    ops: AtomicU64,
}

impl MemberIo for Counting {
    forward_member_io!(inner, attach);
    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        let data_offset = paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
        let mut counted = 0;
        for req in reqs.iter() {
            match &req.op {
                IoOp::Read { buf, offset_bytes } if *offset_bytes >= data_offset => self
                    .read_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed),
                IoOp::Write {
                    buf, offset_bytes, ..
                } if *offset_bytes >= data_offset => self
                    .write_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed),
                IoOp::Flush | IoOp::Discard { .. } => 0,
                _ => continue,
            };
            counted += 1;
        }
        if counted > 0 {
            self.batches.fetch_add(1, Ordering::Relaxed);
            self.ops.fetch_add(counted, Ordering::Relaxed);
        }
        self.inner.submit(reqs);
    }
}

impl Counting {
    /// (read bytes, write bytes, batches, ops) since the last call.
    fn take(&self) -> (u64, u64, u64, u64) {
        (
            self.read_bytes.swap(0, Ordering::Relaxed),
            self.write_bytes.swap(0, Ordering::Relaxed),
            self.batches.swap(0, Ordering::Relaxed),
            self.ops.swap(0, Ordering::Relaxed),
        )
    }
}

/// An array whose member I/O is counted, without the stripe cache (the patterns below are what a write asks of
/// the members when nothing is cached; `cached_pages_are_not_read_again` is the cache's).
fn counted(level: Level, members: usize, chunk: u64) -> (Arc<Counting>, Array) {
    counted_with_cache(level, members, chunk, 0)
}

fn counted_with_cache(
    level: Level,
    members: usize,
    chunk: u64,
    stripe_cache_bytes: usize,
) -> (Arc<Counting>, Array) {
    let size = paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES + 8 * chunk;
    let io = Arc::new(Counting {
        inner: MemMembers::new(members, size),
        read_bytes: AtomicU64::new(0),
        write_bytes: AtomicU64::new(0),
        batches: AtomicU64::new(0),
        ops: AtomicU64::new(0),
    });
    create_io(io.as_ref(), level, chunk, "count").expect("create");
    let opts = AssembleOptions {
        stripe_cache_bytes: Some(stripe_cache_bytes),
        ..AssembleOptions::new(reference())
    };
    let array = assemble_io(io.clone(), opts).expect("assemble");
    io.take();
    (io, array)
}

const PAGE: u64 = 4096;

#[test]
fn full_stripe_write_reads_nothing_and_is_one_batch() {
    for (level, n) in [(Level::Raid5, 5usize), (Level::Raid6, 6)] {
        let chunk = 65536;
        let (io, array) = counted(level, n, chunk);
        let k = (n - level.parity_chunks()) as u64;
        array
            .write(k * chunk, &vec![3u8; (k * chunk) as usize], false)
            .expect("write");
        let (read, written, batches, ops) = io.take();
        assert_eq!(read, 0, "{level}: a full-stripe write read {read} bytes");
        assert_eq!(
            written,
            n as u64 * chunk,
            "{level}: every member gets one chunk"
        );
        assert_eq!(
            (batches, ops),
            (1, n as u64),
            "{level}: one batch of one write per member"
        );
    }
}

#[test]
fn small_write_uses_read_modify_write() {
    // RAID5 of 8: a 4 KiB write reads old data + old P (2 pages), not the 6 other data pages RCW would need.
    let (io, array) = counted(Level::Raid5, 8, 65536);
    array
        .write(3 * 65536 + 8192, &[7u8; 4096], false)
        .expect("write");
    let (read, written, batches, _) = io.take();
    assert_eq!(read, 2 * PAGE);
    assert_eq!(written, 2 * PAGE);
    assert_eq!(batches, 2, "one batch of reads, one of writes");
    // RAID6 of 8: old data + P + Q.
    let (io, array) = counted(Level::Raid6, 8, 65536);
    array.write(100, &[7u8; 10], false).expect("write");
    let (read, written, _, _) = io.take();
    assert_eq!((read, written), (3 * PAGE, 3 * PAGE));
}

#[test]
fn large_partial_write_uses_reconstruct_write() {
    // RAID5 of 5 (4 data chunks): overwrite 3 of 4 chunks; RCW reads the 4th (1 chunk), RMW would read 4.
    let chunk = 16384;
    let (io, array) = counted(Level::Raid5, 5, chunk);
    array
        .write(0, &vec![1u8; 3 * chunk as usize], false)
        .expect("write");
    let (read, written, _, _) = io.take();
    assert_eq!(read, chunk);
    assert_eq!(written, 4 * chunk);
    // Unaligned edges: RCW reads around the fully overwritten pages, i.e. the untouched chunk plus two edge pages.
    array
        .write(100, &vec![1u8; 3 * chunk as usize - 200], false)
        .expect("write");
    let (read, _, _, _) = io.take();
    assert_eq!(read, chunk + 2 * PAGE);
}

#[test]
fn cached_pages_are_not_read_again() {
    // RAID6 of 8: the first small write reads old data, P and Q; rewrites of the same pages read nothing, and
    // write the same as before.
    let (io, array) = counted_with_cache(Level::Raid6, 8, 65536, 1 << 20);
    array.write(100, &[7u8; 10], false).expect("write");
    assert_eq!(io.take().0, 3 * PAGE);
    for round in 0..3u8 {
        array.write(200, &[round; 10], false).expect("rewrite");
        let (read, written, batches, _) = io.take();
        assert_eq!((read, written), (0, 3 * PAGE), "round {round}");
        assert_eq!(batches, 1, "writes only");
    }
    // A reconstruct-write keeps what it wrote too: three of four chunks written (the fourth read), then a
    // piece of one page of the first rewritten as a read-modify-write from the cache.
    let (io, array) = counted_with_cache(Level::Raid5, 5, 16384, 8 << 20);
    array.write(0, &vec![1u8; 3 * 16384], false).expect("write");
    assert_eq!(io.take().0, 16384, "the untouched chunk");
    array.flush().expect("flush");
    array.write(4096 + 10, &[2u8; 100], false).expect("rewrite");
    assert_eq!(io.take().0, 0);
    let stats = array.detail().stripe_cache;
    assert!(stats.hits > 0 && stats.held_bytes > 0, "{stats:?}");
}

#[test]
fn mirror_write_goes_to_every_copy_in_one_batch() {
    let (io, array) = counted(Level::Raid1, 3, 4096);
    array.write(4096, &[9u8; 8192], true).expect("write");
    let (read, written, batches, ops) = io.take();
    assert_eq!((read, written, batches, ops), (0, 3 * 8192, 1, 6));
    // A sub-page write reads its page once, then writes it to every copy.
    array.write(10, &[9u8; 5], false).expect("write");
    let (read, written, batches, _) = io.take();
    assert_eq!((read, written, batches), (PAGE, 3 * PAGE, 2));
}

#[test]
fn flush_reaches_every_member_at_once() {
    let (io, array) = counted(Level::Raid6, 6, 4096);
    array.flush().expect("flush");
    let (_, _, batches, ops) = io.take();
    assert_eq!((batches, ops), (1, 6));
}

#[test]
fn raid6_rebuild_leaves_out_the_q_a_row_does_not_need() {
    // With only the rebuilt slot missing, a row whose missing chunk is data or P is solved from the data and P:
    // its Q is not read. Rows whose Q lives on the rebuilt slot read the data and P (all five survivors).
    let chunk = 65536;
    let (io, array) = counted(Level::Raid6, 6, chunk);
    let data: Vec<u8> = (0..array.size_bytes())
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    array.write(0, &data, false).expect("fill");
    array.fail_member(0).expect("fail");
    array.remove_member(0).expect("remove");
    io.take();
    let outcome = array
        .add_member(paraid_engine::NewMember::Image {
            label: "new".to_string(),
            size_bytes: paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES + 8 * chunk,
        })
        .expect("add");
    assert_eq!(outcome, paraid_engine::AddOutcome::Rebuilding { slot: 0 });
    assert!(array.wait_idle(std::time::Duration::from_secs(30)));
    let (read, written, _, _) = io.take();
    let g = array.geometry();
    let k = g.data_per_stripe();
    let q_on_slot = (0..g.rows)
        .filter(|&r| g.stripe_member(r, k + 1) == 0)
        .count() as u64;
    assert!(q_on_slot > 0 && q_on_slot < g.rows, "the layout rotates Q");
    assert_eq!(
        read,
        (g.rows * k as u64 + q_on_slot) * chunk,
        "survivor reads"
    );
    assert_eq!(written, g.rows * chunk, "the new member written once");
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).expect("read");
    assert!(back == data, "contents after the rebuild");
}

#[test]
fn degraded_read_of_whole_stripes_reads_each_survivor_once() {
    // A stripe read whole with one member out: the survivors' chunks are read once each (the missing chunk is
    // solved from them, and the data pieces come out of the same read), not once for the pieces and again for
    // the solving. RAID6 of 6 with one member out: five chunks per stripe instead of 4 + 5.
    for (level, n, out) in [
        (Level::Raid5, 5usize, 1usize),
        (Level::Raid6, 6, 1),
        (Level::Raid6, 6, 2),
    ] {
        let chunk = 65536;
        let (io, array) = counted(level, n, chunk);
        let data: Vec<u8> = (0..array.size_bytes())
            .map(|i| (i * 13 % 251) as u8)
            .collect();
        array.write(0, &data, false).expect("fill");
        for slot in 0..out {
            array.fail_member(slot).expect("fail");
        }
        io.take();
        let g = array.geometry();
        let mut back = vec![0u8; data.len()];
        array.read(0, &mut back).expect("degraded read");
        assert!(back == data, "{level} with {out} out: contents");
        let (read, written, _, _) = io.take();
        let survivors = (n - out) as u64;
        // Stripes with a data chunk on a missing member are read whole from the survivors; the others are read
        // directly, their data chunks only.
        let solved = (0..g.rows)
            .filter(|&r| (0..g.data_per_stripe()).any(|i| g.stripe_member(r, i) < out))
            .count() as u64;
        let k = g.data_per_stripe() as u64;
        assert!(solved > 0 && solved < g.rows, "the layout rotates");
        assert_eq!(
            read,
            (solved * survivors + (g.rows - solved) * k) * chunk,
            "{level} with {out} out: survivor reads"
        );
        assert_eq!(written, 0, "{level}: a read writes nothing");
        // Into a page-aligned buffer, whole chunks are read (and solved) where they go: same bytes.
        let mut aligned = paraid_parity::HostBuf::zeroed(data.len());
        array.read(0, &mut aligned).expect("degraded read, aligned");
        assert!(
            aligned[..] == data[..],
            "{level} with {out} out: contents, aligned"
        );
        assert_eq!(io.take().0, read, "{level} with {out} out: the same reads");
    }
}
