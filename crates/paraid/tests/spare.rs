//! A hot spare given to `paraid serve --spare` takes over a failed slot by itself, and the rebuilt array holds
//! the data and consistent parity.

mod common;

#[path = "common/format.rs"]
mod format;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_spare_given_at_start_takes_over_a_failed_slot() {
    let scratch = Scratch::new("spare");
    let members = scratch.members(4);
    create("5", "16K", "12M", &members);
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(12 << 20)
        .unwrap();
    let data = random_bytes(0x59a7e, 16 << 20);
    let input = scratch.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let served = Served::start(
        &scratch.path("s.sock"),
        &members,
        &["--spare", spare.to_str().unwrap()],
    );
    let control = PathBuf::from(format!("{}.ctl", served.socket.display()));
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    let array = status(&control);
    assert_eq!(
        array["spares"].as_array().map(|s| s.len()),
        Some(1),
        "{array}"
    );
    ctl(&control, &["fail", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let array = status(&control);
        let all_active = array["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"].as_str() == Some("active"));
        if array["progress"].is_null() && all_active {
            assert_eq!(
                array["spares"].as_array().map(|s| s.len()),
                Some(0),
                "the spare was used: {array}"
            );
            assert!(
                array["members"][1]["path"]
                    .as_str()
                    .unwrap()
                    .ends_with("spare.img"),
                "{array}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the spare did not take over within 30 s: {array}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    assert!(
        back[..data.len()] == data[..],
        "data after the automatic rebuild"
    );
    served.stop();
    let mut on_disk = members.clone();
    on_disk[1] = spare;
    format::reassemble_and_check(&format::read_array(&on_disk));
}
