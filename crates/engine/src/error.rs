//! The engine's one error type. Each variant is named after the action that failed and carries what the user
//! needs to act on it: the path or slot, and the underlying error as `source()`.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::layout::{GeometryError, Level};
use crate::superblock::DecodeError;

/// What kind of member operation failed (for `AccessMember`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberOp {
    Read,
    Write,
    Flush,
    Discard,
}

impl fmt::Display for MemberOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberOp::Read => "read",
            MemberOp::Write => "write",
            MemberOp::Flush => "flush",
            MemberOp::Discard => "discard",
        })
    }
}

#[derive(Debug)]
pub enum EngineError {
    /// The create options themselves are wrong (chunk size, member count, name).
    ValidateOptions { what: String },
    /// The geometry implied by the options cannot exist.
    ValidateGeometry { source: GeometryError },
    /// stat(2) on a member path failed.
    InspectMember { path: PathBuf, source: io::Error },
    /// The path is neither a regular file nor a block device.
    CheckMemberKind { path: PathBuf, kind: &'static str },
    /// Two paths name the same file or device.
    CheckDuplicate { path: PathBuf, other: PathBuf },
    /// `create` found a paraid superblock on a member and was not told to overwrite it.
    CheckExistingMember {
        path: PathBuf,
        name: String,
        uuid: String,
    },
    /// `create` found another filesystem, partition table or volume signature on a member and was not told to
    /// overwrite it.
    CheckForeignData { path: PathBuf, what: &'static str },
    /// Creating or extending a member file failed.
    SizeMember { path: PathBuf, source: io::Error },
    /// open(2) of a member failed.
    OpenMember { path: PathBuf, source: io::Error },
    /// The member is smaller than what it has to hold.
    CheckMemberSize {
        path: PathBuf,
        have_bytes: u64,
        need_bytes: u64,
    },
    /// A member of an existing array is smaller than its superblock says the array needs (truncated, or a
    /// device that shrank): its data is incomplete.
    CheckShortMember {
        path: PathBuf,
        have_bytes: u64,
        need_bytes: u64,
    },
    /// Reading the superblock area failed.
    ReadSuperblock { path: PathBuf, source: io::Error },
    /// The superblock area holds no valid paraid superblock.
    DecodeSuperblock { path: PathBuf, source: DecodeError },
    /// `examine` found no paraid superblock but another signature (a filesystem, a partition table, a volume).
    ExamineForeign { path: PathBuf, what: &'static str },
    /// One of several members given to assemble or describe an array has no valid superblock.
    DecodeMemberSuperblock { path: PathBuf, source: DecodeError },
    /// Writing a superblock failed.
    WriteSuperblock {
        path: PathBuf,
        slot: usize,
        source: io::Error,
    },
    /// A member belongs to another array than the first member given.
    MatchArray {
        path: PathBuf,
        uuid: String,
        expected_uuid: String,
    },
    /// A member's superblock disagrees with the others about the array (geometry, level, ...).
    MatchGeometry { path: PathBuf, what: &'static str },
    /// Two members claim the same slot.
    MatchSlot {
        path: PathBuf,
        other: PathBuf,
        slot: usize,
    },
    /// A member's event counter is behind the newest member: its contents cannot be trusted.
    TrustStaleMember {
        path: PathBuf,
        slot: usize,
        events: u64,
        newest_events: u64,
    },
    /// The members at the newest events each leave another out of their slot tables: the array's history forked
    /// and no branch can be chosen from the superblocks.
    TrustForkedMembers { paths: Vec<PathBuf>, events: u64 },
    /// More members are missing than the level survives.
    AssembleDegraded {
        level: Level,
        missing_slots: Vec<usize>,
        tolerated: usize,
    },
    /// The array failed: more members are recorded as failed than its level tolerates, and some of them are
    /// given (stale). `force` would start it from `force_would_trust`, those that left last.
    AssembleFailedArray {
        level: Level,
        missing_slots: Vec<usize>,
        tolerated: usize,
        force_would_trust: Vec<PathBuf>,
    },
    /// Reading random bytes for the array UUID failed.
    GenerateUuid { source: io::Error },
    /// Setting up the io_uring for member I/O failed.
    SetUpRing { source: io::Error },
    /// An array request reaches past the end of the array.
    CheckRange {
        offset_bytes: u64,
        len_bytes: u64,
        array_bytes: u64,
    },
    /// I/O to a member failed during an array request.
    AccessMember {
        op: MemberOp,
        slot: usize,
        path: String,
        source: io::Error,
    },
    /// The data needed by a request cannot be read or rebuilt from the members present.
    ReconstructStripe {
        stripe: u64,
        source: paraid_parity::ParityError,
    },
    /// A request needs a member that is not present and the level has no other way to serve it.
    ReachMember { slot: usize, path: String },
    /// A background job (rebuild, check, resync) could not be started.
    StartJob { kind: &'static str, why: String },
    /// The array is beyond its level's tolerance and serves nothing (every request fails with EIO).
    ServeRequest {
        level: Level,
        faulty_slots: Vec<usize>,
    },
    /// An administrative change of a slot (fail, remove, replace) is not possible.
    ChangeMember { slot: usize, why: String },
    /// A new member cannot join the array.
    AddMember { member: String, why: String },
    /// A write gathered with others into one stripe write (array/gather.rs) failed with that write.
    WriteGathered { offset_bytes: u64, why: String },
    /// Making a write's partial parity durable in a member's log ring failed (the write was not done); no slot
    /// when the log itself refused (a round that does not fit its ring).
    LogPartialParity {
        slot: Option<usize>,
        path: String,
        source: io::Error,
    },
    /// A write or discard window was redone after member failures until its attempts ran out.
    RetryWindow { what: &'static str, attempts: usize },
    /// Writing zeros over a member's reserved area (`zero_superblock`) failed.
    ZeroMember { path: PathBuf, source: io::Error },
    /// The array cannot be served read-only as it stands (it needs writing first, or an option asks for writes).
    AssembleReadOnly { why: String },
    /// A request or command that would write to the members, refused by an array served read-only.
    ChangeReadOnly { action: &'static str },
    /// A write answered before it was written in place (array/write_back.rs) failed in the background: every
    /// flush and write after it reports this.
    WriteBehind { why: String },
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use EngineError::*;
        match self {
            ValidateOptions { what } => write!(f, "invalid options: {what}"),
            ValidateGeometry { source } => write!(f, "invalid geometry: {source}"),
            InspectMember { path, source } => write!(f, "cannot stat {}: {source}", path.display()),
            CheckMemberKind { path, kind } => {
                write!(f, "{} is a {kind}, not a regular file or block device", path.display())
            }
            CheckDuplicate { path, other } => {
                write!(f, "{} and {} are the same member", path.display(), other.display())
            }
            CheckExistingMember { path, name, uuid } => write!(
                f,
                "{} already belongs to paraid array '{name}' ({uuid}); give --force to overwrite it",
                path.display()
            ),
            CheckForeignData { path, what } => write!(
                f,
                "{} holds {what}; give --force to overwrite it",
                path.display()
            ),
            SizeMember { path, source } => {
                write!(f, "cannot create or extend {}: {source}", path.display())
            }
            OpenMember { path, source } => write!(f, "cannot open {}: {source}", path.display()),
            CheckMemberSize { path, have_bytes, need_bytes } => write!(
                f,
                "{} is too small: {have_bytes} bytes, needs at least {need_bytes}",
                path.display()
            ),
            CheckShortMember { path, have_bytes, need_bytes } => write!(
                f,
                "{} is too small for its array: {have_bytes} bytes, the array needs {need_bytes} (truncated?); leave \
                 it out (the array starts without it where its level allows) and `paraid add` a member of at least \
                 {need_bytes} bytes",
                path.display()
            ),
            ReadSuperblock { path, source } => {
                write!(f, "cannot read the superblock of {}: {source}", path.display())
            }
            DecodeSuperblock { path, source } => write!(f, "{}: {source}", path.display()),
            ExamineForeign { path, what } => {
                write!(f, "{}: not a paraid array member: it holds {what}", path.display())
            }
            DecodeMemberSuperblock { path, source } => write!(
                f,
                "{}: {source}; leave it out (the array starts without it where its level allows) and `paraid add` it \
                 back to rebuild it",
                path.display()
            ),
            WriteSuperblock { path, slot, source } => {
                write!(f, "cannot write the superblock of {} (slot {slot}): {source}", path.display())
            }
            MatchArray { path, uuid, expected_uuid } => write!(
                f,
                "{} belongs to array {uuid}, not to array {expected_uuid} of the other members",
                path.display()
            ),
            MatchGeometry { path, what } => {
                write!(f, "{} disagrees with the other members about the {what}", path.display())
            }
            MatchSlot { path, other, slot } => write!(
                f,
                "{} and {} both claim slot {slot} (a copied member?)",
                path.display(),
                other.display()
            ),
            TrustStaleMember { path, slot, events, newest_events } if events < newest_events => write!(
                f,
                "{} (slot {slot}) is stale: events {events} < {newest_events}; leave it out, then `paraid add` it to the \
                 running array (a member back in the slot it left is rebuilt only where written since)",
                path.display()
            ),
            TrustStaleMember { path, slot, events, .. } => write!(
                f,
                "{} (slot {slot}) is stale: a member at the same events {events} records it as failed (the array \
                 was started again without it); leave it out and rebuild it",
                path.display()
            ),
            TrustForkedMembers { paths, events } => write!(
                f,
                "the members at events {events} ({}) each record another as failed: the array's history forked \
                 (an update reached only some members before the array failed, and it was started again from the \
                 others); give only the members of the branch to keep",
                paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
            AssembleDegraded { level, missing_slots, tolerated } => write!(
                f,
                "{level} cannot run with slots {missing_slots:?} missing (tolerates {tolerated} in the worst case)"
            ),
            AssembleFailedArray { level, missing_slots, tolerated, force_would_trust } => write!(
                f,
                "the {level} array failed: slots {missing_slots:?} have no member in sync (it tolerates {tolerated}); \
                 `paraid serve --force` starts it from {}, recorded as failed by the others but the last to leave \
                 (blocks being written when it failed may read back neither old nor new; the other stale members \
                 given are rebuilt; `--force --read-only` shows what it would serve without writing)",
                force_would_trust
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            GenerateUuid { source } => write!(f, "cannot read /dev/urandom for the array UUID: {source}"),
            SetUpRing { source } => write!(f, "cannot set up io_uring: {source}"),
            CheckRange { offset_bytes, len_bytes, array_bytes } => write!(
                f,
                "request at byte {offset_bytes} of {len_bytes} bytes reaches past the array end at {array_bytes}"
            ),
            AccessMember { op, slot, path, source } => {
                write!(f, "{op} on member {path} (slot {slot}) failed: {source}")
            }
            ReconstructStripe { stripe, source } => {
                write!(f, "cannot reconstruct stripe {stripe}: {source}")
            }
            ReachMember { slot, path } => {
                write!(f, "member {path} (slot {slot}) is missing and no other copy can serve the request")
            }
            StartJob { kind, why } => write!(f, "cannot start the {kind}: {why}"),
            ServeRequest { level, faulty_slots } => write!(
                f,
                "the {level} array is beyond its tolerance (slots {faulty_slots:?} failed or missing): it serves nothing"
            ),
            ChangeMember { slot, why } => write!(f, "cannot change slot {slot}: {why}"),
            WriteGathered { offset_bytes, why } => write!(
                f,
                "cannot write at byte {offset_bytes}: the stripe write it was gathered into failed: {why}"
            ),
            AddMember { member, why } => write!(f, "cannot take {member} into the array: {why}"),
            ZeroMember { path, source } => {
                write!(f, "cannot zero the superblock area of {}: {source}", path.display())
            }
            AssembleReadOnly { why } => write!(f, "cannot serve the array read-only: {why}"),
            WriteBehind { why } => write!(
                f,
                "a write answered before it reached the members failed there, so its data is lost: {why}"
            ),
            ChangeReadOnly { action } => write!(
                f,
                "{action} refused: the array is served read-only (serve it without --read-only to change it)"
            ),
            LogPartialParity { slot: Some(slot), path, source } => {
                write!(f, "cannot log partial parity on member {path} (slot {slot}): {source}")
            }
            LogPartialParity { slot: None, source, .. } => write!(f, "cannot log partial parity: {source}"),
            RetryWindow { what, attempts } => {
                write!(f, "gave up on a {what} window after {attempts} attempts: members kept failing")
            }
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        use EngineError::*;
        match self {
            ValidateGeometry { source } => Some(source),
            InspectMember { source, .. }
            | SizeMember { source, .. }
            | OpenMember { source, .. }
            | ReadSuperblock { source, .. }
            | WriteSuperblock { source, .. }
            | ZeroMember { source, .. }
            | GenerateUuid { source }
            | SetUpRing { source }
            | AccessMember { source, .. }
            | LogPartialParity { source, .. } => Some(source),
            DecodeSuperblock { source, .. } | DecodeMemberSuperblock { source, .. } => Some(source),
            ReconstructStripe { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<GeometryError> for EngineError {
    fn from(source: GeometryError) -> EngineError {
        EngineError::ValidateGeometry { source }
    }
}
