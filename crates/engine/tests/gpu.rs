//! The array on the CUDA parity backend: a RAID6's writes, degraded reads, a two-member rebuild, and a check and
//! repair all run their parity through the GPU, and the member images are then audited with the reference
//! backend. Where there is no GPU the test prints why it skipped (CI has none; the device tool's H100 runs it).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{verify_array_members, Rng};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{
    assemble_io, create_io, AddOutcome, Array, AssembleOptions, MemMembers, NewMember, SlotState,
};
use paraid_parity::cuda::{driver_present, CudaBackend, GpuPolicy};
use paraid_parity::{cpu_best, Backend};

const WAIT: Duration = Duration::from_secs(60);
const MEMBERS: usize = 6;
const CHUNK_BYTES: u64 = 64 << 10;
const ROWS: u64 = 96;

/// The GPU backend on every batch, or None with the reason printed.
fn gpu_backend() -> Option<Arc<CudaBackend>> {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver (libcuda cannot be loaded), so there is no GPU to test");
        return None;
    }
    match CudaBackend::new(cpu_best(), GpuPolicy::Always) {
        Ok(gpu) => Some(Arc::new(gpu)),
        Err(e) => {
            eprintln!("skipped: a CUDA driver is present but the GPU cannot be used: {e}");
            None
        }
    }
}

fn read_all(array: &Array) -> Vec<u8> {
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read all");
    all
}

fn run_check(array: &Array, repair: bool) -> paraid_engine::Progress {
    array.start_check(repair).expect("start check");
    assert!(array.wait_idle(WAIT), "check finished");
    let result = array.last_result().expect("a check result");
    assert_eq!(result.outcome.as_deref(), Some("completed"), "{result:?}");
    result
}

/// GPU batches so far, or 0 without a GPU.
fn gpu_batches(gpu: Option<&CudaBackend>) -> u64 {
    gpu.map_or(0, |gpu| gpu.batches().0)
}

