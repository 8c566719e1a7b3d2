//! Assembly: reading the rings back, pairing RAID6 halves, and recomputing parity of live entries.

use super::*;

/// An entry found in a ring at assembly.
#[derive(Debug, Clone)]
struct FoundEntry {
    seq: u64,
    stripe: u64,
    page_first: u64,
    pages: u64,
    modified: u64,
    /// Whether the entry has a payload (none: every chunk modified, the partial parity is zero).
    payload: bool,
    /// Its partial parities found (`pages` pages each): RAID6 entries may be split between the rings of the P and
    /// the Q member, and recovery pairs the halves (`pair_halves`).
    pp: Option<Vec<u8>>,
    qp: Option<Vec<u8>>,
}

impl FoundEntry {
    /// Entries of one round are told apart by what they cover (stripe writes of one round do not overlap).
    fn key(&self) -> (u64, u64, u64, u64, u64) {
        (
            self.seq,
            self.stripe,
            self.page_first,
            self.pages,
            self.modified,
        )
    }
}

/// A data entry found in a ring at assembly (journal mode, `FLAG_DATA`): chunk `index`'s new contents over the
/// pages, or (`bytes` None) a marker that the pages hold what they hold.
#[derive(Debug, Clone)]
struct FoundData {
    seq: u64,
    stripe: u64,
    index: usize,
    page_first: u64,
    pages: u64,
    bytes: Option<Vec<u8>>,
}

/// Per data chunk (index) and page of one chunk's pages: the newest entry that says what the page holds, as
/// (round, the contents to roll forward, or None: as found).
type Deciders<'a> = Vec<Vec<Option<(u64, Option<&'a [u8]>)>>>;

/// What assembly found in the rings and what recovering it did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogRecovery {
    /// Records that counted (checksums, UUID and sequence number right), entries in them.
    pub records: u64,
    pub entries: u64,
    /// Stripes whose parity was recomputed, and how many pages of them.
    pub stripes: u64,
    pub pages: u64,
    /// Chunks of members missing at restart solved from partial parity (they were not being written).
    pub solved_from_log: u64,
    /// Journal mode: chunk pages whose new contents were written in place from the log (rolled forward).
    pub pages_rolled_forward: u64,
    /// The highest sequence number seen (the log continues above it).
    pub max_seq: u64,
}

impl Ppl {
    /// Reads the ring header of every active member: the log continues above the highest `retired_seq` (a clean
    /// array has nothing live in its rings).
    pub(crate) fn resume(&self, array: &Array) -> Result<(), EngineError> {
        let slots: Vec<usize> = array.active_slots().collect();
        let mut headers = AlignedBuf::zeroed(PAGE * slots.len().max(1));
        let reqs: Vec<IoReq<'_>> = headers
            .chunks_mut(PAGE)
            .zip(&slots)
            .map(|(b, &slot)| IoReq::read(slot, self.offset_bytes, b))
            .collect();
        array.run(reqs)?;
        let retired = headers
            .chunks(PAGE)
            .take(slots.len())
            .map(|h| self.decode_ring_header(h))
            .max()
            .unwrap_or(0);
        self.continue_after(retired.max(1) - 1, retired);
        Ok(())
    }

    /// The log continues with sequence numbers above `max_seq`; records below `retired` are void.
    fn continue_after(&self, max_seq: u64, retired: u64) {
        let mut st = self.lock();
        st.next_seq = max_seq + 1;
        st.retired_seq = retired;
        st.flushed_seq = retired;
    }

    fn decode_ring_header(&self, page: &[u8]) -> u64 {
        let version = get_u32(page, 8);
        let valid = page[0..8] == RING_MAGIC
            && matches!(version, LOG_VERSION_WHOLE | LOG_VERSION | LOG_VERSION_DATA)
            && page[16..32] == self.uuid.0
            && get_u32(page, CHECKSUM_AT) == crc32c(&page[..CHECKSUM_AT]);
        if valid {
            get_u64(page, 32)
        } else {
            0
        }
    }

