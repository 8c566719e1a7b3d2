//! What a fault rule says: which I/Os it applies to (`Scope`), what it does to them (`Fault`), and what the
//! injector reports it did (`FaultCounts`, `Injection`).

use std::ops::{BitOr, Range};
use std::time::Duration;

use crate::error::MemberOp;

/// A set of member operation kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpKinds(u8);

impl OpKinds {
    pub const READ: OpKinds = OpKinds(1);
    pub const WRITE: OpKinds = OpKinds(2);
    pub const FLUSH: OpKinds = OpKinds(4);
    pub const DISCARD: OpKinds = OpKinds(8);
    /// Reads and writes (what carries data).
    pub const DATA: OpKinds = OpKinds(1 | 2);
    pub const ALL: OpKinds = OpKinds(1 | 2 | 4 | 8);

    pub fn contains(self, op: MemberOp) -> bool {
        self.0 & OpKinds::of(op).0 != 0
    }

    pub fn of(op: MemberOp) -> OpKinds {
        match op {
            MemberOp::Read => OpKinds::READ,
            MemberOp::Write => OpKinds::WRITE,
            MemberOp::Flush => OpKinds::FLUSH,
            MemberOp::Discard => OpKinds::DISCARD,
        }
    }
}

impl BitOr for OpKinds {
    type Output = OpKinds;
    fn bitor(self, other: OpKinds) -> OpKinds {
        OpKinds(self.0 | other.0)
    }
}

/// Keeps a rule within the array's tolerance: it fires on at most `max_slots` distinct slots per stripe row of the
/// data area (row `r` is member bytes `data_offset_bytes + r * chunk_bytes ..`). I/Os outside the data area do not
/// match a rule that has a row limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLimit {
    pub data_offset_bytes: u64,
    pub chunk_bytes: u64,
    pub max_slots: usize,
}

/// Which I/Os a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Slots (empty: every slot).
    pub slots: Vec<usize>,
    pub ops: OpKinds,
    /// Member byte ranges an I/O must overlap (empty: anywhere). A flush has no range: it matches only rules
    /// without ranges.
    pub ranges: Vec<Range<u64>>,
    pub row_limit: Option<RowLimit>,
    /// Only the I/O of this device (`FaultyMembers::device_at`), in whatever slot it is: a dying drive stays
    /// dead when a spare or a new member takes its slot, and a spare that moves into a slot keeps its faults.
    pub device: Option<DeviceId>,
}

impl Scope {
    /// Every I/O of every slot.
    pub fn all() -> Scope {
        Scope {
            slots: Vec::new(),
            ops: OpKinds::ALL,
            ranges: Vec::new(),
            row_limit: None,
            device: None,
        }
    }

    /// Every I/O of one device, wherever it is attached.
    pub fn device(device: DeviceId) -> Scope {
        Scope {
            device: Some(device),
            ..Scope::all()
        }
    }

    /// Every I/O of one slot.
    pub fn slot(slot: usize) -> Scope {
        Scope::slots(&[slot])
    }

    pub fn slots(slots: &[usize]) -> Scope {
        Scope {
            slots: slots.to_vec(),
            ..Scope::all()
        }
    }

    pub fn ops(mut self, ops: OpKinds) -> Scope {
        self.ops = ops;
        self
    }

    pub fn range(mut self, range: Range<u64>) -> Scope {
        self.ranges.push(range);
        self
    }

    pub fn row_limit(mut self, limit: RowLimit) -> Scope {
        self.row_limit = Some(limit);
        self
    }

    pub(super) fn matches(
        &self,
        slot: usize,
        device: Option<DeviceId>,
        op: MemberOp,
        span: Option<Range<u64>>,
    ) -> bool {
        if !self.slots.is_empty() && !self.slots.contains(&slot) {
            return false;
        }
        if self.device.is_some() && self.device != device {
            return false;
        }
        if !self.ops.contains(op) {
            return false;
        }
        if self.ranges.is_empty() {
            return true;
        }
        match span {
            Some(span) => self.ranges.iter().any(|r| overlaps(r, &span)),
            None => false,
        }
    }
}

pub(super) fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

/// How a rule numbers the I/Os it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Each slot counts its own matching I/Os ("the 3rd write to each member").
    PerSlot,
    /// One count over every matching I/O ("the 3rd matching write").
    Global,
}

/// What happens to a matching I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The `nth` matching I/O (1-based, counted from when the rule was added) and every one after it fail with
    /// EIO: a member that dies.
    FailFrom { nth: u64, count: Count },
    /// Only the `nth` matching I/O fails with EIO: a transient error.
    FailOnce { nth: u64, count: Count },
    /// Matching I/Os `nth ..= nth + times - 1` fail with EIO, then the rule is spent: an error that survives a
    /// retry or two (a sector that reads again once rewritten).
    FailRun { nth: u64, times: u64, count: Count },
    /// One in `one_in` matching reads or writes gets `bits` bits flipped, silently: a read returns corrupted bytes
    /// (the medium is intact), a write stores corrupted bytes (the caller's buffer is intact). Bits are chosen
    /// inside the scope's ranges when it has any.
    FlipBits { bits: u32, one_in: u64 },
    /// One in `one_in` matching reads or writes goes to the member offset shifted by `shift_bytes` (a multiple of
    /// 4096); a shift that would leave the member is not applied.
    Misdirect { shift_bytes: i64, one_in: u64 },
    /// One in `one_in` matching I/Os completes `delay` late: sleeping when `sleep`, otherwise only recorded (the
    /// simulator's virtual time).
    Delay {
        delay: Duration,
        one_in: u64,
        sleep: bool,
    },
}

/// Names a rule added to a `FaultyMembers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u32);

/// A device attached to a `FaultyMembers`: those there at its creation, then one per `attach`. `move_member`
/// takes it along; `detach` ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(pub u64);

/// What was injected, by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// I/Os the rule's scope matched (whether it fired or not).
    pub matched: u64,
    pub failed: u64,
    pub flipped_reads: u64,
    pub flipped_writes: u64,
    pub bits_flipped: u64,
    pub misdirected_reads: u64,
    pub misdirected_writes: u64,
    pub delayed: u64,
    pub delay_ns: u64,
}

impl FaultCounts {
    /// Injections of any class (matched I/Os that were left alone do not count).
    pub fn injected(&self) -> u64 {
        self.failed
            + self.flipped_reads
            + self.flipped_writes
            + self.misdirected_reads
            + self.misdirected_writes
            + self.delayed
    }
}

impl std::ops::AddAssign for FaultCounts {
    fn add_assign(&mut self, o: FaultCounts) {
        self.matched += o.matched;
        self.failed += o.failed;
        self.flipped_reads += o.flipped_reads;
        self.flipped_writes += o.flipped_writes;
        self.bits_flipped += o.bits_flipped;
        self.misdirected_reads += o.misdirected_reads;
        self.misdirected_writes += o.misdirected_writes;
        self.delayed += o.delayed;
        self.delay_ns += o.delay_ns;
    }
}

/// One injection, for tests that must know exactly what was done (which bit of which member, where a write
/// landed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    pub rule: RuleId,
    pub slot: usize,
    pub op: MemberOp,
    /// The I/O as the caller issued it.
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub what: Injected,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injected {
    Failed,
    /// Bit `bit` of the byte at member offset `at_bytes` (where the caller meant it) was flipped.
    FlippedBit {
        at_bytes: u64,
        bit: u8,
    },
    /// The I/O went to member offset `to_bytes` instead of `offset_bytes`.
    Misdirected {
        to_bytes: u64,
    },
    Delayed {
        delay: Duration,
    },
}
