//! `serve --write-back` keeps the writes it holds in a file in shared memory as well (engine `array/held.rs`;
//! `PARAID_HELD_DIR` points it at a scratch directory here), so that a kill of paraid does not lose them: the file
//! is made at the start, left behind by a kill, looked at by the next serve (read-write: written and removed or
//! made anew; read-only: left alone), and removed by a clean stop. What a replay writes is proved in the engine
//! (`tests/write_back.rs`, `held_writes_survive_a_kill_in_their_store_and_only_into_their_array`) and by the
//! simulator's kills; members on tmpfs write too fast here to catch a write held at a kill.

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn held_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn the_held_write_file_lives_from_start_to_clean_stop_and_outlives_a_kill() {
    let scratch = Scratch::new("held-file");
    let members = scratch.members(4);
    create("5", "64K", "64M", &members);
    let dir = scratch.path("held");
    std::fs::create_dir_all(&dir).unwrap();
    let env = [("PARAID_HELD_DIR", dir.to_str().unwrap())];
    let socket = scratch.path("s.sock");

    let mut served = Served::start_with_env(&socket, &members, &["--write-back"], &env);
    let files = held_files(&dir);
    assert_eq!(
        files.len(),
        1,
        "one held-write file while served: {files:?}"
    );
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("paraid-") && name.ends_with(".held"),
        "{name}"
    );
    let input = scratch.path("in.bin");
    let data = random_bytes(9, 2 << 20);
    std::fs::write(&input, &data).unwrap();
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    let mut child = served.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(held_files(&dir), files, "a kill leaves the file");

    // Read-only: the file is neither written from nor touched.
    let before = std::fs::read(&files[0]).unwrap();
    let served = Served::start_with_env(&socket, &members, &["--read-only"], &env);
    let mut back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    back.truncate(data.len());
    assert!(back == data, "read-only after the kill: other bytes");
    served.stop();
    assert_eq!(
        std::fs::read(&files[0]).unwrap(),
        before,
        "read-only touched the file"
    );

    // Read-write with write-back: made anew; a clean stop removes it.
    let served = Served::start_with_env(&socket, &members, &["--write-back"], &env);
    assert_eq!(held_files(&dir), files);
    let mut back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    back.truncate(data.len());
    assert!(back == data, "after the kill: other bytes");
    served.stop();
    assert!(
        held_files(&dir).is_empty(),
        "a clean stop leaves {:?}",
        held_files(&dir)
    );

    // Killed again, then served without write-back: the file is looked at and removed.
    let mut served = Served::start_with_env(&socket, &members, &["--write-back"], &env);
    let mut child = served.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(held_files(&dir).len(), 1);
    let served = Served::start_with_env(&socket, &members, &[], &env);
    assert!(
        held_files(&dir).is_empty(),
        "served without write-back: {:?}",
        held_files(&dir)
    );
    served.stop();
}
