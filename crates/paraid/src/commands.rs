//! create, serve, examine, detail: each validates its input, acts, and prints state (text or `--json`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paraid_engine::{
    Array, ArrayState, AssembleOptions, CreateOptions, Geometry, Level, WriteBackConfig,
};
use paraid_fuse::{FuseConfig, FuseFile};
use paraid_nbd::{BoundSocket, Listener, Server, ServerConfig};
use paraid_parity::BackendChoice;
use paraid_ublk::{UblkConfig, UblkDevice};

use crate::cli::{
    parse_listen, CreateArgs, DetailArgs, ExamineArgs, ServeArgs, UblkDeleteArgs,
    ZeroSuperblockArgs,
};
use crate::control::ControlServer;
use crate::export::ArrayExport;
use crate::metrics::IoMetrics;
use crate::units::{format_bytes, parse_bytes};

pub type CommandResult = Result<(), String>;

pub fn create(args: CreateArgs) -> CommandResult {
    let options = CreateOptions {
        level: args.level.parse::<Level>().map_err(|e| e.to_string())?,
        chunk_bytes: parse_bytes(&args.chunk).map_err(|e| format!("--chunk: {e}"))?,
        name: args.name,
        size_bytes: args
            .size
            .as_deref()
            .map(parse_bytes)
            .transpose()
            .map_err(|e| format!("--size: {e}"))?,
        members: args.members,
        force: args.force,
    };
    let data_offset_bytes = match args.data_offset.as_deref() {
        Some(text) => parse_bytes(text).map_err(|e| format!("--data-offset: {e}"))?,
        None => paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES,
    };
    let report = paraid_engine::create_with_data_offset(&options, data_offset_bytes)
        .map_err(|e| e.to_string())?;
    let geometry = Geometry::new(
        options.level,
        options.members.len(),
        options.chunk_bytes,
        report.member_data_bytes,
    )
    .map_err(|e| format!("the created array's geometry: {e}"))?;
    if args.json {
        let value = serde_json::json!({
            "uuid": report.uuid,
            "name": options.name,
            "level": options.level.to_string(),
            "chunk_bytes": options.chunk_bytes,
            "members": options.members.len(),
            "array_bytes": report.array_bytes,
            "member_data_bytes": report.member_data_bytes,
            "data_offset_bytes": report.data_offset_bytes,
            "discarded_members": report.discarded_members,
            "instant_init": report.discarded_members == options.members.len(),
            "stripe_bytes": parity_stripe_bytes(&geometry),
        });
        println!("{value}");
    } else {
        println!(
            "paraid: created {} array '{}' ({}) of {} members, chunk {}: {} usable",
            options.level,
            options.name,
            report.uuid,
            options.members.len(),
            format_bytes(options.chunk_bytes),
            format_bytes(report.array_bytes)
        );
        if report.discarded_members == options.members.len() {
            println!(
                "paraid: instant init: every member was discarded to zeros, and all-zero data has all-zero parity, \
                 so the array is consistent now, with no resync"
            );
        } else {
            println!(
                "paraid: {} of {} members could not be discarded and were zeroed by writing instead",
                options.members.len() - report.discarded_members,
                options.members.len()
            );
        }
        if let Some(advice) = stripe_advice(&geometry) {
            println!("paraid: {advice}");
        }
    }
    Ok(())
}

/// The data of one stripe of a RAID5/6 array; None for the other levels.
fn parity_stripe_bytes(geometry: &Geometry) -> Option<u64> {
    geometry.level.has_parity().then(|| geometry.stripe_bytes())
}

/// What a filesystem on a RAID5/6 array should be told: a write of whole stripes neither reads old data nor logs
/// partial parity, so a filesystem aligned to them (and a database whose page is a stripe) writes far less. Over
/// ublk mkfs.xfs reads the chunk and the stripe from the device (io_min, io_opt); over NBD and FUSE it cannot.
fn stripe_advice(geometry: &Geometry) -> Option<String> {
    let stripe = parity_stripe_bytes(geometry)?;
    let data = geometry.data_per_stripe();
    Some(format!(
        "a stripe holds {} of data ({data} chunks): writes of whole stripes skip the read-modify-write and the \
         write-hole log. Align a filesystem to them: mkfs.xfs -d su={}k,sw={data} and mount -o swalloc (over \
         ublk mkfs.xfs reads this from the device); for a database, a chunk that makes the stripe its page \
         (InnoDB's 16 KiB on RAID6 of six: --chunk 4K)",
        format_bytes(stripe),
        geometry.chunk_bytes / 1024
    ))
}

