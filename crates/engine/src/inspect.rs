//! `paraid detail`: what a set of members says about its array, read from their superblocks with nothing
//! written, and what `serve` of exactly that set would do. Unlike assembly it reports a stale member or too many
//! missing ones instead of refusing: a description is most wanted when the array will not start.

use std::path::PathBuf;

use crate::array::ArrayIdentity;
use crate::assemble::{found_of, judge, open_members, Verdict};
use crate::error::EngineError;
use crate::superblock::{ArrayState, SlotState};

/// An array as its members' superblocks describe it (offline).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberSetDetail {
    /// The newest superblock's: its state is clean when the array stopped cleanly, dirty while it runs or after
    /// an unclean stop (the next start recovers the log and resyncs).
    #[serde(flatten)]
    pub identity: ArrayIdentity,
    /// Bytes each member needs (reserved area and data area).
    pub member_bytes: u64,
    /// One per slot, in slot order.
    pub members: Vec<MemberSetSlot>,
    /// Members given that are behind the newest events and left out by its slot table.
    pub stale: Vec<StaleMember>,
    /// Hot spares given (paths).
    pub spares: Vec<String>,
    /// What `paraid serve` of exactly these paths does.
    pub serve: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberSetSlot {
    pub slot: usize,
    /// The member given for the slot; empty when none is.
    pub path: String,
    /// The newest slot table's state; `missing` when no trusted member for the slot was given.
    pub state: SlotState,
    /// Rebuilding: bytes of the slot's data area in sync (where a rebuild resumes).
    pub recovery_offset_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StaleMember {
    pub path: String,
    /// The slot its own superblock names.
    pub slot: usize,
    pub events: u64,
    /// Added back to its slot (`paraid add` on the running array), it is rebuilt only in the regions the
    /// write-intent bitmap marks as written since it left (docs/format.md, "Re-add"); otherwise whole.
    pub re_add_from_bitmap: bool,
    /// With `re_add_from_bitmap`, for a member that left in the middle of its own rebuild: that holds only below
    /// this byte of its data area (its rebuild checkpoint), the rest is rebuilt whole. None otherwise.
    pub re_add_in_sync_below_bytes: Option<u64>,
}

/// Describes the array that the members at `paths` form, writing nothing (read-only opens without O_EXCL: works
/// while the array runs). Errors only where no description is possible: unreadable members or superblocks,
/// members of different arrays or geometries, two members claiming one slot.
pub fn inspect(paths: &[PathBuf]) -> Result<MemberSetDetail, EngineError> {
    let (opened, spares) = open_members(paths, crate::member::Access::Look)?;
    let found = found_of(&opened);
    let verdict = match judge(&found) {
        Ok(verdict) => verdict,
        Err(forked @ EngineError::TrustForkedMembers { .. }) => {
            return Ok(forked_detail(&found, &spares, &forked));
        }
        Err(e) => return Err(e),
    };
    let newest = &verdict.newest;
    let members = (0..newest.members)
        .map(|slot| {
            let given = found
                .iter()
                .enumerate()
                .find(|(i, f)| f.superblock.slot == slot && !verdict.stale.contains(i));
            let entry = &newest.slots[slot];
            MemberSetSlot {
                slot,
                path: given
                    .map(|(_, f)| f.label.display().to_string())
                    .unwrap_or_default(),
                state: if given.is_some() {
                    entry.state
                } else {
                    SlotState::Missing
                },
                recovery_offset_bytes: (given.is_some() && entry.state == SlotState::Rebuilding)
                    .then_some(entry.recovery_offset_bytes),
            }
        })
        .collect();
    let stale = verdict
        .stale
        .iter()
        .map(|&i| {
            let rows = crate::assemble::in_sync_outside_bitmap_rows(newest, &found[i].superblock);
            StaleMember {
                path: found[i].label.display().to_string(),
                slot: found[i].superblock.slot,
                events: found[i].superblock.events,
                re_add_from_bitmap: rows > 0,
                re_add_in_sync_below_bytes: (rows > 0 && rows < newest.geometry().rows)
                    .then_some(rows * newest.chunk_bytes),
            }
        })
        .collect();
    Ok(MemberSetDetail {
        identity: ArrayIdentity::of(newest),
        member_bytes: newest.required_member_bytes(),
        serve: serve_outlook(&verdict, &found_labels(&found, &verdict.stale), &found),
        members,
        stale,
        spares: spares
            .iter()
            .map(|m| m.path.display().to_string())
            .collect(),
    })
}

/// A forked member set has no newest superblock to describe it from: the first member's identity and geometry,
/// each slot with the member given for it (as its own table sees itself), and the refusal.
fn forked_detail(
    found: &[crate::assemble::Found],
    spares: &[crate::member::MemberFile],
    forked: &EngineError,
) -> MemberSetDetail {
    let first = &found[0].superblock;
    let members = (0..first.members)
        .map(|slot| {
            let given = found.iter().find(|f| f.superblock.slot == slot);
            MemberSetSlot {
                slot,
                path: given
                    .map(|f| f.label.display().to_string())
                    .unwrap_or_default(),
                state: given.map_or(SlotState::Missing, |f| f.superblock.slots[slot].state),
                recovery_offset_bytes: None,
            }
        })
        .collect();
    let mut identity = ArrayIdentity::of(first);
    identity.events = found.iter().map(|f| f.superblock.events).max().unwrap_or(0);
    MemberSetDetail {
        identity,
        member_bytes: first.required_member_bytes(),
        members,
        stale: Vec::new(),
        spares: spares
            .iter()
            .map(|m| m.path.display().to_string())
            .collect(),
        serve: format!("refused: {forked}"),
    }
}

fn found_labels(found: &[crate::assemble::Found], positions: &[usize]) -> Vec<String> {
    positions
        .iter()
        .map(|&i| found[i].label.display().to_string())
        .collect()
}

/// One line: whether `serve` starts, whole or degraded, and what it does first.
fn serve_outlook(verdict: &Verdict, stale: &[String], found: &[crate::assemble::Found]) -> String {
    let newest = &verdict.newest;
    let geometry = newest.geometry();
    let tolerance = format!(
        "{} tolerates {} missing",
        geometry.level,
        geometry.tolerated_missing()
    );
    let without = if !verdict.survives() {
        let force = crate::assemble::forced_verdict(found, verdict)
            .map(|(_, trusted)| {
                format!(
                    ", or `paraid serve --force` starts it from {}, the last to leave (with --read-only, to look \
                     first without writing)",
                    found_labels(found, &trusted).join(", ")
                )
            })
            .unwrap_or_default();
        format!(
            "refused: slots {:?} have no member ({tolerance}); give the missing members{force}",
            verdict.missing_slots
        )
    } else {
        let mut line = if verdict.missing_slots.is_empty() {
            "starts with every member".to_string()
        } else {
            format!(
                "starts degraded: slots {:?} missing ({tolerance}); a spare or `paraid add` rebuilds them",
                verdict.missing_slots
            )
        };
        let rebuilding: Vec<usize> = (0..newest.members)
            .filter(|&s| {
                newest.slots[s].state == SlotState::Rebuilding
                    && !verdict.missing_slots.contains(&s)
            })
            .collect();
        if !rebuilding.is_empty() {
            line += &format!("; resumes rebuilding slots {rebuilding:?} from their checkpoints");
        }
        if newest.state == ArrayState::Dirty {
            line += match (newest.ppl_bytes > 0, newest.bitmap_chunk_bytes > 0) {
                (true, _) => {
                    "; it was not stopped cleanly (or is running): the log's entries are recovered before it \
                     serves and the dirty regions resynced while it serves"
                }
                (false, true) => {
                    "; it was not stopped cleanly (or is running): the dirty regions are resynced while it serves"
                }
                (false, false) => "; it was not stopped cleanly (or is running)",
            };
        }
        line
    };
    if stale.is_empty() {
        without
    } else {
        format!(
            "refused: {} stale (missed writes while out of the array); left out, the array {}; `paraid add` \
             of a stale member to the running array re-adds it to its slot (rebuilt only where written since, \
             when the bitmap kept track: `re_add_from_bitmap`) or makes it a spare that is rebuilt",
            stale.join(", "),
            without.strip_prefix("refused: ").map_or(without.clone(), |r| format!("is still refused: {r}"))
        )
    }
}
