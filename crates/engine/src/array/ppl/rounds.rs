//! Group commit: rounds of queued entries laid out as records, placed in the rings and written.

use super::*;

impl Ppl {
    /// Queues `entries` and returns once they are durable (the round they went out in).
    pub(super) fn commit(&self, array: &Array, entries: Vec<Entry>) -> Result<u64, EngineError> {
        self.commit_reserving(array, entries, Vec::new())
            .map(|(round, _)| round)
    }

    /// `commit`, with `reserve` pages per member's ring (by slot) set aside in the round for records written
    /// later with its sequence number (`write_reserved`); returns the round and the space.
    pub(super) fn commit_reserving(
        &self,
        array: &Array,
        entries: Vec<Entry>,
        reserve: Vec<u64>,
    ) -> Result<(u64, Reserved), EngineError> {
        let mut st = self.lock();
        let id = st.next_submission;
        st.next_submission += 1;
        st.queue.push_back(Submission {
            id,
            entries,
            reserve,
        });
        loop {
            if let Some(done) = st.done.remove(&id) {
                let reserved = st.reserved.remove(&id).unwrap_or_default();
                return done
                    .map(|round| (round, reserved))
                    .map_err(LogFailure::into_error);
            }
            // Lead a round if one may start; otherwise the queue waits for the next free one (group commit).
            if st.rounds_writing < self.rounds_in_flight && !st.queue.is_empty() && !st.paused {
                st.rounds_writing += 1;
                st = self.lead(array, st, id);
                st.rounds_writing -= 1;
                self.wake_after_round(&st);
                continue;
            }
            st = self.wait_for_round(st, id);
        }
    }

