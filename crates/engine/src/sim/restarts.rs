//! Steps that stop the array: power losses (also between the member writes of one request), kills and
//! restarts, re-assembly with stale or missing members, and the audits that follow them.

use super::*;
use crate::buf::AlignedBuf;

impl Run<'_> {
    /// Whether losing power now is a case the configuration leaves out (a degraded array).
    pub(super) fn crash_left_out(&self) -> bool {
        self.g.level != Level::Raid0 && self.degraded() && !self.cfg.classes.crash_degraded
    }

    /// Starts a write that the power (or the process) will cut after `cut_after` member writes; returns whether
    /// it was cut short.
    pub(super) fn write_cut_short(&mut self, cut_after: u64, fua: bool) -> bool {
        self.io.inner().cut_power_after_writes(cut_after);
        let (offset, len) = self.extent();
        // Page-aligned like a frontend's buffers: where the extent starts on a page, whole chunks go out from it
        // directly (write/parity.rs), elsewhere through scratch, so both paths run.
        let mut buf = crate::buf::AlignedBuf::zeroed(len);
        self.rng.fill(&mut buf[..len]);
        let data = &buf[..len];
        self.report.writes += 1;
        match self.front().write(offset, data, fua) {
            Ok(()) => {
                self.note(format!(
                    "write {offset}+{len} fua={fua} completed before the cut after {cut_after} member writes"
                ));
                self.model
                    .write(offset, data, WriteOutcome::Acked { durable: fua });
                false
            }
            Err(e) => {
                self.note(format!(
                    "write {offset}+{len} fua={fua} cut after {cut_after} member writes: {e}"
                ));
                self.model.write(offset, data, WriteOutcome::Failed);
                true
            }
        }
    }

    /// Power loss, now or between two member writes of a write request.
    pub(super) fn crash(&mut self, mid_request: bool) -> Result<(), String> {
        if self.crash_left_out() {
            self.note("power loss left out: degraded array".into());
            return Ok(());
        }
        // What the engine decided while the power was on; whatever it does with the I/O errors of the power cut
        // never reaches the members.
        self.note_evictions_before_drop();
        let mut interrupted = false;
        if mid_request {
            let cut_after = self.rng.below(2 * self.g.members as u64 + 2);
            let fua = self.rng.one_in(4);
            interrupted = if self.cfg.concurrent && self.rng.one_in(2) {
                self.batch_cut_short(4 * cut_after)?
            } else {
                self.write_cut_short(cut_after, fua)
            };
            if interrupted {
                self.report.power_cuts_mid_request += 1;
            }
        }
        let crash_seed = self.rng.next_u64();
        self.lose_power(crash_seed, interrupted)
    }

    /// The power goes (if it has not yet): each unflushed write is kept, dropped or torn, drawn from
    /// `crash_seed`, and the array is re-assembled from what the members hold.
    pub(super) fn lose_power(&mut self, crash_seed: u64, interrupted: bool) -> Result<(), String> {
        self.io.inner().cut_power();
        // Held writes not yet written are lost with the power (their member writes fail from here on), and so is
        // the store they were kept in (shared memory).
        let _ = self.close_write_back();
        self.held_region = None;
        self.report.crashes += 1;
        let r = self.io.inner().crash(crash_seed, CrashPolicy::Random);
        self.report.crash_writes_kept += r.writes_kept;
        self.report.crash_writes_dropped += r.writes_dropped;
        self.report.crash_writes_torn += r.writes_torn;
        self.note(format!(
            "power loss: {} unflushed writes kept, {} dropped, {} torn",
            r.writes_kept, r.writes_dropped, r.writes_torn
        ));
        self.reassemble(r.images, interrupted)
    }

    /// The process dies between requests, or (half the time) in the middle of one: every completed member write
    /// survives.
    pub(super) fn kill(&mut self) -> Result<(), String> {
        self.note_evictions_before_drop();
        let mut interrupted = false;
        if self.crash_left_out() {
            self.note("kill left out: degraded array".into());
            return Ok(());
        }
        if self.rng.one_in(2) {
            let cut_after = self.rng.below(2 * self.g.members as u64 + 2);
            interrupted = if self.cfg.concurrent && self.rng.one_in(2) {
                self.batch_cut_short(4 * cut_after)?
            } else {
                self.write_cut_short(cut_after, false)
            };
        } else {
            self.note("kill between requests".to_string());
        }
        self.io.inner().cut_power();
        // Held writes die with the process (their member writes fail from here on).
        let _ = self.close_write_back();
        self.report.kills += 1;
        // Completed writes sit in the kernel's cache: all of them survive the process. So does every write
        // answered, flushed or not: write-back's held writes too, kept in a store the next assembly writes from
        // (held.rs).
        let r = self.io.inner().crash(0, CrashPolicy::KeepAll);
        self.after_kill = true;
        let result = self.reassemble(r.images, interrupted);
        self.after_kill = false;
        result
    }

    /// Adds the log's stream figures, the stripe cache's and the reads steered around a slow member of the
    /// running array to the report (before it is dropped).
    pub(super) fn note_log_streams(&mut self) {
        if let Some(array) = self.array.as_ref() {
            let log = array.integrity();
            self.report.log_rides += log.log_rides;
            self.report.log_entries_off_parity += log.log_entries_off_parity;
            self.report.log_stream_extensions += log.log_stream_extensions;
            self.report.log_data_first += log.log_data_first;
            self.report.log_parity_alone += log.log_parity_alone;
            self.report.log_not_lone += log.log_not_lone;
            self.report.log_markers_skipped += log.log_markers_skipped;
            self.report.log_cpu_busy += log.log_cpu_busy;
            self.report.log_ring_full_flushes += log.log_retire_flushes;
            let detail = array.detail();
            self.report.stripe_cache_hits += detail.stripe_cache.hits;
            self.report.stripe_cache_misses += detail.stripe_cache.misses;
            self.report.steered_reads += detail.slow_member.steered_reads;
        }
    }

    /// Clean stop (a kill if the stop fails) and re-assembly.
    pub(super) fn restart(&mut self) -> Result<(), String> {
        self.settle_write_back();
        self.note_evictions_before_drop();
        self.note_log_streams();
        // A clean stop writes what write-back holds first. One of those writes having failed (judged as a failed
        // request: only beyond the level's tolerance) fails the stop: what it held is lost, so nothing may count
        // as flushed.
        let held = match self.close_write_back() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.request_failed("a write held by write-back", &e)?;
                Err(format!("write-back: {e}"))
            }
        };
        let array = self.array.take().expect("the array runs between restarts");
        match held.and_then(|()| array.stop().map_err(|e| e.to_string())) {
            Ok(_) => {
                self.model.flushed();
                self.report.restarts += 1;
                self.note("clean stop".to_string());
                let images = self.io.inner().images();
                self.reassemble(images, false)
            }
            Err(e) => {
                if !self.beyond {
                    return Err(format!("stop failed within the level's tolerance: {e}"));
                }
                self.note(format!(
                    "stop failed ({e}): restarting from what the members hold"
                ));
                self.io.inner().cut_power();
                self.report.kills += 1;
                let r = self.io.inner().crash(0, CrashPolicy::KeepAll);
                self.reassemble(r.images, false)
            }
        }
    }

    /// Members the engine evicted carry an older event count than the others from then on.
    pub(super) fn note_evictions_before_drop(&mut self) {
        self.sync_slot_states();
        if let Some(array) = self.array.as_ref() {
            for slot in 0..self.g.members {
                if !self.gone[slot] && array.slot_state(slot) == SlotState::Faulty {
                    self.stale_behind[slot] = true;
                }
            }
        }
    }

    /// Brings the array back from `images` after a crash, kill or stop: failed members are left out (the admin
    /// pulled them), a stale member is offered first (refused, or re-added), then the whole array is read back
    /// before and after the background resync, and the members audited.
    pub(super) fn reassemble(
        &mut self,
        mut images: Vec<Option<Vec<u8>>>,
        cut_mid_request: bool,
    ) -> Result<(), String> {
        self.note_log_streams();
        let _ = self.close_write_back();
        self.array = None;
        self.lse_armed = false;
        self.report.faults += self.io.counts();
        self.report.virtual_delay += self.io.virtual_delay();
        images.truncate(self.g.members);
        for (slot, image) in images.iter_mut().enumerate() {
            if self.failed[slot] {
                self.stale[slot] = image.take();
                self.failed[slot] = false;
                self.gone[slot] = true;
                self.report.members_removed += 1;
            } else if self.gone[slot] {
                *image = None;
            }
        }
        self.beyond = false;

        let mut opts = self.assemble_options();
        if self.cfg.classes.stale_reattach {
            let candidates: Vec<usize> = (0..self.g.members)
                .filter(|s| self.stale_behind[*s] && self.stale[*s].is_some())
                .collect();
            // Staleness shows only next to a newer member: alone, an old member is all the array there is.
            let newer_present = images.iter().any(|i| i.is_some());
            if !candidates.is_empty() && newer_present && self.rng.one_in(2) {
                let slot = *self.rng.pick(&candidates);
                let mut with_stale = images.clone();
                with_stale[slot] = self.stale[slot].clone();
                // A re-added member is a rebuild target, not a source: only where the array runs without it.
                if self.cfg.classes.rebuild && self.g.survives(&self.gone) && self.rng.one_in(2) {
                    // Re-add: the stale member comes back as a rebuild target in its slot.
                    opts.re_add = true;
                    images = with_stale;
                    self.gone[slot] = false;
                    self.stale[slot] = None;
                    self.stale_behind[slot] = false;
                    self.report.re_adds += 1;
                    self.note(format!("stale member {slot} re-added"));
                } else {
                    let members = Arc::new(CrashMembers::from_images(with_stale.clone()));
                    let label = std::path::PathBuf::from(members.label(slot));
                    let attempt = assemble_io(members, self.assemble_options());
                    match attempt {
                        Err(EngineError::TrustStaleMember { slot: named, .. }) if named == slot => {
                            self.report.stale_refusals += 1;
                            self.note(format!("stale member {slot} offered back: refused"));
                        }
                        // The array failed when it left: refused too, naming it as what `force` would trust.
                        Err(EngineError::AssembleFailedArray {
                            force_would_trust, ..
                        }) if force_would_trust.contains(&label) => {
                            self.report.stale_refusals += 1;
                            self.note(format!(
                                "stale member {slot} offered back: refused (the array failed when it left; force \
                                 would trust it)"
                            ));
                            if self.rng.one_in(2) {
                                // The operator's `serve --force`: the member that left last is trusted again.
                                opts.force = true;
                                images = with_stale;
                                self.gone[slot] = false;
                                self.stale[slot] = None;
                                self.stale_behind[slot] = false;
                                self.report.forced += 1;
                                self.note(format!("stale member {slot} trusted by force"));
                            }
                        }
                        Err(e) => {
                            return Err(format!(
                                "stale member {slot} offered back: expected a refusal naming it, got: {e}"
                            ))
                        }
                        Ok(_) => {
                            return Err(format!(
                                "stale member {slot} (behind the others) was trusted"
                            ))
                        }
                    }
                }
            }
        }

        let survives = self.g.survives(&self.gone);
        // A read-only start does not write what write-back's store holds (held.rs): it would serve older values.
        if survives
            && !opts.re_add
            && !opts.force
            && self.read_only_rng.one_in(2)
            && !self.held_writes_pending()
        {
            self.read_only_look(&images)?;
        }
        let seed = SplitMix64::derive(
            self.seed,
            2 + self.report.restarts + self.report.crashes + self.report.kills,
        )
        .next_u64();
        self.io = member_stack(CrashMembers::from_images(images), seed, self.cfg);
        match assemble_io(self.io.clone(), opts) {
            Ok(array) => {
                if !survives {
                    return Err(format!(
                        "assembly accepted an array missing slots {:?}, beyond what {} survives",
                        self.gone_slots(),
                        self.g.level
                    ));
                }
                self.array = Some(array);
            }
            Err(e) => {
                if survives {
                    if let EngineError::TrustStaleMember {
                        events,
                        newest_events,
                        ..
                    } = &e
                    {
                        if cut_mid_request && events + 1 == *newest_events && !self.cfg.strict {
                            // Known engine bug: a power cut inside a superblock update leaves members one event
                            // apart, and assembly refuses the older ones. Counted; the seed ends here.
                            self.report.known_bug_hits += 1;
                            self.note(format!("known engine bug (torn superblock update): {e}"));
                            self.dead = true;
                            return Ok(());
                        }
                    }
                    return Err(format!("re-assembly failed: {e}"));
                }
                // Refused, as it must be: AssembleDegraded naming the missing slots, or (every member gone)
                // "no members present".
                self.report.beyond_tolerance_refusals += 1;
                self.note(format!("re-assembly refused beyond tolerance: {e}"));
                self.dead = true;
                return Ok(());
            }
        }
        for slot in 0..self.g.members {
            if self.gone[slot] {
                self.stale_behind[slot] = true;
            }
        }
        self.after_assembly()?;

        // A dirty array resyncs (and a re-added member rebuilds) in the background. The simulator waits for it
        // before reading: a read running beside the job would interleave member I/O with it, and the seed would no
        // longer replay exactly (row 4's resync test checks that reads before and after a resync agree). With
        // concurrent batches, half the time the read-back and a batch run beside the job instead.
        let beside_jobs = self.cfg.concurrent && self.rng.one_in(2);
        if !beside_jobs {
            self.settle_jobs_after_assembly()?;
        }
        // Page-aligned, as a frontend's buffer: whole chunks are read (and solved) right into it (read.rs).
        let mut all = AlignedBuf::zeroed(self.model.array_bytes() as usize);
        self.array()
            .read(0, &mut all)
            .map_err(|e| format!("reading the whole array back after re-assembly failed: {e}"))?;
        let blocks = match self.check_read_back(&all) {
            Ok((blocks, forgiven)) => {
                if forgiven > 0 {
                    self.report.write_hole_limit_blocks += forgiven;
                    self.note(format!(
                        "{forgiven} blocks of missing members, written at the crash, came back as neither old nor new \
                         (partial parity log limit)"
                    ));
                }
                blocks
            }
            Err(m) => {
                return Err(format!(
                    "after re-assembly (missing {:?}): {m}; {}",
                    self.gone_slots(),
                    self.diagnose(m.block)
                ))
            }
        };
        self.report.blocks_verified += blocks;
        self.note(format!(
            "re-assembled without {:?}: {blocks} blocks verified{}",
            self.gone_slots(),
            if beside_jobs {
                " (beside the background jobs)"
            } else {
                ""
            }
        ));
        if beside_jobs {
            self.batch()?;
            self.settle_jobs_after_assembly()?;
        }
        self.audit("after re-assembly")
    }

    /// Checks the whole array as read back after a restart against the model (which then holds what was read):
    /// the blocks checked, and how many of them were forgiven. Blocks of a parity array's missing members that a
    /// write was changing at the crash may come back as neither old nor new: the partial parity log protects the
    /// rest of the stripe, not the missing chunk being written (docs/reliability.md). Unless strict, such blocks
    /// are counted, not failed.
    fn check_read_back(&mut self, all: &[u8]) -> Result<(u64, u64), model::Mismatch> {
        let g = self.g;
        let gone = self.gone.clone();
        let strict = self.cfg.strict;
        let forgive =
            move |block: u64| g.level.has_parity() && gone[g.map(block * PAGE_BYTES, 0).member];
        if self.after_kill {
            // Forgiven as after a power loss (a block of a missing member written since the last flush), but every
            // other block must hold what was answered: a kill keeps every member write that completed.
            let forgive = move |block: u64| !strict && forgive(block);
            return self.model.check_after_kill_forgiving(all, forgive);
        }
        if strict {
            self.model.check_after_crash(all).map(|b| (b, 0))
        } else {
            self.model.check_after_crash_forgiving(all, forgive)
        }
    }

    /// The operator's `serve --read-only` before the real start: the same member images served read-only must read
    /// back as the model says, the values pinned here being what the read-write start must then serve too (the
    /// log's recovery runs in memory, so blocks at the write-hole limit come back the same both times); only a
    /// RAID5/6 array without the log may be refused (dirty with a member missing); and not one byte of any member
    /// may change.
    fn read_only_look(&mut self, images: &[Option<Vec<u8>>]) -> Result<(), String> {
        let members = Arc::new(CrashMembers::from_images(images.to_vec()));
        let opts = AssembleOptions {
            read_only: true,
            ..self.assemble_options()
        };
        let log_on = opts.write_hole_log;
        self.report.read_only_looks += 1;
        match assemble_io(members.clone(), opts) {
            Ok(array) => {
                let mut all = AlignedBuf::zeroed(self.model.array_bytes() as usize);
                array
                    .read(0, &mut all)
                    .map_err(|e| format!("reading the array served read-only failed: {e}"))?;
                let (blocks, forgiven) = self.check_read_back(&all).map_err(|m| {
                    format!(
                        "served read-only (missing {:?}): {m}; {}",
                        self.gone_slots(),
                        self.diagnose(m.block)
                    )
                })?;
                self.report.blocks_verified += blocks;
                // Counted here, where they are first seen; the read-write start must then serve the same bytes.
                self.report.write_hole_limit_blocks += forgiven;
                array
                    .stop()
                    .map_err(|e| format!("stopping the array served read-only: {e}"))?;
                self.note(format!("served read-only first: {blocks} blocks verified"));
            }
            Err(EngineError::AssembleReadOnly { why }) if self.g.level.has_parity() && !log_on => {
                self.report.read_only_refusals += 1;
                self.note(format!("served read-only first: refused ({why})"));
            }
            Err(e) => return Err(format!("serving read-only failed: {e}")),
        }
        if members.images() != images {
            return Err("serving read-only changed a member".to_string());
        }
        Ok(())
    }

    /// Waits for the background jobs an assembly started (resync, rebuild of a re-added member) and counts them;
    /// one that neither completed nor yielded to a rebuild is a violation.
    pub(super) fn settle_jobs_after_assembly(&mut self) -> Result<(), String> {
        self.wait_jobs("after re-assembly")?;
        if let Some(done) = self.array().last_result() {
            match done.kind {
                "resync" => {
                    self.report.resyncs += 1;
                    self.report.resync_rewritten += done.repaired;
                }
                "rebuild" => {
                    self.report.rebuilds += 1;
                    if done.in_sync_bytes > 0 {
                        self.report.re_adds_from_bitmap += 1;
                    }
                }
                _ => {}
            }
            // A resync yields to a rebuild ("interrupted"); whether the stripes end consistent is what the audit
            // below checks.
            let yielded = done.kind == "resync" && done.outcome.as_deref() == Some("interrupted");
            if done.outcome.as_deref() != Some("completed") && !yielded {
                return Err(format!(
                    "background {} after re-assembly: {done:?}",
                    done.kind
                ));
            }
        }
        Ok(())
    }

    /// Where a block lives and what its stripe looks like on the members, for a violation message.
    pub(super) fn diagnose(&self, block: u64) -> String {
        let g = &self.g;
        let at = g.map(block * PAGE_BYTES, 0);
        let row = at.data_offset_bytes / g.chunk_bytes;
        let page_at = at.data_offset_bytes % g.chunk_bytes;
        let images = self.io.inner().images();
        let mut text = format!(
            "block {block} is on member {} row {row} at +{page_at} (slot states {:?})",
            at.member,
            (0..g.members)
                .map(|s| self.array.as_ref().map(|a| a.slot_state(s)))
                .collect::<Vec<_>>()
        );
        if g.level.has_parity() {
            let k = g.data_per_stripe();
            let cells: Vec<Option<&[u8]>> = (0..k + g.level.parity_chunks())
                .map(|i| {
                    let m = g.stripe_member(row, i);
                    images.get(m).and_then(|i| i.as_deref()).map(|img| {
                        let off = (self.data_offset_bytes + row * g.chunk_bytes + page_at) as usize;
                        &img[off..off + PAGE_BYTES as usize]
                    })
                })
                .collect();
            if cells.iter().all(|c| c.is_some()) {
                let cells: Vec<&[u8]> = cells.into_iter().flatten().collect();
                use paraid_parity::Backend;
                let verdict =
                    paraid_parity::reference::Reference.check(&cells, g.level == Level::Raid6);
                text.push_str(&format!("; that page of its stripe: {verdict:?}"));
            } else {
                text.push_str("; its stripe has a member missing");
            }
        }
        text
    }

    pub(super) fn gone_slots(&self) -> Vec<usize> {
        (0..self.g.members).filter(|s| self.gone[*s]).collect()
    }

    /// Checks member images directly: parity of every stripe, every copy of every chunk against the model. Slots
    /// failed but not yet removed are left out (their contents are not trusted).
    pub(super) fn audit(&mut self, when: &str) -> Result<(), String> {
        // The members are looked at directly: held writes must be in place first.
        self.settle_write_back();
        if self.model.settled_bytes().is_none() {
            // Blocks of failed writes allow old or new: a full read settles them (and checks them).
            let mut all = vec![0u8; self.model.array_bytes() as usize];
            match self.array().read(0, &mut all) {
                Ok(()) => {}
                Err(e) if self.lse_armed && self.redundancy_exhausted() => {
                    // An unretryable read fault armed while redundancy remained, now on the last copy (a member
                    // failed since): no member can give those bytes, and the read rightly fails (seed 30610520).
                    // Nothing is settled, so the members cannot be audited against the model.
                    self.note(format!(
                        "{when}: audit skipped: the whole-array read met the armed read fault on the last copy: {e}"
                    ));
                    return Ok(());
                }
                Err(e) => return Err(format!("{when}: reading the whole array failed: {e}")),
            }
            let blocks = self
                .model
                .check_read(0, &all)
                .map_err(|m| format!("{when}: {m}"))?;
            self.report.blocks_verified += blocks;
        }
        let Some(expected) = self.model.settled_bytes() else {
            return Err(format!(
                "{when}: after a full read-back every block should be settled"
            ));
        };
        let mut images = self.io.inner().images();
        images.truncate(self.g.members);
        for (slot, image) in images.iter_mut().enumerate() {
            if self.failed[slot] || self.gone[slot] {
                *image = None;
            }
        }
        let r = audit::audit_images(&self.g, self.data_offset_bytes, &images, Some(&expected));
        self.report.audits += 1;
        self.report.stripes_audited += r.stripes_checked + r.degraded_stripes_checked;
        if !r.clean() {
            let array = self.array();
            let i = array.integrity();
            return Err(format!(
                "member audit {when}: {}; since assembly: {} stripes recovered from the log, resyncs verified {} \
                 stripes and rewrote {}, {} bitmap regions dirty now; last job: {:?}",
                r.describe(),
                i.log_recovered_stripes,
                i.resync_stripes,
                i.resync_rewritten,
                i.dirty_regions,
                array.last_result()
            ));
        }
        self.note(format!(
            "audit {when}: {} stripes, {} degraded stripes, {} chunk copies consistent",
            r.stripes_checked, r.degraded_stripes_checked, r.copies_checked
        ));
        Ok(())
    }
}
