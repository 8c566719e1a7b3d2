//! A small NBD load generator over Unix sockets: a stand-in for `fio --ioengine=nbd` where fio is not installed.
//!
//!     nbd_load --socket PATH [--connections 1] [--depth 32] [--pattern write|randwrite|read|randread]
//!              [--bs 1M] [--seconds 5] [--passes N] [--size SIZE] [--fua] [--verify] [--json]
//!
//! Each connection is a thread pair on its own socket: one thread sends requests, keeping `--depth` in flight,
//! the other reads the (simple) replies. Sequential patterns split the region (`--size` bytes from offset 0,
//! default the whole export) evenly between connections; each walks its share in `--bs` steps and wraps around,
//! once every request of the pass before is answered (a block's two writes never in flight together).
//! Random patterns pick `--bs`-aligned offsets uniformly in the region. `--passes N` (sequential patterns) ends
//! a connection's run once it has walked its share N times, or at `--seconds`, whichever comes first: one pass
//! of writes is a prefill, so that a timed run after it meets allocated blocks.
//!
//! Written data is a function of (byte offset, generation), different in every 8-byte word, where the generation
//! is how many times the connection has wrapped its share (always 0 for randwrite). A write run ends with FLUSH on
//! every connection. `--verify` (write only) then reads back each connection's last pass and counts the 8-byte
//! words that differ from what was written; any mismatch makes the exit status 1. `--fua` sets FUA on writes.
//!
//! Output: one human line, or with `--json` one JSON object on stdout with pattern, bs_bytes, depth, connections,
//! seconds, bytes, mib_s, iops, lat_mean_us, lat_p50_us, lat_p99_us, verified_bytes, mismatches. An NBD error
//! reply or a connection closed early is a hard error (`nbd_load: error: ...`, exit status 1).
//!
//! The protocol is implemented here from the NBD spec (fixed newstyle, NBD_OPT_GO, simple replies), independently
//! of the server in this crate.

#[path = "common/size.rs"]
mod size;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

// Handshake.
const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;
const NBD_OPT_GO: u32 = 7;
const NBD_REP_ACK: u32 = 1;
const NBD_REP_INFO: u32 = 3;
const NBD_REP_ERROR_BIT: u32 = 1 << 31;
const NBD_INFO_EXPORT: u16 = 0;

// Transmission.
const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_FLAG_FUA: u16 = 1 << 0;

/// No reply within this long is a hard error rather than a hang.
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

/// Prints `nbd_load: error: ...` and exits with status 1. Used from any thread: a failed request ends the run.
fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("nbd_load: error: {message}");
    std::process::exit(1);
}

// ---------------------------------------------------------------------------------------------------------------
// Arguments

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Write,
    RandWrite,
    Read,
    RandRead,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Write => "write",
            Pattern::RandWrite => "randwrite",
            Pattern::Read => "read",
            Pattern::RandRead => "randread",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Pattern::Write | Pattern::RandWrite)
    }

    fn random(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::RandRead)
    }
}

