//! Fault matrix rows about whole members: a member lost while idle (1), two lost in RAID6 (2), a member dying in
//! the middle of a stripe write (3), more losses than the level survives (8), transient versus persistent errors
//! (10) and a stale member coming back (13). See /work/shared/docs/faults.md and docs/reliability.md.

mod common_sim;

use std::sync::Arc;

use common_sim::*;
use paraid_engine::sim::model::hash;
use paraid_parity::Backend;

/// Row 1, by removal: every member of every redundant layout removed in turn; the whole array, hashed (mdadm's
/// 01r5integ), and every block read on its own must equal what was written, and a degraded write must read back.
#[test]
fn row01_one_member_removed_each_in_turn() {
    let configs = redundant_configs();
    let mut cases = 0;
    let mut blocks = 0u64;
    for (i, (level, members, chunk, rows)) in configs.iter().copied().enumerate() {
        let filled = Filled::new(level, members, chunk, rows, 10 + i as u64);
        let want = hash(&filled.contents);
        for gone in 0..members {
            let (_io, array) = assemble_cow(&filled.base, &[gone], gone as u64, reference())
                .unwrap_or_else(|e| panic!("{level}/{members} without {gone}: {e}"));
            assert_eq!(array.slot_state(gone), SlotState::Missing);
            let mut all = vec![0u8; filled.contents.len()];
            array.read(0, &mut all).expect("degraded whole read");
            assert_eq!(
                hash(&all),
                want,
                "{level}/{members} without {gone}: hash differs (first wrong block {:?})",
                first_wrong_block(&all, &filled.contents)
            );
            let mut model = filled.model();
            let (reads, _) = read_each_block(&array, &mut model);
            assert_eq!(
                (reads.wrong, reads.failed),
                (0, 0),
                "{level}/{members} without {gone}"
            );
            let mut rng = SplitMix64::new(gone as u64);
            for _ in 0..4 {
                assert!(random_write(&array, &mut model, &mut rng), "degraded write");
            }
            blocks += reads.correct + verify_all(&array, &mut model, "after degraded writes");
            cases += 1;
        }
    }
    figure(
        "1",
        "row01_one_member_removed_each_in_turn",
        &format!(
            "{} layouts x members = {cases} removals, {blocks} blocks verified, 0 wrong",
            configs.len()
        ),
    );
}

/// Row 1 as the matrix states it: a member that errors on every I/O from tick t while the array runs must be
/// failed out and the array must go on serving every block from the others.
#[test]
fn row01_one_member_fails_while_idle() {
    let mut cases = 0;
    for (i, (level, members, chunk, rows)) in redundant_configs().into_iter().enumerate() {
        let filled = Filled::new(level, members, chunk, rows, 20 + i as u64);
        for slot in 0..members {
            let (io, array) =
                assemble_cow(&filled.base, &[], slot as u64, reference()).expect("assemble");
            let mut model = filled.model();
            let tick = io.ticks();
            io.add(
                Scope::slot(slot),
                Fault::FailFrom {
                    nth: 1,
                    count: Count::Global,
                },
            );
            let (reads, failed) = read_each_block(&array, &mut model);
            assert_eq!(reads.wrong, 0, "{level}/{members}: wrong reads");
            assert!(
                failed.is_empty(),
                "{level}/{members}: member {slot} failing from tick {tick}: blocks {failed:?} unreadable"
            );
            assert_eq!(array.slot_state(slot), SlotState::Faulty, "evicted");
            let mut rng = SplitMix64::new(slot as u64);
            for _ in 0..8 {
                assert!(random_write(&array, &mut model, &mut rng), "degraded write");
            }
            verify_all(&array, &mut model, "after the failure");
            cases += 1;
        }
    }
    figure(
        "1",
        "row01_one_member_fails_while_idle",
        &format!("{cases} layouts x members failed at a tick, 0 wrong, 0 unreadable"),
    );
}

/// The CPU backends this machine runs (the reference first), each once.
fn backends() -> Vec<Arc<dyn Backend>> {
    let mut all = paraid_parity::cpu_backends();
    let mut seen = Vec::new();
    all.retain(|b| {
        let fresh = !seen.contains(&b.name());
        seen.push(b.name());
        fresh
    });
    all
}

/// Row 2: RAID6 missing every pair of members, with every CPU backend: the whole array reconstructs exactly, a
/// degraded write keeps the surviving parity right. Rows of at least `members` stripes put every role pair
/// (two data, data + P, data + Q, P + Q) in the pair's place somewhere.
#[test]
fn row02_two_members_fail_raid6_every_pair() {
    let backends = backends();
    let mut passed = 0;
    let mut role_pairs = std::collections::BTreeSet::new();
    for (members, chunk) in [(4usize, 4096u64), (5, 8192), (6, 4096), (8, 4096)] {
        let rows = members as u64;
        let filled = Filled::new(Level::Raid6, members, chunk, rows, 200 + members as u64);
        let g = filled.geometry;
        let k = g.data_per_stripe();
        for backend in &backends {
            for a in 0..members {
                for b in a + 1..members {
                    for stripe in 0..g.stripes() {
                        let role = |slot: usize| match g.stripe_index(stripe, slot) {
                            i if i < k => "D",
                            i if i == k => "P",
                            _ => "Q",
                        };
                        let mut pair = [role(a), role(b)];
                        pair.sort();
                        role_pairs.insert(pair.join("+"));
                    }
                    let (io, array) =
                        assemble_cow(&filled.base, &[a, b], 0, backend.clone()).expect("assemble");
                    let mut all = vec![0u8; filled.contents.len()];
                    array.read(0, &mut all).expect("read");
                    assert!(
                        all == filled.contents,
                        "{} without {a},{b}: block {:?} wrong",
                        backend.name(),
                        first_wrong_block(&all, &filled.contents)
                    );
                    let mut model = filled.model();
                    let mut rng = SplitMix64::new((a * 64 + b) as u64);
                    for _ in 0..3 {
                        assert!(random_write(&array, &mut model, &mut rng));
                    }
                    verify_all(&array, &mut model, "degraded writes");
                    let expected = model.settled_bytes().expect("settled");
                    let audit = audit_images(
                        &g,
                        filled.data_offset_bytes,
                        &io.inner().images(),
                        Some(&expected),
                    );
                    assert!(
                        audit.clean(),
                        "{} without {a},{b}: {}",
                        backend.name(),
                        audit.describe()
                    );
                    passed += 1;
                }
            }
        }
    }
    assert_eq!(role_pairs.len(), 4, "role pairs covered: {role_pairs:?}");
    let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
    figure(
        "2",
        "row02_two_members_fail_raid6_every_pair",
        &format!(
            "{} pairs x {} backends ({}) = {passed} passed; role pairs {:?}",
            passed / backends.len(),
            backends.len(),
            names.join(", "),
            role_pairs
        ),
    );
}

