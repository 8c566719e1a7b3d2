//! The command line, mdadm-like. Every command that prints state takes `--json`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "paraid",
    version,
    about = "Software RAID for NVMe with GPU or CPU SIMD parity, served over NBD"
)]
pub struct Cli {
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create an array: validates every member, discards them (instant init) and writes superblocks.
    Create(CreateArgs),
    /// Assemble an array from its members' superblocks and serve it over NBD (or as a ublk block device, or as a file over FUSE) until
    /// SIGINT/SIGTERM.
    Serve(ServeArgs),
    /// Print one member's superblock.
    Examine(ExamineArgs),
    /// Describe the array that these members form (level, size, members and their states).
    Detail(DetailArgs),
    /// Ask a running array (through its control socket) for its state and the progress of rebuild or check.
    Status(StatusArgs),
    /// Print a running array's state and I/O counters in the Prometheus text format (for a scraper or
    /// node_exporter's textfile collector).
    Metrics(MetricsArgs),
    /// Mark a member of a running array faulty (its chunks are then served by reconstruction).
    Fail(MemberArgs),
    /// Detach a faulty, missing or spare member from a running array.
    Remove(MemberArgs),
    /// Add a member to a running array: a hot spare, which takes over a failed slot at once if there is one.
    Add(AddArgs),
    /// Rebuild a member's contents onto a new one while the old one keeps serving, then detach the old one.
    Replace(ReplaceArgs),
    /// Start a consistency check (or, with --repair, check and repair) of a running array.
    Check(CheckArgs),
    /// Set the rebuild/check rate limits of a running array (like md's sync_speed_min/max).
    Speed(SpeedArgs),
    /// Watch a running array and report each change that needs someone (a member failed, the array degraded,
    /// a rebuild or check started, progressed or ended, mismatches found), like `mdadm --monitor`: a line (or a JSON
    /// object) per event, and a program run for each.
    Monitor(MonitorArgs),
    /// Stop a running array cleanly (as SIGTERM to its `paraid serve` does: clients are disconnected, the array
    /// flushed and marked clean) and wait until its server has exited.
    Stop(StopArgs),
    /// Delete a ublk device whose paraid is gone (one served with --ublk-id waits for a takeover until then; its
    /// waiting I/O fails).
    UblkDelete(UblkDeleteArgs),
    /// Wipe members' paraid metadata (superblock, bitmap, log; like mdadm's --zero-superblock): they no longer
    /// name an array, and `create` takes them without --force. Their data areas are left as they are. Refused for
    /// a member in use (a running `paraid serve`).
    ZeroSuperblock(ZeroSuperblockArgs),
    /// The embedded default: a RAID6 of six sparse files, served over NBD, written and read back by a real client.
    Demo(DemoArgs),
}

