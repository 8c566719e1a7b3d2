//! Members that are block devices: loop devices over sparse files. Needs root and losetup; skips (saying why)
//! without them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{data_areas, reference, verify_members, Rng, TempDir};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{assemble, create, examine, AssembleOptions, CreateOptions, EngineError};

/// Loop devices attached for the test, detached on drop (also when the test fails).
struct Loops(Vec<PathBuf>);

impl Drop for Loops {
    fn drop(&mut self) {
        for dev in &self.0 {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

fn attach(files: &[PathBuf]) -> Result<Loops, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".to_string());
    }
    let mut loops = Loops(Vec::new());
    for file in files {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        loops
            .0
            .push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    Ok(loops)
}

fn sparse(path: &Path, bytes: u64) {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(bytes))
        .expect("backing file");
}

#[test]
fn raid5_on_loop_devices() {
    let dir = TempDir::new("block");
    let files = dir.members(4);
    for f in &files {
        sparse(f, DEFAULT_DATA_OFFSET_BYTES + (4 << 20));
    }
    let loops = match attach(&files) {
        Ok(loops) => loops,
        Err(why) => {
            eprintln!("skipping raid5_on_loop_devices: {why}");
            return;
        }
    };
    let devs = loops.0.clone();
    // A size larger than the devices is refused before anything is written.
    let too_big = CreateOptions {
        force: false,
        level: Level::Raid5,
        chunk_bytes: 65536,
        name: "loop".into(),
        size_bytes: Some(DEFAULT_DATA_OFFSET_BYTES + (8 << 20)),
        members: devs.clone(),
    };
    let err = create(&too_big).expect_err("device smaller than size");
    assert!(matches!(err, EngineError::CheckMemberSize { .. }), "{err}");

    let report = create(&CreateOptions {
        force: false,
        size_bytes: None,
        ..too_big
    })
    .expect("create on loop devices");
    assert_eq!(report.member_data_bytes, 4 << 20);
    let array = assemble(&devs, AssembleOptions::new(reference())).expect("assemble");
    // While assembled the devices are held exclusively: a second assembly is refused.
    let err = match assemble(&devs, AssembleOptions::new(reference())) {
        Ok(_) => panic!("second assembly of devices in use"),
        Err(e) => e,
    };
    assert!(matches!(err, EngineError::OpenMember { .. }), "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    // Examining a member of a running array works (read-only, not exclusive).
    assert_eq!(examine(&devs[1]).expect("examine").slot, 1);

    let mut model = vec![0u8; array.size_bytes() as usize];
    let mut rng = Rng::new(42);
    rng.fill(&mut model);
    array.write(0, &model, false).expect("write");
    let (offset, len) = (65536 * 3 + 100, 65536 * 6);
    array.discard(offset, len).expect("discard");
    model[offset as usize..(offset + len) as usize].fill(0);
    array
        .write(777, b"odd offset after discard", true)
        .expect("write");
    model[777..777 + 24].copy_from_slice(b"odd offset after discard");
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model);
    let g = array.geometry();
    // An assembly that finds the devices held waits a moment for the holder to let go (a server killed a moment
    // ago holds its devices until the kernel has torn its io_uring down): here the holder stops 300 ms later.
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        array.stop().expect("stop");
    });
    let again = assemble(&devs, AssembleOptions::new(reference()))
        .expect("an assembly waits for a holder that lets go");
    holder.join().expect("holder");
    again.stop().expect("stop");
    drop(loops);
    // The backing files, read directly.
    let images: Vec<Option<Vec<u8>>> = files
        .iter()
        .map(|f| Some(std::fs::read(f).expect("read")))
        .collect();
    verify_members(
        &g,
        &data_areas(&images, DEFAULT_DATA_OFFSET_BYTES, &g),
        &model,
    );
}
