//! The FUSE frontend against a real kernel: an export in memory served over a file, read and written through
//! the file system (buffered and O_DIRECT), flushed, holes punched, refusals. Root with /dev/fuse only: without
//! them each test prints that it skipped and why.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use paraid_fuse::{FuseConfig, FuseFile};
use paraid_nbd::{Export, MemoryExport};

const SIZE_BYTES: usize = 16 << 20;

fn skip_without_fuse(test: &str) -> bool {
    match paraid_fuse::available() {
        Ok(()) => false,
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            true
        }
    }
}

fn mount_point(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("paraid-fuse-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("disk")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A 4096-aligned buffer for O_DIRECT.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let storage = vec![0u8; len + 4096];
    let start = (4096 - storage.as_ptr() as usize % 4096) % 4096;
    (storage, start)
}

fn errno(result: io::Result<impl Sized>) -> Option<i32> {
    result.err().and_then(|e| e.raw_os_error())
}

#[test]
fn reads_and_writes_reach_the_export() {
    if skip_without_fuse("reads_and_writes_reach_the_export") {
        return;
    }
    let export = Arc::new(MemoryExport::with_contents(pattern(SIZE_BYTES, 1), false));
    let path = mount_point("rw");
    let served = FuseFile::start(export.clone(), &path, &FuseConfig::default()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SIZE_BYTES as u64);

    // Buffered (the file is direct I/O underneath: any offset and length go straight to the export).
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut got = vec![0u8; 10_000];
    file.read_exact_at(&mut got, 12_345).unwrap();
    assert_eq!(got, pattern(SIZE_BYTES, 1)[12_345..22_345]);
    let new = pattern(777, 9);
    file.write_all_at(&new, 1_000_001).unwrap();
    file.sync_all().unwrap();
    assert_eq!(&export.contents()[1_000_001..1_000_778], &new[..]);

    // O_DIRECT, 1 MiB at once (the largest request), as a loop device with direct I/O sends.
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let (mut storage, start) = aligned(1 << 20);
    let buf = &mut storage[start..start + (1 << 20)];
    buf.copy_from_slice(&pattern(1 << 20, 42));
    direct.write_all_at(buf, 4 << 20).unwrap();
    buf.fill(0);
    direct.read_exact_at(buf, 4 << 20).unwrap();
    assert_eq!(buf, &pattern(1 << 20, 42)[..]);
    assert_eq!(
        &export.contents()[4 << 20..5 << 20],
        &pattern(1 << 20, 42)[..]
    );

    // Reads at the end are short, as for any file.
    let mut tail = vec![0u8; 8192];
    let n = file.read_at(&mut tail, SIZE_BYTES as u64 - 100).unwrap();
    assert_eq!(n, 100);
    drop((file, direct));
    let stats = served.stop().unwrap();
    assert!(stats.requests > 0);
    assert!(!stats.aborted);
    // Unmounted: the path is the empty file it was.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
}

#[test]
fn holes_read_as_zeroes_and_the_size_stays() {
    if skip_without_fuse("holes_read_as_zeroes_and_the_size_stays") {
        return;
    }
    let export = Arc::new(MemoryExport::with_contents(pattern(SIZE_BYTES, 3), false));
    let path = mount_point("holes");
    let served = FuseFile::start(export.clone(), &path, &FuseConfig::default()).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: a valid descriptor; plain integer arguments.
    let punched = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            65_536,
            131_072,
        )
    };
    assert_eq!(punched, 0, "{}", io::Error::last_os_error());
    let contents = export.contents();
    assert!(contents[65_536..196_608].iter().all(|&b| b == 0));
    assert_eq!(contents[65_535], pattern(SIZE_BYTES, 3)[65_535]);
    assert_eq!(contents[196_608], pattern(SIZE_BYTES, 3)[196_608]);

    // The size is the export's: growing, shrinking and writing past the end are refused.
    assert_eq!(
        errno(file.set_len(SIZE_BYTES as u64 / 2)),
        Some(libc::EPERM)
    );
    assert_eq!(
        errno(file.set_len(SIZE_BYTES as u64 * 2)),
        Some(libc::EPERM)
    );
    file.set_len(SIZE_BYTES as u64).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        errno(std::fs::set_permissions(
            &path,
            std::fs::Permissions::from_mode(0o600)
        )),
        Some(libc::EPERM)
    );
    assert_eq!(
        errno(file.write_all_at(b"past the end", SIZE_BYTES as u64)),
        Some(libc::ENOSPC)
    );
    drop(file);
    served.stop().unwrap();
}

#[test]
fn a_read_only_export_refuses_writers() {
    if skip_without_fuse("a_read_only_export_refuses_writers") {
        return;
    }
    let export: Arc<dyn Export> =
        Arc::new(MemoryExport::with_contents(pattern(SIZE_BYTES, 5), true));
    let path = mount_point("ro");
    let served = FuseFile::start(export, &path, &FuseConfig::default()).unwrap();
    assert_eq!(
        errno(OpenOptions::new().write(true).open(&path)),
        Some(libc::EROFS)
    );
    let mut got = vec![0u8; 4096];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut got, 8192)
        .unwrap();
    assert_eq!(got, pattern(SIZE_BYTES, 5)[8192..12_288]);
    served.stop().unwrap();
}

#[test]
fn a_file_held_open_at_stop_fails_its_io_instead_of_hanging() {
    if skip_without_fuse("a_file_held_open_at_stop_fails_its_io_instead_of_hanging") {
        return;
    }
    let export = Arc::new(MemoryExport::new(SIZE_BYTES));
    let path = mount_point("held");
    let served = FuseFile::start(export, &path, &FuseConfig::default()).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let stats = served.stop().unwrap();
    assert!(
        stats.aborted,
        "the open file kept the connection: it was aborted"
    );
    let mut got = [0u8; 512];
    assert_eq!(errno(file.read_exact_at(&mut got, 0)), Some(libc::ENOTCONN));
}

#[test]
fn a_directory_is_no_place_to_serve() {
    if skip_without_fuse("a_directory_is_no_place_to_serve") {
        return;
    }
    let export = Arc::new(MemoryExport::new(SIZE_BYTES));
    let dir = mount_point("dir").parent().unwrap().to_owned();
    let error = FuseFile::start(export, &dir, &FuseConfig::default())
        .err()
        .expect("a directory is refused");
    assert!(error.to_string().contains("not a regular file"), "{error}");
}
