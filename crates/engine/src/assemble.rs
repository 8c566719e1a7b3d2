//! Assembling an array from its members: read and cross-check every superblock, refuse anything doubtful, then
//! hand the members to `Array`.
//!
//! The member with the highest event counter is the truth. A member behind it (stale: it missed writes) is
//! refused, naming it and its events, unless the caller asks to re-add stale members: then it is rebuilt from
//! scratch (in its own slot, or as a spare when a newer member holds that slot). Hot spares sit in slot table
//! entries at or beyond the member count; a blank device given as a spare gets a spare superblock.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::array::Array;
use crate::buf::AlignedBuf;
use crate::error::EngineError;
use crate::member::{Access, IoReq, MemberFile, MemberIo, UringMembers};
use crate::superblock::{DecodeError, SlotEntry, SlotState, Superblock, SUPERBLOCK_BYTES};
use crate::uuid::Uuid;

pub struct AssembleOptions {
    pub parity: Arc<dyn paraid_parity::Backend>,
    /// Hot spares for `assemble` (paths; blank devices are fine). `assemble_io` finds its spares in the member
    /// set's slots beyond the member count instead.
    pub spares: Vec<PathBuf>,
    /// Re-add stale members (events behind the newest) as rebuild targets instead of refusing them.
    pub re_add: bool,
    /// Start an array that failed (more members left than its level tolerates, each recorded as failed by the
    /// others) from the stale members that left it last, as mdadm's `--assemble --force` does: see
    /// `force_members`. The other stale members are re-added as rebuild targets.
    pub force: bool,
    /// Log the partial parity of RAID5/6 partial-stripe writes (closes the write hole with a member missing at
    /// restart; docs/reliability.md). Default on, unless the environment has `PARAID_PPL=off`.
    pub write_hole_log: bool,
    /// Let a write that changes one chunk of a stripe ride that stripe's stream entry in the log instead of
    /// logging an entry of its own (array/ppl/, "Stream entries"). Default on, unless the environment has
    /// `PARAID_PPL_STREAMS=off`.
    pub log_streams: bool,
    /// Journal mode (RAID5/6 with the partial parity log on): the log's entries also carry the new data of
    /// partial-stripe writes, recovery rolls it forward, and a small write through `Array::write_answering` (and so
    /// through `WriteBack` in `Answer::FromLog`) is answered once its entries are durable, before its in-place
    /// writes: durable when answered, at one device round trip less than the log costs otherwise
    /// (docs/reliability.md, "Journal mode"). Default off, unless the environment has `PARAID_JOURNAL=on`.
    pub journal: bool,
    /// Combine sequential partial-stripe RAID5/6 writes that are in flight together into full-stripe writes
    /// (array/gather.rs). Default on, unless the environment has `PARAID_GATHER=off`.
    pub gather_writes: bool,
    /// With `gather_writes`: a partial RAID5/6 write that lies in one stripe and finds another partial write at
    /// work there queues, and the writes queued on the stripe are written together once it is free: one
    /// read-modify-write and one log entry for all of them (array/gather.rs). Default on, unless the environment
    /// has `PARAID_COMBINE=off`.
    pub combine_queued_writes: bool,
    /// Bytes the stripe cache may hold (array/stripe_cache.rs: what RAID5/6 writes put on their chunks, so that a
    /// later read-modify-write of the same pages reads nothing); 0 turns it off. None: `PARAID_STRIPE_CACHE_MIB`
    /// from the environment if set, else 64 MiB, or none when every member lives in memory
    /// (`default_stripe_cache_bytes`).
    pub stripe_cache_bytes: Option<usize>,
    /// Partial parity log rounds written at the same time (group commit, array/ppl/rounds.rs). None:
    /// `PARAID_PPL_ROUNDS` from the environment if set, else one on drives and four when every member lives in
    /// memory (`default_log_rounds_in_flight`).
    pub log_rounds_in_flight: Option<usize>,
    /// Journal mode: writers at work in the log from which it counts as deep, and a small write no longer logs
    /// its data before it reads (nor, with `journal_parity_alone`, its data at all in a stripe without a live
    /// entry; array/ppl/). None: `PARAID_LOG_DEEP_WRITERS` from the environment if set, else 4; 0: always deep.
    pub log_deep_writers: Option<usize>,
    /// Journal mode: a small write where the log is deep, in stripes without a live entry, logs its partial
    /// parity alone and is answered once written in place (array/ppl/, `Ppl::parity_alone`). Default on, unless
    /// the environment has `PARAID_JOURNAL_PARITY_ALONE=off` (docs/reliability.md, "Stop 38", and "Open bugs", seed
    /// 30826522: why it was off until stop 39).
    pub journal_parity_alone: bool,
    /// Journal mode: only a write that no other write awaits an answer beside (through `Array::write_answering`)
    /// is answered from the log; the others take the log's own way, logging their partial parity alone where
    /// their stripes have no live entry, and are answered once written in place (docs/reliability.md, "Lone
    /// answers"). Default off, unless the environment has `PARAID_JOURNAL_LONE=on`.
    pub journal_lone_answers: bool,
    /// Journal mode: a gate each early answer must pass, asked once per write through `Array::write_answering`;
    /// while it says the CPU is not spare the write takes the log's own way (spare_cpu.rs: where the CPU, not the
    /// members' latency, is the limit, an early answer's copies cost more than its round trip saves). None: every
    /// write may be answered early. Default from `PARAID_JOURNAL_LONE=auto` (lone answers on, gated by the
    /// machine's idle CPU, `spare_cpu::ProcStatCpu`), else none.
    pub spare_cpu: Option<Arc<dyn crate::spare_cpu::SpareCpu>>,
    /// Journal mode with a gate on spare CPU: the members' queues decide too (array/queueing.rs): while they
    /// queue requests only a lone write is answered early, while they are saturated none is. Set with the
    /// machine's gate (`gate_answers_on_spare_cpu`), unless the environment has `PARAID_MEMBER_QUEUES=off`; off
    /// where a caller gives a gate of its own (the simulator's seeded one must not follow the clock).
    pub watch_member_queues: bool,
    /// RAID5 without the journal: a log entry may go to the ring of a member whose chunk it counts as modified
    /// instead of the P member's, so that a round of small writes writes fewer records (array/ppl/spread.rs).
    /// Default on, unless the environment has `PARAID_PPL_SPREAD=off`.
    pub log_spread: bool,
    /// Serve reads only and write nothing to any member, superblocks, bitmap and log included (md's
    /// `--readonly`): members are opened read-only (claimed shared: no writer serves beside it), nothing is
    /// resynced or rebuilt, and writes and member changes are refused (`EngineError::ChangeReadOnly`). After an
    /// unclean stop the partial parity log's recovery is applied in memory only (member/overlay.rs). A member
    /// that fails is left out in memory only. Refused with spares or `re_add`, and for a RAID5/6 array stopped
    /// uncleanly with members missing whose log is off (nothing can make its stripes consistent).
    pub read_only: bool,
}

