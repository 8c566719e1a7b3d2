//! Flushes and retirement: when records may be forgotten, and the ring header that says so.

use super::*;

impl Ppl {
    /// Called before a flush of every member starts.
    pub(crate) fn flush_begin(&self) -> FlushMark {
        // The epoch moves on and the oldest unfinished round is read in one critical section, the one a writer's
        // `complete` also reads the epoch in. Apart, a writer completing in between took the new epoch (its
        // pages stayed counted as not durable) while the mark's round already counted its round as finished:
        // the flush then let the round, and the page's data entry, retire, and the stripe's next entry counted
        // the page as being written; with its member missing at restart, recovery solved it from parity the
        // next write tore (journal mode, seed 30660306).
        let st = self.lock();
        let epoch = self.flush_epoch.fetch_add(1, Ordering::SeqCst);
        FlushMark {
            epoch,
            seq: oldest_unfinished(&st),
        }
    }

    /// A client's flush: waits for the borrowing writers in flight (module doc) to finish their in-place writes,
    /// and no writer starts borrowing until `barrier_done` (the members' flushes then cover the borrowed chunks
    /// and the borrowers' writes alike). Why: a borrowing entry has no partial parity for the chunk it borrows.
    /// Were that entry's own writes still in flight when the flush made the chunk durable, a power loss tearing
    /// them, with the chunk's member missing at restart, would leave the chunk (acknowledged, and flushed) to be
    /// solved from torn parity (concurrent simulation, seed 107350; `faults_crash::flush_waits_for_logged_writes_in_flight`).
    /// Borrowing entries made meanwhile would make the same claims about chunks the flush is making durable
    /// (seed 106395; `faults_crash::log_entries_wait_for_a_flush_under_way`). Writers that borrow nothing go on
    /// (`faults_crash::a_flush_does_not_wait_for_a_write_that_borrows_nothing`).
    pub(crate) fn barrier_begin(&self) -> FlushMark {
        if self.enabled {
            let mut st = self.lock();
            st.barriers += 1;
            let waited_since = (st.borrowing > 0).then(std::time::Instant::now);
            while st.borrowing > 0 {
                st = self.wait(st);
            }
            drop(st);
            if let Some(since) = waited_since {
                let us = since.elapsed().as_micros() as u64;
                self.add_stats(|s| {
                    s.barrier_waits += 1;
                    s.barrier_wait_us += us;
                });
            }
        }
        self.flush_begin()
    }

    /// Ends a client's flush (`barrier_begin`): `completed` when every member's flush succeeded.
    pub(crate) fn barrier_done(&self, mark: FlushMark, completed: bool) {
        let mut st = self.lock();
        if completed {
            flush_done_locked(&mut st, mark);
        }
        if self.enabled {
            st.barriers -= 1;
            self.wake_everyone(&st);
            drop(st);
        }
    }

    /// Called after a flush of every member completed: writes completed before it began are durable.
    pub(crate) fn flush_done(&self, mark: FlushMark) {
        let mut st = self.lock();
        flush_done_locked(&mut st, mark);
    }

    /// Whether some stripe has chunks written since the last flush of every member: the background tick then
    /// flushes, counted here.
    pub(crate) fn tick_flush_wanted(&self) -> bool {
        self.enabled && !self.lock().dirty_stripes.is_empty()
    }

    pub(crate) fn count_tick_flush(&self) {
        self.add_stats(|s| s.tick_flushes += 1);
    }

    /// Retires what the flushes allow (the background tick); returns whether anything was retired.
    pub(crate) fn retire_flushed(&self, array: &Array) -> Result<bool, EngineError> {
        if !self.enabled {
            return Ok(false);
        }
        let mut st = self.lock();
        if st.retiring || st.flushed_seq <= st.retired_seq {
            return Ok(false);
        }
        st.retiring = true;
        let target = st.flushed_seq;
        let (mut st, result) = self.write_retired(array, st, target);
        st.retiring = false;
        self.wake_everyone(&st);
        drop(st);
        result.map(|()| true).map_err(LogFailure::into_error)
    }

    /// Retires every record (clean stop, after the final flush; or at assembly after recovery): nothing is in
    /// flight. Returns the first sequence number not retired.
    pub(crate) fn retire_all(&self, array: &Array) -> Result<u64, EngineError> {
        // A flush the log counts, though the callers flushed: it also forgets which pages were not durable.
        // Left behind, a page made durable by the caller's flush still counted as not durable, and the next entry
        // of its stripe took its chunk as being written: with the page's data entry retired here and its member
        // missing at restart, recovery solved it from parity a later write tore (journal mode, seed 30650278).
        self.flush_members(array)?;
        let mut st = self.lock();
        while st.retiring || st.log_writes_busy() {
            st = self.wait(st);
        }
        st.retiring = true;
        let target = st.next_seq;
        st.flushed_seq = st.flushed_seq.max(target);
        let (mut st, result) = self.write_retired(array, st, target);
        st.retiring = false;
        self.wake_everyone(&st);
        drop(st);
        result.map_err(LogFailure::into_error)?;
        Ok(target)
    }

