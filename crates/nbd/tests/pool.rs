//! The worker pool at queue depth 1: a client that waits for each reply before sending its next request must
//! cost the connection one worker besides the thread that started it, however many requests it sends. Its own
//! test binary, so that no other test's connections add workers to the process while it counts them.

mod common;

use std::time::Duration;

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::ServerConfig;

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn a_queue_depth_one_client_costs_one_extra_worker() {
    let config = ServerConfig {
        workers_per_connection: 16,
        ..small_config()
    };
    let (_export, mut client, handle) = serve_recording(1 << 20, config);
    let payload = [0x42u8; 4096];
    // A database's commits: write, flush, write, flush, each waiting for its reply. Before the fix the pool
    // grew while the worker that had just replied was still counted busy (5 workers within 3 s over NBD).
    for i in 0..3000u64 {
        client
            .write_request(0, 2 * i, (i % 256) * 4096, &payload)
            .unwrap();
        assert_eq!(client.simple_reply().unwrap(), (0, 2 * i));
        client.request(0, CMD_FLUSH, 2 * i + 1, 0, 0).unwrap();
        assert_eq!(client.simple_reply().unwrap(), (0, 2 * i + 1));
    }
    let workers = threads_named("nbd-worker");
    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
    assert!(
        workers <= 1,
        "6000 requests at queue depth 1 started {workers} workers beside the connection's thread"
    );
}
