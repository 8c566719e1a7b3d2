//! Wiping a member's paraid metadata (mdadm's `--zero-superblock`): the reserved area at its start (superblock,
//! write-intent bitmap, partial parity log) becomes zeros, so the device no longer names an array and `create`
//! takes it without `--force`. Its data area is left as it is.

use std::path::{Path, PathBuf};

use crate::assemble::{open_member, read_superblock};
use crate::buf::AlignedBuf;
use crate::error::EngineError;
use crate::member::{Access, IoReq, MemberIo, UringMembers};
use crate::superblock::DEFAULT_DATA_OFFSET_BYTES;

/// Bytes zeroed per write.
const ZERO_WRITE_BYTES: usize = 1 << 20;

/// What a member held before it was wiped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ZeroedMember {
    pub path: PathBuf,
    /// The array it belonged to, when its superblock could be read.
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub slot: Option<usize>,
    pub events: Option<u64>,
    /// Bytes of reserved area zeroed (the superblock's data offset; the default one without a superblock).
    pub zeroed_bytes: u64,
}

/// Zeroes the reserved area of `path`. The member is claimed first, so a member of a running array (or one in
/// use otherwise) is refused. Without `force` the member must hold a readable paraid superblock; with it, a
/// damaged or foreign one is wiped too (the default reserved area).
pub fn zero_superblock(path: &Path, force: bool) -> Result<ZeroedMember, EngineError> {
    let member = open_member(path, Access::Serve)?;
    let superblock = match read_superblock(&member) {
        Ok(sb) => Some(sb),
        Err(_) if force => None,
        Err(e) => return Err(e),
    };
    let zeroed_bytes = superblock
        .as_ref()
        .map_or(DEFAULT_DATA_OFFSET_BYTES, |sb| sb.data_offset_bytes)
        .min(member.size_bytes / 4096 * 4096);
    let io = UringMembers::new(vec![Some(member)]);
    let zeros = AlignedBuf::zeroed(ZERO_WRITE_BYTES);
    let mut at = 0u64;
    while at < zeroed_bytes {
        let len = (zeroed_bytes - at).min(ZERO_WRITE_BYTES as u64) as usize;
        let mut reqs = [IoReq::write(0, at, &zeros[..len], true)];
        io.submit(&mut reqs);
        let [req] = reqs;
        req.result.map_err(|source| EngineError::ZeroMember {
            path: path.to_path_buf(),
            source,
        })?;
        at += len as u64;
    }
    Ok(ZeroedMember {
        path: path.to_path_buf(),
        uuid: superblock.as_ref().map(|sb| sb.uuid.to_string()),
        name: superblock.as_ref().map(|sb| sb.name.clone()),
        slot: superblock.as_ref().map(|sb| sb.slot),
        events: superblock.as_ref().map(|sb| sb.events),
        zeroed_bytes,
    })
}
