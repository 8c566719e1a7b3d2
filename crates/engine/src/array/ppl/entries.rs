//! The write path: which entries a write logs, and their partial parity (rides and stream entries: `streams.rs`).

use super::streams::stream_touches;
use super::*;

impl Ppl {
    /// Whether a read-modify-write of `stripe` can compute its partial parity from what it reads: every chunk
    /// written since the last flush must be among the chunks this write rewrites over all of `r` (otherwise the
    /// write reads the whole stripe: reconstruct-write).
    pub(in crate::array) fn rmw_allowed(
        &self,
        stripe: u64,
        touches: &[(usize, Range<u64>)],
        r: &Range<u64>,
    ) -> bool {
        if !self.enabled {
            return true;
        }
        let dirty = self
            .lock()
            .stripes
            .get(&stripe)
            .map_or(0, |s| s.dirty_over(r, self.journal));
        let allowed = (0..64).filter(|i| dirty & (1 << i) != 0).all(|i| {
            touches
                .iter()
                .any(|(index, pages)| *index == i && pages == r)
        });
        if !allowed {
            self.add_stats(|s| s.rmw_to_rcw += 1);
        }
        allowed
    }

    /// Makes the entries for the stripes of one write window durable before it writes in place. `data_round`:
    /// the round that already carried the window's data (`log_data_first`); the window's own round then holds
    /// only its partial parity. `early`: the writer may be answered once the log holds its data (a lone write
    /// through `Array::write_answering`, journal mode); `sequential`: it continues the write its client waited for
    /// before (`note_waited_for`).
    pub(in crate::array) fn log_window(
        &self,
        array: &Array,
        views: &[StripeView<'_>],
        fua: bool,
        data: Option<&DataRound<'_>>,
        early: bool,
        sequential: bool,
    ) -> Result<Logged<'_>, EngineError> {
        let data_round = data.map(|d| d.seq);
        let written: WrittenInPlace = views
            .iter()
            .map(|v| (v.stripe, v.written.clone()))
            .collect();
        let mut logged = Logged {
            ppl: self,
            round: None,
            written,
            fua,
            rides: Vec::new(),
            streams: Vec::new(),
            health_epoch: array.health.epoch.load(Ordering::SeqCst),
            borrowing: false,
            answerable: data_round.is_some(),
            data_round,
            carried_data: data_round.is_some(),
            whole_markers: Vec::new(),
        };
        if !self.enabled {
            return Ok(logged);
        }
        // Stream entries and rides: not for a window whose data a data round carried (journal mode).
        let all_active = self.streams
            && data_round.is_none()
            && (0..self.geometry.members).all(|m| array.is_active(m));
        // Journal mode: whether the window's data goes into the log beside its partial parity (and the write may
        // be answered from the log). Not for a window that continues stream entries (lone answers): it rides or
        // extends them, as the log does, and is answered once written in place.
        let parity_alone = data_round.is_none()
            && ((all_active
                && self.journal
                && self.continues_streams(array, &stream_touches(views), sequential))
                || self.parity_alone(views, early));
        let carry_data =
            self.journal && data_round.is_none() && !parity_alone && self.carries_data(views);
        logged.carried_data |= carry_data;
        if fua && self.parity_leans_on_unflushed(views) {
            // A FUA write is durable on return, and so must be what its parity is computed from: the new parity
            // also covers chunks other writes left in the members' caches. Lose one of those and the member
            // holding this write, and the write could not be rebuilt. Make them durable first.
            self.flush_members(array)?;
            self.add_stats(|s| s.fua_flushes += 1);
        } else if self.journal
            && data_round.is_none()
            && !carry_data
            && self.markers_cover_unflushed(views)
        {
            // A marker makes recovery take a chunk's pages as found, voiding an older data entry. If the write
            // that entry answered is not durable in place, "as found" may be older than what was answered (this
            // write's own in-place writes may be lost): make it durable first.
            self.flush_members(array)?;
            self.add_stats(|s| s.fua_flushes += 1);
        }
        // A window that carries its data makes no stream entry and rides none: a ride's data is not in the log.
        let all_active = all_active && !carry_data;
        if self.take_rides(views, all_active, &mut logged) {
            return Ok(logged); // every stripe rides: nothing to log
        }
        let (entries, streams) =
            self.entries_for(array, views, all_active, carry_data, &mut logged);
        // Entries made after a member's departure failed the array count its chunks as living in the parity; a
        // forced start trusts that member's own chunks again, and such an entry, the newest of its stripe, would
        // solve a missing member's chunks from the wrong partial parity. Nothing is logged once the array failed
        // (set before the member's state changes, so an entry that saw it out sees this too).
        array.check_serving()?;
        if entries.is_empty() {
            return Ok(logged);
        }
        if parity_alone {
            self.add_stats(|s| s.parity_alone += 1);
        }
        if log::log_enabled!(log::Level::Trace) {
            log::trace!(
                "partial parity log: window {:?} (parity alone {parity_alone}, data carried {carry_data}, data \
                 round {data_round:?}) logs {:?}",
                views
                    .iter()
                    .map(|v| (v.stripe, &v.written, &v.changed_missing))
                    .collect::<Vec<_>>(),
                entries
                    .iter()
                    .map(|e| (e.stripe, e.page_first, e.pages, e.modified, e.data_index, e.payload.is_some()))
                    .collect::<Vec<_>>()
            );
        }
        let answerable =
            self.journal && (data_round.is_some() || carries_every_write(&entries, views));
        if let Some(data) = data {
            // Into the data round's own space: no wait for room (`log_data_first`).
            if self.write_reserved(array, data.seq, &data.reserved, &entries)? {
                logged.streams = streams;
                logged.answerable = answerable;
                return Ok(logged);
            }
            debug_assert!(
                false,
                "the window's partial parity did not fit the space its data round set aside"
            );
            log::warn!(
                "partial parity log: a window's partial parity did not fit the space its data round set aside"
            );
        }
        logged.round = Some(self.commit(array, entries)?);
        log::trace!(
            "partial parity log: the window above is round {:?}",
            logged.round
        );
        logged.streams = streams;
        logged.answerable = answerable;
        Ok(logged)
    }

