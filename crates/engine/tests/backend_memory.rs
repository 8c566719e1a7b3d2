//! The engine's batches of whole stripes in the parity backend's own memory (`Backend::alloc_host`): a GPU
//! serves such batches in place, without a staging copy (crates/parity/src/cuda/in_place.rs). A GPU is not at
//! hand here, so a backend stands in for it that lends memory and counts, for every batch, whether each of its
//! chunks lies in memory it lent: a rebuild's recoveries, a check's verifications and the parity of whole
//! stripes written must; written from a frontend's buffer, the data chunks lie where the frontend received them
//! (in lent memory when it asked the array for it, `Array::payload_memory`). Then the member images are audited
//! with the reference.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{verify_array_members, Rng};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{
    assemble_io, create_io, AddOutcome, Array, AssembleOptions, MemMembers, NewMember,
};
use paraid_parity::reference::Reference;
use paraid_parity::{Backend, CheckOutcome, HostBuf, ParityError, StripeGen, StripeRecover};

const WAIT: Duration = Duration::from_secs(60);
const CHUNK_BYTES: u64 = 64 << 10;
const ROWS: u64 = 64;

/// The reference backend, lending memory and counting batches by where their chunks lie.
#[derive(Default)]
struct Lender {
    /// Lent buffers: (start, length); a buffer is forgotten when freed.
    lent: Arc<Mutex<Vec<(usize, usize)>>>,
    buffers_lent: AtomicU64,
    /// Batches whose every chunk lay in lent memory, and the others.
    inside: AtomicU64,
    outside: AtomicU64,
}

impl Lender {
    fn count<'a>(&self, chunks: impl IntoIterator<Item = &'a [u8]>) {
        let lent = self.lent.lock().unwrap();
        let all_lent = chunks.into_iter().all(|c| {
            let at = c.as_ptr() as usize;
            lent.iter()
                .any(|&(start, len)| at >= start && at + c.len() <= start + len)
        });
        if all_lent {
            &self.inside
        } else {
            &self.outside
        }
        .fetch_add(1, Relaxed);
    }

    fn counts(&self) -> (u64, u64) {
        (self.inside.load(Relaxed), self.outside.load(Relaxed))
    }
}

