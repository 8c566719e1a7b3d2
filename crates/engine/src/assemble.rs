//! Assembling an array from its members: read and cross-check every superblock, refuse anything doubtful, then
//! hand the members to `Array`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::array::{Array, ArrayDetail, MemberDetail};
use crate::buf::AlignedBuf;
use crate::error::EngineError;
use crate::member::{IoReq, MemberFile, MemberIo, UringMembers};
use crate::superblock::{SlotState, Superblock, SUPERBLOCK_BYTES};

pub struct AssembleOptions {
    pub parity: Arc<dyn paraid_parity::Backend>,
}

/// Reads one member's superblock (read-only open: works on members of a running array).
pub fn examine(path: &Path) -> Result<Superblock, EngineError> {
    let member = open_member(path, false)?;
    read_superblock(&member)
}

fn open_member(path: &Path, writable: bool) -> Result<MemberFile, EngineError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).map_err(|source| EngineError::InspectMember {
        path: path.to_path_buf(),
        source,
    })?;
    let file_type = meta.file_type();
    if !(file_type.is_file() || file_type.is_block_device()) {
        let kind = if file_type.is_dir() {
            "directory"
        } else {
            "special file"
        };
        return Err(EngineError::CheckMemberKind {
            path: path.to_path_buf(),
            kind,
        });
    }
    let opened = if writable {
        MemberFile::open(path)
    } else {
        MemberFile::open_read_only(path)
    };
    opened.map_err(|source| EngineError::OpenMember {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn read_superblock(member: &MemberFile) -> Result<Superblock, EngineError> {
    let path = &member.path;
    if member.size_bytes < SUPERBLOCK_BYTES as u64 {
        return Err(EngineError::DecodeSuperblock {
            path: path.clone(),
            source: crate::superblock::DecodeError::Truncated {
                len_bytes: member.size_bytes as usize,
            },
        });
    }
    let mut block = AlignedBuf::zeroed(SUPERBLOCK_BYTES);
    member
        .read_at(0, &mut block)
        .map_err(|source| EngineError::ReadSuperblock {
            path: path.clone(),
            source,
        })?;
    Superblock::decode(&block).map_err(|source| EngineError::DecodeSuperblock {
        path: path.clone(),
        source,
    })
}

/// Opens the members at `paths` (any order), cross-checks their superblocks and starts the array (marking it
/// dirty, events + 1, on every member).
pub fn assemble(paths: &[PathBuf], opts: AssembleOptions) -> Result<Array, EngineError> {
    let (opened, newest) = open_checked(paths, true)?;
    let mut members: Vec<Option<MemberFile>> = (0..newest.members).map(|_| None).collect();
    for (member, sb) in opened {
        members[sb.slot] = Some(member);
    }
    let io: Arc<dyn MemberIo> = Arc::new(UringMembers::new(members));
    Array::start(io, newest, opts.parity)
}

/// Describes the array that the members at `paths` form, with the same checks as `assemble`, writing nothing
/// (read-only opens without O_EXCL: works while the array runs).
pub fn inspect(paths: &[PathBuf]) -> Result<ArrayDetail, EngineError> {
    let (opened, newest) = open_checked(paths, false)?;
    let geometry = newest.geometry();
    let members = (0..newest.members)
        .map(|slot| {
            let present = opened.iter().find(|(_, sb)| sb.slot == slot);
            MemberDetail {
                slot,
                path: present
                    .map(|(m, _)| m.path.display().to_string())
                    .unwrap_or_default(),
                state: if present.is_some() {
                    newest.slots[slot].state
                } else {
                    SlotState::Missing
                },
            }
        })
        .collect();
    Ok(ArrayDetail {
        uuid: newest.uuid.to_string(),
        name: newest.name.clone(),
        level: newest.level,
        layout: newest.layout,
        chunk_bytes: newest.chunk_bytes,
        size_bytes: geometry.array_bytes(),
        state: newest.state,
        events: newest.events,
        members,
        parity_backend: "none (not assembled)".to_string(),
        spares: Vec::new(),
        progress: None,
        failed: false,
        sync_speed_min_bytes_per_s: 0,
        sync_speed_max_bytes_per_s: 0,
    })
}

/// Opens the members at `paths` (any order), refusing duplicates, and cross-checks their superblocks; returns
/// them with the newest superblock (the one the array continues from).
fn open_checked(
    paths: &[PathBuf],
    writable: bool,
) -> Result<(Vec<(MemberFile, Superblock)>, Superblock), EngineError> {
    if paths.is_empty() {
        return Err(EngineError::ValidateOptions {
            what: "no members given".to_string(),
        });
    }
    let mut opened: Vec<(MemberFile, Superblock)> = Vec::with_capacity(paths.len());
    for path in paths {
        // Duplicates first: opening a block device twice with O_EXCL would report a confusing EBUSY.
        if let Ok((_, identity)) = crate::member::identify(path) {
            if let Some((m, _)) = opened.iter().find(|(m, _)| m.identity == identity) {
                return Err(EngineError::CheckDuplicate {
                    path: path.clone(),
                    other: m.path.clone(),
                });
            }
        }
        let member = open_member(path, writable)?;
        let sb = read_superblock(&member)?;
        opened.push((member, sb));
    }
    let found: Vec<Found> = opened
        .iter()
        .map(|(m, sb)| Found {
            label: m.path.clone(),
            superblock: sb.clone(),
            size_bytes: m.size_bytes,
        })
        .collect();
    let newest = cross_check(&found)?;
    Ok((opened, newest))
}

/// Assembles from members that sit behind `io` already in slot order (in-memory members, a simulator);
/// absent slots are missing members.
pub fn assemble_io(io: Arc<dyn MemberIo>, opts: AssembleOptions) -> Result<Array, EngineError> {
    let slots = io.slots();
    let present: Vec<usize> = (0..slots).filter(|s| io.present(*s)).collect();
    let mut blocks = AlignedBuf::zeroed(SUPERBLOCK_BYTES * present.len());
    {
        let mut reqs: Vec<IoReq<'_>> = blocks
            .chunks_mut(SUPERBLOCK_BYTES)
            .zip(&present)
            .map(|(block, &slot)| IoReq::read(slot, 0, block))
            .collect();
        io.submit(&mut reqs);
        for req in reqs {
            let slot = req.slot;
            req.result.map_err(|source| EngineError::ReadSuperblock {
                path: PathBuf::from(io.label(slot)),
                source,
            })?;
        }
    }
    let mut found = Vec::with_capacity(present.len());
    for (block, &slot) in blocks.chunks(SUPERBLOCK_BYTES).zip(&present) {
        let label = PathBuf::from(io.label(slot));
        let superblock =
            Superblock::decode(block).map_err(|source| EngineError::DecodeSuperblock {
                path: label.clone(),
                source,
            })?;
        if superblock.slot != slot {
            return Err(EngineError::MatchGeometry {
                path: label,
                what: "slot (member sits in another position)",
            });
        }
        found.push(Found {
            label,
            superblock,
            size_bytes: io.size_bytes(slot),
        });
    }
    if found.is_empty() {
        return Err(EngineError::ValidateOptions {
            what: "no members present".to_string(),
        });
    }
    let newest = cross_check(&found)?;
    if slots != newest.members {
        return Err(EngineError::ValidateOptions {
            what: format!(
                "{slots} member slots given, the array has {}",
                newest.members
            ),
        });
    }
    Array::start(io, newest, opts.parity)
}

struct Found {
    label: PathBuf,
    superblock: Superblock,
    size_bytes: u64,
}

/// Refuses mixed arrays, disagreeing geometry, doubled slots, short members, stale members and too many missing
/// members; returns the newest superblock (the one the array continues from).
fn cross_check(found: &[Found]) -> Result<Superblock, EngineError> {
    let first = &found[0].superblock;
    for f in found {
        let sb = &f.superblock;
        if sb.uuid != first.uuid {
            return Err(EngineError::MatchArray {
                path: f.label.clone(),
                uuid: sb.uuid.to_string(),
                expected_uuid: first.uuid.to_string(),
            });
        }
        let disagreement = if sb.level != first.level {
            Some("level")
        } else if sb.layout != first.layout {
            Some("layout")
        } else if sb.chunk_bytes != first.chunk_bytes {
            Some("chunk size")
        } else if sb.members != first.members {
            Some("member count")
        } else if sb.data_offset_bytes != first.data_offset_bytes {
            Some("data offset")
        } else if sb.data_bytes != first.data_bytes {
            Some("data size")
        } else {
            None
        };
        if let Some(what) = disagreement {
            return Err(EngineError::MatchGeometry {
                path: f.label.clone(),
                what,
            });
        }
        if f.size_bytes < sb.required_member_bytes() {
            return Err(EngineError::CheckMemberSize {
                path: f.label.clone(),
                have_bytes: f.size_bytes,
                need_bytes: sb.required_member_bytes(),
            });
        }
    }
    for (i, f) in found.iter().enumerate() {
        if let Some(other) = found[..i]
            .iter()
            .find(|o| o.superblock.slot == f.superblock.slot)
        {
            return Err(EngineError::MatchSlot {
                path: f.label.clone(),
                other: other.label.clone(),
                slot: f.superblock.slot,
            });
        }
    }
    let newest = found
        .iter()
        .max_by_key(|f| f.superblock.events)
        .expect("at least one member");
    let newest_events = newest.superblock.events;
    if let Some(stale) = found.iter().find(|f| f.superblock.events < newest_events) {
        return Err(EngineError::TrustStaleMember {
            path: stale.label.clone(),
            slot: stale.superblock.slot,
            events: stale.superblock.events,
            newest_events,
        });
    }
    let geometry = newest.superblock.geometry();
    let mut missing = vec![true; geometry.members];
    for f in found {
        missing[f.superblock.slot] = false;
    }
    if !geometry.survives(&missing) {
        return Err(EngineError::AssembleDegraded {
            level: geometry.level,
            missing_slots: (0..geometry.members).filter(|s| missing[*s]).collect(),
            tolerated: geometry.tolerated_missing(),
        });
    }
    Ok(newest.superblock.clone())
}
