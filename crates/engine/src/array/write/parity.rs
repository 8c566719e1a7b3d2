//! RAID5/6 writes: a window of stripes read, merged, its parity computed, logged (ppl/) and written in place, and
//! what the log and the stripe cache are told of it.

use super::*;

/// Writes `extents` of `buf` (one: all of it; more: `write_extents`) at `offset_bytes` plus their starts.
pub(super) fn write_parity<'a>(
    array: &'a Array,
    offset_bytes: u64,
    buf: &[u8],
    extents: &[Range<usize>],
    fua: bool,
    answer: Option<&EarlyAnswer<'a>>,
) -> Result<(), EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let np = g.level.parity_chunks();
    let mut all = extents
        .iter()
        .flat_map(|e| {
            pieces(g.chunk_bytes, offset_bytes + e.start as u64, e.len() as u64).map(move |piece| {
                Piece {
                    buf_at: piece.buf_at + e.start,
                    ..piece
                }
            })
        })
        .map(|piece| Touch {
            index: (piece.chunk % k as u64) as usize,
            piece,
        })
        .peekable();
    let mut touches: Vec<Touch> = Vec::new();
    let mut plans: Vec<StripePlan> = Vec::new();
    let mut first_window = true;
    while all.peek().is_some() {
        touches.clear();
        plans.clear();
        let mut window_bytes = 0usize;
        // The member states the plans are made against (bumped by every state change).
        let mut planned_epoch = array.health.epoch.load(Ordering::SeqCst);
        // Gather whole stripes until the window is full.
        while let Some(first) = all.peek().copied() {
            let stripe = first.piece.chunk / k as u64;
            let start = touches.len();
            while let Some(t) = all.peek().copied() {
                if t.piece.chunk / k as u64 != stripe {
                    break;
                }
                touches.push(t);
                all.next();
            }
            let plan = plan_stripe(array, stripe, &touches, start..touches.len(), 0);
            window_bytes += plan.scratch_bytes(&touches, k, np);
            plans.push(plan);
            if window_bytes >= WINDOW_BYTES || plans.len() as u64 >= WINDOW_STRIPES {
                break;
            }
        }
        // Only a write of one window can be answered from the log: its log round holds all of it.
        let early = answer.filter(|_| first_window && all.peek().is_none());
        first_window = false;
        let first_stripe = plans[0].stripe;
        let stripes = plans[plans.len() - 1].stripe - first_stripe + 1;
        let _guard = array.locks.lock(first_stripe, stripes);
        // Journal mode: the data logged before anything is read, and the writer answered once it is durable
        // (ppl/entries.rs, `log_data_first`). Not where the plans read nothing (the stripe cache holds what they
        // need): the partial parity is then at hand, and one round with both costs a record less for the same
        // single round trip before the answer.
        // Nor where the window continues stream entries (lone answers): it rides or extends them instead, as
        // with the log (`Ppl::continues_streams`).
        if let (Some(answer), Some(ppl)) = (early, array.integrity.ppl()) {
            let reads_members = plans.iter().any(|p| p.reads_members);
            let pieces = (!fua
                && reads_members
                && !ppl.continues_streams(
                    array,
                    &stream_touches(&plans, &touches),
                    answer.sequential,
                ))
            .then(|| data_first_pieces(array, &plans, &touches, buf))
            .flatten();
            if let Some(round) = pieces
                .map(|p| ppl.log_data_first(array, &p))
                .transpose()?
                .flatten()
            {
                *answer.data_round.borrow_mut() = Some(round);
                array.wait_durable()?;
                answer.give();
            }
        }
        retry_window(array, |attempt, unreadable| {
            // The plans were made before the stripes' locks were taken. A write that held them meanwhile may
            // have failed on a member and evicted it: that member's chunks of these stripes then miss that
            // write (its new bytes live only in the parity), so a plan that still reads them would compute
            // parity from stale bytes and write it before anything notices (a redo cannot take that back: it
            // would reconstruct the stale bytes from that parity). Under the locks no write to these stripes
            // fails unnoticed any more, so plans made now read only chunks that hold every acknowledged byte
            // (faults_members::row03_write_queued_behind_a_member_failure_reads_no_stale_chunk, sim seed 218289).
            if attempt > 0 || array.health.epoch.load(Ordering::SeqCst) != planned_epoch {
                // Re-plan with the members as they are now.
                planned_epoch = array.health.epoch.load(Ordering::SeqCst);
                for plan in plans.iter_mut() {
                    *plan = plan_stripe(
                        array,
                        plan.stripe,
                        &touches,
                        plan.touches.clone(),
                        unreadable,
                    );
                }
                window_bytes = plans.iter().map(|p| p.scratch_bytes(&touches, k, np)).sum();
            }
            if rmw_to_rcw_for_log(array, &mut plans, &touches) {
                window_bytes = plans.iter().map(|p| p.scratch_bytes(&touches, k, np)).sum();
            }
            let window = |scratch: &mut [u8]| {
                write_parity_window(array, &plans, &touches, buf, fua, early, scratch)
            };
            // Parity computed in the backend's memory where it lends some: with the request's own bytes in such
            // memory too (`Array::payload_memory`), a GPU serves whole stripes in place.
            let outcome = if array.parity_lends_memory {
                with_batch_scratch(array.parity.as_ref(), window_bytes, window)
            } else {
                with_scratch(window_bytes, window)
            }?;
            if matches!(outcome, Attempt::Done)
                && array.health.epoch.load(Ordering::SeqCst) != planned_epoch
            {
                // A member left while the window was logged or written (its log write failed, say): the
                // window's log entries count the chunks it held as written in place, yet their new contents
                // live only in the parity now. Done again against the members as they are, the window logs
                // entries that keep those contents in the partial parity (sim seeds 4911, 5980, 6017).
                return Ok(Attempt::Redo {
                    unreadable: 0,
                    wrote_in_place: true,
                });
            }
            Ok(outcome)
        })?;
    }
    Ok(())
}