/// Row 2 with the members failing while the array runs (I/O errors, not absent at assembly).
#[test]
fn row02_two_members_fail_while_running_raid6() {
    let mut passed = 0;
    for members in [4usize, 6] {
        let filled = Filled::new(Level::Raid6, members, 4096, members as u64, 300);
        for a in 0..members {
            for b in a + 1..members {
                let (io, array) =
                    assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
                io.fail_slot(a);
                io.fail_slot(b);
                let mut model = filled.model();
                let (reads, failed) = read_each_block(&array, &mut model);
                assert_eq!(reads.wrong, 0);
                assert!(failed.is_empty(), "without {a},{b}: {failed:?} unreadable");
                passed += 1;
            }
        }
    }
    figure(
        "2",
        "row02_two_members_fail_while_running_raid6",
        &format!("{passed} pairs failed while running, 0 wrong"),
    );
}

/// Array writes of different shapes for row 3: (name, offset, length) in terms of the geometry.
fn write_shapes(g: &Geometry) -> Vec<(&'static str, u64, usize)> {
    let stripe = g.stripe_bytes();
    let chunk = g.chunk_bytes;
    vec![
        ("sub-page in one chunk", chunk + 100, 300),
        ("most of a stripe", 5, (stripe - 4096 - 5) as usize),
        ("one full stripe", stripe, stripe as usize),
        ("across two stripes", stripe / 2 + 4096, stripe as usize),
    ]
}

/// Row 3: the member taking the k-th member write of an array write dies at that write (and stays dead), for
/// every k of several write shapes and layouts. Then the dead member is replaced by nothing (degraded
/// re-assembly): every block must read as its old or new value, everything else as before, and the surviving
/// members' parity must match the data read.
#[test]
fn row03_member_fails_in_the_middle_of_a_stripe_write() {
    let configs: [(Level, usize, u64); 7] = [
        (Level::Raid5, 3, 4096),
        (Level::Raid5, 4, 16384),
        (Level::Raid5, 5, 8192),
        (Level::Raid6, 4, 4096),
        (Level::Raid6, 6, 16384),
        (Level::Raid1, 3, 8192),
        (Level::Raid10, 4, 8192),
    ];
    let mut points = 0;
    let (mut acked, mut failed_writes) = (0, 0);
    for (c, (level, members, chunk)) in configs.into_iter().enumerate() {
        let filled = Filled::new(level, members, chunk, 6, 400 + c as u64);
        let g = filled.geometry;
        for (shape, offset, len) in write_shapes(&g) {
            let len = len.min((g.array_bytes() - offset) as usize);
            let mut data = vec![0u8; len];
            SplitMix64::new(points as u64).fill(&mut data);
            // Dry run: the order of member I/Os this write issues.
            let order: Vec<(usize, bool)> = {
                let (io, array) =
                    assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
                io.add(
                    Scope::all(),
                    Fault::Delay {
                        delay: std::time::Duration::ZERO,
                        one_in: 1,
                        sleep: false,
                    },
                );
                array.write(offset, &data, false).expect("dry run");
                io.injections()
                    .iter()
                    .map(|i| (i.slot, i.op == paraid_engine::MemberOp::Write))
                    .collect()
            };
            let writes: Vec<usize> = (0..order.len()).filter(|i| order[*i].1).collect();
            assert!(!writes.is_empty(), "{shape}: the write writes");
            for (k, &at) in writes.iter().enumerate() {
                let slot = order[at].0;
                // The victim's I/O count up to and including its k-th member write.
                let nth = order[..=at].iter().filter(|(s, _)| *s == slot).count() as u64;
                let (io, array) =
                    assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
                let rule = io.add(
                    Scope::slot(slot),
                    Fault::FailFrom {
                        nth,
                        count: Count::Global,
                    },
                );
                let mut model = filled.model();
                let outcome = match array.write(offset, &data, false) {
                    Ok(()) => {
                        acked += 1;
                        WriteOutcome::Acked { durable: false }
                    }
                    Err(_) => {
                        failed_writes += 1;
                        WriteOutcome::Failed
                    }
                };
                model.write(offset, &data, outcome);
                let what = format!(
                    "{level}/{members} chunk {chunk}, {shape}: member {slot} dies at member write {}",
                    k + 1
                );
                assert!(
                    io.rule_counts(rule).expect("rule").failed > 0,
                    "{what}: the failure was injected"
                );
                // While the member is dying: no read may return wrong data.
                let (reads, _) = read_each_block(&array, &mut model);
                assert_eq!(reads.wrong, 0, "{what}: wrong reads while failing");
                drop(array);
                // Replace the dead member by nothing: degraded re-assembly from what the others hold.
                let mut after = io.inner().images();
                after[slot] = None;
                let (io2, array) = assemble_images(after, 0, reference())
                    .unwrap_or_else(|e| panic!("{what}: degraded re-assembly: {e}"));
                verify_all(&array, &mut model, &what);
                let expected = model.settled_bytes().expect("settled");
                let audit =
                    audit_images(&g, filled.data_offset_bytes, &images(&io2), Some(&expected));
                assert!(audit.clean(), "{what}: {}", audit.describe());
                points += 1;
            }
        }
    }
    figure(
        "3",
        "row03_member_fails_in_the_middle_of_a_stripe_write",
        &format!(
            "{points} failure points (k-th member write x 4 write shapes x 7 layouts), 0 violations; \
             writes acknowledged {acked}, failed {failed_writes}; parity of survivors consistent in all"
        ),
    );
}

