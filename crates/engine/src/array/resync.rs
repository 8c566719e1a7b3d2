//! Consistency after an unclean stop: the write-intent bitmap and partial parity log set-up at assembly, the
//! recovery of logged stripes, and the background resync of dirty regions.

use super::bitmap::integrity_layout;
use crate::superblock::{Superblock, FORMAT_VERSION};

/// Gives a superblock the version 2 bitmap and partial parity log layout (at create, and when assembly upgrades a
/// version 1 array: its area between the superblock and the data was zeroed by create and never used).
pub(crate) fn set_integrity_layout(sb: &mut Superblock) {
    let layout = integrity_layout(&sb.geometry(), sb.data_offset_bytes);
    sb.format_version = FORMAT_VERSION;
    sb.bitmap_chunk_bytes = layout.bitmap_chunk_bytes;
    sb.bitmap_bytes = layout.bitmap_bytes;
    sb.ppl_offset_bytes = layout.ppl_offset_bytes;
    sb.ppl_bytes = layout.ppl_bytes;
}
