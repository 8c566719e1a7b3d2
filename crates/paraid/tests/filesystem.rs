//! A real filesystem on the array: nbdfuse exposes the export as a file, losetup makes it a block device,
//! mkfs.xfs formats it. Files written, everything unmounted, the server restarted, the files read back intact.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// nbdfuse + loop device + XFS mount; torn down in reverse order on drop (also when an assertion fails).
struct Mounted {
    fuse_dir: PathBuf,
    mount: Option<LoopMount>,
    fuse: Option<Child>,
}

impl Mounted {
    fn attach(uri: &str, fuse_dir: &Path, mount_dir: &Path, format: bool) -> Mounted {
        std::fs::create_dir_all(fuse_dir).unwrap();
        let disk = fuse_dir.join("disk");
        let fuse = Command::new("nbdfuse")
            .arg(&disk)
            .arg(uri)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nbdfuse (apt-get install nbdfuse)");
        let mut mounted = Mounted {
            fuse_dir: fuse_dir.to_path_buf(),
            mount: None,
            fuse: Some(fuse),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !disk.exists() {
            assert!(
                Instant::now() < deadline,
                "nbdfuse did not expose {}",
                disk.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        mounted.mount = Some(LoopMount::attach(&disk, mount_dir, format, &[]));
        mounted
    }

    fn detach(&mut self) {
        if let Some(mut mount) = self.mount.take() {
            mount.detach();
        }
        if let Some(mut fuse) = self.fuse.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.fuse_dir)
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while fuse.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = fuse.kill();
            let _ = fuse.wait();
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.detach();
    }
}

/// A loop device over a file and an XFS mount on it, torn down in reverse order on drop.
struct LoopMount {
    loop_dev: Option<String>,
    mount_dir: PathBuf,
    mounted: bool,
}

impl LoopMount {
    fn attach(file: &Path, mount_dir: &Path, format: bool, losetup_flags: &[&str]) -> LoopMount {
        std::fs::create_dir_all(mount_dir).unwrap();
        let mut args = vec!["-f", "--show"];
        args.extend_from_slice(losetup_flags);
        args.push(file.to_str().unwrap());
        let dev = client("losetup", &args).trim().to_string();
        let mut mount = LoopMount {
            loop_dev: Some(dev.clone()),
            mount_dir: mount_dir.to_path_buf(),
            mounted: false,
        };
        if format {
            client("mkfs.xfs", &["-q", "-f", &dev]);
        }
        client("mount", &["-t", "xfs", &dev, mount_dir.to_str().unwrap()]);
        mount.mounted = true;
        mount
    }

    fn detach(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mount_dir).status();
            self.mounted = false;
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
        }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Twelve files of odd sizes (some not a whole page) from `seed`.
fn test_files(seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..12)
        .map(|i| {
            (
                format!("file{i}.bin"),
                random_bytes(seed + i, 4096 * 97 + 13 * i as usize),
            )
        })
        .collect()
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    std::fs::create_dir(dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    client("sync", &[]);
}

fn check_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        let back = std::fs::read(dir.join(name)).unwrap();
        assert!(&back == bytes, "{name} changed across the restart");
    }
}

fn skip_reason() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (losetup, mount)".into());
    }
    for (what, path) in [
        ("/dev/fuse", "/dev/fuse"),
        ("/dev/loop-control", "/dev/loop-control"),
    ] {
        if !Path::new(path).exists() {
            return Some(format!("{what} is missing"));
        }
    }
    None
}

#[test]
fn xfs_on_raid6_survives_a_server_restart() {
    if let Some(reason) = skip_reason() {
        println!("skipped: xfs_on_raid6_survives_a_server_restart: {reason}");
        return;
    }
    let scratch = Scratch::new("xfs");
    let members = scratch.members(6);
    // XFS wants at least 300 MB: 4 data members of 160 MiB (less the 4 MiB reserved) give 624 MiB.
    create("6", "64K", "160M", &members);
    let files = test_files(0xf11e_0000);
    let (fuse_dir, mnt) = (scratch.path("fuse"), scratch.path("mnt"));

    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let mut mount = Mounted::attach(&served.uri(), &fuse_dir, &mnt, true);
    write_files(&mnt.join("dir"), &files);
    mount.detach();
    served.stop();

    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let mut mount = Mounted::attach(&served.uri(), &fuse_dir, &mnt, false);
    check_files(&mnt.join("dir"), &files);
    mount.detach();
    served.stop();
}

