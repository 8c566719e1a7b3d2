//! The frontend against the real ublk driver: a memory export served as /dev/ublkbN, written and read through
//! the block device, checked byte for byte against the export. Needs root and ublk_drv (Linux 6.4+); the host
//! and CI kernels have no ublk, so there it prints that it skipped and why. `crates/ublk/tests/vm/run` runs it in
//! the vmlab guest, whose kernel has the driver.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use paraid_nbd::MemoryExport;
use paraid_ublk::{UblkConfig, UblkDevice};

/// Why the kernel tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    let control = Path::new(paraid_ublk::ctrl::CONTROL_PATH);
    if !control.exists() {
        let _ = std::process::Command::new("modprobe")
            .arg("ublk_drv")
            .status();
    }
    if !control.exists() {
        return Some(format!(
            "{} is missing: this kernel has no ublk_drv (crates/ublk/tests/vm/run runs these in a VM with one)",
            control.display()
        ));
    }
    None
}

macro_rules! require_ublk {
    () => {
        if let Some(reason) = unavailable() {
            println!("ublk: skipped: {reason}");
            return;
        }
    };
}

/// A page-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, len }
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is len bytes and ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

fn open_direct(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

/// A pattern that differs per byte and per request, so a misplaced or torn block is caught.
fn pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

const SIZE_BYTES: usize = 64 << 20;

#[test]
fn writes_through_the_block_device_land_in_the_export_and_read_back() {
    require_ublk!();
    let export = Arc::new(MemoryExport::new(SIZE_BYTES));
    let device = UblkDevice::start(export.clone(), &UblkConfig::default()).expect("starting");
    let path = device.block_path();
    let disk = open_direct(&path);
    // Sizes from one sector to the largest request and past it (the kernel splits those).
    let writes: [(u64, usize); 6] = [
        (0, 4096),
        (512 * 9, 512),
        (1 << 20, 128 << 10),
        (8 << 20, 512 << 10),
        (20 << 20, 3 << 20),
        (SIZE_BYTES as u64 - 4096, 4096),
    ];
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let mut buf = Aligned::new(len);
        pattern(i as u64, buf.bytes());
        disk.write_all_at(buf.bytes(), offset).expect("writing");
    }
    // SAFETY: fsync on an open descriptor.
    assert_eq!(unsafe { libc::fsync(disk.as_raw_fd()) }, 0, "fsync");
    let contents = export.contents();
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let mut want = vec![0u8; len];
        pattern(i as u64, &mut want);
        let offset = offset as usize;
        assert!(
            contents[offset..offset + len] == want[..],
            "write {i} ({len} bytes at {offset}) did not land in the export"
        );
        let mut back = Aligned::new(len);
        disk.read_exact_at(back.bytes(), offset as u64)
            .expect("reading");
        assert!(back.bytes() == &want[..], "write {i} did not read back");
    }
    drop(disk);
    let stats = device.stop().expect("stopping");
    assert!(stats.requests >= writes.len() as u64, "{stats:?}");
    assert_eq!(stats.failed_requests, 0);
    // One thread, one request at a time: most arrive into an idle queue and are served on the queue thread.
    assert!(stats.served_inline > 0, "{stats:?}");
    assert!(!path.exists(), "{} still exists after stop", path.display());
}

#[test]
fn discard_and_zeroout_reach_the_export() {
    require_ublk!();
    let export = Arc::new(MemoryExport::with_contents(vec![0xee; SIZE_BYTES], false));
    let device = UblkDevice::start(export.clone(), &UblkConfig::default()).expect("starting");
    let disk = open_direct(&device.block_path());
    // BLKZEROOUT = _IO(0x12, 127), BLKDISCARD = _IO(0x12, 119): a [start, length] pair of u64.
    const BLKDISCARD: libc::c_ulong = 0x1277;
    const BLKZEROOUT: libc::c_ulong = 0x127f;
    let range: [u64; 2] = [4 << 20, 1 << 20];
    // SAFETY: the ioctls read a 16-byte range from a live array.
    assert_eq!(
        unsafe { libc::ioctl(disk.as_raw_fd(), BLKZEROOUT, range.as_ptr()) },
        0,
        "BLKZEROOUT: {}",
        io::Error::last_os_error()
    );
    let contents = export.contents();
    assert!(
        contents[4 << 20..5 << 20].iter().all(|&b| b == 0),
        "zeroed range"
    );
    assert!(
        contents[(4 << 20) - 1] == 0xee && contents[5 << 20] == 0xee,
        "neighbours kept"
    );
    let discard: [u64; 2] = [16 << 20, 2 << 20];
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::ioctl(disk.as_raw_fd(), BLKDISCARD, discard.as_ptr()) },
        0,
        "BLKDISCARD: {}",
        io::Error::last_os_error()
    );
    drop(disk);
    device.stop().expect("stopping");
}

#[test]
fn many_threads_at_once_each_read_back_their_own_blocks() {
    require_ublk!();
    let export = Arc::new(MemoryExport::new(SIZE_BYTES));
    let config = UblkConfig {
        queues: 2,
        depth: 32,
        workers_per_queue: 4,
        // Every request through the worker pools, so that this test covers them whatever the timing.
        serve_inline_when_idle: false,
        ..UblkConfig::default()
    };
    let device = UblkDevice::start(export.clone(), &config).expect("starting");
    let path = device.block_path();
    // Eight threads, each owning every eighth 16 KiB block, writing then reading in a scrambled order.
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let disk = open_direct(&path);
                let blocks = (SIZE_BYTES / (16 << 10)) as u64;
                let mine: Vec<u64> = (0..blocks).filter(|b| b % 8 == t).collect();
                let mut buf = Aligned::new(16 << 10);
                for round in 0..2u64 {
                    // 37 is prime to the count (512), so this visits every block once, out of order.
                    for i in 0..mine.len() {
                        let block = mine[(i * 37 + round as usize) % mine.len()];
                        pattern(block * 10 + round, buf.bytes());
                        disk.write_all_at(buf.bytes(), block * (16 << 10))
                            .expect("writing");
                    }
                    let mut want = vec![0u8; 16 << 10];
                    for &block in &mine {
                        pattern(block * 10 + round, &mut want);
                        disk.read_exact_at(buf.bytes(), block * (16 << 10))
                            .expect("reading");
                        assert!(
                            buf.bytes() == &want[..],
                            "thread {t} block {block} round {round}"
                        );
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a writer thread failed");
    }
    let stats = device.stop().expect("stopping");
    assert_eq!(stats.failed_requests, 0);
    assert_eq!(stats.served_inline, 0, "{stats:?}");
    // Neighbouring blocks of different threads may arrive together and be merged; the contents say both ways
    // were right.
    println!("ublk: {stats:?}");
    let contents = export.contents();
    let mut want = vec![0u8; 16 << 10];
    for block in 0..(SIZE_BYTES / (16 << 10)) as u64 {
        pattern(block * 10 + 1, &mut want);
        let at = block as usize * (16 << 10);
        assert!(
            contents[at..at + (16 << 10)] == want[..],
            "block {block} in the export"
        );
    }
}
