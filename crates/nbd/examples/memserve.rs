//! Serves an in-memory export over NBD: a test fixture and the smallest example of the crate's API.
//!
//!     memserve [--size 64M] [--unix PATH | --tcp 127.0.0.1:10809] [--name NAME] [--read-only] [--workers N]
//!
//! Without --unix/--tcp it expects socket activation, so `nbdinfo -- [ memserve --size 1G ]` works. SIGINT or
//! SIGTERM stops it cleanly (in-flight requests answered, socket file removed).

#[path = "common/size.rs"]
mod size;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paraid_nbd::{listener_from_systemd, Listener, MemoryExport, Server, ServerConfig};

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALLED.store(true, Ordering::Relaxed);
}

struct Args {
    size_bytes: usize,
    listener: Option<Listener>,
    name: String,
    read_only: bool,
    workers: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        size_bytes: 64 << 20,
        listener: None,
        name: String::new(),
        read_only: false,
        workers: 4,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--size" => {
                args.size_bytes = usize::try_from(size::parse_size(&value()?)?)
                    .map_err(|_| "--size too large".to_string())?
            }
            "--unix" => args.listener = Some(Listener::Unix(PathBuf::from(value()?))),
            "--tcp" => {
                let addr: SocketAddr = value()?.parse().map_err(|e| format!("--tcp: {e}"))?;
                args.listener = Some(Listener::Tcp(addr));
            }
            "--name" => args.name = value()?,
            "--read-only" => args.read_only = true,
            "--workers" => {
                args.workers = value()?.parse().map_err(|e| format!("--workers: {e}"))?
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("memserve: {message}");
            return ExitCode::from(2);
        }
    };
    let listener = match args.listener {
        Some(listener) => listener,
        None if listener_from_systemd().is_some() => Listener::Inherited,
        None => {
            eprintln!(
                "memserve: give --unix PATH or --tcp ADDR, or start it with socket activation"
            );
            return ExitCode::from(2);
        }
    };

    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    {
        let shutdown = shutdown.clone();
        std::thread::spawn(move || {
            while !SIGNALLED.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            shutdown.store(true, Ordering::Relaxed);
        });
    }

    let export = Arc::new(MemoryExport::with_contents(
        vec![0; args.size_bytes],
        args.read_only,
    ));
    let config = ServerConfig {
        export_name: args.name,
        description: format!("memserve, {} bytes in memory", args.size_bytes),
        workers_per_connection: args.workers,
        ..ServerConfig::default()
    };
    match &listener {
        Listener::Unix(path) => {
            println!("memserve: serving nbd+unix:///?socket={}", path.display())
        }
        Listener::Tcp(addr) => println!("memserve: serving nbd://{addr}"),
        Listener::Inherited => {}
    }
    match Server::new(export, config).serve(listener, shutdown) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memserve: {error}");
            ExitCode::FAILURE
        }
    }
}