    /// Writes one round of queued submissions: takes them (within the budget), lays them out as records, gets
    /// ring space and the round's sequence number together, and writes the records with FUA. `own` is the
    /// leader's own submission, which another leader's round may have taken.
    fn lead<'a>(
        &'a self,
        array: &Array,
        mut st: MutexGuard<'a, LogState>,
        own: u64,
    ) -> MutexGuard<'a, LogState> {
        // Take submissions in order while every member's share stays within the budget.
        let has_q = self.geometry.level == Level::Raid6;
        let mut taken: Vec<Submission> = Vec::new();
        let mut pages = vec![0u64; self.geometry.members];
        while let Some(sub) = st.queue.front() {
            let mut add = vec![0u64; self.geometry.members];
            for e in &sub.entries {
                for slot in e.slots.iter().flatten() {
                    add[*slot] += record_entry_pages(&(e, e.parts_on(*slot, has_q)));
                }
            }
            for (slot, pages) in sub.reserve.iter().enumerate() {
                add[slot] += pages;
            }
            let fits = pages
                .iter()
                .zip(&add)
                .all(|(have, more)| have + more <= self.round_budget_pages);
            if !taken.is_empty() && !fits {
                break;
            }
            for (have, more) in pages.iter_mut().zip(&add) {
                *have += more;
            }
            let sub = st.queue.pop_front().expect("front exists");
            taken.push(sub);
        }
        let (mut st, result) = self.write_round(array, &mut taken, st, own);
        match result {
            Ok(None) => {
                // Given up: back to the front of the queue, in their order, for the next leader.
                if self.spread {
                    self.back_on_parity_rings(&mut taken);
                }
                for sub in taken.into_iter().rev() {
                    st.queue.push_front(sub);
                }
            }
            Ok(Some(round)) => {
                for sub in &taken {
                    st.done.insert(sub.id, Ok(round));
                }
            }
            Err((round, failure)) => {
                for sub in &taken {
                    st.done.insert(sub.id, Err(failure.clone()));
                }
                // Those writers will not write in place; they do not hold the round back.
                if let Some(round) = round {
                    st.inflight.remove(&round);
                }
            }
        }
        st
    }

    /// Lays the round out as records, finds ring space (retiring old records if needed), takes the round's
    /// sequence number with it, and writes the records with FUA. Returns the round, or the failure (and the
    /// round if it had one), or None when it gave up waiting for space because the leader's own submission
    /// (`own`) went out in another leader's round.
    #[allow(clippy::type_complexity)]
    fn write_round<'a>(
        &'a self,
        array: &Array,
        taken: &mut [Submission],
        mut st: MutexGuard<'a, LogState>,
        own: u64,
    ) -> (
        MutexGuard<'a, LogState>,
        Result<Option<u64>, (Option<u64>, LogFailure)>,
    ) {
        if self.spread {
            self.spread_round(array, &mut st, taken);
        }
        let taken: &[Submission] = taken;
        let mut records = self.layout(taken.iter().flat_map(|s| &s.entries));
        let mut record_pages: Vec<u64> = records
            .iter()
            .map(|(_, entries)| 1 + entries.iter().map(record_entry_pages).sum::<u64>())
            .collect();
        // Space set aside for records written later (`commit_reserving`): placed as records without entries.
        let mut reserving: Vec<(u64, usize)> = Vec::new();
        for sub in taken {
            for (slot, &pages) in sub.reserve.iter().enumerate() {
                if pages > 0 {
                    reserving.push((sub.id, records.len()));
                    records.push((slot, Vec::new()));
                    record_pages.push(pages);
                }
            }
        }
        // Ring space for every record, all or nothing; the sequence number goes with it, so that rings fill in
        // sequence order and a round waiting for space never holds one back that could free it.
        let mut placed: Vec<u64> = Vec::with_capacity(records.len());
        let round = loop {
            placed.clear();
            let mut cursors: Vec<RingCursor> = st.rings.iter().map(|r| r.cursor()).collect();
            for ((slot, _), &pages) in records.iter().zip(&record_pages) {
                match cursors[*slot].place(pages, self.ring_pages) {
                    Some(start) => placed.push(start),
                    None => break,
                }
            }
            if placed.len() == records.len() {
                let round = st.next_seq;
                st.next_seq += 1;
                *st.inflight.entry(round).or_insert(0) += taken.len();
                if self.spread {
                    self.settle(&mut st, taken, round);
                }
                if log::log_enabled!(log::Level::Trace) {
                    for e in taken.iter().flat_map(|s| &s.entries) {
                        log::trace!(
                            "partial parity log: round {round}: stripe {} pages {}+{} modified {:#b}{}",
                            e.stripe,
                            e.page_first,
                            e.pages,
                            e.modified,
                            if e.payload.is_some() { "" } else { " (no payload)" }
                        );
                    }
                }
                for (((slot, _), &pages), &start) in records.iter().zip(&record_pages).zip(&placed)
                {
                    let ring = &mut st.rings[*slot];
                    ring.head = start + pages;
                    ring.live.push_back((round, start, pages));
                }
                for &(id, n) in &reserving {
                    let (slot, _) = records[n];
                    st.reserved
                        .entry(id)
                        .or_default()
                        .push((slot, placed[n], record_pages[n]));
                }
                break round;
            }
            // The leader is a writer of the round its own submission went out in, and counts there until it has
            // written in place. Waiting here for that round's writers to complete would wait for itself (with
            // more than one round in flight, sixteen writers on tmpfs hung this way): it gives the round up.
            if st.done.contains_key(&own) {
                if self.spread {
                    self.unsettle(&mut st, taken);
                }
                return (st, Ok(None));
            }
            // Out of space: retire what can be retired, waiting for earlier writers to complete if needed.
            st.wanting_room += 1;
            let (mut guard, result) = self.make_room(array, st);
            guard.wanting_room -= 1;
            st = guard;
            if let Err(failure) = result {
                if self.spread {
                    self.unsettle(&mut st, taken);
                }
                return (st, Err((None, failure)));
            }
        };
        let mirror = live_mirror(&mut st, array);
        drop(st);
        // A record identical to an earlier one of the round (same entries and parts, same order: RAID6 entries of
        // stripes whose P or Q member is missing go whole to the other) is encoded and checksummed once.
        let mut encoded: Vec<AlignedBuf> = Vec::with_capacity(records.len());
        let mut source: Vec<usize> = Vec::with_capacity(records.len());
        // The space set aside is not written now.
        records.truncate(records.len() - reserving.len());
        placed.truncate(records.len());
        for (n, (_, entries)) in records.iter().enumerate() {
            let same = records[..n].iter().position(|(_, earlier)| {
                earlier.len() == entries.len()
                    && earlier
                        .iter()
                        .zip(entries)
                        .all(|(a, b)| std::ptr::eq(a.0, b.0) && a.1 == b.1)
            });
            match same {
                Some(m) => source.push(source[m]),
                None => {
                    source.push(encoded.len());
                    encoded.push(self.encode_record(round, entries));
                }
            }
        }
        let reqs = self.record_reqs(
            records
                .iter()
                .zip(&placed)
                .zip(&source)
                .map(|(((slot, _), start), &buf)| (*slot, *start, &encoded[buf])),
            mirror,
        );
        let record_writes = reqs.len() as u64;
        let result = self.run_log_io(array, reqs);
        self.count_records(taken.iter().flat_map(|t| &t.entries), record_writes, 1);
        (
            self.lock(),
            result.map(|()| Some(round)).map_err(|f| (Some(round), f)),
        )
    }

    /// Per member, the entries it holds (and which of their partial parities), cut into records.
    fn layout<'e>(
        &self,
        entries: impl Iterator<Item = &'e Entry>,
    ) -> Vec<(usize, Vec<RecordEntry<'e>>)> {
        let has_q = self.geometry.level == Level::Raid6;
        let mut per_slot: Vec<Vec<RecordEntry<'_>>> = vec![Vec::new(); self.geometry.members];
        for e in entries {
            for slot in e.slots.iter().flatten() {
                per_slot[*slot].push((e, e.parts_on(*slot, has_q)));
            }
        }
        let mut records: Vec<(usize, Vec<RecordEntry<'_>>)> = Vec::new();
        for (slot, entries) in per_slot.into_iter().enumerate() {
            let mut current: Vec<RecordEntry<'_>> = Vec::new();
            let mut current_pages = 0;
            for (e, parts) in entries {
                let pages = record_entry_pages(&(e, parts));
                if current.len() == ENTRIES_PER_RECORD
                    || (!current.is_empty() && 1 + current_pages + pages > self.round_budget_pages)
                {
                    records.push((slot, std::mem::take(&mut current)));
                    current_pages = 0;
                }
                current_pages += pages;
                current.push((e, parts));
            }
            if !current.is_empty() {
                records.push((slot, current));
            }
        }
        records
    }

    /// Writes `entries` as records of round `round` into the space the round set aside (`commit_reserving`),
    /// with FUA; false, nothing written, when they do not fit there. No other round is waited for: the space is
    /// the round's own, live while the round is.
    pub(super) fn write_reserved(
        &self,
        array: &Array,
        round: u64,
        reserved: &Reserved,
        entries: &[Entry],
    ) -> Result<bool, EngineError> {
        let records = self.layout(entries.iter());
        let mut left: Vec<(usize, u64, u64)> = reserved.clone();
        let mut placed: Vec<u64> = Vec::with_capacity(records.len());
        for (slot, record) in &records {
            let pages = 1 + record.iter().map(record_entry_pages).sum::<u64>();
            let Some(space) = left
                .iter_mut()
                .find(|(s, _, free)| s == slot && *free >= pages)
            else {
                return Ok(false);
            };
            placed.push(space.1);
            space.1 += pages;
            space.2 -= pages;
        }
        // Counted as a write into the space set aside, not as a round: a ring handed over to a replacement
        // (`hand_over_ring`) and the retirement of every round (`retire_all`) wait for both, and the replacement
        // gets this record too from then on (the mirror); but group commit (`rounds_in_flight`) does not wait for
        // it. Counted as a round, on drives (one round in flight) the next writer's data round waited for this
        // record: at queue depth 1 every write paid both, and the data first halved the journal's IOPS instead
        // of saving a round trip (docs/benchmarks.md, "The write-hole cost on random writes over the array (stop
        // 37)").
        let mut st = self.lock();
        while st.paused {
            st = self.wait(st);
        }
        st.reserved_writing += 1;
        let mirror = live_mirror(&mut st, array);
        drop(st);
        let encoded: Vec<AlignedBuf> = records
            .iter()
            .map(|(_, record)| self.encode_record(round, record))
            .collect();
        let reqs = self.record_reqs(
            records
                .iter()
                .zip(&placed)
                .zip(&encoded)
                .map(|(((slot, _), start), buf)| (*slot, *start, buf)),
            mirror,
        );
        if log::log_enabled!(log::Level::Trace) {
            for e in entries {
                log::trace!(
                    "partial parity log: round {round} (set aside): stripe {} pages {}+{} modified {:#b}",
                    e.stripe,
                    e.page_first,
                    e.pages,
                    e.modified,
                );
            }
        }
        let record_writes = reqs.len() as u64;
        let written = self.run_log_io(array, reqs);
        let mut st = self.lock();
        st.reserved_writing -= 1;
        self.wake(st);
        written.map_err(LogFailure::into_error)?;
        self.count_records(entries.iter(), record_writes, 0);
        Ok(true)
    }

    /// FUA writes of encoded records (slot, first page, record), each also to the slot's replacement where
    /// `mirror` names one.
    fn record_reqs<'b>(
        &self,
        records: impl Iterator<Item = (usize, u64, &'b AlignedBuf)>,
        mirror: Option<(usize, usize)>,
    ) -> Vec<IoReq<'b>> {
        let mut reqs = Vec::new();
        for (slot, start, buf) in records {
            reqs.push(IoReq::write(slot, self.record_offset(start), buf, true));
            if let Some((_, io)) = mirror.filter(|(s, _)| *s == slot) {
                reqs.push(IoReq::write(io, self.record_offset(start), buf, true));
            }
        }
        reqs
    }

    /// Counts records written: `rounds` rounds, the entries they hold and their payload, `record_writes` writes.
    fn count_records<'e>(
        &self,
        entries: impl Iterator<Item = &'e Entry>,
        record_writes: u64,
        rounds: u64,
    ) {
        let (mut count, mut payload_bytes) = (0u64, 0u64);
        for e in entries {
            count += 1;
            payload_bytes += e.payload_pages() * PAGE_BYTES;
        }
        self.add_stats(|s| {
            s.rounds += rounds;
            s.entries += count;
            s.payload_bytes += payload_bytes;
            s.record_writes += record_writes;
        });
    }

    fn record_offset(&self, start_page: u64) -> u64 {
        self.offset_bytes + (1 + start_page) * PAGE_BYTES
    }

    fn encode_record(&self, seq: u64, entries: &[RecordEntry<'_>]) -> AlignedBuf {
        let payload_pages: u64 = entries.iter().map(record_entry_pages).sum();
        // The header page is cleared (its unused bytes are zero on disk); the entries' parts fill the payload.
        let mut buf = AlignedBuf::for_overwrite((1 + payload_pages as usize) * PAGE);
        let (header, payload) = buf.split_at_mut(PAGE);
        header.fill(0);
        header[0..8].copy_from_slice(&RECORD_MAGIC);
        let version = if entries.iter().any(|(_, parts)| parts & FLAG_DATA != 0) {
            LOG_VERSION_DATA
        } else {
            LOG_VERSION
        };
        put_u32(header, 8, version);
        put_u32(header, 12, entries.len() as u32);
        header[16..32].copy_from_slice(&self.uuid.0);
        put_u64(header, 32, seq);
        put_u32(header, 40, payload_pages as u32);
        let mut at_page = 0u64;
        for (n, &(e, parts)) in entries.iter().enumerate() {
            let at = ENTRIES_AT + n * ENTRY_BYTES;
            put_u64(header, at, e.stripe);
            put_u32(header, at + 8, e.page_first);
            put_u32(header, at + 12, e.pages);
            put_u64(header, at + 16, e.modified);
            put_u32(header, at + 24, at_page as u32);
            if parts & FLAG_DATA != 0 {
                header[at + 28] = parts; // FLAG_PAYLOAD only if the data is there
            } else if parts != 0 {
                header[at + 28] = FLAG_PAYLOAD | parts;
            }
            if parts != 0 {
                for part in e.parts_bytes(parts) {
                    let from = at_page as usize * PAGE;
                    payload[from..from + part.len()].copy_from_slice(part);
                    at_page += (part.len() / PAGE) as u64;
                }
            }
        }
        assert_eq!(
            at_page, payload_pages,
            "the entries' parts fill the payload"
        );
        let payload_crc = crc32c(payload);
        put_u32(header, 44, payload_crc);
        // The header is mostly zeros past its entries: their share of the CRC is computed, not read.
        let used = ENTRIES_AT + entries.len() * ENTRY_BYTES;
        let crc = checksum_zero_tail(&header[..CHECKSUM_AT], used);
        put_u32(header, CHECKSUM_AT, crc);
        buf
    }

    pub(super) fn encode_ring_header(&self, retired_seq: u64) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(PAGE);
        buf[0..8].copy_from_slice(&RING_MAGIC);
        put_u32(&mut buf, 8, LOG_VERSION);
        buf[16..32].copy_from_slice(&self.uuid.0);
        put_u64(&mut buf, 32, retired_seq);
        let crc = crc32c(&buf[..CHECKSUM_AT]);
        put_u32(&mut buf, CHECKSUM_AT, crc);
        buf
    }

    pub(super) fn run_log_io(&self, array: &Array, reqs: Vec<IoReq<'_>>) -> Result<(), LogFailure> {
        array.run(reqs).map_err(LogFailure::from_error)
    }
}