impl AssembleOptions {
    /// No spares, stale members refused.
    pub fn new(parity: Arc<dyn paraid_parity::Backend>) -> AssembleOptions {
        let mut options = AssembleOptions {
            parity,
            spares: Vec::new(),
            re_add: false,
            force: false,
            write_hole_log: crate::array::switch_on_by_env(crate::array::PPL_ENV),
            log_streams: crate::array::switch_on_by_env(crate::array::PPL_STREAMS_ENV),
            journal: crate::array::journal_from_env(),
            gather_writes: crate::array::switch_on_by_env(crate::array::GATHER_ENV),
            combine_queued_writes: crate::array::switch_on_by_env(crate::array::COMBINE_ENV),
            stripe_cache_bytes: crate::array::stripe_cache_bytes_from_env(),
            log_rounds_in_flight: crate::array::log_rounds_in_flight_from_env(),
            log_deep_writers: crate::array::log_deep_writers_from_env(),
            journal_parity_alone: crate::array::switch_on_by_env(crate::array::PARITY_ALONE_ENV),
            journal_lone_answers: crate::array::switched_on_by_env(crate::array::LONE_ANSWERS_ENV),
            spare_cpu: None,
            watch_member_queues: false,
            log_spread: crate::array::switch_on_by_env(crate::array::SPREAD_ENV),
            read_only: false,
        };
        if crate::array::lone_answers_auto_by_env() {
            options.gate_answers_on_spare_cpu();
        }
        options
    }