    /// Assembly of a dirty array: reads every active member's ring and recomputes the parity of every stripe
    /// that a live entry names (from the log where a member is missing, from the data otherwise), flushes, and
    /// retires the whole log. Runs before the array serves anything.
    pub(crate) fn recover(&self, array: &Array) -> Result<LogRecovery, EngineError> {
        let g = self.geometry;
        let slots: Vec<usize> = array.active_slots().collect();
        let ring_bytes = (self.ring_pages as usize + 1) * PAGE;
        let mut found: Vec<FoundEntry> = Vec::new();
        let mut found_data: Vec<FoundData> = Vec::new();
        let mut report = LogRecovery::default();
        let mut retired = 0u64;
        for &slot in &slots {
            let mut area = AlignedBuf::zeroed(ring_bytes);
            array.run(vec![IoReq::read(slot, self.offset_bytes, &mut area)])?;
            retired = retired.max(self.decode_ring_header(&area[..PAGE]));
            let before = found.len();
            let (records, entries) = self.parse_ring(&area, &mut found, &mut found_data);
            log::trace!(
                "partial parity log recovery: slot {slot} (ring retired below {}): rounds {:?}",
                self.decode_ring_header(&area[..PAGE]),
                found[before..]
                    .iter()
                    .map(|e| (e.seq, e.stripe))
                    .collect::<Vec<_>>()
            );
            report.records += records;
            report.entries += entries;
        }
        report.max_seq = found
            .iter()
            .map(|e| e.seq)
            .chain(found_data.iter().map(|d| d.seq))
            .max()
            .unwrap_or(0)
            .max(retired);
        // Records below the highest retired_seq of any member are void everywhere (retirement is global).
        found.retain(|e| e.seq >= retired);
        found_data.retain(|d| d.seq >= retired);
        // A data entry is on several rings (the parity members' and its chunk's): one copy of each.
        found_data.sort_by_key(|d| {
            (
                d.stripe,
                d.seq,
                d.index,
                d.page_first,
                d.pages,
                d.bytes.is_none(),
            )
        });
        found_data.dedup_by_key(|d| (d.stripe, d.seq, d.index, d.page_first, d.pages));
        let found = self.pair_halves(array, found);
        for e in &found {
            log::trace!(
                "partial parity log recovery: live entry of round {} (retired below {retired}): stripe {} pages {}+{} \
                 modified {:#b}",
                e.seq,
                e.stripe,
                e.page_first,
                e.pages,
                e.modified
            );
        }
        let mut by_stripe: BTreeMap<u64, (Vec<FoundEntry>, Vec<FoundData>)> = BTreeMap::new();
        for e in found {
            by_stripe.entry(e.stripe).or_default().0.push(e);
        }
        for d in found_data {
            by_stripe.entry(d.stripe).or_default().1.push(d);
        }
        let chunk_pages = g.chunk_bytes / PAGE_BYTES;
        let k = g.data_per_stripe();
        for (stripe, (entries, data)) in &mut by_stripe {
            for d in data.iter() {
                log::trace!(
                    "partial parity log recovery: data entry of round {}: stripe {stripe} chunk {} pages {}+{}{}",
                    d.seq,
                    d.index,
                    d.page_first,
                    d.pages,
                    if d.bytes.is_some() { "" } else { " (marker)" }
                );
            }
            let deciders = deciders(k, chunk_pages, data);
            // Pages whose newest data entry carries contents but no partial parity entry of theirs was found (its
            // parity members are missing, or its round was cut short): recovered as if every chunk were modified.
            let rolled = |page: u64| {
                (0..k).any(|i| matches!(deciders[i][page as usize], Some((_, Some(_)))))
            };
            let mut uncovered: Vec<u64> = (0..chunk_pages).filter(|&p| rolled(p)).collect();
            uncovered.retain(|p| {
                !entries
                    .iter()
                    .any(|e| (e.page_first..e.page_first + e.pages).contains(p))
            });
            for page in uncovered {
                entries.push(FoundEntry {
                    seq: 0,
                    stripe: *stripe,
                    page_first: page,
                    pages: 1,
                    modified: all_data(k),
                    payload: false,
                    pp: None,
                    qp: None,
                });
            }
            // Per page, the newest entry covering it decides.
            let mut winner: Vec<Option<usize>> = vec![None; chunk_pages as usize];
            for (i, e) in entries.iter().enumerate() {
                for page in e.page_first..e.page_first + e.pages {
                    let w = &mut winner[page as usize];
                    if w.is_none_or(|j| entries[j].seq < e.seq) {
                        *w = Some(i);
                    }
                }
            }
            let mut page = 0u64;
            while page < chunk_pages {
                let Some(i) = winner[page as usize] else {
                    page += 1;
                    continue;
                };
                let mut end = page + 1;
                while end < chunk_pages && winner[end as usize] == Some(i) {
                    end += 1;
                }
                let (solved, rolled) =
                    self.recover_run(array, *stripe, page..end, &entries[i], data, &deciders)?;
                report.solved_from_log += solved;
                report.pages_rolled_forward += rolled;
                report.pages += end - page;
                page = end;
            }
            report.stripes += 1;
        }
        let reqs: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
        array.run(reqs)?;
        self.continue_after(report.max_seq, retired);
        self.retire_all(array)?;
        Ok(report)
    }

