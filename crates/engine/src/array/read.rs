use super::Array;
use crate::error::EngineError;

pub(super) fn read(array: &Array, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
    let _ = (array, offset_bytes, buf);
    todo!("read path")
}
