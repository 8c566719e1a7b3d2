//! Consistency check and repair (md's `check` / `repair`), and the stripe verification the resync shares.
//!
//! Stripes are read in batches under their stripe locks (foreground writes to them wait; others proceed) and
//! verified with the parity backend's `check_batch`. RAID6 names the bad chunk of a stripe with one bad chunk
//! (and, repairing, rebuilds just that chunk); a RAID6 stripe with more than one bad chunk and a RAID5 stripe
//! whose parity does not match get their parity recomputed from the data (the data cannot be told wrong from
//! right there). RAID1/10 compare every copy with the first and copy the first over the others.

use paraid_parity::{CheckOutcome, StripeGen};

use super::Array;
use crate::buf::{with_batch_scratch, with_scratch, Carver};
use crate::error::EngineError;
use crate::layout::Level;
use crate::member::IoReq;

/// Scratch one batch may read into.
const BATCH_BYTES: u64 = 8 << 20;
/// Stripes per batch at most (the locks of a batch are held while it is read, checked and fixed).
const BATCH_STRIPES: u64 = 64;
/// Findings kept for `check_findings` (the counts in `Progress` are exact beyond it).
const FINDINGS_KEPT: usize = 4096;

/// What verification does about a stripe that does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fix {
    /// Count only.
    Nothing,
    /// Resync after an unclean stop: parity from data, copies from the first.
    Resync,
    /// Repair after a check: RAID6 rebuilds a named bad chunk, else as `Resync`.
    Repair,
}

/// One stripe a check found wrong.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckFinding {
    /// Stripe (RAID5/6 row, RAID1/10 chunk) and the array byte it starts at.
    pub stripe: u64,
    pub offset_bytes: u64,
    /// "bad chunk" (RAID6 named it), "parity mismatch", or "copies differ".
    pub kind: &'static str,
    /// The member holding the bad chunk (RAID6 "bad chunk"), or the first copy that differs (RAID1/10).
    pub slot: Option<usize>,
    pub repaired: bool,
}

/// What one batch found and did.
#[derive(Debug, Default)]
pub(super) struct BatchResult {
    pub stripes: u64,
    pub mismatches: u64,
    pub repaired: u64,
    pub findings: Vec<CheckFinding>,
}

/// Stripes per batch for this geometry.
pub(super) fn batch_stripes(array: &Array) -> u64 {
    let g = array.geometry;
    let per_stripe = g.members as u64 * g.chunk_bytes;
    (BATCH_BYTES / per_stripe).clamp(1, BATCH_STRIPES)
}

/// Reads stripes `first..first + count` under their locks, verifies them and fixes them as `fix` says.
pub(super) fn verify_stripes(
    array: &Array,
    first: u64,
    count: u64,
    fix: Fix,
) -> Result<BatchResult, EngineError> {
    let _guard = array.locks.lock(first, count);
    if array.geometry.level.has_parity() {
        verify_parity(array, first, count, fix)
    } else {
        verify_copies(array, first, count, fix)
    }
}