pub fn examine(args: ExamineArgs) -> CommandResult {
    let superblock = paraid_engine::examine(&args.member).map_err(|e| e.to_string())?;
    let value = serde_json::to_value(&superblock)
        .map_err(|e| format!("encoding the superblock as JSON: {e}"))?;
    if args.json {
        println!("{value}");
    } else {
        println!("{}:", args.member.display());
        print_fields(&in_use_slots_only(value), 2);
    }
    Ok(())
}

/// Wipes the members' reserved areas; every member is checked before any is written (a bad one leaves all as
/// they were).
pub fn zero_superblock(args: ZeroSuperblockArgs) -> CommandResult {
    let wiped =
        paraid_engine::zero_superblocks(&args.members, args.force).map_err(|e| e.to_string())?;
    if args.json {
        println!("{}", serde_json::json!({ "wiped": wiped }));
        return Ok(());
    }
    for zeroed in &wiped {
        match (&zeroed.name, &zeroed.uuid, zeroed.slot) {
            (Some(name), Some(uuid), Some(slot)) => println!(
                "paraid: {}: superblock of array '{name}' ({uuid}), slot {slot}, wiped ({} zeroed)",
                zeroed.path.display(),
                format_bytes(zeroed.zeroed_bytes)
            ),
            _ => println!(
                "paraid: {}: no readable superblock; {} zeroed (--force)",
                zeroed.path.display(),
                format_bytes(zeroed.zeroed_bytes)
            ),
        }
    }
    Ok(())
}

/// The superblock's slot table in text form: the entries in use, each with its index (the table has 64 entries,
/// mostly unused; `--json` keeps them all).
fn in_use_slots_only(mut superblock: serde_json::Value) -> serde_json::Value {
    if let Some(slots) = superblock.get_mut("slots").and_then(|v| v.as_array_mut()) {
        let in_use: Vec<serde_json::Value> = slots
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry["state"] != "unused")
            .map(|(index, entry)| {
                let mut entry = entry.clone();
                entry["entry"] = index.into();
                entry
            })
            .collect();
        *slots = in_use;
    }
    superblock
}

pub fn detail(args: DetailArgs) -> CommandResult {
    let detail = paraid_engine::inspect(&args.members).map_err(|e| e.to_string())?;
    let value =
        serde_json::to_value(&detail).map_err(|e| format!("encoding the detail as JSON: {e}"))?;
    if args.json {
        println!("{value}");
    } else {
        for line in crate::status_text::detail_lines(&value) {
            println!("{line}");
        }
    }
    Ok(())
}

/// Plain text for a JSON object: `key: value` lines, nested objects and arrays indented.
pub fn print_fields(value: &serde_json::Value, indent: usize) {
    let pad = " ".repeat(indent);
    match value {
        serde_json::Value::Object(map) => {
            for (key, field) in map {
                match field {
                    serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                        println!("{pad}{key}:");
                        print_fields(field, indent + 2);
                    }
                    serde_json::Value::String(text) => println!("{pad}{key}: {text}"),
                    other => println!("{pad}{key}: {other}"),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                match item {
                    serde_json::Value::Object(map) => {
                        let line: Vec<String> = map
                            .iter()
                            .map(|(k, v)| match v {
                                serde_json::Value::String(text) => format!("{k}={text}"),
                                other => format!("{k}={other}"),
                            })
                            .collect();
                        println!("{pad}- {}", line.join(" "));
                    }
                    serde_json::Value::String(text) => println!("{pad}- {text}"),
                    other => println!("{pad}- {other}"),
                }
            }
        }
        other => println!("{pad}{other}"),
    }
}

/// Where `serve` listens: systemd socket activation first (so `nbdinfo -- [ paraid serve ... ]` works), then
/// `--listen`, then a Unix socket.
fn choose_listener(args: &ServeArgs, array_name: &str) -> Result<Listener, String> {
    if paraid_nbd::listener_from_systemd().is_some() {
        return Ok(Listener::Inherited);
    }
    if let Some(text) = &args.listen {
        return Ok(Listener::Tcp(parse_listen(text)?));
    }
    let path = args
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/paraid-{array_name}.sock")));
    // The default path comes from the array's name, which every array created without --name shares.
    let hint = format!(
        "the default socket of arrays named '{array_name}': give this one --socket PATH, or create arrays with \
         distinct --name"
    );
    let hint = args.socket.is_none().then_some(hint.as_str());
    crate::control::clear_stale_socket(&path, "socket", hint)?;
    Ok(Listener::Unix(path))
}

/// Where the control socket goes: `--control`, else beside a Unix NBD socket, else /tmp/paraid-NAME.ctl.
pub fn control_path(
    explicit: Option<&Path>,
    listener: Option<&Listener>,
    array_name: &str,
) -> PathBuf {
    match (explicit, listener) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(Listener::Unix(socket))) => PathBuf::from(format!("{}.ctl", socket.display())),
        (None, _) => PathBuf::from(format!("/tmp/paraid-{array_name}.ctl")),
    }
}