impl Backend for Lender {
    fn name(&self) -> &'static str {
        "lender"
    }
    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        Reference.gen_p(data, p)
    }
    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        Reference.gen_pq(data, p, q)
    }
    fn update(&self, index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: Option<&mut [u8]>) {
        Reference.update(index, old, new, p, q)
    }
    fn recover(
        &self,
        chunks: &mut [&mut [u8]],
        has_q: bool,
        missing: &[usize],
    ) -> Result<(), ParityError> {
        Reference.recover(chunks, has_q, missing)
    }
    fn check(&self, chunks: &[&[u8]], has_q: bool) -> CheckOutcome {
        Reference.check(chunks, has_q)
    }
    fn gen_batch(&self, stripes: &mut [StripeGen<'_>]) {
        self.count(
            stripes
                .iter()
                .flat_map(|s| s.data.iter().copied().chain([&*s.p]).chain(s.q.as_deref())),
        );
        Reference.gen_batch(stripes)
    }
    fn recover_batch(&self, stripes: &mut [StripeRecover<'_>]) -> Result<(), ParityError> {
        self.count(stripes.iter().flat_map(|s| s.chunks.iter().map(|c| &**c)));
        Reference.recover_batch(stripes)
    }
    fn check_batch(&self, stripes: &[&[&[u8]]], has_q: bool, out: &mut [CheckOutcome]) {
        self.count(stripes.iter().flat_map(|s| s.iter().copied()));
        Reference.check_batch(stripes, has_q, out)
    }
    fn alloc_host(&self, bytes: usize) -> Option<HostBuf> {
        let mut buf = HostBuf::zeroed(bytes);
        self.lent
            .lock()
            .unwrap()
            .push((buf.as_ptr() as usize, buf.len()));
        self.buffers_lent.fetch_add(1, Relaxed);
        let lent = self.lent.clone();
        buf.set_release(Box::new(move |at, _| {
            lent.lock()
                .unwrap()
                .retain(|&(start, _)| start != at as usize);
        }));
        Some(buf)
    }
}

/// Between two counts (inside, outside): `what` ran batches, every one of them in lent memory.
fn all_in_lent_memory(before: (u64, u64), after: (u64, u64), what: &str) {
    assert!(
        after.0 > before.0,
        "{what} ran no batch in lent memory: {after:?}"
    );
    assert_eq!(
        after.1, before.1,
        "a batch of {what} lay outside lent memory"
    );
}

/// A RAID6 of six in-memory members, `ROWS` rows, on `parity`.
fn raid6_of(parity: Arc<dyn Backend>) -> (Arc<MemMembers>, Array) {
    let member_bytes = DEFAULT_DATA_OFFSET_BYTES + ROWS * CHUNK_BYTES;
    let io = Arc::new(MemMembers::new(6, member_bytes));
    create_io(io.as_ref(), Level::Raid6, CHUNK_BYTES, "lent").expect("create");
    let array = assemble_io(io.clone(), AssembleOptions::new(parity)).expect("assemble");
    (io, array)
}

/// The array reads back `model`, and the members hold it with parity the reference agrees with.
fn holds(io: &MemMembers, array: &Array, model: &[u8], when: &str) {
    let mut back = vec![0u8; model.len()];
    array.read(0, &mut back).expect("read back");
    assert!(back == model, "contents {when}");
    verify_array_members(io, array, model);
}

#[test]
fn rebuild_and_check_batches_are_in_backend_memory() {
    let lender = Arc::new(Lender::default());
    let (io, array) = raid6_of(lender.clone());
    let mut model = vec![0u8; array.size_bytes() as usize];
    Rng::new(0x1e7).fill(&mut model);
    // Written from a buffer off a page boundary: the write path copies the data into its scratch area, which is
    // lent memory, beside the parity.
    let mut skewed = vec![0u8; model.len() + 1];
    skewed[1..].copy_from_slice(&model);
    array.write(0, &skewed[1..], false).expect("fill");
    array.flush().expect("flush");
    all_in_lent_memory((0, 0), lender.counts(), "the fill");

    // A degraded read solves each piece on its own (`Backend::recover`, not a batch).
    array.fail_member(3).expect("fail");
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("degraded read");
    assert!(all == model, "degraded read");
    let before = lender.counts();

    // The rebuild's batches: every one in lent memory.
    array.remove_member(3).expect("remove");
    let outcome = array
        .add_member(NewMember::Image {
            label: "new3".into(),
            size_bytes: DEFAULT_DATA_OFFSET_BYTES + ROWS * CHUNK_BYTES,
        })
        .expect("add");
    assert_eq!(outcome, AddOutcome::Rebuilding { slot: 3 });
    assert!(array.wait_idle(WAIT), "rebuild finished");
    assert_eq!(
        array.last_result().and_then(|r| r.outcome).as_deref(),
        Some("completed")
    );
    let after_rebuild = lender.counts();
    all_in_lent_memory(before, after_rebuild, "the rebuild");

    // A check's batches too, and it finds nothing wrong.
    array.start_check(false).expect("check");
    assert!(array.wait_idle(WAIT), "check finished");
    let check = array.last_result().expect("a check result");
    assert_eq!(check.outcome.as_deref(), Some("completed"));
    assert_eq!(check.mismatches, 0);
    let after_check = lender.counts();
    all_in_lent_memory(after_rebuild, after_check, "the check");
    assert!(lender.buffers_lent.load(Relaxed) > 0);

    holds(&io, &array, &model, "after the rebuild");
    eprintln!(
        "batches in lent memory: {}, outside: {}; buffers lent: {}",
        after_check.0,
        after_check.1,
        lender.buffers_lent.load(Relaxed)
    );
}

#[test]
fn whole_stripes_written_from_lent_memory_are_computed_there() {
    let lender = Arc::new(Lender::default());
    let (io, array) = raid6_of(lender.clone());
    let g = array.geometry();
    let len = 8 * g.stripe_bytes() as usize;
    let mut model = vec![0u8; array.size_bytes() as usize];

    // Whole stripes from ordinary memory on a page boundary: computed where they lie (no copy), outside lent
    // memory.
    let mut plain = HostBuf::zeroed(len);
    Rng::new(0x9a1).fill(&mut plain);
    let before = lender.counts();
    array.write(0, &plain, false).expect("write from the heap");
    model[..len].copy_from_slice(&plain);
    let after_plain = lender.counts();
    assert!(after_plain.1 > before.1, "{after_plain:?}");
    assert_eq!(after_plain.0, before.0, "{after_plain:?}");

    // From the memory the array lends for payloads (what NBD and ublk receive into): every batch in lent memory,
    // parity included.
    let mut lent = array
        .payload_memory(len)
        .expect("a backend that lends memory lends payload memory");
    Rng::new(0x9a2).fill(&mut lent[..len]);
    array
        .write(len as u64, &lent[..len], false)
        .expect("write from lent memory");
    model[len..2 * len].copy_from_slice(&lent[..len]);
    let after_lent = lender.counts();
    all_in_lent_memory(
        after_plain,
        after_lent,
        "whole-stripe writes from lent memory",
    );

    // A partial-stripe write from lent memory is right too (it reads before it writes; not a batch of whole
    // stripes).
    let at = 2 * len + 4096 * 3;
    Rng::new(0x9a3).fill(&mut lent[..20_000]);
    array
        .write(at as u64, &lent[..20_000], false)
        .expect("partial write from lent memory");
    model[at..at + 20_000].copy_from_slice(&lent[..20_000]);
    drop(lent);

    array.flush().expect("flush");
    holds(&io, &array, &model, "after the writes");

    // A backend that lends nothing: no payload memory either.
    let (_, plain_array) = raid6_of(Arc::new(Reference));
    assert!(plain_array.payload_memory(len).is_none());
}
