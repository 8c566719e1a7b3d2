//! The on-disk superblock: 4096 bytes at byte 0 of every member, little-endian, CRC-32C protected.
//! docs/format.md is the normative description; the offsets below must match it.

use std::fmt;

use crate::crc32c::crc32c;
use crate::layout::{Geometry, Layout, Level, MAX_MEMBERS, PAGE_BYTES};
use crate::uuid::Uuid;

pub const MAGIC: [u8; 8] = *b"PARAIDSB";
/// The version `create` writes and assembly upgrades older members to.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest version this build reads (version 1: no bitmap, no partial parity log).
pub const MIN_FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Bytes covered by the checksum; the checksum itself is the last 4 bytes.
pub const CHECKSUMMED_BYTES: usize = SUPERBLOCK_BYTES - 4;
pub const NAME_BYTES: usize = 32;
pub const SLOT_TABLE_OFFSET: usize = 1024;
pub const SLOT_ENTRY_BYTES: usize = 32;
pub const SLOT_ENTRIES: usize = MAX_MEMBERS;
/// Default start of the data area: room for the superblock, a reserved page and a write-intent bitmap.
pub const DEFAULT_DATA_OFFSET_BYTES: u64 = 4 << 20;
/// The write-intent bitmap area starts after the superblock and one reserved page.
pub const BITMAP_OFFSET_BYTES: u64 = 2 * PAGE_BYTES;

// Field offsets (see docs/format.md, "Superblock").
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_SB_BYTES: usize = 12;
const OFF_ARRAY_UUID: usize = 16;
const OFF_MEMBER_UUID: usize = 32;
const OFF_NAME: usize = 48;
const OFF_LEVEL: usize = 80;
const OFF_LAYOUT: usize = 84;
const OFF_CHUNK: usize = 88;
const OFF_MEMBERS: usize = 96;
const OFF_SLOT: usize = 100;
const OFF_DATA_OFFSET: usize = 104;
const OFF_DATA_BYTES: usize = 112;
const OFF_ARRAY_BYTES: usize = 120;
const OFF_EVENTS: usize = 128;
const OFF_STATE: usize = 136;
const OFF_FLAGS: usize = 140;
const OFF_CREATED: usize = 144;
const OFF_UPDATED: usize = 152;
const OFF_BITMAP_OFFSET: usize = 160;
const OFF_BITMAP_BYTES: usize = 168;
const OFF_BITMAP_CHUNK: usize = 176;
const OFF_SLOT_TABLE_OFFSET: usize = 184;
const OFF_SLOT_TABLE_ENTRIES: usize = 188;
const OFF_SLOT_ENTRY_BYTES: usize = 192;
const OFF_PPL_OFFSET: usize = 196;
const OFF_PPL_BYTES: usize = 204;
const OFF_BITMAP_KEPT_SINCE: usize = 212;
const OFF_SERVE_NONCE: usize = 224;
const OFF_CHECKSUM: usize = CHECKSUMMED_BYTES;

/// Whether the array was shut down cleanly (every stripe's parity known to match).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrayState {
    Clean,
    Dirty,
}

impl fmt::Display for ArrayState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArrayState::Clean => "clean",
            ArrayState::Dirty => "dirty",
        })
    }
}

/// The state of one slot, as recorded in every member's slot table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Entry not in use.
    Unused,
    /// In sync and serving.
    Active,
    /// Failed while the array ran; not trusted.
    Faulty,
    /// Absent when the array was assembled.
    Missing,
    /// A spare, not part of the data layout (entries at or beyond `members`).
    Spare,
    /// Being rebuilt; bytes below `recovery_offset_bytes` of its data area are in sync.
    Rebuilding,
}

impl SlotState {
    pub fn code(self) -> u8 {
        match self {
            SlotState::Unused => 0,
            SlotState::Active => 1,
            SlotState::Faulty => 2,
            SlotState::Missing => 3,
            SlotState::Spare => 4,
            SlotState::Rebuilding => 5,
        }
    }

