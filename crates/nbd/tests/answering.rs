//! `Export::write_answering`: an export that may answer a write before it is done (paraid's journal mode, once
//! the data is durable in its log). The reply must go out when the export answers, not when the write returns;
//! a write the export does not answer early is replied to when it returns, with its error if it fails.

mod common;

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::{Export, Server};

/// Both exports' bytes.
struct Memory(Mutex<Vec<u8>>);

impl Memory {
    fn new() -> Memory {
        Memory(Mutex::new(vec![0u8; 1 << 20]))
    }

    fn read(&self, offset_bytes: u64, buf: &mut [u8]) {
        let at = offset_bytes as usize;
        buf.copy_from_slice(&self.0.lock().unwrap()[at..at + buf.len()]);
    }

    fn write(&self, offset_bytes: u64, buf: &[u8]) {
        let at = offset_bytes as usize;
        self.0.lock().unwrap()[at..at + buf.len()].copy_from_slice(buf);
    }

    fn zero(&self, offset_bytes: u64, len_bytes: u64) {
        let at = offset_bytes as usize;
        self.0.lock().unwrap()[at..at + len_bytes as usize].fill(0);
    }
}

/// Answers writes at offset 0 early and then waits for the test's go before returning; writes elsewhere are
/// answered when they return, and a write at `FAILING_AT` fails.
struct EarlyExport {
    go: Mutex<Receiver<()>>,
    returned: Sender<u64>,
    bytes: Memory,
}

const FAILING_AT: u64 = 8192;

impl Export for EarlyExport {
    fn size_bytes(&self) -> u64 {
        1 << 20
    }

    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.bytes.read(offset_bytes, buf);
        Ok(())
    }

    fn write(&self, offset_bytes: u64, buf: &[u8], _fua: bool) -> io::Result<()> {
        if offset_bytes == FAILING_AT {
            return Err(io::Error::other("the medium refused it"));
        }
        self.bytes.write(offset_bytes, buf);
        Ok(())
    }

    fn write_answering(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        fua: bool,
        answered: &dyn Fn(),
    ) -> io::Result<()> {
        if offset_bytes == 0 {
            answered();
            self.go
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .expect("the test lets the write finish");
        }
        let result = self.write(offset_bytes, buf, fua);
        self.returned.send(offset_bytes).unwrap();
        result
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, _fua: bool) -> io::Result<()> {
        self.bytes.zero(offset_bytes, len_bytes);
        Ok(())
    }
}

#[test]
fn a_write_answered_early_is_replied_to_before_it_returns() {
    let (go, go_rx) = channel();
    let (returned_tx, returned) = channel();
    let export = Arc::new(EarlyExport {
        go: Mutex::new(go_rx),
        returned: returned_tx,
        bytes: Memory::new(),
    });
    let server = Arc::new(Server::new(export.clone(), small_config()));
    let (mut client, handle) = connect_in_process(server, Arc::new(AtomicBool::new(false)));
    client.handshake(false).unwrap();

    // Answered early: the reply arrives while the export still holds the write.
    client.write_request(0, 1, 0, &[0x11u8; 4096]).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 1));
    assert!(
        returned.try_recv().is_err(),
        "the reply came before the write returned"
    );
    // Another request is served meanwhile, by another worker.
    client.write_request(0, 2, 4096, &[0x22u8; 4096]).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 2));
    assert_eq!(returned.recv_timeout(Duration::from_secs(5)), Ok(4096));
    go.send(()).unwrap();
    assert_eq!(returned.recv_timeout(Duration::from_secs(5)), Ok(0));

    // Not answered early and failing: the error is the reply.
    client
        .write_request(0, 3, FAILING_AT, &[0x33u8; 4096])
        .unwrap();
    let (error, reply_handle) = client.simple_reply().unwrap();
    assert_eq!(reply_handle, 3);
    assert_ne!(error, 0, "a failed write not answered early gets its error");
    assert_eq!(
        returned.recv_timeout(Duration::from_secs(5)),
        Ok(FAILING_AT)
    );
    let mut first = vec![0u8; 4096];
    export.bytes.read(0, &mut first);
    assert_eq!(first, [0x11u8; 4096]);

    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
}