fn verify_parity(
    array: &Array,
    first: u64,
    count: u64,
    fix: Fix,
) -> Result<BatchResult, EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let np = g.level.parity_chunks();
    let has_q = g.level == Level::Raid6;
    let width = k + np;
    let cb = g.chunk_bytes as usize;
    let mut result = BatchResult {
        stripes: count,
        ..BatchResult::default()
    };
    // In the parity backend's memory where it has some: a GPU checks the batch in place.
    let scratch_bytes = count as usize * (width + np) * cb;
    with_batch_scratch(array.parity.as_ref(), scratch_bytes, |scratch| {
        let mut carver = Carver::new(scratch);
        let mut cells: Vec<Vec<&mut [u8]>> = (0..count)
            .map(|_| (0..width).map(|_| carver.take(cb)).collect())
            .collect();
        let mut fresh: Vec<Vec<&mut [u8]>> = (0..count)
            .map(|_| (0..np).map(|_| carver.take(cb)).collect())
            .collect();
        // A resync of a degraded array leaves the missing members' chunks out (a check refuses to start on one,
        // and stops when a member fails).
        let missing: Vec<Vec<usize>> = (0..count)
            .map(|j| {
                let s = first + j;
                (0..width)
                    .filter(|i| fix == Fix::Resync && !array.is_active(g.stripe_member(s, *i)))
                    .collect()
            })
            .collect();
        {
            let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(count as usize * width);
            for (j, stripe_cells) in cells.iter_mut().enumerate() {
                let s = first + j as u64;
                for (i, cell) in stripe_cells.iter_mut().enumerate() {
                    if missing[j].contains(&i) {
                        continue;
                    }
                    let member = g.stripe_member(s, i);
                    reqs.push(IoReq::read(member, array.member_offset(s, 0), cell));
                }
            }
            array.run(reqs)?;
        }
        let mut outcomes = vec![CheckOutcome::Consistent; count as usize];
        {
            let whole: Vec<usize> = (0..count as usize)
                .filter(|j| missing[*j].is_empty())
                .collect();
            let views: Vec<Vec<&[u8]>> = whole
                .iter()
                .map(|j| cells[*j].iter().map(|b| &**b).collect())
                .collect();
            let stripes: Vec<&[&[u8]]> = views.iter().map(|v| &v[..]).collect();
            let mut whole_outcomes = vec![CheckOutcome::Consistent; whole.len()];
            array
                .parity
                .check_batch(&stripes, has_q, &mut whole_outcomes);
            for (j, outcome) in whole.iter().zip(whole_outcomes) {
                outcomes[*j] = outcome;
            }
        }
        for (j, miss) in missing.iter().enumerate().filter(|(_, m)| !m.is_empty()) {
            if miss.len() >= np {
                continue; // no redundancy left to check against: a rebuild recomputes the stripe whole
            }
            if degraded_parity_differs(array, &mut cells[j], &mut fresh[j], miss).map_err(
                |source| EngineError::ReconstructStripe {
                    stripe: first + j as u64,
                    source,
                },
            )? {
                outcomes[j] = CheckOutcome::Mismatch;
            }
        }
        // Decide per stripe: which chunks get rewritten (`Some(i)`: the named chunk; `None`: the parity).
        let mut rewrite: Vec<(usize, Option<usize>)> = Vec::new();
        for (j, outcome) in outcomes.iter().enumerate() {
            let s = first + j as u64;
            let (kind, named) = match *outcome {
                CheckOutcome::Consistent => continue,
                CheckOutcome::BadChunk(i) if fix != Fix::Resync => ("bad chunk", Some(i)),
                CheckOutcome::BadChunk(_) | CheckOutcome::Mismatch => ("parity mismatch", None),
            };
            let slot = named.map(|i| g.stripe_member(s, i));
            result.mismatches += 1;
            let repaired = fix != Fix::Nothing;
            if repaired {
                result.repaired += 1;
                rewrite.push((j, named));
            }
            if fix != Fix::Resync {
                match slot {
                    Some(slot) => log::warn!(
                        "check: stripe {s}: chunk on member {} (slot {slot}) is wrong{}",
                        array.io.label(slot),
                        if repaired { "; rewritten" } else { "" }
                    ),
                    None => log::warn!(
                        "check: stripe {s}: parity does not match the data{}",
                        if repaired { "; parity rewritten" } else { "" }
                    ),
                }
            }
            result.findings.push(CheckFinding {
                stripe: s,
                offset_bytes: s * g.stripe_bytes(),
                kind,
                slot,
                repaired,
            });
        }
        if rewrite.is_empty() {
            return Ok(result);
        }
        // Compute the replacements: a named chunk from the rest of its stripe, parity from the data.
        for (j, named) in &rewrite {
            let stripe_cells = &mut cells[*j];
            if let Some(i) = named {
                let mut refs: Vec<&mut [u8]> = stripe_cells.iter_mut().map(|c| &mut **c).collect();
                array
                    .parity
                    .recover(&mut refs, has_q, &[*i])
                    .map_err(|source| EngineError::ReconstructStripe {
                        stripe: first + *j as u64,
                        source,
                    })?;
            } else {
                let (data, _) = stripe_cells.split_at(k);
                let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
                let (p, q) = fresh[*j].split_at_mut(1);
                // The generator's borrow of `fresh[*j]` ends with this statement: the copy below reads it.
                array.parity.gen_batch(&mut [StripeGen {
                    data: &data,
                    p: &mut *p[0],
                    q: q.first_mut().map(|q| &mut **q),
                }]);
                for (n, parity) in fresh[*j].iter().enumerate() {
                    stripe_cells[k + n].copy_from_slice(parity);
                }
            }
        }
        let regions = array.integrity.begin_internal_write(array, first, count)?;
        let mut reqs: Vec<IoReq<'_>> = Vec::new();
        for (j, named) in &rewrite {
            let s = first + *j as u64;
            let chunks: Vec<usize> = match named {
                Some(i) => vec![*i],
                None => (k..width).filter(|i| !missing[*j].contains(i)).collect(),
            };
            for i in chunks {
                // FUA: what a read returned before the fix must not come back after a power loss.
                reqs.push(IoReq::write(
                    g.stripe_member(s, i),
                    array.member_offset(s, 0),
                    cells[*j][i],
                    true,
                ));
            }
        }
        let written = array.run(reqs);
        array.integrity.end_internal_write(regions);
        written?;
        Ok(result)
    })
}

