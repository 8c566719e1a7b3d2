//! `paraid zero-superblock` (mdadm's --zero-superblock): a member's metadata wiped, its data left, the member then
//! taken by `create` without --force; refused for a member in use, for a file without a superblock unless
//! --force, with nothing written.

mod common;

use common::*;

#[test]
fn a_wiped_member_names_no_array_and_create_takes_it() {
    let scratch = Scratch::new("zero-sb");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let data_offset = {
        let out = paraid_with_paths(&["examine", "--json"], &members[..1]);
        let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        sb["data_offset_bytes"].as_u64().unwrap() as usize
    };
    // Something in member 2's data area, to see that it stays.
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let input = scratch.path("in.bin");
    std::fs::write(&input, random_bytes(3, 4 << 20)).unwrap();
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);

    // In use: refused, nothing written.
    let in_use = std::fs::read(&members[2]).unwrap();
    let out = paraid_with_paths(&["zero-superblock"], &members[2..3]);
    assert!(
        !out.status.success(),
        "a member of a running array was wiped"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&members[2]).unwrap() == in_use,
        "the refused wipe wrote"
    );
    served.stop();
    let before = std::fs::read(&members[2]).unwrap();

    let out = paraid_with_paths(&["zero-superblock", "--json"], &members[2..3]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let wiped = &reply["wiped"][0];
    assert_eq!(wiped["slot"].as_u64(), Some(2), "{reply}");
    assert_eq!(
        wiped["zeroed_bytes"].as_u64(),
        Some(data_offset as u64),
        "{reply}"
    );
    let after = std::fs::read(&members[2]).unwrap();
    assert!(
        after[..data_offset].iter().all(|&b| b == 0),
        "the reserved area is not zeros"
    );
    assert!(
        after[data_offset..] == before[data_offset..],
        "the data area changed"
    );

    let out = paraid_with_paths(&["examine"], &members[2..3]);
    assert!(!out.status.success(), "examine still finds a superblock");
    // Given among the members, it is refused by name; without it the array serves degraded.
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("s2.sock").to_str().unwrap(),
        ],
        &members,
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no paraid superblock"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = Served::start(
        &scratch.path("s2.sock"),
        &[members[0].clone(), members[1].clone(), members[3].clone()],
        &[],
    );
    let control = std::path::PathBuf::from(format!("{}.ctl", served.socket.display()));
    let array = status(&control);
    let states: Vec<&str> = array["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == "active").count(),
        3,
        "{array}"
    );
    served.stop();

    // One bad member among several: refused, and none of them is written.
    let rest = [members[0].clone(), members[1].clone(), members[3].clone()];
    let before_rest: Vec<Vec<u8>> = rest.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let out = paraid_with_paths(
        &["zero-superblock"],
        &[rest[0].clone(), rest[1].clone(), members[2].clone()],
    );
    assert!(
        !out.status.success(),
        "a member without a superblock was wiped without --force"
    );
    let out = paraid_with_paths(&["zero-superblock"], &[rest[0].clone(), rest[0].clone()]);
    assert!(!out.status.success(), "a member given twice was wiped");
    for (m, before) in rest.iter().zip(&before_rest) {
        assert!(
            std::fs::read(m).unwrap() == *before,
            "a refused wipe wrote {}",
            m.display()
        );
    }

    // No superblock any more: refused without --force; with it, wiped again.
    let out = paraid_with_paths(&["zero-superblock"], &members[2..3]);
    assert!(
        !out.status.success(),
        "a member without a superblock was wiped without --force"
    );
    let out = paraid_with_paths(&["zero-superblock", "--force"], &members[2..3]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no readable superblock"));

    // Every member wiped: create takes them without --force.
    let out = paraid_with_paths(&["zero-superblock"], &rest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = paraid_with_paths(&["create", "--level", "6", "--chunk", "64K"], &members);
    assert!(
        out.status.success(),
        "create refused wiped members: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
