//! Every CPU backend against the reference: gen, update, every single and double erasure, check, and
//! the batched forms, on random geometries, lengths and buffer placements. The reference itself is
//! held to the definitions (recover must give back what was lost; check must name what was broken).

mod common;

use common::{Placement, Rng, TestBuf, TestStripe, PLACEMENTS};
use paraid_parity::reference::Reference;
use paraid_parity::{
    cpu_backends, gf, Backend, CheckOutcome, ParityError, StripeGen, StripeRecover,
};

/// Lengths that hit every path of a SIMD kernel: empty, shorter than a vector, exact vectors, and
/// vectors with odd tails, up to several unrolled blocks.
const LENGTHS: [usize; 14] = [
    0,
    1,
    15,
    63,
    64,
    65,
    127,
    128,
    191,
    256,
    320,
    511,
    1024 + 64 + 13,
    4096,
];

fn backends() -> Vec<std::sync::Arc<dyn Backend>> {
    let all = cpu_backends();
    let names: Vec<&str> = all.iter().map(|b| b.name()).collect();
    eprintln!("backends under test: {names:?}");
    all
}

#[test]
fn reference_matches_hand_computed_stripe() {
    // k = 3, one byte per chunk: P = d0 ^ d1 ^ d2, Q = d0 ^ 2*d1 ^ 4*d2 with 0x11d reduction.
    let data: [&[u8]; 3] = [&[0x80], &[0x80], &[0x01]];
    let mut p = [0u8];
    let mut q = [0u8];
    Reference.gen_pq(&data, &mut p, &mut q);
    assert_eq!(p[0], 0x01);
    // 2 * 0x80 = 0x100 ^ 0x11d = 0x1d; so Q = 0x80 ^ 0x1d ^ 0x04.
    assert_eq!(q[0], 0x80 ^ 0x1d ^ 0x04);
}

#[test]
fn gen_matches_reference() {
    let mut rng = Rng::new(1);
    for backend in backends() {
        for &len in &LENGTHS {
            for placement in PLACEMENTS {
                let k = 1 + rng.below(32);
                let mut expected = TestStripe::random(k, true, len, placement, &mut rng);
                let mut stripe = TestStripe::random(k, true, len, placement, &mut rng);
                for (dst, src) in stripe.chunks[..k].iter_mut().zip(&expected.chunks[..k]) {
                    dst.as_mut_slice().copy_from_slice(src.as_slice());
                }
                // Garbage in the outputs must not leak into the result.
                for parity in &mut stripe.chunks[k..] {
                    rng.fill(parity.as_mut_slice());
                }
                expected.gen(&Reference);
                stripe.gen(backend.as_ref());
                assert_eq!(
                    stripe.to_vecs(),
                    expected.to_vecs(),
                    "{} gen_pq k={k} len={len} {placement:?}",
                    backend.name()
                );

                let mut p = TestBuf::random(len, placement, &mut rng);
                backend.gen_p(&stripe.data(), p.as_mut_slice());
                assert_eq!(
                    p.as_slice(),
                    expected.chunks[k].as_slice(),
                    "{} gen_p k={k} len={len} {placement:?}",
                    backend.name()
                );
            }
        }
        // The widest stripes, including RAID6's limit of 253 data chunks.
        for k in [
            2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 31, 32, 33, 64, 128, 253,
        ] {
            let len = 64 * (1 + rng.below(8)) + rng.below(2) * rng.below(64);
            let mut expected =
                TestStripe::random(k, true, len, Placement::Offset(rng.below(64)), &mut rng);
            let data: Vec<Vec<u8>> = expected.data().iter().map(|c| c.to_vec()).collect();
            let data: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
            let mut p = vec![0u8; len];
            let mut q = vec![0u8; len];
            backend.gen_pq(&data, &mut p, &mut q);
            expected.gen(&Reference);
            assert_eq!(
                p,
                expected.chunks[k].as_slice(),
                "{} P k={k} len={len}",
                backend.name()
            );
            assert_eq!(
                q,
                expected.chunks[k + 1].as_slice(),
                "{} Q k={k} len={len}",
                backend.name()
            );
        }
    }
}