/// Buffers of one stripe, carved from the window's scratch.
pub(super) struct StripeBufs<'s> {
    /// RCW/degraded: every data chunk over R, then (degraded) P and Q over R, in stripe index order.
    /// RMW: the new bytes of each touch over its pages.
    pub(super) chunks: Vec<&'s mut [u8]>,
    /// RMW: the old bytes of each touch over its pages.
    pub(super) old: Vec<&'s mut [u8]>,
    /// RCW/RMW: P (and Q) over R. Degraded keeps them at the end of `chunks`.
    pub(super) parity: Vec<&'s mut [u8]>,
    /// RCW, by data index: the request's own bytes where it overwrites the chunk over all of R from a
    /// page-aligned address (its `chunks` entry is then empty): parity is computed from them and they are
    /// written from there, without a copy into scratch (a sequential writer's whole payload).
    pub(super) direct: Vec<Option<&'s [u8]>>,
}

/// The request's bytes for data index `index` of `plan` if it overwrites the chunk over all of R from a
/// page-aligned address (O_DIRECT members need one), else None.
pub(super) fn direct_bytes<'b>(
    plan: &StripePlan,
    touches: &[Touch],
    index: usize,
    buf: &'b [u8],
) -> Option<&'b [u8]> {
    let t = touches[plan.touches.clone()]
        .iter()
        .find(|t| t.index == index)?;
    let covers_r = t.piece.lo == plan.r.start && t.piece.hi == plan.r.end;
    let bytes = &buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()];
    (covers_r && (bytes.as_ptr() as u64).is_multiple_of(PAGE_BYTES)).then_some(bytes)
}

impl StripeBufs<'_> {
    /// Data chunk `index` over R (RCW and degraded, once merged).
    pub(super) fn data(&self, index: usize) -> &[u8] {
        match self.direct.get(index).copied().flatten() {
            Some(bytes) => bytes,
            None => &self.chunks[index][..],
        }
    }
}

