//! `paraid demo`: the embedded default. A RAID6 of six sparse files, created, served over NBD on a Unix socket,
//! written and read back with `nbdcopy` (a client we did not write), then stopped cleanly.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use paraid_engine::{CreateOptions, Level};
use paraid_nbd::Listener;

use crate::cli::DemoArgs;
use crate::commands::{serve_array, ArraySource, CommandResult, Frontend, NbdTuning};
use crate::units::{format_bytes, parse_bytes};

const MEMBER_COUNT: usize = 6;
const SAMPLE_BYTES: usize = 32 << 20;

pub fn run(args: DemoArgs) -> CommandResult {
    let member_bytes = parse_bytes(&args.member_size).map_err(|e| format!("--member-size: {e}"))?;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => make_temp_dir()?,
    };
    fs::create_dir_all(&dir)
        .map_err(|e| format!("{}: creating the demo directory: {e}", dir.display()))?;
    let members: Vec<PathBuf> = (0..MEMBER_COUNT)
        .map(|i| dir.join(format!("member{i}.img")))
        .collect();
    for member in &members {
        if member.exists() {
            return Err(format!(
                "{}: already exists; give --dir an empty directory (the demo never overwrites files)",
                member.display()
            ));
        }
    }

    step(&format!(
        "1. creating RAID6 over {MEMBER_COUNT} sparse files of {} in {}",
        format_bytes(member_bytes),
        dir.display()
    ));
    let started = Instant::now();
    let report = paraid_engine::create(&CreateOptions {
        force: false,
        level: Level::Raid6,
        chunk_bytes: 64 << 10,
        name: "demo".into(),
        size_bytes: Some(member_bytes),
        members: members.clone(),
    })
    .map_err(|e| e.to_string())?;
    println!(
        "   array {} : {} usable, chunk 64 KiB, initialised in {:.0} ms by discarding the members (instant init)",
        report.uuid,
        format_bytes(report.array_bytes),
        started.elapsed().as_secs_f64() * 1e3
    );

    let socket = dir.join("paraid.sock");
    let shutdown = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<String>();
    let server = {
        let members = members.clone();
        let socket = socket.clone();
        let shutdown = shutdown.clone();
        let backend = args.parity_backend.clone();
        std::thread::Builder::new()
            .name("demo-server".into())
            .spawn(move || {
                serve_array(
                    ArraySource {
                        members: &members,
                        spares: &[],
                        parity_backend: &backend,
                        stripe_cache_mib: None,
                        write_hole_log: None,
                        journal: None,
                        force: false,
                        read_only: false,
                        write_back: paraid_engine::WriteBackConfig::from_env(),
                    },
                    Frontend::Nbd {
                        tuning: NbdTuning::default(),
                        listener: |_: &str| Ok(Listener::Unix(socket)),
                    },
                    None,
                    shutdown,
                    |endpoint, _control, array| {
                        let detail = array.detail();
                        // Said as `paraid status` says it, so a newcomer does not read "dirty" as damage.
                        let state = crate::status_text::state_words(&crate::commands::json_word(
                            &detail.identity.state,
                        ));
                        let _ = ready_tx.send(format!(
                            "{state}; {} members, parity backend {}, on {}",
                            detail.members.len(),
                            detail.parity_backend,
                            endpoint.describe()
                        ));
                    },
                )
            })
            .map_err(|e| format!("starting the server thread: {e}"))?
    };
    let ready = match ready_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(ready) => ready,
        Err(_) => {
            shutdown.store(true, Ordering::SeqCst);
            return match server.join() {
                Ok(Err(message)) => Err(message),
                _ => Err("the demo server did not start within 30 s".into()),
            };
        }
    };
    step(&format!("2. serving the array: {ready}"));
    wait_for_socket(&socket)?;
    let uri = format!("nbd+unix:///?socket={}", socket.display());

    let outcome = exercise(&dir, &uri);
    if args.keep_serving && outcome.is_ok() {
        step("serving until Ctrl-C (SIGINT) or SIGTERM");
        let signalled = crate::signals::shutdown_flag();
        while !signalled.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    shutdown.store(true, Ordering::SeqCst);
    let served = server
        .join()
        .map_err(|_| "the demo server thread panicked".to_string())?;
    outcome?;
    let stopped = served?;
    step(&format!(
        "5. stopped the server: {}",
        crate::commands::describe_stopped(stopped)
    ));
    let member_list: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    println!();
    println!("To serve it again and connect:");
    println!(
        "   paraid serve --socket {} {}",
        socket.display(),
        member_list.join(" ")
    );
    println!("   nbdinfo {uri}");
    println!(
        "   nbdcopy {uri} copy.img          # or: nbdfuse DIR {uri}; losetup; mkfs.xfs; mount"
    );
    println!("   paraid detail {}", member_list.join(" "));
    Ok(())
}