/// Journal mode where `serve` was given no `--consistency-policy` (`ArraySource::journal` None): the default
/// policy is the journal gated on spare CPU, which measured at or ahead of the log alone in every case but one
/// (docs/benchmarks.md, "The gated journal as the default (stop 52)"). Not where the log is off (`PARAID_PPL=off`:
/// the bitmap alone), not where `PARAID_JOURNAL` says (`journal_env_set`: the engine read it, on or off), and not
/// with write-back (`write_back_on`), which answers a small write once held in memory, before the journal could.
fn default_journal(log_on: bool, journal_env_set: bool, write_back_on: bool) -> bool {
    if !log_on || journal_env_set {
        return log_on && paraid_engine::array::journal_from_env();
    }
    !write_back_on
}

/// What `serve_array` assembles: named fields, so member and spare paths cannot trade places.
pub struct ArraySource<'a> {
    pub members: &'a [PathBuf],
    pub spares: &'a [PathBuf],
    /// A `--parity-backend` value.
    pub parity_backend: &'a str,
    /// `--stripe-cache-mib`; None: the engine's default (or its environment variable).
    pub stripe_cache_mib: Option<usize>,
    /// `--consistency-policy ppl|bitmap` as "keep the partial parity log"; None: the engine's default (or its
    /// environment variable).
    pub write_hole_log: Option<bool>,
    /// `--consistency-policy journal` (`AssembleOptions::journal`) as Some(true), another policy as Some(false);
    /// None: `serve`'s default, the journal (`default_journal`).
    pub journal: Option<bool>,
    /// `--force`: start a failed array from the members that left it last (`AssembleOptions::force`).
    pub force: bool,
    /// `--read-only`: write nothing to the members (`AssembleOptions::read_only`).
    pub read_only: bool,
    /// `--write-back` (engine `WriteBack`): small writes answered once held in memory.
    pub write_back: WriteBackConfig,
}

/// How the NBD server serves each connection.
#[derive(Debug, Clone, Copy)]
pub struct NbdTuning {
    /// `--workers`: most worker threads per connection.
    pub workers: usize,
    /// `--merge-write-kib` in bytes: WRITEs that continue one another and arrived together are served as one
    /// array write up to this size (0: never).
    pub merge_write_bytes: u32,
}

impl Default for NbdTuning {
    fn default() -> Self {
        NbdTuning {
            workers: paraid_nbd::DEFAULT_WORKERS_PER_CONNECTION,
            merge_write_bytes: paraid_nbd::DEFAULT_MERGE_WRITE_BYTES,
        }
    }
}

/// How the ublk device serves.
#[derive(Debug, Clone, Copy)]
pub struct UblkTuning {
    /// `--ublk-queues`: hardware queues, each a thread with its own io_uring.
    pub queues: u16,
    /// `--ublk-depth`: requests in flight per queue.
    pub depth: u16,
    /// `--workers`: worker threads per queue.
    pub workers: usize,
    /// `--ublk-id`: a fixed /dev/ublkbN that outlives a crash of paraid (its I/O waits for the next serve).
    pub dev_id: Option<u32>,
    /// `--merge-write-kib` in bytes, as for NBD.
    pub merge_write_bytes: u32,
}

/// Which frontend serves the array.
pub enum Frontend<L> {
    /// NBD, on the listener `L` picks once the array's name is known.
    Nbd { tuning: NbdTuning, listener: L },
    /// A kernel block device, /dev/ublkbN.
    Ublk(UblkTuning),
    /// A regular file, a FUSE mount over it.
    Fuse { path: PathBuf, workers: usize },
}

/// Where a served array can be reached, for the message that says it is ready.
pub enum Endpoint<'a> {
    Nbd(&'a Listener),
    Ublk(&'a Path),
    Fuse(&'a Path),
}

impl Endpoint<'_> {
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Nbd(listener) => describe_listener(listener),
            Endpoint::Ublk(path) => format!("{} (ublk)", path.display()),
            Endpoint::Fuse(path) => format!("{} (a file over FUSE)", path.display()),
        }
    }
}

