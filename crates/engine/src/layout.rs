//! Array geometry: where every array byte, every copy and every parity chunk lives. Pure arithmetic, no I/O.
//!
//! Units: a *chunk* is `chunk_bytes` contiguous bytes on one member; a member's data area is `rows` chunks, row `r`
//! starting at byte `r * chunk_bytes` of the data area. Array byte `x` lies in data chunk `c = x / chunk_bytes`.
//!
//! * RAID0: chunk `c` is on member `c % n`, row `c / n`.
//! * RAID1: chunk `c` is on row `c` of every member (an n-way mirror).
//! * RAID10, md "near 2": copy `r` (0 or 1) of chunk `c` is at position `p = 2c + r`, member `p % n`, row `p / n`.
//! * RAID5/RAID6, md left-symmetric: stripe `s` is row `s`; P is on member `n - 1 - (s % n)`; RAID6 puts Q on
//!   `(P + 1) % n` and data chunk `i` of the stripe on `(P + 2 + i) % n`; RAID5 puts data chunk `i` on
//!   `(P + 1 + i) % n`. Array chunk `c` is data chunk `c % k` of stripe `c / k`, `k` = data chunks per stripe.
//!
//! Stripe index convention (shared with `paraid_parity`): data chunks `0..k`, then P at `k`, then Q at `k + 1`.

use std::fmt;
use std::str::FromStr;

/// The page size of every member I/O: O_DIRECT needs offsets, lengths and buffers aligned to it.
pub const PAGE_BYTES: u64 = 4096;
pub const MIN_CHUNK_BYTES: u64 = 4096;
pub const MAX_CHUNK_BYTES: u64 = 16 << 20;
/// Members an array may have; the superblock's slot table has exactly this many entries.
pub const MAX_MEMBERS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Raid0,
    Raid1,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    /// The number stored in the superblock (and used by mdadm): 0, 1, 5, 6, 10.
    pub fn code(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    pub fn from_code(code: u32) -> Option<Level> {
        match code {
            0 => Some(Level::Raid0),
            1 => Some(Level::Raid1),
            5 => Some(Level::Raid5),
            6 => Some(Level::Raid6),
            10 => Some(Level::Raid10),
            _ => None,
        }
    }

    /// Fewest members that make sense: below these the level degenerates (RAID5 of 2 is a mirror, RAID6 of 3 a
    /// triple mirror) and md refuses them too. RAID0 of one member is a passthrough: paraid's own path without
    /// parity, the baseline a parity level is measured against (md allows it with `--force`).
    pub fn min_members(self) -> usize {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 | Level::Raid10 => 2,
            Level::Raid5 => 3,
            Level::Raid6 => 4,
        }
    }

    /// Parity chunks per stripe (0 for levels without parity).
    pub fn parity_chunks(self) -> usize {
        match self {
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }

    pub fn has_parity(self) -> bool {
        self.parity_chunks() > 0
    }

    /// The only layout this version implements for the level.
    pub fn default_layout(self) -> Layout {
        match self {
            Level::Raid0 | Level::Raid1 => Layout::Plain,
            Level::Raid5 | Level::Raid6 => Layout::LeftSymmetric,
            Level::Raid10 => Layout::Near2,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raid{}", self.code())
    }
}

/// A word that names no RAID level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseLevelError {
    pub word: String,
}

impl fmt::Display for ParseLevelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown RAID level '{}' (expected 0, 1, 5, 6 or 10)",
            self.word
        )
    }
}

impl std::error::Error for ParseLevelError {}

impl FromStr for Level {
    type Err = ParseLevelError;

    fn from_str(word: &str) -> Result<Level, ParseLevelError> {
        let lower = word.trim().to_ascii_lowercase();
        let digits = lower.strip_prefix("raid").unwrap_or(&lower);
        let code = match digits {
            "0" => 0,
            "1" => 1,
            "5" => 5,
            "6" => 6,
            "10" => 10,
            _ => {
                return Err(ParseLevelError {
                    word: word.to_string(),
                })
            }
        };
        Level::from_code(code).ok_or_else(|| ParseLevelError {
            word: word.to_string(),
        })
    }
}