pub(super) fn write_parity_window(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    buf: &[u8],
    fua: bool,
    answer: Option<&EarlyAnswer<'_>>,
    scratch: &mut [u8],
) -> Result<Attempt, EngineError> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let np = g.level.parity_chunks();
    let has_q = g.level == Level::Raid6;
    let mut carver = Carver::new(scratch);
    let mut bufs: Vec<StripeBufs<'_>> = plans
        .iter()
        .map(|plan| {
            let r = page_len(&plan.r);
            match plan.mode {
                Mode::Rcw => {
                    let direct: Vec<Option<&[u8]>> = (0..k)
                        .map(|i| direct_bytes(plan, touches, i, buf))
                        .collect();
                    StripeBufs {
                        chunks: direct
                            .iter()
                            .map(|d| carver.take(if d.is_some() { 0 } else { r }))
                            .collect(),
                        old: Vec::new(),
                        parity: (0..np).map(|_| carver.take(r)).collect(),
                        direct,
                    }
                }
                Mode::Degraded => StripeBufs {
                    chunks: (0..k + np).map(|_| carver.take(r)).collect(),
                    old: Vec::new(),
                    parity: Vec::new(),
                    direct: Vec::new(),
                },
                Mode::Rmw => {
                    let mine = &touches[plan.touches.clone()];
                    StripeBufs {
                        chunks: mine
                            .iter()
                            .map(|t| carver.take(page_len(&t.pages())))
                            .collect(),
                        old: mine
                            .iter()
                            .map(|t| carver.take(page_len(&t.pages())))
                            .collect(),
                        parity: (0..np).map(|_| carver.take(r)).collect(),
                        direct: Vec::new(),
                    }
                }
            }
        })
        .collect();

    // Phase 1: every read of the window in one batch. What an earlier write left in the stripe cache is what the
    // members hold (stripe_cache.rs): those bytes are not read. Degraded stripes read everything they can.
    let cache = &array.stripe_cache;
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    for (plan, b) in plans.iter().zip(bufs.iter_mut()) {
        let s = plan.stripe;
        let mine = &touches[plan.touches.clone()];
        let member_at = |index: usize, in_chunk: u64| {
            (g.stripe_member(s, index), array.member_offset(s, in_chunk))
        };
        match plan.mode {
            Mode::Rcw => {
                for (index, chunk) in b.chunks.iter_mut().enumerate() {
                    if b.direct[index].is_some() {
                        continue; // overwritten whole from the request's bytes: nothing to read
                    }
                    let (member, at) = member_at(index, plan.r.start);
                    let full = match mine.iter().find(|t| t.index == index) {
                        Some(t) => t.full_pages(),
                        None => plan.r.start..plan.r.start,
                    };
                    if full.is_empty() {
                        if plan.readable(index) && !cache.fill(s, index, plan.r.start, chunk) {
                            reqs.push(IoReq::read(member, at, chunk));
                        }
                        continue;
                    }
                    if !plan.readable(index) {
                        // A missing chunk is planned RCW only when the request covers all of R.
                        debug_assert!(full.start == plan.r.start && full.end == plan.r.end);
                        continue;
                    }
                    // Read around the fully overwritten pages.
                    let left = (full.start - plan.r.start) as usize;
                    let right = (full.end - plan.r.start) as usize;
                    let (head, rest) = chunk.split_at_mut(left);
                    let tail = &mut rest[right - left..];
                    if !head.is_empty() && !cache.fill(s, index, plan.r.start, head) {
                        reqs.push(IoReq::read(member, at, head));
                    }
                    if !tail.is_empty() && !cache.fill(s, index, full.end, tail) {
                        reqs.push(IoReq::read(member, array.member_offset(s, full.end), tail));
                    }
                }
            }
            Mode::Degraded => {
                for (index, chunk) in b.chunks.iter_mut().enumerate() {
                    let (member, at) = member_at(index, plan.r.start);
                    if plan.readable(index) {
                        reqs.push(IoReq::read(member, at, chunk));
                    }
                }
            }
            Mode::Rmw => {
                for (t, old) in mine.iter().zip(b.old.iter_mut()) {
                    if cache.fill(s, t.index, t.pages().start, old) {
                        continue;
                    }
                    let (member, at) = member_at(t.index, t.pages().start);
                    reqs.push(IoReq::read(member, at, old));
                }
                for (i, p) in b.parity.iter_mut().enumerate() {
                    if cache.fill(s, k + i, plan.r.start, p) {
                        continue;
                    }
                    let (member, at) = member_at(k + i, plan.r.start);
                    reqs.push(IoReq::read(member, at, p));
                }
            }
        }
    }
    if let Some(redo) = read_window(array, reqs) {
        return Ok(redo);
    }

    // Phase 2: merge the new data and compute parity.
    for (plan, b) in plans.iter().zip(bufs.iter_mut()) {
        let mine = &touches[plan.touches.clone()];
        if plan.mode == Mode::Degraded {
            let missing = &plan.missing;
            if missing.iter().any(|i| *i < k) {
                array
                    .parity
                    .recover(&mut b.chunks, has_q, missing)
                    .map_err(|source| EngineError::ReconstructStripe {
                        stripe: plan.stripe,
                        source,
                    })?;
            }
            // From here on the degraded stripe is an RCW stripe whose parity sits after its data.
            let parity = b.chunks.split_off(k);
            b.parity = parity;
        }
        match plan.mode {
            Mode::Rcw | Mode::Degraded => {
                for t in mine {
                    if b.direct.get(t.index).copied().flatten().is_some() {
                        continue;
                    }
                    let at = (t.piece.lo - plan.r.start) as usize;
                    b.chunks[t.index][at..at + t.piece.len()]
                        .copy_from_slice(&buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()]);
                }
            }
            Mode::Rmw => {
                for (j, t) in mine.iter().enumerate() {
                    let pages = t.pages();
                    let new = &mut b.chunks[j];
                    new.copy_from_slice(b.old[j]);
                    let at = (t.piece.lo - pages.start) as usize;
                    new[at..at + t.piece.len()]
                        .copy_from_slice(&buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()]);
                    let sub =
                        (pages.start - plan.r.start) as usize..(pages.end - plan.r.start) as usize;
                    let (p, q) = b.parity.split_at_mut(1);
                    array.parity.update(
                        t.index,
                        b.old[j],
                        b.chunks[j],
                        &mut p[0][sub.clone()],
                        q.first_mut().map(|q| &mut q[sub]),
                    );
                }
            }
        }
    }
    // Full parity generation for every RCW (and degraded) stripe of the window in one backend call.
    {
        let mut data_refs: Vec<Vec<&[u8]>> = Vec::new();
        let mut parity_refs: Vec<&mut Vec<&mut [u8]>> = Vec::new();
        for (plan, b) in plans.iter().zip(bufs.iter_mut()) {
            if plan.mode == Mode::Rmw {
                continue;
            }
            let StripeBufs {
                chunks,
                parity,
                direct,
                ..
            } = b;
            data_refs.push(
                chunks
                    .iter()
                    .enumerate()
                    .map(|(i, c)| direct.get(i).copied().flatten().unwrap_or(&**c))
                    .collect(),
            );
            parity_refs.push(parity);
        }
        let mut gens: Vec<StripeGen<'_>> = data_refs
            .iter()
            .zip(parity_refs.iter_mut())
            .map(|(data, parity)| {
                let (p, q) = parity.split_at_mut(1);
                StripeGen {
                    data,
                    p: &mut *p[0],
                    q: q.first_mut().map(|q| &mut **q),
                }
            })
            .collect();
        if !gens.is_empty() {
            array.parity.gen_batch(&mut gens);
        }
    }

    // The stripes' partial parity durable before anything is written in place (ppl/).
    let logged = match array.integrity.ppl() {
        Some(ppl) => Some(
            ppl.log_window(
                array,
                &log_views(array, plans, touches, &bufs),
                fua,
                answer
                    .map(|a| a.data_round.borrow())
                    .as_deref()
                    .and_then(|d| d.as_ref()),
                answer.is_some(),
                answer.is_some_and(|a| a.sequential),
            )?,
        ),
        None => None,
    };
    if let (Some(answer), Some(logged)) = (answer, &logged) {
        if logged.answerable {
            // Durable in the log (recovery rolls it forward), and the member states the entries were made
            // against are on record: the writer may go on while the window writes in place.
            array.wait_durable()?;
            answer.give();
        }
    }

    // Phase 3: every write of the window in one batch. The stripe cache forgets what the window writes first: from
    // here until the writes succeed, what the members hold there is not known (stripe_cache.rs).
    for plan in plans {
        for t in &touches[plan.touches.clone()] {
            array
                .stripe_cache
                .forget_range(plan.stripe, t.index, t.pages());
        }
        for i in 0..np {
            array
                .stripe_cache
                .forget_range(plan.stripe, k + i, plan.r.clone());
        }
    }
    let mut reqs: Vec<IoReq<'_>> = Vec::new();
    for (plan, b) in plans.iter().zip(bufs.iter()) {
        let s = plan.stripe;
        let mine = &touches[plan.touches.clone()];
        for (j, t) in mine.iter().enumerate() {
            let member = g.stripe_member(s, t.index);
            let dests = array.write_targets(member, s);
            if dests == [NO_TARGET; 2] {
                continue;
            }
            let pages = t.pages();
            let bytes = match plan.mode {
                Mode::Rmw => &b.chunks[j][..],
                Mode::Rcw | Mode::Degraded => &b.data(t.index)
                    [(pages.start - plan.r.start) as usize..(pages.end - plan.r.start) as usize],
            };
            for dest in dests.into_iter().filter(|d| *d != NO_TARGET) {
                reqs.push(IoReq::write(
                    dest,
                    array.member_offset(s, pages.start),
                    bytes,
                    fua,
                ));
            }
        }
        for (i, p) in b.parity.iter().enumerate() {
            let member = g.stripe_member(s, k + i);
            for dest in array.write_targets(member, s) {
                if dest != NO_TARGET {
                    reqs.push(IoReq::write(
                        dest,
                        array.member_offset(s, plan.r.start),
                        p,
                        fua,
                    ));
                }
            }
        }
    }
    // Nothing is written in place once the array failed: the targets above leave out a member that left, whose
    // chunks a forced start would trust again (ppl/entries.rs, `log_window`).
    array.check_serving()?;
    let failed = array.submit_tolerant(reqs);
    drop(logged); // the in-place writes are done (ppl/)
    if failed.is_empty() {
        store_in_cache(array, plans, touches, &bufs);
        Ok(Attempt::Done)
    } else {
        Ok(Attempt::Redo {
            unreadable: 0,
            wrote_in_place: true,
        })
    }
}

