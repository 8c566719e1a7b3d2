//! Stream entries and rides (module doc, "Stream entries"): a stream of small writes into one chunk logs one entry
//! per `STREAM_PAGES` pages instead of one per write, and which writes of a client that waits for each count as
//! such a stream.

use super::*;

impl Ppl {
    /// Whether the window rides stream entries (module doc): in every one of its stripes, or in none. Each
    /// ridden round counts the write as one of its writers until `complete`, and is no longer taken as flushed.
    ///
    /// All or none, because a writer that rides must not then wait for a round of its own: that wait may be for
    /// ring space that only retiring the ridden round would free, and the round cannot retire before this writer
    /// completes. A window that rode in one stripe and logged another hung every writer once the ring filled
    /// (`integrity_log::a_window_that_rides_and_logs_never_waits_on_its_own_ride`).
    pub(super) fn take_rides(
        &self,
        views: &[StripeView<'_>],
        all_active: bool,
        logged: &mut Logged<'_>,
    ) -> bool {
        if !all_active {
            return false;
        }
        let mut st = self.lock();
        if st.retiring || st.wanting_room > 0 {
            // A retirement must not find a round it is retiring ridden again.
            return false;
        }
        let ridden = |v: &StripeView<'_>| -> Option<u64> {
            let (index, _) = v.single_chunk()?;
            let log = st.stripes.get(&v.stripe)?;
            let stream = log.newest_stream()?;
            // Journal mode: not beside a live data entry, which recovery would roll forward over the ride's
            // pages (markers void one; a ride logs none).
            let rides = stream.seq >= st.retired_seq
                && !(self.journal && log.has_live_data_entry(st.retired_seq))
                && stream.health_epoch == logged.health_epoch
                && stream.index == index
                && stream.range.start <= v.r.start
                && v.r.end <= stream.range.end
                && log.dirty_over(&stream.range, false) & !(1u64 << index) == 0;
            rides.then_some(stream.seq)
        };
        let Some(seqs) = views
            .iter()
            .map(ridden)
            .collect::<Option<Vec<u64>>>()
            .filter(|seqs| !seqs.is_empty())
        else {
            return false;
        };
        for &seq in &seqs {
            *st.inflight.entry(seq).or_insert(0) += 1;
            st.flushed_seq = st.flushed_seq.min(seq);
        }
        drop(st);
        let n = seqs.len() as u64;
        logged.rides = seqs;
        self.add_stats(|s| s.rides += n);
        true
    }

    /// Journal mode with lone answers: whether the write continues a stream in every stripe it touches
    /// (`touches`), none of which has a live data entry: it is `sequential` (its client waits for it, and it
    /// starts within or right after the write its client waited for before, `note_waited_for`); or it changes
    /// one chunk, no other chunk of the stripe has pages not yet durable, and the write starts within or right
    /// after the pages of the stripe's newest entry, a live stream entry of that chunk, or at the start of the
    /// chunk after a stream entry that reached the end of the chunk before it (`follows_a_stream_at`). Such a write
    /// rides stream entries or makes them, logging its partial parity alone (or nothing), as the log does: a
    /// database's commit stream then pays what it pays with the log instead of a data round per commit. Its
    /// writer is answered once written in place, not from the log.
    pub(in crate::array) fn continues_streams(
        &self,
        array: &Array,
        touches: &[StreamTouch],
        sequential: bool,
    ) -> bool {
        if !self.enabled
            || !self.streams
            || !self.journal
            || touches.is_empty()
            || !(0..self.geometry.members).all(|m| array.is_active(m))
        {
            return false;
        }
        let chunk = 0..self.geometry.chunk_bytes;
        let st = self.lock();
        let no_log = StripeLog::default();
        touches.iter().all(|(stripe, one)| {
            let log = st.stripes.get(stripe).unwrap_or(&no_log);
            if log.has_live_data_entry(st.retired_seq) {
                return false; // its data entries would not void that one (`take_rides`)
            }
            if sequential {
                return true; // also over two chunks, where a commit crosses from one to the next
            }
            let Some((index, pages)) = one else {
                return false;
            };
            let continues_entry = log.has_live_entry(st.retired_seq)
                && log.newest_stream().is_some_and(|s| {
                    s.index == *index && s.range.start <= pages.start && pages.start <= s.range.end
                });
            log.dirty_over(&chunk, false) & !(1u64 << index) == 0
                && (continues_entry || self.follows_a_stream_at(&st, *stripe, *index, pages.start))
        })
    }