#[test]
fn update_matches_gen_of_new_data() {
    let mut rng = Rng::new(2);
    for backend in backends() {
        for &len in &LENGTHS {
            for placement in PLACEMENTS {
                for has_q in [false, true] {
                    let k = 1 + rng.below(32);
                    let mut stripe = TestStripe::random(k, has_q, len, placement, &mut rng);
                    stripe.gen(&Reference);
                    // Several read-modify-writes in a row, sometimes of the same chunk.
                    for _ in 0..3 {
                        let index = rng.below(k);
                        let new = TestBuf::random(len, placement, &mut rng);
                        let old = stripe.chunks[index].as_slice().to_vec();
                        let (data, parity) = stripe.chunks.split_at_mut(k);
                        match parity {
                            [p] => {
                                backend.update(index, &old, new.as_slice(), p.as_mut_slice(), None)
                            }
                            [p, q] => backend.update(
                                index,
                                &old,
                                new.as_slice(),
                                p.as_mut_slice(),
                                Some(q.as_mut_slice()),
                            ),
                            _ => unreachable!(),
                        }
                        data[index].as_mut_slice().copy_from_slice(new.as_slice());
                    }
                    let mut expected = stripe.to_vecs();
                    let data: Vec<&[u8]> = expected[..k]
                        .iter()
                        .map(|c| c.as_slice())
                        .collect::<Vec<_>>();
                    let mut p = vec![0u8; len];
                    let mut q = vec![0u8; len];
                    if has_q {
                        Reference.gen_pq(&data, &mut p, &mut q);
                    } else {
                        Reference.gen_p(&data, &mut p);
                    }
                    expected[k] = p;
                    if has_q {
                        expected[k + 1] = q;
                    }
                    assert_eq!(
                        stripe.to_vecs(),
                        expected,
                        "{} update k={k} len={len} has_q={has_q} {placement:?}",
                        backend.name()
                    );
                }
            }
        }
    }
}

/// Wipes `missing`, recovers, and compares with the original stripe.
fn assert_recovers(
    backend: &dyn Backend,
    stripe: &mut TestStripe,
    missing: &[usize],
    rng: &mut Rng,
) {
    let original = stripe.to_vecs();
    for &m in missing {
        rng.fill(stripe.chunks[m].as_mut_slice());
    }
    let has_q = stripe.has_q;
    let result = backend.recover(&mut stripe.all_mut(), has_q, missing);
    assert_eq!(result, Ok(()), "{} recover {missing:?}", backend.name());
    let len = original[0].len();
    for (i, chunk) in stripe.chunks.iter().enumerate() {
        assert!(
            chunk.as_slice() == original[i].as_slice(),
            "{} recover k={} len={len} has_q={has_q} missing={missing:?}: chunk {i} differs",
            backend.name(),
            stripe.k
        );
    }
}

#[test]
fn recover_every_single_and_double_erasure() {
    let mut rng = Rng::new(3);
    for backend in backends() {
        for k in 1..=32 {
            // Lengths with whole vectors and a tail; the placement rotates with k.
            let len = [64, 200, 4 * 64 + 1, 129][k % 4];
            let placement = PLACEMENTS[k % PLACEMENTS.len()];
            let mut raid5 = TestStripe::random(k, false, len, placement, &mut rng);
            raid5.gen(&Reference);
            assert_recovers(backend.as_ref(), &mut raid5, &[], &mut rng);
            for m in 0..=k {
                assert_recovers(backend.as_ref(), &mut raid5, &[m], &mut rng);
            }
            let mut raid6 = TestStripe::random(k, true, len, placement, &mut rng);
            raid6.gen(&Reference);
            for x in 0..k + 2 {
                assert_recovers(backend.as_ref(), &mut raid6, &[x], &mut rng);
                for y in x + 1..k + 2 {
                    // Both orders: callers need not sort.
                    let missing = if (x + y) % 2 == 0 { [x, y] } else { [y, x] };
                    assert_recovers(backend.as_ref(), &mut raid6, &missing, &mut rng);
                }
            }
        }
        // Wide stripes: a sample of pairs, including the last data chunk and both parities.
        for k in [64, 200, 253] {
            let len = 64 * 3 + 5;
            let mut raid6 = TestStripe::random(k, true, len, Placement::GuardPage, &mut rng);
            raid6.gen(&Reference);
            for missing in [
                [0, 1],
                [0, k - 1],
                [k - 2, k - 1],
                [k - 1, k],
                [k - 1, k + 1],
                [k, k + 1],
                [3, k],
                [7, k + 1],
            ] {
                assert_recovers(backend.as_ref(), &mut raid6, &missing, &mut rng);
            }
        }
    }
}