/// Parity ranges up to this size are kept in the stripe cache: small writes, the ones that read before they
/// write. Longer ones are mostly sequential streams, which would only push hot pages out.
pub(super) const CACHE_STORE_MAX_BYTES: u64 = 64 << 10;

/// Keeps what the small partial-stripe writes of a window wrote (their data pages, and the parity) in the stripe
/// cache, once every in-place write succeeded: what the next read-modify-write of the
/// same pages reads. Degraded stripes are left out (their chunks are not all where the write put them).
pub(super) fn store_in_cache(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    bufs: &[StripeBufs<'_>],
) {
    let cache = &array.stripe_cache;
    if !cache.enabled() {
        return;
    }
    let k = array.geometry.data_per_stripe();
    for (plan, b) in plans.iter().zip(bufs) {
        let whole = |index: usize| {
            touches[plan.touches.clone()]
                .iter()
                .any(|t| t.index == index && t.full_pages() == plan.r)
        };
        if plan.mode == Mode::Degraded
            || plan.r.end - plan.r.start > CACHE_STORE_MAX_BYTES
            || (0..k).all(whole)
        {
            continue; // degraded, long, or written whole over R (it read nothing: a stream's)
        }
        if !cache.admit(plan.stripe) {
            continue;
        }
        // What a read-modify-write of the same pages reads: the written data pages and the parity. (A
        // reconstruct-write also knows the other data chunks over R; keeping them would halve how many hot pages
        // the cache holds, for the rarer rewrites the log turns into reconstruct-writes.)
        for (j, t) in touches[plan.touches.clone()].iter().enumerate() {
            let pages = t.pages();
            let bytes = match plan.mode {
                Mode::Rmw => &b.chunks[j][..],
                _ => &b.data(t.index)
                    [(pages.start - plan.r.start) as usize..(pages.end - plan.r.start) as usize],
            };
            cache.store(plan.stripe, t.index, pages.start, bytes);
        }
        for (i, p) in b.parity.iter().enumerate() {
            cache.store(plan.stripe, k + i, plan.r.start, p);
        }
    }
}

/// Per stripe of a window, the one data chunk it changes there and the pages (`Ppl::continues_streams`).
pub(super) fn stream_touches(plans: &[StripePlan], touches: &[Touch]) -> Vec<StreamTouch> {
    plans
        .iter()
        .map(|plan| {
            let mine = &touches[plan.touches.clone()];
            let one = match mine {
                [first, rest @ ..] if rest.iter().all(|t| t.index == first.index) => {
                    let pages = rest.iter().fold(first.pages(), |a, t| {
                        let b = t.pages();
                        a.start.min(b.start)..a.end.max(b.end)
                    });
                    Some((first.index, pages))
                }
                _ => None,
            };
            (plan.stripe, one)
        })
        .collect()
}

/// Journal mode: the pieces of a window `Ppl::log_data_first` may log before anything is read (stripe, data
/// index, in-chunk pages, their new bytes): every piece covers whole pages (its bytes are the pages' contents
/// without a read) and no stripe is written whole (those are not answered from the log). None otherwise.
pub(super) fn data_first_pieces<'b>(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    buf: &'b [u8],
) -> Option<Vec<DataPiece<'b>>> {
    let k = array.geometry.data_per_stripe();
    let whole = 0..array.geometry.chunk_bytes;
    let mut pieces = Vec::new();
    for plan in plans {
        let mine = &touches[plan.touches.clone()];
        if (0..k).all(|i| mine.iter().any(|t| t.index == i && t.full_pages() == whole)) {
            return None;
        }
        for t in mine {
            let pages = t.pages();
            if t.piece.lo != pages.start || t.piece.hi != pages.end {
                return None;
            }
            let bytes = &buf[t.piece.buf_at..t.piece.buf_at + t.piece.len()];
            pieces.push(DataPiece {
                stripe: plan.stripe,
                index: t.index,
                pages,
                bytes,
            });
        }
    }
    Some(pieces)
}

