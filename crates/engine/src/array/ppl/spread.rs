//! RAID5: which ring a round puts each entry on, so that the round writes fewer records.
//!
//! Why an entry may leave the P member's ring: recovery uses an entry's partial parity only to solve a missing
//! member's chunk that the entry counts as unmodified (`recover_run`). With a chunk it counts as modified missing,
//! that chunk is solved from the parity as found, whatever the entry holds; with the P member missing, the data
//! are all there and there is no parity to rewrite. So, RAID5 tolerating one missing member at restart, the entry
//! is needed exactly when its ring's member is present if the ring is the P member's or that of a member whose
//! chunk the entry counts as modified: either one will do. On drives bound by their request rate, each record is
//! one request more per round and member, and a round of eight random small writes over five members touches
//! about four P members, but about two and a half members when each entry may also go to its written chunk's
//! member (docs/reliability.md, "Entries off the parity ring (stop 44)").
//!
//! The hazard this must not open: a stripe's newest entry on a ring whose member is missing at restart while an
//! older live entry of the stripe sits on a present ring. Recovery would apply the older one, whose partial
//! parity holds a chunk the newer write changed since, and solve the missing chunk from it. Hence the rule: an
//! entry goes off the P member's ring, to member x's, only if every live entry of its stripe is on x's ring. An
//! entry on the P member's ring is always allowed: with the P member missing, recovery has nothing to rewrite.
//! Per stripe the log remembers the rings that may hold its live entries (`Placed`), conservatively: a round
//! given up or failed keeps its rings counted until the stripe has no live entry left.
//!
//! Journal mode's data entries stay where they are (on the P member's ring and their chunk's member's), and a
//! stripe with one live keeps its partial parity entries on the P member's ring: the rule above counts the data
//! entries' rings among the stripe's live ones. Without it, a newer partial parity entry moved to a member that is
//! missing at restart would leave an older data entry of the stripe to decide its pages (rolled forward over what
//! the newer write put there).
//!
//! RAID6 keeps its entries where they are: PP and QP on the P and Q members (each missing pair needs the half on
//! a present parity member; `parts_on`).

use super::*;

/// Per stripe (`LogState::placed`): the rings that may hold its live entries.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Placed {
    /// Member slots (bits) whose rings got an entry of the stripe since it last had none live.
    rings: u64,
    /// The newest round that holds one (0: none yet).
    seq: u64,
    /// Rounds laid out with one that have not taken their sequence number yet.
    pending: u32,
}

impl Placed {
    pub(super) fn live(&self, retired: u64) -> bool {
        self.pending > 0 || (self.seq != 0 && self.seq >= retired)
    }
}

impl Ppl {
    /// Chooses the ring of every entry of the round (RAID5 with `spread`): each stripe's entries go together,
    /// to the P member's ring or to one of the rings the rule allows, chosen greedily so that the round uses as
    /// few rings as it can. Falls back to the P members' rings if the choice would put more on one member than
    /// a round may. Marks the stripes as pending (`settle` or `unsettle` after).
    pub(super) fn spread_round(&self, array: &Array, st: &mut LogState, taken: &mut [Submission]) {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let retired = st.retired_seq;
        // Units: the stripes of the round, each with the rings its entries may all go to.
        // (stripe, P slot, allowed rings)
        let mut units: Vec<(u64, usize, u64)> = Vec::new();
        // Journal mode: per stripe of the round, the rings its data entries go to (they are not moved).
        let mut data_rings: Vec<(u64, u64)> = Vec::new();
        for e in taken.iter().flat_map(|s| &s.entries) {
            if e.data_index.is_some() {
                let rings = entry_rings(e);
                match data_rings.iter_mut().find(|d| d.0 == e.stripe) {
                    Some(d) => d.1 |= rings,
                    None => data_rings.push((e.stripe, rings)),
                }
                continue;
            }
            if !movable(e) {
                continue;
            }
            let p = g.stripe_member(e.stripe, k);
            debug_assert_eq!(
                e.slots[0],
                Some(p),
                "entries come to a round on their P member's ring"
            );
            debug_assert!(e.slots[1].is_none() && e.slots[2].is_none());
            let modified_rings = (0..k)
                .filter(|i| e.modified & (1 << i) != 0)
                .map(|i| g.stripe_member(e.stripe, i))
                .filter(|&m| array.is_active(m))
                .fold(0u64, |m, slot| m | (1 << slot));
            match units.iter_mut().find(|u| u.0 == e.stripe) {
                Some(u) => u.2 &= modified_rings,
                None => units.push((e.stripe, p, modified_rings)),
            }
        }
        let data_rings_of =
            |stripe: u64| data_rings.iter().find(|d| d.0 == stripe).map_or(0, |d| d.1);
        for u in &mut units {
            let live = st
                .placed
                .get(&u.0)
                .filter(|pl| pl.live(retired))
                .map_or(0, |pl| pl.rings);
            // Off the P ring only to the one ring every live entry is on, this round's data entries counted.
            let live = live | data_rings_of(u.0);
            u.2 = match live.count_ones() {
                0 => u.2,
                1 => u.2 & live,
                _ => 0,
            };
            u.2 |= 1 << u.1;
        }
        // Greedy cover: the ring most of the unplaced stripes may go to, until every stripe has one.
        let mut chosen: Vec<Option<usize>> = vec![None; units.len()];
        while chosen.iter().any(|c| c.is_none()) {
            let mut counts = vec![0u32; g.members];
            for (u, c) in units.iter().zip(&chosen) {
                if c.is_none() {
                    for (slot, n) in counts.iter_mut().enumerate() {
                        *n += ((u.2 >> slot) & 1) as u32;
                    }
                }
            }
            // Ties go round the members with the rounds: a fixed order (the lowest slot first) gave the low
            // members most of the records of writers one at a time, and a drive at its request limit sets the
            // array's pace by its busiest member.
            let turn = (st.next_seq % g.members as u64) as usize;
            let best = (0..g.members)
                .max_by_key(|&slot| {
                    (
                        counts[slot],
                        std::cmp::Reverse((slot + g.members - turn) % g.members),
                    )
                })
                .expect("members");
            for (u, c) in units.iter().zip(chosen.iter_mut()) {
                if c.is_none() && u.2 & (1 << best) != 0 {
                    *c = Some(best);
                }
            }
        }
        let ring_of = |stripe: u64| {
            let n = units.iter().position(|u| u.0 == stripe).expect("unit");
            chosen[n].expect("chosen")
        };
        let mut pages = vec![0u64; g.members];
        for e in taken.iter().flat_map(|s| &s.entries) {
            if e.data_index.is_some() {
                for slot in e.slots.iter().flatten() {
                    pages[*slot] += record_entry_pages(&(e, e.parts_on(*slot, false)));
                }
            } else if movable(e) {
                pages[ring_of(e.stripe)] += record_entry_pages(&(e, e.parts_on(0, false)));
            }
        }
        for sub in taken.iter() {
            for (slot, more) in sub.reserve.iter().enumerate() {
                pages[slot] += more;
            }
        }
        let spread = pages.iter().all(|&p| p <= self.round_budget_pages);
        if spread {
            for e in taken.iter_mut().flat_map(|s| s.entries.iter_mut()) {
                if movable(e) {
                    e.slots[0] = Some(ring_of(e.stripe));
                }
            }
        }
        for (u, c) in units.iter().zip(&chosen) {
            let ring = if spread { c.expect("chosen") } else { u.1 };
            place(st, u.0, (1 << ring) | data_rings_of(u.0), retired);
        }
        // Stripes with data entries alone in this round.
        for &(stripe, rings) in &data_rings {
            if !units.iter().any(|u| u.0 == stripe) {
                place(st, stripe, rings, retired);
            }
        }
        if spread {
            let off_parity = units
                .iter()
                .zip(&chosen)
                .filter(|(u, c)| **c != Some(u.1))
                .count() as u64;
            self.add_stats(|s| s.entries_off_parity += off_parity);
        }
    }