#[test]
fn recover_on_random_geometries_and_placements() {
    let mut rng = Rng::new(4);
    for backend in backends() {
        for _ in 0..60 {
            let k = 1 + rng.below(40);
            let len = LENGTHS[rng.below(LENGTHS.len())];
            let placement = PLACEMENTS[rng.below(PLACEMENTS.len())];
            let has_q = rng.below(2) == 1;
            let mut stripe = TestStripe::random(k, has_q, len, placement, &mut rng);
            stripe.gen(&Reference);
            let chunks = stripe.chunks.len();
            let x = rng.below(chunks);
            let missing: Vec<usize> = if has_q && rng.below(4) != 0 {
                let y = (x + 1 + rng.below(chunks - 1)) % chunks;
                vec![x, y]
            } else {
                vec![x]
            };
            assert_recovers(backend.as_ref(), &mut stripe, &missing, &mut rng);
        }
    }
}

#[test]
fn recover_reports_bad_requests() {
    let mut rng = Rng::new(5);
    for backend in backends() {
        let mut stripe = TestStripe::random(4, true, 64, Placement::Offset(0), &mut rng);
        assert_eq!(
            backend.recover(&mut stripe.all_mut(), true, &[0, 1, 2]),
            Err(ParityError::TooManyMissing {
                missing: 3,
                tolerated: 2
            })
        );
        assert_eq!(
            backend.recover(&mut stripe.all_mut(), false, &[0, 1]),
            Err(ParityError::TooManyMissing {
                missing: 2,
                tolerated: 1
            })
        );
        assert_eq!(
            backend.recover(&mut stripe.all_mut(), true, &[6]),
            Err(ParityError::MissingIndexOutOfRange {
                index: 6,
                chunks: 6
            })
        );
        let mut short = vec![0u8; 32];
        let mut chunks = stripe.all_mut();
        chunks[2] = &mut short;
        assert_eq!(
            backend.recover(&mut chunks, true, &[0]),
            Err(ParityError::LengthMismatch {
                expected: 64,
                found: 32
            })
        );
        let mut one = [0u8; 64];
        let mut two = [0u8; 64];
        assert!(matches!(
            backend.recover(&mut [&mut one[..], &mut two[..]], true, &[0]),
            Err(ParityError::Geometry { .. })
        ));
    }
}