/// What the partial parity log needs of each stripe of the window: the chunks written in place, the new data it
/// holds and the new parity.
pub(super) fn log_views<'a>(
    array: &Array,
    plans: &[StripePlan],
    touches: &[Touch],
    bufs: &'a [StripeBufs<'_>],
) -> Vec<StripeView<'a>> {
    let g = array.geometry;
    let k = g.data_per_stripe();
    let whole = 0..g.chunk_bytes;
    plans
        .iter()
        .zip(bufs)
        .map(|(plan, b)| {
            let mine = &touches[plan.touches.clone()];
            let full = (0..k).all(|i| mine.iter().any(|t| t.index == i && t.full_pages() == whole));
            let (written, changed_missing) = mine
                .iter()
                .map(|t| (t.index, t.pages()))
                .partition(|(i, _)| array.is_active(g.stripe_member(plan.stripe, *i)));
            let data = match plan.mode {
                Mode::Rmw => {
                    let mut data = vec![None; k];
                    for (j, t) in mine.iter().enumerate() {
                        data[t.index] = Some((t.pages(), &*b.chunks[j]));
                    }
                    data
                }
                Mode::Rcw | Mode::Degraded => {
                    (0..k).map(|i| Some((plan.r.clone(), b.data(i)))).collect()
                }
            };
            StripeView {
                stripe: plan.stripe,
                r: plan.r.clone(),
                full,
                written,
                changed_missing,
                data,
                p: b.parity[0],
                q: b.parity.get(1).map(|q| &**q),
            }
        })
        .collect()
}
