//! Rebuild rate and what it costs the host, per parity backend: a RAID6 of member files (default: six of 1 GiB
//! on /dev/shm, 64 KiB chunks), written whole, one member failed, removed and replaced by a blank file, rebuilt
//! with no speed limit; then a check of every stripe, which must find no mismatch. Prints, per backend, the
//! seconds until the slot is active, GB/s of member rebuilt, the process's CPU time (every thread) per GB of
//! member rebuilt, and where the parity batches ran.
//!
//! Usage: rebuild_rate [--dir DIR] [--member-mib N] [--members N] [cpu|gpu|auto ...] (default: cpu gpu)
//!
//! On tmpfs the member I/O is itself CPU work (the kernel copies every page), so the CPU a rebuild saves by
//! leaving parity to the GPU is the parity's share of the whole, not all of it.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use paraid_engine::layout::Level;
use paraid_engine::{assemble, create, AssembleOptions, CreateOptions, NewMember, SlotState};
use paraid_parity::{select, BackendChoice};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut dir = PathBuf::from("/dev/shm");
    let mut member_mib: u64 = 1024;
    let mut members = 6usize;
    let mut choices: Vec<BackendChoice> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match arg.as_str() {
            "--dir" => dir = PathBuf::from(value("--dir")),
            "--member-mib" => member_mib = value("--member-mib").parse().expect("--member-mib N"),
            "--members" => members = value("--members").parse().expect("--members N"),
            word => choices.push(word.parse().unwrap_or_else(|e| panic!("{e}"))),
        }
    }
    if choices.is_empty() {
        choices = vec![BackendChoice::Cpu, BackendChoice::Gpu];
    }
    let dir = dir.join(format!("paraid-rebuild-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the directory");
    for choice in choices {
        run(&dir, choice, members, member_mib);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn run(dir: &std::path::Path, choice: BackendChoice, members: usize, member_mib: u64) {
    let parity = select(choice);
    let paths: Vec<PathBuf> = (0..members)
        .map(|i| dir.join(format!("m{i}.img")))
        .collect();
    let blank = dir.join("new.img");
    for p in paths.iter().chain([&blank]) {
        let _ = std::fs::remove_file(p);
    }
    let size_bytes = (4 + member_mib) << 20;
    create(&CreateOptions {
        force: false,
        level: Level::Raid6,
        chunk_bytes: 64 << 10,
        name: "rebuild-rate".into(),
        size_bytes: Some(size_bytes),
        members: paths.clone(),
    })
    .expect("create");
    let array = Arc::new(assemble(&paths, AssembleOptions::new(parity.clone())).expect("assemble"));
    // Written whole with data that differs per MiB, so that every chunk's parity is work.
    let mut buf = vec![0u8; 4 << 20];
    common::fill(&mut buf, 0x9e37_79b9_7f4a_7c15);
    let mut at = 0u64;
    while at < array.size_bytes() {
        let len = buf.len().min((array.size_bytes() - at) as usize);
        buf[..8].copy_from_slice(&at.to_le_bytes());
        array.write(at, &buf[..len], false).expect("write");
        at += len as u64;
    }
    array.flush().expect("flush");
    array.set_sync_speed(0, u64::MAX);
    let slot = 2;
    array.fail_member(slot).expect("fail");
    array.remove_member(slot).expect("remove");
    std::fs::File::create(&blank)
        .and_then(|f| f.set_len(size_bytes))
        .expect("blank member");
    let cpu0 = common::process_cpu_s();
    let start = Instant::now();
    array
        .add_member(NewMember::Path(blank.clone()))
        .expect("add");
    assert!(
        array.wait_idle(Duration::from_secs(3600)),
        "rebuild finished"
    );
    let seconds = start.elapsed().as_secs_f64();
    let cpu_s = common::process_cpu_s() - cpu0;
    let result = array.last_result().expect("a rebuild result");
    assert_eq!(result.outcome.as_deref(), Some("completed"), "{result:?}");
    assert_eq!(array.slot_state(slot), SlotState::Active);
    let gb = result.total_bytes as f64 / 1e9;
    let described = parity.describe();
    array.start_check(false).expect("check");
    assert!(array.wait_idle(Duration::from_secs(3600)), "check finished");
    let check = array.last_result().expect("a check result");
    assert_eq!(check.outcome.as_deref(), Some("completed"), "{check:?}");
    println!(
        "{choice}: rebuilt {:.2} GB of member in {seconds:.2} s: {:.2} GB/s; host CPU {:.2} s ({:.2} s per GB, {:.2} cores busy); check after it: {} mismatches in {:.2} GB; parity: {described}",
        gb,
        gb / seconds,
        cpu_s,
        cpu_s / gb,
        cpu_s / seconds,
        check.mismatches,
        check.total_bytes as f64 / 1e9,
    );
    assert_eq!(check.mismatches, 0, "the rebuilt member does not check out");
    drop(array);
    for p in paths.iter().chain([&blank]) {
        let _ = std::fs::remove_file(p);
    }
}