/// An export that answers early only writes whose client waits for them
/// (`Export::answers_early_only_when_waited_for`): counts which way each write came, and takes `delay` over each.
struct WaitedForExport {
    delay: Duration,
    answering: std::sync::atomic::AtomicUsize,
    plain: std::sync::atomic::AtomicUsize,
    bytes: Memory,
}

impl WaitedForExport {
    fn store(&self, offset_bytes: u64, buf: &[u8]) {
        std::thread::sleep(self.delay);
        self.bytes.write(offset_bytes, buf);
    }

    fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.answering.load(SeqCst), self.plain.load(SeqCst))
    }
}

impl Export for WaitedForExport {
    fn size_bytes(&self) -> u64 {
        1 << 20
    }

    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.bytes.read(offset_bytes, buf);
        Ok(())
    }

    fn write(&self, offset_bytes: u64, buf: &[u8], _fua: bool) -> io::Result<()> {
        self.plain.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store(offset_bytes, buf);
        Ok(())
    }

    fn write_answering(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        _fua: bool,
        answered: &dyn Fn(),
    ) -> io::Result<()> {
        self.answering
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        answered();
        self.store(offset_bytes, buf);
        Ok(())
    }

    fn answers_early_only_when_waited_for(&self) -> bool {
        true
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, _fua: bool) -> io::Result<()> {
        self.bytes.zero(offset_bytes, len_bytes);
        Ok(())
    }
}

/// A client that waits for each write's reply gets every write answered early (the export's
/// `write_answering`, even while the previous write is still being written after its early answer); writes sent
/// while others are unanswered go to `write`. Merging is off so that each request is served alone.
#[test]
fn only_writes_the_client_waits_for_go_to_write_answering() {
    let export = Arc::new(WaitedForExport {
        delay: Duration::from_millis(20),
        answering: Default::default(),
        plain: Default::default(),
        bytes: Memory::new(),
    });
    let config = paraid_nbd::ServerConfig {
        merge_write_bytes: 0,
        ..small_config()
    };
    let server = Arc::new(Server::new(export.clone(), config));
    let (mut client, handle) = connect_in_process(server, Arc::new(AtomicBool::new(false)));
    client.handshake(false).unwrap();

    // Queue depth 1: each write sent after the previous reply.
    for n in 0..8u64 {
        client
            .write_request(0, n, n * 4096, &[n as u8 + 1; 4096])
            .unwrap();
        assert_eq!(client.simple_reply().unwrap(), (0, n));
    }
    assert_eq!(
        export.counts(),
        (8, 0),
        "(write_answering, write) at queue depth 1"
    );

    // Queue depth 8: the writes after the first are read while it is unanswered (it takes 20 ms and is not
    // answered early: the socket held the next request when it was read, or it was).
    for n in 8..16u64 {
        client
            .write_request(0, n, n * 4096, &[n as u8 + 1; 4096])
            .unwrap();
    }
    let mut replies: Vec<u64> = (8..16)
        .map(|_| {
            let (error, handle) = client.simple_reply().unwrap();
            assert_eq!(error, 0);
            handle
        })
        .collect();
    replies.sort_unstable();
    assert_eq!(replies, (8..16).collect::<Vec<u64>>());
    let (answering, plain) = export.counts();
    assert!(
        plain >= 7 && answering + plain == 16,
        "({answering}, {plain}) (write_answering, write) after eight writes at queue depth 8"
    );
    for n in 0..16u64 {
        let mut page = vec![0u8; 4096];
        export.bytes.read(n * 4096, &mut page);
        assert_eq!(page, [n as u8 + 1; 4096]);
    }

    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
}