impl UblkTuning {
    /// The device's settings that do not depend on the array, so that `serve` can check them before it
    /// assembles anything.
    fn config(&self) -> UblkConfig {
        UblkConfig {
            queues: self.queues,
            depth: self.depth,
            workers_per_queue: self.workers,
            dev_id: self.dev_id,
            merge_write_bytes: self.merge_write_bytes,
            // PARAID_UBLK_INLINE=off: every request through the worker pool (for comparing the two).
            serve_inline_when_idle: std::env::var("PARAID_UBLK_INLINE")
                .map_or(true, |v| v != "off"),
            // PARAID_UBLK_MAX_IO_KIB: the largest request (each tag's buffer), for comparing sizes.
            max_io_bytes: std::env::var("PARAID_UBLK_MAX_IO_KIB")
                .ok()
                .and_then(|kib| kib.parse::<u32>().ok())
                .map_or(paraid_ublk::DEFAULT_MAX_IO_BYTES, |kib| {
                    kib.saturating_mul(1024)
                }),
            gather_reads: gather_reads_from_env("PARAID_UBLK_GATHER_READS"),
            ..UblkConfig::default()
        }
    }
}

/// `VAR=N`: READs that arrived together are served as one array call, up to N; `off` or 0: each on its own (for
/// comparing the two). Unset or unreadable: the default.
fn gather_reads_from_env(var: &str) -> usize {
    match std::env::var(var) {
        Ok(v) if v == "off" => 0,
        Ok(v) => v.parse().unwrap_or(paraid_nbd::DEFAULT_GATHER_READS),
        Err(_) => paraid_nbd::DEFAULT_GATHER_READS,
    }
}

/// The ublk device's settings for this array: the tuning's, the array's owner tag, and the chunk and the full
/// stripe as the minimum and optimal I/O sizes where they are powers of two (what mkfs.xfs aligns to).
fn ublk_config(
    detail: &paraid_engine::ArrayDetail,
    array: &Array,
    tuning: UblkTuning,
) -> UblkConfig {
    let chunk_bytes = detail.identity.chunk_bytes;
    let stripe_bytes = chunk_bytes * array.geometry().data_per_stripe() as u64;
    let hint = |bytes: u64| match u32::try_from(bytes) {
        Ok(bytes) if bytes.is_power_of_two() => bytes,
        _ => 0,
    };
    UblkConfig {
        io_min_bytes: hint(chunk_bytes),
        io_opt_bytes: hint(stripe_bytes),
        owner_tag: owner_tag(&detail.identity.uuid),
        whole_write_bytes: stripe_bytes,
        ..tuning.config()
    }
}

/// The first 64 bits of the array's UUID: what a ublk device that outlived its server remembers of its array, so
/// that only a server of the same array takes it over.
fn owner_tag(uuid: &str) -> u64 {
    let hex: String = uuid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    u64::from_str_radix(&hex, 16).unwrap_or(0)
}

/// Starts the control socket for a served array.
fn start_control(
    path: &Path,
    array: &Arc<Array>,
    shutdown: &Arc<AtomicBool>,
) -> Result<(ControlServer, Arc<IoMetrics>), String> {
    let metrics = Arc::new(IoMetrics::default());
    let server = ControlServer::start(path, array.clone(), metrics.clone(), shutdown.clone())?;
    Ok((server, metrics))
}

/// A start that failed after assembly: the array is stopped cleanly (it was marked dirty), then `message`.
fn stop_and_fail(array: Arc<Array>, message: String) -> Result<ArrayState, String> {
    stop_array(array)?;
    Err(message)
}

