use super::Array;
use crate::error::EngineError;

pub(super) fn discard(
    array: &Array,
    offset_bytes: u64,
    len_bytes: u64,
    fua: bool,
) -> Result<(), EngineError> {
    let _ = (array, offset_bytes, len_bytes, fua);
    Err(EngineError::ValidateOptions {
        what: "discard not implemented yet".into(),
    })
}
