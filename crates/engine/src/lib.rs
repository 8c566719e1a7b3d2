//! paraid array engine: geometry (`layout`), on-disk superblocks (`superblock`), member I/O (`member`), the
//! array read/write paths (`array`), and setting arrays up (`create`, `assemble`).
//!
//! docs/format.md describes the on-disk format this crate reads and writes.

pub mod array;
pub mod assemble;
pub mod buf;
pub mod cpu_quota;
pub mod crc32c;
pub mod create;
pub mod error;
pub mod fault;
pub mod inspect;
pub mod layout;
mod lock;
pub mod member;
mod signature;
pub mod sim;
pub mod spare_cpu;
pub mod superblock;
pub mod uuid;
pub mod zero;

pub use array::{
    journal_from_env, AddOutcome, AllocationExtent, Answer, Answered, Array, ArrayDetail,
    ArrayIdentity, CheckFinding, GatherStats, IntegrityReport, MemberDetail, Progress,
    SlowMemberStats, StripeCacheStats, WriteBack, WriteBackConfig, WriteBackStats, COMBINE_ENV,
    GATHER_ENV, JOURNAL_ENV, STRIPE_CACHE_ENV, WRITE_BACK_ENV,
};
pub use assemble::{assemble, assemble_io, examine, AssembleOptions};
pub use create::{
    create, create_io, create_io_with_data_offset, create_with_data_offset,
    small_ring_data_offset_bytes, CreateOptions, CreateReport, MAX_DATA_OFFSET_BYTES,
    MIN_DATA_OFFSET_BYTES,
};
pub use error::{EngineError, MemberOp};
pub use inspect::{inspect, MemberSetDetail};
pub use layout::{Geometry, Layout, Level, ParseLevelError};
pub use lock::StripeLockStats;
pub use member::{IoOp, IoReq, MemMembers, MemberIo, NewMember, UringMembers};
pub use superblock::{ArrayState, SlotEntry, SlotState, Superblock};
pub use uuid::Uuid;
pub use zero::{zero_superblocks, ZeroedMember};
