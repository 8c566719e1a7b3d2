//! Batches: several requests at once, each on its own thread, the way a frontend's workers send them.
//!
//! Why: one request at a time never meets what only concurrency reaches: two writes of one stripe racing for its
//! lock, write gathering (a stream's partial-stripe writes joined into one full-stripe write), partial parity log
//! entries of several writes in flight, a flush overtaking writes, a power cut or a kill with several requests cut
//! short at once, requests beside a running rebuild or an online check.
//!
//! What stays exact: the requests of a batch touch disjoint bytes, so whatever order they run in, each write's
//! bytes end as its data when acknowledged, and as old or new when it failed. A flush in the batch makes durable
//! only the writes acknowledged before it was issued (one counter stamps every issue and completion); writes still
//! in flight when it was issued stay crash-uncertain. Reads are checked against the model like any other read.
//!
//! What does not replay: the interleaving. A seed's workload and faults are drawn the same way every run, but which
//! request meets an armed fault or a power cut, and which writes gather, depends on the threads. A violation still
//! prints its seed; rerunning the seed (several times if need be) is how it is chased.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;

use crate::buf::AlignedBuf;
use crate::fault::SplitMix64;
use crate::layout::{Level, PAGE_BYTES};
use crate::EngineError;

use super::model::WriteOutcome;
use super::{random_extent, Run};

/// Requests in a batch.
const BATCH_MIN: u64 = 2;
const BATCH_MAX: u64 = 8;
/// A `Shape::Fill` batch (`small_ring` only): enough writes at once to fill a small log ring while some of them
/// wait on it (the two hangs of stop 22 needed a writer waiting for room while the ring was full of its
/// batch-mates' rounds).
const FILL_MAX: u64 = 24;
/// Tries to draw an extent disjoint from those already in the batch before giving up on that request.
const DISJOINT_TRIES: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write { fua: bool },
    Read,
    Discard,
    WriteZeroes { fua: bool },
    Flush,
}

/// How a batch's extents are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Anywhere in the array, any mix of requests.
    Random,
    /// Consecutive writes of one size (a stream): what write gathering joins.
    Stream,
    /// Small requests inside one or two stripes: writes racing for a stripe's lock and log entry.
    Stripe,
    /// Many whole-page writes anywhere, many crossing a stripe boundary (with `small_ring` only): they fill the
    /// log's ring while others wait for room, some riding stream entries. Whole pages, so that no block is shared
    /// by two of them (the model's cost of shared blocks doubles with every write sharing one).
    Fill,
}

struct Request {
    op: Op,
    offset_bytes: u64,
    len: usize,
    /// What a write writes.
    data: Option<AlignedBuf>,
}

impl Request {
    fn text(&self) -> String {
        let (name, fua) = match self.op {
            Op::Write { fua } => ("write", fua),
            Op::Read => ("read", false),
            Op::Discard => ("discard", false),
            Op::WriteZeroes { fua } => ("write-zeroes", fua),
            Op::Flush => return "flush".to_string(),
        };
        format!(
            "{name} {}+{}{}",
            self.offset_bytes,
            self.len,
            if fua { " fua" } else { "" }
        )
    }

    fn extent(&self) -> Option<(u64, usize)> {
        (self.op != Op::Flush).then_some((self.offset_bytes, self.len))
    }
}

/// What one request of a batch came back with, and when (stamps of one counter shared by the batch).
struct Outcome {
    result: Result<(), EngineError>,
    /// A write answered once durable in the journal (`SimConfig::journal`).
    from_log: bool,
    read: Vec<u8>,
    issued: u64,
    done: u64,
}

fn overlaps(a: (u64, usize), b: (u64, usize)) -> bool {
    a.0 < b.0 + b.1 as u64 && b.0 < a.0 + a.1 as u64
}

/// Up to `count` extents from `draw`, each disjoint from those before it (a draw that overlaps one is drawn
/// again, up to `DISJOINT_TRIES` times, then that request is left out).
fn disjoint(
    rng: &mut SplitMix64,
    count: usize,
    mut draw: impl FnMut(&mut SplitMix64) -> (u64, usize),
) -> Vec<(u64, usize)> {
    let mut taken: Vec<(u64, usize)> = Vec::with_capacity(count);
    for _ in 0..count {
        for _ in 0..DISJOINT_TRIES {
            let e = draw(rng);
            if !taken.iter().any(|t| overlaps(*t, e)) {
                taken.push(e);
                break;
            }
        }
    }
    taken
}