/// Assembles the array and serves it (NBD or ublk data plane, control socket) until `shutdown`; then stops it
/// cleanly (flush, mark clean).
pub fn serve_array<L: FnOnce(&str) -> Result<Listener, String>>(
    source: ArraySource<'_>,
    frontend: Frontend<L>,
    control: Option<&Path>,
    shutdown: Arc<AtomicBool>,
    on_ready: impl FnOnce(&Endpoint<'_>, &Path, &Array),
) -> Result<ArrayState, String> {
    let ArraySource {
        members,
        spares,
        parity_backend,
        stripe_cache_mib,
        write_hole_log,
        journal,
        force,
        read_only,
        write_back,
    } = source;
    let choice: BackendChoice = parity_backend
        .parse()
        .map_err(|e| format!("--parity-backend: {e}"))?;
    let parity = paraid_parity::select(choice);
    let mut options = AssembleOptions {
        spares: spares.to_vec(),
        stripe_cache_bytes: stripe_cache_mib
            .map(|mib| mib.saturating_mul(1 << 20))
            .or_else(paraid_engine::array::stripe_cache_bytes_from_env),
        ..AssembleOptions::new(parity)
    };
    if let Some(log) = write_hole_log {
        options.write_hole_log = log;
    }
    options.journal = journal.unwrap_or_else(|| {
        default_journal(
            options.write_hole_log,
            std::env::var_os(paraid_engine::JOURNAL_ENV).is_some(),
            write_back.is_on(),
        )
    });
    // Journal mode answers early only while the machine has CPU to spare for it (engine spare_cpu.rs), unless
    // PARAID_JOURNAL_LONE pins a rule: "on" the frontend's lone rule alone, "off" every small write early.
    if options.journal && std::env::var_os(paraid_engine::array::LONE_ANSWERS_ENV).is_none() {
        options.gate_answers_on_spare_cpu();
    }
    options.force = force;
    options.read_only = read_only;
    let array = Arc::new(paraid_engine::assemble(members, options).map_err(|e| e.to_string())?);
    // Journal mode answers small writes through the write-back pool, once they are durable in the log. Only where
    // the array can answer from its log (RAID5/6): elsewhere the pool's threads would never be used.
    let write_back = if array.answers_from_log() && !read_only {
        let pool = if write_back.is_on() {
            write_back
        } else {
            WriteBackConfig::JOURNAL
        };
        WriteBackConfig {
            answer: paraid_engine::Answer::FromLog,
            ..pool
        }
    } else {
        write_back
    };
    // Said on the frontend line because it changes what a kill of paraid may lose.
    let answers_when_held =
        write_back.is_on() && write_back.answer == paraid_engine::Answer::WhenHeld;
    // What a killed serve's write-back held is written before anything is served; this serve's held writes are
    // kept beside it (held.rs).
    let held_path = crate::held::path_for(&array);
    let held_store = match crate::held::prepare(&array, &held_path, &write_back, read_only) {
        Ok(store) => store,
        Err(message) => return stop_and_fail(array, message),
    };
    let held_kept = held_store.is_some();
    let outcome = serve_frontend(
        array,
        frontend,
        control,
        shutdown,
        on_ready,
        write_back,
        held_store,
        answers_when_held,
    );
    // Stopped cleanly: every held write is in place.
    if held_kept && outcome.is_ok() {
        crate::held::remove(&held_path);
    }
    outcome
}

/// `serve_array` from the frontend on: serves until `shutdown`, then stops the array.
#[allow(clippy::too_many_arguments)]
fn serve_frontend<L: FnOnce(&str) -> Result<Listener, String>>(
    array: Arc<Array>,
    frontend: Frontend<L>,
    control: Option<&Path>,
    shutdown: Arc<AtomicBool>,
    on_ready: impl FnOnce(&Endpoint<'_>, &Path, &Array),
    write_back: WriteBackConfig,
    held_store: Option<paraid_engine::array::held::HeldStore>,
    answers_when_held: bool,
) -> Result<ArrayState, String> {
    let detail = array.detail();
    match frontend {
        Frontend::Nbd { tuning, listener } => {
            let listener = match listener(&detail.identity.name) {
                Ok(listener) => listener,
                Err(message) => return stop_and_fail(array, message),
            };
            let control_path = control_path(control, Some(&listener), &detail.identity.name);
            let (control_server, metrics) = match start_control(&control_path, &array, &shutdown) {
                Ok(started) => started,
                Err(message) => return stop_and_fail(array, message),
            };
            // Made before the socket is bound: a client that can connect finds the export whole (its write-back
            // pool started).
            let export = ArrayExport::new(array.clone(), metrics, write_back, held_store);
            // Bound before anything says the array is served: a port or path that cannot be bound is the error.
            let socket = match BoundSocket::bind(listener.clone()) {
                Ok(socket) => socket,
                Err(error) => {
                    drop(export);
                    drop(control_server);
                    return stop_and_fail(array, error.to_string());
                }
            };
            control_server.set_frontend(serde_json::json!({
                "kind": "nbd",
                "uri": describe_listener(&listener),
                "export_name": detail.identity.name,
                "write_back": answers_when_held,
            }));
            on_ready(&Endpoint::Nbd(&listener), &control_path, &array);
            let config = ServerConfig {
                export_name: detail.identity.name.clone(),
                description: format!("paraid {} {}", detail.identity.level, detail.identity.uuid),
                workers_per_connection: tuning.workers.max(1),
                merge_write_bytes: tuning.merge_write_bytes,
                gather_reads: gather_reads_from_env("PARAID_NBD_GATHER_READS"),
                ..ServerConfig::default()
            };
            let server = Server::new(Arc::new(export), config);
            let served = server.serve_socket(socket, shutdown.clone());
            drop(server);
            // The NBD server can also end on its own (socket activation, an error): the control thread follows.
            shutdown.store(true, Ordering::SeqCst);
            drop(control_server);
            let stopped = stop_array(array);
            served.map_err(|e| e.to_string())?;
            stopped
        }
        Frontend::Ublk(tuning) => {
            let control_path = control_path(control, None, &detail.identity.name);
            let (control_server, metrics) = match start_control(&control_path, &array, &shutdown) {
                Ok(started) => started,
                Err(message) => return stop_and_fail(array, message),
            };
            let export = Arc::new(ArrayExport::new(
                array.clone(),
                metrics,
                write_back,
                held_store,
            ));
            let device = match UblkDevice::start(export, &ublk_config(&detail, &array, tuning)) {
                Ok(device) => device,
                Err(error) => {
                    // The control thread runs until the shutdown flag says otherwise.
                    shutdown.store(true, Ordering::SeqCst);
                    drop(control_server);
                    return stop_and_fail(array, error.to_string());
                }
            };
            control_server.set_frontend(serde_json::json!({
                "kind": "ublk",
                "device": device.block_path(),
                "ublk_id": device.dev_id(),
                "survives_server_crash": tuning.dev_id.is_some(),
                "write_back": answers_when_held,
            }));
            on_ready(&Endpoint::Ublk(&device.block_path()), &control_path, &array);
            while !shutdown.load(Ordering::SeqCst) && device.serving() {
                std::thread::sleep(Duration::from_millis(100));
            }
            // A queue that ended without a stop broke its ring: the device is removed and the array stopped.
            let broke = !shutdown.load(Ordering::SeqCst);
            let removed = device.stop();
            shutdown.store(true, Ordering::SeqCst);
            drop(control_server);
            let stopped = stop_array(array);
            match removed {
                Err(error) => return Err(format!("removing the ublk device: {error}")),
                Ok(_) if broke => return Err("the ublk device stopped serving".into()),
                Ok(_) => {}
            }
            stopped
        }
        Frontend::Fuse { path, workers } => {
            let control_path = control_path(control, None, &detail.identity.name);
            let (control_server, metrics) = match start_control(&control_path, &array, &shutdown) {
                Ok(started) => started,
                Err(message) => return stop_and_fail(array, message),
            };
            let export = Arc::new(ArrayExport::new(
                array.clone(),
                metrics,
                write_back,
                held_store,
            ));
            let config = FuseConfig {
                workers,
                ..FuseConfig::default()
            };
            // Said before the file is served: whoever sees the file at its size may ask at once.
            control_server.set_frontend(serde_json::json!({
                "kind": "fuse",
                "file": path,
                "write_back": answers_when_held,
            }));
            let file = match FuseFile::start(export, &path, &config) {
                Ok(file) => file,
                Err(error) => {
                    shutdown.store(true, Ordering::SeqCst);
                    drop(control_server);
                    return stop_and_fail(array, error.to_string());
                }
            };
            on_ready(&Endpoint::Fuse(file.path()), &control_path, &array);
            while !shutdown.load(Ordering::SeqCst) && file.serving() {
                std::thread::sleep(Duration::from_millis(100));
            }
            // Unmounted from outside (`umount FILE`): the array is stopped as for a signal.
            let unmounted = !shutdown.load(Ordering::SeqCst);
            let stopped_file = file.stop();
            shutdown.store(true, Ordering::SeqCst);
            drop(control_server);
            let stopped = stop_array(array);
            match stopped_file {
                Err(error) => return Err(format!("ending the FUSE mount: {error}")),
                Ok(stats) if stats.aborted => log::warn!(
                    "the served file was still open at the stop (a loop device?): its connection was aborted"
                ),
                Ok(_) => {}
            }
            if unmounted {
                log::info!("the served file was unmounted: stopping");
            }
            stopped
        }
    }
}

/// Stops the array cleanly; the state it recorded (clean, or dirty with a resync left to resume).
fn stop_array(array: Arc<Array>) -> Result<ArrayState, String> {
    match Arc::try_unwrap(array) {
        Ok(array) => array.stop().map_err(|e| format!("stopping the array: {e}")),
        Err(_) => {
            Err("stopping the array: it is still in use by a connection that did not end".into())
        }
    }
}

fn physical_memory_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page_bytes) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64).saturating_mul(page_bytes.max(0) as u64)
}