    /// Journal mode with lone answers: notes a write whose client waits for it (`Array::write_answering`, array
    /// bytes), and says whether it starts within or right after one of the last `WAITED_FOR_KEPT` noted and is
    /// either small (half a stream entry's reach ahead at most: a commit stream, whose next writes ride) or ends
    /// inside a stripe. `continues_streams` sends such a write the log's way. A longer one rides nothing, but
    /// where it ends inside a stripe its stream's next write lands in that stripe, and would wait for the stripe
    /// lock while this one, answered early, is still being written in place: sequential 64 KiB writes at queue
    /// depth 1 on RAID5 of six (members on disk) did 1,220 writes/s with early answers and 1,430 the log's way
    /// (docs/benchmarks.md, "Sequential writes smaller than a stripe (stop 64)"). One that ends at a stripe's end
    /// keeps the early answer: the next write goes to the next stripe. Several kept, not one: commit streams of
    /// several writers at once (a gate on spare CPU lets writes at depth come here) interleave, and each must
    /// still be seen continuing its own (four writers' commit streams with only the last write kept: −32 %
    /// against the bitmap alone, their writes taking the data-first path; `writehole_cost latency:100`, stop 51).
    pub(in crate::array) fn note_waited_for(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if !self.enabled || !self.streams || !self.journal {
            return false;
        }
        let mut st = self.lock();
        let end = offset_bytes + len_bytes;
        let kept = &mut st.recent_waited_for;
        let continued = kept
            .iter()
            .position(|r| r.start <= offset_bytes && offset_bytes <= r.end);
        // The stream continued (or the new one) becomes the newest; the one longest unseen makes room.
        match continued {
            Some(i) => {
                kept.remove(i);
            }
            None if kept.len() == WAITED_FOR_KEPT => {
                kept.pop_front();
            }
            None => {}
        }
        kept.push_back(offset_bytes..end);
        continued.is_some()
            && (len_bytes <= STREAM_PAGES / 2 * PAGE_BYTES
                || !end.is_multiple_of(self.geometry.stripe_bytes()))
    }

    /// Whether `v` writes the start of a data chunk whose predecessor in the array (the chunk before it in array
    /// order) ends in a stream entry that reached its end: a stream crossing into the next chunk, which then
    /// extends at once instead of logging its first pages on their own.
    pub(super) fn follows_a_stream(&self, st: &LogState, v: &StripeView<'_>) -> bool {
        v.single_chunk().is_some_and(|(index, pages)| {
            self.follows_a_stream_at(st, v.stripe, index, pages.start)
        })
    }

    /// `follows_a_stream` for a write into data chunk `index` of `stripe` from in-chunk byte `start`.
    pub(super) fn follows_a_stream_at(
        &self,
        st: &LogState,
        stripe: u64,
        index: usize,
        start: u64,
    ) -> bool {
        let g = self.geometry;
        let k = g.data_per_stripe() as u64;
        let chunk = stripe * k + index as u64;
        if start != 0 || chunk == 0 {
            return false;
        }
        let (stripe, index) = ((chunk - 1) / k, ((chunk - 1) % k) as usize);
        st.stripes.get(&stripe).is_some_and(|log| {
            log.newest_stream()
                .is_some_and(|s| s.index == index && s.range.end == g.chunk_bytes)
        })
    }