/// Row 3, with a second writer: a write planned while another write held its stripe's lock, and that write's
/// member write failed (evicting the member). The second write planned to read the evicted member's chunk,
/// which misses the first write: read anyway, it would put stale bytes into the parity and so bring them back
/// when the chunk is reconstructed. It must plan again under the lock (concurrent simulation, seed 218289: the
/// first write to a member that had just joined failed beside a stream of writes sharing a page).
#[test]
fn row03_write_queued_behind_a_member_failure_reads_no_stale_chunk() {
    let (chunk_bytes, rows) = (16384u64, 4u64);
    let mut cases = 0;
    for (level, members) in [(Level::Raid6, 4), (Level::Raid5, 3), (Level::Raid6, 5)] {
        let filled = Filled::new(level, members, chunk_bytes, rows, 418 + members as u64);
        let g = filled.geometry;
        let stripe = 1u64;
        // The first write overwrites data index 0 of the stripe (on `victim`) and reads index 1 to make parity;
        // the second changes one page of index 1, which reads less as a reconstruct-write (index 0's page) than
        // as a read-modify-write (its own page and the parity).
        let victim = g.stripe_member(stripe, 0);
        let other = g.stripe_member(stripe, 1);
        let stripe_at = stripe * g.data_per_stripe() as u64 * chunk_bytes;
        let (first_at, first_len) = (stripe_at, chunk_bytes as usize);
        let (second_at, second_len) = (stripe_at + chunk_bytes + 4096, 4096usize);
        let mut rng = SplitMix64::new(cases);
        let mut first = vec![0u8; first_len];
        let mut second = vec![0u8; second_len];
        rng.fill(&mut first);
        rng.fill(&mut second);
        let (io, array) = assemble_images(filled.base.to_vec(), 0, reference()).expect("assemble");
        let data_at = filled.data_offset_bytes;
        let rule = io.add(
            Scope::slot(victim)
                .ops(OpKinds::WRITE)
                .range(data_at..data_at + rows * chunk_bytes),
            Fault::FailFrom {
                nth: 1,
                count: Count::Global,
            },
        );
        // The first write's reads are held back, so the second is planned (victim still active) and waits for
        // the stripe's lock before the first write fails on the victim.
        hold_back(&io, Scope::slot(other).ops(OpKinds::READ), 200);
        let mut model = filled.model();
        std::thread::scope(|s| {
            let array = &array;
            let first = &first;
            let second = &second;
            let a = s.spawn(move || array.write(first_at, first, false));
            std::thread::sleep(std::time::Duration::from_millis(50));
            let b = s.spawn(move || array.write(second_at, second, false));
            a.join()
                .expect("first")
                .expect("first write acknowledged (degraded)");
            b.join()
                .expect("second")
                .expect("second write acknowledged");
        });
        model.write(first_at, &first, WriteOutcome::Acked { durable: false });
        model.write(second_at, &second, WriteOutcome::Acked { durable: false });
        let what =
            format!("{level}/{members}: member {victim} fails the first write of stripe {stripe}");
        assert!(
            io.rule_counts(rule).expect("rule").failed > 0,
            "{what}: the failure was injected"
        );
        assert_eq!(
            array.slot_state(victim),
            SlotState::Faulty,
            "{what}: the member is evicted"
        );
        verify_all(&array, &mut model, &what);
        drop(array);
        let mut after = io.inner().images();
        after[victim] = None;
        let expected = model.settled_bytes().expect("settled");
        let audit = audit_images(&g, data_at, &after, Some(&expected));
        assert!(audit.clean(), "{what}: {}", audit.describe());
        cases += 1;
    }
    assert_eq!(cases, 3);
}

/// Row 8: one member more than the level survives fails while the array runs. No read may return wrong data
/// (most fail, those not touching a dead member may succeed); a write may fail; re-assembly is refused with an
/// error naming the missing slots.
#[test]
fn row08_beyond_tolerance() {
    let cases: [(Level, usize, &[usize]); 7] = [
        (Level::Raid0, 3, &[1]),
        (Level::Raid1, 2, &[0, 1]),
        (Level::Raid5, 4, &[0, 2]),
        (Level::Raid5, 3, &[1, 2]),
        (Level::Raid6, 5, &[1, 2, 4]),
        (Level::Raid10, 4, &[0, 1]),
        (Level::Raid10, 5, &[4, 0]),
    ];
    let (mut reads_total, mut reads_failed, mut wrong) = (0u64, 0u64, 0u64);
    for (c, (level, members, dead)) in cases.into_iter().enumerate() {
        let filled = Filled::new(level, members, 8192, 6, 800 + c as u64);
        assert!(!filled.geometry.survives(&missing(members, dead)));
        let (io, array) = assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
        for &slot in dead {
            io.fail_slot(slot);
        }
        let mut model = filled.model();
        let (r, _) = read_each_block(&array, &mut model);
        let mut rng = SplitMix64::new(c as u64);
        for _ in 0..20 {
            random_write(&array, &mut model, &mut rng);
        }
        let (r2, _) = read_each_block(&array, &mut model);
        for r in [r, r2] {
            reads_total += r.correct + r.failed + r.wrong;
            reads_failed += r.failed;
            wrong += r.wrong;
        }
        assert_eq!(wrong, 0, "{level}/{members} without {dead:?}: wrong reads");
        assert!(r.failed > 0, "{level}: reads of dead members fail");
        drop(array);
        let mut after = io.inner().images();
        for &slot in dead {
            after[slot] = None;
        }
        match assemble_images(after, 0, reference()) {
            Ok(_) => panic!("{level}/{members} without {dead:?}: assembled"),
            Err(e) => {
                // Refused naming the missing slots, or, with every member gone, saying none is present.
                let text = e.to_string();
                let clear = match e {
                    EngineError::AssembleDegraded { .. } => text.contains("cannot run"),
                    EngineError::ValidateOptions { .. } => {
                        dead.len() == members && text.contains("no members present")
                    }
                    _ => false,
                };
                assert!(clear, "{level}: unclear refusal: {text}");
            }
        }
    }
    figure(
        "8",
        "row08_beyond_tolerance",
        &format!(
            "wrong reads {wrong} of {reads_total} block reads ({reads_failed} failed with EIO) over {} cases; \
             re-assembly refused in all",
            cases.len()
        ),
    );
}

