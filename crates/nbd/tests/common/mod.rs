//! Shared by the integration tests: an export that checks and records every call, an in-process server on a
//! temporary Unix socket, a byte-level NBD client, and a runner for external client programs with a time limit.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use paraid_nbd::proto::*;
use paraid_nbd::{Export, Extent, MemoryExport, NbdError, Server, ServerConfig};

// ---------------------------------------------------------------------------------------------------------------
// Recording export

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Read,
    Write { fua: bool },
    Flush,
    Trim,
    WriteZeroes { fua: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub kind: CallKind,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// A memory export that records every call and counts any whose range leaves the export (which the server must
/// never make). Optional behaviours: a delay in reads, a forced error, a panic.
pub struct RecordingExport {
    inner: MemoryExport,
    size_bytes: u64,
    calls: Mutex<Vec<Call>>,
    out_of_range_calls: AtomicUsize,
    pub read_delay: Mutex<Duration>,
    /// When set, every read/write/flush/trim/zero fails with this error.
    pub fail_with: Mutex<Option<fn() -> io::Error>>,
    pub panic_on_read: AtomicBool,
    multi_conn: bool,
    read_bytes_in_flight: AtomicU64,
    read_bytes_in_flight_peak: AtomicU64,
    /// The number of reads in each `read_many` call, in order.
    read_batches: Mutex<Vec<usize>>,
    /// A read that starts at this offset fails with EIO (the others are served).
    pub fail_read_at: Mutex<Option<u64>>,
    /// `Export::write_arriving`: WRITEs told arriving and not yet handed on, and the times told arriving.
    arriving: AtomicI64,
    arrivals: AtomicUsize,
    /// `Export::write_follows`: each offset told, with the number of calls recorded before it.
    follows: Mutex<Vec<(u64, usize)>>,
}

impl RecordingExport {
    pub fn new(size_bytes: usize) -> Arc<Self> {
        Self::build(MemoryExport::new(size_bytes), size_bytes, true)
    }

    pub fn with(size_bytes: usize, read_only: bool, multi_conn: bool) -> Arc<Self> {
        Self::build(
            MemoryExport::with_contents(vec![0; size_bytes], read_only),
            size_bytes,
            multi_conn,
        )
    }

    fn build(inner: MemoryExport, size_bytes: usize, multi_conn: bool) -> Arc<Self> {
        Arc::new(RecordingExport {
            inner,
            size_bytes: size_bytes as u64,
            calls: Mutex::new(Vec::new()),
            out_of_range_calls: AtomicUsize::new(0),
            read_delay: Mutex::new(Duration::ZERO),
            fail_with: Mutex::new(None),
            panic_on_read: AtomicBool::new(false),
            multi_conn,
            read_bytes_in_flight: AtomicU64::new(0),
            read_bytes_in_flight_peak: AtomicU64::new(0),
            read_batches: Mutex::new(Vec::new()),
            fail_read_at: Mutex::new(None),
            arriving: AtomicI64::new(0),
            arrivals: AtomicUsize::new(0),
            follows: Mutex::new(Vec::new()),
        })
    }

    fn record(&self, kind: CallKind, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let in_range = offset_bytes
            .checked_add(len_bytes)
            .is_some_and(|end| end <= self.size_bytes);
        if !in_range {
            self.out_of_range_calls.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.lock().unwrap().push(Call {
            kind,
            offset_bytes,
            len_bytes,
        });
        match *self.fail_with.lock().unwrap() {
            Some(make_error) => Err(make_error()),
            None => Ok(()),
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn out_of_range_calls(&self) -> usize {
        self.out_of_range_calls.load(Ordering::SeqCst)
    }

    pub fn contents(&self) -> Vec<u8> {
        self.inner.contents()
    }

    /// The number of reads in each `read_many` call the server made, in order.
    pub fn read_batches(&self) -> Vec<usize> {
        self.read_batches.lock().unwrap().clone()
    }

    /// WRITEs the server told arriving and not yet handed on (`Export::write_arriving`), and how many it told
    /// arriving in all.
    pub fn arriving(&self) -> (i64, usize) {
        (
            self.arriving.load(Ordering::SeqCst),
            self.arrivals.load(Ordering::SeqCst),
        )
    }

    /// The offsets the server told as followed (`Export::write_follows`), each with the number of calls the
    /// export had served before it was told.
    pub fn follows(&self) -> Vec<(u64, usize)> {
        self.follows.lock().unwrap().clone()
    }

    pub fn peak_read_bytes_in_flight(&self) -> u64 {
        self.read_bytes_in_flight_peak.load(Ordering::SeqCst)
    }

    /// Only calls that can change data.
    pub fn mutating_calls(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| !matches!(c.kind, CallKind::Read | CallKind::Flush))
            .collect()
    }
}

impl Export for RecordingExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.record(CallKind::Read, offset_bytes, buf.len() as u64)?;
        let now = self
            .read_bytes_in_flight
            .fetch_add(buf.len() as u64, Ordering::SeqCst)
            + buf.len() as u64;
        self.read_bytes_in_flight_peak
            .fetch_max(now, Ordering::SeqCst);
        let delay = *self.read_delay.lock().unwrap();
        if !delay.is_zero() {
            thread::sleep(delay);
        }
        self.read_bytes_in_flight
            .fetch_sub(buf.len() as u64, Ordering::SeqCst);
        if self.panic_on_read.load(Ordering::SeqCst) {
            panic!("RecordingExport told to panic on read");
        }
        if *self.fail_read_at.lock().unwrap() == Some(offset_bytes) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.read(offset_bytes, buf)
    }

    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        self.read_batches.lock().unwrap().push(reads.len());
        reads
            .iter_mut()
            .map(|(offset_bytes, buf)| self.read(*offset_bytes, buf))
            .collect()
    }

    fn write_arriving(&self, arriving: bool) {
        if arriving {
            self.arrivals.fetch_add(1, Ordering::SeqCst);
            self.arriving.fetch_add(1, Ordering::SeqCst);
        } else {
            self.arriving.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn write_follows(&self, offset_bytes: u64) {
        let calls = self.calls.lock().unwrap().len();
        self.follows.lock().unwrap().push((offset_bytes, calls));
    }

    fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        self.record(CallKind::Write { fua }, offset_bytes, buf.len() as u64)?;
        self.inner.write(offset_bytes, buf, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.record(CallKind::Flush, 0, 0)?;
        self.inner.flush()
    }

    fn trim(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.record(CallKind::Trim, offset_bytes, len_bytes)?;
        self.inner.trim(offset_bytes, len_bytes)
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> io::Result<()> {
        self.record(CallKind::WriteZeroes { fua }, offset_bytes, len_bytes)?;
        self.inner.write_zeroes(offset_bytes, len_bytes, fua)
    }

    fn multi_conn_safe(&self) -> bool {
        self.multi_conn
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn reports_allocation(&self) -> bool {
        self.inner.reports_allocation()
    }

    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<Vec<Extent>> {
        let in_range = offset_bytes
            .checked_add(len_bytes)
            .is_some_and(|end| end <= self.size_bytes);
        if !in_range || len_bytes == 0 {
            self.out_of_range_calls.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.allocation(offset_bytes, len_bytes)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Temporary directories and in-process servers

/// A fresh directory under /tmp, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("paraid-nbd-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `Server::serve` on a Unix socket in a temporary directory, in a background thread; stopped on drop.
pub struct UnixServer {
    pub socket: PathBuf,
    pub shutdown: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), NbdError>>>,
    _dir: TempDir,
}

impl UnixServer {
    pub fn start(export: Arc<dyn Export>, config: ServerConfig) -> UnixServer {
        let dir = TempDir::new("srv");
        let socket = dir.join("nbd.sock");
        let shutdown = Arc::new(AtomicBool::new(false));
        let server = Server::new(export, config);
        let thread = {
            let socket = socket.clone();
            let shutdown = shutdown.clone();
            thread::spawn(move || server.serve(paraid_nbd::Listener::Unix(socket), shutdown))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "server did not create {}",
                socket.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
        UnixServer {
            socket,
            shutdown,
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// Raises the shutdown flag and returns what `serve` returned and how long it took.
    pub fn stop(&mut self) -> (Result<(), NbdError>, Duration) {
        let started = Instant::now();
        self.shutdown.store(true, Ordering::SeqCst);
        let result = self
            .thread
            .take()
            .expect("stopped twice")
            .join()
            .expect("serve panicked");
        (result, started.elapsed())
    }
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// A byte-level client

/// An NBD client written against the spec, byte by byte, for requests real clients refuse to send.
pub struct RawClient {
    pub stream: UnixStream,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub flags: u16,
    pub chunk_type: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

/// A structured reply, all chunks up to the DONE one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StructuredReply {
    pub handle: u64,
    pub data: Vec<(u64, Vec<u8>)>,
    pub error: Option<u32>,
}

impl RawClient {
    pub fn new(stream: UnixStream) -> RawClient {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        RawClient { stream }
    }

    pub fn read_bytes(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; n];
        self.stream.read_exact(&mut bytes)?;
        Ok(bytes)
    }

    pub fn u16(&mut self) -> io::Result<u16> {
        Ok(u16::from_be_bytes(self.read_bytes(2)?.try_into().unwrap()))
    }

    pub fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_be_bytes(self.read_bytes(4)?.try_into().unwrap()))
    }

    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_be_bytes(self.read_bytes(8)?.try_into().unwrap()))
    }

    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads the greeting (checking it) and sends the client flags.
    pub fn greet(&mut self, client_flags: u32) -> io::Result<()> {
        assert_eq!(self.u64()?, NBD_MAGIC);
        assert_eq!(self.u64()?, IHAVEOPT);
        let handshake_flags = self.u16()?;
        assert_eq!(handshake_flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        self.send(&client_flags.to_be_bytes())
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        self.send(&bytes)
    }

    pub fn read_option_reply(&mut self) -> io::Result<OptionReply> {
        assert_eq!(self.u64()?, OPTION_REPLY_MAGIC);
        let option = self.u32()?;
        let reply_type = self.u32()?;
        let len = self.u32()? as usize;
        let data = self.read_bytes(len)?;
        Ok(OptionReply {
            option,
            reply_type,
            data,
        })
    }

    pub fn go_data(name: &str, info_requests: &[u16]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(info_requests.len() as u16).to_be_bytes());
        for info in info_requests {
            data.extend_from_slice(&info.to_be_bytes());
        }
        data
    }

    /// NBD_OPT_GO with the default export; returns (size, transmission flags) from NBD_INFO_EXPORT.
    pub fn go(&mut self) -> io::Result<(u64, u16)> {
        self.send_option(OPT_GO, &Self::go_data("", &[INFO_BLOCK_SIZE]))?;
        let mut export = None;
        loop {
            let reply = self.read_option_reply()?;
            assert_eq!(reply.option, OPT_GO);
            match reply.reply_type {
                REP_INFO => {
                    let info_type = u16::from_be_bytes([reply.data[0], reply.data[1]]);
                    if info_type == INFO_EXPORT {
                        let size = u64::from_be_bytes(reply.data[2..10].try_into().unwrap());
                        let flags = u16::from_be_bytes(reply.data[10..12].try_into().unwrap());
                        export = Some((size, flags));
                    }
                }
                REP_ACK => return Ok(export.expect("GO acknowledged without NBD_INFO_EXPORT")),
                other => panic!("unexpected GO reply type {other:#x}"),
            }
        }
    }

    /// Greeting, optional structured replies, GO.
    pub fn handshake(&mut self, structured: bool) -> io::Result<(u64, u16)> {
        self.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)?;
        if structured {
            self.send_option(OPT_STRUCTURED_REPLY, &[])?;
            let reply = self.read_option_reply()?;
            assert_eq!(reply.reply_type, REP_ACK);
        }
        self.go()
    }

    pub fn request_bytes(flags: u16, kind: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&flags.to_be_bytes());
        bytes.extend_from_slice(&kind.to_be_bytes());
        bytes.extend_from_slice(&handle.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&len.to_be_bytes());
        bytes
    }

    pub fn request(
        &mut self,
        flags: u16,
        kind: u16,
        handle: u64,
        offset: u64,
        len: u32,
    ) -> io::Result<()> {
        self.send(&Self::request_bytes(flags, kind, handle, offset, len))
    }

    pub fn write_request(
        &mut self,
        flags: u16,
        handle: u64,
        offset: u64,
        data: &[u8],
    ) -> io::Result<()> {
        let mut bytes = Self::request_bytes(flags, CMD_WRITE, handle, offset, data.len() as u32);
        bytes.extend_from_slice(data);
        self.send(&bytes)
    }

    /// A simple reply header: (error, handle).
    pub fn simple_reply(&mut self) -> io::Result<(u32, u64)> {
        let magic = self.u32()?;
        assert_eq!(magic, SIMPLE_REPLY_MAGIC, "expected a simple reply");
        self.simple_reply_after_magic()
    }

    fn simple_reply_after_magic(&mut self) -> io::Result<(u32, u64)> {
        let error = self.u32()?;
        let handle = self.u64()?;
        Ok((error, handle))
    }

    pub fn chunk(&mut self) -> io::Result<Chunk> {
        let magic = self.u32()?;
        self.chunk_after_magic(magic)
    }

    fn chunk_after_magic(&mut self, magic: u32) -> io::Result<Chunk> {
        assert_eq!(
            magic, STRUCTURED_REPLY_MAGIC,
            "expected a structured reply chunk"
        );
        let flags = self.u16()?;
        let chunk_type = self.u16()?;
        let handle = self.u64()?;
        let len = self.u32()? as usize;
        let payload = self.read_bytes(len)?;
        Ok(Chunk {
            flags,
            chunk_type,
            handle,
            payload,
        })
    }

    /// Reads one whole reply when structured replies are on: simple replies (allowed for non-READ) or chunks up
    /// to DONE.
    pub fn structured_reply(&mut self) -> io::Result<StructuredReply> {
        let mut magic = self.u32()?;
        if magic == SIMPLE_REPLY_MAGIC {
            let (error, handle) = self.simple_reply_after_magic()?;
            return Ok(StructuredReply {
                handle,
                data: Vec::new(),
                error: (error != 0).then_some(error),
            });
        }
        let mut reply = StructuredReply {
            handle: 0,
            data: Vec::new(),
            error: None,
        };
        loop {
            let chunk = self.chunk_after_magic(magic)?;
            reply.handle = chunk.handle;
            match chunk.chunk_type {
                REPLY_TYPE_OFFSET_DATA => {
                    let offset = u64::from_be_bytes(chunk.payload[0..8].try_into().unwrap());
                    reply.data.push((offset, chunk.payload[8..].to_vec()));
                }
                REPLY_TYPE_ERROR => {
                    let error = u32::from_be_bytes(chunk.payload[0..4].try_into().unwrap());
                    let message_len =
                        u16::from_be_bytes([chunk.payload[4], chunk.payload[5]]) as usize;
                    assert_eq!(
                        chunk.payload.len(),
                        6 + message_len,
                        "error chunk length mismatch"
                    );
                    reply.error = Some(error);
                }
                REPLY_TYPE_NONE => assert!(chunk.payload.is_empty()),
                other => panic!("unexpected chunk type {other:#x}"),
            }
            if chunk.flags & REPLY_FLAG_DONE != 0 {
                return Ok(reply);
            }
            magic = self.u32()?;
        }
    }

    /// True when the server closed the connection (EOF or reset) within `timeout`.
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        self.stream.set_read_timeout(Some(timeout)).unwrap();
        let mut byte = [0u8; 1];
        let closed = match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        closed
    }
}

/// A client connected to `server.serve_stream` running in a thread; the handle yields what serve_stream returned.
pub fn connect_in_process(
    server: Arc<Server>,
    shutdown: Arc<AtomicBool>,
) -> (RawClient, JoinHandle<Result<(), NbdError>>) {
    let (client, server_side) = UnixStream::pair().unwrap();
    let handle = thread::spawn(move || server.serve_stream(server_side, &shutdown));
    (RawClient::new(client), handle)
}

/// Ends a connection as a client does (NBD_CMD_DISC), and checks the server closes it and its thread ends cleanly.
pub fn disconnect(mut client: RawClient, handle: JoinHandle<Result<(), NbdError>>) {
    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
}

/// A recording export of `size_bytes` served in process with `config`, and a client past the handshake (simple
/// replies); the handle yields what serve_stream returned.
pub fn serve_recording(
    size_bytes: usize,
    config: ServerConfig,
) -> (
    Arc<RecordingExport>,
    RawClient,
    JoinHandle<Result<(), NbdError>>,
) {
    serve_recording_with(size_bytes, config, false)
}

/// `serve_recording`, with structured replies negotiated where `structured`.
pub fn serve_recording_with(
    size_bytes: usize,
    config: ServerConfig,
    structured: bool,
) -> (
    Arc<RecordingExport>,
    RawClient,
    JoinHandle<Result<(), NbdError>>,
) {
    let export = RecordingExport::new(size_bytes);
    let server = Arc::new(Server::new(export.clone(), config));
    let (mut client, handle) = connect_in_process(server, Arc::new(AtomicBool::new(false)));
    client.handshake(structured).unwrap();
    (export, client, handle)
}

pub fn small_config() -> ServerConfig {
    ServerConfig {
        export_name: "disk".into(),
        description: "test disk".into(),
        workers_per_connection: 4,
        max_request_bytes: 1 << 20,
        ..ServerConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// External programs

/// Whether `program` can be run; prints why a test is skipped when it cannot.
pub fn have(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .env("PATH", client_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        eprintln!(
            "SKIPPED: {program} is not installed (scripts/install-deps.sh --test installs it)"
        );
    }
    found
}

/// nbdsh needs the system Python first in PATH.
pub fn client_path() -> String {
    format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default())
}

/// Runs a command with a time limit (killing it past the limit), returning its output.
pub fn run(command: &mut Command, limit: Duration) -> Output {
    let description = format!("{command:?}");
    let mut child = command
        .env("PATH", client_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {description}: {e}"));
    // Drain the pipes in threads so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_thread = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err_thread = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{description} ran past {limit:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_thread.join().unwrap(),
        stderr: err_thread.join().unwrap(),
    }
}

/// Runs and asserts success, returning stdout as text.
pub fn run_ok(command: &mut Command, limit: Duration) -> String {
    let description = format!("{command:?}");
    let output = run(command, limit);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{description} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pseudo_random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

pub fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

// ---------------------------------------------------------------------------------------------------------------
// The crate's examples as programs

/// The path of the crate's example `name` (memserve, nbd_load), built with the same profile as this test.
/// `cargo test` builds examples before running tests; when only a test target was built, the examples are built
/// here, once per test process (a no-op when they are fresh).
pub fn example(name: &str) -> PathBuf {
    static EXAMPLES: OnceLock<PathBuf> = OnceLock::new();
    let binary = EXAMPLES.get_or_init(build_examples).join(name);
    assert!(
        binary.exists(),
        "the example {} is missing; build it with `cargo build -p paraid-nbd --examples`",
        binary.display()
    );
    binary
}

fn build_examples() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in <target>/<profile>/deps");
    let examples = profile_dir.join("examples");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(name) => name.to_string(),
        None => panic!("no profile directory above {}", exe.display()),
    };
    let target_dir = profile_dir.parent().unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", "paraid-nbd", "--examples"])
        .args(["--profile", &profile])
        .env("CARGO_TARGET_DIR", target_dir)
        .status();
    match status {
        Ok(status) if status.success() => {}
        other => eprintln!(
            "note: could not rebuild the examples ({other:?}); using those in {}",
            examples.display()
        ),
    }
    examples
}

/// The memserve example serving `size` bytes on a Unix socket in a temporary directory; `stop` (or drop) sends
/// SIGTERM, then SIGKILL past 5 s.
pub struct MemServe {
    child: std::process::Child,
    pub socket: PathBuf,
    _dir: TempDir,
}

impl MemServe {
    pub fn start(size: &str) -> MemServe {
        let dir = TempDir::new("memserve");
        let socket = dir.join("m.sock");
        let child = Command::new(example("memserve"))
            .args(["--size", size, "--unix"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "memserve never created its socket"
            );
            thread::sleep(Duration::from_millis(10));
        }
        MemServe {
            child,
            socket,
            _dir: dir,
        }
    }

    /// SIGTERM, and how memserve exited: None if it was still running 5 s later (then killed).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: signalling the child we started, by its pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self.child.try_wait().ok().flatten() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for MemServe {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}