    /// The stream entry for `v` if the write changes one data chunk and no other chunk of the stripe has pages
    /// not yet durable: over R, or (the write continues a stream seen twice: the stripe's newest entry is a stream
    /// entry of the same chunk that this write continues, made by a write that continued one itself, or
    /// `after_stream`, see `follows_a_stream`) from R up to `STREAM_PAGES` pages ahead, the partial parity there
    /// read from the members. Not in regions awaiting resync (their parity may not match the data it would be read
    /// against).
    pub(super) fn stream_entry(
        &self,
        array: &Array,
        v: &StripeView<'_>,
        log: &StripeLog,
        after_stream: bool,
        slots: [Option<usize>; 3],
    ) -> Option<(Entry, NewStream)> {
        let g = self.geometry;
        let (index, pages) = v.single_chunk()?;
        let chunk = 0..g.chunk_bytes;
        if *pages != v.r
            || log.dirty_over(&chunk, false) & !(1u64 << index) != 0
            || array.integrity.awaits_resync(v.stripe)
        {
            return None;
        }
        let continued_entry = log
            .newest_stream()
            .filter(|s| s.index == index && s.range.start <= v.r.start && v.r.start <= s.range.end);
        // Reach ahead only for a stream seen twice in a row (this write continues an entry whose own write
        // continued another), or after a stream that filled the chunk before: random small writes land on the
        // page after another's often enough (over NBD at QD32, RAID6 random 4 KiB writes: 2.2 % of them), and each
        // such extension read and logged sixteen pages that no write then rode (docs/benchmarks.md, "Streams seen
        // twice before they reach ahead (stop 40)").
        let continues = after_stream || continued_entry.is_some_and(|s| s.continued);
        let ahead_end = (v.r.end + STREAM_PAGES * PAGE_BYTES).min(g.chunk_bytes);
        // Reaching ahead reads the chunk and the parity there: with the slow member (slow.rs) among them the write
        // would wait for it, so the entry covers R alone and the next write logs an entry of its own.
        let reads_slow = array.slow_slot().is_some_and(|slot| {
            (g.data_per_stripe()..g.data_per_stripe() + g.level.parity_chunks())
                .chain([index])
                .any(|i| g.stripe_member(v.stripe, i) == slot)
        });
        let ahead = if continues && v.r.end < ahead_end && !reads_slow {
            self.stream_ahead(array, v.stripe, index, v.r.end..ahead_end)
        } else {
            None
        };
        let own = self.partial_parity(array, v, 1u64 << index, v.r.clone());
        let (range, payload) = match ahead {
            None => (v.r.clone(), own),
            Some(ahead) => {
                // PP over R then ahead, and (RAID6) QP over R then ahead.
                let np = g.level.parity_chunks();
                let (own_len, ahead_len) = (own.len() / np, ahead.len() / np);
                let mut payload = AlignedBuf::zeroed(own.len() + ahead.len());
                for part in 0..np {
                    let at = part * (own_len + ahead_len);
                    payload[at..at + own_len]
                        .copy_from_slice(&own[part * own_len..(part + 1) * own_len]);
                    payload[at + own_len..at + own_len + ahead_len]
                        .copy_from_slice(&ahead[part * ahead_len..(part + 1) * ahead_len]);
                }
                self.add_stats(|s| s.stream_extensions += 1);
                (v.r.start..ahead_end, payload)
            }
        };
        let entry = Entry {
            stripe: v.stripe,
            page_first: (range.start / PAGE_BYTES) as u32,
            pages: ((range.end - range.start) / PAGE_BYTES) as u32,
            modified: 1u64 << index,
            payload: Some(payload),
            slots,
            data_index: None,
        };
        let new = NewStream {
            stripe: v.stripe,
            index,
            range,
            continued: after_stream || continued_entry.is_some(),
        };
        Some((entry, new))
    }

    /// PP (and QP) of `stripe` over the in-chunk bytes `ahead` with data chunk `index` taken out, from the parity
    /// and the chunk as the members hold them (the caller holds the stripe's lock; every member is active and no
    /// other chunk has pages not yet durable there). None if a read fails (the entry then covers R only).
    pub(super) fn stream_ahead(
        &self,
        array: &Array,
        stripe: u64,
        index: usize,
        ahead: Range<u64>,
    ) -> Option<AlignedBuf> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks();
        let len = (ahead.end - ahead.start) as usize;
        let at = array.member_offset(stripe, ahead.start);
        let mut parity = AlignedBuf::zeroed(np * len);
        let mut chunk = AlignedBuf::zeroed(len);
        {
            // Under the stripe's lock, before the window's in-place writes: the stripe cache holds what the
            // members hold (stripe_cache.rs).
            let cache = &array.stripe_cache;
            let mut reqs: Vec<IoReq<'_>> = parity
                .chunks_mut(len)
                .enumerate()
                .filter_map(|(i, b)| {
                    (!cache.fill(stripe, k + i, ahead.start, b))
                        .then(|| IoReq::read(g.stripe_member(stripe, k + i), at, b))
                })
                .collect();
            if !cache.fill(stripe, index, ahead.start, &mut chunk) {
                reqs.push(IoReq::read(g.stripe_member(stripe, index), at, &mut chunk));
            }
            array.run(reqs).ok()?;
        }
        let (pp, qp) = parity.split_at_mut(len);
        take_out(array, index, &chunk, pp, (np == 2).then_some(qp));
        Some(parity)
    }
}

/// A stripe a write touches, for `Ppl::continues_streams`: the stripe, and the data index and in-chunk pages of
/// the one chunk the write changes there (none: it changes several, or a missing member's).
pub(in crate::array) type StreamTouch = (u64, Option<(usize, Range<u64>)>);

/// `StreamTouch`es of a window's stripes.
pub(super) fn stream_touches(views: &[StripeView<'_>]) -> Vec<StreamTouch> {
    views
        .iter()
        .map(|v| {
            let one = v
                .single_chunk()
                .filter(|(_, pages)| **pages == v.r)
                .map(|(index, pages)| (index, pages.clone()));
            (v.stripe, one)
        })
        .collect()
}
