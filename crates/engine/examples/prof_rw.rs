// scratch: not committed
use paraid_engine::layout::Level;
use paraid_engine::{assemble, create, AssembleOptions, CreateOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
fn main() {
    let threads: u64 = std::env::var("T")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let secs: f64 = std::env::var("S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let bs: usize = std::env::var("BS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096);
    let log = std::env::var("LOG").map(|v| v != "off").unwrap_or(true);
    let dir = PathBuf::from("/dev/shm/prof");
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<PathBuf> = (0..6).map(|i| dir.join(format!("m{i}.img"))).collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    create(&CreateOptions {
        force: false,
        level: Level::Raid6,
        chunk_bytes: 65536,
        name: "p".into(),
        size_bytes: Some(260 << 20),
        members: paths.clone(),
    })
    .unwrap();
    for p in &paths {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(f.metadata().unwrap().len()).unwrap();
        std::process::Command::new("fallocate")
            .arg("-l")
            .arg(format!("{}", f.metadata().unwrap().len()))
            .arg(p)
            .status()
            .unwrap();
    }
    let mut opts = AssembleOptions::new(paraid_parity::cpu_best());
    opts.write_hole_log = log;
    let array = Arc::new(assemble(&paths, opts).unwrap());
    let size = array.size_bytes();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let a = array.clone();
            let stop = stop.clone();
            let n = n.clone();
            std::thread::spawn(move || {
                let mut x = 0x1234_5678_9abc_def0u64 ^ (t + 1);
                let block = vec![t as u8; bs];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = (x % (size / bs as u64)) * bs as u64;
                    a.write(at, &block, false).unwrap();
                    n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let el = t0.elapsed().as_secs_f64();
    let nn = n.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "log={log} threads={threads} bs={bs}: {:.1} kIOPS",
        nn as f64 / el / 1e3
    );
    Arc::try_unwrap(array)
        .unwrap_or_else(|_| panic!())
        .stop()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