    /// Short of ring space for a round: retires every record whose writes completed, flushing every member
    /// first if needed; waits for a writer to complete (or for another retirement) when nothing can be retired
    /// yet.
    pub(super) fn make_room<'a>(
        &'a self,
        array: &Array,
        mut st: MutexGuard<'a, LogState>,
    ) -> (MutexGuard<'a, LogState>, Result<(), LogFailure>) {
        if st.retiring {
            return (self.wait(st), Ok(()));
        }
        let target = oldest_unfinished(&st);
        if target <= st.retired_seq {
            if st.inflight.is_empty() {
                // Nothing older to wait for: the round alone does not fit (the ring was sized to prevent this).
                return (
                    st,
                    Err(LogFailure {
                        slot: None,
                        path: String::new(),
                        kind: io::ErrorKind::OutOfMemory,
                        message: "a log round does not fit in the partial parity log ring"
                            .to_string(),
                    }),
                );
            }
            // Everything retirable is retired: earlier writers are still writing in place. Wait for one.
            return (self.wait(st), Ok(()));
        }
        st.retiring = true;
        if st.flushed_seq < target {
            drop(st);
            let mark = self.flush_begin();
            let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
            let flushed = self.run_log_io(array, reqs);
            self.add_stats(|s| s.retire_flushes += 1);
            st = self.lock();
            if let Err(failure) = flushed {
                st.retiring = false;
                self.wake_everyone(&st);
                return (st, Err(failure));
            }
            flush_done_locked(&mut st, mark);
        }
        let to = st.flushed_seq;
        let (mut st, result) = if to > st.retired_seq {
            self.write_retired(array, st, to)
        } else {
            (st, Ok(()))
        };
        st.retiring = false;
        self.wake_everyone(&st);
        (st, result)
    }

    /// As the one retiring: writes every active member's ring header with `retired_seq = to` (FUA), then forgets
    /// the records below it.
    fn write_retired<'a>(
        &'a self,
        array: &Array,
        st: MutexGuard<'a, LogState>,
        to: u64,
    ) -> (MutexGuard<'a, LogState>, Result<(), LogFailure>) {
        debug_assert!(st.retiring);
        assert_dirty_rounds_live(&st, to);
        drop(st);
        // A failed array keeps its log as it is: a forced start (`AssembleOptions::force`) brings back the member
        // whose departure failed it, and the live entries are what makes the stripes it missed writes in
        // consistent again. A flush of the survivors alone says nothing about that member.
        if let Err(e) = array.check_serving() {
            return (self.lock(), Err(LogFailure::from_error(e)));
        }
        log::trace!("partial parity log: retiring rounds below {to}");
        let header = self.encode_ring_header(to);
        let reqs: Vec<IoReq<'_>> = array
            .active_slots()
            .map(|slot| IoReq::write(slot, self.offset_bytes, &header, true))
            .collect();
        let result = self.run_log_io(array, reqs);
        let mut st = self.lock();
        if result.is_ok() {
            st.retired_seq = st.retired_seq.max(to);
            let retired = st.retired_seq;
            for ring in st.rings.iter_mut() {
                while ring.live.front().is_some_and(|(seq, _, _)| *seq < retired) {
                    ring.live.pop_front();
                }
            }
            st.stripes.retain(|_, s| s.remembered(retired));
            st.placed.retain(|_, p| p.live(retired));
            self.add_stats(|s| s.retirements += 1);
        }
        (st, result)
    }

    /// Voids whatever an old ring on `slot` holds (a member that joins: its ring may hold records of an earlier
    /// life that newer writes made wrong).
    /// A replacement (io index `to`) is about to take over `from`, which is active and holds live records: the
    /// replacement gets a copy of `from`'s ring, taken while no round is written, and every record written to
    /// `from` from then on until it took over. (An empty ring would lose the live entries of stripes whose P
    /// or Q `from` is: a power loss after the replacement, with another member missing at restart, would then
    /// reconstruct that member's chunks from torn parity.)
    pub(crate) fn hand_over_ring(
        &self,
        array: &Array,
        from: usize,
        to: usize,
    ) -> Result<(), EngineError> {
        log::trace!(
            "partial parity log: ring of slot {from} copied to io {to} (a live replacement)"
        );
        let mut st = self.lock();
        while st.paused || st.log_writes_busy() {
            st = self.wait(st);
        }
        st.paused = true;
        drop(st);
        let mut area = AlignedBuf::zeroed((self.ring_pages as usize + 1) * PAGE);
        let copied = array
            .run(vec![IoReq::read(from, self.offset_bytes, &mut area)])
            .and_then(|()| array.run(vec![IoReq::write(to, self.offset_bytes, &area, true)]));
        let mut st = self.lock();
        st.paused = false;
        if copied.is_ok() {
            st.mirror = Some((from, to));
        }
        self.wake_everyone(&st);
        drop(st);
        copied
    }

    /// A member rebuilt into its slot starts with an empty ring: every page of the ring zeroed, then a header.
    /// A header alone would not do: the member may hold records of an earlier life whose sequence numbers the
    /// array reuses (assembly numbers on from the highest record of the members active then, and a member
    /// re-added or missing then was not among them), and such a record would pass for live (concurrent
    /// simulation, seed 110269: before this, only the header was written).
    pub(crate) fn reset_member(&self, array: &Array, slot: usize) -> Result<(), EngineError> {
        log::trace!("partial parity log: ring of io {slot} emptied (a member joins)");
        let body_bytes = self.ring_pages * PAGE_BYTES;
        // Member I/O wants page-aligned buffers.
        let zeros = AlignedBuf::zeroed(body_bytes.min(1 << 20) as usize);
        let mut at = 0u64;
        while at < body_bytes {
            let n = (body_bytes - at).min(zeros.len() as u64) as usize;
            let offset = self.offset_bytes + PAGE_BYTES + at;
            array.run(vec![IoReq::write(slot, offset, &zeros[..n], false)])?;
            at += n as u64;
        }
        // The zeros durable before the header that says the ring is empty.
        array.run(vec![IoReq::flush(slot)])?;
        let retired = self.lock().retired_seq.max(1);
        let header = self.encode_ring_header(retired);
        array.run(vec![IoReq::write(slot, self.offset_bytes, &header, true)])
    }
}
