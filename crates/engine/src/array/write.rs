use super::Array;
use crate::error::EngineError;

pub(super) fn write(
    array: &Array,
    offset_bytes: u64,
    buf: &[u8],
    fua: bool,
) -> Result<(), EngineError> {
    let _ = (array, offset_bytes, buf, fua);
    todo!("write path")
}