    pub fn from_code(code: u8) -> Option<SlotState> {
        Some(match code {
            0 => SlotState::Unused,
            1 => SlotState::Active,
            2 => SlotState::Faulty,
            3 => SlotState::Missing,
            4 => SlotState::Spare,
            5 => SlotState::Rebuilding,
            _ => return None,
        })
    }
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlotState::Unused => "unused",
            SlotState::Active => "active",
            SlotState::Faulty => "faulty",
            SlotState::Missing => "missing",
            SlotState::Spare => "spare",
            SlotState::Rebuilding => "rebuilding",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlotEntry {
    pub state: SlotState,
    /// Rebuild checkpoint: bytes of the data area already rebuilt (meaningful while `Rebuilding`).
    pub recovery_offset_bytes: u64,
    /// UUID of the member that last held the slot (nil if unknown).
    pub member_uuid: Uuid,
    /// `Rebuilding` onto the slot's own member come back (a re-add): rows in regions the write-intent bitmap does
    /// not mark are in sync on it, at or beyond the checkpoint too (docs/format.md, "Re-add"). Flags byte, bit 0.
    pub rebuild_from_bitmap: bool,
}

impl SlotEntry {
    pub const UNUSED: SlotEntry = SlotEntry {
        state: SlotState::Unused,
        recovery_offset_bytes: 0,
        member_uuid: Uuid([0; 16]),
        rebuild_from_bitmap: false,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Superblock {
    pub format_version: u32,
    pub uuid: Uuid,
    pub member_uuid: Uuid,
    pub name: String,
    pub level: Level,
    pub layout: Layout,
    pub chunk_bytes: u64,
    pub members: usize,
    pub slot: usize,
    pub data_offset_bytes: u64,
    /// Bytes of each member's data area the array uses.
    pub data_bytes: u64,
    pub array_bytes: u64,
    pub events: u64,
    pub state: ArrayState,
    pub created_unix: u64,
    pub updated_unix: u64,
    pub bitmap_offset_bytes: u64,
    pub bitmap_bytes: u64,
    /// Array bytes per bitmap bit (a power-of-two number of stripes); 0 = no bitmap kept (RAID0, version 1).
    pub bitmap_chunk_bytes: u64,
    /// The partial parity log ring (RAID5/6, version 2): member byte offset and size; both 0 = no log.
    pub ppl_offset_bytes: u64,
    pub ppl_bytes: u64,
    /// The events value since which the write-intent bitmap has kept every bit while any slot was not active
    /// (bits are cleared only while every member is in sync), so that the regions written since a member left are
    /// all marked and a member that comes back is rebuilt only there; 0 = not known to be kept (a version 1
    /// array, or one last written by a build that cleared bits while degraded: such a build wrote zero here).
    pub bitmap_kept_since_events: u64,
    /// Random for each read-write start of the array, in every superblock write it makes: tells one serve's
    /// writes from another's (array/held.rs). 0: written by `create`, or by a build before stop 57 (reserved
    /// bytes there).
    pub serve_nonce: u64,
    /// `SLOT_ENTRIES` entries; entries `0..members` are the array's slots.
    pub slots: Vec<SlotEntry>,
}

/// Why bytes are not a valid superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Truncated { len_bytes: usize },
    BadMagic,
    BadChecksum { stored: u32, computed: u32 },
    UnsupportedVersion { version: u32 },
    BadField { field: &'static str, value: u64 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { len_bytes } => write!(
                f,
                "no paraid superblock: {len_bytes} bytes, too short to hold one ({SUPERBLOCK_BYTES}): not an array member"
            ),
            DecodeError::BadMagic => f.write_str("no paraid superblock (bad magic): not an array member"),
            DecodeError::BadChecksum { stored, computed } => write!(
                f,
                "superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): corrupted"
            ),
            DecodeError::UnsupportedVersion { version } => write!(
                f,
                "superblock format version {version} is not supported (this build reads {FORMAT_VERSION})"
            ),
            DecodeError::BadField { field, value } => {
                write!(f, "superblock field {field} has an invalid value {value}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

fn put_u32(block: &mut [u8], at: usize, value: u32) {
    block[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(block: &mut [u8], at: usize, value: u64) {
    block[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(block: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn get_u64(block: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&block[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn get_uuid(block: &[u8], at: usize) -> Uuid {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&block[at..at + 16]);
    Uuid(bytes)
}

impl Superblock {
    /// The geometry this superblock describes (validated by `decode`).
    pub fn geometry(&self) -> Geometry {
        Geometry {
            level: self.level,
            members: self.members,
            chunk_bytes: self.chunk_bytes,
            rows: self.data_bytes / self.chunk_bytes,
        }
    }

    /// Smallest member size (bytes) that holds this superblock's data area.
    pub fn required_member_bytes(&self) -> u64 {
        self.data_offset_bytes + self.data_bytes
    }

    /// The 4096 on-disk bytes, checksum included.
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        assert!(self.name.len() <= NAME_BYTES);
        assert!(self.slots.len() == SLOT_ENTRIES);
        let mut block = [0u8; SUPERBLOCK_BYTES];
        block[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut block, OFF_VERSION, self.format_version);
        put_u32(&mut block, OFF_SB_BYTES, SUPERBLOCK_BYTES as u32);
        block[OFF_ARRAY_UUID..OFF_ARRAY_UUID + 16].copy_from_slice(&self.uuid.0);
        block[OFF_MEMBER_UUID..OFF_MEMBER_UUID + 16].copy_from_slice(&self.member_uuid.0);
        block[OFF_NAME..OFF_NAME + self.name.len()].copy_from_slice(self.name.as_bytes());
        put_u32(&mut block, OFF_LEVEL, self.level.code());
        put_u32(&mut block, OFF_LAYOUT, self.layout.code());
        put_u64(&mut block, OFF_CHUNK, self.chunk_bytes);
        put_u32(&mut block, OFF_MEMBERS, self.members as u32);
        put_u32(&mut block, OFF_SLOT, self.slot as u32);
        put_u64(&mut block, OFF_DATA_OFFSET, self.data_offset_bytes);
        put_u64(&mut block, OFF_DATA_BYTES, self.data_bytes);
        put_u64(&mut block, OFF_ARRAY_BYTES, self.array_bytes);
        put_u64(&mut block, OFF_EVENTS, self.events);
        put_u32(
            &mut block,
            OFF_STATE,
            matches!(self.state, ArrayState::Dirty) as u32,
        );
        put_u32(&mut block, OFF_FLAGS, 0);
        put_u64(&mut block, OFF_CREATED, self.created_unix);
        put_u64(&mut block, OFF_UPDATED, self.updated_unix);
        put_u64(&mut block, OFF_BITMAP_OFFSET, self.bitmap_offset_bytes);
        put_u64(&mut block, OFF_BITMAP_BYTES, self.bitmap_bytes);
        put_u64(&mut block, OFF_BITMAP_CHUNK, self.bitmap_chunk_bytes);
        put_u32(&mut block, OFF_SLOT_TABLE_OFFSET, SLOT_TABLE_OFFSET as u32);
        put_u32(&mut block, OFF_SLOT_TABLE_ENTRIES, SLOT_ENTRIES as u32);
        put_u32(&mut block, OFF_SLOT_ENTRY_BYTES, SLOT_ENTRY_BYTES as u32);
        put_u64(&mut block, OFF_PPL_OFFSET, self.ppl_offset_bytes);
        put_u64(&mut block, OFF_PPL_BYTES, self.ppl_bytes);
        put_u64(
            &mut block,
            OFF_BITMAP_KEPT_SINCE,
            self.bitmap_kept_since_events,
        );
        put_u64(&mut block, OFF_SERVE_NONCE, self.serve_nonce);
        for (i, entry) in self.slots.iter().enumerate() {
            let at = SLOT_TABLE_OFFSET + i * SLOT_ENTRY_BYTES;
            block[at] = entry.state.code();
            block[at + 1] = u8::from(entry.rebuild_from_bitmap);
            put_u64(&mut block, at + 8, entry.recovery_offset_bytes);
            block[at + 16..at + 32].copy_from_slice(&entry.member_uuid.0);
        }
        let checksum = crc32c(&block[..CHECKSUMMED_BYTES]);
        put_u32(&mut block, OFF_CHECKSUM, checksum);
        block
    }

    /// Parses and validates the first `SUPERBLOCK_BYTES` of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Superblock, DecodeError> {
        if bytes.len() < SUPERBLOCK_BYTES {
            return Err(DecodeError::Truncated {
                len_bytes: bytes.len(),
            });
        }
        let block = &bytes[..SUPERBLOCK_BYTES];
        if block[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let stored = get_u32(block, OFF_CHECKSUM);
        let computed = crc32c(&block[..CHECKSUMMED_BYTES]);
        if stored != computed {
            return Err(DecodeError::BadChecksum { stored, computed });
        }
        let version = get_u32(block, OFF_VERSION);
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(DecodeError::UnsupportedVersion { version });
        }
        let bad = |field: &'static str, value: u64| DecodeError::BadField { field, value };
        let check_u32 = |field: &'static str, at: usize, expected: usize| {
            let value = get_u32(block, at);
            if value as usize == expected {
                Ok(())
            } else {
                Err(bad(field, value as u64))
            }
        };
        check_u32("superblock_bytes", OFF_SB_BYTES, SUPERBLOCK_BYTES)?;
        check_u32(
            "slot_table_offset",
            OFF_SLOT_TABLE_OFFSET,
            SLOT_TABLE_OFFSET,
        )?;
        check_u32("slot_table_entries", OFF_SLOT_TABLE_ENTRIES, SLOT_ENTRIES)?;
        check_u32("slot_entry_bytes", OFF_SLOT_ENTRY_BYTES, SLOT_ENTRY_BYTES)?;
        let flags = get_u32(block, OFF_FLAGS);
        if flags != 0 {
            return Err(bad("flags", flags as u64));
        }

        let name_field = &block[OFF_NAME..OFF_NAME + NAME_BYTES];
        let name_len = name_field
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(NAME_BYTES);
        if name_field[name_len..].iter().any(|b| *b != 0) {
            return Err(bad("name", name_len as u64));
        }
        let name = std::str::from_utf8(&name_field[..name_len])
            .map_err(|e| bad("name", e.valid_up_to() as u64))?
            .to_string();

        let level_code = get_u32(block, OFF_LEVEL);
        let level = Level::from_code(level_code).ok_or(bad("level", level_code as u64))?;
        let layout_code = get_u32(block, OFF_LAYOUT);
        let layout = Layout::from_code(layout_code).ok_or(bad("layout", layout_code as u64))?;
        if layout != level.default_layout() {
            return Err(bad("layout", layout_code as u64));
        }
        let chunk_bytes = get_u64(block, OFF_CHUNK);
        let members = get_u32(block, OFF_MEMBERS) as usize;
        let data_bytes = get_u64(block, OFF_DATA_BYTES);
        let geometry = Geometry::new(level, members, chunk_bytes, data_bytes).map_err(|_| {
            bad(
                "geometry (level/members/chunk_bytes/data_bytes)",
                level_code as u64,
            )
        })?;
        if geometry.member_data_bytes() != data_bytes {
            return Err(bad("data_bytes", data_bytes));
        }
        let array_bytes = get_u64(block, OFF_ARRAY_BYTES);
        if array_bytes != geometry.array_bytes() {
            return Err(bad("array_bytes", array_bytes));
        }
        let slot = get_u32(block, OFF_SLOT) as usize;
        if slot >= SLOT_ENTRIES {
            return Err(bad("slot", slot as u64));
        }
        let data_offset_bytes = get_u64(block, OFF_DATA_OFFSET);
        if data_offset_bytes < BITMAP_OFFSET_BYTES || !data_offset_bytes.is_multiple_of(PAGE_BYTES)
        {
            return Err(bad("data_offset_bytes", data_offset_bytes));
        }
        if data_offset_bytes.checked_add(data_bytes).is_none() {
            return Err(bad("data_bytes", data_bytes));
        }
        let state = match get_u32(block, OFF_STATE) {
            0 => ArrayState::Clean,
            1 => ArrayState::Dirty,
            other => return Err(bad("state", other as u64)),
        };
        let bitmap_offset_bytes = get_u64(block, OFF_BITMAP_OFFSET);
        let bitmap_bytes = get_u64(block, OFF_BITMAP_BYTES);
        if bitmap_offset_bytes < SUPERBLOCK_BYTES as u64
            || bitmap_offset_bytes.saturating_add(bitmap_bytes) > data_offset_bytes
        {
            return Err(bad("bitmap_offset_bytes", bitmap_offset_bytes));
        }
        let bitmap_chunk_bytes = get_u64(block, OFF_BITMAP_CHUNK);
        let ppl_offset_bytes = get_u64(block, OFF_PPL_OFFSET);
        let ppl_bytes = get_u64(block, OFF_PPL_BYTES);
        if version == 1 {
            // Version 1 keeps neither: the fields are zero (reserved bytes there).
            if bitmap_chunk_bytes != 0 {
                return Err(bad("bitmap_chunk_bytes", bitmap_chunk_bytes));
            }
            if ppl_offset_bytes != 0 || ppl_bytes != 0 {
                return Err(bad("ppl_offset_bytes", ppl_offset_bytes));
            }
        } else {
            check_integrity_areas(
                &geometry,
                bitmap_offset_bytes,
                bitmap_bytes,
                bitmap_chunk_bytes,
                ppl_offset_bytes,
                ppl_bytes,
                data_offset_bytes,
            )
            .map_err(|(field, value)| bad(field, value))?;
        }
        let mut slots = Vec::with_capacity(SLOT_ENTRIES);
        for i in 0..SLOT_ENTRIES {
            let at = SLOT_TABLE_OFFSET + i * SLOT_ENTRY_BYTES;
            let state =
                SlotState::from_code(block[at]).ok_or(bad("slot state", block[at] as u64))?;
            slots.push(SlotEntry {
                state,
                recovery_offset_bytes: get_u64(block, at + 8),
                member_uuid: get_uuid(block, at + 16),
                // Only while rebuilding; the other bits are reserved (zero).
                rebuild_from_bitmap: state == SlotState::Rebuilding && block[at + 1] & 1 != 0,
            });
        }
        // A member's own slot is one of the array's, or, for a hot spare, a spare entry beyond them.
        if slot >= members && slots[slot].state != SlotState::Spare {
            return Err(bad("slot", slot as u64));
        }
        Ok(Superblock {
            format_version: version,
            uuid: get_uuid(block, OFF_ARRAY_UUID),
            member_uuid: get_uuid(block, OFF_MEMBER_UUID),
            name,
            level,
            layout,
            chunk_bytes,
            members,
            slot,
            data_offset_bytes,
            data_bytes,
            array_bytes,
            events: get_u64(block, OFF_EVENTS),
            state,
            created_unix: get_u64(block, OFF_CREATED),
            updated_unix: get_u64(block, OFF_UPDATED),
            bitmap_offset_bytes,
            bitmap_bytes,
            bitmap_chunk_bytes,
            ppl_offset_bytes,
            ppl_bytes,
            bitmap_kept_since_events: get_u64(block, OFF_BITMAP_KEPT_SINCE),
            serve_nonce: get_u64(block, OFF_SERVE_NONCE),
            slots,
        })
    }
}

/// Version 2 rules for the write-intent bitmap and the partial parity log (docs/format.md): a bit covers a
/// power-of-two number of whole stripes and the bitmap holds a bit for every stripe; the log ring is whole pages
/// between the bitmap and the data area, and only parity levels keep one. Returns the offending field.
fn check_integrity_areas(
    geometry: &Geometry,
    bitmap_offset_bytes: u64,
    bitmap_bytes: u64,
    bitmap_chunk_bytes: u64,
    ppl_offset_bytes: u64,
    ppl_bytes: u64,
    data_offset_bytes: u64,
) -> Result<(), (&'static str, u64)> {
    if bitmap_chunk_bytes != 0 {
        let stripe_bytes = geometry.stripe_bytes();
        let per_bit = bitmap_chunk_bytes / stripe_bytes;
        if !bitmap_chunk_bytes.is_multiple_of(stripe_bytes) || !per_bit.is_power_of_two() {
            return Err(("bitmap_chunk_bytes", bitmap_chunk_bytes));
        }
        let regions = geometry.stripes().div_ceil(per_bit);
        if bitmap_bytes.saturating_mul(8) < regions {
            return Err(("bitmap_bytes", bitmap_bytes));
        }
    }
    if ppl_offset_bytes == 0 && ppl_bytes == 0 {
        return Ok(());
    }
    let fits = geometry.level.has_parity()
        && ppl_offset_bytes.is_multiple_of(PAGE_BYTES)
        && ppl_bytes.is_multiple_of(PAGE_BYTES)
        && ppl_bytes >= 2 * PAGE_BYTES
        && ppl_offset_bytes >= bitmap_offset_bytes.saturating_add(bitmap_bytes)
        && ppl_offset_bytes.saturating_add(ppl_bytes) <= data_offset_bytes;
    if fits {
        Ok(())
    } else {
        Err(("ppl_offset_bytes", ppl_offset_bytes))
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let geometry = Geometry::new(Level::Raid6, 6, 65536, 10 << 20).expect("geometry");
        let mut slots = vec![SlotEntry::UNUSED; SLOT_ENTRIES];
        for (i, slot) in slots.iter_mut().enumerate().take(6) {
            slot.state = if i == 2 {
                SlotState::Missing
            } else {
                SlotState::Active
            };
            slot.member_uuid = Uuid([i as u8 + 1; 16]);
        }
        slots[4].state = SlotState::Rebuilding;
        slots[4].recovery_offset_bytes = 3 << 20;
        slots[7].state = SlotState::Spare;
        Superblock {
            format_version: FORMAT_VERSION,
            uuid: Uuid([0xab; 16]),
            member_uuid: Uuid([4; 16]),
            name: "héllo-array".to_string(),
            level: geometry.level,
            layout: geometry.level.default_layout(),
            chunk_bytes: geometry.chunk_bytes,
            members: geometry.members,
            slot: 3,
            data_offset_bytes: DEFAULT_DATA_OFFSET_BYTES,
            data_bytes: geometry.member_data_bytes(),
            array_bytes: geometry.array_bytes(),
            events: 0x1234_5678_9abc,
            state: ArrayState::Dirty,
            created_unix: 1_700_000_000,
            updated_unix: 1_700_000_100,
            bitmap_offset_bytes: BITMAP_OFFSET_BYTES,
            bitmap_bytes: DEFAULT_DATA_OFFSET_BYTES - BITMAP_OFFSET_BYTES,
            bitmap_chunk_bytes: 0,
            ppl_offset_bytes: 0,
            ppl_bytes: 0,
            bitmap_kept_since_events: 41,
            serve_nonce: 0x5e57_0057,
            slots,
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let block = sb.encode();
        assert_eq!(Superblock::decode(&block), Ok(sb.clone()));
        // Fields sit where docs/format.md says they do.
        assert_eq!(&block[0..8], b"PARAIDSB");
        assert_eq!(get_u32(&block, 80), 6);
        assert_eq!(get_u64(&block, 88), 65536);
        assert_eq!(get_u32(&block, 100), 3);
        assert_eq!(get_u64(&block, 128), 0x1234_5678_9abc);
        assert_eq!(block[1024 + 2 * 32], SlotState::Missing.code());
        assert_eq!(get_u64(&block, 1024 + 4 * 32 + 8), 3 << 20);
        assert_eq!(get_u32(&block, 4092), crc32c(&block[..4092]));
    }

    /// A hot spare's superblock names its spare entry (beyond the member count) as its slot.
    #[test]
    fn spare_round_trips_and_a_slot_beyond_without_spare_is_refused() {
        let mut sb = sample();
        sb.slot = 7; // entry 7 is a spare in the sample
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb.clone()));
        sb.slot = 8; // entry 8 is unused
        assert!(matches!(
            Superblock::decode(&sb.encode()),
            Err(DecodeError::BadField { field: "slot", .. })
        ));
    }

    #[test]
    fn every_level_round_trips() {
        for level in [
            Level::Raid0,
            Level::Raid1,
            Level::Raid5,
            Level::Raid6,
            Level::Raid10,
        ] {
            let mut sb = sample();
            let geometry = Geometry::new(level, 5, 4096, 1 << 20).expect("geometry");
            sb.level = level;
            sb.layout = level.default_layout();
            sb.members = 5;
            sb.chunk_bytes = 4096;
            sb.data_bytes = geometry.member_data_bytes();
            sb.array_bytes = geometry.array_bytes();
            assert_eq!(Superblock::decode(&sb.encode()), Ok(sb), "{level}");
        }
    }

    #[test]
    fn bad_checksum_detected() {
        let block = sample().encode();
        for at in [0usize, 9, 47, 100, 1024, 2000, 4091, 4092, 4095] {
            let mut corrupt = block;
            corrupt[at] ^= 0x10;
            let err = Superblock::decode(&corrupt).expect_err("corruption must be detected");
            if at < 8 {
                assert_eq!(err, DecodeError::BadMagic);
            } else {
                assert!(
                    matches!(err, DecodeError::BadChecksum { .. }),
                    "byte {at}: {err}"
                );
            }
        }
    }

    #[test]
    fn bad_magic_and_zeroes_detected() {
        assert_eq!(
            Superblock::decode(&[0u8; SUPERBLOCK_BYTES]),
            Err(DecodeError::BadMagic)
        );
        let mut block = sample().encode();
        block[0] = b'X';
        assert_eq!(Superblock::decode(&block), Err(DecodeError::BadMagic));
    }

    #[test]
    fn truncated_detected() {
        let block = sample().encode();
        for len in [0, 1, 8, 4095] {
            assert_eq!(
                Superblock::decode(&block[..len]),
                Err(DecodeError::Truncated { len_bytes: len })
            );
        }
    }

    /// A block whose checksum is valid but whose fields are not (a buggy or newer writer) is refused too.
    #[test]
    fn invalid_fields_refused() {
        let reseal = |block: &mut [u8; SUPERBLOCK_BYTES]| {
            let checksum = crc32c(&block[..CHECKSUMMED_BYTES]);
            put_u32(block, OFF_CHECKSUM, checksum);
        };
        let cases: [(usize, u64, &str); 6] = [
            (OFF_VERSION, 3, "version"),
            (OFF_LEVEL, 4, "level"),
            (OFF_CHUNK, 65536 + 4096, "chunk"),
            (OFF_SLOT, 6, "slot"),
            (OFF_STATE, 7, "state"),
            (OFF_FLAGS, 1, "flags"),
        ];
        for (at, value, what) in cases {
            let mut block = sample().encode();
            if at == OFF_CHUNK {
                put_u64(&mut block, at, value);
            } else {
                put_u32(&mut block, at, value as u32);
            }
            reseal(&mut block);
            assert!(
                Superblock::decode(&block).is_err(),
                "{what} = {value} accepted"
            );
        }
    }

    #[test]
    fn serializes_the_documented_json_fields() {
        let json = serde_json::to_value(sample()).expect("json");
        for field in [
            "level",
            "layout",
            "chunk_bytes",
            "slot",
            "members",
            "data_offset_bytes",
            "data_bytes",
            "uuid",
            "name",
            "events",
            "state",
            "created_unix",
            "format_version",
        ] {
            assert!(json.get(field).is_some(), "missing {field} in {json}");
        }
        assert_eq!(json["level"], "raid6");
        assert_eq!(json["layout"], "left-symmetric");
        assert_eq!(json["state"], "dirty");
        assert_eq!(json["uuid"], "abababab-abab-abab-abab-abababababab");
    }
}
