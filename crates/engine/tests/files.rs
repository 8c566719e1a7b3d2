//! create / examine / assemble on sparse files through io_uring and O_DIRECT, including every refusal.

mod common;

use std::path::PathBuf;

use common::{
    allocated_bytes, data_areas, random_writes_and_reads, read_files, reference, verify_members,
    Rng, TempDir,
};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{
    assemble, create, create_with_data_offset, examine, ArrayState, AssembleOptions, CreateOptions,
    EngineError,
};

const MIB: u64 = 1 << 20;

fn options(level: Level, members: Vec<PathBuf>, size: Option<u64>) -> CreateOptions {
    CreateOptions {
        force: false,
        level,
        chunk_bytes: 65536,
        name: "files".to_string(),
        size_bytes: size,
        members,
    }
}

fn opts() -> AssembleOptions {
    AssembleOptions::new(reference())
}

/// Every file's bytes (or None when absent): to prove a refused call wrote nothing.
fn snapshot(paths: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths.iter().map(|p| std::fs::read(p).ok()).collect()
}

fn one_line(err: &EngineError) -> String {
    let text = err.to_string();
    assert!(!text.contains('\n'), "error spans lines: {text}");
    text
}

#[test]
fn create_examine_assemble_round_trip_every_level() {
    for (level, members) in [
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid10, 3),
    ] {
        let dir = TempDir::new("roundtrip");
        let paths = dir.members(members);
        let report = create(&options(level, paths.clone(), Some(6 * MIB))).expect("create");
        assert_eq!(report.data_offset_bytes, DEFAULT_DATA_OFFSET_BYTES);
        assert_eq!(report.member_data_bytes, 2 * MIB);
        assert_eq!(
            report.discarded_members, members,
            "files are zeroed by hole punching"
        );
        for (slot, path) in paths.iter().enumerate() {
            let sb = examine(path).expect("examine");
            assert_eq!(
                (sb.slot, sb.level, sb.members, sb.events),
                (slot, level, members, 0)
            );
            assert_eq!(sb.uuid.to_string(), report.uuid);
            assert_eq!(sb.state, ArrayState::Clean);
            assert_eq!(sb.array_bytes, report.array_bytes);
            assert!(
                allocated_bytes(path) < MIB,
                "{}: create left the data area allocated",
                path.display()
            );
        }

        // Members in another order than their slots.
        let mut shuffled = paths.clone();
        shuffled.reverse();
        let array = assemble(&shuffled, opts()).expect("assemble");
        assert_eq!(array.size_bytes(), report.array_bytes);
        let detail = array.detail();
        assert_eq!(detail.identity.events, 1);
        assert_eq!(detail.identity.state, ArrayState::Dirty);
        assert_eq!(detail.members[0].path, paths[0].display().to_string());
        assert_eq!(detail.parity_backend, "reference");
        let json = serde_json::to_value(&detail).expect("json");
        for field in [
            "uuid",
            "name",
            "level",
            "layout",
            "chunk_bytes",
            "size_bytes",
            "state",
            "events",
            "members",
        ] {
            assert!(json.get(field).is_some(), "detail lacks {field}");
        }
        assert_eq!(
            examine(&paths[0]).expect("examine").state,
            ArrayState::Dirty
        );

        let mut model = vec![0u8; array.size_bytes() as usize];
        let mut rng = Rng::new(members as u64);
        for _ in 0..40 {
            let len = 1 + rng.below(200_000) as usize;
            let offset = rng.below(array.size_bytes() - len as u64);
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            array
                .write(offset, &data, rng.below(4) == 0)
                .expect("write");
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
        }
        let mut all = vec![0u8; model.len()];
        array.read(0, &mut all).expect("read");
        assert!(all == model, "{level}: read back differs");
        let g = array.geometry();
        array.stop().expect("stop");
        for path in &paths {
            let sb = examine(path).expect("examine");
            assert_eq!((sb.events, sb.state), (2, ArrayState::Clean));
        }
        // The files themselves, read without the engine.
        verify_members(
            &g,
            &data_areas(&read_files(&paths), DEFAULT_DATA_OFFSET_BYTES, &g),
            &model,
        );

        // Reassembled, the data is still there.
        let array = assemble(&paths, opts()).expect("reassemble");
        array.read(0, &mut all).expect("read");
        assert!(all == model, "{level}: data lost across stop/assemble");
        array.stop().expect("stop");
    }
}