/// Row 8, stricter: once the array knows it is beyond tolerance it stops serving: every request fails.
#[test]
fn row08_beyond_tolerance_stops_serving() {
    let filled = Filled::new(Level::Raid5, 4, 8192, 6, 880);
    let (io, array) = assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
    io.fail_slot(0);
    io.fail_slot(2);
    let mut model = filled.model();
    // Touch the dead members until the array notices.
    let _ = read_each_block(&array, &mut model);
    let (r, _) = read_each_block(&array, &mut model);
    assert_eq!(r.wrong, 0);
    assert_eq!(r.correct, 0, "every request fails once beyond tolerance");
    assert!(array.write(0, &[1u8; 10], false).is_err());
    figure(
        "8",
        "row08_beyond_tolerance_stops_serving",
        "every request fails once beyond tolerance",
    );
}

/// Row 10: a member's n-th I/O fails once (for many n): retried, never evicted, every request succeeds. A member
/// whose every I/O fails is evicted once past the threshold, and the array goes on degraded.
#[test]
fn row10_transient_vs_persistent_errors() {
    let filled = Filled::new(Level::Raid5, 4, 8192, 6, 1000);
    let mut transient_cases = 0;
    let mut false_evictions = 0;
    for slot in 0..4 {
        for nth in 1..=12u64 {
            let (io, array) = assemble_cow(&filled.base, &[], nth, reference()).expect("assemble");
            let rule = io.add(
                Scope::slot(slot),
                Fault::FailOnce {
                    nth,
                    count: Count::Global,
                },
            );
            let mut model = filled.model();
            let mut rng = SplitMix64::new(nth);
            for _ in 0..10 {
                assert!(
                    random_write(&array, &mut model, &mut rng),
                    "member {slot}, I/O #{nth} failing once: the error surfaced"
                );
                let (offset, len) = extent(&mut rng, array.size_bytes(), 65536);
                let mut got = vec![0u8; len];
                array
                    .read(offset, &mut got)
                    .expect("read with a transient error");
                model
                    .check_read(offset, &got)
                    .unwrap_or_else(|m| panic!("member {slot}, I/O #{nth}: {m}"));
            }
            verify_all(&array, &mut model, "after a transient error");
            assert_eq!(
                io.rule_counts(rule).expect("rule").failed,
                1,
                "member {slot}: I/O #{nth} failed once"
            );
            if array.slot_state(slot) != SlotState::Active {
                false_evictions += 1;
            }
            transient_cases += 1;
        }
    }
    assert_eq!(false_evictions, 0);
    // Read errors that survive the retry on distinct pages (each page reads again once rewritten): counted one
    // per page, served by reconstruction; the member is evicted only when the count reaches the threshold.
    let threshold = 8u32;
    for bad_pages in [threshold - 1, threshold + 2] {
        let (io, array) = assemble_cow(&filled.base, &[], 7, reference()).expect("assemble");
        array.set_error_threshold(threshold);
        let g = filled.geometry;
        // Pages of member 2's data chunks (not its parity, which plain reads do not touch), over its rows.
        let data_rows: Vec<u64> = (0..g.rows)
            .filter(|r| g.stripe_index(*r, 2) < g.data_per_stripe())
            .collect();
        let n = data_rows.len() as u64;
        for p in 0..bad_pages as u64 {
            let at = filled.data_offset_bytes
                + data_rows[(p % n) as usize] * g.chunk_bytes
                + (p / n) * 4096;
            io.add(
                Scope::slot(2).ops(OpKinds::READ).range(at..at + 4096),
                Fault::FailRun {
                    nth: 1,
                    times: 2,
                    count: Count::Global,
                },
            );
        }
        let mut model = filled.model();
        let (reads, failed) = read_each_block(&array, &mut model);
        assert_eq!(
            (reads.wrong, failed.len()),
            (0, 0),
            "{bad_pages} bad pages: every read served"
        );
        let counted = array.slot_errors(2);
        if bad_pages < threshold {
            assert_eq!(
                array.slot_state(2),
                SlotState::Active,
                "{bad_pages} errors < threshold {threshold}: no eviction"
            );
            assert_eq!(counted, bad_pages, "one counted error per bad page");
        } else {
            assert_eq!(
                array.slot_state(2),
                SlotState::Faulty,
                "{bad_pages} errors >= threshold {threshold}: evicted"
            );
        }
    }
    let (io, array) = assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
    io.fail_slot(1);
    let mut model = filled.model();
    let mut reads_until_evicted = 0;
    let mut buf = vec![0u8; 4096];
    for block in 0..array.size_bytes() / 4096 {
        if array.slot_state(1) != SlotState::Active {
            break;
        }
        array
            .read(block * 4096, &mut buf)
            .expect("served by reconstruction");
        model
            .check_read(block * 4096, &buf)
            .unwrap_or_else(|m| panic!("while member 1 fails: {m}"));
        reads_until_evicted += 1;
    }
    assert_eq!(
        array.slot_state(1),
        SlotState::Faulty,
        "persistent errors evict"
    );
    let counted = array.slot_errors(1);
    let injected = io.counts().failed;
    let (reads, failed) = read_each_block(&array, &mut model);
    assert_eq!(
        (reads.wrong, failed.len()),
        (0, 0),
        "degraded after eviction"
    );
    figure(
        "10",
        "row10_transient_vs_persistent_errors",
        &format!(
            "false evictions {false_evictions} of {transient_cases} transient errors (each retried, no request \
             failed); {} unretryable read errors below the threshold of {threshold}: kept, {} at it: evicted; a dead \
             member: evicted at the first failed rewrite ({counted} counted, {injected} failed member I/Os with \
             retries, {reads_until_evicted} block reads); every read served, 0 wrong",
            threshold - 1,
            threshold + 2
        ),
    );
}