/// A RAID6 stripe with one member missing (resync after an unclean stop): the missing chunk is solved the way
/// a read solves it, and the parity present is compared with parity computed from the data so completed. A
/// full-stripe write torn by the crash leaves P and Q disagreeing; rewriting the one that differs keeps what
/// reads return and makes the stripe consistent again, so a second failure or the rebuild cannot turn the
/// disagreement into wrong data elsewhere. Returns whether present parity differs.
fn degraded_parity_differs(
    array: &Array,
    cells: &mut [&mut [u8]],
    fresh: &mut [&mut [u8]],
    missing: &[usize],
) -> Result<bool, paraid_parity::ParityError> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let has_q = g.level == Level::Raid6;
    {
        let mut refs: Vec<&mut [u8]> = cells.iter_mut().map(|c| &mut **c).collect();
        array.parity.recover(&mut refs, has_q, missing)?;
    }
    let (data, parity) = cells.split_at(k);
    let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
    {
        let (p, q) = fresh.split_at_mut(1);
        let mut gens = [StripeGen {
            data: &data,
            p: &mut *p[0],
            q: q.first_mut().map(|q| &mut **q),
        }];
        array.parity.gen_batch(&mut gens);
    }
    Ok(parity
        .iter()
        .zip(fresh.iter())
        .enumerate()
        .any(|(n, (stored, want))| !missing.contains(&(k + n)) && **stored != **want))
}

fn verify_copies(
    array: &Array,
    first: u64,
    count: u64,
    fix: Fix,
) -> Result<BatchResult, EngineError> {
    let g = array.geometry;
    let copies = g.copies();
    let cb = g.chunk_bytes as usize;
    let mut result = BatchResult {
        stripes: count,
        ..BatchResult::default()
    };
    with_scratch(count as usize * copies * cb, |scratch| {
        let mut carver = Carver::new(scratch);
        let mut cells: Vec<Vec<&mut [u8]>> = (0..count)
            .map(|_| (0..copies).map(|_| carver.take(cb)).collect())
            .collect();
        {
            let mut reqs: Vec<IoReq<'_>> = Vec::new();
            for (j, chunk_cells) in cells.iter_mut().enumerate() {
                let chunk = first + j as u64;
                for (copy, cell) in chunk_cells.iter_mut().enumerate() {
                    let addr = g.chunk_copy(chunk, copy);
                    if array.is_active(addr.member) {
                        reqs.push(IoReq::read(
                            addr.member,
                            array.member_offset(addr.row, 0),
                            cell,
                        ));
                    }
                }
            }
            array.run(reqs)?;
        }
        let mut rewrite: Vec<(u64, usize, Vec<usize>)> = Vec::new();
        for (j, chunk_cells) in cells.iter().enumerate() {
            let chunk = first + j as u64;
            let present: Vec<usize> = (0..copies)
                .filter(|c| array.is_active(g.chunk_copy(chunk, *c).member))
                .collect();
            let Some((&source, others)) = present.split_first() else {
                continue;
            };
            let differ: Vec<usize> = others
                .iter()
                .copied()
                .filter(|c| chunk_cells[*c] != chunk_cells[source])
                .collect();
            if differ.is_empty() {
                continue;
            }
            result.mismatches += 1;
            let repaired = fix != Fix::Nothing;
            let slot = g.chunk_copy(chunk, differ[0]).member;
            if fix != Fix::Resync {
                log::warn!(
                    "check: chunk {chunk}: the copy on member {} (slot {slot}) differs from the first{}",
                    array.io.label(slot),
                    if repaired { "; rewritten from it" } else { "" }
                );
            }
            result.findings.push(CheckFinding {
                stripe: chunk,
                offset_bytes: chunk * g.chunk_bytes,
                kind: "copies differ",
                slot: Some(slot),
                repaired,
            });
            if repaired {
                result.repaired += 1;
                rewrite.push((chunk, source, differ));
            }
        }
        if fix == Fix::Resync {
            // Copies found equal may be equal only in the members' caches: a write since the unclean stop that
            // covered a chunk whose copies differ on the media hides the difference until a power loss drops
            // it, and a copy left stale would then come back (concurrent simulation, seed 111054). Made durable
            // here, under the chunks' locks, the copies are equal on the media too before the region counts as
            // resynced.
            let flushes: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
            array.run(flushes)?;
        }
        if rewrite.is_empty() {
            return Ok(result);
        }
        let regions = array.integrity.begin_internal_write(array, first, count)?;
        let mut reqs: Vec<IoReq<'_>> = Vec::new();
        for (chunk, source, differ) in &rewrite {
            let j = (chunk - first) as usize;
            for &copy in differ {
                let addr = g.chunk_copy(*chunk, copy);
                // FUA: what a read returned before the fix must not come back after a power loss.
                reqs.push(IoReq::write(
                    addr.member,
                    array.member_offset(addr.row, 0),
                    cells[j][*source],
                    true,
                ));
            }
        }
        let written = array.run(reqs);
        array.integrity.end_internal_write(regions);
        written?;
        Ok(result)
    })
}