/// The client side of the demo: nbdinfo, then nbdcopy in and out, compared byte for byte.
fn exercise(dir: &Path, uri: &str) -> CommandResult {
    step("3. nbdinfo (libnbd) reads the export:");
    let info = run_client(Command::new("nbdinfo").arg(uri))?;
    for line in info
        .lines()
        .filter(|l| l.contains("export-size") || l.contains("can_") || l.contains("is_"))
        .take(12)
    {
        println!("   {}", line.trim());
    }

    let input = dir.join("sample.bin");
    let output = dir.join("readback.bin");
    write_sample(&input)?;
    step(&format!(
        "4. nbdcopy writes {} of random data into the array and reads the array back",
        format_bytes(SAMPLE_BYTES as u64)
    ));
    let started = Instant::now();
    run_client(Command::new("nbdcopy").arg(&input).arg(uri))?;
    let write_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    run_client(Command::new("nbdcopy").arg(uri).arg(&output))?;
    let read_s = started.elapsed().as_secs_f64();
    let matched = compare_prefix(&input, &output)?;
    let _ = fs::remove_file(&input);
    let _ = fs::remove_file(&output);
    if !matched {
        return Err("read-back data differs from what was written".into());
    }
    println!(
        "   wrote {} in {:.2} s, read the whole array back in {:.2} s: the first {} are byte-identical, the rest reads as zeros",
        format_bytes(SAMPLE_BYTES as u64),
        write_s,
        read_s,
        format_bytes(SAMPLE_BYTES as u64)
    );
    Ok(())
}

fn step(text: &str) {
    println!("paraid demo: {text}");
}

fn run_client(command: &mut Command) -> Result<String, String> {
    let name = command.get_program().to_string_lossy().into_owned();
    let output = command
        .output()
        .map_err(|e| format!("running {name}: {e} (install it: apt-get install libnbd-bin)"))?;
    if !output.status.success() {
        return Err(format!(
            "{name} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Random bytes from a small xorshift generator seeded by the clock: the demo needs variety, not secrecy.
fn write_sample(path: &Path) -> CommandResult {
    let mut state = (Instant::now().elapsed().as_nanos() as u64)
        ^ 0x9e37_79b9_7f4a_7c15
        ^ std::process::id() as u64;
    let mut bytes = vec![0u8; SAMPLE_BYTES];
    for word in bytes.chunks_exact_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes());
    }
    fs::File::create(path)
        .and_then(|mut f| f.write_all(&bytes))
        .map_err(|e| format!("{}: writing the sample: {e}", path.display()))
}

/// True when `output` starts with the bytes of `input` and holds only zeros after them.
fn compare_prefix(input: &Path, output: &Path) -> Result<bool, String> {
    let written = fs::read(input).map_err(|e| format!("{}: {e}", input.display()))?;
    let mut reader = fs::File::open(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let mut prefix = vec![0u8; written.len()];
    reader
        .read_exact(&mut prefix)
        .map_err(|e| format!("{}: reading back: {e}", output.display()))?;
    if prefix != written {
        return Ok(false);
    }
    let mut rest = vec![0u8; 1 << 20];
    loop {
        let n = reader
            .read(&mut rest)
            .map_err(|e| format!("{}: {e}", output.display()))?;
        if n == 0 {
            return Ok(true);
        }
        if rest[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

fn wait_for_socket(socket: &Path) -> CommandResult {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{}: the server did not start listening within 10 s",
        socket.display()
    ))
}

fn make_temp_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let dir = base.join(format!("paraid-demo-{}-{attempt}", std::process::id()));
        if fs::create_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    Err(format!(
        "{}: could not create a demo directory",
        base.display()
    ))
}