/// The scenario on `parity`; with `gpu` given (the same backend), each phase must have run batches on it.
fn writes_rebuild_and_check(parity: Arc<dyn Backend>, gpu: Option<&CudaBackend>) {
    eprintln!("parity backend: {}", parity.describe());
    let on_gpu = |after: u64, what: &str| {
        let now = gpu_batches(gpu);
        if gpu.is_some() {
            assert!(now > after, "{what} ran no batch on the GPU");
        }
        now
    };
    let member_bytes = DEFAULT_DATA_OFFSET_BYTES + ROWS * CHUNK_BYTES;
    let io = Arc::new(MemMembers::new(MEMBERS, member_bytes));
    create_io(io.as_ref(), Level::Raid6, CHUNK_BYTES, "gpu").expect("create");
    let array = assemble_io(io.clone(), AssembleOptions::new(parity.clone())).expect("assemble");
    let g = array.geometry();
    let mut rng = Rng::new(0x6e0);

    // Whole stripes, then small writes that read-modify-write.
    let mut model = vec![0u8; array.size_bytes() as usize];
    rng.fill(&mut model);
    array.write(0, &model, false).expect("fill");
    // Whole stripes from the memory the array lends its frontends (what NBD and ublk receive into): on a GPU
    // they are computed in place.
    let in_place_before = gpu.map_or(0, |gpu| gpu.batches_in_place());
    let stripes_len = (ROWS / 2 * g.stripe_bytes()) as usize;
    if let Some(mut lent) = array.payload_memory(stripes_len) {
        rng.fill(&mut lent[..stripes_len]);
        array
            .write(0, &lent[..stripes_len], false)
            .expect("whole stripes from payload memory");
        model[..stripes_len].copy_from_slice(&lent[..stripes_len]);
    }
    if let Some(gpu) = gpu {
        let in_place = gpu.batches_in_place() - in_place_before;
        assert!(
            in_place > 0,
            "whole stripes written from payload memory ran no batch in place"
        );
        eprintln!("whole-stripe writes from payload memory: {in_place} batches served in place");
    }
    for _ in 0..200 {
        let len = 1 + rng.below(3 * CHUNK_BYTES) as usize;
        let offset = rng.below(array.size_bytes() - len as u64) as usize;
        rng.fill(&mut model[offset..offset + len]);
        array
            .write(offset as u64, &model[offset..offset + len], false)
            .expect("write");
    }
    array.flush().expect("flush");
    verify_array_members(&io, &array, &model);
    let after_writes = on_gpu(0, "the writes");

    // Two members gone: every read of their chunks is recovered.
    let lost = [1usize, 4];
    for slot in lost {
        array.fail_member(slot).expect("fail");
    }
    assert!(
        read_all(&array) == model,
        "degraded reads with two members failed"
    );

    // Both rebuilt onto new members, one after the other.
    let in_place_before = gpu.map_or(0, |gpu| gpu.batches_in_place());
    for slot in lost {
        array.remove_member(slot).expect("remove");
    }
    for slot in lost {
        let outcome = array
            .add_member(NewMember::Image {
                label: format!("new{slot}"),
                size_bytes: member_bytes,
            })
            .expect("add");
        assert_eq!(outcome, AddOutcome::Rebuilding { slot });
        assert!(array.wait_idle(WAIT), "rebuild of slot {slot} finished");
        let result = array.last_result().expect("a rebuild result");
        assert_eq!(result.outcome.as_deref(), Some("completed"), "{result:?}");
        assert_eq!(array.slot_state(slot), SlotState::Active);
    }
    assert!(read_all(&array) == model, "contents after the rebuild");
    verify_array_members(&io, &array, &model);
    let after_rebuild = on_gpu(after_writes, "the rebuild");
    if let Some(gpu) = gpu {
        // The rebuild's buffers are the backend's registered host memory: its batches skip the staging copy.
        let in_place = gpu.batches_in_place() - in_place_before;
        assert!(
            in_place > 0,
            "the rebuild ran no batch in place: {}",
            gpu.describe()
        );
        eprintln!("rebuild: {in_place} batches served in place");
        // One launch per rebuild batch of many rows, not one per row (the lost chunk's role rotates from row to
        // row, and rows whose Q was not read are recovered without it: one launch mixes them all).
        assert!(
            in_place * 4 <= 2 * ROWS,
            "{in_place} batches in place for {} rebuilt rows: not batched",
            2 * ROWS
        );
    }

    // One bad chunk in every seventh stripe: the check names its member, the repair rewrites it.
    let width = g.data_per_stripe() + g.level.parity_chunks();
    let mut corrupted = Vec::new();
    for stripe in (2..g.stripes()).step_by(7) {
        let member = g.stripe_member(stripe, rng.below(width as u64) as usize);
        let at = array.data_offset_bytes() + stripe * CHUNK_BYTES + rng.below(CHUNK_BYTES);
        let byte = io.image(member).expect("present")[at as usize] ^ 0x10;
        io.poke(member, at, &[byte]);
        corrupted.push((stripe, member));
    }
    let in_place_before = gpu.map_or(0, |gpu| gpu.batches_in_place());
    let found = run_check(&array, false);
    if let Some(gpu) = gpu {
        // The check's batches are in the backend's registered memory too.
        let in_place = gpu.batches_in_place() - in_place_before;
        assert!(
            in_place > 0,
            "the check ran no batch in place: {}",
            gpu.describe()
        );
        eprintln!("check: {in_place} batches served in place");
    }
    assert_eq!(
        found.mismatches,
        corrupted.len() as u64,
        "every bad chunk found"
    );
    let named: Vec<(u64, Option<usize>)> = array
        .check_findings()
        .iter()
        .map(|f| (f.stripe, f.slot))
        .collect();
    let expected: Vec<(u64, Option<usize>)> = corrupted
        .iter()
        .map(|&(stripe, member)| (stripe, Some(member)))
        .collect();
    assert_eq!(named, expected, "each stripe's bad member named");
    let repaired = run_check(&array, true);
    assert_eq!(repaired.repaired, corrupted.len() as u64);
    assert_eq!(
        run_check(&array, false).mismatches,
        0,
        "consistent after the repair"
    );
    array.flush().expect("flush");
    verify_array_members(&io, &array, &model);

    on_gpu(after_rebuild, "the check and repair");
    if let Some(gpu) = gpu {
        assert!(
            gpu.gpu_enabled(),
            "the GPU was switched off: {}",
            gpu.describe()
        );
    }
    eprintln!("done on {}", parity.describe());
    array.stop().expect("stop");
}

#[test]
fn raid6_writes_rebuild_and_check_on_the_gpu() {
    let Some(gpu) = gpu_backend() else {
        return;
    };
    writes_rebuild_and_check(gpu.clone(), Some(&gpu));
}

/// The same scenario on the best CPU backend: what the GPU run is held to, and a check of the scenario itself
/// where no GPU is.
#[test]
fn raid6_writes_rebuild_and_check_on_the_cpu() {
    writes_rebuild_and_check(cpu_best(), None);
}