/// `create_with_data_offset` (`paraid create --data-offset`): the data area starts there, the log's ring fills the
/// room before it, the array assembles, serves and reassembles with its data where the files say; offsets that
/// are not whole MiB from 4 MiB to 1 GiB are refused with nothing written.
#[test]
fn a_larger_data_offset_moves_the_data_area_and_grows_the_log_ring() {
    let dir = TempDir::new("data-offset");
    let paths = dir.members(5);
    let offset = 16 * MIB;
    let report = create_with_data_offset(
        &options(Level::Raid6, paths.clone(), Some(20 * MIB)),
        offset,
    )
    .expect("create");
    assert_eq!(report.data_offset_bytes, offset);
    assert_eq!(report.member_data_bytes, 4 * MIB);
    let sb = examine(&paths[0]).expect("examine");
    assert_eq!(sb.data_offset_bytes, offset);
    assert!(
        sb.ppl_bytes > 15 * MIB && sb.ppl_offset_bytes + sb.ppl_bytes <= offset,
        "the log's ring fills the room before the data: {} bytes at {}",
        sb.ppl_bytes,
        sb.ppl_offset_bytes
    );
    let default = TempDir::new("data-offset-default");
    let default_paths = default.members(5);
    create(&options(
        Level::Raid6,
        default_paths.clone(),
        Some(20 * MIB),
    ))
    .expect("create");
    assert!(examine(&default_paths[0]).expect("examine").ppl_bytes < 4 * MIB);

    let array = assemble(&paths, opts()).expect("assemble");
    assert!(array.integrity().log_enabled);
    let mut model = vec![0u8; array.size_bytes() as usize];
    random_writes_and_reads(&array, &mut model, 16, 30, "data offset 16 MiB");
    let g = array.geometry();
    array.stop().expect("stop");
    // The files themselves, read without the engine, from the offset.
    verify_members(&g, &data_areas(&read_files(&paths), offset, &g), &model);
    let array = assemble(&paths, opts()).expect("reassemble");
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model, "data lost across stop/assemble");
    array.stop().expect("stop");

    let fresh = TempDir::new("data-offset-refused");
    let fresh_paths = fresh.members(5);
    for bad in [0, 3 * MIB, 4 * MIB + 4096, 2 << 30] {
        let before = snapshot(&fresh_paths);
        let err = create_with_data_offset(
            &options(Level::Raid6, fresh_paths.clone(), Some(20 * MIB)),
            bad,
        )
        .expect_err("refused");
        assert!(one_line(&err).contains("data offset"), "{err}");
        assert!(
            snapshot(&fresh_paths) == before,
            "a refused create wrote something"
        );
    }
}