/// Row 13: a member left out of a degraded run (its image kept as a snapshot) comes back after more writes: the
/// event counter must catch it and assembly refuse it, naming it; the array without it still reads right.
/// Both a clean stop and a process kill after the degraded writes. (A power loss while degraded is the write
/// hole: row 4.)
#[test]
fn row13_stale_member_comes_back() {
    let mut attempts = 0;
    for (i, (level, members, chunk, rows)) in redundant_configs().into_iter().enumerate() {
        let filled = Filled::new(level, members, chunk, rows, 1300 + i as u64);
        for (victim, crash) in [(0usize, false), (members - 1, true)] {
            let snapshot = filled.base[victim].clone();
            let mut gone_images: Vec<Option<Vec<u8>>> = filled.base.to_vec();
            gone_images[victim] = None;
            let (io, array) = assemble_images(gone_images, 0, reference()).expect("degraded");
            let mut model = filled.model();
            let mut rng = SplitMix64::new(i as u64);
            for _ in 0..6 {
                assert!(random_write(&array, &mut model, &mut rng));
            }
            let after = if crash {
                drop(array);
                io.inner().cut_power();
                io.inner().crash(i as u64, CrashPolicy::KeepAll).images
            } else {
                array.stop().expect("stop");
                images(&io)
            };
            let mut with_stale = after.clone();
            with_stale[victim] = snapshot;
            attempts += 1;
            match assemble_images(with_stale, 0, reference()) {
                Ok((_, array)) => {
                    // Say what a trusted stale member would serve wrongly.
                    let (r, _) = read_each_block(&array, &mut model);
                    panic!(
                        "{level}/{members}: stale member {victim} trusted ({} wrong reads)",
                        r.wrong
                    );
                }
                Err(EngineError::TrustStaleMember { slot, .. }) => assert_eq!(slot, victim),
                Err(e) => panic!("{level}/{members}: unexpected refusal: {e}"),
            }
            // Without it the array is whole.
            let (_io, array) =
                assemble_images(after, 0, reference()).expect("without the stale one");
            let mut all = vec![0u8; array.size_bytes() as usize];
            array.read(0, &mut all).expect("read");
            if crash {
                model
                    .check_after_crash(&all)
                    .unwrap_or_else(|m| panic!("{level}: after crash: {m}"));
            } else {
                model
                    .check_read(0, &all)
                    .unwrap_or_else(|m| panic!("{level}: {m}"));
            }
        }
    }
    figure(
        "13",
        "row13_stale_member_comes_back",
        &format!("stale reads 0; {attempts} stale re-attachments (after a clean stop or a kill) refused by the event counter"),
    );
}

/// Row 13 for a member failed out while the array runs (not absent at assembly), and offered back: the eviction
/// must be recorded (events) before the member could be trusted again.
#[test]
fn row13_evicted_member_comes_back() {
    let filled = Filled::new(Level::Raid5, 4, 8192, 6, 1390);
    let (io, array) = assemble_cow(&filled.base, &[], 0, reference()).expect("assemble");
    io.fail_slot(2);
    let mut model = filled.model();
    let mut rng = SplitMix64::new(5);
    for _ in 0..8 {
        assert!(
            random_write(&array, &mut model, &mut rng),
            "degraded writes go on"
        );
    }
    assert_eq!(array.slot_state(2), SlotState::Faulty);
    array.stop().expect("stop");
    let mut back = io.inner().images();
    back[2] = filled.base[2].clone();
    match assemble_images(back, 0, reference()) {
        Err(EngineError::TrustStaleMember { slot: 2, .. }) => {}
        Err(e) => panic!("unexpected refusal: {e}"),
        Ok(_) => panic!("evicted member trusted"),
    }
    figure(
        "13",
        "row13_evicted_member_comes_back",
        "evicted member refused at assembly",
    );
}

fn events(image: &Option<Vec<u8>>) -> u64 {
    paraid_engine::Superblock::decode(&image.as_ref().expect("image")[..4096])
        .expect("superblock")
        .events
}