    /// Journal mode's early answers gated on the machine's idle CPU (`PARAID_JOURNAL_LONE=auto`): lone answers on,
    /// each early answer asked of `spare_cpu::ProcStatCpu` (spare_cpu.rs).
    pub fn gate_answers_on_spare_cpu(&mut self) {
        self.journal_lone_answers = true;
        self.spare_cpu = Some(Arc::new(crate::spare_cpu::ProcStatCpu::new()));
        self.watch_member_queues = crate::array::switch_on_by_env(crate::array::MEMBER_QUEUES_ENV);
    }
}

/// Reads one member's superblock (read-only open: works on members of a running array).
pub fn examine(path: &Path) -> Result<Superblock, EngineError> {
    let member = open_member(path, Access::Look)?;
    read_superblock(&member).map_err(|e| match e {
        // Not a member: say what it is, if it says so itself.
        EngineError::DecodeSuperblock {
            path,
            source: DecodeError::BadMagic,
        } => match crate::create::foreign_data(&member) {
            Ok(Some(what)) => EngineError::ExamineForeign { path, what },
            _ => EngineError::DecodeSuperblock {
                path,
                source: DecodeError::BadMagic,
            },
        },
        e => e,
    })
}

/// Opens a member after checking it is a regular file or a block device (shared with `create`).
pub(crate) fn open_member(path: &Path, access: Access) -> Result<MemberFile, EngineError> {
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
    MemberFile::open_with(path, access).map_err(|source| EngineError::OpenMember {
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

/// Opens the members at `paths` (any order) and the spares, cross-checks their superblocks and starts the array
/// (marking it dirty, events + 1, on every member; with `read_only`, writing nothing).
pub fn assemble(paths: &[PathBuf], opts: AssembleOptions) -> Result<Array, EngineError> {
    refuse_writing_options(&opts)?;
    let access = if opts.read_only {
        Access::ServeReadOnly
    } else {
        Access::Serve
    };
    let (opened, mut newest, stale, mut spares_in_paths) = open_checked(paths, access, &opts)?;
    let mut members: Vec<Option<MemberFile>> = (0..newest.members).map(|_| None).collect();
    let mut re_add: Vec<(usize, u64)> = Vec::new();
    let mut spares: Vec<(MemberFile, Option<Superblock>)> = Vec::new();
    for (i, (member, sb)) in opened.into_iter().enumerate() {
        if !stale.contains(&i) {
            members[sb.slot] = Some(member);
        } else {
            spares.push((member, Some(sb)));
        }
    }
    if opts.read_only {
        // Read-only, nothing is rebuilt: the stale members that `force` did not start from, and spares, sit out.
        for member in spares.iter().map(|(m, _)| m).chain(&spares_in_paths) {
            log::warn!(
                "{} left out: an array served read-only rebuilds nothing",
                member.path.display()
            );
        }
        spares.clear();
        spares_in_paths.clear();
    }
    // Stale members re-added: into their own slot if no newer member holds it, else as spares.
    let mut still_spare = spares_in_paths;
    for (member, sb) in spares {
        let slot = sb.as_ref().map_or(usize::MAX, |sb| sb.slot);
        if slot < newest.members && members[slot].is_none() {
            let in_sync_rows = sb
                .as_ref()
                .map_or(0, |sb| in_sync_outside_bitmap_rows(&newest, sb));
            newest.slots[slot].member_uuid =
                sb.as_ref().map_or(Uuid::default(), |sb| sb.member_uuid);
            members[slot] = Some(member);
            re_add.push((slot, in_sync_rows));
        } else {
            still_spare.push(member);
        }
    }
    if !opts.spares.is_empty() && newest.geometry().tolerated_missing() == 0 {
        return Err(EngineError::ValidateOptions {
            what: format!(
                "spares for {}: it keeps no redundancy, so a spare could never be rebuilt onto",
                newest.level
            ),
        });
    }
    for path in &opts.spares {
        if let Some((m, _)) = members
            .iter()
            .flatten()
            .map(|m| (m, ()))
            .find(|(m, _)| crate::member::identify(path).is_ok_and(|(_, id)| id == m.identity))
        {
            return Err(EngineError::CheckDuplicate {
                path: path.clone(),
                other: m.path.clone(),
            });
        }
        let member = open_member(path, Access::Serve)?;
        match read_superblock(&member) {
            Ok(sb) if sb.uuid != newest.uuid => {
                return Err(EngineError::MatchArray {
                    path: path.clone(),
                    uuid: sb.uuid.to_string(),
                    expected_uuid: newest.uuid.to_string(),
                })
            }
            Ok(sb) if sb.slot < newest.members && sb.events == newest.events => {
                return Err(EngineError::ValidateOptions {
                    what: format!(
                        "{} is member {} of the array, not a spare",
                        path.display(),
                        sb.slot
                    ),
                })
            }
            _ => {}
        }
        if member.size_bytes < newest.required_member_bytes() {
            return Err(EngineError::CheckMemberSize {
                path: path.clone(),
                have_bytes: member.size_bytes,
                need_bytes: newest.required_member_bytes(),
            });
        }
        still_spare.push(member);
    }
    let mut fresh: Vec<usize> = Vec::new();
    for member in still_spare {
        let entry = spare_entry(&mut newest, &member.path)?;
        if members.len() <= entry {
            members.resize_with(entry + 1, || None);
        }
        fresh.push(entry);
        members[entry] = Some(member);
    }
    let in_memory = members.iter().flatten().all(|m| m.memory_backed);
    let io: Arc<dyn MemberIo> = Arc::new(UringMembers::new(members));
    zero_reserved(io.as_ref(), &newest, &fresh)?;
    Array::start(io, newest, &re_add, &opts, in_memory)
}

/// With `read_only`, refuses the options that ask for writes (spares and re-adding stale members mean rebuilds).
fn refuse_writing_options(opts: &AssembleOptions) -> Result<(), EngineError> {
    let why = match (opts.read_only, opts.spares.is_empty(), opts.re_add) {
        (false, _, _) | (true, true, false) => return Ok(()),
        (true, false, _) => "spares are rebuilt onto, which writes",
        (true, true, true) => "re-added members are rebuilt, which writes",
    };
    Err(EngineError::AssembleReadOnly {
        why: why.to_string(),
    })
}

/// Gives a spare a slot table entry at or beyond the member count, with a fresh member UUID.
fn spare_entry(newest: &mut Superblock, path: &Path) -> Result<usize, EngineError> {
    let entry = (newest.members..newest.slots.len())
        .find(|e| newest.slots[*e].state == SlotState::Unused)
        .ok_or_else(|| EngineError::ValidateOptions {
            what: format!("no free slot table entry for spare {}", path.display()),
        })?;
    newest.slots[entry] = SlotEntry {
        state: SlotState::Spare,
        recovery_offset_bytes: 0,
        member_uuid: Uuid::random().map_err(|source| EngineError::GenerateUuid { source })?,
        rebuild_from_bitmap: false,
    };
    Ok(entry)
}

/// Zeroes the reserved area (superblock, bitmap, log) of members joining as spares, as `create` leaves it.
fn zero_reserved(
    io: &dyn MemberIo,
    newest: &Superblock,
    entries: &[usize],
) -> Result<(), EngineError> {
    let mut reqs: Vec<IoReq<'_>> = entries
        .iter()
        .map(|&e| IoReq::discard(e, 0, newest.data_offset_bytes))
        .collect();
    io.submit(&mut reqs);
    for req in reqs {
        req.outcome(io)?;
    }
    Ok(())
}

/// What `open_checked` found: the members with their superblocks, the newest superblock (the one the array
/// continues from), the positions of stale members among them (only with `re_add`; otherwise a stale member is
/// an error), and the hot spares found among the paths (their superblocks name a spare entry).
type Checked = (
    Vec<(MemberFile, Superblock)>,
    Superblock,
    Vec<usize>,
    Vec<MemberFile>,
);

/// Opens the members at `paths` (any order), refusing duplicates, and cross-checks their superblocks.
fn open_checked(
    paths: &[PathBuf],
    access: Access,
    opts: &AssembleOptions,
) -> Result<Checked, EngineError> {
    let (opened, spares) = open_members(paths, access)?;
    let (newest, stale) = cross_check(&found_of(&opened), opts)?;
    Ok((opened, newest, stale, spares))
}

/// Members of an array's slots with their superblocks, and spares of the same array.
pub(crate) type Opened = (Vec<(MemberFile, Superblock)>, Vec<MemberFile>);

/// The members at `paths`, opened, with their superblocks (those in one of the array's slots), and the spares
/// among them (their superblocks name a spare entry of the same array). Refuses duplicates, unreadable
/// superblocks, spares of another array and a set of spares alone.
pub(crate) fn open_members(paths: &[PathBuf], access: Access) -> Result<Opened, EngineError> {
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
        let member = open_member(path, access)?;
        let sb = read_superblock(&member).map_err(|e| match e {
            EngineError::DecodeSuperblock { path, source } if paths.len() > 1 => {
                EngineError::DecodeMemberSuperblock { path, source }
            }
            e => e,
        })?;
        opened.push((member, sb));
    }
    let (opened, spares): (Vec<_>, Vec<_>) =
        opened.into_iter().partition(|(_, sb)| sb.slot < sb.members);
    let Some((_, first)) = opened.first() else {
        return Err(EngineError::ValidateOptions {
            what: "only spares given: no member of the array".to_string(),
        });
    };
    for (m, sb) in &spares {
        if sb.uuid != first.uuid {
            return Err(EngineError::MatchArray {
                path: m.path.clone(),
                uuid: sb.uuid.to_string(),
                expected_uuid: first.uuid.to_string(),
            });
        }
    }
    Ok((opened, spares.into_iter().map(|(m, _)| m).collect()))
}

pub(crate) fn found_of(opened: &[(MemberFile, Superblock)]) -> Vec<Found> {
    opened
        .iter()
        .map(|(m, sb)| Found {
            label: m.path.clone(),
            superblock: sb.clone(),
            size_bytes: m.size_bytes,
        })
        .collect()
}

/// Assembles from members that sit behind `io` already in slot order (in-memory members, a simulator);
/// absent slots are missing members. Present slots beyond the member count are spares (blank, or spares of
/// this array).
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
    let mut beyond: Vec<(usize, Result<Superblock, DecodeError>)> = Vec::new();
    let decoded: Vec<(usize, Result<Superblock, DecodeError>)> = blocks
        .chunks(SUPERBLOCK_BYTES)
        .zip(&present)
        .map(|(block, &slot)| (slot, Superblock::decode(block)))
        .collect();
    // The member count comes from the members themselves: the first decodable superblock in its own slot.
    let members = decoded
        .iter()
        .find_map(|(slot, sb)| {
            sb.as_ref()
                .ok()
                .filter(|sb| sb.slot == *slot)
                .map(|sb| sb.members)
        })
        .unwrap_or(slots);
    for (slot, decoded) in decoded {
        let label = PathBuf::from(io.label(slot));
        if slot >= members {
            beyond.push((slot, decoded));
            continue;
        }
        let superblock = decoded.map_err(|source| EngineError::DecodeSuperblock {
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
    refuse_writing_options(&opts)?;
    let (mut newest, stale) = cross_check(&found, &opts)?;
    if slots < newest.members {
        return Err(EngineError::ValidateOptions {
            what: format!(
                "{slots} member slots given, the array has {}",
                newest.members
            ),
        });
    }
    // Read-only, the stale members that `force` did not start from sit out (nothing is rebuilt).
    let re_add: Vec<(usize, u64)> = stale
        .iter()
        .filter(|_| !opts.read_only)
        .map(|&i| {
            let sb = &found[i].superblock;
            (sb.slot, in_sync_outside_bitmap_rows(&newest, sb))
        })
        .collect();
    let mut fresh = Vec::new();
    // Read-only, spares take no part: nothing is rebuilt onto them.
    let beyond = if opts.read_only { Vec::new() } else { beyond };
    for (slot, decoded) in beyond {
        let label = io.label(slot);
        match decoded {
            Ok(sb) if sb.uuid != newest.uuid => {
                return Err(EngineError::MatchArray {
                    path: PathBuf::from(label),
                    uuid: sb.uuid.to_string(),
                    expected_uuid: newest.uuid.to_string(),
                })
            }
            Ok(sb) if sb.slot == slot && newest.slots[slot].state == SlotState::Spare => {
                newest.slots[slot].member_uuid = sb.member_uuid;
            }
            _ => {
                newest.slots[slot] = SlotEntry {
                    state: SlotState::Spare,
                    recovery_offset_bytes: 0,
                    member_uuid: Uuid::random()
                        .map_err(|source| EngineError::GenerateUuid { source })?,
                    rebuild_from_bitmap: false,
                };
                fresh.push(slot);
            }
        }
        if io.size_bytes(slot) < newest.required_member_bytes() {
            return Err(EngineError::CheckMemberSize {
                path: PathBuf::from(io.label(slot)),
                have_bytes: io.size_bytes(slot),
                need_bytes: newest.required_member_bytes(),
            });
        }
    }
    zero_reserved(io.as_ref(), &newest, &fresh)?;
    // Member sets given whole (in memory, simulated, wrapped for faults) stand for drives: their defaults apply.
    Array::start(io, newest, &re_add, &opts, false)
}

/// How much of stale member `sb`, re-added into its own slot of the array `newest` describes, holds the array's
/// bytes wherever the write-intent bitmap marks no write since it left, in member rows from the start of its data
/// area: all of them (`rows`) if it was active there in its own view (or being re-added there itself); its rebuild
/// checkpoint if it left in the middle of a whole rebuild into the slot (the rows below were built and flushed
/// before the checkpoint was written, rebuild.rs `persist_checkpoint`); 0 for anything else. Only when the slot
/// table still records it as the slot's member (no other member was built there since) and the bitmap has kept
/// its bits while degraded since before it left (`Superblock::bitmap_kept_since_events`): every region written
/// since is then marked. Its rebuild covers the marked regions only, below the bound. The same rule as a running
/// array's `paraid add`.
pub(crate) fn in_sync_outside_bitmap_rows(newest: &Superblock, sb: &Superblock) -> u64 {
    let slot = sb.slot;
    let returning = newest.bitmap_chunk_bytes > 0
        && newest.bitmap_kept_since_events != 0
        // Present at the superblock write just before the keeping began (the one the keeping build's first
        // write follows: `create`'s, or another build's last) is enough: it left no earlier than that, and a
        // member that left earlier missed it.
        && sb.events + 1 >= newest.bitmap_kept_since_events
        && sb.events < newest.events
        && slot < newest.members
        && newest.slots[slot].member_uuid == sb.member_uuid
        && matches!(
            newest.slots[slot].state,
            SlotState::Faulty | SlotState::Missing
        );
    let rows = newest.geometry().rows;
    match sb.slots.get(slot) {
        Some(own) if returning => match own.state {
            SlotState::Active => rows,
            SlotState::Rebuilding if own.rebuild_from_bitmap => rows,
            SlotState::Rebuilding => (own.recovery_offset_bytes / newest.chunk_bytes).min(rows),
            _ => 0,
        },
        _ => 0,
    }
}

pub(crate) struct Found {
    pub(crate) label: PathBuf,
    pub(crate) superblock: Superblock,
    pub(crate) size_bytes: u64,
}

/// What the superblocks of a member set say, before anything decides whether the array may start.
#[derive(Clone)]
pub(crate) struct Verdict {
    /// The newest superblock: the one the array continues from.
    pub(crate) newest: Superblock,
    /// Positions in the member set of stale members (behind the newest events, left out by its slot table).
    pub(crate) stale: Vec<usize>,
    /// Slots with no trusted member present.
    pub(crate) missing_slots: Vec<usize>,
}

impl Verdict {
    pub(crate) fn survives(&self) -> bool {
        let geometry = self.newest.geometry();
        let mut missing = vec![false; geometry.members];
        for &slot in &self.missing_slots {
            missing[slot] = true;
        }
        geometry.survives(&missing)
    }
}

/// Refuses mixed arrays, disagreeing geometry, short members and doubled slots (stale members aside); says which
/// members are stale and which slots are missing.
pub(crate) fn judge(found: &[Found]) -> Result<Verdict, EngineError> {
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
            return Err(EngineError::CheckShortMember {
                path: f.label.clone(),
                have_bytes: f.size_bytes,
                need_bytes: sb.required_member_bytes(),
            });
        }
    }
    let newest_events = found
        .iter()
        .map(|f| f.superblock.events)
        .max()
        .expect("at least one member");
    // The members at the newest events normally share one slot table. They do not when the array's history
    // forked: an update reached some members, the array then failed (beyond tolerance) before the rest had it,
    // and it was started again from those others, whose next update brought them to the same count. A member of
    // that group that another member of it leaves out of its table is on the abandoned branch: stale, however
    // equal its events (simulation seed 9922168, `faults_members::a_forked_history_trusts_neither_branch_blindly`).
    let group: Vec<usize> = (0..found.len())
        .filter(|&i| found[i].superblock.events == newest_events)
        .collect();
    let trusted: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| {
            group
                .iter()
                .all(|&j| j == i || keeps(&found[j].superblock, &found[i].superblock))
        })
        .collect();
    let Some(&newest_index) = trusted.first() else {
        return Err(EngineError::TrustForkedMembers {
            paths: group.iter().map(|&i| found[i].label.clone()).collect(),
            events: newest_events,
        });
    };
    let newest = &found[newest_index];
    // Stale first: an old copy of a slot's member is stale, not a duplicate of the slot. A member behind the
    // newest events missed writes only if the newest slot table left it out (missing, faulty, or another
    // member's UUID in its slot): data is written to every member the table keeps. A member the newest table
    // still keeps, with its own UUID, only missed superblock updates (a power loss between the members' writes
    // of one update): it is trusted.
    let kept = |sb: &Superblock| trusted.iter().all(|&t| keeps(&found[t].superblock, sb));
    let stale: Vec<usize> = (0..found.len())
        .filter(|&i| !trusted.contains(&i) && (group.contains(&i) || !kept(&found[i].superblock)))
        .collect();
    for f in found {
        let sb = &f.superblock;
        if sb.events < newest_events && kept(sb) {
            log::warn!(
                "{} (slot {}) has events {} < {newest_events}: it missed a superblock update, not data (the \
                 newest slot table keeps it); trusted",
                f.label.display(),
                sb.slot,
                sb.events
            );
        }
    }
    for (i, f) in found.iter().enumerate() {
        if stale.contains(&i) {
            continue;
        }
        if let Some(other) = found[..i]
            .iter()
            .enumerate()
            .find(|(j, o)| !stale.contains(j) && o.superblock.slot == f.superblock.slot)
            .map(|(_, o)| o)
        {
            return Err(EngineError::MatchSlot {
                path: f.label.clone(),
                other: other.label.clone(),
                slot: f.superblock.slot,
            });
        }
    }
    let geometry = newest.superblock.geometry();
    let mut missing = vec![true; geometry.members];
    for (i, f) in found.iter().enumerate() {
        if !stale.contains(&i) && f.superblock.slot < geometry.members {
            missing[f.superblock.slot] = false;
        }
    }
    Ok(Verdict {
        newest: newest.superblock.clone(),
        stale,
        missing_slots: (0..geometry.members).filter(|s| missing[*s]).collect(),
    })
}

/// Trusts stale members whose departure failed the array, the one that left last first, until the array has
/// the members its level needs; returns their positions in `found`. Why those: an array fails the moment one
/// member too many leaves, so that member missed only writes that failed with the array (never acknowledged),
/// while one that left earlier missed writes the array acknowledged degraded (their contents live in parity the
/// trusted members hold, and a rebuild of the earlier one recomputes them): never trusted. Only members that were
/// active in their own view, in a slot no trusted member holds, are taken.
fn force_members(found: &[Found], verdict: &mut Verdict) -> Vec<usize> {
    let mut trusted = Vec::new();
    let mut candidates: Vec<usize> = verdict
        .stale
        .iter()
        .copied()
        .filter(|&i| {
            let sb = &found[i].superblock;
            sb.slot < sb.members
                && sb.slots[sb.slot].state == SlotState::Active
                && its_departure_failed_the_array(sb)
        })
        .collect();
    candidates.sort_by_key(|&i| std::cmp::Reverse(found[i].superblock.events));
    for i in candidates {
        if verdict.survives() {
            break;
        }
        let sb = &found[i].superblock;
        if !verdict.missing_slots.contains(&sb.slot) {
            continue;
        }
        verdict.newest.slots[sb.slot] = SlotEntry {
            state: SlotState::Active,
            recovery_offset_bytes: 0,
            member_uuid: sb.member_uuid,
            rebuild_from_bitmap: false,
        };
        verdict.missing_slots.retain(|&slot| slot != sb.slot);
        verdict.stale.retain(|&j| j != i);
        trusted.push(i);
    }
    trusted
}

/// What `force` makes of a verdict that does not survive: the verdict with the trusted members in, and their
/// positions in `found`; None when the array survives anyway, or when force cannot make it survive.
pub(crate) fn forced_verdict(found: &[Found], verdict: &Verdict) -> Option<(Verdict, Vec<usize>)> {
    if verdict.survives() {
        return None;
    }
    let mut forced = verdict.clone();
    let trusted = force_members(found, &mut forced);
    forced.survives().then_some((forced, trusted))
}

/// Whether the array failed the moment the member whose superblock is `sb` left: its own superblock, last written
/// while it was in, records which members were out then, and with it out too the level no longer survives. A
/// member whose departure the array survived missed writes acknowledged while it ran degraded: never forced.
fn its_departure_failed_the_array(sb: &Superblock) -> bool {
    let missing: Vec<bool> = (0..sb.members)
        .map(|slot| slot == sb.slot || sb.slots[slot].state != SlotState::Active)
        .collect();
    !sb.geometry().survives(&missing)
}

/// Whether the slot table of `by` keeps the member whose superblock is `sb` in its slot (active or being
/// rebuilt, with its member UUID): data is written to every member a table keeps.
fn keeps(by: &Superblock, sb: &Superblock) -> bool {
    let entry = &by.slots[sb.slot];
    sb.slot < by.members
        && matches!(entry.state, SlotState::Active | SlotState::Rebuilding)
        && entry.member_uuid == sb.member_uuid
}

/// `judge`, then refuses stale members (unless `re_add` or `force`) and too many missing members; returns the
/// newest superblock and the positions in `found` of stale members (to be rebuilt, never read). With `force`, an
/// array that would be refused for too many missing members first trusts stale members (`force_members`).
fn cross_check(
    found: &[Found],
    opts: &AssembleOptions,
) -> Result<(Superblock, Vec<usize>), EngineError> {
    let mut verdict = judge(found)?;
    if let Some((forced, trusted)) = forced_verdict(found, &verdict) {
        if opts.force {
            for &i in &trusted {
                let sb = &found[i].superblock;
                log::warn!(
                    "forced: trusting {} (slot {}, events {} < {}), recorded as failed by the others but the last to \
                     leave",
                    found[i].label.display(),
                    sb.slot,
                    sb.events,
                    verdict.newest.events
                );
            }
            verdict = forced;
        } else {
            let geometry = verdict.newest.geometry();
            return Err(EngineError::AssembleFailedArray {
                level: geometry.level,
                missing_slots: verdict.missing_slots,
                tolerated: geometry.tolerated_missing(),
                force_would_trust: trusted.iter().map(|&i| found[i].label.clone()).collect(),
            });
        }
    }
    if let (false, Some(&i)) = (opts.re_add || opts.force, verdict.stale.first()) {
        let f = &found[i];
        return Err(EngineError::TrustStaleMember {
            path: f.label.clone(),
            slot: f.superblock.slot,
            events: f.superblock.events,
            newest_events: verdict.newest.events,
        });
    }
    if !verdict.survives() {
        let geometry = verdict.newest.geometry();
        return Err(EngineError::AssembleDegraded {
            level: geometry.level,
            missing_slots: verdict.missing_slots,
            tolerated: geometry.tolerated_missing(),
        });
    }
    Ok((verdict.newest, verdict.stale))
}
