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
    mount_dir: PathBuf,
    loop_dev: Option<String>,
    fuse: Option<Child>,
    mounted: bool,
}

impl Mounted {
    fn attach(uri: &str, fuse_dir: &Path, mount_dir: &Path, format: bool) -> Mounted {
        std::fs::create_dir_all(fuse_dir).unwrap();
        std::fs::create_dir_all(mount_dir).unwrap();
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
            mount_dir: mount_dir.to_path_buf(),
            loop_dev: None,
            fuse: Some(fuse),
            mounted: false,
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
        let dev = client("losetup", &["-f", "--show", disk.to_str().unwrap()])
            .trim()
            .to_string();
        mounted.loop_dev = Some(dev.clone());
        if format {
            client("mkfs.xfs", &["-q", "-f", &dev]);
        }
        client("mount", &["-t", "xfs", &dev, mount_dir.to_str().unwrap()]);
        mounted.mounted = true;
        mounted
    }

    fn detach(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mount_dir).status();
            self.mounted = false;
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
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
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            (
                format!("file{i}.bin"),
                random_bytes(0xf11e_0000 + i, 4096 * 97 + 13 * i as usize),
            )
        })
        .collect();

    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    {
        let mut mount = Mounted::attach(
            &served.uri(),
            &scratch.path("fuse"),
            &scratch.path("mnt"),
            true,
        );
        std::fs::create_dir(scratch.path("mnt/dir")).unwrap();
        for (name, bytes) in &files {
            std::fs::write(scratch.path("mnt/dir").join(name), bytes).unwrap();
        }
        client("sync", &[]);
        mount.detach();
    }
    served.stop();

    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    {
        let mut mount = Mounted::attach(
            &served.uri(),
            &scratch.path("fuse"),
            &scratch.path("mnt"),
            false,
        );
        for (name, bytes) in &files {
            let back = std::fs::read(scratch.path("mnt/dir").join(name)).unwrap();
            assert!(&back == bytes, "{name} changed across the restart");
        }
        mount.detach();
    }
    served.stop();
}