/// How chunks are placed on members; each level has exactly one layout in format version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// RAID0 round robin, RAID1 every member.
    Plain,
    /// md's default RAID5/RAID6 layout (ALGORITHM_LEFT_SYMMETRIC).
    LeftSymmetric,
    /// md's RAID10 "n2" layout.
    #[serde(rename = "near-2")]
    Near2,
}

impl Layout {
    pub fn code(self) -> u32 {
        match self {
            Layout::Plain => 0,
            Layout::LeftSymmetric => 1,
            Layout::Near2 => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<Layout> {
        match code {
            0 => Some(Layout::Plain),
            1 => Some(Layout::LeftSymmetric),
            2 => Some(Layout::Near2),
            _ => None,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Plain => "plain",
            Layout::LeftSymmetric => "left-symmetric",
            Layout::Near2 => "near-2",
        })
    }
}

/// Why a geometry is impossible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GeometryError {
    ChunkNotPowerOfTwo {
        chunk_bytes: u64,
    },
    ChunkOutOfRange {
        chunk_bytes: u64,
    },
    TooFewMembers {
        level: Level,
        members: usize,
        min: usize,
    },
    TooManyMembers {
        members: usize,
        max: usize,
    },
    /// Members too small to hold a single data chunk (per stripe row).
    NoRoom {
        member_data_bytes: u64,
        chunk_bytes: u64,
    },
    LayoutMismatch {
        level: Level,
        layout: Layout,
    },
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GeometryError::ChunkNotPowerOfTwo { chunk_bytes } => {
                write!(f, "chunk size {chunk_bytes} bytes is not a power of two")
            }
            GeometryError::ChunkOutOfRange { chunk_bytes } => write!(
                f,
                "chunk size {chunk_bytes} bytes is outside {MIN_CHUNK_BYTES}..={MAX_CHUNK_BYTES} bytes"
            ),
            GeometryError::TooFewMembers { level, members, min } => {
                write!(f, "{level} needs at least {min} members, got {members}")
            }
            GeometryError::TooManyMembers { members, max } => {
                write!(f, "{members} members is more than the supported {max}")
            }
            GeometryError::NoRoom { member_data_bytes, chunk_bytes } => write!(
                f,
                "member data area of {member_data_bytes} bytes holds no complete chunk of {chunk_bytes} bytes"
            ),
            GeometryError::LayoutMismatch { level, layout } => {
                write!(f, "layout {layout} is not valid for {level}")
            }
        }
    }
}

impl std::error::Error for GeometryError {}

/// One chunk-sized cell of one member: member `member`, data-area byte `row * chunk_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkAddr {
    pub member: usize,
    pub row: u64,
}

/// One byte of one member's data area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteAddr {
    pub member: usize,
    /// Offset inside the member's data area (add the superblock's `data_offset_bytes` for the device offset).
    pub data_offset_bytes: u64,
}

/// What a member cell holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Copy `copy` of array data chunk `chunk`.
    Data { chunk: u64, copy: usize },
    /// Parity P of stripe `stripe`.
    P { stripe: u64 },
    /// Parity Q of stripe `stripe` (RAID6).
    Q { stripe: u64 },
    /// Holds nothing (the last cell of a RAID10 array with an odd number of positions).
    Unused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub members: usize,
    pub chunk_bytes: u64,
    /// Chunks per member data area.
    pub rows: u64,
}