impl Array {
    /// Starts a consistency check of every stripe in the background (md's `check`; with `repair`, md's
    /// `repair`). Progress kind "check" or "repair": `mismatches` counts stripes found wrong, `repaired` those
    /// rewritten; the final figures are in `last_result()`, the stripes found in `check_findings()`.
    pub fn start_check(&self, repair: bool) -> Result<(), EngineError> {
        if repair {
            self.refuse_if_read_only("repair")?;
        }
        let kind = if repair { "repair" } else { "check" };
        let g = self.geometry;
        if g.level == Level::Raid0 {
            return Err(EngineError::StartJob {
                kind,
                why: "RAID0 keeps no redundancy to check against".to_string(),
            });
        }
        if let Some(slot) = (0..g.members).find(|s| !self.is_active(*s)) {
            return Err(EngineError::StartJob {
                kind,
                why: format!(
                    "slot {slot} is {}: check a degraded array after its rebuild",
                    self.slot_state(slot)
                ),
            });
        }
        // A second check would only repeat the first (md answers EBUSY); one queued behind a rebuild or resync is
        // fine: it runs when they are done.
        if let Some(other) = self
            .jobs
            .kinds_underway()
            .into_iter()
            .find(|k| matches!(*k, "check" | "repair"))
        {
            return Err(EngineError::StartJob {
                kind,
                why: format!(
                    "a {other} is already under way; `status` shows its progress and result"
                ),
            });
        }
        let fix = if repair { Fix::Repair } else { Fix::Nothing };
        let stripes = g.stripes();
        let stripe_bytes = g.stripe_bytes();
        self.queue_job(kind, None, g.array_bytes(), false, move |array, mut job| {
            array.integrity.clear_findings();
            let batch = batch_stripes(array);
            let mut s = 0;
            while s < stripes {
                if job.stopping() || job.preempted() {
                    job.finish("interrupted");
                    return;
                }
                if (0..g.members).any(|slot| !array.is_active(slot)) {
                    job.finish("aborted: a member failed");
                    return;
                }
                let count = batch.min(stripes - s);
                match verify_stripes(array, s, count, fix) {
                    Ok(r) => {
                        job.add_mismatches(r.mismatches);
                        job.add_repaired(r.repaired);
                        array.integrity.add_findings(r.findings, FINDINGS_KEPT);
                    }
                    Err(e) => {
                        log::error!("{kind} stopped at stripe {s}: {e}");
                        job.finish(&format!("aborted: {e}"));
                        return;
                    }
                }
                job.advance(count * stripe_bytes);
                job.throttle();
                s += count;
            }
            job.finish("completed");
        })
    }

    /// The stripes the last (or running) check found wrong, in order (at most the first 4096).
    pub fn check_findings(&self) -> Vec<CheckFinding> {
        self.integrity.findings()
    }
}