impl Run<'_> {
    /// Step: a batch of requests at once.
    pub(super) fn batch(&mut self) -> Result<(), String> {
        let (shape, requests) = self.plan_batch();
        self.run_batch(shape, requests, false).map(|_| ())
    }

    /// Step: an online check (or repair, half the time) of a consistent array while a batch of requests runs. A
    /// stripe being written is not a mismatch: the check must find nothing and rewrite nothing, and the members
    /// must audit clean afterwards (a repair that rewrote parity from data read before a write landed would not).
    pub(super) fn check_beside_batch(&mut self) -> Result<(), String> {
        // As for planted corruption: a check stops at an unreadable page, and RAID0 has nothing to check.
        if self.degraded() || self.beyond || self.lse_armed || self.g.level == Level::Raid0 {
            return Ok(());
        }
        self.wait_jobs("before an online check")?;
        let repair = self.rng.one_in(2);
        let what = if repair { "repair" } else { "check" };
        let done = self.run_check_beside(repair, |run| {
            run.note(format!("online {what} beside requests"));
            run.batch()
        })?;
        if done.mismatches != 0 || done.repaired != 0 {
            return Err(format!(
                "online {what} of a consistent array beside requests found {} mismatches and rewrote {}: {:?}",
                done.mismatches,
                done.repaired,
                self.array().check_findings()
            ));
        }
        self.report.online_checks += 1;
        self.audit(&format!("after an online {what}"))
    }

    /// A batch that the power (or the process) cuts after `cut_after` member writes; returns whether a request
    /// of it failed (was cut short). Every failure is excused: the power is going.
    pub(super) fn batch_cut_short(&mut self, cut_after: u64) -> Result<bool, String> {
        self.io.inner().cut_power_after_writes(cut_after);
        let (shape, requests) = self.plan_batch();
        self.run_batch(shape, requests, true)
    }

    fn plan_batch(&mut self) -> (Shape, Vec<Request>) {
        let shapes: &[Shape] = if self.cfg.small_ring {
            &[
                Shape::Random,
                Shape::Random,
                Shape::Stream,
                Shape::Stripe,
                Shape::Fill,
            ]
        } else {
            &[Shape::Random, Shape::Random, Shape::Stream, Shape::Stripe]
        };
        let shape = *self.rng.pick(shapes);
        let count = match shape {
            Shape::Fill => self.rng.range(BATCH_MAX + 1, FILL_MAX),
            _ => self.rng.range(BATCH_MIN, BATCH_MAX),
        } as usize;
        let extents = match shape {
            Shape::Random => self.random_extents(count),
            Shape::Stream => self.stream_extents(count),
            Shape::Stripe => self.stripe_extents(count),
            Shape::Fill => self.fill_extents(count),
        };
        let mut flush_planned = false;
        let mut requests = Vec::with_capacity(extents.len() + 1);
        for (offset_bytes, len) in extents {
            let op = match shape {
                Shape::Stream | Shape::Fill => Op::Write {
                    fua: self.rng.one_in(8),
                },
                Shape::Stripe => match self.rng.below(10) {
                    0..=5 => Op::Write {
                        fua: self.rng.one_in(4),
                    },
                    _ => Op::Read,
                },
                Shape::Random => match self.rng.below(20) {
                    0..=8 => Op::Write {
                        fua: self.rng.one_in(4),
                    },
                    9..=15 => Op::Read,
                    16 => Op::Discard,
                    17 => Op::WriteZeroes {
                        fua: self.rng.one_in(3),
                    },
                    _ if !flush_planned => {
                        flush_planned = true;
                        requests.push(Request {
                            op: Op::Flush,
                            offset_bytes: 0,
                            len: 0,
                            data: None,
                        });
                        Op::Read
                    }
                    _ => Op::Read,
                },
            };
            let data = matches!(op, Op::Write { .. }).then(|| {
                let mut buf = AlignedBuf::zeroed(len);
                self.rng.fill(&mut buf[..len]);
                buf
            });
            requests.push(Request {
                op,
                offset_bytes,
                len,
                data,
            });
        }
        (shape, requests)
    }

    /// Up to `count` extents anywhere, disjoint.
    fn random_extents(&mut self, count: usize) -> Vec<(u64, usize)> {
        let (array_bytes, stripe_bytes) = (self.model.array_bytes(), self.g.stripe_bytes());
        disjoint(&mut self.rng, count, |rng| {
            random_extent(rng, array_bytes, stripe_bytes)
        })
    }

    /// `count` consecutive extents of one size (half a stripe, a quarter, a chunk, two thirds, or any length up
    /// to a stripe), from a stripe boundary half the time.
    fn stream_extents(&mut self, count: usize) -> Vec<(u64, usize)> {
        let (array_bytes, stripe_bytes) = (self.model.array_bytes(), self.g.stripe_bytes());
        let piece = match self.rng.below(5) {
            0 => stripe_bytes / 2,
            1 => stripe_bytes / 4,
            2 => self.g.chunk_bytes,
            3 => stripe_bytes * 2 / 3,
            _ => self.rng.range(1, stripe_bytes),
        }
        .clamp(1, array_bytes);
        let count = (count as u64).min(array_bytes / piece).max(1);
        let span = piece * count;
        let mut start = self.rng.below(array_bytes - span + 1);
        if self.rng.one_in(2) {
            start -= start % stripe_bytes;
        }
        (0..count)
            .map(|i| (start + i * piece, piece as usize))
            .collect()
    }

    /// Up to `count` disjoint whole-page extents of up to two chunks anywhere (so that many cross a chunk's or a
    /// stripe's end).
    fn fill_extents(&mut self, count: usize) -> Vec<(u64, usize)> {
        let array_pages = self.model.array_bytes() / PAGE_BYTES;
        let longest = (2 * self.g.chunk_bytes / PAGE_BYTES).clamp(1, array_pages);
        disjoint(&mut self.rng, count, |rng| {
            let pages = rng.range(1, longest);
            let first = rng.below(array_pages - pages + 1);
            ((first * PAGE_BYTES), (pages * PAGE_BYTES) as usize)
        })
    }

    /// Up to `count` disjoint extents of up to two chunks inside one or two neighbouring stripes.
    fn stripe_extents(&mut self, count: usize) -> Vec<(u64, usize)> {
        let (array_bytes, stripe_bytes) = (self.model.array_bytes(), self.g.stripe_bytes());
        let stripes = array_bytes.div_ceil(stripe_bytes);
        let first = self.rng.below(stripes) * stripe_bytes;
        let end = (first + self.rng.range(1, 2) * stripe_bytes).min(array_bytes);
        let region = end - first;
        let longest = (2 * self.g.chunk_bytes).min(region);
        disjoint(&mut self.rng, count, |rng| {
            let len = rng.range(1, longest);
            (first + rng.below(region - len + 1), len as usize)
        })
    }

    /// Runs `requests` at once, one thread each, then settles the model. With `cut`, a power cut is armed and
    /// every failure is excused; returns whether any request failed.
    fn run_batch(
        &mut self,
        shape: Shape,
        requests: Vec<Request>,
        cut: bool,
    ) -> Result<bool, String> {
        let array = self
            .array
            .as_ref()
            .expect("the array runs between restarts");
        // Client requests go through `write_back` (field by field: `self` is changed below while `array` is still
        // in use).
        let front = self
            .write_back
            .as_ref()
            .expect("the array runs between restarts");
        let gather_before = array.gather_stats();
        let clock = AtomicU64::new(0);
        // A stream goes out in order, one thread after another as a client queues it; the other shapes start
        // together.
        let barrier = Barrier::new(if shape == Shape::Stream {
            1
        } else {
            requests.len()
        });
        let outcomes: Vec<Outcome> = std::thread::scope(|s| {
            let handles: Vec<_> = requests
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let (barrier, clock) = (&barrier, &clock);
                    if shape == Shape::Stream {
                        // The NBD server tells the engine of a continuation it holds before it hands on the
                        // write it continues (`Array::note_write_follows`); the stream's next request does.
                        let follows = requests.get(i + 1).is_some_and(|next| {
                            matches!(next.op, Op::Write { fua: false })
                                && next.offset_bytes == r.offset_bytes + r.len as u64
                        });
                        if follows {
                            array.note_write_follows(r.offset_bytes + r.len as u64);
                        }
                    }
                    s.spawn(move || {
                        if shape != Shape::Stream {
                            barrier.wait();
                        }
                        let mut read = Vec::new();
                        let mut from_log = false;
                        let issued = clock.fetch_add(1, Ordering::SeqCst);
                        let result = match r.op {
                            Op::Write { fua } => {
                                let data = r.data.as_ref().expect("a write carries data");
                                // The buffer is rounded up to whole pages. Writes at odd pages go the
                                // caller's-thread way.
                                let caller = (r.offset_bytes / 4096) % 2 == 1;
                                super::write_through(
                                    front,
                                    r.offset_bytes,
                                    &data[..r.len],
                                    fua,
                                    caller,
                                )
                                .map(|a| from_log = a == crate::Answered::FromLog)
                            }
                            Op::Read => {
                                read = vec![0u8; r.len];
                                super::read_front(front, r.offset_bytes, &mut read)
                            }
                            Op::Discard => front.discard(r.offset_bytes, r.len as u64),
                            Op::WriteZeroes { fua } => {
                                front.write_zeroes(r.offset_bytes, r.len as u64, fua)
                            }
                            Op::Flush => front.flush(),
                        };
                        let done = clock.fetch_add(1, Ordering::SeqCst);
                        Outcome {
                            result,
                            from_log,
                            read,
                            issued,
                            done,
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let gather_after = array.gather_stats();
        self.report.batches += 1;
        self.report.batch_requests += requests.len() as u64;
        self.report.gathered_writes += gather_after.joined - gather_before.joined;
        self.report.gathered_stripes += gather_after.full_stripes - gather_before.full_stripes;
        self.report.queued_gathers += gather_after.queued - gather_before.queued;
        self.report.gathers_for_followers +=
            gather_after.led_for_follower - gather_before.led_for_follower;
        debug_assert!(requests.iter().enumerate().all(|(i, a)| {
            requests[i + 1..]
                .iter()
                .all(|b| match (a.extent(), b.extent()) {
                    (Some(x), Some(y)) => !overlaps(x, y),
                    _ => true,
                })
        }));

        // Writes acknowledged before the flush was issued, then the flush, then the rest: disjoint bytes make the
        // order within each group irrelevant.
        let flush_issued = requests
            .iter()
            .zip(&outcomes)
            .find(|(r, o)| r.op == Op::Flush && o.result.is_ok())
            .map(|(_, o)| o.issued);
        let mut by_completion: Vec<usize> = (0..requests.len()).collect();
        by_completion.sort_by_key(|i| outcomes[*i].done);
        let mut flush_applied = false;
        let mut any_failed = false;
        // What the writes not made durable by the flush left (see `BlockModel::written_together`), and the model
        // when they were issued.
        let mut base = self.model.clone();
        let mut together: Vec<(u64, Cow<[u8]>)> = Vec::new();
        let mut texts = Vec::with_capacity(requests.len());
        for i in by_completion {
            let (r, o) = (&requests[i], &outcomes[i]);
            if let Some(issued) = flush_issued {
                if !flush_applied && o.done > issued {
                    self.model.flushed();
                    flush_applied = true;
                    base = self.model.clone();
                    together.clear();
                }
            }
            let what = r.text();
            match r.op {
                Op::Write { .. } => self.report.writes += 1,
                Op::Read => self.report.reads += 1,
                Op::Flush => self.report.flushes += 1,
                Op::Discard | Op::WriteZeroes { .. } => self.report.discards += 1,
            }
            if let Err(e) = &o.result {
                any_failed = true;
                texts.push((i, format!("{what}: {e}")));
                if !cut {
                    self.request_failed(&what, e)?;
                }
            } else {
                texts.push((i, format!("{what}: ok")));
            }
            // What the request leaves in its bytes, and whether durably (discard and write-zeroes leave zeros).
            let written: Option<(Cow<[u8]>, bool)> = match r.op {
                // Answered from the journal: durable as if FUA.
                Op::Write { fua } => r
                    .data
                    .as_ref()
                    .map(|d| (Cow::Borrowed(&d[..r.len]), fua || o.from_log)),
                Op::Discard => Some((Cow::Owned(vec![0u8; r.len]), false)),
                Op::WriteZeroes { fua } => Some((Cow::Owned(vec![0u8; r.len]), fua)),
                Op::Read | Op::Flush => None,
            };
            if let Some((bytes, durable)) = written {
                let outcome = match o.result {
                    Ok(()) => WriteOutcome::Acked { durable },
                    Err(_) => WriteOutcome::Failed,
                };
                self.model.write(r.offset_bytes, &bytes, outcome);
                together.push((r.offset_bytes, bytes));
            }
        }
        let together: Vec<(u64, &[u8])> = together.iter().map(|(o, b)| (*o, &b[..])).collect();
        self.model.written_together(&base, &together);
        // Reads touch bytes no write of the batch touched: the model as it now stands judges them.
        for (r, o) in requests.iter().zip(&outcomes) {
            if r.op == Op::Read && o.result.is_ok() {
                let blocks = self
                    .model
                    .check_read(r.offset_bytes, &o.read)
                    .map_err(|m| {
                        format!(
                            "batch read {}+{} returned wrong data: {m}",
                            r.offset_bytes, r.len
                        )
                    })?;
                self.report.blocks_verified += blocks;
            }
        }
        texts.sort_by_key(|(i, _)| *i);
        let texts: Vec<String> = texts.into_iter().map(|(_, t)| t).collect();
        self.note(format!(
            "batch ({shape:?}, {} at once{}): {}",
            requests.len(),
            if cut { ", power cut armed" } else { "" },
            texts.join("; ")
        ));
        // After a power cut the engine reacts to I/O errors no member will ever see (evictions included): the
        // crash that follows decides, as for a single request cut short.
        if !cut {
            self.sync_slot_states();
        }
        Ok(any_failed)
    }
}