    /// Joins the halves of split RAID6 entries (PP from the P member's ring, QP from the Q member's) and keeps
    /// what recovery can use. An entry missing a half whose member is missing at restart is whole enough: every
    /// case with that parity member gone needs only the other half. One missing a half whose member is present
    /// belongs to a round whose records were not all written when the power went (a ring that lost a live half
    /// otherwise, a member joining with an empty one, is emptied only after every round was retired: see
    /// `member_joined`), so its in-place writes never started: with at most one unmodified data chunk missing
    /// its half still solves the stripe (the entry is valid from the moment it was made); with two it cannot, and
    /// it is dropped, leaving the stripe to the older entries it did not get to replace.
    fn pair_halves(&self, array: &Array, found: Vec<FoundEntry>) -> Vec<FoundEntry> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        if g.level != Level::Raid6 {
            return found;
        }
        let mut by_key: BTreeMap<(u64, u64, u64, u64, u64), FoundEntry> = BTreeMap::new();
        for e in found {
            match by_key.get_mut(&e.key()) {
                Some(have) => {
                    have.pp = have.pp.take().or(e.pp);
                    have.qp = have.qp.take().or(e.qp);
                }
                None => {
                    by_key.insert(e.key(), e);
                }
            }
        }
        by_key
            .into_values()
            .filter_map(|e| {
                if !e.payload || (e.pp.is_some() && e.qp.is_some()) {
                    return Some(e);
                }
                let absent_parity = if e.pp.is_none() { k } else { k + 1 };
                if !array.is_active(g.stripe_member(e.stripe, absent_parity)) {
                    return Some(e);
                }
                let unmodified_missing = (0..k)
                    .filter(|&i| {
                        e.modified & (1 << i) == 0 && !array.is_active(g.stripe_member(e.stripe, i))
                    })
                    .count();
                if unmodified_missing <= 1 {
                    return Some(e);
                }
                log::warn!(
                    "partial parity log: round {} wrote only half of stripe {}'s entry (pages {}+{}) before it \
                     stopped, and two of its data chunks are missing: the stripe is left to its older entries",
                    e.seq,
                    e.stripe,
                    e.page_first,
                    e.pages
                );
                None
            })
            .collect()
    }

    /// Collects the counting records of one ring into `found`; returns (records, entries).
    fn parse_ring(
        &self,
        area: &[u8],
        found: &mut Vec<FoundEntry>,
        found_data: &mut Vec<FoundData>,
    ) -> (u64, u64) {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks() as u64;
        let chunk_pages = g.chunk_bytes / PAGE_BYTES;
        let pages_total = (area.len() / PAGE) as u64;
        let (mut records, mut entries) = (0, 0);
        let mut page = 1u64;
        while page < pages_total {
            let header = &area[page as usize * PAGE..(page as usize + 1) * PAGE];
            let payload_pages = get_u32(header, 40) as u64;
            let n = get_u32(header, 12) as usize;
            let version = get_u32(header, 8);
            let plausible = header[0..8] == RECORD_MAGIC
                && matches!(version, LOG_VERSION_WHOLE | LOG_VERSION | LOG_VERSION_DATA)
                && header[16..32] == self.uuid.0
                && n <= ENTRIES_PER_RECORD
                && page + 1 + payload_pages <= pages_total
                && get_u32(header, CHECKSUM_AT) == crc32c(&header[..CHECKSUM_AT]);
            if !plausible {
                page += 1;
                continue;
            }
            let from = (page + 1) as usize * PAGE;
            let record_payload = &area[from..from + payload_pages as usize * PAGE];
            if get_u32(header, 44) != crc32c(record_payload) {
                page += 1; // torn: its writes never started
                continue;
            }
            let seq = get_u64(header, 32);
            for e in 0..n {
                let at = ENTRIES_AT + e * ENTRY_BYTES;
                let entry = FoundEntry {
                    seq,
                    stripe: get_u64(header, at),
                    page_first: get_u32(header, at + 8) as u64,
                    pages: get_u32(header, at + 12) as u64,
                    modified: get_u64(header, at + 16),
                    payload: false,
                    pp: None,
                    qp: None,
                };
                let payload_page = get_u32(header, at + 24) as u64;
                let flags = header[at + 28];
                let has_payload = flags & FLAG_PAYLOAD != 0;
                if version == LOG_VERSION_DATA && flags & FLAG_DATA != 0 {
                    let index = entry.modified as usize;
                    let sane = entry.stripe < g.stripes()
                        && entry.pages > 0
                        && entry.page_first + entry.pages <= chunk_pages
                        && index < k
                        && (!has_payload || payload_page + entry.pages <= payload_pages);
                    if !sane {
                        log::warn!(
                            "partial parity log: data entry {e} of record {seq} is out of range; ignored"
                        );
                        continue;
                    }
                    let bytes = has_payload.then(|| {
                        let from = payload_page as usize * PAGE;
                        record_payload[from..from + entry.pages as usize * PAGE].to_vec()
                    });
                    found_data.push(FoundData {
                        seq,
                        stripe: entry.stripe,
                        index,
                        page_first: entry.page_first,
                        pages: entry.pages,
                        bytes,
                    });
                    entries += 1;
                    continue;
                }
                // Version 1 holds every payload whole.
                let parts = match (has_payload, version) {
                    (false, _) => 0,
                    (true, LOG_VERSION_WHOLE) if np == 2 => FLAG_PP | FLAG_QP,
                    (true, LOG_VERSION_WHOLE) => FLAG_PP,
                    (true, _) => flags & (FLAG_PP | FLAG_QP),
                };
                let part_count = u64::from(parts.count_ones());
                let sane = entry.stripe < g.stripes()
                    && entry.pages > 0
                    && entry.page_first + entry.pages <= chunk_pages
                    && entry.modified & !all_data(k) == 0
                    && (!has_payload
                        || (part_count > 0
                            && (np == 2 || parts == FLAG_PP)
                            && payload_page + part_count * entry.pages <= payload_pages));
                if !sane {
                    log::warn!(
                        "partial parity log: entry {e} of record {seq} is out of range; ignored"
                    );
                    continue;
                }
                let span = entry.pages as usize * PAGE;
                let mut at = payload_page as usize * PAGE;
                let mut take = |flag: u8| {
                    (parts & flag != 0).then(|| {
                        at += span;
                        record_payload[at - span..at].to_vec()
                    })
                };
                let (pp, qp) = (take(FLAG_PP), take(FLAG_QP));
                found.push(FoundEntry {
                    payload: has_payload,
                    pp,
                    qp,
                    ..entry
                });
                entries += 1;
            }
            records += 1;
            page += 1 + payload_pages;
        }
        (records, entries)
    }

    /// Makes pages `pages` of `stripe` consistent following `entry`, with the data entries' contents rolled forward
    /// where they decide (`deciders`); returns the chunks solved from the log and the chunk pages rolled forward.
    fn recover_run(
        &self,
        array: &Array,
        stripe: u64,
        pages: Range<u64>,
        entry: &FoundEntry,
        data: &[FoundData],
        deciders: &Deciders<'_>,
    ) -> Result<(u64, u64), EngineError> {
        let g = self.geometry;
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks();
        let has_q = np == 2;
        let len = ((pages.end - pages.start) * PAGE_BYTES) as usize;
        let lo = pages.start * PAGE_BYTES;
        let at = array.member_offset(stripe, lo);
        let mut bufs: Vec<AlignedBuf> = (0..k + np).map(|_| AlignedBuf::zeroed(len)).collect();
        let members: Vec<usize> = (0..k + np).map(|i| g.stripe_member(stripe, i)).collect();
        let missing: Vec<usize> = (0..k + np)
            .filter(|i| !array.is_active(members[*i]))
            .collect();
        {
            let reqs: Vec<IoReq<'_>> = bufs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| !missing.contains(i))
                .map(|(i, b)| IoReq::read(members[i], at, b))
                .collect();
            array.run(reqs)?;
        }
        let modified = |i: usize| entry.modified & (1 << i) != 0;
        let unmodified_missing: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|i| *i < k && !modified(*i))
            .collect();
        let modified_missing: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|i| *i < k && modified(*i))
            .collect();
        log::trace!(
            "partial parity log recovery: stripe {stripe} pages {pages:?} by round {} modified {:#b}: missing \
             {missing:?}, unmodified missing {unmodified_missing:?}, modified missing {modified_missing:?}",
            entry.seq,
            entry.modified
        );
        let fail = |source| EngineError::ReconstructStripe { stripe, source };
        if !unmodified_missing.is_empty() {
            // A stripe whose modified chunks are zero and whose parity is PP/QP is consistent: solve it (from the
            // halves there are: `pair_halves` kept only entries whose halves suffice).
            assert!(
                entry.payload,
                "an entry without payload counts every chunk as modified"
            );
            let from = ((lo / PAGE_BYTES - entry.page_first) * PAGE_BYTES) as usize;
            let halves = [&entry.pp, &entry.qp];
            let mut solve = unmodified_missing.clone();
            solve.extend((k..k + np).filter(|i| halves[i - k].is_none()));
            assert!(
                solve.len() <= np,
                "stripe {stripe}: more unknowns than partial parities"
            );
            let mut virt: Vec<Vec<u8>> = (0..k + np)
                .map(|i| match (i >= k).then(|| halves[i - k]) {
                    Some(Some(half)) => half[from..from + len].to_vec(),
                    Some(None) => vec![0u8; len],
                    None if modified(i) || missing.contains(&i) => vec![0u8; len],
                    None => bufs[i].to_vec(),
                })
                .collect();
            // The partial parity holds each unmodified chunk as it was when the entry was made: a chunk page a
            // live data entry carried, not yet durable then (the entry did not count it as modified: journal
            // mode, `dirty_over`), as that entry has it, whatever the member kept.
            for (i, v) in virt.iter_mut().enumerate().take(k) {
                if modified(i) || missing.contains(&i) {
                    continue;
                }
                for page in pages.clone() {
                    if let Some(bytes) = carried_before(data, i, page, entry.seq) {
                        let at = ((page - pages.start) * PAGE_BYTES) as usize;
                        v[at..at + PAGE].copy_from_slice(bytes);
                    }
                }
            }
            let mut refs: Vec<&mut [u8]> = virt.iter_mut().map(|v| &mut v[..]).collect();
            array
                .parity
                .recover(&mut refs, has_q, &solve)
                .map_err(fail)?;
            for &i in &unmodified_missing {
                bufs[i].copy_from_slice(&virt[i]);
            }
        }
        if !modified_missing.is_empty() {
            // Being written when the power went and now missing: whatever the parity on the members says.
            let mut solve: Vec<usize> = modified_missing.clone();
            solve.extend(missing.iter().copied().filter(|i| *i >= k));
            let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            array
                .parity
                .recover(&mut refs, has_q, &solve)
                .map_err(fail)?;
        }
        // Roll forward: the chunks solved or read above as they were; their newest data entries' contents now
        // (after the solving, which needs the partial parity's view of the chunks).
        let mut rolled_chunks: Vec<usize> = Vec::new();
        let mut rolled = 0u64;
        for (i, buf) in bufs.iter_mut().enumerate().take(k) {
            for page in pages.clone() {
                if let Some((_, Some(bytes))) = deciders[i][page as usize] {
                    let at = ((page - pages.start) * PAGE_BYTES) as usize;
                    buf[at..at + PAGE].copy_from_slice(bytes);
                    rolled += 1;
                    if rolled_chunks.last() != Some(&i) {
                        rolled_chunks.push(i);
                    }
                }
            }
        }
        {
            let (data, parity) = bufs.split_at_mut(k);
            let data: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
            let (p, q) = parity.split_at_mut(1);
            match q.first_mut() {
                Some(q) => array.parity.gen_pq(&data, &mut p[0], q),
                None => array.parity.gen_p(&data, &mut p[0]),
            }
        }
        let reqs: Vec<IoReq<'_>> = (k..k + np)
            .chain(rolled_chunks)
            .filter(|i| !missing.contains(i))
            .map(|i| IoReq::write(members[i], at, &bufs[i], false))
            .collect();
        array.stripe_cache.forget(stripe, 1); // new parity (stripe_cache.rs)
        array.run(reqs)?;
        Ok((unmodified_missing.len() as u64, rolled))
    }
}