/// The replacement a slot's records also go to (see `hand_over_ring`), while it is that slot's rebuild target;
/// forgotten once it took the slot over.
fn live_mirror(st: &mut LogState, array: &Array) -> Option<(usize, usize)> {
    let mirror = st
        .mirror
        .filter(|&(slot, io)| array.write_targets(slot, 0)[1] == io);
    if mirror.is_none() {
        st.mirror = None;
    }
    mirror
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::superblock::DEFAULT_DATA_OFFSET_BYTES;
    use crate::{assemble_io, create_io, AssembleOptions, MemMembers};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    /// A leader whose own submission went out in another leader's round is a writer of that round until it has
    /// written in place. With the ring full and that round the oldest live one, waiting for room would wait for
    /// itself (sixteen writers on tmpfs, four rounds in flight, hung this way): it gives its round up, its
    /// submissions back at the front of the queue, and goes on.
    #[test]
    fn a_leader_does_not_wait_for_room_on_a_round_it_is_a_writer_of() {
        let io = Arc::new(MemMembers::new(3, DEFAULT_DATA_OFFSET_BYTES + 16 * 65536));
        create_io(io.as_ref(), Level::Raid5, 65536, "lead").expect("create");
        let mut opts = AssembleOptions::new(Arc::new(paraid_parity::reference::Reference));
        opts.write_hole_log = true;
        opts.log_rounds_in_flight = Some(4);
        let array = Arc::new(assemble_io(io, opts).expect("assemble"));
        array.set_integrity_tick(false);
        let (own, other) = (1_000, 1_001);
        {
            let ppl = array.integrity.ppl().expect("log enabled");
            let mut st = ppl.lock();
            // Round `oldest` went out with the leader's own submission; the leader has not written in place yet,
            // and the round fills every ring.
            let oldest = st.next_seq;
            st.next_seq += 1;
            st.retired_seq = oldest;
            st.inflight.insert(oldest, 1);
            st.done.insert(own, Ok(oldest));
            let ring_pages = ppl.ring_pages;
            for ring in st.rings.iter_mut() {
                ring.live.push_back((oldest, 0, ring_pages));
                ring.head = ring_pages;
            }
            // Another writer's submission is queued: the leader takes it.
            st.queue.push_back(Submission {
                reserve: Vec::new(),
                id: other,
                entries: vec![Entry {
                    stripe: 0,
                    page_first: 0,
                    pages: 1,
                    modified: 1,
                    payload: Some(AlignedBuf::zeroed(PAGE)),
                    slots: [Some(2), None, None],
                    data_index: None,
                }],
            });
            st.rounds_writing += 1;
        }
        let (tx, rx) = mpsc::channel();
        let leader = {
            let array = array.clone();
            std::thread::spawn(move || {
                let ppl = array.integrity.ppl().expect("log enabled");
                let st = ppl.lead(&array, ppl.lock(), own);
                tx.send((
                    st.queue.iter().map(|s| s.id).collect::<Vec<u64>>(),
                    st.done.contains_key(&other),
                    st.wanting_room,
                ))
                .expect("send");
            })
        };
        let (queued, other_done, wanting_room) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the leader waited for room on the round it is a writer of");
        leader.join().expect("leader");
        assert_eq!(
            queued,
            vec![other],
            "the other writer's submission is queued again"
        );
        assert!(!other_done);
        assert_eq!(wanting_room, 0);
    }
}