/// `--merge-write-kib` in bytes, refused past the largest request the server accepts.
fn merge_write_bytes(kib: u32) -> Result<u32, String> {
    let limit_kib = ServerConfig::default().max_request_bytes / 1024;
    if kib > limit_kib {
        return Err(format!(
            "--merge-write-kib {kib}: at most {limit_kib} (the largest request the server accepts)"
        ));
    }
    Ok(kib * 1024)
}

/// Most worker threads `--workers` may ask for, per connection or ublk queue (each holds request buffers).
const MAX_WORKERS: usize = 1024;

pub fn serve(args: ServeArgs) -> CommandResult {
    // Every flag is checked before the array is assembled: a refused command writes nothing.
    if let Some(text) = &args.listen {
        // A trial bind: a port in use is refused before the array is assembled (std sets SO_REUSEADDR, so the
        // real bind after it succeeds).
        let addr = parse_listen(text)?;
        drop(
            std::net::TcpListener::bind(addr)
                .map_err(|e| format!("binding TCP address {addr}: {e}"))?,
        );
    }
    if !args.ublk {
        let given = [
            ("--ublk-queues", args.ublk_queues.is_some()),
            ("--ublk-depth", args.ublk_depth.is_some()),
            ("--ublk-id", args.ublk_id.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            return Err(format!("{flag} applies only with --ublk"));
        }
    }
    if args.write_back && args.consistency_policy.as_deref() == Some("journal") {
        return Err("--write-back answers writes before they are durable, --consistency-policy journal once they \
                    are durable in the log: give one of them"
            .to_string());
    }
    if let Some(workers) = args.workers.filter(|w| !(1..=MAX_WORKERS).contains(w)) {
        return Err(format!("--workers {workers}: 1 to {MAX_WORKERS}"));
    }
    let workers = args
        .workers
        .unwrap_or(paraid_nbd::DEFAULT_WORKERS_PER_CONNECTION);
    if let Some(mib) = args.stripe_cache_mib {
        let memory_mib = physical_memory_bytes() >> 20;
        if mib as u64 > memory_mib / 2 {
            return Err(format!(
                "--stripe-cache-mib {mib}: more than half of this machine's memory ({memory_mib} MiB)"
            ));
        }
    }
    // A socket a live server holds (or a path that is no socket) is refused before the array is assembled, which
    // writes its superblocks. Default paths come from the array's name: read it from the superblocks first.
    let early_name = paraid_engine::inspect(&args.members)
        .ok()
        .map(|detail| detail.identity.name);
    if let Some(name) = &early_name {
        let listener = if args.ublk
            || args.fuse.is_some()
            || args.listen.is_some()
            || paraid_nbd::listener_from_systemd().is_some()
        {
            None
        } else {
            Some(choose_listener(&args, name)?)
        };
        let control = control_path(args.control.as_deref(), listener.as_ref(), name);
        crate::control::clear_stale_control_socket(&control)?;
    }
    let frontend = if let Some(path) = &args.fuse {
        if let Err(why) = paraid_fuse::available() {
            return Err(format!("--fuse: {why}"));
        }
        // Checked before the array is assembled: a refused serve writes nothing.
        paraid_fuse::mount::check_mount_file(path).map_err(|e| format!("--fuse: {e}"))?;
        Frontend::Fuse {
            path: path.clone(),
            // As many as NBD and ublk start by default: on drives that wait for their media, requests in flight
            // are what keeps them busy (under MariaDB on disk, 16 workers gave 1.5x the TPS of 4); on members in
            // memory on few cores fewer queue less on stripe locks (`--workers 4`; docs/benchmarks.md, "A file
            // over FUSE, served by paraid itself").
            workers: args.workers.unwrap_or(paraid_fuse::DEFAULT_WORKERS),
        }
    } else if args.ublk {
        let tuning = UblkTuning {
            queues: args.ublk_queues.unwrap_or(paraid_ublk::DEFAULT_QUEUES),
            depth: args.ublk_depth.unwrap_or(paraid_ublk::DEFAULT_DEPTH),
            workers,
            dev_id: args.ublk_id,
            merge_write_bytes: merge_write_bytes(args.merge_write_kib)?,
        };
        tuning
            .config()
            .validate()
            .map_err(|e| format!("--ublk: {e}"))?;
        Frontend::Ublk(tuning)
    } else {
        Frontend::Nbd {
            tuning: NbdTuning {
                workers,
                merge_write_bytes: merge_write_bytes(args.merge_write_kib)?,
            },
            listener: |name: &str| choose_listener(&args, name),
        }
    };
    let shutdown = crate::signals::shutdown_flag();
    let members = args.members.clone();
    let stopped = serve_array(
        ArraySource {
            members: &members,
            spares: &args.spares,
            parity_backend: &args.parity_backend,
            stripe_cache_mib: args.stripe_cache_mib,
            write_hole_log: args
                .consistency_policy
                .as_deref()
                .map(|p| p == "ppl" || p == "journal"),
            journal: args.consistency_policy.as_deref().map(|p| p == "journal"),
            force: args.force,
            read_only: args.read_only,
            write_back: if args.write_back {
                WriteBackConfig::on()
            } else {
                WriteBackConfig::from_env()
            },
        },
        frontend,
        args.control.as_deref(),
        shutdown,
        |endpoint, control, array| {
            let detail = array.detail();
            // stderr: with socket activation, stdout belongs to the client that started us.
            eprintln!(
                "paraid: serving {} array '{}' ({}), {} on {}; control socket {}; `paraid stop`, SIGINT or SIGTERM \
                 stops it cleanly",
                detail.identity.level,
                detail.identity.name,
                serving_state(&detail),
                format_bytes(detail.identity.size_bytes),
                endpoint.describe(),
                control.display()
            );
        },
    )?;
    if args.read_only {
        eprintln!(
            "paraid: stopped; nothing was written to the members (read-only; they stay {})",
            json_word(&stopped)
        );
    } else {
        eprintln!("paraid: stopped; {}", describe_stopped(stopped));
    }
    Ok(())
}

/// What a clean stop left on the members, for the line `serve` ends with.
pub fn describe_stopped(state: ArrayState) -> &'static str {
    match state {
        ArrayState::Clean => "the array is marked clean on every member",
        _ => "the array is left dirty on every member: the resync of its dirty regions was cut short and resumes at \
              the next start",
    }
}