/// Row 13, forked: an update (member 2 failed) reached member 1 but not member 0 before the array went down; the
/// array was started again from member 0 alone, whose next update brought it to the same event count, and was
/// written. Member 1 is stale at equal events: refused, naming it. (Taken as the newest by its position, its table
/// kept both and the array served, from member 1, data older than what member 0's branch acknowledged: simulation
/// seed 9922168 found the fork.) Two branches at the same events that each leave the other out are refused as forked.
#[test]
fn a_forked_history_trusts_neither_branch_blindly() {
    let filled = Filled::new(Level::Raid1, 3, 4096, 8, 1400);
    let (io, array) = assemble_images(filled.base.to_vec(), 0, reference()).expect("assemble");
    let assembled = images(&io);
    array.fail_member(2).expect("fail member 2");
    let failed = images(&io);
    drop(array);
    assert_eq!(events(&failed[1]), events(&assembled[0]) + 1);

    // Branch B: member 0 as it was before the update, started alone, written and flushed, then killed.
    let (io_b, array_b) = assemble_images(vec![assembled[0].clone(), None, None], 1, reference())
        .expect("member 0 alone");
    let mut model = filled.model();
    let mut rng = SplitMix64::new(14);
    for _ in 0..8 {
        assert!(random_write(&array_b, &mut model, &mut rng));
    }
    array_b.flush().expect("flush");
    drop(array_b);
    let branch_b = images(&io_b);
    assert_eq!(
        events(&branch_b[0]),
        events(&failed[1]),
        "the two branches are at the same events"
    );

    // Member 0 of branch B with member 1 of branch A: member 1 is stale.
    let forked = vec![branch_b[0].clone(), failed[1].clone(), None];
    match assemble_images(forked.clone(), 2, reference()) {
        Ok((_, array)) => {
            let (r, _) = read_each_block(&array, &mut model);
            panic!(
                "member 1 of the abandoned branch trusted ({} wrong reads)",
                r.wrong
            );
        }
        Err(e @ EngineError::TrustStaleMember { slot: 1, .. }) => {
            assert!(e.to_string().contains("at the same events"), "{e}")
        }
        Err(e) => panic!("expected member 1 refused as stale, got: {e}"),
    }
    // Re-added, it is rebuilt and every read gives branch B's data.
    let mut opts = AssembleOptions::new(reference());
    opts.re_add = true;
    let io = Arc::new(paraid_engine::MemMembers::from_images(forked));
    let array = assemble_io(io, opts).expect("re-added");
    assert!(array.wait_idle(std::time::Duration::from_secs(30)));
    let (r, _) = read_each_block(&array, &mut model);
    assert_eq!(r.wrong, 0, "reads after re-adding the stale member");
    drop(array);

    // Member 1 too started alone from where it was before the update: a third branch at the same events, and
    // it and branch B each leave the other out.
    let (io_c, array_c) = assemble_images(vec![None, assembled[1].clone(), None], 3, reference())
        .expect("member 1 alone");
    drop(array_c);
    let branch_c = images(&io_c);
    assert_eq!(events(&branch_c[1]), events(&branch_b[0]));
    match assemble_images(
        vec![branch_b[0].clone(), branch_c[1].clone(), None],
        4,
        reference(),
    ) {
        Err(e @ EngineError::TrustForkedMembers { .. }) => {
            assert!(e.to_string().contains("history forked"), "{e}")
        }
        Ok(_) => panic!("two forked branches assembled"),
        Err(e) => panic!("expected a forked history, got: {e}"),
    }
    // `paraid detail` of the same two (as files) describes them and says why serve refuses.
    let dir = std::env::temp_dir().join(format!("paraid-forked-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<std::path::PathBuf> = [&branch_b[0], &branch_c[1]]
        .iter()
        .enumerate()
        .map(|(i, image)| {
            let path = dir.join(format!("m{i}.img"));
            std::fs::write(&path, image.as_ref().unwrap()).unwrap();
            path
        })
        .collect();
    let detail = paraid_engine::inspect(&files).expect("a forked set is described");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        detail.serve.starts_with("refused: ") && detail.serve.contains("history forked"),
        "{}",
        detail.serve
    );
    assert_eq!(detail.members[2].state, SlotState::Missing);
}

/// Two administrators' fails at once, of two members of a RAID5, while a superblock update holds the superblock
/// lock: each fail must judge the tolerance with the other's outcome known. One is done, the other refused, and
/// the array keeps serving (both used to pass their check against the same member states, and the second took
/// the array beyond its tolerance).
#[test]
fn two_fails_at_once_never_take_the_array_beyond_tolerance() {
    let (io, array) = new_array(Level::Raid5, 4, 4096, 8, 31, reference());
    let data = vec![0x5au8; array.size_bytes() as usize];
    array.write(0, &data, false).expect("fill");
    array.flush().expect("flush");
    // Superblock writes take 300 ms: the spare's addition below holds the lock that long.
    let slow = io.add(
        Scope::all().ops(OpKinds::WRITE).range(0..4096),
        Fault::Delay {
            delay: std::time::Duration::from_millis(300),
            one_in: 1,
            sleep: true,
        },
    );
    let array = &array;
    let outcomes = std::thread::scope(|t| {
        let add = t.spawn(|| {
            array.add_member(paraid_engine::NewMember::Image {
                label: "spare".into(),
                size_bytes: member_bytes(4096, 8),
            })
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        let fails = [1, 2].map(|slot| t.spawn(move || array.fail_member(slot)));
        add.join().expect("add thread").expect("add a spare");
        fails.map(|f| f.join().expect("fail thread"))
    });
    io.remove(slow);
    let done = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(done, 1, "exactly one fail is done: {outcomes:?}");
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).expect("the array still serves");
    assert!(back == data, "degraded read differs");
}

/// An array that failed because one member too many left (the `earlier` members died, writes went on degraded
/// and were acknowledged, then the `last` member's writes failed, as on a full file system) is refused at the
/// next start, naming the `last` member as what `force` would trust, and with `force` starts from it: every
/// acknowledged block reads back, the earlier members (which missed acknowledged writes) are not trusted but
/// rebuilt, also not when offered without the last one, and the array is whole again afterwards. (RAID1 has no
/// such case: its last member's failure is recorded by no one, so it starts from that member without force.)
#[test]
fn a_failed_array_starts_by_force_from_the_member_that_left_last() {
    let cases: [(Level, usize, &[usize], usize); 5] = [
        (Level::Raid5, 3, &[2], 0),
        (Level::Raid5, 5, &[1], 3),
        (Level::Raid6, 5, &[4, 2], 0),
        (Level::Raid6, 4, &[3, 1], 2),
        (Level::Raid10, 4, &[1], 0),
    ];
    for (c, (level, members, earlier, last)) in cases.into_iter().enumerate() {
        let what = format!("{level} of {members}, {earlier:?} then {last}");
        let seed = 43 + c as u64;
        let (io, array) = new_array(level, members, 4096, 16, seed, reference());
        let mut rng = SplitMix64::new(seed);
        let mut model = fill(&array, &mut rng);
        for &slot in earlier {
            io.fail_slot(slot);
            for _ in 0..15 {
                random_write(&array, &mut model, &mut rng);
            }
            array.flush().expect("degraded flush");
            model.flushed();
            assert_eq!(array.slot_state(slot), SlotState::Faulty, "{what}");
        }
        // The last member's writes fail from now on (its reads still work): the array goes beyond its tolerance.
        let full = io.add(
            Scope::slot(last).ops(OpKinds::WRITE),
            Fault::FailFrom {
                nth: 1,
                count: Count::Global,
            },
        );
        for _ in 0..10 {
            random_write(&array, &mut model, &mut rng);
        }
        assert!(
            array.write(0, &[1u8; 4096], false).is_err(),
            "{what}: the array failed"
        );
        model.write(0, &[1u8; 4096], WriteOutcome::Failed);
        io.remove(full);
        drop(array);
        // The process ends without a crash: what the members hold now is what the next start finds.
        let images = io.inner().images();
        let refused = assemble_images(images.clone(), 0, reference());
        let last_label = std::path::PathBuf::from(format!("crash{last}"));
        assert!(
            matches!(&refused, Err(EngineError::AssembleFailedArray { force_would_trust, .. })
                if force_would_trust.as_slice() == std::slice::from_ref(&last_label)),
            "{what}: without force: {:?}",
            refused.err()
        );
        let forced = |images: Vec<Option<Vec<u8>>>| {
            let io = Arc::new(FaultyMembers::new(CrashMembers::from_images(images), 0));
            assemble_io(
                io,
                AssembleOptions {
                    force: true,
                    ..AssembleOptions::new(reference())
                },
            )
        };
        // The earlier members offered without the last one: they left while the array served on and missed
        // acknowledged writes, so force trusts none of them.
        let mut early = images.clone();
        early[last] = None;
        assert!(
            forced(early).is_err(),
            "{what}: forced from members that left earlier"
        );
        let array = forced(images).unwrap_or_else(|e| panic!("{what}: forced assembly: {e}"));
        assert_eq!(array.slot_state(last), SlotState::Active, "{what}: trusted");
        for &slot in earlier {
            assert_ne!(
                array.slot_state(slot),
                SlotState::Active,
                "{what}: slot {slot} is not trusted"
            );
        }
        verify_all(
            &array,
            &mut model,
            &format!("{what}: forced, before the rebuild"),
        );
        assert!(
            array.wait_idle(std::time::Duration::from_secs(60)),
            "{what}: the rebuild ends"
        );
        assert!(
            (0..members).all(|s| array.slot_state(s) == SlotState::Active),
            "{what}: rebuilt"
        );
        verify_all(
            &array,
            &mut model,
            &format!("{what}: forced, after the rebuild"),
        );
    }
}

/// The forced-start tests' array: a RAID5 of 4 with 4 KiB chunks, without the stripe cache (a write's reads then
/// go to the members, where a test can slow them) and the background tick, filled and flushed, with slot 3 out
/// and stripes 1 and 3 written degraded (their bitmap regions dirty). Stripe 3: chunks 0, 1, 2 on slots 1, 2, 3,
/// P on slot 0; stripe 1: chunks 0, 1, 2 on slots 3, 0, 1, P on slot 2.
fn raid5_of_4_without_slot_3(seed: u64) -> (Arc<Stack>, Array, BlockModel) {
    const CHUNK: u64 = 4096;
    let io = Arc::new(FaultyMembers::new(
        CrashMembers::new(4, member_bytes(CHUNK, 8)),
        seed,
    ));
    create_io(io.as_ref(), Level::Raid5, CHUNK, "faults").expect("create_io");
    let opts = AssembleOptions {
        stripe_cache_bytes: Some(0),
        ..AssembleOptions::new(reference())
    };
    let array = assemble_io(io.clone(), opts).expect("assemble_io");
    array.set_integrity_tick(false);
    let g = array.geometry();
    let slots = |stripe: u64| {
        (0..4)
            .map(|i| g.stripe_member(stripe, i))
            .collect::<Vec<_>>()
    };
    assert_eq!(slots(3), vec![1, 2, 3, 0], "stripe 3");
    assert_eq!(slots(1), vec![3, 0, 1, 2], "stripe 1");
    let mut rng = SplitMix64::new(seed);
    let mut model = fill(&array, &mut rng);
    io.fail_slot(3);
    for stripe in [1, 3] {
        let bytes = vec![0x11 + stripe as u8; CHUNK as usize];
        let at = stripe * g.stripe_bytes() + CHUNK;
        array.write(at, &bytes, false).expect("a degraded write");
        model.write(at, &bytes, WriteOutcome::Acked { durable: false });
    }
    array.flush().expect("flush");
    model.flushed();
    assert_eq!(array.slot_state(3), SlotState::Faulty);
    // The rebuild job slot 3's eviction asked for (it finds no spare) takes the membership exclusively: pending
    // beside a write in flight, it would hold every later request until that write ends.
    assert!(
        array.wait_idle(std::time::Duration::from_secs(30)),
        "no background job left"
    );
    (io, array, model)
}

/// Fails the array of `raid5_of_4_without_slot_3` under a write in flight: with slot 0's reads taking 500 ms and
/// slot 1's writes failing, write B (one chunk of 0xBB at `b_at`, FUA if `fua`) starts, and 100 ms into its read of P
/// write X, the whole of stripe 1, fails on slot 1: slot 1 leaves and the array fails. Both writes fail.
fn fail_the_array_beside_a_slow_write(
    io: &Stack,
    array: &Array,
    model: &mut BlockModel,
    b_at: u64,
    fua: bool,
) {
    let g = array.geometry();
    io.add(
        Scope::slot(0).ops(OpKinds::READ),
        Fault::Delay {
            delay: std::time::Duration::from_millis(500),
            one_in: 1,
            sleep: true,
        },
    );
    io.add(
        Scope::slot(1).ops(OpKinds::WRITE),
        Fault::FailFrom {
            nth: 1,
            count: Count::Global,
        },
    );
    let b = vec![0xBB; g.chunk_bytes as usize];
    let x = vec![0xCC; g.stripe_bytes() as usize];
    let (b_result, x_result) = std::thread::scope(|s| {
        let b_thread = s.spawn(|| array.write(b_at, &b, fua));
        // X starts 100 ms into B's slow read of P (a pause from B's start raced B under load).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !io
            .injections()
            .iter()
            .any(|i| i.slot == 0 && matches!(i.what, Injected::Delayed { .. }))
        {
            assert!(std::time::Instant::now() < deadline, "B never read P");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let x_result = array.write(g.stripe_bytes(), &x, false);
        (b_thread.join().unwrap(), x_result)
    });
    assert!(
        x_result.is_err() && b_result.is_err(),
        "the array failed: X {x_result:?}, B {b_result:?}"
    );
    model.write(b_at, &b, WriteOutcome::Failed);
    model.write(g.stripe_bytes(), &x, WriteOutcome::Failed);
}

/// Starts the array of `images` without slot 3, by force.
fn start_by_force_without_slot_3(mut images: Vec<Option<Vec<u8>>>) -> Array {
    images[3] = None;
    let stack = Arc::new(FaultyMembers::new(CrashMembers::from_images(images), 0));
    let opts = AssembleOptions {
        force: true,
        ..AssembleOptions::new(reference())
    };
    let array =
        assemble_io(stack, opts).expect("forced start from slot 1, the member that left last");
    assert_eq!(array.slot_state(1), SlotState::Active);
    array
}

/// A write in flight when another write's failure fails the array (simulation seed 10052938). RAID5 of 4, slot 3
/// already out. Write B rewrites stripe 3's chunk 0 (slot 1; chunk 2 is on slot 3, P on slot 0) and is still
/// reading P (slow) when write X, a full-stripe write of stripe 1, fails on slot 1: slot 1 leaves and the array
/// fails. A forced start trusts slot 1 again, whose chunk 0 B never reached, and must solve chunk 2 (slot 3,
/// flushed long before) from the stripe. Before: B logged its entry after slot 1 had left, counting chunk 0 as
/// living in the parity (B's new bytes in its partial parity), and wrote P in place; the forced start solved
/// chunk 2 from that entry against slot 1's old chunk 0: garbage. Now nothing is logged or written in place
/// once the array failed.
#[test]
fn a_write_in_flight_when_the_array_fails_leaves_the_forced_start_whole() {
    let (io, array, mut model) = raid5_of_4_without_slot_3(10052938);
    let stripe_3 = 3 * array.geometry().stripe_bytes();
    fail_the_array_beside_a_slow_write(&io, &array, &mut model, stripe_3, false);
    drop(array);
    let array = start_by_force_without_slot_3(io.inner().images());
    verify_all(&array, &mut model, "forced, slot 3 missing");
}

/// A forced start after a power loss: the member it trusts lost a write, and the log brings the stripe back.
/// RAID5 of 4, slot 3 out, stripe 3 as above (chunk 0 on slot 1, chunk 2 on slot 3, P on slot 0). Write W
/// rewrites chunk 0 and is acknowledged without a flush: its entry is live, its P and slot 1's chunk in the
/// members' caches. Write X then fails on slot 1 and fails the array (the eviction makes the survivors durable,
/// P included), while FUA write B, reading P slowly, is still in flight; a background tick follows. The power
/// goes and slot 1 loses W's chunk. The forced start trusts slot 1, and chunk 2 (flushed long before) must be
/// solved with W's entry, not from P (which holds W's bytes) against slot 1's old chunk 0: nothing after the
/// failure may retire or outdate that entry.
#[test]
fn a_forced_start_after_a_power_loss_solves_what_the_trusted_member_lost_from_the_log() {
    let (io, array, mut model) = raid5_of_4_without_slot_3(27);
    let g = array.geometry();
    let stripe_3 = 3 * g.stripe_bytes();
    let w = vec![0x77; g.chunk_bytes as usize];
    array.write(stripe_3, &w, false).expect("write W");
    model.write(stripe_3, &w, WriteOutcome::Acked { durable: false });
    fail_the_array_beside_a_slow_write(&io, &array, &mut model, stripe_3 + g.chunk_bytes, true);
    let _ = array.run_integrity_tick();
    drop(array);
    io.inner().cut_power();
    let images = (0..4).map(|slot| io.inner().durable_image(slot)).collect();
    let array = start_by_force_without_slot_3(images);
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read the forced array");
    if let Err(m) = model.check_after_crash(&all) {
        panic!("forced after a power loss, slot 3 missing: {m}");
    }
}

/// When a member leaves, the survivors are flushed (what the leaver held now lives only in parity). A survivor
/// whose flush fails there, after a retry, is evicted too. That flush used to be fire-and-forget, left for the next
/// request to find, and a member that had failed it could go on serving with writes it may have lost: the
/// concurrent simulation found it (seed 54300577), a new member failing its flush after another member left
/// beside its rebuild. RAID6 of six, every flush of slot 0 failing from now on, slot 1 failed by a write: both
/// leave, the array serves degraded by two, every block reads back.
#[test]
fn a_survivor_whose_flush_fails_as_a_member_leaves_is_evicted_too() {
    const CHUNK: u64 = 16384;
    let (io, array) = new_array(Level::Raid6, 6, CHUNK, 8, 54, reference());
    array.set_integrity_tick(false);
    let mut rng = SplitMix64::new(54);
    let mut model = fill(&array, &mut rng);
    io.add(
        Scope::slot(0).ops(OpKinds::FLUSH),
        Fault::FailFrom {
            nth: 1,
            count: Count::Global,
        },
    );
    io.fail_slot(1);
    // A write reaching slot 1 fails there and evicts it; the survivors' flush then fails on slot 0.
    let g = array.geometry();
    let k = g.data_per_stripe() as u64;
    let stripe = (0..g.stripes())
        .find(|&s| (0..k as usize).any(|i| g.stripe_member(s, i) == 1))
        .expect("a stripe with a chunk on slot 1");
    let index = (0..k as usize)
        .find(|&i| g.stripe_member(stripe, i) == 1)
        .expect("chunk on slot 1") as u64;
    let at = (stripe * k + index) * CHUNK;
    let bytes = vec![0x5a; 4096];
    array
        .write(at, &bytes, false)
        .expect("a write, degraded by the eviction");
    model.write(at, &bytes, WriteOutcome::Acked { durable: false });
    assert_eq!(
        array.slot_state(1),
        SlotState::Faulty,
        "slot 1 failed a write"
    );
    assert_eq!(
        array.slot_state(0),
        SlotState::Faulty,
        "slot 0 failed the survivors' flush and must not serve"
    );
    verify_all(&array, &mut model, "degraded by two");
}