    /// The round of `taken` (laid out by `spread_round`) took sequence number `round`.
    pub(super) fn settle(&self, st: &mut LogState, taken: &[Submission], round: u64) {
        self.each_stripe(st, taken, |pl| {
            pl.pending -= 1;
            pl.seq = pl.seq.max(round);
        });
    }

    /// The round of `taken` (laid out by `spread_round`) was given up before it took a sequence number: its rings
    /// stay counted (the submissions go out in a later round, laid out again).
    pub(super) fn unsettle(&self, st: &mut LogState, taken: &[Submission]) {
        self.each_stripe(st, taken, |pl| pl.pending -= 1);
    }

    /// Puts the entries of a round given up back on their P members' rings, as they came: the next leader admits
    /// them by those rings' budgets and lays them out again.
    pub(super) fn back_on_parity_rings(&self, taken: &mut [Submission]) {
        let k = self.geometry.data_per_stripe();
        for e in taken.iter_mut().flat_map(|s| s.entries.iter_mut()) {
            if movable(e) {
                e.slots[0] = Some(self.geometry.stripe_member(e.stripe, k));
            }
        }
    }

    fn each_stripe(&self, st: &mut LogState, taken: &[Submission], mut f: impl FnMut(&mut Placed)) {
        let mut seen: Vec<u64> = Vec::new();
        for e in taken.iter().flat_map(|s| &s.entries) {
            if !counts_in_placed(e) || seen.contains(&e.stripe) {
                continue;
            }
            seen.push(e.stripe);
            let pl = st
                .placed
                .get_mut(&e.stripe)
                .expect("placed by spread_round");
            debug_assert!(pl.pending > 0);
            f(pl);
        }
    }
}

/// The rings an entry of a round goes to (bits by slot).
fn entry_rings(e: &Entry) -> u64 {
    e.slots
        .iter()
        .flatten()
        .fold(0, |rings, slot| rings | (1 << slot))
}

/// A partial parity entry on a ring (its P member's as it comes): `spread_round` may move it.
fn movable(e: &Entry) -> bool {
    e.data_index.is_none() && e.slots[0].is_some()
}

/// Whether `spread_round` records the stripe of `e` in `LogState::placed` (and `settle`/`unsettle` find it there):
/// a partial parity entry on a ring, or a data entry on any.
fn counts_in_placed(e: &Entry) -> bool {
    movable(e) || (e.data_index.is_some() && entry_rings(e) != 0)
}

/// Counts a round laid out with entries of `stripe` on `rings` (pending until it settles).
fn place(st: &mut LogState, stripe: u64, rings: u64, retired: u64) {
    let pl = st.placed.entry(stripe).or_default();
    if !pl.live(retired) {
        *pl = Placed::default();
    }
    pl.rings |= rings;
    pl.pending += 1;
}
