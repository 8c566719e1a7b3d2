//! Where `serve --write-back` keeps its held writes against a kill of paraid (engine `array/held.rs`): a file per
//! array in shared memory (/dev/shm, or `PARAID_HELD_DIR`), and what `serve` does with one a killed serve left.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use paraid_engine::array::held::{self, HeldRegion, HeldStore};
use paraid_engine::{Answer, Array, WriteBackConfig};

/// Directory of the held-write files (default /dev/shm: memory that outlives the process, not the machine).
pub const HELD_DIR_ENV: &str = "PARAID_HELD_DIR";

/// The held-write file of `array`.
pub fn path_for(array: &Array) -> PathBuf {
    let dir = std::env::var_os(HELD_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"));
    dir.join(format!("paraid-{}.held", array.uuid()))
}

/// Before anything is served: writes into `array` what a killed serve of it left in `path` (not when served
/// read-only, which writes nothing: it says so), then makes the file anew for this serve's write-back when it
/// answers small writes once held (`write_back`), or removes it. A file that cannot be made leaves write-back
/// without one, with a warning: its held writes then die with the process.
pub fn prepare(
    array: &Array,
    path: &Path,
    write_back: &WriteBackConfig,
    read_only: bool,
) -> Result<Option<HeldStore>, String> {
    let left = HeldRegion::open_file(path)
        .map_err(|e| format!("opening the write-back store {}: {e}", path.display()))?;
    if let Some(region) = left {
        if read_only {
            let pending = HeldStore::leftover(&region).map_or(0, |l| l.writes.len());
            if pending > 0 {
                log::warn!(
                    "{pending} writes that write-back held when paraid was last killed are in {}; served \
                     read-only, they are not written and reads do not show them (serve read-write to write them)",
                    path.display()
                );
            }
            return Ok(None);
        }
        let replayed = held::replay(array, &region).map_err(|e| {
            format!(
                "writing what write-back held when paraid was last killed ({}): {e}",
                path.display()
            )
        })?;
        if replayed.written > 0 {
            log::warn!(
                "wrote {} writes that write-back had answered before paraid was killed (from {})",
                replayed.written,
                path.display()
            );
        }
    }
    if read_only || !(write_back.is_on() && write_back.answer == Answer::WhenHeld) {
        remove(path);
        return Ok(None);
    }
    let bytes = HeldStore::region_bytes(write_back.threads, write_back.max_write_bytes);
    match HeldRegion::create_file(path, bytes) {
        Ok(region) => {
            log::info!(
                "write-back keeps held writes in {} against a kill of paraid",
                path.display()
            );
            Ok(Some(HeldStore::format(
                Arc::new(region),
                array,
                write_back.threads,
                write_back.max_write_bytes,
            )))
        }
        Err(e) => {
            log::warn!(
                "write-back: cannot make {} ({e}): writes answered while held are lost if paraid is killed \
                 before they are written",
                path.display()
            );
            Ok(None)
        }
    }
}

/// Removes the held-write file (after a clean stop every held write is in place); gone already is fine.
pub fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("removing {}: {e}", path.display()),
    }
}
