//! `paraid demo`, the README's first command: it must run to the end on a fresh machine, and leave behind an array
//! that serves again with what the demo wrote.

mod common;

use std::process::{Command, Output};

use common::{nbdcopy_out, paraid_bin, Scratch, Served};

const MEMBERS: usize = 6;
/// What the demo writes at the start of the array (`demo.rs`'s `SAMPLE_BYTES`).
const SAMPLE_BYTES: usize = 32 << 20;

/// `paraid demo`, the NBD clients it runs found as `common::client` finds them.
fn demo(args: &[&str]) -> Output {
    Command::new(paraid_bin())
        .arg("demo")
        .args(args)
        .env("PATH", common::system_path_first())
        .output()
        .expect("running paraid demo")
}

#[test]
fn the_demo_runs_to_the_end_and_leaves_an_array_that_serves_what_it_wrote() {
    let scratch = Scratch::new("demo");
    let dir = scratch.path("demo");
    let out = demo(&["--dir", dir.to_str().unwrap(), "--member-size", "16M"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "paraid demo failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "paraid demo: 1. creating RAID6 over 6 sparse files of 16 MiB",
        "paraid demo: 2. serving the array: dirty (in use; made clean at a clean stop); 6 members",
        "paraid demo: 3. nbdinfo (libnbd) reads the export:",
        "the first 32 MiB are byte-identical, the rest reads as zeros",
        "paraid demo: 5. stopped the server: the array is marked clean on every member",
    ] {
        assert!(stdout.contains(step), "no {step:?} in:\n{stdout}");
    }
    let members: Vec<_> = (0..MEMBERS)
        .map(|i| dir.join(format!("member{i}.img")))
        .collect();
    for member in &members {
        let examined = common::paraid(&["examine", member.to_str().unwrap(), "--json"]);
        assert!(examined.status.success(), "examine {}", member.display());
        let superblock: serde_json::Value = serde_json::from_slice(&examined.stdout).unwrap();
        assert_eq!(superblock["state"], "clean", "{}", member.display());
        assert_eq!(superblock["level"], "raid6");
    }
    // The sample and its read-back were removed by the demo; the array keeps the sample.
    assert!(!dir.join("sample.bin").exists() && !dir.join("readback.bin").exists());

    // Served again as the demo's closing lines say: the sample is there (random bytes, so hardly a zero page in
    // it), and every byte after it reads as zeros.
    let served = Served::start(&dir.join("paraid.sock"), &members, &[]);
    let array = nbdcopy_out(&served.uri(), &scratch.path("array.bin"));
    served.stop();
    assert_eq!(
        array.len(),
        4 * (16 << 20) - 4 * (4 << 20),
        "RAID6 of six 16 MiB members, 4 MiB of metadata each"
    );
    let zero_pages = array[..SAMPLE_BYTES]
        .chunks(4096)
        .filter(|page| page.iter().all(|&b| b == 0))
        .count();
    assert_eq!(zero_pages, 0, "the demo's random sample has zero pages");
    assert!(
        array[SAMPLE_BYTES..].iter().all(|&b| b == 0),
        "bytes after the sample are not zero"
    );
}

#[test]
fn the_demo_refuses_a_directory_with_member_files_and_a_bad_member_size() {
    let scratch = Scratch::new("demo-refused");
    let dir = scratch.path("demo");
    std::fs::create_dir_all(&dir).unwrap();
    let kept = dir.join("member3.img");
    std::fs::write(&kept, b"someone's data").unwrap();
    let out = demo(&["--dir", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the demo ran over an existing file");
    assert!(
        stderr.contains("member3.img: already exists; give --dir an empty directory"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&kept).unwrap(), b"someone's data");
    assert!(
        !dir.join("member0.img").exists(),
        "the demo created members before refusing"
    );

    let out = demo(&[
        "--dir",
        scratch.path("other").to_str().unwrap(),
        "--member-size",
        "12Q",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--member-size"), "{stderr}");
}
