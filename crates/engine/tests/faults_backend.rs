//! Fault matrix row 14: the parity backend. Every backend this machine offers (each CPU backend, and what
//! `--parity-backend gpu|auto` selects: the GPU, or the CPU it falls back to) must leave member bytes identical
//! to the reference's for the same requests, including degraded reads and writes; and a backend that computes
//! wrong parity must be caught by the audit that vouches for the others.

mod common_sim;

use std::sync::Arc;

use common_sim::*;
use paraid_parity::{select, Backend, BackendChoice};

/// The same requests, in the same order, on a fresh array with `backend`: writes of every shape, a member lost
/// (degraded reads and writes), then the data areas of the member images.
fn run_with(
    backend: Arc<dyn Backend>,
    level: Level,
    members: usize,
    chunk: u64,
) -> (Vec<Option<Vec<u8>>>, u64) {
    let (io, array) = new_array(level, members, chunk, 8, 14, backend.clone());
    let g = array.geometry();
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(1400 + members as u64);
    for _ in 0..40 {
        assert!(random_write(&array, &mut model, &mut rng));
    }
    array.stop().expect("stop");
    let mut images = images(&io);
    images[1] = None;
    let (io, array) = assemble_images(images, 0, backend).expect("degraded");
    let mut blocks = verify_all(&array, &mut model, "degraded read");
    for _ in 0..20 {
        assert!(random_write(&array, &mut model, &mut rng));
    }
    blocks += verify_all(&array, &mut model, "degraded writes");
    let data_offset = array.data_offset_bytes();
    array.stop().expect("stop");
    // Data areas only: superblocks carry random UUIDs and times.
    let areas = images_data(&images_of(&io), data_offset, &g);
    (areas, blocks)
}

fn images_of(io: &Stack) -> Vec<Option<Vec<u8>>> {
    io.inner().images()
}

fn images_data(images: &[Option<Vec<u8>>], data_offset: u64, g: &Geometry) -> Vec<Option<Vec<u8>>> {
    images
        .iter()
        .map(|i| {
            i.as_ref().map(|b| {
                b[data_offset as usize..(data_offset + g.member_data_bytes()) as usize].to_vec()
            })
        })
        .collect()
}

#[test]
fn row14_backend_differential() {
    let mut backends: Vec<(String, Arc<dyn Backend>)> = paraid_parity::cpu_backends()
        .into_iter()
        .map(|b| (b.name().to_string(), b))
        .collect();
    let mut fallbacks = 0;
    for choice in [BackendChoice::Gpu, BackendChoice::Auto] {
        let b = select(choice);
        let name = b.name().to_string();
        if choice == BackendChoice::Gpu
            && paraid_parity::cpu_backends()
                .iter()
                .any(|c| c.name() == name)
        {
            // No usable GPU here: `gpu` fell back to a CPU backend, as it must (logged by the dispatcher).
            println!("row 14: --parity-backend gpu fell back to CPU backend {name}");
            fallbacks += 1;
        }
        backends.push((format!("select({choice:?}) = {name}"), b));
    }
    let mut cases = 0;
    let mut blocks = 0;
    for (level, members, chunk) in [
        (Level::Raid5, 5, 8192u64),
        (Level::Raid6, 6, 8192),
        (Level::Raid6, 4, 4096),
    ] {
        let (want, _) = run_with(reference(), level, members, chunk);
        for (name, backend) in &backends {
            let (got, b) = run_with(backend.clone(), level, members, chunk);
            for (slot, (w, g)) in want.iter().zip(&got).enumerate() {
                assert!(
                    w == g,
                    "{name}, {level}/{members}: member {slot} differs from the reference"
                );
            }
            blocks += b;
            cases += 1;
        }
    }
    let names: Vec<&str> = backends.iter().map(|(n, _)| n.as_str()).collect();
    figure(
        "14",
        "row14_backend_differential",
        &format!(
            "{cases} differential cases ({} backends x 3 layouts: {}), member bytes identical to the \
             reference, {blocks} blocks verified; GPU fallbacks to CPU: {fallbacks}",
            backends.len(),
            names.join(", ")
        ),
    );
}

/// A backend that computes wrong parity now and then must not go unnoticed: the member audit (the reference
/// check over raw member bytes) flags the stripes it wrote. This is what gives the differential test its teeth.
#[test]
fn row14_faulty_backend_is_caught() {
    let faulty = Arc::new(FaultyBackend::new(reference(), 1, 1));
    let (io, array) = new_array(Level::Raid6, 6, 8192, 8, 0, faulty.clone());
    let g = array.geometry();
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(14);
    for _ in 0..30 {
        assert!(random_write(&array, &mut model, &mut rng));
    }
    let data_offset = array.data_offset_bytes();
    array.stop().expect("stop");
    assert!(
        faulty.corrupted() > 0,
        "the faulty backend corrupted parity"
    );
    let audit = audit_images(
        &g,
        data_offset,
        &images_of(&io),
        model.settled_bytes().as_deref(),
    );
    assert!(
        !audit.bad_stripes.is_empty(),
        "{} corrupted parity computations went unnoticed",
        faulty.corrupted()
    );
    figure(
        "14",
        "row14_faulty_backend_is_caught",
        &format!(
            "{} wrong parity computations, {} stripes flagged by the reference audit",
            faulty.corrupted(),
            audit.bad_stripes.len()
        ),
    );
}