#[test]
fn check_names_the_single_bad_chunk() {
    let mut rng = Rng::new(6);
    for backend in backends() {
        for k in [1, 2, 3, 5, 10, 17, 32, 253] {
            let len = [64, 100, 4096 + 64 + 3, 1][k % 4];
            let placement = PLACEMENTS[k % PLACEMENTS.len()];
            for has_q in [false, true] {
                let mut stripe = TestStripe::random(k, has_q, len, placement, &mut rng);
                stripe.gen(&Reference);
                assert_eq!(
                    backend.check(&stripe.all(), has_q),
                    CheckOutcome::Consistent,
                    "{} k={k}",
                    backend.name()
                );
                for bad in 0..stripe.chunks.len() {
                    if k > 40 && bad % 16 != 0 && bad < k {
                        continue;
                    }
                    // Corrupt one or a few bytes of one chunk.
                    let saved = stripe.chunks[bad].as_slice().to_vec();
                    for _ in 0..1 + rng.below(3) {
                        let at = rng.below(len);
                        let flip = rng.nonzero_byte();
                        stripe.chunks[bad].as_mut_slice()[at] ^= flip;
                    }
                    let changed = stripe.chunks[bad].as_slice() != saved.as_slice();
                    let expected = match (changed, has_q) {
                        (false, _) => CheckOutcome::Consistent,
                        (true, false) => CheckOutcome::Mismatch,
                        (true, true) => CheckOutcome::BadChunk(bad),
                    };
                    assert_eq!(
                        backend.check(&stripe.all(), has_q),
                        expected,
                        "{} k={k} len={len} bad={bad}",
                        backend.name()
                    );
                    stripe.chunks[bad].as_mut_slice().copy_from_slice(&saved);
                }
                if has_q && stripe.chunks.len() >= 3 && len >= 2 {
                    // Two bad chunks at different bytes can never look like one.
                    let a = rng.below(stripe.chunks.len());
                    let b = (a + 1 + rng.below(stripe.chunks.len() - 1)) % stripe.chunks.len();
                    stripe.chunks[a].as_mut_slice()[0] ^= rng.nonzero_byte();
                    stripe.chunks[b].as_mut_slice()[len - 1] ^= rng.nonzero_byte();
                    assert_eq!(
                        backend.check(&stripe.all(), has_q),
                        CheckOutcome::Mismatch,
                        "{} k={k} bad={a},{b}",
                        backend.name()
                    );
                }
            }
        }
    }
}

#[test]
fn check_rejects_data_error_aliasing_past_k() {
    // Sq / Sp = 2^z with z >= k cannot come from one data chunk: two chunks are bad.
    let k = 4;
    let len = 64;
    let mut rng = Rng::new(7);
    for backend in backends() {
        let mut stripe = TestStripe::random(k, true, len, Placement::Offset(0), &mut rng);
        stripe.gen(&Reference);
        // Error e in P and 2^9 e in Q at the same byte: looks like data chunk 9, which k = 4 lacks.
        stripe.chunks[k].as_mut_slice()[10] ^= 0x33;
        stripe.chunks[k + 1].as_mut_slice()[10] ^= gf::mul(gf::exp(9), 0x33);
        assert_eq!(
            backend.check(&stripe.all(), true),
            CheckOutcome::Mismatch,
            "{}",
            backend.name()
        );
    }
}