pub fn ublk_delete(args: UblkDeleteArgs) -> CommandResult {
    let deleted = paraid_ublk::delete_device(Path::new(paraid_ublk::ctrl::CONTROL_PATH), args.id)
        .map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "ublk_id": deleted.dev_id,
                "deleted": true,
                "server_pid": deleted.server_pid,
                "waiting_io_failed": deleted.was_waiting,
            })
        );
    } else if deleted.was_waiting {
        println!(
            "paraid: /dev/ublkb{} deleted; it was waiting for a takeover (server pid {} is gone), and the I/O that \
             waited on it has failed",
            deleted.dev_id, deleted.server_pid
        );
    } else {
        println!("paraid: /dev/ublkb{} deleted", deleted.dev_id);
    }
    Ok(())
}

/// What a user starting the array needs to know of its state: how many members serve, and the background job
/// (a resync after an unclean stop, a resumed rebuild). The superblock's `dirty` says only that the array is in
/// use, which every served array is.
fn serving_state(detail: &paraid_engine::ArrayDetail) -> String {
    let active = detail
        .members
        .iter()
        .filter(|m| m.state == paraid_engine::SlotState::Active)
        .count();
    let mut words = format!("{active} of {} members active", detail.members.len());
    if active < detail.members.len() {
        words.push_str(", degraded");
    }
    if detail.read_only {
        words.push_str(", read-only: nothing is written to the members");
    }
    // A rebuild job without a slot is only looking for a spare (it ends at once when there is none).
    if let Some(progress) = detail
        .progress
        .as_ref()
        .filter(|p| p.kind != "rebuild" || p.slot.is_some())
    {
        match progress.slot {
            Some(slot) => words.push_str(&format!(", {} of slot {slot} running", progress.kind)),
            None => words.push_str(&format!(", {} running", progress.kind)),
        }
    }
    words
}

