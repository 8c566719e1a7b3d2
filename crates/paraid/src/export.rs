//! The RAID array seen through the frontends' `Export` trait (NBD and ublk); every request is counted in the I/O
//! metrics. Client requests go through the engine's `WriteBack`, which holds small writes when `--write-back` is
//! on and passes everything straight to the array when it is off.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use paraid_engine::array::held::HeldStore;
use paraid_engine::{Array, EngineError, WriteBack, WriteBackConfig};
use paraid_nbd::{Export, Extent, PayloadMemory};

use crate::metrics::{IoMetrics, OpStats};

pub struct ArrayExport {
    array: Arc<Array>,
    /// Client requests' way to the array. Dropped with the export (when the frontend ends): held writes are
    /// written before the array is stopped.
    front: WriteBack,
    metrics: Arc<IoMetrics>,
}

impl ArrayExport {
    /// `held`: where write-back keeps held writes against a kill (engine `array/held.rs`), if anywhere.
    pub fn new(
        array: Arc<Array>,
        metrics: Arc<IoMetrics>,
        write_back: WriteBackConfig,
        held: Option<HeldStore>,
    ) -> Self {
        let front = WriteBack::with_store(&array, write_back, held);
        ArrayExport {
            array,
            front,
            metrics,
        }
    }
}

/// Runs `serve` and counts it in `stats` as a request of `bytes`.
fn counted<T>(stats: &OpStats, bytes: u64, serve: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let started = Instant::now();
    let result = serve();
    stats.record(started, bytes, result.is_ok());
    result
}

/// The engine's errors reach the NBD client as an errno; the full text goes to the log, once per failure.
fn to_io(action: &str, error: EngineError) -> io::Error {
    log::error!("{action}: {error}");
    io::Error::other(error.to_string())
}

impl Export for ArrayExport {
    fn size_bytes(&self) -> u64 {
        self.array.size_bytes()
    }

    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = buf.len() as u64;
        counted(&self.metrics.read, bytes, || {
            self.front
                .read(offset_bytes, buf)
                .map_err(|e| to_io("read", e))
        })
    }

    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        let started = Instant::now();
        let results = self.front.read_many(reads);
        reads
            .iter()
            .zip(results)
            .map(|((_, buf), result)| {
                self.metrics
                    .read
                    .record(started, buf.len() as u64, result.is_ok());
                result.map_err(|e| to_io("read", e))
            })
            .collect()
    }

    fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        counted(&self.metrics.write, buf.len() as u64, || {
            self.front
                .write(offset_bytes, buf, fua)
                .map_err(|e| to_io("write", e))
        })
    }

    /// Journal mode: the reply goes out once the write is durable in the log (`WriteBack::write_answering`), from
    /// this thread, with no copy and no hand-off to the write-back pool.
    fn write_answering(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        fua: bool,
        answered: &dyn Fn(),
    ) -> io::Result<()> {
        counted(&self.metrics.write, buf.len() as u64, || {
            self.front
                .write_answering(offset_bytes, buf, fua, answered)
                .map_err(|e| to_io("write", e))
        })
    }

    fn write_arriving(&self, arriving: bool) {
        self.array.note_write_arriving(arriving);
    }

    fn write_follows(&self, offset_bytes: u64) {
        self.array.note_write_follows(offset_bytes);
    }

    /// Journal mode with lone answers: the server sends only writes whose client waits for them here.
    fn answers_early_only_when_waited_for(&self) -> bool {
        self.array.answers_lone_writes_only()
    }

    fn flush(&self) -> io::Result<()> {
        counted(&self.metrics.flush, 0, || {
            self.front.flush().map_err(|e| to_io("flush", e))
        })
    }

    fn trim(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        counted(&self.metrics.trim, len_bytes, || {
            self.front
                .discard(offset_bytes, len_bytes)
                .map_err(|e| to_io("trim", e))
        })
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> io::Result<()> {
        counted(&self.metrics.write_zeroes, len_bytes, || {
            self.front
                .write_zeroes(offset_bytes, len_bytes, fua)
                .map_err(|e| to_io("write_zeroes", e))
        })
    }

    /// Holes of the array (data chunks in holes of their sparse member files on every copy) read as zeros; a
    /// client copying the array skips them (engine `array/allocation.rs`).
    fn reports_allocation(&self) -> bool {
        true
    }

    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<Vec<Extent>> {
        let extents = self
            .front
            .allocation(offset_bytes, len_bytes)
            .map_err(|e| to_io("block status", e))?;
        Ok(extents
            .into_iter()
            .map(|e| Extent {
                len_bytes: e.len_bytes,
                hole: e.hole,
                zero: e.hole,
            })
            .collect())
    }

    /// An array served read-only (`paraid serve --read-only`): NBD clients see NBD_FLAG_READ_ONLY and their
    /// writes fail with EPERM; a ublk device is read-only to the kernel.
    fn read_only(&self) -> bool {
        self.array.is_read_only()
    }

    /// Write payloads (NBD) and request buffers (ublk) in the parity backend's memory where it lends some: a GPU
    /// then computes whole stripes a client wrote where the frontend received them (engine
    /// `Array::payload_memory`).
    fn payload_memory(&self, len_bytes: usize) -> Option<PayloadMemory> {
        self.array
            .payload_memory(len_bytes)
            .map(|buf| Box::new(buf) as PayloadMemory)
    }

    /// One array object serves every connection and its FLUSH syncs every member, so a flush on any connection
    /// covers writes acknowledged on all of them.
    fn multi_conn_safe(&self) -> bool {
        true
    }
}