impl Command {
    /// Whether the command was asked for JSON output (its errors are then JSON on stdout too).
    pub fn json(&self) -> bool {
        match self {
            Command::Create(a) => a.json,
            Command::Examine(a) => a.json,
            Command::Detail(a) => a.json,
            Command::Status(a) => a.json,
            Command::Fail(a) | Command::Remove(a) => a.json,
            Command::Add(a) => a.json,
            Command::Replace(a) => a.json,
            Command::Check(a) => a.json,
            Command::Speed(a) => a.json,
            Command::Stop(a) => a.json,
            Command::Monitor(a) => a.json,
            Command::UblkDelete(a) => a.json,
            Command::ZeroSuperblock(a) => a.json,
            Command::Serve(_) | Command::Metrics(_) | Command::Demo(_) => false,
        }
    }
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// RAID level: 0, 1, 5, 6 or 10.
    #[arg(long, short = 'l')]
    pub level: String,
    /// Chunk size, a power of two (4K to 16M).
    #[arg(long, short = 'c', default_value = "64K")]
    pub chunk: String,
    /// Array name (at most 32 bytes).
    #[arg(long, short = 'N', default_value = "paraid")]
    pub name: String,
    /// Size of each member: creates member files that don't exist and extends shorter ones.
    #[arg(long, short = 'z')]
    pub size: Option<String>,
    /// Where each member's data starts (like mdadm's --data-offset), whole MiB from 4M to 1G [default: 4M]. The
    /// room before it holds the superblocks, the write-intent bitmap and the write-hole log's ring: a larger ring
    /// fills less often where small writes go into large chunks, each time waiting for old writes and flushing
    /// every member.
    #[arg(long)]
    pub data_offset: Option<String>,
    /// Overwrite members that already belong to a paraid array or hold a filesystem, partition table or volume.
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Member files or block devices, in slot order.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Unix socket to listen on (the default; path defaults to /tmp/paraid-NAME.sock).
    #[arg(long, conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Listen on TCP instead, e.g. 127.0.0.1:10809 (a bare port means 127.0.0.1).
    #[arg(long)]
    pub listen: Option<String>,
    /// Control socket for `paraid status` and the management commands (default: the NBD socket's path + `.ctl`,
    /// or /tmp/paraid-NAME.ctl with --listen, --ublk or --fuse).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Parity backend: auto, cpu or gpu.
    #[arg(long, default_value = "auto")]
    pub parity_backend: String,
    /// Most worker threads per NBD connection (the pool starts with one and grows while every worker is busy;
    /// each runs one request at a time) [default: 16]; with --ublk, the worker threads per queue [default: 16];
    /// with --fuse, the threads that read and serve the file's requests [default: 16].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Serve as a kernel block device, /dev/ublkbN, instead of over NBD (Linux 6.4+ with ublk_drv loaded; root).
    #[arg(long, conflicts_with_all = ["socket", "listen"])]
    pub ublk: bool,
    /// Serve as the regular file FILE instead of over NBD: a FUSE file system mounted over it (FILE is created
    /// empty if missing, and is that empty file again after the stop), for a loop device (`losetup`) where the
    /// kernel has neither nbd nor ublk. Root; detach the loop device before stopping (its I/O fails after).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["socket", "listen", "ublk"])]
    pub fuse: Option<PathBuf>,
    /// ublk hardware queues, each a thread with its own io_uring [default: 1].
    // No clap defaults, and no `requires = "ublk"` (a flag's implicit `false` satisfies it): `serve` refuses the
    // ublk settings without --ublk itself.
    #[arg(long, value_name = "N")]
    pub ublk_queues: Option<u16>,
    /// Requests in flight per ublk queue (each holds a 512 KiB buffer) [default: 64].
    #[arg(long, value_name = "N")]
    pub ublk_depth: Option<u16>,
    /// A fixed device, /dev/ublkbN, that outlives a crash of paraid: its I/O waits (a mounted filesystem sees
    /// nothing) until `paraid serve --ublk --ublk-id N` on the same array takes it over. Without it the kernel
    /// picks the number and a crash fails the device's I/O.
    #[arg(long, value_name = "N")]
    pub ublk_id: Option<u32>,
    /// KiB up to which WRITEs that continue one another and have arrived together are served as one array write
    /// (a client writing sequentially in pieces smaller than a stripe then writes whole stripes), over NBD and
    /// ublk alike; 0 turns it off.
    #[arg(long = "merge-write-kib", value_name = "KIB", default_value_t = paraid_nbd::DEFAULT_MERGE_WRITE_BYTES / 1024)]
    pub merge_write_kib: u32,
    /// Hot spare (repeatable): takes over a failed slot automatically and is rebuilt.
    #[arg(long = "spare")]
    pub spares: Vec<PathBuf>,
    /// MiB of memory for the stripe cache (RAID5/6: the data and parity pages small writes last wrote, so that
    /// rewriting them reads nothing from the drives); 0 turns it off [default: PARAID_STRIPE_CACHE_MIB if set,
    /// else 64, or 0 when every member is on tmpfs/ramfs, where a read is as cheap as the cache].
    #[arg(long = "stripe-cache-mib", value_name = "MIB")]
    pub stripe_cache_mib: Option<usize>,
    /// How RAID1/5/6/10 stay consistent across an unclean stop, like mdadm's --consistency-policy: ppl
    /// (write-intent bitmap and partial parity log: no write hole), journal (ppl whose log may also carry the new
    /// data of a small RAID5/6 write, which is then answered once durable in the log, before it is written in
    /// place: a device round trip less for a client that waits for each write; nothing answered is lost to a kill
    /// or a power loss; it answers so only while the machine has CPU to spare, a write its client waits for alone
    /// from 30 % idle, any write from 50 %, and otherwise takes ppl's way; PARAID_JOURNAL_LONE=on|off pins the
    /// older rules), or bitmap (bitmap and resync only: faster small RAID5/6 writes, but a member
    /// missing at restart can lose blocks of stripes being written at the crash) [default: journal; ppl with
    /// --write-back or where PARAID_JOURNAL=off; bitmap where PARAID_PPL=off].
    #[arg(long = "consistency-policy", value_name = "POLICY", value_parser = ["ppl", "journal", "bitmap"])]
    pub consistency_policy: Option<String>,
    /// Write-back: answer writes of up to 128 KiB (not FUA) once they are held in memory and write them to the
    /// members in the background, so that a client waiting for each write keeps many in flight. FLUSH and FUA
    /// keep their meaning (a flush waits for every write answered before it). Held writes are kept in a file in
    /// /dev/shm as well (PARAID_HELD_DIR sets the directory) until they are in place: if paraid is killed, the
    /// next serve writes them first. A power loss or reboot loses a held write no flush covered, as a drive's
    /// volatile cache does [default: off, or on where PARAID_WRITE_BACK=on].
    #[arg(long = "write-back", conflicts_with = "read_only")]
    pub write_back: bool,
    /// Start an array that failed (more members recorded as failed than its level tolerates) from the failed
    /// members whose departure failed it (they missed only writes that failed with it), like mdadm's --assemble
    /// --force: blocks being written when it failed may read back neither old nor new. Other stale members given
    /// are rebuilt.
    #[arg(long)]
    pub force: bool,
    /// Serve the array read-only and write nothing to its members, superblocks included (like mdadm's
    /// --readonly): clients may only read; nothing is resynced, rebuilt or repaired, and fail, remove, add,
    /// replace and check --repair are refused. Degraded arrays are served; one stopped uncleanly too (the partial
    /// parity log's recovery of the stripes being written at the crash is applied in memory), its dirty state
    /// left for the next read-write start. No writer may serve the members meanwhile.
    #[arg(long = "read-only", conflicts_with = "spares")]
    pub read_only: bool,
    /// Member files or block devices (any order: slots come from the superblocks).
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ExamineArgs {
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    pub member: PathBuf,
}

#[derive(Args, Debug)]
pub struct DetailArgs {
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct MetricsArgs {
    /// The array's control socket (printed by `paraid serve`).
    #[arg(long)]
    pub control: PathBuf,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The array's control socket (printed by `paraid serve`).
    #[arg(long)]
    pub control: PathBuf,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Keep showing progress (a bar on a terminal; a line per second otherwise) until the array is idle.
    #[arg(long)]
    pub watch: bool,
}

#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// The array's control socket (printed by `paraid serve`); repeat it to watch several arrays (the monitor
    /// ends when the last one's server is gone).
    #[arg(long, required = true)]
    pub control: Vec<PathBuf>,
    /// Run this for each event, as `PROGRAM EVENT CONTROL [MEMBER]` (mdadm's order), with PARAID_EVENT,
    /// PARAID_ARRAY, PARAID_UUID, PARAID_CONTROL, PARAID_SLOT, PARAID_MEMBER and PARAID_DETAIL set; events wait
    /// for it in turn.
    #[arg(long)]
    pub program: Option<PathBuf>,
    /// Seconds between two looks at the array.
    #[arg(long, default_value_t = 5)]
    pub delay_s: u64,
    /// Look once, report what needs someone now (a failed or degraded array, a slow member), and exit.
    #[arg(long)]
    pub oneshot: bool,
    /// Report a TestMessage first (to try the program and whoever it alerts).
    #[arg(long)]
    pub test: bool,
    /// Print each event as a JSON object (one per line) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct MemberArgs {
    /// The array's control socket (printed by `paraid serve`: the NBD socket path plus `.ctl`).
    #[arg(long)]
    pub control: PathBuf,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The member: its path or its slot number.
    pub member: String,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// The array's control socket (printed by `paraid serve`: the NBD socket path plus `.ctl`).
    #[arg(long)]
    pub control: PathBuf,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The new member: a file or block device at least as large as the others (not a member of any array).
    pub path: PathBuf,
}

#[derive(Args, Debug)]
pub struct ReplaceArgs {
    /// The array's control socket (printed by `paraid serve`: the NBD socket path plus `.ctl`).
    #[arg(long)]
    pub control: PathBuf,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The member to replace: its path or slot number.
    pub member: String,
    /// The new member.
    pub with: PathBuf,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The array's control socket (printed by `paraid serve`: the NBD socket path plus `.ctl`).
    #[arg(long)]
    pub control: PathBuf,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Repair what the check finds (RAID6 rewrites the named bad chunk; RAID5 rewrites parity).
    #[arg(long)]
    pub repair: bool,
    /// Wait for the check to finish and print its result.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Args, Debug)]
pub struct SpeedArgs {
    /// The array's control socket (printed by `paraid serve`: the NBD socket path plus `.ctl`).
    #[arg(long)]
    pub control: PathBuf,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Rate guaranteed to rebuild/check even while clients do I/O, e.g. 100M (per second).
    #[arg(long)]
    pub min: String,
    /// Rate cap, e.g. 2G (per second); 0 means no cap.
    #[arg(long)]
    pub max: String,
}

#[derive(Args, Debug)]
pub struct StopArgs {
    /// The array's control socket (printed by `paraid serve`: the NBD socket path plus `.ctl`).
    #[arg(long)]
    pub control: PathBuf,
    /// Give up waiting for the server to exit after this many seconds (exit status 1; the server goes on
    /// stopping). Without it, wait as long as the stop takes.
    #[arg(long, value_name = "SECONDS")]
    pub timeout_s: Option<u64>,
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UblkDeleteArgs {
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// The device's number N (/dev/ublkbN).
    pub id: u32,
}

#[derive(Args, Debug)]
pub struct ZeroSuperblockArgs {
    /// Print the result as JSON (one object) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Wipe also a member whose superblock cannot be read (damaged, or another array format's): the default
    /// reserved area (4 MiB).
    #[arg(long)]
    pub force: bool,
    /// Member files or block devices.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Directory for the six member files (created if missing; default: a new temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Size of each sparse member file.
    #[arg(long, default_value = "64M")]
    pub member_size: String,
    /// Keep serving after the demonstration until Ctrl-C.
    #[arg(long)]
    pub keep_serving: bool,
    /// Parity backend: auto, cpu or gpu.
    #[arg(long, default_value = "auto")]
    pub parity_backend: String,
}

/// `ADDR:PORT`, or a bare port on 127.0.0.1 (TCP is loopback-only unless an address is given).
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse::<SocketAddr>().map_err(|_| {
        format!("'{text}' is not a listen address: expected ADDR:PORT such as 127.0.0.1:10809")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_defaults_to_loopback() {
        assert_eq!(
            parse_listen("10809").unwrap().to_string(),
            "127.0.0.1:10809"
        );
        assert_eq!(
            parse_listen("0.0.0.0:99").unwrap().to_string(),
            "0.0.0.0:99"
        );
        assert!(parse_listen("localhost").is_err());
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