/// The JSON word for a serializable enum (`clean`, `dirty`, `raid6`): the same words `--json` prints.
pub fn json_word<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(word)) => word,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_string(),
    }
}

pub fn describe_listener(listener: &Listener) -> String {
    match listener {
        Listener::Unix(path) => format!("nbd+unix:///?socket={}", path.display()),
        Listener::Tcp(addr) => format!("nbd://{addr}"),
        Listener::Inherited => "the socket systemd (or the client) handed over".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::default_journal;
    use super::{parity_stripe_bytes, stripe_advice};
    use paraid_engine::{Geometry, Level};

    fn geometry(level: Level, members: usize, chunk_bytes: u64) -> Geometry {
        Geometry::new(level, members, chunk_bytes, 16 * chunk_bytes).expect("geometry")
    }

    /// Without `PARAID_JOURNAL`: the journal unless the log is off or write-back answers first.
    #[test]
    fn the_default_policy_is_the_journal_unless_the_log_is_off_or_write_back_is_on() {
        assert!(default_journal(true, false, false));
        assert!(!default_journal(true, false, true));
        assert!(!default_journal(false, false, false));
        assert!(
            !default_journal(false, true, false),
            "no journal without its log"
        );
    }

    #[test]
    fn create_tells_the_stripe_a_filesystem_should_align_to() {
        assert_eq!(
            parity_stripe_bytes(&geometry(Level::Raid6, 6, 4096)),
            Some(16384)
        );
        assert_eq!(
            parity_stripe_bytes(&geometry(Level::Raid5, 6, 65536)),
            Some(5 * 65536)
        );
        assert_eq!(
            parity_stripe_bytes(&geometry(Level::Raid10, 4, 65536)),
            None
        );
        let advice = stripe_advice(&geometry(Level::Raid6, 6, 4096)).expect("RAID6 has stripes");
        assert!(
            advice.starts_with("a stripe holds 16 KiB of data (4 chunks)"),
            "{advice}"
        );
        assert!(
            advice.contains("mkfs.xfs -d su=4k,sw=4 and mount -o swalloc"),
            "{advice}"
        );
        assert!(stripe_advice(&geometry(Level::Raid1, 2, 65536)).is_none());
    }
}
