//! The control plane of a running array: a Unix socket beside the NBD socket, one JSON object per line each way.
//! Requests: {"op": "status"} and the management operations; replies: {"ok": true, ...} or
//! {"ok": false, "error": "one line"}. Kept apart from the data plane: it never touches the NBD server.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use paraid_engine::{Array, SlotState};
use serde_json::{json, Value};

use crate::metrics::IoMetrics;

/// Longest request line accepted: the requests are small; a longer line is a confused or hostile client.
const MAX_REQUEST_BYTES: u64 = 64 << 10;

/// Makes `path` free for the `kind` of socket serve binds ("socket", "control socket"): a stale socket file is
/// removed; a live server's socket, or a file of another kind, is refused, with `hint` (what to give instead) when
/// there is one.
pub fn clear_stale_socket(path: &Path, kind: &str, hint: Option<&str>) -> Result<(), String> {
    paraid_nbd::clear_stale_socket(path).map_err(|e| {
        let what = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                format!("another server already listens on this {kind}")
            }
            _ => format!("cannot use it for the {kind}: {e}"),
        };
        match hint {
            Some(hint) => format!("{}: {what} ({hint})", path.display()),
            None => format!("{}: {what}", path.display()),
        }
    })
}

/// `clear_stale_socket` for the control socket.
pub fn clear_stale_control_socket(path: &Path) -> Result<(), String> {
    clear_stale_socket(path, "control socket", Some("give this one --control PATH"))
}

/// The control socket's server side: a thread that answers requests until `shutdown`.
pub struct ControlServer {
    path: PathBuf,
    /// The socket file this server bound (device, inode), removed at the end only if still there.
    identity: Option<(u64, u64)>,
    thread: Option<JoinHandle<()>>,
    /// How the array is served (`frontend` in status), set once the frontend is up.
    frontend: Arc<OnceLock<Value>>,
}

impl ControlServer {
    pub fn start(
        path: &Path,
        array: Arc<Array>,
        metrics: Arc<IoMetrics>,
        shutdown: Arc<AtomicBool>,
    ) -> Result<ControlServer, String> {
        clear_stale_control_socket(path)?;
        let listener = UnixListener::bind(path)
            .map_err(|e| format!("{}: binding the control socket: {e}", path.display()))?;
        let identity = paraid_nbd::socket_file_identity(path);
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: control socket: {e}", path.display()))?;
        let frontend = Arc::new(OnceLock::new());
        let served_by = frontend.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, array, metrics, served_by, shutdown))
            .map_err(|e| format!("starting the control thread: {e}"))?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            identity,
            thread: Some(thread),
            frontend,
        })
    }

    /// Says in `status` how the array is served (the frontend starts after the control socket, so that a
    /// failed start can still be reported and the array stopped cleanly).
    pub fn set_frontend(&self, frontend: Value) {
        let _ = self.frontend.set(frontend);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Only if it is still ours: a server started on the same path while this one stopped has replaced it.
        let _ = paraid_nbd::remove_socket_file(&self.path, self.identity);
    }
}

/// Clients answered at once; one more is told the server is busy. Each is a thread of its own, so that a client
/// that connects and sends nothing (or reads slowly) holds up no other.
const MAX_CLIENTS: usize = 16;

