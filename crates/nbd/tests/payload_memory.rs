//! Payloads received into memory the export lends (`Export::payload_memory`): a RAID array lends its parity
//! backend's memory, so that a GPU computes on a client's data where it was received. Here an export lends
//! page-aligned memory and records, for every write, whether its bytes lay in memory it lent; the data must be
//! the same either way, and memory that is not page-aligned must not be used.

mod common;

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::{Export, MemoryExport, PayloadMemory, Server, ServerConfig};

const SIZE: usize = 4 << 20;

/// Where lent buffers lie: (start, length), forgotten when a buffer is dropped.
type Lent = Arc<Mutex<Vec<(usize, usize)>>>;

/// A heap buffer that starts `skew` bytes past a 4 KiB boundary and leaves `lent` when dropped.
struct LentBuf {
    base: *mut u8,
    layout: Layout,
    skew: usize,
    len: usize,
    lent: Lent,
}

unsafe impl Send for LentBuf {}

impl LentBuf {
    fn new(len: usize, skew: usize, lent: &Lent) -> LentBuf {
        let layout = Layout::from_size_align(len + skew, 4096).unwrap();
        let base = unsafe { alloc_zeroed(layout) };
        assert!(!base.is_null());
        lent.lock().unwrap().push((base as usize + skew, len));
        LentBuf {
            base,
            layout,
            skew,
            len,
            lent: lent.clone(),
        }
    }
}

impl Deref for LentBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.base.add(self.skew), self.len) }
    }
}

impl DerefMut for LentBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.base.add(self.skew), self.len) }
    }
}

impl Drop for LentBuf {
    fn drop(&mut self) {
        let at = self.base as usize + self.skew;
        self.lent.lock().unwrap().retain(|&(start, _)| start != at);
        unsafe { dealloc(self.base, self.layout) };
    }
}

/// A memory export that lends buffers (aligned, or `skew` bytes off) and counts writes by where their bytes lay.
struct Lender {
    inner: MemoryExport,
    skew: usize,
    lent: Lent,
    lend: AtomicBool,
    buffers_lent: AtomicUsize,
    writes_inside: AtomicUsize,
    writes_outside: AtomicUsize,
}

impl Lender {
    fn new(skew: usize) -> Arc<Lender> {
        Arc::new(Lender {
            inner: MemoryExport::new(SIZE),
            skew,
            lent: Lent::default(),
            lend: AtomicBool::new(true),
            buffers_lent: AtomicUsize::new(0),
            writes_inside: AtomicUsize::new(0),
            writes_outside: AtomicUsize::new(0),
        })
    }

    fn writes(&self) -> (usize, usize) {
        (
            self.writes_inside.load(Relaxed),
            self.writes_outside.load(Relaxed),
        )
    }
}

