//! Steps that change members: failures (admin and I/O), transient errors, silent corruption found by check
//! and repair, and rebuilds onto blank members and live replacements.

use super::*;

impl Run<'_> {
    pub(super) fn fail_member(&mut self) -> Result<(), String> {
        if self.beyond {
            return Ok(());
        }
        let healthy: Vec<usize> = (0..self.g.members)
            .filter(|s| !self.failed[*s] && !self.gone[*s])
            .collect();
        if healthy.is_empty() {
            return Ok(());
        }
        let slot = *self.rng.pick(&healthy);
        let mut missing = self.missing();
        missing[slot] = true;
        let survivable = self.g.survives(&missing);
        let go_beyond = self.cfg.classes.beyond_tolerance && self.rng.one_in(3);
        if !survivable && !go_beyond {
            return Ok(());
        }
        if survivable && self.rng.one_in(3) {
            // The admin fails it: at once, durably.
            self.array()
                .fail_member(slot)
                .map_err(|e| format!("admin fail of member {slot}: {e}"))?;
            self.failed[slot] = true;
            self.report.member_failures += 1;
            self.report.admin_fails += 1;
            self.note(format!("member {slot} failed by the admin"));
            return Ok(());
        }
        let nth = self.rng.range(1, 40);
        let rule = self.io.add(
            Scope::slot(slot),
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
        self.fail_rules[slot] = Some(rule);
        self.failed[slot] = true;
        self.report.member_failures += 1;
        if !survivable {
            self.beyond = true;
            self.report.beyond_tolerance += 1;
        }
        self.note(format!(
            "member {slot} fails from its I/O #{nth} on{}",
            if survivable {
                ""
            } else {
                " (beyond tolerance)"
            }
        ));
        Ok(())
    }

    pub(super) fn transient_error(&mut self) {
        // One transient fault at a time: two pending ones can meet in one request (a read and its retry, or two
        // members of one stripe), which is more than a transient error, and whether they meet depends on how many
        // I/Os a background job issued meanwhile (timing), so the seed would not replay.
        let io = &self.io;
        if self
            .transient_armed
            .iter()
            .any(|&(id, needed, _)| io.rule_counts(id).is_some_and(|c| c.failed < needed))
        {
            return;
        }
        let present: Vec<usize> = (0..self.g.members)
            .filter(|s| !self.gone[*s] && !self.failed[*s])
            .collect();
        if present.is_empty() {
            return;
        }
        let slot = *self.rng.pick(&present);
        if self.rng.one_in(2) {
            let nth = self.rng.range(1, 20);
            let id = self.io.add(
                Scope::slot(slot).ops(OpKinds::DATA),
                Fault::FailOnce {
                    nth,
                    count: Count::Global,
                },
            );
            self.transient_armed.push((id, 1, slot));
            self.report.transient_errors += 1;
            self.note(format!("member {slot}: its data I/O #{nth} will fail once"));
        } else {
            // A page that fails reads (twice: the retry too) until it is rewritten.
            let row = self.rng.below(self.g.rows);
            let page = self.rng.below(self.g.chunk_bytes / PAGE_BYTES);
            let at = self.data_offset_bytes + row * self.g.chunk_bytes + page * PAGE_BYTES;
            let id = self.io.add(
                Scope::slot(slot)
                    .ops(OpKinds::READ)
                    .range(at..at + PAGE_BYTES),
                Fault::FailRun {
                    nth: 1,
                    times: 2,
                    count: Count::Global,
                },
            );
            self.transient_armed.push((id, 2, slot));
            self.lse_armed = true;
            self.report.unretryable_read_errors += 1;
            self.note(format!(
                "member {slot}: page at {at} fails its next two reads"
            ));
        }
    }

    /// Plants flipped bits at rest where repair can tell the right copy (RAID6: any chunk; RAID5: P; mirrors: a
    /// copy other than the first), then checks (every one found), repairs, and checks again (none left). Needs
    /// every member active.
    pub(super) fn corrupt(&mut self) -> Result<(), String> {
        // A check stops at an unreadable page (reported), so none may be pending.
        if self.degraded() || self.beyond || self.lse_armed || self.g.level == Level::Raid0 {
            return Ok(());
        }
        self.wait_jobs("before planting corruption")?;
        let units = self.rng.range(1, 3.min(self.g.rows));
        let mut rows: Vec<u64> = Vec::new();
        while (rows.len() as u64) < units {
            let r = self.rng.below(self.g.rows);
            if !rows.contains(&r) {
                rows.push(r);
            }
        }
        let mut planted = 0u64;
        for &row in &rows {
            let (member, cell_row) = match self.g.level {
                Level::Raid6 => (self.rng.below(self.g.members as u64) as usize, row),
                Level::Raid5 => (self.g.p_member(row), row),
                _ => {
                    // Mirrors: the chunk whose first copy sits in this row of member 0 is not known in general;
                    // take chunk `row` (every level has at least `rows` chunks) and spoil its second copy.
                    let chunk = row.min(self.g.data_chunks() - 1);
                    let copy = 1 + self.rng.below(self.g.copies() as u64 - 1) as usize;
                    let addr = self.g.chunk_copy(chunk, copy);
                    (addr.member, addr.row)
                }
            };
            let at = self.data_offset_bytes
                + cell_row * self.g.chunk_bytes
                + self.rng.below(self.g.chunk_bytes);
            let image = self.io.inner().image(member).expect("every member present");
            let byte = image[at as usize] ^ (1 << self.rng.below(8));
            self.io.inner().poke(member, at, &[byte]);
            planted += 1;
        }
        // Mirrors: two rows may name one chunk only if rows collide, which the loop above prevents.
        self.report.corruptions_planted += planted;
        self.note(format!(
            "silent corruption: a bit flipped at rest in {planted} stripes/chunks (rows {rows:?})"
        ));
        let found = self.run_check(false)?;
        if found.mismatches != planted {
            return Err(format!(
                "check found {} mismatches for {planted} planted corruptions: {:?}",
                found.mismatches,
                self.array().check_findings()
            ));
        }
        self.report.corruptions_detected += found.mismatches;
        let fixed = self.run_check(true)?;
        if fixed.repaired != planted {
            return Err(format!(
                "repair rewrote {} stripes for {planted} corruptions",
                fixed.repaired
            ));
        }
        self.report.corruptions_repaired += fixed.repaired;
        // Known engine bug: repair does not flush what it rewrote (a power loss brings the corruption back).
        self.flush_after_repair()?;
        let again = self.run_check(false)?;
        if again.mismatches != 0 {
            return Err(format!("{} mismatches left after repair", again.mismatches));
        }
        self.note(format!(
            "check found {planted}, repair fixed {planted}, none left"
        ));
        self.audit("after repair")
    }

    /// Known engine bug (docs/reliability.md, tests/faults_engine_bugs.rs): a repair never flushes what it rewrote,
    /// so a power loss after it "completed" brings the corruption back. Unless strict, the simulator flushes after
    /// every repair so that the rest of the seed tests everything else.
    pub(super) fn flush_after_repair(&mut self) -> Result<(), String> {
        if self.cfg.strict {
            return Ok(());
        }
        // Through write-back: writes held beside the repair are made durable too, as the model will say.
        self.front()
            .flush()
            .map_err(|e| format!("flush after a repair: {e}"))?;
        self.model.flushed();
        self.note(
            "flush after the rebuild or repair (works around the unflushed-job-writes bug)"
                .to_string(),
        );
        Ok(())
    }

    pub(super) fn run_check(&mut self, repair: bool) -> Result<crate::Progress, String> {
        self.run_check_beside(repair, |_| Ok(()))
    }

    /// `run_check`, with `beside` run while the check runs (requests sent alongside it).
    pub(super) fn run_check_beside(
        &mut self,
        repair: bool,
        beside: impl FnOnce(&mut Self) -> Result<(), String>,
    ) -> Result<crate::Progress, String> {
        self.array()
            .start_check(repair)
            .map_err(|e| format!("start check: {e}"))?;
        beside(self)?;
        self.wait_jobs("check")?;
        let done = self
            .array()
            .last_result()
            .ok_or_else(|| "a check ran but left no result".to_string())?;
        if done.outcome.as_deref() != Some("completed") {
            return Err(format!("check did not complete: {done:?}"));
        }
        Ok(done)
    }

    /// Replaces a failed or missing member by a blank one and rebuilds it; with every member healthy, replaces a
    /// working member live (half the time).
    /// With `failing_new_members`, one time in three: a failure rule for the blank member about to be added
    /// (`replacing` false) or to be built as a live replacement, on I/O the add itself never does (it reads the
    /// superblock, discards the reserved area and writes the superblock with FUA), so the seed replays exactly.
    /// Returns the slot the engine will give an added member (the first failed or missing one without a member;
    /// a replacement is built at an entry past the data slots, where no other member does I/O), the rule, and
    /// what fails.
    pub(super) fn arm_new_member_fault(
        &mut self,
        replacing: bool,
    ) -> Option<(Option<usize>, RuleId, &'static str)> {
        if !self.cfg.failing_new_members || !self.join_rng.one_in(3) {
            return None;
        }
        let array = self.array.as_ref()?;
        let (slot, member) = if replacing {
            let entries: Vec<usize> = (self.g.members..MAX_MEMBERS).collect();
            (None, Scope::slots(&entries))
        } else {
            let slot = (0..self.g.members).find(|&s| {
                matches!(array.slot_state(s), SlotState::Faulty | SlotState::Missing)
                    && !self.io.present(s)
            })?;
            (Some(slot), Scope::slot(slot))
        };
        let data_at = self.data_offset_bytes;
        let rows = (self.member_bytes - data_at) / self.g.chunk_bytes;
        let writes = member.clone().ops(OpKinds::WRITE);
        let (scope, nth, what) = match self.join_rng.below(3) {
            0 => (
                writes.range(data_at..self.member_bytes),
                self.join_rng.range(1, rows),
                "a write of its rebuilt data",
            ),
            // With a checkpoint after every batch (`after_assembly`) a rebuild flushes its target many times,
            // the last before it completes; without, once, at the end.
            1 => (
                member.ops(OpKinds::FLUSH),
                self.join_rng.range(1, 4),
                "a flush of it",
            ),
            _ => (
                // The bitmap and the ring lie after the superblock and its reserved copy (docs/format.md).
                writes.range(2 * SUPERBLOCK_BYTES as u64..data_at),
                self.join_rng.range(1, 3),
                "a write of its bitmap or log ring",
            ),
        };
        let rule = self.io.add(
            scope,
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
        let role = match slot {
            Some(slot) => format!("the blank member for slot {slot}"),
            None => "the replacement".to_string(),
        };
        self.note(format!("{role} will fail {what} (#{nth})"));
        Some((slot, rule, what))
    }

    pub(super) fn rebuild(&mut self) -> Result<(), String> {
        if self.beyond {
            return Ok(());
        }
        self.wait_jobs("before a rebuild")?;
        self.sync_slot_states();
        let members = self.g.members;
        let states: Vec<SlotState> = (0..members).map(|s| self.array().slot_state(s)).collect();
        let replaceable: Vec<usize> = (0..members)
            .filter(|s| matches!(states[*s], SlotState::Faulty | SlotState::Missing))
            .collect();
        let label = format!("new{}", self.report.rebuilds + self.report.replacements);
        let member = NewMember::Image {
            label,
            size_bytes: self.member_bytes,
        };
        if replaceable.is_empty() {
            if self.degraded() || !self.rng.one_in(2) {
                return Ok(());
            }
            if self.g.level == Level::Raid0 {
                // Nothing to copy from while keeping redundancy: the engine must refuse.
                return match self.array().replace_member(0, member) {
                    Err(_) => Ok(()),
                    Ok(()) => Err("replace_member on RAID0 was accepted".to_string()),
                };
            }
            let slot = self.rng.below(members as u64) as usize;
            let joining_fault = self.arm_new_member_fault(true);
            self.array()
                .replace_member(slot, member)
                .map_err(|e| format!("replace member {slot}: {e}"))?;
            let beside = self.cfg.concurrent && self.rng.one_in(2);
            if beside {
                self.note(format!("requests while member {slot} is replaced"));
                self.batch()?;
            }
            self.wait_jobs("live replacement")?;
            let done = self.array().last_result();
            if let Some((_, rule, what)) = joining_fault {
                // The rule covers every entry past the data slots: lifted whatever happened, or it would catch
                // the next replacement.
                let fired = self.io.rule_counts(rule).is_some_and(|c| c.failed > 0);
                self.io.remove(rule);
                // A request beside the replacement may meet the rule too (a client flush reaches the new
                // member, even before the replacement's job starts): the replacement must end aborted all the
                // same. None reaches the entry after the new member took the slot: the replacement holds
                // requests off while it completes.
                let completed = rebuild_completed(&done, slot);
                if fired {
                    if completed || self.array().slot_state(slot) != SlotState::Active {
                        return Err(format!(
                            "the replacement of member {slot} failed {what}: the replacement must be dropped and \
                             the member keep serving, got {:?} and slot state {}",
                            done.as_ref().and_then(|d| d.outcome.clone()),
                            self.array().slot_state(slot)
                        ));
                    }
                    self.report.new_member_failures += 1;
                    self.note(format!(
                        "the replacement of member {slot} failed {what}: {}",
                        done.as_ref()
                            .and_then(|d| d.outcome.as_deref())
                            .unwrap_or("no result")
                    ));
                    return self.audit("after a replacement failed");
                }
            }
            if self.array().slot_state(slot) != SlotState::Active || !rebuild_completed(&done, slot)
            {
                return Err(format!(
                    "live replacement of member {slot} did not complete: {done:?}"
                ));
            }
            self.report.replacements += 1;
            self.note(format!("member {slot} replaced live"));
            return self.audit("after a live replacement");
        }
        let slot = *self.rng.pick(&replaceable);
        // Half the time a failed member comes back instead (a drive that reset, a cable reseated): the same
        // device with what its medium held, its cache lost. `add` re-adds it to its slot where the bitmap kept
        // track, else rebuilds it whole; either way it must end holding the array's bytes (audited below).
        let mut member = member;
        let mut back = false;
        // Some(checkpoint) if it failed in the middle of its own rebuild (its superblock still says so).
        let mut back_mid_rebuild: Option<u64> = None;
        if states[slot] == SlotState::Faulty && self.io.present(slot) && self.readd_rng.one_in(2) {
            if let Some(image) = self.io.inner().durable_image(slot) {
                back_mid_rebuild = image
                    .get(..crate::superblock::SUPERBLOCK_BYTES)
                    .and_then(|block| crate::superblock::Superblock::decode(block).ok())
                    .and_then(|sb| {
                        let own = sb.slots.get(slot).filter(|_| sb.slot == slot)?;
                        (own.state == SlotState::Rebuilding).then_some(own.recovery_offset_bytes)
                    });
                member = NewMember::Existing {
                    label: format!("back{slot}"),
                    image: Arc::new(image),
                };
                back = true;
            }
        }
        if states[slot] == SlotState::Faulty && self.io.present(slot) {
            self.array()
                .remove_member(slot)
                .map_err(|e| format!("remove member {slot}: {e}"))?;
        }
        if let Some(rule) = self.fail_rules[slot].take() {
            self.io.remove(rule);
        }
        // The blank member is a new device: a transient fault armed for the one it replaces does not follow it.
        let io = &self.io;
        self.transient_armed.retain(|&(id, _, s)| {
            if s == slot {
                io.remove(id);
            }
            s != slot
        });
        // Drawn before the member joins: a rebuild the power will cut gets no joining fault. That fault could
        // strike in the background before the cut is armed (a bitmap write as it joins), evicting the member the
        // cut branch below takes to be in its slot (seeds 20003299, 20004045 of the unshaken run, stop 30).
        let cut_rebuild = self.cfg.rebuild_power_losses
            && self.cfg.classes.crash_degraded
            && self.rebuild_cut_rng.one_in(3);
        let joining_fault = if cut_rebuild {
            None
        } else {
            self.arm_new_member_fault(false)
        };
        let outcome = self
            .array()
            .add_member(member)
            .map_err(|e| format!("add a blank member for slot {slot}: {e}"))?;
        let took = match outcome {
            AddOutcome::Rebuilding { slot: took } => took,
            AddOutcome::ReAdded { slot: took } if back && took == slot => {
                self.report.members_back_re_added += 1;
                self.report.members_back_mid_rebuild_re_added +=
                    u64::from(back_mid_rebuild.is_some());
                took
            }
            outcome => {
                return Err(format!(
                    "a {} member should take a failed or missing slot{}: {outcome:?}",
                    if back { "returning" } else { "blank" },
                    if back { " (its own, if re-added)" } else { "" }
                ))
            }
        };
        if back {
            self.report.members_back += 1;
            self.report.members_back_mid_rebuild += u64::from(back_mid_rebuild.is_some());
            self.note(format!(
                "failed member {slot} added back{}: {outcome:?}",
                match back_mid_rebuild {
                    Some(bytes) => format!(
                        " (it failed in the middle of its rebuild, checkpoint at byte {bytes})"
                    ),
                    None => String::new(),
                }
            ));
        }
        let joining_fault = match joining_fault {
            Some((at, rule, _)) if at != Some(took) => {
                self.io.remove(rule);
                None
            }
            armed => armed,
        };
        if cut_rebuild {
            // The power goes in the middle of the rebuild; the restart resumes it from its last checkpoint.
            debug_assert!(joining_fault.is_none());
            let writes = self.rebuild_cut_rng.range(1, 2 * self.g.rows + 4);
            self.note(format!(
                "power cut after {writes} more member writes, in the rebuild of slot {took}"
            ));
            // What the engine decided while the power was on; what it makes of the I/O errors after the cut
            // (the new member aborted, members evicted) never reaches the members.
            self.note_evictions_before_drop();
            // The new member is in the slot from here on, as after a rebuild: re-assembly brings it back with
            // whatever its superblock says (rebuilding from a checkpoint, or active).
            self.failed[took] = false;
            self.gone[took] = false;
            self.stale[took] = None;
            self.stale_behind[took] = false;
            self.io.inner().cut_power_after_writes(writes);
            self.report.rebuild_power_losses += 1;
            // The rebuild ends (completed, or stopped by the power loss); the power is off from the cut on.
            self.wait_jobs("rebuild cut by a power loss")?;
            let crash_seed = self.rebuild_cut_rng.next_u64();
            return self.lose_power(crash_seed, true);
        }
        let beside = self.cfg.concurrent && self.rng.one_in(2);
        if beside {
            self.note(format!("requests while slot {took} rebuilds"));
            self.batch()?;
        }
        self.wait_jobs("rebuild")?;
        let done = self.array().last_result();
        let completed = rebuild_completed(&done, took);
        self.sync_slot_states();
        if let Some((_, rule, what)) = joining_fault {
            if self.io.rule_counts(rule).is_some_and(|c| c.failed > 0) {
                // Whenever it failed, a member that failed an I/O must not serve: aborted as a target, or
                // evicted as a member. Only requests beside the rebuild can meet the rule after it joined.
                let state = self.array().slot_state(took);
                if state == SlotState::Active || (completed && !beside) {
                    return Err(format!(
                        "the new member of slot {took} failed {what}, yet it joined the array (slot {state}): \
                         {done:?}"
                    ));
                }
                // It stays in its slot, faulty and failing, until a later rebuild removes it; the abort moved the
                // survivors' event counters past it.
                self.fail_rules[took] = Some(rule);
                self.failed[took] = true;
                self.stale[took] = None;
                self.stale_behind[took] = true;
                self.report.new_member_failures += 1;
                // The outcome only: the progress carries a rate, which is timing.
                let outcome = done.as_ref().and_then(|d| d.outcome.clone());
                self.note(format!(
                    "the new member of slot {took} failed {what}: {}",
                    outcome.as_deref().unwrap_or("no result")
                ));
                return self.audit("after a new member failed");
            }
            self.io.remove(rule);
        }
        if !completed || self.array().slot_state(took) != SlotState::Active {
            if self.beyond {
                self.note(format!(
                    "rebuild of {took} ended beyond tolerance: {done:?}"
                ));
                return Ok(());
            }
            // An unretryable read fault armed while redundancy remained, now on the last copy (a member failed
            // since): the rebuild cannot read those bytes anywhere and, rightly, does not activate its target.
            let unreadable = done.as_ref().is_some_and(|d| !d.unreadable.is_empty());
            if unreadable && self.lse_armed && self.redundancy_exhausted() {
                self.note(format!(
                    "rebuild of {took} stopped at bytes no member could read (armed read fault on the last copy)"
                ));
                return Ok(());
            }
            return Err(format!("rebuild of slot {took} did not complete: {done:?}"));
        }
        self.failed[took] = false;
        self.gone[took] = false;
        self.stale[took] = None;
        self.stale_behind[took] = false;
        self.report.rebuilds += 1;
        self.note(format!("blank member rebuilt into slot {took}"));
        self.audit("after a rebuild")
    }
}

/// Whether `done` (the array's last job result) is a rebuild or replacement of `slot` that completed. The kind
/// and slot matter: a replacement aborted before its job ran (a request beside it failed on the new member) leaves
/// the result of the job before, a resync say, as the last.
pub(super) fn rebuild_completed(done: &Option<crate::Progress>, slot: usize) -> bool {
    done.as_ref().is_some_and(|d| {
        d.kind == "rebuild" && d.slot == Some(slot) && d.outcome.as_deref() == Some("completed")
    })
}
