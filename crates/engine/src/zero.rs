//! Wiping a member's paraid metadata (mdadm's `--zero-superblock`): the reserved area at its start (superblock,
//! write-intent bitmap, partial parity log) becomes zeros, so the device no longer names an array and `create`
//! takes it without `--force`. Its data area is left as it is.

use std::path::PathBuf;

use crate::assemble::{open_member, read_superblock};
use crate::error::EngineError;
use crate::layout::PAGE_BYTES;
use crate::member::{Access, IoReq, MemberFile, MemberIo, UringMembers};
use crate::superblock::{Superblock, DEFAULT_DATA_OFFSET_BYTES};

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

/// Zeroes the reserved area of every member in `paths`. Every member is opened, claimed and checked before any is
/// written, so a bad one among them leaves all as they were: a member in use (of a running array, or claimed
/// otherwise) is refused, a path given twice too, and without `force` each must hold a readable paraid
/// superblock; with it, a damaged or foreign one is wiped as well (the default reserved area).
pub fn zero_superblocks(paths: &[PathBuf], force: bool) -> Result<Vec<ZeroedMember>, EngineError> {
    let mut checked = Vec::with_capacity(paths.len());
    for path in paths {
        let member = open_member(path, Access::Serve)?;
        if let Some((other, _)) = checked
            .iter()
            .find(|(m, _): &&(MemberFile, Option<Superblock>)| m.identity == member.identity)
        {
            return Err(EngineError::CheckDuplicate {
                path: path.clone(),
                other: other.path.clone(),
            });
        }
        let superblock = match read_superblock(&member) {
            Ok(sb) => Some(sb),
            Err(_) if force => None,
            Err(e) => return Err(e),
        };
        checked.push((member, superblock));
    }
    // As a spare's reserved area is cleared (assemble.rs, `zero_reserved`): a discard, which reads back as zeros
    // on every member kind (a hole punched in a file, zeroes written on a device that cannot discard to zeros),
    // then a flush, all members at once.
    let wiped: Vec<ZeroedMember> = checked
        .iter()
        .map(|(member, superblock)| ZeroedMember {
            path: member.path.clone(),
            uuid: superblock.as_ref().map(|sb| sb.uuid.to_string()),
            name: superblock.as_ref().map(|sb| sb.name.clone()),
            slot: superblock.as_ref().map(|sb| sb.slot),
            events: superblock.as_ref().map(|sb| sb.events),
            zeroed_bytes: superblock
                .as_ref()
                .map_or(DEFAULT_DATA_OFFSET_BYTES, |sb| sb.data_offset_bytes)
                .min(member.size_bytes / PAGE_BYTES * PAGE_BYTES),
        })
        .collect();
    let io = UringMembers::new(checked.into_iter().map(|(m, _)| Some(m)).collect());
    let submit = |mut reqs: Vec<IoReq<'_>>| -> Result<(), EngineError> {
        io.submit(&mut reqs);
        for req in reqs {
            req.result.map_err(|source| EngineError::ZeroMember {
                path: wiped[req.slot].path.clone(),
                source,
            })?;
        }
        Ok(())
    };
    submit(
        wiped
            .iter()
            .enumerate()
            .map(|(i, w)| IoReq::discard(i, 0, w.zeroed_bytes))
            .collect(),
    )?;
    submit((0..wiped.len()).map(IoReq::flush).collect())?;
    Ok(wiped)
}
