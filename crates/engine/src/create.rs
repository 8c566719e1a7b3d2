//! Creating an array: validate everything, then zero every member (instant init), then write superblocks.

use std::io;
use std::path::{Path, PathBuf};

use crate::error::EngineError;
use crate::layout::{Geometry, Level, MAX_MEMBERS, PAGE_BYTES};
use crate::member::{IoReq, MemberFile, MemberIo, UringMembers};
use crate::superblock::{
    now_unix, ArrayState, SlotEntry, SlotState, Superblock, BITMAP_OFFSET_BYTES,
    DEFAULT_DATA_OFFSET_BYTES, FORMAT_VERSION, NAME_BYTES, SLOT_ENTRIES, SUPERBLOCK_BYTES,
};
use crate::uuid::Uuid;

#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub level: Level,
    /// Power of two, 4 KiB ..= 16 MiB (recorded for RAID1 too).
    pub chunk_bytes: u64,
    /// At most 32 bytes of UTF-8.
    pub name: String,
    /// Per-member size: regular files that don't exist are created, shorter ones extended; members larger than
    /// this use only its first `size_bytes`.
    pub size_bytes: Option<u64>,
    pub members: Vec<PathBuf>,
    /// Overwrite members that already hold a paraid superblock or another signature (`signature.rs`); otherwise they
    /// are refused, like mdadm asks.
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CreateReport {
    pub uuid: String,
    pub array_bytes: u64,
    pub member_data_bytes: u64,
    pub data_offset_bytes: u64,
    /// Members whose data area was zeroed by deallocation (hole punch / discard) rather than by writing zeros.
    pub discarded_members: usize,
}

/// The signature of another filesystem, partition table or volume at the start of `member`, if any.
pub(crate) fn foreign_data(member: &MemberFile) -> Result<Option<&'static str>, EngineError> {
    let len = (member.size_bytes.min(crate::signature::SCAN_BYTES as u64) / PAGE_BYTES * PAGE_BYTES)
        as usize;
    let mut head = crate::buf::AlignedBuf::zeroed(len.max(PAGE_BYTES as usize));
    member
        .read_at(0, &mut head[..len])
        .map_err(|source| EngineError::ReadSuperblock {
            path: member.path.clone(),
            source,
        })?;
    Ok(crate::signature::foreign_signature(&head[..len]))
}

fn invalid(what: String) -> EngineError {
    EngineError::ValidateOptions { what }
}

/// Checks what can be checked without touching any path.
fn validate_options(
    level: Level,
    chunk_bytes: u64,
    name: &str,
    members: usize,
) -> Result<(), EngineError> {
    if name.len() > NAME_BYTES {
        return Err(invalid(format!(
            "name '{name}' is {} bytes, at most {NAME_BYTES} allowed",
            name.len()
        )));
    }
    if name.contains('\0') {
        return Err(invalid("name contains a NUL byte".to_string()));
    }
    if members > MAX_MEMBERS {
        return Err(invalid(format!(
            "{members} members given, at most {MAX_MEMBERS} supported"
        )));
    }
    if members < level.min_members() {
        return Err(invalid(format!(
            "{level} needs at least {} members, {members} given",
            level.min_members()
        )));
    }
    // Geometry checks the chunk size; use a size that always holds a chunk so only the chunk can fail.
    Geometry::new(level, members, chunk_bytes, u64::MAX / 2)?;
    Ok(())
}

/// What create found at one path before writing anything.
enum Planned {
    /// An existing file or device, opened.
    Open(MemberFile),
    /// A regular file to be created.
    New(PathBuf),
}

/// Validates `opts` and every member, then zeroes each member's data area (deallocating it where possible: "instant
/// init", all-zero stripes already have correct parity) and writes a superblock to each. Nothing is written
/// unless every check passed.
pub fn create(opts: &CreateOptions) -> Result<CreateReport, EngineError> {
    create_with_data_offset(opts, DEFAULT_DATA_OFFSET_BYTES)
}

/// The least and the most `create_with_data_offset` takes, and the step (whole MiB keep the data area aligned
/// for any chunk up to 1 MiB and for drives' erase blocks).
pub const MIN_DATA_OFFSET_BYTES: u64 = DEFAULT_DATA_OFFSET_BYTES;
pub const MAX_DATA_OFFSET_BYTES: u64 = 1 << 30;
pub const DATA_OFFSET_STEP_BYTES: u64 = 1 << 20;