/// Instant init: create discards old contents, so a member full of junk reads back as zeros with parity right.
#[test]
fn create_zeroes_old_contents() {
    let dir = TempDir::new("junk");
    let paths = dir.members(4);
    let mut rng = Rng::new(4);
    for path in &paths {
        let mut junk = vec![0u8; (5 * MIB) as usize];
        rng.fill(&mut junk);
        std::fs::write(path, &junk).expect("junk");
    }
    create(&options(Level::Raid5, paths.clone(), None)).expect("create");
    let array = assemble(&paths, opts()).expect("assemble");
    let mut all = vec![1u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read");
    assert!(all.iter().all(|b| *b == 0));
    let g = array.geometry();
    array.stop().expect("stop");
    verify_members(
        &g,
        &data_areas(&read_files(&paths), DEFAULT_DATA_OFFSET_BYTES, &g),
        &all,
    );
    for path in &paths {
        assert!(
            allocated_bytes(path) < MIB,
            "junk still allocated in {}",
            path.display()
        );
    }
}

#[test]
fn discard_punches_holes_in_member_files() {
    let dir = TempDir::new("discard");
    let paths = dir.members(4);
    create(&options(Level::Raid6, paths.clone(), Some(8 * MIB))).expect("create");
    let array = assemble(&paths, opts()).expect("assemble");
    let size = array.size_bytes();
    let mut data = vec![0u8; size as usize];
    Rng::new(8).fill(&mut data);
    array.write(0, &data, false).expect("write");
    array.flush().expect("flush");
    let full: u64 = paths.iter().map(|p| allocated_bytes(p)).sum();
    array.discard(0, size).expect("discard");
    array.flush().expect("flush");
    let after: u64 = paths.iter().map(|p| allocated_bytes(p)).sum();
    assert!(
        after + 4 * 4 * MIB / 2 <= full,
        "discard freed too little: {full} -> {after} bytes"
    );
    let mut all = vec![1u8; size as usize];
    array.read(0, &mut all).expect("read");
    assert!(all.iter().all(|b| *b == 0));
    array.stop().expect("stop");
}

// ----- refusals: one clear line naming what is wrong, and nothing written -----

fn refused_create(opts: &CreateOptions, watch: &[PathBuf]) -> EngineError {
    let before = snapshot(watch);
    let err = create(opts).expect_err("create should refuse");
    assert!(
        snapshot(watch) == before,
        "refused create wrote something: {err}"
    );
    err
}

#[test]
fn create_refusals() {
    let dir = TempDir::new("refuse-create");
    let paths = dir.members(4);
    for path in &paths {
        std::fs::write(path, vec![7u8; (6 * MIB) as usize]).expect("file");
    }
    let new_path = dir.path("new.img");
    let mut watch = paths.clone();
    watch.push(new_path.clone());

    let mut o = options(Level::Raid5, paths.clone(), None);
    o.chunk_bytes = 48 * 1024;
    let e = refused_create(&o, &watch);
    assert!(one_line(&e).contains("power of two"), "{e}");

    let o = options(Level::Raid6, paths[..3].to_vec(), None);
    assert!(one_line(&refused_create(&o, &watch)).contains("at least 4"));

    let mut o = options(Level::Raid5, paths.clone(), None);
    o.name = "x".repeat(33);
    assert!(one_line(&refused_create(&o, &watch)).contains("name"));

    // The same file twice, by the same path and through a symlink.
    let o = options(
        Level::Raid5,
        vec![paths[0].clone(), paths[1].clone(), paths[0].clone()],
        None,
    );
    let e = refused_create(&o, &watch);
    assert!(matches!(e, EngineError::CheckDuplicate { .. }), "{e}");
    assert!(one_line(&e).contains("m0.img"));
    let link = dir.path("link.img");
    std::os::unix::fs::symlink(&paths[1], &link).expect("symlink");
    let o = options(
        Level::Raid5,
        vec![paths[0].clone(), paths[1].clone(), link.clone()],
        None,
    );
    assert!(matches!(
        refused_create(&o, &watch),
        EngineError::CheckDuplicate { .. }
    ));
    // A file to be created, named twice.
    let o = options(
        Level::Raid1,
        vec![new_path.clone(), dir.0.join(".").join("new.img")],
        Some(6 * MIB),
    );
    assert!(matches!(
        refused_create(&o, &watch),
        EngineError::CheckDuplicate { .. }
    ));

    // Too small: one short member (no size given), and a size below data offset + one chunk.
    std::fs::write(&paths[3], vec![7u8; (4 * MIB) as usize]).expect("short file");
    let e = refused_create(&options(Level::Raid5, paths.clone(), None), &watch);
    assert!(matches!(e, EngineError::CheckMemberSize { .. }), "{e}");
    assert!(one_line(&e).contains("m3.img"), "{e}");
    std::fs::write(&paths[3], vec![7u8; (6 * MIB) as usize]).expect("file");
    let o = options(
        Level::Raid5,
        vec![new_path.clone(), paths[1].clone(), paths[2].clone()],
        Some(4 * MIB),
    );
    assert!(matches!(
        refused_create(&o, &watch),
        EngineError::CheckMemberSize { .. }
    ));

    let o = options(Level::Raid5, paths.clone(), Some(6 * MIB + 100));
    assert!(one_line(&refused_create(&o, &watch)).contains("multiple of 4096"));

    let o = options(
        Level::Raid5,
        vec![paths[0].clone(), paths[1].clone(), dir.0.clone()],
        None,
    );
    let e = refused_create(&o, &watch);
    assert!(matches!(e, EngineError::CheckMemberKind { .. }), "{e}");

    let o = options(
        Level::Raid5,
        vec![paths[0].clone(), paths[1].clone(), new_path.clone()],
        None,
    );
    let e = refused_create(&o, &watch);
    assert!(
        matches!(e, EngineError::InspectMember { .. }) && one_line(&e).contains("new.img"),
        "{e}"
    );
}

fn refused_assemble(paths: &[PathBuf], watch: &[PathBuf]) -> EngineError {
    let before = snapshot(watch);
    let err = match assemble(paths, opts()) {
        Ok(_) => panic!("assemble should refuse {paths:?}"),
        Err(e) => e,
    };
    assert!(
        snapshot(watch) == before,
        "refused assemble wrote something: {err}"
    );
    one_line(&err);
    err
}

#[test]
fn assemble_refusals() {
    let dir = TempDir::new("refuse-assemble");
    let a = (0..4)
        .map(|i| dir.path(&format!("a{i}.img")))
        .collect::<Vec<_>>();
    let b = (0..4)
        .map(|i| dir.path(&format!("b{i}.img")))
        .collect::<Vec<_>>();
    create(&options(Level::Raid5, a.clone(), Some(5 * MIB))).expect("create a");
    create(&options(Level::Raid5, b.clone(), Some(5 * MIB))).expect("create b");
    let stranger = dir.path("stranger.img");
    std::fs::write(&stranger, vec![0u8; (5 * MIB) as usize]).expect("stranger");
    let mut watch: Vec<PathBuf> = a.iter().chain(b.iter()).cloned().collect();
    watch.push(stranger.clone());

    // A file that is no member.
    let e = refused_assemble(&[a[0].clone(), a[1].clone(), stranger.clone()], &watch);
    assert!(
        e.to_string().contains("stranger.img") && e.to_string().contains("not an array member"),
        "{e}"
    );
    // Members of two arrays.
    let e = refused_assemble(
        &[a[0].clone(), a[1].clone(), b[2].clone(), a[3].clone()],
        &watch,
    );
    assert!(
        matches!(e, EngineError::MatchArray { .. }) && e.to_string().contains("b2.img"),
        "{e}"
    );
    // The same member twice.
    let e = refused_assemble(&[a[0].clone(), a[1].clone(), a[1].clone()], &watch);
    assert!(matches!(e, EngineError::CheckDuplicate { .. }), "{e}");
    // Two members claiming one slot (a copied member file).
    let copy = dir.path("copy-of-a1.img");
    std::fs::copy(&a[1], &copy).expect("copy");
    watch.push(copy.clone());
    let e = refused_assemble(
        &[a[0].clone(), a[1].clone(), copy.clone(), a[3].clone()],
        &watch,
    );
    assert!(matches!(e, EngineError::MatchSlot { slot: 1, .. }), "{e}");
    // Too many missing for RAID5.
    let e = refused_assemble(&[a[0].clone(), a[1].clone()], &watch);
    assert!(matches!(e, EngineError::AssembleDegraded { .. }), "{e}");
    // A truncated member.
    let short = dir.path("short.img");
    std::fs::copy(&a[2], &short).expect("copy");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .and_then(|f| f.set_len(4 * MIB))
        .expect("truncate");
    watch.push(short.clone());
    let e = refused_assemble(
        &[a[0].clone(), a[1].clone(), short.clone(), a[3].clone()],
        &watch,
    );
    assert!(
        matches!(e, EngineError::CheckShortMember { .. }) && e.to_string().contains("short.img"),
        "{e}"
    );
    // A corrupted superblock.
    let bad = dir.path("bad.img");
    let mut bytes = std::fs::read(&a[2]).expect("read");
    bytes[200] ^= 1;
    std::fs::write(&bad, &bytes).expect("write");
    watch.push(bad.clone());
    let e = refused_assemble(
        &[a[0].clone(), a[1].clone(), bad.clone(), a[3].clone()],
        &watch,
    );
    assert!(
        e.to_string().contains("checksum") && e.to_string().contains("bad.img"),
        "{e}"
    );
    assert!(examine(&bad).is_err());
    // A stale member: run degraded without a3, then offer a3 again.
    let array = assemble(&a[..3], opts()).expect("degraded assembly");
    array
        .write(0, b"written while a3 was away", true)
        .expect("write");
    array.stop().expect("stop");
    let e = refused_assemble(&a, &watch);
    assert!(
        matches!(e, EngineError::TrustStaleMember { slot: 3, .. })
            && e.to_string().contains("a3.img"),
        "{e}"
    );
    // Not a file at all.
    let e = refused_assemble(&[a[0].clone(), dir.0.clone()], &watch);
    assert!(matches!(e, EngineError::CheckMemberKind { .. }), "{e}");
}
