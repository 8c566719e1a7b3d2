//! Fixtures shared by the CLI integration tests: scratch directories, a served array, real NBD clients.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn paraid_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_paraid"))
}

/// A scratch directory removed on drop. Under /dev/shm when present: O_DIRECT works on tmpfs and it spares the disk.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = base.join(format!("paraid-test-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }

    pub fn members(&self, count: usize) -> Vec<PathBuf> {
        (0..count)
            .map(|i| self.dir.join(format!("m{i}.img")))
            .collect()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn paraid(args: &[&str]) -> Output {
    Command::new(paraid_bin())
        .args(args)
        .output()
        .expect("running paraid")
}

pub fn paraid_with_paths(args: &[&str], paths: &[PathBuf]) -> Output {
    Command::new(paraid_bin())
        .args(args)
        .args(paths)
        .output()
        .expect("running paraid")
}

/// Runs `paraid create`, asserting success.
pub fn create(level: &str, chunk: &str, size: &str, members: &[PathBuf]) {
    let out = paraid_with_paths(
        &["create", "--level", level, "--chunk", chunk, "--size", size],
        members,
    );
    assert!(
        out.status.success(),
        "paraid create --level {level} --chunk {chunk} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `paraid serve` child on a Unix socket; SIGTERM on drop (clean stop).
pub struct Served {
    pub child: Option<Child>,
    pub socket: PathBuf,
}

impl Served {
    pub fn start(socket: &Path, members: &[PathBuf], extra: &[&str]) -> Served {
        Served::start_with_env(socket, members, extra, &[])
    }

    /// `start` with `env` (name, value) set for the server.
    pub fn start_with_env(
        socket: &Path,
        members: &[PathBuf],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Served {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(paraid_bin())
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .args(members)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning paraid serve");
        let mut served = Served {
            child: Some(child),
            socket: socket.to_path_buf(),
        };
        served.wait_listening();
        served
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("paraid serve exited before listening: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "paraid serve did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// SIGTERM, then wait: the server flushes and marks the array clean. Asserts a clean exit.
    pub fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.success(),
            "paraid serve did not stop cleanly: {status}"
        );
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("server already stopped");
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("paraid serve ignored SIGTERM for 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.terminate();
        }
    }
}

/// PATH with the system's directories first, so that the Debian NBD clients are found before any other copy.
pub fn system_path_first() -> String {
    format!(
        "/usr/bin:/usr/sbin:/bin:/sbin:{}",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs a client command, asserting success; returns stdout.
pub fn client(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("PATH", system_path_first())
        .output()
        .unwrap_or_else(|e| {
            panic!("running {program}: {e} (scripts/install-deps.sh --test installs it)")
        });
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deterministic pseudo-random bytes (xorshift64*): the same seed gives the same data in every run.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Runs a management command against a running array's control socket with `--json`; returns its last JSON line.
pub fn ctl(control: &Path, args: &[&str]) -> serde_json::Value {
    let mut all: Vec<&str> = vec![args[0], "--control", control.to_str().unwrap(), "--json"];
    all.extend_from_slice(&args[1..]);
    let out = paraid(&all);
    assert!(
        out.status.success(),
        "paraid {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{all:?} JSON: {e}: {text}"))
}

/// The running array as `paraid status --json` reports it.
pub fn status(control: &Path) -> serde_json::Value {
    ctl(control, &["status"])["array"].clone()
}

/// The whole array read out by nbdcopy into `path`, returned as bytes.
pub fn nbdcopy_out(uri: &str, path: &Path) -> Vec<u8> {
    client("nbdcopy", &[uri, path.to_str().unwrap()]);
    std::fs::read(path).unwrap()
}