/// `paraid serve --fuse FILE`: the array is the file itself (no NBD, no nbdfuse); a loop device over it.
struct ServedFile {
    child: Option<Child>,
    file: PathBuf,
}

impl ServedFile {
    fn start(file: &Path, control: &Path, members: &[PathBuf]) -> ServedFile {
        let child = Command::new(paraid_bin())
            .arg("serve")
            .arg("--fuse")
            .arg(file)
            .arg("--control")
            .arg(control)
            .args(members)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning paraid serve --fuse");
        let mut served = ServedFile {
            child: Some(child),
            file: file.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(file).map_or(0, |m| m.len()) == 0 {
            if let Some(status) = served.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("paraid serve --fuse exited before serving: {status}");
            }
            assert!(Instant::now() < deadline, "{} never served", file.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        served
    }

    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "paraid serve --fuse did not stop cleanly: {status}"
        );
        assert_eq!(
            std::fs::metadata(&self.file).unwrap().len(),
            0,
            "unmounted at the stop: the file is the empty one it was"
        );
    }
}

impl Drop for ServedFile {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.file).status();
        }
    }
}

#[test]
fn xfs_on_raid6_served_over_fuse_survives_a_server_restart() {
    if let Some(reason) = skip_reason() {
        println!("skipped: xfs_on_raid6_served_over_fuse_survives_a_server_restart: {reason}");
        return;
    }
    let scratch = Scratch::new("xfs-fuse");
    let members = scratch.members(6);
    create("6", "64K", "160M", &members);
    let files = test_files(0xf05e_0000);
    let (disk, control, mnt) = (
        scratch.path("disk"),
        scratch.path("c.ctl"),
        scratch.path("mnt"),
    );

    let served = ServedFile::start(&disk, &control, &members);
    let frontend = &ctl(&control, &["status"])["frontend"];
    assert_eq!(frontend["kind"], "fuse", "{frontend}");
    assert_eq!(
        std::fs::metadata(&disk).unwrap().len(),
        status(&control)["size_bytes"].as_u64().unwrap(),
        "the file is the array's size"
    );
    let mut mount = LoopMount::attach(&disk, &mnt, true, &["--direct-io=on"]);
    write_files(&mnt.join("dir"), &files);
    mount.detach();
    served.stop();

    let served = ServedFile::start(&disk, &control, &members);
    let mut mount = LoopMount::attach(&disk, &mnt, false, &["--direct-io=on"]);
    check_files(&mnt.join("dir"), &files);
    mount.detach();
    served.stop();
}

#[test]
fn serve_over_fuse_refuses_a_directory_before_assembling() {
    if let Some(reason) = skip_reason() {
        println!("skipped: serve_over_fuse_refuses_a_directory_before_assembling: {reason}");
        return;
    }
    let scratch = Scratch::new("fuse-dir");
    let members = scratch.members(4);
    create("5", "64K", "32M", &members);
    let dir = scratch.path("dir");
    std::fs::create_dir(&dir).unwrap();
    let mut args = vec!["serve", "--fuse", dir.to_str().unwrap()];
    let member_args: Vec<&str> = members.iter().map(|m| m.to_str().unwrap()).collect();
    args.extend(member_args);
    let out = paraid(&args);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a regular file"), "{stderr}");
    // Nothing served, and the array was stopped cleanly after the refusal.
    let detail = paraid_with_paths(&["detail", "--json"], &members);
    let detail: serde_json::Value = serde_json::from_slice(&detail.stdout).unwrap();
    assert_eq!(detail["state"], "clean", "{detail}");
}