impl Export for Lender {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset_bytes, buf)
    }
    fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        let at = buf.as_ptr() as usize;
        let inside = self
            .lent
            .lock()
            .unwrap()
            .iter()
            .any(|&(start, len)| at >= start && at + buf.len() <= start + len);
        if inside {
            &self.writes_inside
        } else {
            &self.writes_outside
        }
        .fetch_add(1, Relaxed);
        self.inner.write(offset_bytes, buf, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn trim(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.trim(offset_bytes, len_bytes)
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> io::Result<()> {
        self.inner.write_zeroes(offset_bytes, len_bytes, fua)
    }
    fn payload_memory(&self, len_bytes: usize) -> Option<PayloadMemory> {
        if !self.lend.load(Relaxed) {
            return None;
        }
        self.buffers_lent.fetch_add(1, Relaxed);
        Some(Box::new(LentBuf::new(len_bytes, self.skew, &self.lent)))
    }
}

fn config() -> ServerConfig {
    ServerConfig {
        // One worker: its buffer grows with the requests and is reused, which is the path under test.
        workers_per_connection: 1,
        max_request_bytes: 2 << 20,
        ..small_config()
    }
}

/// Writes of several sizes, one at a time and merged (sequential pieces sent together), then reads them back.
fn write_and_read_back(export: Arc<Lender>) {
    let server = Arc::new(Server::new(export.clone(), config()));
    let (mut client, handle) =
        connect_in_process(server, Arc::new(std::sync::atomic::AtomicBool::new(false)));
    client.handshake(false).unwrap();
    let mut expected = vec![0u8; SIZE];
    let mut handle_no = 1u64;
    // First (the worker's buffer is still empty), sequential pieces that arrive together: merged into one
    // export write, for which `get_keeping` grows the buffer while keeping what it holds.
    let mut batch = Vec::new();
    for n in 0..8u64 {
        let offset = (2 << 20) + n as usize * 2048;
        let bytes = pseudo_random_bytes(2048, 100 + n);
        batch.extend(RawClient::request_bytes(
            0,
            CMD_WRITE,
            100 + n,
            offset as u64,
            2048,
        ));
        batch.extend(&bytes);
        expected[offset..offset + 2048].copy_from_slice(&bytes);
    }
    client.send(&batch).unwrap();
    for _ in 0..8 {
        assert_eq!(client.simple_reply().unwrap().0, 0);
    }
    let mut put = |client: &mut RawClient, offset: usize, len: usize| {
        let bytes = pseudo_random_bytes(len, handle_no);
        client
            .write_request(0, handle_no, offset as u64, &bytes)
            .unwrap();
        let (error, reply) = client.simple_reply().unwrap();
        assert_eq!((error, reply), (0, handle_no));
        expected[offset..offset + len].copy_from_slice(&bytes);
        handle_no += 1;
    };
    for (offset, len) in [
        (0usize, 512usize),
        (4096, 4096),
        (65536, 65536),
        (1 << 20, 1 << 20),
        (3 << 20, 12345),
        // Larger than a worker keeps its buffer for: received into the heap (lent memory may be costly to make).
        (2 << 20, 2 << 20),
    ] {
        put(&mut client, offset, len);
    }
    let mut got = vec![0u8; SIZE];
    for at in (0..SIZE).step_by(1 << 20) {
        client
            .request(0, CMD_READ, 9_999, at as u64, 1 << 20)
            .unwrap();
        let (error, reply) = client.simple_reply().unwrap();
        assert_eq!((error, reply), (0, 9_999));
        got[at..at + (1 << 20)].copy_from_slice(&client.read_bytes(1 << 20).unwrap());
    }
    assert!(got == expected, "what the client reads back");
    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
}

#[test]
fn write_payloads_are_received_into_lent_memory() {
    let export = Lender::new(0);
    write_and_read_back(export.clone());
    let (inside, outside) = export.writes();
    assert!(inside >= 6, "writes in lent memory: {inside}");
    assert_eq!(outside, 1, "writes outside lent memory (the 2 MiB one)");
    let lent = export.buffers_lent.load(Relaxed);
    assert!(lent >= 1, "buffers lent: {lent}");
    // Lent only when the buffer grew, not per request.
    assert!(lent < inside, "{lent} buffers lent for {inside} writes");
}

#[test]
fn lent_memory_off_a_page_boundary_is_not_used() {
    let export = Lender::new(8);
    write_and_read_back(export.clone());
    let (inside, outside) = export.writes();
    assert_eq!(inside, 0, "writes in misaligned lent memory");
    assert!(outside >= 7, "writes: {outside}");
    assert!(export.buffers_lent.load(Relaxed) >= 1);
}

#[test]
fn an_export_that_stops_lending_gets_heap_memory() {
    let export = Lender::new(0);
    export.lend.store(false, Relaxed);
    write_and_read_back(export.clone());
    assert_eq!(export.writes().0, 0);
    assert_eq!(export.buffers_lent.load(Relaxed), 0);
}