    /// Counts `logged` as a borrowing writer (module doc) once no client flush is under way; waits for those
    /// under way first. The caller holds the log's lock, and decided under it that the writer borrows.
    fn begin_borrowing<'a>(
        &self,
        mut st: MutexGuard<'a, LogState>,
        logged: &mut Logged<'_>,
    ) -> MutexGuard<'a, LogState> {
        let waited_since = (st.barriers > 0).then(std::time::Instant::now);
        while st.barriers > 0 {
            st = self.wait(st);
        }
        st.borrowing += 1;
        logged.borrowing = true;
        let waited_us = waited_since.map(|t| t.elapsed().as_micros() as u64);
        self.add_stats(|s| {
            s.borrowing += 1;
            if let Some(us) = waited_us {
                s.borrowing_waits += 1;
                s.borrowing_wait_us += us;
            }
        });
        st
    }

    /// Whether a stripe of the window has pages not yet durable, under its new parity, that this write does not
    /// overwrite.
    fn parity_leans_on_unflushed(&self, views: &[StripeView<'_>]) -> bool {
        let st = self.lock();
        views.iter().any(|v| leans_on_unflushed(&st, v, false))
    }

    /// Whole stripes about to be overwritten without the write path (deallocated by a discard): a live entry of
    /// theirs is voided by an entry that counts every chunk as modified, and their chunks count as written.
    pub(in crate::array) fn log_overwrite(
        &self,
        array: &Array,
        stripes: Range<u64>,
    ) -> Result<Logged<'_>, EngineError> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let all = all_data(k);
        let mut logged = Logged {
            ppl: self,
            round: None,
            // Only chunks of present members are written (a missing member's chunk is never dirty: its value is
            // in the parity, and every entry's partial parity carries it).
            written: stripes
                .clone()
                .map(|s| {
                    let present = (0..k).filter(|i| array.is_active(g.stripe_member(s, *i)));
                    (s, present.map(|i| (i, 0..g.chunk_bytes)).collect())
                })
                .collect(),
            fua: false,
            rides: Vec::new(),
            streams: Vec::new(),
            health_epoch: array.health.epoch.load(Ordering::SeqCst),
            borrowing: false,
            answerable: false,
            data_round: None,
            carried_data: false,
            whole_markers: Vec::new(),
        };
        if !self.enabled || !g.level.has_parity() {
            return Ok(logged);
        }
        let (live, unflushed) = {
            // Its entries count every chunk as modified, a missing member's too: taken as borrowing (rare).
            let st = self.begin_borrowing(self.lock(), &mut logged);
            let live: Vec<u64> = stripes
                .filter(|s| {
                    st.stripes
                        .get(s)
                        .is_some_and(|l| l.last_seq != 0 && l.last_seq >= st.retired_seq)
                })
                .collect();
            let unflushed = live
                .iter()
                .any(|s| st.stripes.get(s).is_some_and(|l| !l.dirty.is_empty()));
            (live, unflushed)
        };
        if self.journal && unflushed {
            // The markers below void data entries whose writes may not be durable in place (`log_window`).
            self.flush_members(array)?;
            self.add_stats(|s| s.fua_flushes += 1);
        }
        let mut entries: Vec<Entry> = live
            .iter()
            .copied()
            .filter_map(|stripe| {
                let slots = self.parity_slots(array, stripe);
                slots.iter().any(|s| s.is_some()).then_some(Entry {
                    stripe,
                    page_first: 0,
                    pages: (g.chunk_bytes / PAGE_BYTES) as u32,
                    modified: all,
                    payload: None,
                    slots,
                    data_index: None,
                })
            })
            .collect();
        if self.journal {
            // Markers on the chunks' own rings as well (`data_entries`): with the parity members missing at
            // restart, an older data entry there would bring back what the discard removed.
            for &stripe in &live {
                let [p, q, _] = self.parity_slots(array, stripe);
                for i in 0..k {
                    let member = g.stripe_member(stripe, i);
                    entries.push(Entry {
                        stripe,
                        page_first: 0,
                        pages: (g.chunk_bytes / PAGE_BYTES) as u32,
                        modified: i as u64,
                        payload: None,
                        slots: [p, q, array.is_active(member).then_some(member)],
                        data_index: Some(i),
                    });
                }
            }
        }
        if !entries.is_empty() {
            logged.round = Some(self.commit(array, entries)?);
        }
        Ok(logged)
    }

    /// Records the in-place writes of a logged window as done (dropping `Logged` calls it).
    pub(super) fn complete(&self, logged: &Logged<'_>) {
        if !self.enabled {
            return;
        }
        let mut st = self.lock();
        // The epoch now, after the writes completed: a flush with this epoch or later began after them. Read
        // under the lock `flush_begin` moves it under, so that the flush's mark and this writer agree on whether
        // the flush covers the writes (`flush_begin`).
        let epoch = self.flush_epoch.load(Ordering::SeqCst);
        if logged.borrowing {
            st.borrowing -= 1;
        }
        let durable = logged.fua || epoch <= st.flushed_epoch;
        // The oldest round these writes relied on, which stays unflushed while they are not durable.
        let relied_on = logged
            .round
            .into_iter()
            .chain(logged.data_round)
            .chain(logged.rides.iter().copied())
            .min();
        for (stripe, written) in &logged.written {
            let known = st.stripes.contains_key(stripe);
            if logged.fua && logged.round.is_none() && !known {
                continue; // durable already, nothing logged, nothing dirty: nothing to remember
            }
            let retired = st.retired_seq;
            let s = st.stripes.entry(*stripe).or_default();
            for (index, range) in written {
                if durable {
                    s.clean(*index, range);
                } else {
                    s.add_dirty(*index, range.clone(), epoch, relied_on, logged.answerable);
                }
            }
            // The data round too: with a live entry the stripe's later writes log markers, so that this data
            // entry cannot roll back what they write.
            if let Some(round) = logged.round.max(logged.data_round) {
                s.last_seq = s.last_seq.max(round);
                if logged.carried_data {
                    s.last_data_seq = s.last_data_seq.max(round);
                }
                if logged.round == Some(round) && logged.whole_markers.contains(stripe) {
                    s.last_whole_seq = round;
                }
            }
            let (dirty, remembered) = (!s.dirty.is_empty(), s.remembered(retired));
            if dirty {
                st.dirty_stripes.insert(*stripe);
            } else {
                st.dirty_stripes.remove(stripe);
            }
            if !remembered {
                st.stripes.remove(stripe);
            }
        }
        if let Some(round) = logged.round {
            for new in &logged.streams {
                if let Some(s) = st.stripes.get_mut(&new.stripe) {
                    s.stream = Some(Stream {
                        seq: round,
                        index: new.index,
                        range: new.range.clone(),
                        health_epoch: logged.health_epoch,
                        continued: new.continued,
                    });
                }
            }
        }
        for &seq in &logged.rides {
            writer_done(&mut st, seq);
            let latest = st.ridden.entry(seq).or_insert(epoch);
            *latest = (*latest).max(epoch);
        }
        if let Some(round) = logged.round {
            writer_done(&mut st, round);
        }
        if logged.round.is_some() || !logged.rides.is_empty() || logged.borrowing {
            self.wake(st);
        }
    }

    /// The entries for `views` (a window that rides no stream entry): per stripe, per stretch of pages with the
    /// same set of written chunks; a write of one chunk makes a stream entry. Journal mode: with `carry_data`, data
    /// entries with the window's new data; without, markers where a stripe has a live entry. Returns them and the
    /// stream entries among them (stripe, data index, in-chunk bytes).
    #[allow(clippy::type_complexity)]
    fn entries_for(
        &self,
        array: &Array,
        views: &[StripeView<'_>],
        all_active: bool,
        carry_data: bool,
        logged: &mut Logged<'_>,
    ) -> (Vec<Entry>, Vec<NewStream>) {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let all = all_data(k);
        let mut entries = Vec::new();
        let mut streams = Vec::new();
        let (logs, after_streams): (Vec<StripeLog>, Vec<bool>) = {
            let mut st = self.lock();
            let borrows = views
                .iter()
                .any(|v| leans_on_unflushed(&st, v, self.journal));
            if borrows {
                // A flush that ends meanwhile may make the chunks durable: the entries are computed after it.
                st = self.begin_borrowing(st, logged);
            }
            views
                .iter()
                .map(|v| {
                    let mut s = st.stripes.get(&v.stripe).cloned().unwrap_or_default();
                    if s.last_seq < st.retired_seq {
                        s.last_seq = 0;
                    }
                    if s.last_data_seq < st.retired_seq {
                        s.last_data_seq = 0;
                    }
                    (s, self.follows_a_stream(&st, v))
                })
                .unzip()
        };
        for ((v, log), &after_stream) in views.iter().zip(&logs).zip(&after_streams) {
            let slots = self.parity_slots(array, v.stripe);
            if self.journal && logged.data_round.is_none() {
                // Data entries go beside the partial parity: with the parity members missing too, an older data
                // entry on a data member's ring must not bring back what this write replaces.
                // Retired rounds were zeroed in the snapshot above, so every round left in it counts as live.
                let live = self.voids_on_markers(log, 0);
                self.data_entries(array, v, slots, carry_data, live, &mut entries);
            }
            if slots.iter().all(|s| s.is_none()) {
                continue; // no parity written: nothing can disagree with the data
            }
            // A full-stripe write needs no partial parity, unless a data chunk's member is missing: its new
            // contents then live only in the parity, and the log keeps them for a torn write.
            let missing_mask = (0..k)
                .filter(|i| !array.is_active(g.stripe_member(v.stripe, *i)))
                .fold(0u64, |m, i| m | (1 << i));
            if v.full && missing_mask == 0 {
                if log.last_seq == 0 {
                    continue; // no live entry: the bitmap's resync covers a torn full-stripe write
                }
                // The stripe's newest live entry says already what a marker would: parity from the data as
                // found, older entries void (a database's doublewrite area, rewritten whole over and over, logged
                // one marker per write: 28,000 in 30 s under MariaDB). Should that round retire while this write
                // is in flight, the stripe is as one without a live entry. Not beside a live data entry (journal
                // mode).
                if log.last_seq == log.last_whole_seq && log.last_data_seq == 0 {
                    self.add_stats(|s| s.markers_skipped += 1);
                } else {
                    logged.whole_markers.push(v.stripe);
                    entries.push(Entry {
                        stripe: v.stripe,
                        page_first: 0,
                        pages: (g.chunk_bytes / PAGE_BYTES) as u32,
                        modified: all,
                        payload: None,
                        slots,
                        data_index: None,
                    });
                }
                continue;
            }
            // Journal mode: no stream entry beside a live data entry (rides of it would not void that entry).
            if all_active && !(self.journal && log.last_data_seq != 0) {
                if let Some((entry, new)) = self.stream_entry(array, v, log, after_stream, slots) {
                    streams.push(new);
                    entries.push(entry);
                    continue;
                }
            }
            // Cut R wherever the set of written or not-durable chunks changes.
            let mut cuts: Vec<u64> = vec![v.r.start, v.r.end];
            for (_, pages) in v.written.iter().chain(&v.changed_missing) {
                cuts.push(pages.start.clamp(v.r.start, v.r.end));
                cuts.push(pages.end.clamp(v.r.start, v.r.end));
            }
            for d in &log.dirty {
                cuts.push(d.range.start.clamp(v.r.start, v.r.end));
                cuts.push(d.range.end.clamp(v.r.start, v.r.end));
            }
            cuts.sort_unstable();
            cuts.dedup();
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                let covering = v
                    .written
                    .iter()
                    .filter(|(_, p)| p.start <= a && p.end >= b)
                    .fold(0u64, |m, (i, _)| m | (1 << i));
                let changes_missing = v
                    .changed_missing
                    .iter()
                    .any(|(_, p)| p.start <= a && p.end >= b);
                if covering == 0 && !changes_missing {
                    continue; // parity rewritten with its old value there: nothing changes
                }
                // A missing member's chunk is never modified: its value (reconstructed by the write path, or
                // the new one) is in the new parity, and so stays in the partial parity. Pages it had not made
                // durable before it went missing count for nothing now.
                // Journal mode: pages a live data entry carries are not counted (`leans_on_unflushed`). Counted,
                // with their member missing at restart and their data entry retired by a flush meanwhile (the
                // flush does not wait for this writer), they were solved from parity this write tore (seed
                // 30660306).
                let modified = (covering | log.dirty_over(&(a..b), self.journal)) & !missing_mask;
                let pages = ((b - a) / PAGE_BYTES) as u32;
                let payload = if modified & all == all {
                    None
                } else {
                    Some(self.partial_parity(array, v, modified, a..b))
                };
                entries.push(Entry {
                    stripe: v.stripe,
                    page_first: (a / PAGE_BYTES) as u32,
                    pages,
                    modified,
                    payload,
                    slots,
                    data_index: None,
                });
            }
        }
        (entries, streams)
    }

    /// The rings a stripe's entries go to: its P and (RAID6) Q members where active; the third place, a data
    /// entry's own chunk member, left empty.
    fn parity_slots(&self, array: &Array, stripe: u64) -> [Option<usize>; 3] {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let p = g.stripe_member(stripe, k);
        let q = (g.level == Level::Raid6).then(|| g.stripe_member(stripe, k + 1));
        [
            array.is_active(p).then_some(p),
            q.filter(|q| array.is_active(*q)),
            None,
        ]
    }

    /// Journal mode: whether the window's data entries carry its data: the window's partial-stripe writes stay
    /// within `data_budget_pages` (a window holding a full stripe is not answered from the log anyway); else they
    /// are markers.
    fn carries_data(&self, views: &[StripeView<'_>]) -> bool {
        views.iter().all(|v| !v.full)
            && views
                .iter()
                .flat_map(|v| v.written.iter().chain(&v.changed_missing))
                .map(|(_, pages)| (pages.end - pages.start) / PAGE_BYTES)
                .sum::<u64>()
                <= self.data_budget_pages()
    }

    /// Whether the log is deep: `deep_writers` (`DEEP_WRITERS_DEFAULT`) or more writers at work in it (from their
    /// entries to the end of their in-place writes, queued ones included).
    fn log_is_deep(&self, st: &LogState) -> bool {
        st.inflight.values().sum::<usize>() + st.queue.len() >= self.deep_writers
    }

    /// Journal mode: whether the window logs its partial parity alone, as the log without the journal does, and
    /// is answered once written in place: where the log is deep (`log_is_deep`) and none of its stripes has a
    /// live entry. Why: with many writers at work, answering from the log saves no time a writer waits for (the
    /// others fill the members), while its data entries are a copy of the data on three rings (RAID6), a record
    /// each: more bytes and CPU where those are the limit (stop 38, sixteen writers on two cores: 16 KiB random
    /// writes −52..−58 % against the bitmap with it, −62..−66 % without). Not where
    /// a stripe has a live entry: a data entry there may carry pages not yet durable in place, which the markers
    /// this write would log instead void (`markers_cover_unflushed`: a flush of every member first). Turned off by
    /// `AssembleOptions::journal_parity_alone` (`PARITY_ALONE_ENV`). Off by default in stop 38 while the simulator
    /// lost an answered write with it (seed 30826522): pages it left without their data beside pages a later
    /// write carried were merged as not carried (`StripeLog::add_dirty`, fixed in stop 39).
    ///
    /// With lone answers (`LogOptions::lone_answers`) also every window whose writer will not be answered from the
    /// log (`early` false: not lone, more than one window, FUA, gathered): its data entries would buy nothing.
    fn parity_alone(&self, views: &[StripeView<'_>], early: bool) -> bool {
        if !self.journal || !self.parity_alone_on {
            return false;
        }
        let st = self.lock();
        (self.log_is_deep(&st) || (self.lone_answers && !early))
            && views.iter().all(|v| {
                st.stripes
                    .get(&v.stripe)
                    .is_none_or(|log| !self.voids_on_markers(log, st.retired_seq))
            })
    }

    /// Journal mode: whether a write into the stripe that does not carry its data must log markers, voiding a
    /// live data entry that could roll back what it writes: a live entry of any kind, or with lone answers
    /// (`LogOptions::lone_answers`) only one that carried data (markers void nothing else).
    fn voids_on_markers(&self, log: &StripeLog, retired: u64) -> bool {
        if self.lone_answers {
            log.has_live_data_entry(retired)
        } else {
            log.has_live_entry(retired)
        }
    }

    /// Whether a chunk the window writes without carrying its data (markers) has pages not yet durable in a
    /// stripe with a live entry (whose data entries the markers void).
    fn markers_cover_unflushed(&self, views: &[StripeView<'_>]) -> bool {
        let st = self.lock();
        views.iter().any(|v| {
            st.stripes.get(&v.stripe).is_some_and(|log| {
                self.voids_on_markers(log, st.retired_seq)
                    && v.written
                        .iter()
                        .chain(&v.changed_missing)
                        .any(|(i, pages)| {
                            log.dirty.iter().any(|d| {
                                d.index == *i
                                    && d.range.start < pages.end
                                    && pages.start < d.range.end
                            })
                        })
            })
        })
    }

    /// Flushes every active member as a flush that the log counts (dirty pages become durable).
    pub(super) fn flush_members(&self, array: &Array) -> Result<(), EngineError> {
        let mark = self.flush_begin();
        let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
        array.run(reqs)?;
        self.flush_done(mark);
        Ok(())
    }

    /// Most pages of data one window's entries carry (journal mode): what the ring was sized for on top of two
    /// requests' partial parity (`one_request_pages`).
    fn data_budget_pages(&self) -> u64 {
        self.geometry.level.parity_chunks() as u64 * (self.geometry.chunk_bytes / PAGE_BYTES)
    }

    /// Journal mode: one data entry per chunk `v` changes (written in place, or changed while its member is
    /// missing), carrying its new pages when `carry` (else a marker), on the rings of the parity members in
    /// `slots` and of the chunk's own member if present. Markers only where the stripe has a live entry (`live`).
    fn data_entries(
        &self,
        array: &Array,
        v: &StripeView<'_>,
        slots: [Option<usize>; 3],
        carry: bool,
        live: bool,
        entries: &mut Vec<Entry>,
    ) {
        if !carry && !live {
            // Markers void older data entries, and none is live. Where one is, the markers go to the chunks'
            // own rings too: an entry without payload on the parity members' rings (a full-stripe write) is
            // lost with them, and the older data entry on the chunk's ring would roll back this write.
            return;
        }
        for (index, pages) in v.written.iter().chain(&v.changed_missing) {
            let contents = carry.then(|| {
                let (held, bytes) = v.data[*index]
                    .as_ref()
                    .expect("the write path holds every chunk it writes");
                assert!(
                    held.start <= pages.start && held.end >= pages.end,
                    "chunk {index} of stripe {} held over {held:?}, written over {pages:?}",
                    v.stripe
                );
                let from = (pages.start - held.start) as usize;
                &bytes[from..from + (pages.end - pages.start) as usize]
            });
            entries.extend(self.data_entry(array, v.stripe, *index, pages, slots, contents));
        }
    }

    /// A data entry of chunk `index` of `stripe` over in-chunk `pages`, carrying `contents` (None: a marker), for
    /// the rings of the parity members in `parity` and of the chunk's own member if present; None where none of
    /// them is.
    fn data_entry(
        &self,
        array: &Array,
        stripe: u64,
        index: usize,
        pages: &Range<u64>,
        parity: [Option<usize>; 3],
        contents: Option<&[u8]>,
    ) -> Option<Entry> {
        let member = self.geometry.stripe_member(stripe, index);
        let slots = [
            parity[0],
            parity[1],
            array.is_active(member).then_some(member),
        ];
        if slots.iter().all(|s| s.is_none()) {
            return None;
        }
        let payload = contents.map(|bytes| {
            let mut buf = AlignedBuf::for_overwrite(bytes.len());
            buf.copy_from_slice(bytes);
            buf
        });
        Some(Entry {
            stripe,
            page_first: (pages.start / PAGE_BYTES) as u32,
            pages: ((pages.end - pages.start) / PAGE_BYTES) as u32,
            modified: index as u64,
            payload,
            slots,
            data_index: Some(index),
        })
    }

    /// Journal mode: logs the new data of a write of one window before it reads anything, so that it can be
    /// answered one log write after it began, not after a read and a log write. Its partial parity follows in the
    /// window's own round (`log_window` with the data round), before anything is written in place: until that
    /// round is durable the members hold what they held, recovery solves the stripe from older entries (or
    /// recomputes its parity) and rolls this data forward. `pieces`: stripe, data index, in-chunk pages and their
    /// new bytes (page-aligned, no whole stripe). None, nothing logged, where the log cannot carry the window this
    /// way: beyond the data budget, or a chunk with no ring left to hold it.
    pub(in crate::array) fn log_data_first(
        &self,
        array: &Array,
        pieces: &[DataPiece<'_>],
    ) -> Result<Option<DataRound<'_>>, EngineError> {
        if !self.enabled || !self.journal || !self.data_first || pieces.is_empty() {
            return Ok(None);
        }
        // Where many writers are at work the round trip it saves is hidden anyway, and the record more it costs
        // (the partial parity's own) is not: on disks bound by requests per second it cost a quarter more at
        // QD32 than logging data and partial parity together (docs/benchmarks.md, "Journal mode: the data
        // first").
        if self.log_is_deep(&self.lock()) {
            return Ok(None);
        }
        let pages: u64 = pieces
            .iter()
            .map(|d| (d.pages.end - d.pages.start) / PAGE_BYTES)
            .sum();
        if pages > self.data_budget_pages() {
            return Ok(None);
        }
        let g = self.geometry;
        // Ring space for the window's partial parity, set aside in this round (`write_reserved`): waiting for
        // room later, with this round live until the write is done in place, could wait for itself. Enough by
        // construction: a stripe's entries cover disjoint stretches of at least a page within the pages the
        // window writes there (`entries_for`), so on each of its P and Q members they hold at most both halves
        // over those pages (a parity member present alone holds both) in at most that many entries, and a
        // member's records need a header per `ENTRIES_PER_RECORD` entries (the round stays below the budget
        // that would split them otherwise, checked below).
        let mut halves = vec![0u64; g.members];
        let mut entries_most = vec![0u64; g.members];
        let mut stripes: Vec<(u64, Range<u64>)> = Vec::new();
        for d in pieces {
            match stripes.iter_mut().find(|(s, _)| *s == d.stripe) {
                Some((_, r)) => *r = r.start.min(d.pages.start)..r.end.max(d.pages.end),
                None => stripes.push((d.stripe, d.pages.clone())),
            }
        }
        for (stripe, r) in &stripes {
            let [p, q, _] = self.parity_slots(array, *stripe);
            let r_pages = (r.end - r.start) / PAGE_BYTES;
            for slot in [p, q].into_iter().flatten() {
                halves[slot] += 2 * r_pages;
                entries_most[slot] += r_pages;
            }
        }
        let reserve: Vec<u64> = halves
            .iter()
            .zip(&entries_most)
            .map(|(&halves, &entries)| match entries {
                0 => 0,
                n => halves + n.div_ceil(ENTRIES_PER_RECORD as u64),
            })
            .collect();
        // Only where the round stays well within a ring (it is sized for two requests' partial parity and the
        // data budget a round).
        if reserve.iter().any(|&reserved| {
            reserved + 1 + pages > self.round_budget_pages.min(self.ring_pages / 2)
        }) {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(pieces.len());
        for DataPiece {
            stripe,
            index,
            pages: range,
            bytes,
        } in pieces
        {
            assert!(
                range.start % PAGE_BYTES == 0 && bytes.len() as u64 == range.end - range.start,
                "data first: stripe {stripe} chunk {index}: {range:?} against {} bytes",
                bytes.len()
            );
            let parity = self.parity_slots(array, *stripe);
            let Some(entry) = self.data_entry(array, *stripe, *index, range, parity, Some(bytes))
            else {
                return Ok(None); // no ring left to hold it
            };
            entries.push(entry);
        }
        array.check_serving()?;
        let traced: Vec<(u64, usize, Range<u64>)> = if log::log_enabled!(log::Level::Trace) {
            pieces
                .iter()
                .map(|p| (p.stripe, p.index, p.pages.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let (seq, reserved) = self.commit_reserving(array, entries, reserve)?;
        log::trace!("partial parity log: data first in round {seq}: {traced:?}");
        self.add_stats(|s| s.data_first += 1);
        Ok(Some(DataRound {
            ppl: self,
            seq,
            reserved,
        }))
    }

    /// PP (and QP) over `range` of `v`: the new parity with the contribution of every chunk in `modified` taken
    /// out again.
    pub(super) fn partial_parity(
        &self,
        array: &Array,
        v: &StripeView<'_>,
        modified: u64,
        range: Range<u64>,
    ) -> AlignedBuf {
        let len = (range.end - range.start) as usize;
        let np = self.geometry.level.parity_chunks();
        // Every byte is written below: PP from P, QP (RAID6) from Q.
        let mut payload = AlignedBuf::for_overwrite(np * len);
        let at = (range.start - v.r.start) as usize;
        let (pp, qp) = payload.split_at_mut(len);
        pp.copy_from_slice(&v.p[at..at + len]);
        match v.q {
            Some(q) => qp.copy_from_slice(&q[at..at + len]),
            None => debug_assert!(qp.is_empty()),
        }
        for i in (0..self.geometry.data_per_stripe()).filter(|i| modified & (1 << i) != 0) {
            let (held, bytes) = v.data[i]
                .as_ref()
                .expect("the write path holds every chunk a log entry counts as modified");
            assert!(
                held.start <= range.start && held.end >= range.end,
                "chunk {i} of stripe {} held over {held:?}, needed over {range:?}",
                v.stripe
            );
            let from = (range.start - held.start) as usize;
            take_out(
                array,
                i,
                &bytes[from..from + len],
                pp,
                (np == 2).then_some(&mut *qp),
            );
        }
        payload
    }
}

/// Whether `entries` (a window's, journal mode) carry the new contents of every chunk page `views` change: the
/// window's writes are then durable once the round is.
fn carries_every_write(entries: &[Entry], views: &[StripeView<'_>]) -> bool {
    views.iter().all(|v| {
        !v.full
            && v.written
                .iter()
                .chain(&v.changed_missing)
                .all(|(index, pages)| {
                    entries.iter().any(|e| {
                        e.stripe == v.stripe
                            && e.data_index == Some(*index)
                            && e.payload.is_some()
                            && u64::from(e.page_first) * PAGE_BYTES == pages.start
                            && u64::from(e.page_first + e.pages) * PAGE_BYTES == pages.end
                    })
                })
    })
}
