//! Shared test helpers: a seeded generator, an in-memory array, and checks that read member bytes directly.
#![allow(dead_code)]

use std::sync::Arc;

use paraid_engine::layout::{Geometry, Level};
use paraid_engine::sim::audit::audit_images;
use paraid_engine::{assemble_io, create_io, Array, AssembleOptions, MemMembers};
use paraid_parity::reference::Reference;
use paraid_parity::Backend;

/// SplitMix64: small, seeded, good enough to drive tests reproducibly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

pub fn reference() -> Arc<dyn Backend> {
    Arc::new(Reference)
}

/// A fresh array on in-memory members: `rows` chunks of data area per member.
pub fn mem_array(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
) -> (Arc<MemMembers>, Array) {
    let member_bytes = paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES + rows * chunk_bytes;
    let io = Arc::new(MemMembers::new(members, member_bytes));
    create_io(io.as_ref(), level, chunk_bytes, "test").expect("create_io");
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble_io");
    (io, array)
}

/// A random request: offset anywhere, length biased to small and odd, sometimes spanning stripes.
pub fn random_extent(rng: &mut Rng, array_bytes: u64, stripe_bytes: u64) -> (u64, usize) {
    let max_len = match rng.below(4) {
        0 => 512,
        1 => 8192,
        2 => stripe_bytes,
        _ => 3 * stripe_bytes,
    }
    .min(array_bytes);
    let len = 1 + rng.below(max_len);
    let offset = rng.below(array_bytes - len + 1);
    (offset, len as usize)
}

/// A healthy in-memory array of `rows` chunks per member filled with random data (from `seed`), stopped; returns
/// the member images and the model (the array contents).
pub fn filled(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
    seed: u64,
) -> (Vec<Option<Vec<u8>>>, Vec<u8>) {
    let (io, array) = mem_array(level, members, chunk_bytes, rows);
    let mut model = vec![0u8; array.size_bytes() as usize];
    Rng::new(seed).fill(&mut model);
    array.write(0, &model, false).expect("fill");
    array.stop().expect("stop");
    ((0..members).map(|s| io.image(s)).collect(), model)
}

/// `ops` rounds of a random write (recorded in `model`) and a random read checked against `model`; `what` names
/// the case in a failure.
pub fn random_writes_and_reads(array: &Array, model: &mut [u8], seed: u64, ops: usize, what: &str) {
    let stripe_bytes = array.geometry().stripe_bytes();
    let mut rng = Rng::new(seed);
    for op in 0..ops {
        let (offset, len) = random_extent(&mut rng, array.size_bytes(), stripe_bytes);
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        array.write(offset, &data, false).expect("degraded write");
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        let (offset, len) = random_extent(&mut rng, array.size_bytes(), stripe_bytes);
        let mut got = vec![0u8; len];
        array.read(offset, &mut got).expect("degraded read");
        assert!(
            got == model[offset as usize..offset as usize + len],
            "{what}: op {op} read differs"
        );
    }
}

/// Member data areas (bytes from `data_offset` on), `None` for missing members.
pub fn data_areas(
    images: &[Option<Vec<u8>>],
    data_offset: u64,
    g: &Geometry,
) -> Vec<Option<Vec<u8>>> {
    images
        .iter()
        .map(|image| {
            image.as_ref().map(|bytes| {
                bytes[data_offset as usize..(data_offset + g.member_data_bytes()) as usize].to_vec()
            })
        })
        .collect()
}

/// Checks every stripe's parity from raw member bytes with the Reference backend, and every copy of every
/// data chunk against `model` (the array contents expected); members given as `None` are skipped. `areas` are
/// data areas (as `data_areas` cuts them), hence a data offset of 0 for the library's audit.
pub fn verify_members(g: &Geometry, areas: &[Option<Vec<u8>>], model: &[u8]) {
    let report = audit_images(g, 0, areas, Some(model));
    assert!(report.clean(), "{g:?}: {}", report.describe());
}

/// `verify_members` over the data areas of every member of `array`, whose images `io` holds.
pub fn verify_array_members(io: &MemMembers, array: &Array, model: &[u8]) {
    let g = array.geometry();
    let images: Vec<Option<Vec<u8>>> = (0..g.members).map(|s| io.image(s)).collect();
    verify_members(
        &g,
        &data_areas(&images, array.data_offset_bytes(), &g),
        model,
    );
}

/// A private directory under the system temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "paraid-engine-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }

    pub fn members(&self, count: usize) -> Vec<std::path::PathBuf> {
        (0..count)
            .map(|i| self.path(&format!("m{i}.img")))
            .collect()
    }

    /// `create` of an array named "test" on `count` member files here (`members`), each `member_bytes`.
    pub fn create_array(
        &self,
        level: Level,
        count: usize,
        chunk_bytes: u64,
        member_bytes: u64,
    ) -> Vec<std::path::PathBuf> {
        let paths = self.members(count);
        paraid_engine::create(&paraid_engine::CreateOptions {
            force: false,
            level,
            chunk_bytes,
            name: "test".to_string(),
            size_bytes: Some(member_bytes),
            members: paths.clone(),
        })
        .expect("create");
        paths
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Member files' bytes, read directly (not through the engine).
pub fn read_files(paths: &[std::path::PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths
        .iter()
        .map(|p| Some(std::fs::read(p).expect("read member file")))
        .collect()
}

/// Bytes allocated to a file (st_blocks * 512).
pub fn allocated_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

/// A little-endian u32 at byte `at` (readers of docs/format.md).
pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// A little-endian u64 at byte `at` (readers of docs/format.md).
pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// CRC-32C bit by bit, as docs/format.md specifies it: independent of the engine's table-driven one.
pub fn crc32c_bitwise(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    crc ^ 0xFFFF_FFFF
}

/// The engine's `forward_member_io!`, for the tests' member wrappers.
#[allow(unused_imports)]
pub(crate) use paraid_engine::forward_member_io;