/// `create` with each member's data area at `data_offset_bytes` instead of the default 4 MiB (mdadm's
/// `--data-offset`). What lies before it holds the superblocks, the write-intent bitmap and the partial parity
/// log's ring, so a larger offset is a larger ring: a log that writes much (small writes into large chunks, a
/// database's pages into 64 KiB chunks) fills it less often, and each time it fills, the log waits for the writes
/// of its oldest records and flushes every member before it reuses their space. Whole MiB, 4 MiB to 1 GiB.
pub fn create_with_data_offset(
    opts: &CreateOptions,
    data_offset_bytes: u64,
) -> Result<CreateReport, EngineError> {
    validate_options(opts.level, opts.chunk_bytes, &opts.name, opts.members.len())?;
    if !(MIN_DATA_OFFSET_BYTES..=MAX_DATA_OFFSET_BYTES).contains(&data_offset_bytes)
        || !data_offset_bytes.is_multiple_of(DATA_OFFSET_STEP_BYTES)
    {
        return Err(invalid(format!(
            "data offset {data_offset_bytes} bytes: must be whole MiB from {} MiB to {} MiB",
            MIN_DATA_OFFSET_BYTES >> 20,
            MAX_DATA_OFFSET_BYTES >> 20
        )));
    }
    if let Some(size) = opts.size_bytes {
        if size % PAGE_BYTES != 0 {
            return Err(invalid(format!(
                "member size {size} bytes is not a multiple of {PAGE_BYTES}"
            )));
        }
    }

    // Pass 1: identify, refuse duplicates and wrong kinds, open what exists. No writes.
    let mut identities: Vec<((u64, u64), PathBuf)> = Vec::new();
    let mut new_paths: Vec<(PathBuf, PathBuf)> = Vec::new(); // (normalised, as given)
    let mut planned = Vec::with_capacity(opts.members.len());
    for path in &opts.members {
        match std::fs::metadata(path) {
            Ok(_) => {
                // Duplicates before opening (as `assemble` does): the second open of one file would find it claimed
                // by the first.
                if let Ok((_, identity)) = crate::member::identify(path) {
                    if let Some((_, other)) = identities.iter().find(|(id, _)| *id == identity) {
                        return Err(EngineError::CheckDuplicate {
                            path: path.clone(),
                            other: other.clone(),
                        });
                    }
                }
                let member = crate::assemble::open_member(path, crate::member::Access::Serve)?;
                identities.push((member.identity, path.clone()));
                if !opts.force {
                    if let Ok(existing) = crate::assemble::read_superblock(&member) {
                        return Err(EngineError::CheckExistingMember {
                            path: path.clone(),
                            name: existing.name,
                            uuid: existing.uuid.to_string(),
                        });
                    }
                    if let Some(what) = foreign_data(&member)? {
                        return Err(EngineError::CheckForeignData {
                            path: path.clone(),
                            what,
                        });
                    }
                }
                planned.push(Planned::Open(member));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && opts.size_bytes.is_some() => {
                let normalised = normalise_new_path(path)?;
                if let Some((_, other)) = new_paths.iter().find(|(n, _)| *n == normalised) {
                    return Err(EngineError::CheckDuplicate {
                        path: path.clone(),
                        other: other.clone(),
                    });
                }
                new_paths.push((normalised, path.clone()));
                planned.push(Planned::New(path.clone()));
            }
            Err(source) => {
                return Err(EngineError::InspectMember {
                    path: path.clone(),
                    source,
                })
            }
        }
    }

    // Pass 2: sizes and geometry.
    let usable_bytes = |member_bytes: u64| -> u64 {
        let bytes = match opts.size_bytes {
            Some(size) => size,
            None => member_bytes,
        };
        bytes - bytes % PAGE_BYTES
    };
    let mut smallest: Option<(u64, PathBuf)> = None;
    for plan in &planned {
        let (bytes, path) = match plan {
            Planned::Open(m) => {
                let bytes = match (opts.size_bytes, m.kind) {
                    (Some(size), crate::member::MemberKind::Block) if m.size_bytes < size => {
                        return Err(EngineError::CheckMemberSize {
                            path: m.path.clone(),
                            have_bytes: m.size_bytes,
                            need_bytes: size,
                        })
                    }
                    _ => usable_bytes(m.size_bytes),
                };
                (bytes, &m.path)
            }
            Planned::New(path) => (usable_bytes(0), path),
        };
        if smallest.as_ref().is_none_or(|(b, _)| bytes < *b) {
            smallest = Some((bytes, path.clone()));
        }
    }
    let (member_bytes, smallest_path) =
        smallest.ok_or_else(|| invalid("no members given".to_string()))?;
    let need_bytes = data_offset_bytes + opts.chunk_bytes;
    if member_bytes < need_bytes {
        return Err(EngineError::CheckMemberSize {
            path: smallest_path,
            have_bytes: member_bytes,
            need_bytes,
        });
    }
    let geometry = Geometry::new(
        opts.level,
        opts.members.len(),
        opts.chunk_bytes,
        member_bytes - data_offset_bytes,
    )?;
    let uuids = random_uuids(opts.members.len() + 1)?;

    // Pass 3: create and extend files, open the new ones. From here on we write.
    let mut members = Vec::with_capacity(planned.len());
    for plan in planned {
        let member = match plan {
            Planned::Open(m) => {
                if let (Some(size), crate::member::MemberKind::File) = (opts.size_bytes, m.kind) {
                    if m.size_bytes < size {
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(&m.path)
                            .and_then(|f| f.set_len(size))
                            .map_err(|source| EngineError::SizeMember {
                                path: m.path.clone(),
                                source,
                            })?;
                    }
                }
                m
            }
            Planned::New(path) => {
                let size = opts.size_bytes.expect("new files only planned with a size");
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .and_then(|f| f.set_len(size))
                    .map_err(|source| EngineError::SizeMember {
                        path: path.clone(),
                        source,
                    })?;
                MemberFile::open(&path).map_err(|source| EngineError::OpenMember {
                    path: path.clone(),
                    source,
                })?
            }
        };
        members.push(Some(member));
    }
    let io = UringMembers::new(members);
    format_members(&io, geometry, data_offset_bytes, &opts.name, &uuids)
}

/// Creates an array on members that already exist behind `io` (in-memory members, a simulator), slot = index.
pub fn create_io(
    io: &dyn MemberIo,
    level: Level,
    chunk_bytes: u64,
    name: &str,
) -> Result<CreateReport, EngineError> {
    create_io_with_data_offset(io, level, chunk_bytes, name, DEFAULT_DATA_OFFSET_BYTES)
}

/// The data offset of an array whose partial parity log ring is as small as the log works with, plus
/// `extra_ring_pages`: twice the most one request logs on a member (and no less than the smallest area kept for a
/// log), after the superblocks and one bitmap page. For `create_io_with_data_offset` in tests of a full ring and
/// the simulator's `small_ring`; the bitmap of such small arrays fits one page (assembly keeps no log otherwise,
/// which `integrity().log_enabled` tells).
pub fn small_ring_data_offset_bytes(level: Level, chunk_bytes: u64, extra_ring_pages: u64) -> u64 {
    let one_request = crate::array::one_request_pages(level, chunk_bytes);
    let ring_pages =
        (1 + 2 * one_request).max(crate::array::MIN_PPL_BYTES / PAGE_BYTES) + extra_ring_pages;
    BITMAP_OFFSET_BYTES + PAGE_BYTES + ring_pages * PAGE_BYTES
}

/// `create_io` with the data area at `data_offset_bytes` instead of the default: a smaller metadata area, whose
/// partial parity log ring fills within a few writes (the simulator's `small_ring`, tests of a full ring). The
/// superblock records the offset, so assembly needs nothing more.
pub fn create_io_with_data_offset(
    io: &dyn MemberIo,
    level: Level,
    chunk_bytes: u64,
    name: &str,
    data_offset_bytes: u64,
) -> Result<CreateReport, EngineError> {
    let slots = io.slots();
    validate_options(level, chunk_bytes, name, slots)?;
    if !data_offset_bytes.is_multiple_of(PAGE_BYTES)
        || data_offset_bytes < BITMAP_OFFSET_BYTES + PAGE_BYTES
    {
        return Err(invalid(format!(
            "data offset {data_offset_bytes} B: must be whole pages, past the superblocks and one bitmap page"
        )));
    }
    let mut smallest: Option<(u64, usize)> = None;
    for slot in 0..slots {
        if !io.present(slot) {
            return Err(EngineError::ReachMember {
                slot,
                path: io.label(slot),
            });
        }
        let bytes = io.size_bytes(slot) - io.size_bytes(slot) % PAGE_BYTES;
        if smallest.is_none_or(|(b, _)| bytes < b) {
            smallest = Some((bytes, slot));
        }
    }
    let (member_bytes, slot) = smallest.ok_or_else(|| invalid("no members given".to_string()))?;
    let need_bytes = data_offset_bytes + chunk_bytes;
    if member_bytes < need_bytes {
        return Err(EngineError::CheckMemberSize {
            path: PathBuf::from(io.label(slot)),
            have_bytes: member_bytes,
            need_bytes,
        });
    }
    let geometry = Geometry::new(level, slots, chunk_bytes, member_bytes - data_offset_bytes)?;
    let uuids = random_uuids(slots + 1)?;
    format_members(io, geometry, data_offset_bytes, name, &uuids)
}

/// A path that does not exist yet, made comparable: the canonical parent joined with the file name.
fn normalise_new_path(path: &Path) -> Result<PathBuf, EngineError> {
    let file_name = path.file_name().ok_or_else(|| EngineError::InspectMember {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = parent
        .canonicalize()
        .map_err(|source| EngineError::InspectMember {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(parent.join(file_name))
}

fn random_uuids(count: usize) -> Result<Vec<Uuid>, EngineError> {
    (0..count)
        .map(|_| Uuid::random().map_err(|source| EngineError::GenerateUuid { source }))
        .collect()
}

/// Zeroes every member from byte 0 to the end of its data area, then writes each member's superblock durably.
/// `uuids[0]` names the array, `uuids[1 + slot]` the members.
fn format_members(
    io: &dyn MemberIo,
    geometry: Geometry,
    data_offset_bytes: u64,
    name: &str,
    uuids: &[Uuid],
) -> Result<CreateReport, EngineError> {
    let slots = geometry.members;
    let end_bytes = data_offset_bytes + geometry.member_data_bytes();
    let mut discards: Vec<IoReq<'_>> = (0..slots)
        .map(|slot| IoReq::discard(slot, 0, end_bytes))
        .collect();
    io.submit(&mut discards);
    let mut discarded_members = 0;
    for req in discards {
        let slot = req.slot;
        req.outcome(io)?;
        if io.discard_deallocates(slot) {
            discarded_members += 1;
        } else {
            log::warn!(
                "{}: the device cannot deallocate with guaranteed zeroes; its {} bytes were zeroed by writing",
                io.label(slot),
                end_bytes
            );
        }
    }

    let now = now_unix();
    let mut slot_table = vec![SlotEntry::UNUSED; SLOT_ENTRIES];
    for (slot, entry) in slot_table.iter_mut().enumerate().take(slots) {
        *entry = SlotEntry {
            state: SlotState::Active,
            recovery_offset_bytes: 0,
            member_uuid: uuids[1 + slot],
            rebuild_from_bitmap: false,
        };
    }
    let mut template = Superblock {
        format_version: FORMAT_VERSION,
        uuid: uuids[0],
        member_uuid: uuids[1],
        name: name.to_string(),
        level: geometry.level,
        layout: geometry.level.default_layout(),
        chunk_bytes: geometry.chunk_bytes,
        members: slots,
        slot: 0,
        data_offset_bytes,
        data_bytes: geometry.member_data_bytes(),
        array_bytes: geometry.array_bytes(),
        events: 0,
        state: ArrayState::Clean,
        created_unix: now,
        updated_unix: now,
        bitmap_offset_bytes: BITMAP_OFFSET_BYTES,
        bitmap_bytes: data_offset_bytes - BITMAP_OFFSET_BYTES,
        bitmap_chunk_bytes: 0,
        ppl_offset_bytes: 0,
        ppl_bytes: 0,
        // The first assembly starts keeping the bitmap's bits while degraded (`Array::start`).
        bitmap_kept_since_events: 0,
        serve_nonce: 0,
        slots: slot_table,
    };
    crate::array::set_integrity_layout(&mut template);
    write_superblocks(io, &template, &(0..slots).collect::<Vec<_>>())?;
    Ok(CreateReport {
        uuid: template.uuid.to_string(),
        array_bytes: geometry.array_bytes(),
        member_data_bytes: geometry.member_data_bytes(),
        data_offset_bytes,
        discarded_members,
    })
}

/// Writes `template` (with each member's own slot and member UUID) to every slot in `slots`, durably (FUA).
pub(crate) fn write_superblocks(
    io: &dyn MemberIo,
    template: &Superblock,
    slots: &[usize],
) -> Result<(), EngineError> {
    let mut blocks = crate::buf::AlignedBuf::zeroed(SUPERBLOCK_BYTES * slots.len());
    for (chunk, &slot) in blocks.chunks_mut(SUPERBLOCK_BYTES).zip(slots) {
        let mut sb = template.clone();
        sb.slot = slot;
        sb.member_uuid = template.slots[slot].member_uuid;
        chunk.copy_from_slice(&sb.encode());
    }
    let mut reqs: Vec<IoReq<'_>> = blocks
        .chunks(SUPERBLOCK_BYTES)
        .zip(slots)
        .map(|(block, &slot)| IoReq::write(slot, 0, block, true))
        .collect();
    io.submit(&mut reqs);
    for req in reqs {
        let slot = req.slot;
        req.result.map_err(|source| EngineError::WriteSuperblock {
            path: PathBuf::from(io.label(slot)),
            slot,
            source,
        })?;
    }
    Ok(())
}