fn accept_loop(
    listener: UnixListener,
    array: Arc<Array>,
    metrics: Arc<IoMetrics>,
    frontend: Arc<OnceLock<Value>>,
    shutdown: Arc<AtomicBool>,
) {
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    while !shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                clients.retain(|client| !client.is_finished());
                if clients.len() >= MAX_CLIENTS {
                    let busy = json!({"ok": false, "error": format!(
                        "the control socket is answering {MAX_CLIENTS} clients already: try again")});
                    let _ = writeln!(stream, "{busy}");
                    continue;
                }
                let (array, metrics, frontend, shutdown) = (
                    array.clone(),
                    metrics.clone(),
                    frontend.clone(),
                    shutdown.clone(),
                );
                let spawned = std::thread::Builder::new()
                    .name("control-client".into())
                    .spawn(move || {
                        if let Err(error) = answer(stream, &array, &metrics, &frontend, &shutdown) {
                            log::debug!("control client: {error}");
                        }
                    });
                match spawned {
                    Ok(client) => clients.push(client),
                    Err(e) => log::warn!("control socket: cannot start a client thread: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                log::warn!("control socket accept: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    // Each client ends within its read timeout once `shutdown` is set; the array is stopped only after they let
    // go of it.
    for client in clients {
        let _ = client.join();
    }
}

/// Answers one client's requests until it hangs up or the server shuts down. Reads time out briefly so that a
/// client that stays connected never holds up a shutdown; a partial line survives the timeouts.
fn answer(
    stream: UnixStream,
    array: &Array,
    metrics: &IoMetrics,
    frontend: &OnceLock<Value>,
    shutdown: &AtomicBool,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line: Vec<u8> = Vec::new();
    while !shutdown.load(Ordering::SeqCst) {
        let room = MAX_REQUEST_BYTES.saturating_sub(line.len() as u64);
        if room == 0 {
            return Err(std::io::Error::other("request line too long"));
        }
        match std::io::Read::take(&mut reader, room).read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) if line.last() != Some(&b'\n') => return Ok(()), // hung up mid-line
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
        let text = String::from_utf8_lossy(&line).trim().to_string();
        line.clear();
        if text.is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&text) {
            Ok(request) if request["op"].as_str() == Some("stop") => {
                // The same flag SIGTERM sets: the frontend ends, then the array is stopped cleanly.
                log::warn!("stop requested through the control socket");
                shutdown.store(true, Ordering::SeqCst);
                // Absolute paths: the caller reads the superblocks once this process has exited, from its own
                // working directory.
                let detail = array.detail();
                let members: Vec<String> = detail
                    .members
                    .iter()
                    // Those the stop writes a superblock to (a faulty member's is left as it was).
                    .filter(|m| {
                        !m.path.is_empty()
                            && matches!(m.state, SlotState::Active | SlotState::Rebuilding)
                    })
                    .map(|m| {
                        std::fs::canonicalize(&m.path)
                            .map_or_else(|_| m.path.clone(), |p| p.display().to_string())
                    })
                    .collect();
                json!({"ok": true, "stopping": true, "server_pid": std::process::id(), "members": members,
                       "failed": detail.failed})
            }
            Ok(request) => handle(&request, array, metrics, frontend),
            Err(e) => json!({"ok": false, "error": format!("request is not JSON: {e}")}),
        };
        writer.write_all(reply.to_string().as_bytes())?;
        writer.write_all(b"\n")?;
    }
    Ok(())
}

fn handle(
    request: &Value,
    array: &Array,
    metrics: &IoMetrics,
    frontend: &OnceLock<Value>,
) -> Value {
    let op = request["op"].as_str().unwrap_or("");
    match crate::manage::dispatch(op, request, array) {
        Ok(mut reply) => {
            if op == "status" {
                reply["io"] = metrics.to_json();
                reply["frontend"] = frontend.get().cloned().unwrap_or(Value::Null);
                reply["server_pid"] = json!(std::process::id());
            }
            reply["ok"] = json!(true);
            reply
        }
        Err(message) => json!({"ok": false, "error": message}),
    }
}

/// The client side: sends one request, returns the reply object, or the server's error as `Err`.
pub fn request(path: &Path, request: &Value) -> Result<Value, String> {
    let stream = UnixStream::connect(path).map_err(|e| {
        format!(
            "{}: cannot reach the array's control socket ({e}); is `paraid serve` running?",
            path.display()
        )
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut writer = stream
        .try_clone()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writer
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("{}: sending the request: {e}", path.display()))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                "{}: no reply within 30 s (the server is busy or hung)",
                path.display()
            ),
            _ => format!("{}: reading the reply: {e}", path.display()),
        })?;
    let reply: Value = serde_json::from_str(&line)
        .map_err(|e| format!("{}: the reply is not JSON: {e}", path.display()))?;
    if reply["ok"].as_bool() == Some(true) {
        Ok(reply)
    } else {
        Err(reply["error"]
            .as_str()
            .unwrap_or("the server refused the request")
            .to_string())
    }
}