impl Geometry {
    /// Checks the chunk size and member count; `member_data_bytes` is rounded down to whole chunks.
    pub fn new(
        level: Level,
        members: usize,
        chunk_bytes: u64,
        member_data_bytes: u64,
    ) -> Result<Geometry, GeometryError> {
        if !chunk_bytes.is_power_of_two() {
            return Err(GeometryError::ChunkNotPowerOfTwo { chunk_bytes });
        }
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&chunk_bytes) {
            return Err(GeometryError::ChunkOutOfRange { chunk_bytes });
        }
        if members < level.min_members() {
            return Err(GeometryError::TooFewMembers {
                level,
                members,
                min: level.min_members(),
            });
        }
        if members > MAX_MEMBERS {
            return Err(GeometryError::TooManyMembers {
                members,
                max: MAX_MEMBERS,
            });
        }
        let rows = member_data_bytes / chunk_bytes;
        let geometry = Geometry {
            level,
            members,
            chunk_bytes,
            rows,
        };
        if geometry.data_chunks() == 0 {
            return Err(GeometryError::NoRoom {
                member_data_bytes,
                chunk_bytes,
            });
        }
        Ok(geometry)
    }

    /// Bytes of each member's data area that the array uses (whole chunks).
    pub fn member_data_bytes(&self) -> u64 {
        self.rows * self.chunk_bytes
    }

    /// Data chunks per stripe (`k`): RAID0 n, RAID5 n-1, RAID6 n-2, RAID1 1. RAID10 has no stripes in this
    /// sense; it reports 1 (each chunk is locked and written on its own).
    pub fn data_per_stripe(&self) -> usize {
        match self.level {
            Level::Raid0 => self.members,
            Level::Raid5 => self.members - 1,
            Level::Raid6 => self.members - 2,
            Level::Raid1 | Level::Raid10 => 1,
        }
    }

    /// Copies of each data chunk.
    pub fn copies(&self) -> usize {
        match self.level {
            Level::Raid1 => self.members,
            Level::Raid10 => 2,
            _ => 1,
        }
    }

    /// Array data chunks.
    pub fn data_chunks(&self) -> u64 {
        match self.level {
            Level::Raid10 => self.rows * self.members as u64 / 2,
            _ => self.rows * self.data_per_stripe() as u64,
        }
    }

    pub fn array_bytes(&self) -> u64 {
        self.data_chunks() * self.chunk_bytes
    }

    /// Stripes: the unit of parity (RAID5/6) and of locking. One stripe is `data_per_stripe()` consecutive data
    /// chunks; for RAID5/6/0 it is one row of every member, for RAID1/10 one chunk.
    pub fn stripes(&self) -> u64 {
        self.data_chunks() / self.data_per_stripe() as u64
    }

    /// Array bytes per stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.data_per_stripe() as u64 * self.chunk_bytes
    }

    /// Member holding P of `stripe` (RAID5/6).
    pub fn p_member(&self, stripe: u64) -> usize {
        debug_assert!(self.level.has_parity());
        let n = self.members as u64;
        (n - 1 - stripe % n) as usize
    }

    /// Member holding Q of `stripe` (RAID6).
    pub fn q_member(&self, stripe: u64) -> usize {
        debug_assert_eq!(self.level, Level::Raid6);
        (self.p_member(stripe) + 1) % self.members
    }

    /// Member holding stripe index `index` (data `0..k`, P = k, Q = k+1) of `stripe`, for RAID0/5/6.
    pub fn stripe_member(&self, stripe: u64, index: usize) -> usize {
        let n = self.members;
        let k = self.data_per_stripe();
        match self.level {
            Level::Raid0 => {
                assert!(index < k);
                index
            }
            Level::Raid5 => {
                assert!(index <= k);
                let p = self.p_member(stripe);
                if index == k {
                    p
                } else {
                    (p + 1 + index) % n
                }
            }
            Level::Raid6 => {
                assert!(index <= k + 1);
                let p = self.p_member(stripe);
                if index == k {
                    p
                } else if index == k + 1 {
                    (p + 1) % n
                } else {
                    (p + 2 + index) % n
                }
            }
            Level::Raid1 | Level::Raid10 => {
                panic!("stripe_member is for RAID0/5/6, not {}", self.level)
            }
        }
    }

    /// Inverse of `stripe_member`: the stripe index that `member` holds in `stripe` (RAID0/5/6).
    pub fn stripe_index(&self, stripe: u64, member: usize) -> usize {
        let n = self.members;
        assert!(member < n);
        match self.level {
            Level::Raid0 => member,
            Level::Raid5 => {
                let p = self.p_member(stripe);
                if member == p {
                    n - 1
                } else {
                    (member + n - p - 1) % n
                }
            }
            Level::Raid6 => {
                let p = self.p_member(stripe);
                let k = n - 2;
                if member == p {
                    k
                } else if member == (p + 1) % n {
                    k + 1
                } else {
                    (member + n - p - 2) % n
                }
            }
            Level::Raid1 | Level::Raid10 => {
                panic!("stripe_index is for RAID0/5/6, not {}", self.level)
            }
        }
    }

    /// Where copy `copy` of data chunk `chunk` lives.
    pub fn chunk_copy(&self, chunk: u64, copy: usize) -> ChunkAddr {
        assert!(
            chunk < self.data_chunks(),
            "chunk {chunk} beyond {}",
            self.data_chunks()
        );
        assert!(copy < self.copies());
        let n = self.members as u64;
        match self.level {
            Level::Raid0 => ChunkAddr {
                member: (chunk % n) as usize,
                row: chunk / n,
            },
            Level::Raid1 => ChunkAddr {
                member: copy,
                row: chunk,
            },
            Level::Raid10 => {
                let position = 2 * chunk + copy as u64;
                ChunkAddr {
                    member: (position % n) as usize,
                    row: position / n,
                }
            }
            Level::Raid5 | Level::Raid6 => {
                let k = self.data_per_stripe() as u64;
                let stripe = chunk / k;
                let index = (chunk % k) as usize;
                ChunkAddr {
                    member: self.stripe_member(stripe, index),
                    row: stripe,
                }
            }
        }
    }

    /// What the cell at `addr` holds: the inverse of `chunk_copy` and of the parity placement.
    pub fn role(&self, addr: ChunkAddr) -> Role {
        assert!(addr.member < self.members && addr.row < self.rows);
        let n = self.members as u64;
        match self.level {
            Level::Raid0 => Role::Data {
                chunk: addr.row * n + addr.member as u64,
                copy: 0,
            },
            Level::Raid1 => Role::Data {
                chunk: addr.row,
                copy: addr.member,
            },
            Level::Raid10 => {
                let position = addr.row * n + addr.member as u64;
                let chunk = position / 2;
                if chunk < self.data_chunks() {
                    Role::Data {
                        chunk,
                        copy: (position % 2) as usize,
                    }
                } else {
                    Role::Unused
                }
            }
            Level::Raid5 | Level::Raid6 => {
                let k = self.data_per_stripe();
                let stripe = addr.row;
                match self.stripe_index(stripe, addr.member) {
                    i if i < k => Role::Data {
                        chunk: stripe * k as u64 + i as u64,
                        copy: 0,
                    },
                    i if i == k => Role::P { stripe },
                    _ => Role::Q { stripe },
                }
            }
        }
    }

    /// Where copy `copy` of array byte `offset_bytes` lives.
    pub fn map(&self, offset_bytes: u64, copy: usize) -> ByteAddr {
        let chunk = offset_bytes / self.chunk_bytes;
        let within = offset_bytes % self.chunk_bytes;
        let cell = self.chunk_copy(chunk, copy);
        ByteAddr {
            member: cell.member,
            data_offset_bytes: cell.row * self.chunk_bytes + within,
        }
    }

    /// The array byte (and copy) held at data-area byte `addr`, or None for parity and unused bytes.
    pub fn unmap(&self, addr: ByteAddr) -> Option<(u64, usize)> {
        let row = addr.data_offset_bytes / self.chunk_bytes;
        let within = addr.data_offset_bytes % self.chunk_bytes;
        match self.role(ChunkAddr {
            member: addr.member,
            row,
        }) {
            Role::Data { chunk, copy } => Some((chunk * self.chunk_bytes + within, copy)),
            _ => None,
        }
    }

    /// Members that hold a copy of something every other member set depends on: whether the array can still
    /// serve every byte with the members marked in `missing` gone.
    pub fn survives(&self, missing: &[bool]) -> bool {
        assert_eq!(missing.len(), self.members);
        let lost = missing.iter().filter(|m| **m).count();
        match self.level {
            Level::Raid0 => lost == 0,
            Level::Raid1 => lost < self.members,
            Level::Raid5 => lost <= 1,
            Level::Raid6 => lost <= 2,
            Level::Raid10 => {
                // Copy pairs repeat with period n (positions 2c, 2c+1 modulo n), so checking the first n chunks
                // (or all of them in a tiny array) covers every pair of members that share a chunk.
                let chunks = self.data_chunks().min(self.members as u64);
                (0..chunks)
                    .all(|chunk| (0..2).any(|copy| !missing[self.chunk_copy(chunk, copy).member]))
            }
        }
    }

    /// Members that may be missing at once in the worst case.
    pub fn tolerated_missing(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid1 => self.members - 1,
            Level::Raid5 | Level::Raid10 => 1,
            Level::Raid6 => 2,
        }
    }
}