#[test]
fn batched_forms_match_single_stripe_forms() {
    let mut rng = Rng::new(8);
    for backend in backends() {
        let k = 6;
        let len = 64 * 5 + 7;
        let mut stripes: Vec<TestStripe> = (0..9)
            .map(|i| TestStripe::random(k, i % 3 != 0, len, PLACEMENTS[i % 4], &mut rng))
            .collect();
        let expected: Vec<Vec<Vec<u8>>> = stripes
            .iter()
            .map(|s| {
                let mut copy =
                    TestStripe::random(k, s.has_q, len, Placement::Offset(0), &mut Rng::new(0));
                for (dst, src) in copy.chunks.iter_mut().zip(&s.chunks) {
                    dst.as_mut_slice().copy_from_slice(src.as_slice());
                }
                copy.gen(&Reference);
                copy.to_vecs()
            })
            .collect();

        // gen_batch
        {
            let mut datas: Vec<Vec<&[u8]>> = Vec::new();
            let mut parities: Vec<Vec<&mut [u8]>> = Vec::new();
            for s in stripes.iter_mut() {
                let (data, parity) = s.chunks.split_at_mut(k);
                datas.push(data.iter().map(|c| c.as_slice()).collect());
                parities.push(parity.iter_mut().map(|c| c.as_mut_slice()).collect());
            }
            let mut batch: Vec<StripeGen> = datas
                .iter()
                .zip(parities.iter_mut())
                .map(|(data, parity)| {
                    let mut parity = parity.iter_mut();
                    let p: &mut [u8] = parity.next().expect("P");
                    let q: Option<&mut [u8]> = parity.next().map(|q| &mut **q);
                    StripeGen { data, p, q }
                })
                .collect();
            backend.gen_batch(&mut batch);
        }
        for (s, e) in stripes.iter().zip(&expected) {
            assert_eq!(&s.to_vecs(), e, "{} gen_batch", backend.name());
        }

        // check_batch: break stripe 4's chunk 2.
        stripes[4].chunks[2].as_mut_slice()[5] ^= 1;
        let all: Vec<Vec<&[u8]>> = stripes.iter().map(|s| s.all()).collect();
        let outcomes_expected: Vec<CheckOutcome> = stripes
            .iter()
            .map(|s| Reference.check(&s.all(), s.has_q))
            .collect();
        for has_q in [false, true] {
            let group: Vec<&[&[u8]]> = all
                .iter()
                .zip(&stripes)
                .filter(|(_, s)| s.has_q == has_q)
                .map(|(a, _)| a.as_slice())
                .collect();
            let mut out = vec![CheckOutcome::Consistent; group.len()];
            backend.check_batch(&group, has_q, &mut out);
            let want: Vec<CheckOutcome> = outcomes_expected
                .iter()
                .zip(&stripes)
                .filter(|(_, s)| s.has_q == has_q)
                .map(|(o, _)| *o)
                .collect();
            assert_eq!(out, want, "{} check_batch has_q={has_q}", backend.name());
        }
        assert_eq!(outcomes_expected[4], CheckOutcome::BadChunk(2));
        stripes[4].chunks[2].as_mut_slice()[5] ^= 1;

        // recover_batch: a different erasure in every stripe.
        let missing: Vec<Vec<usize>> = stripes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.has_q {
                    vec![i % k, k + (i % 2)]
                } else {
                    vec![i % (k + 1)]
                }
            })
            .collect();
        for (s, m) in stripes.iter_mut().zip(&missing) {
            for &i in m {
                s.chunks[i].as_mut_slice().fill(0xa5);
            }
        }
        {
            let mut chunk_lists: Vec<Vec<&mut [u8]>> =
                stripes.iter_mut().map(|s| s.all_mut()).collect();
            let mut batch: Vec<StripeRecover> = chunk_lists
                .iter_mut()
                .zip(&stripes_has_q(&expected, k))
                .zip(&missing)
                .map(|((chunks, &has_q), missing)| StripeRecover {
                    chunks: chunks.as_mut_slice(),
                    has_q,
                    missing,
                })
                .collect();
            assert_eq!(backend.recover_batch(&mut batch), Ok(()));
        }
        for (s, e) in stripes.iter().zip(&expected) {
            assert_eq!(&s.to_vecs(), e, "{} recover_batch", backend.name());
        }
    }
}

fn stripes_has_q(expected: &[Vec<Vec<u8>>], k: usize) -> Vec<bool> {
    expected
        .iter()
        .map(|chunks| chunks.len() == k + 2)
        .collect()
}

#[test]
fn raid5_takes_255_data_chunks() {
    let mut rng = Rng::new(9);
    for backend in backends() {
        let k = 255;
        let mut stripe = TestStripe::random(k, false, 64 + 3, Placement::Offset(5), &mut rng);
        stripe.gen(backend.as_ref());
        let mut expected = stripe.to_vecs();
        let data: Vec<&[u8]> = expected[..k].iter().map(|c| c.as_slice()).collect();
        let mut p = vec![0u8; 67];
        Reference.gen_p(&data, &mut p);
        expected[k] = p;
        assert_eq!(stripe.to_vecs(), expected, "{} gen_p k=255", backend.name());
        assert_recovers(backend.as_ref(), &mut stripe, &[200], &mut rng);
        assert_recovers(backend.as_ref(), &mut stripe, &[k], &mut rng);
        assert_eq!(
            backend.check(&stripe.all(), false),
            CheckOutcome::Consistent
        );
        stripe.chunks[254].as_mut_slice()[66] ^= 4;
        assert_eq!(backend.check(&stripe.all(), false), CheckOutcome::Mismatch);
    }
}

#[test]
#[should_panic(expected = "at most 255 data chunks")]
fn more_than_255_data_chunks_is_refused() {
    let chunk = [0u8; 64];
    let data: Vec<&[u8]> = vec![&chunk[..]; 256];
    let mut p = [0u8; 64];
    paraid_parity::cpu_best().gen_p(&data, &mut p);
}
