//! Rough engine throughput on member files (default: /dev/shm, tmpfs with O_DIRECT), no NBD in between.
//! Usage: cargo run --release -p paraid-engine --example throughput [dir] [member_mib]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use paraid_engine::layout::Level;
use paraid_engine::{assemble, create, AssembleOptions, CreateOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/dev/shm".to_string()))
        .join(format!("paraid-throughput-{}", std::process::id()));
    let member_mib: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(128);
    std::fs::create_dir_all(&dir).expect("create dir");
    let parity = paraid_parity::cpu_best();
    println!("parity backend: {}", parity.name());
    for (level, members) in [
        (Level::Raid0, 4),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid10, 4),
    ] {
        let paths: Vec<PathBuf> = (0..members)
            .map(|i| dir.join(format!("m{i}.img")))
            .collect();
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        let t = Instant::now();
        create(&CreateOptions {
            force: false,
            level,
            chunk_bytes: 65536,
            name: "bench".into(),
            size_bytes: Some((4 + member_mib) << 20),
            members: paths.clone(),
        })
        .expect("create");
        let create_ms = t.elapsed().as_secs_f64() * 1e3;
        let array =
            Arc::new(assemble(&paths, AssembleOptions::new(parity.clone())).expect("assemble"));
        let size = array.size_bytes();
        let mut line = format!(
            "{level} n={members} 64KiB chunks, {} MiB array: create {create_ms:.0} ms",
            size >> 20
        );

        // Sequential 1 MiB writes and reads, one thread.
        let buf = vec![0x5au8; 1 << 20];
        let t = Instant::now();
        let mut at = 0;
        while at + buf.len() as u64 <= size {
            array.write(at, &buf, false).expect("write");
            at += buf.len() as u64;
        }
        array.flush().expect("flush");
        line += &format!(
            ", seq write {:.2} GB/s",
            at as f64 / t.elapsed().as_secs_f64() / 1e9
        );
        let mut rbuf = vec![0u8; 1 << 20];
        let t = Instant::now();
        let mut at = 0;
        while at + rbuf.len() as u64 <= size {
            array.read(at, &mut rbuf).expect("read");
            at += rbuf.len() as u64;
        }
        line += &format!(
            ", seq read {:.2} GB/s",
            at as f64 / t.elapsed().as_secs_f64() / 1e9
        );

        // Random 4 KiB writes (read-modify-write on parity levels), two threads.
        let ops_per_thread = 20_000u64;
        let t = Instant::now();
        let handles: Vec<_> = (0..2u64)
            .map(|thread| {
                let array = array.clone();
                std::thread::spawn(move || {
                    let mut x = 0x1234_5678_9abc_def0u64 ^ thread;
                    let block = vec![thread as u8; 4096];
                    for _ in 0..ops_per_thread {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let at = (x % (size / 4096)) * 4096;
                        array.write(at, &block, false).expect("write");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        line += &format!(
            ", rand 4K write {:.0} kIOPS (2 threads)",
            2.0 * ops_per_thread as f64 / t.elapsed().as_secs_f64() / 1e3
        );
        println!("{line}");
        Arc::try_unwrap(array)
            .unwrap_or_else(|_| panic!("shared"))
            .stop()
            .expect("stop");
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