/// The contents of chunk `index`'s page `page` in the newest data entry older than round `before`, if that entry
/// carries contents (a marker: as found).
fn carried_before(data: &[FoundData], index: usize, page: u64, before: u64) -> Option<&[u8]> {
    data.iter()
        .filter(|d| d.index == index && d.seq < before)
        .filter(|d| (d.page_first..d.page_first + d.pages).contains(&page))
        .max_by_key(|d| d.seq)
        .and_then(|d| {
            let at = ((page - d.page_first) as usize) * PAGE;
            d.bytes.as_deref().map(|b| &b[at..at + PAGE])
        })
}

/// Per data chunk and page of a stripe's chunks, the newest data entry (`Deciders`): its contents, or as found for
/// a marker. Only data entries decide: an entry without payload may mean a full-stripe write (which logs markers
/// in journal mode, on the chunks' own rings too) or only that every chunk of a partial write's stripe was not yet
/// durable, and then the older data entries still hold what was answered.
fn deciders(k: usize, chunk_pages: u64, data: &[FoundData]) -> Deciders<'_> {
    let mut deciders: Deciders<'_> = vec![vec![None; chunk_pages as usize]; k];
    for d in data {
        for page in d.page_first..d.page_first + d.pages {
            let at = ((page - d.page_first) as usize) * PAGE;
            let slot = &mut deciders[d.index][page as usize];
            if slot.is_none_or(|(seq, _)| seq <= d.seq) {
                *slot = Some((d.seq, d.bytes.as_deref().map(|b| &b[at..at + PAGE])));
            }
        }
    }
    deciders
}