struct Args {
    socket: PathBuf,
    connections: usize,
    depth: usize,
    pattern: Pattern,
    bs_bytes: u64,
    seconds: f64,
    /// Sequential patterns: stop after this many passes over the share (else only at `seconds`).
    passes: Option<u64>,
    size_bytes: Option<u64>,
    fua: bool,
    verify: bool,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        socket: PathBuf::new(),
        connections: 1,
        depth: 32,
        pattern: Pattern::Write,
        bs_bytes: 1 << 20,
        seconds: 5.0,
        passes: None,
        size_bytes: None,
        fua: false,
        verify: false,
        json: false,
    };
    let mut socket = None;
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--socket" => socket = Some(PathBuf::from(value()?)),
            "--connections" => {
                args.connections = value()?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            "--depth" => args.depth = value()?.parse().map_err(|e| format!("--depth: {e}"))?,
            "--pattern" => {
                args.pattern = match value()?.as_str() {
                    "write" => Pattern::Write,
                    "randwrite" => Pattern::RandWrite,
                    "read" => Pattern::Read,
                    "randread" => Pattern::RandRead,
                    other => {
                        return Err(format!(
                            "--pattern: {other:?} is not write, randwrite, read or randread"
                        ))
                    }
                }
            }
            "--bs" => args.bs_bytes = size::parse_size(&value()?).map_err(|e| format!("--bs: {e}"))?,
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--passes" => {
                args.passes = Some(value()?.parse().map_err(|e| format!("--passes: {e}"))?)
            }
            "--size" => {
                args.size_bytes = Some(size::parse_size(&value()?).map_err(|e| format!("--size: {e}"))?)
            }
            "--fua" => args.fua = true,
            "--verify" => args.verify = true,
            "--json" => args.json = true,
            "-h" | "--help" => {
                return Err("usage: nbd_load --socket PATH [--connections N] [--depth N] \
                     [--pattern write|randwrite|read|randread] [--bs SIZE] [--seconds S] [--passes N] [--size SIZE] \
                     [--fua] [--verify] [--json]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    args.socket = socket.ok_or("--socket PATH is required")?;
    if args.connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    // Handles carry the slot in their low 16 bits.
    if args.depth == 0 || args.depth > 1 << 16 {
        return Err("--depth must be between 1 and 65536".into());
    }
    if args.bs_bytes == 0 || !args.bs_bytes.is_multiple_of(8) || args.bs_bytes > u32::MAX as u64 {
        return Err("--bs must be a non-zero multiple of 8 bytes below 4G".into());
    }
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err("--seconds must be positive".into());
    }
    if let Some(passes) = args.passes {
        if passes == 0 || args.pattern.random() {
            return Err("--passes takes a count of at least 1, for sequential patterns".into());
        }
    }
    if args.verify && args.pattern != Pattern::Write {
        return Err("--verify only works with --pattern write".into());
    }
    if args.fua && !args.pattern.writes() {
        return Err("--fua only applies to write patterns".into());
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------------------------------
// Data: each 8-byte word a function of its byte offset in the export and the generation

fn generation_key(generation: u64) -> u64 {
    (generation + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A bijection of `offset ^ key` (xor, odd multiply, xorshift), so words differ everywhere within a generation
/// and every word changes from one generation to the next. Cheap enough to vectorise.
#[inline(always)]
fn word(offset_bytes: u64, key: u64) -> u64 {
    let x = (offset_bytes ^ key).wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^ (x >> 32)
}

fn fill(buf: &mut [u8], offset_bytes: u64, generation: u64) {
    let key = generation_key(generation);
    for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(offset_bytes + 8 * i as u64, key).to_le_bytes());
    }
}

/// The number of 8-byte words of `buf` that differ from what `fill` writes; the first one's offset.
fn mismatches(buf: &[u8], offset_bytes: u64, generation: u64) -> (u64, Option<u64>) {
    let key = generation_key(generation);
    let mut count = 0u64;
    for (i, chunk) in buf.chunks_exact(8).enumerate() {
        let at = offset_bytes + 8 * i as u64;
        count += (u64::from_le_bytes(chunk.try_into().unwrap()) != word(at, key)) as u64;
    }
    if count == 0 {
        return (0, None);
    }
    let first = buf
        .chunks_exact(8)
        .enumerate()
        .map(|(i, chunk)| (offset_bytes + 8 * i as u64, chunk))
        .find(|(at, chunk)| u64::from_le_bytes((*chunk).try_into().unwrap()) != word(*at, key))
        .map(|(at, _)| at);
    (count, first)
}

// ---------------------------------------------------------------------------------------------------------------
// Handshake

fn read_u16(stream: &mut UnixStream) -> io::Result<u16> {
    let mut bytes = [0u8; 2];
    stream.read_exact(&mut bytes)?;
    Ok(u16::from_be_bytes(bytes))
}

fn read_u32(stream: &mut UnixStream) -> io::Result<u32> {
    let mut bytes = [0u8; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn read_u64(stream: &mut UnixStream) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    stream.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

/// Describes an I/O error, calling an early end of stream what it is.
fn io_text(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::UnexpectedEof => "short read: the server closed the connection".into(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no reply from the server within {REPLY_TIMEOUT:?}")
        }
        _ => error.to_string(),
    }
}

/// Fixed newstyle handshake and NBD_OPT_GO for the default export: returns (size, transmission flags).
fn handshake(stream: &mut UnixStream) -> Result<(u64, u16), String> {
    let wrap = |what: &str| {
        let what = what.to_string();
        move |e: io::Error| format!("handshake ({what}): {}", io_text(&e))
    };
    let magic = read_u64(stream).map_err(wrap("greeting"))?;
    if magic != NBDMAGIC {
        return Err(format!("not an NBD server (greeting {magic:#x})"));
    }
    let opt_magic = read_u64(stream).map_err(wrap("greeting"))?;
    if opt_magic != IHAVEOPT {
        return Err(format!(
            "server does not speak newstyle negotiation ({opt_magic:#x})"
        ));
    }
    let server_flags = read_u16(stream).map_err(wrap("greeting"))?;
    if server_flags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err("server does not offer fixed newstyle negotiation".into());
    }
    let mut client_flags = NBD_FLAG_C_FIXED_NEWSTYLE;
    if server_flags & NBD_FLAG_NO_ZEROES != 0 {
        client_flags |= NBD_FLAG_C_NO_ZEROES;
    }
    stream
        .write_all(&client_flags.to_be_bytes())
        .map_err(wrap("client flags"))?;

    // NBD_OPT_GO: export name length 0, no name, 0 information requests.
    let mut option = Vec::with_capacity(22);
    option.extend_from_slice(&IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    option.extend_from_slice(&6u32.to_be_bytes());
    option.extend_from_slice(&0u32.to_be_bytes());
    option.extend_from_slice(&0u16.to_be_bytes());
    stream.write_all(&option).map_err(wrap("NBD_OPT_GO"))?;

    let mut export = None;
    loop {
        let magic = read_u64(stream).map_err(wrap("option reply"))?;
        if magic != OPTION_REPLY_MAGIC {
            return Err(format!("bad option reply magic {magic:#x}"));
        }
        let option = read_u32(stream).map_err(wrap("option reply"))?;
        let reply_type = read_u32(stream).map_err(wrap("option reply"))?;
        let len = read_u32(stream).map_err(wrap("option reply"))? as usize;
        if len > 1 << 20 {
            return Err(format!("option reply of {len} bytes"));
        }
        let mut data = vec![0u8; len];
        stream.read_exact(&mut data).map_err(wrap("option reply"))?;
        if option != NBD_OPT_GO {
            return Err(format!(
                "reply to option {option} while waiting for NBD_OPT_GO"
            ));
        }
        match reply_type {
            NBD_REP_ACK => {
                return export
                    .ok_or_else(|| "NBD_OPT_GO acknowledged without NBD_INFO_EXPORT".into())
            }
            NBD_REP_INFO
                if data.len() >= 2 && u16::from_be_bytes([data[0], data[1]]) == NBD_INFO_EXPORT =>
            {
                if data.len() != 12 {
                    return Err(format!("NBD_INFO_EXPORT of {} bytes", data.len()));
                }
                let size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                let flags = u16::from_be_bytes([data[10], data[11]]);
                export = Some((size, flags));
            }
            t if t & NBD_REP_ERROR_BIT != 0 => {
                return Err(format!(
                    "server refused NBD_OPT_GO (reply {t:#x}): {}",
                    String::from_utf8_lossy(&data)
                ))
            }
            _ => {} // Other replies may be ignored.
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Transmission: a sender thread and a receiver thread per connection

/// What the receiver needs to know about a request in flight.
#[derive(Clone, Copy)]
struct InFlight {
    handle: u64,
    command: u16,
    offset_bytes: u64,
    len_bytes: u32,
    /// For verifying reads: the generation the block was last written with.
    generation: u64,
    verify: bool,
    /// Counts in throughput and latency (the timed phase, not flush or verify).
    timed: bool,
    sent: Instant,
}

#[derive(Default)]
struct ReceiverStats {
    bytes: u64,
    latencies_us: Vec<u32>,
    verified_bytes: u64,
    mismatches: u64,
}

fn absorb(pending: &mut [Option<InFlight>], request: InFlight) {
    let slot = (request.handle & 0xffff) as usize;
    assert!(
        pending[slot].is_none(),
        "slot {slot} reused while in flight"
    );
    pending[slot] = Some(request);
}

fn receive(
    mut stream: UnixStream,
    requests: Receiver<InFlight>,
    free_slots: Sender<usize>,
    depth: usize,
    max_len: usize,
) -> ReceiverStats {
    let mut stats = ReceiverStats::default();
    let mut pending: Vec<Option<InFlight>> = vec![None; depth];
    let mut outstanding = 0usize;
    let mut buf = vec![0u8; max_len];
    let mut header = [0u8; 16];
    loop {
        // Never wait on the socket with nothing outstanding: wait for a request, or end when the sender is done.
        if outstanding == 0 {
            match requests.recv() {
                Ok(request) => {
                    absorb(&mut pending, request);
                    outstanding += 1;
                }
                Err(_) => return stats,
            }
        }
        if let Err(e) = stream.read_exact(&mut header) {
            fail(format!("reading a reply: {}", io_text(&e)));
        }
        let magic = u32::from_be_bytes(header[0..4].try_into().unwrap());
        let error = u32::from_be_bytes(header[4..8].try_into().unwrap());
        let handle = u64::from_be_bytes(header[8..16].try_into().unwrap());
        if magic != SIMPLE_REPLY_MAGIC {
            fail(format!(
                "bad reply magic {magic:#x} (expected a simple reply {SIMPLE_REPLY_MAGIC:#x})"
            ));
        }
        let slot = (handle & 0xffff) as usize;
        if slot >= depth {
            fail(format!("reply with unknown handle {handle:#x}"));
        }
        // The sender queues a request's description before sending it, so it is here by now.
        while pending[slot].is_none() {
            match requests.recv() {
                Ok(request) => {
                    absorb(&mut pending, request);
                    outstanding += 1;
                }
                Err(_) => fail(format!("reply with unknown handle {handle:#x}")),
            }
        }
        let request = pending[slot].take().unwrap();
        if request.handle != handle {
            fail(format!(
                "reply with unknown handle {handle:#x} (in flight in that slot: {:#x})",
                request.handle
            ));
        }
        outstanding -= 1;
        let name = match request.command {
            CMD_READ => "READ",
            CMD_WRITE => "WRITE",
            CMD_FLUSH => "FLUSH",
            _ => "request",
        };
        if error != 0 {
            fail(format!(
                "{name} of {} bytes at offset {} failed: NBD error {error} ({})",
                request.len_bytes,
                request.offset_bytes,
                io::Error::from_raw_os_error(error as i32)
            ));
        }
        if request.command == CMD_READ {
            let data = &mut buf[..request.len_bytes as usize];
            if let Err(e) = stream.read_exact(data) {
                fail(format!(
                    "reading {} bytes of data at offset {}: {}",
                    request.len_bytes,
                    request.offset_bytes,
                    io_text(&e)
                ));
            }
            if request.verify {
                let (count, first) = mismatches(data, request.offset_bytes, request.generation);
                if let Some(at) = first {
                    if stats.mismatches == 0 {
                        eprintln!(
                            "nbd_load: first mismatch at byte offset {at} (generation {})",
                            request.generation
                        );
                    }
                }
                stats.mismatches += count;
                stats.verified_bytes += request.len_bytes as u64;
            }
        }
        if request.timed {
            stats.bytes += request.len_bytes as u64;
            let us = request.sent.elapsed().as_micros().min(u32::MAX as u128) as u32;
            stats.latencies_us.push(us);
        }
        // The sender may already be gone (after its last drain); nothing then waits for slots.
        let _ = free_slots.send(slot);
    }
}

/// One connection: this side sends, a thread on a clone of the socket reads the replies. Requests in flight are
/// bounded by `depth` slots; a slot comes back (through `free_slots`) when its reply has been read.
struct Connection {
    stream: UnixStream,
    requests: Option<Sender<InFlight>>,
    free_slots: Receiver<usize>,
    spare_slots: Vec<usize>,
    receiver: Option<thread::JoinHandle<ReceiverStats>>,
    depth: usize,
    next_sequence: u64,
    payload: Vec<u8>,
}

impl Connection {
    fn start(stream: UnixStream, depth: usize, payload_len: usize, read_len: usize) -> Connection {
        let reader = match stream.try_clone() {
            Ok(reader) => reader,
            Err(e) => fail(format!("cloning the socket: {e}")),
        };
        let (requests, requests_rx) = mpsc::channel();
        let (free_tx, free_slots) = mpsc::channel();
        let receiver =
            thread::spawn(move || receive(reader, requests_rx, free_tx, depth, read_len));
        Connection {
            stream,
            requests: Some(requests),
            free_slots,
            spare_slots: (0..depth).rev().collect(),
            receiver: Some(receiver),
            depth,
            next_sequence: 0,
            payload: vec![0u8; payload_len],
        }
    }

    fn acquire_slot(&mut self) -> usize {
        if let Some(slot) = self.spare_slots.pop() {
            return slot;
        }
        match self.free_slots.recv() {
            Ok(slot) => slot,
            Err(_) => fail("the reply thread stopped"),
        }
    }

    /// Waits for a free slot, describes the request to the reply thread, then sends it.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        command: u16,
        flags: u16,
        offset_bytes: u64,
        len_bytes: u32,
        generation: u64,
        verify: bool,
        timed: bool,
    ) {
        let slot = self.acquire_slot();
        self.next_sequence += 1;
        let handle = (self.next_sequence << 16) | slot as u64;
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[4..6].copy_from_slice(&flags.to_be_bytes());
        header[6..8].copy_from_slice(&command.to_be_bytes());
        header[8..16].copy_from_slice(&handle.to_be_bytes());
        header[16..24].copy_from_slice(&offset_bytes.to_be_bytes());
        header[24..28].copy_from_slice(&len_bytes.to_be_bytes());
        if command == CMD_WRITE {
            fill(
                &mut self.payload[..len_bytes as usize],
                offset_bytes,
                generation,
            );
        }
        let request = InFlight {
            handle,
            command,
            offset_bytes,
            len_bytes,
            generation,
            verify,
            timed,
            sent: Instant::now(),
        };
        if self.requests.as_ref().unwrap().send(request).is_err() {
            fail("the reply thread stopped");
        }
        let mut result = self.stream.write_all(&header);
        if result.is_ok() && command == CMD_WRITE {
            result = self.stream.write_all(&self.payload[..len_bytes as usize]);
        }
        if let Err(e) = result {
            fail(format!("sending a request: {}", io_text(&e)));
        }
    }

    /// Waits until every request sent so far has been answered.
    fn drain(&mut self) {
        while self.spare_slots.len() < self.depth {
            match self.free_slots.recv() {
                Ok(slot) => self.spare_slots.push(slot),
                Err(_) => fail("the reply thread stopped"),
            }
        }
    }

    /// Drains, sends NBD_CMD_DISC and returns what the reply thread gathered.
    fn finish(mut self) -> ReceiverStats {
        self.drain();
        let mut disc = [0u8; 28];
        disc[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        disc[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
        // The server closes the connection after DISC; a failure to send it changes nothing measured.
        let _ = self.stream.write_all(&disc);
        drop(self.requests.take());
        match self.receiver.take().unwrap().join() {
            Ok(stats) => stats,
            Err(_) => fail("the reply thread panicked"),
        }
    }
}

/// xorshift64: uniform enough for picking blocks, and reproducible per connection.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// What one connection does, fixed before the run.
#[derive(Clone, Copy)]
struct Job {
    pattern: Pattern,
    bs_bytes: u64,
    seconds: f64,
    passes: Option<u64>,
    /// Sequential: this connection's share, in blocks from `share_first_block`.
    share_first_block: u64,
    share_blocks: u64,
    /// Random: blocks of the whole region.
    region_blocks: u64,
    seed: u64,
    fua: bool,
    flush: bool,
    verify: bool,
}

struct ConnectionResult {
    stats: ReceiverStats,
    start: Instant,
    end: Instant,
}

fn run_connection(mut conn: Connection, job: Job, barrier: &Barrier) -> ConnectionResult {
    let command = if job.pattern.writes() {
        CMD_WRITE
    } else {
        CMD_READ
    };
    let flags = if job.fua { CMD_FLAG_FUA } else { 0 };
    let bs = job.bs_bytes;
    let mut rng = XorShift(job.seed | 1);
    // Sequential position in the share, and how many times the share has been wrapped.
    let mut position = 0u64;
    let mut generation = 0u64;

    barrier.wait();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(job.seconds);
    while Instant::now() < deadline && job.passes.is_none_or(|passes| generation < passes) {
        let (block, block_generation) = if job.pattern.random() {
            (rng.next() % job.region_blocks, 0)
        } else {
            if position == 0 && generation > 0 {
                // A new pass rewrites blocks the last one may still have in flight, and NBD leaves the order of
                // requests in flight together open: the server may apply the older write last, and verify then
                // reads the pass before (a CI-like run here: 90,112 mismatching words). Every reply first.
                conn.drain();
            }
            let at = (job.share_first_block + position, generation);
            position += 1;
            if position == job.share_blocks {
                position = 0;
                generation += 1;
            }
            at
        };
        conn.send(
            command,
            flags,
            block * bs,
            bs as u32,
            block_generation,
            false,
            true,
        );
    }
    conn.drain();
    let end = Instant::now();

    if job.flush {
        conn.send(CMD_FLUSH, 0, 0, 0, 0, false, false);
        conn.drain();
    }
    if job.verify {
        // Blocks before `position` were last written in pass `generation`, the rest (if wrapped) in the one before.
        for i in 0..job.share_blocks {
            let block_generation = match (i < position, generation) {
                (true, g) => g,
                (false, 0) => break,
                (false, g) => g - 1,
            };
            let offset = (job.share_first_block + i) * bs;
            conn.send(
                CMD_READ,
                0,
                offset,
                bs as u32,
                block_generation,
                true,
                false,
            );
        }
    }
    ConnectionResult {
        stats: conn.finish(),
        start,
        end,
    }
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("nbd_load: {message}");
            return ExitCode::from(2);
        }
    };

    // Connect and negotiate every connection before the clock starts.
    let mut streams = Vec::with_capacity(args.connections);
    let mut export: Option<(u64, u16)> = None;
    for _ in 0..args.connections {
        let mut stream = match UnixStream::connect(&args.socket) {
            Ok(stream) => stream,
            Err(e) => fail(format!("connecting to {}: {e}", args.socket.display())),
        };
        let timeouts = stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(REPLY_TIMEOUT)));
        if let Err(e) = timeouts {
            fail(format!("setting socket timeouts: {e}"));
        }
        let this = handshake(&mut stream).unwrap_or_else(|e| fail(e));
        match export {
            None => export = Some(this),
            Some(first) if first.0 != this.0 => fail(format!(
                "connections disagree on the export size ({} and {} bytes)",
                first.0, this.0
            )),
            Some(_) => {}
        }
        streams.push(stream);
    }
    let (export_bytes, transmission_flags) = export.unwrap();

    if args.pattern.writes() && transmission_flags & NBD_FLAG_READ_ONLY != 0 {
        fail("the export is read-only");
    }
    if args.fua && transmission_flags & NBD_FLAG_SEND_FUA == 0 {
        fail("the server does not accept FUA");
    }
    let flush = args.pattern.writes() && transmission_flags & NBD_FLAG_SEND_FLUSH != 0;
    if args.pattern.writes() && !flush {
        eprintln!("nbd_load: note: the server does not accept FLUSH; none sent");
    }
    let region_bytes = args.size_bytes.unwrap_or(export_bytes);
    if region_bytes > export_bytes {
        fail(format!(
            "--size {region_bytes} is larger than the export ({export_bytes} bytes)"
        ));
    }
    let bs = args.bs_bytes;
    let region_blocks = region_bytes / bs;
    let share_blocks = region_blocks / args.connections as u64;
    if share_blocks == 0 {
        fail(format!(
            "a region of {region_bytes} bytes has no block of {bs} bytes for each of {} connections",
            args.connections
        ));
    }

    let payload_len = if args.pattern.writes() {
        bs as usize
    } else {
        0
    };
    let read_len = if !args.pattern.writes() || args.verify {
        bs as usize
    } else {
        0
    };
    let barrier = Arc::new(Barrier::new(args.connections));
    let workers: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(index, stream)| {
            let job = Job {
                pattern: args.pattern,
                bs_bytes: bs,
                seconds: args.seconds,
                passes: args.passes,
                share_first_block: index as u64 * share_blocks,
                share_blocks,
                region_blocks,
                seed: (index as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d),
                fua: args.fua,
                flush,
                verify: args.verify,
            };
            let barrier = barrier.clone();
            let depth = args.depth;
            thread::spawn(move || {
                let conn = Connection::start(stream, depth, payload_len, read_len);
                run_connection(conn, job, &barrier)
            })
        })
        .collect();
    let results: Vec<ConnectionResult> = workers
        .into_iter()
        .map(|worker| {
            worker
                .join()
                .unwrap_or_else(|_| fail("a connection thread panicked"))
        })
        .collect();

    let start = results.iter().map(|r| r.start).min().unwrap();
    let end = results.iter().map(|r| r.end).max().unwrap();
    let seconds = end.duration_since(start).as_secs_f64().max(1e-9);
    let mut latencies: Vec<u32> = Vec::new();
    let (mut bytes, mut verified_bytes, mut mismatches) = (0u64, 0u64, 0u64);
    for result in results {
        bytes += result.stats.bytes;
        verified_bytes += result.stats.verified_bytes;
        mismatches += result.stats.mismatches;
        latencies.extend_from_slice(&result.stats.latencies_us);
    }
    latencies.sort_unstable();
    let requests = latencies.len() as u64;
    let mib_s = bytes as f64 / seconds / (1u64 << 20) as f64;
    let iops = requests as f64 / seconds;
    let lat_mean_us = if requests == 0 {
        0.0
    } else {
        latencies.iter().map(|&us| us as f64).sum::<f64>() / requests as f64
    };
    let lat_p50_us = percentile(&latencies, 50.0);
    let lat_p99_us = percentile(&latencies, 99.0);

    if args.json {
        let report = serde_json::json!({
            "pattern": args.pattern.name(),
            "bs_bytes": bs,
            "depth": args.depth,
            "connections": args.connections,
            "seconds": seconds,
            "bytes": bytes,
            "mib_s": mib_s,
            "iops": iops,
            "lat_mean_us": lat_mean_us,
            "lat_p50_us": lat_p50_us,
            "lat_p99_us": lat_p99_us,
            "verified_bytes": verified_bytes,
            "mismatches": mismatches,
        });
        println!("{report}");
    } else {
        let verified = if args.verify {
            format!(
                "; verified {} bytes, {mismatches} mismatching words",
                verified_bytes
            )
        } else {
            String::new()
        };
        println!(
            "{} bs={} depth={} connections={}: {:.1} MiB/s, {:.0} IOPS, {} bytes in {:.2} s; \
             latency mean {:.0} us, p50 {} us, p99 {} us{verified}",
            args.pattern.name(),
            human_bytes(bs),
            args.depth,
            args.connections,
            mib_s,
            iops,
            bytes,
            seconds,
            lat_mean_us,
            lat_p50_us,
            lat_p99_us,
        );
    }
    if mismatches > 0 {
        eprintln!(
            "nbd_load: error: verify found {mismatches} mismatching 8-byte words in {verified_bytes} bytes"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
