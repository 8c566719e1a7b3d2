//! The CUDA backend: every kernel compiles with NVRTC (no GPU needed), the fallback works where
//! there is no GPU, and, where there is one, the GPU is byte-identical to the reference.

mod common;

use std::sync::Arc;

use common::{Placement, Rng, TestStripe, PLACEMENTS};
use paraid_parity::cuda::{
    compile_kernel, driver_present, nvrtc_present, CudaBackend, GpuPolicy, IN_PLACE_KERNEL_NAME,
    KERNEL_SOURCES,
};
use paraid_parity::reference::Reference;
use paraid_parity::{
    cpu_best, select, Backend, BackendChoice, CheckOutcome, StripeGen, StripeRecover,
};

#[test]
fn every_kernel_source_is_listed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda/kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("kernel directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = KERNEL_SOURCES
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "every .cu file must be in KERNEL_SOURCES so CI compiles it"
    );
}

#[test]
fn cuda_kernels_compile_with_nvrtc() {
    if !nvrtc_present() {
        eprintln!(
            "skipped: libnvrtc is not loadable; install the nvidia-cuda-nvrtc wheel and export \
             LD_LIBRARY_PATH=$(scripts/nvrtc-path.sh) (scripts/test.sh does both)"
        );
        return;
    }
    // Hopper (the target), Ampere, and NVRTC's default.
    for (name, source) in KERNEL_SOURCES {
        for arch in [None, Some("compute_80"), Some("compute_90")] {
            let ptx = compile_kernel(name, source, arch)
                .unwrap_or_else(|e| panic!("{name} for {arch:?}: {e}"));
            let text = ptx.to_src();
            for entry in ["paraid_stripe", IN_PLACE_KERNEL_NAME] {
                assert!(
                    text.contains(&format!(".entry {entry}(")),
                    "{name} for {arch:?}: no {entry} entry in the PTX"
                );
            }
            // No per-thread stack: a local-memory spill would make the kernel crawl.
            assert!(
                !text.contains(".local"),
                "{name} for {arch:?}: kernel uses local memory"
            );
            if std::env::var_os("PARAID_DUMP_PTX").is_some() {
                eprintln!("{text}");
            }
            if let Some(arch) = arch {
                let target = arch.replace("compute_", "sm_");
                assert!(
                    text.contains(&format!(".target {target}")),
                    "{name}: PTX not for {target}"
                );
            }
        }
        eprintln!("{name}: compiled by NVRTC for default, compute_80, compute_90");
    }
}

#[test]
fn nvrtc_reports_compile_errors_instead_of_panicking() {
    if !nvrtc_present() {
        eprintln!("skipped: libnvrtc is not loadable");
        return;
    }
    let error = compile_kernel(
        "broken.cu",
        "extern \"C\" __global__ void k() { this is not CUDA }",
        None,
    )
    .expect_err("broken source must not compile");
    assert!(
        error.to_string().contains("compile the parity kernel"),
        "{error}"
    );
}

/// The GPU backend under `policy`, or None with the reason printed.
fn gpu_backend(policy: GpuPolicy) -> Option<Arc<CudaBackend>> {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver");
        return None;
    }
    match CudaBackend::new(cpu_best(), policy) {
        Ok(backend) => Some(Arc::new(backend)),
        Err(e) => {
            eprintln!("skipped: CUDA driver present but no usable GPU: {e}");
            None
        }
    }
}

#[test]
fn without_gpu_every_choice_falls_back_to_a_correct_backend() {
    let mut rng = Rng::new(21);
    for choice in [BackendChoice::Cpu, BackendChoice::Gpu, BackendChoice::Auto] {
        let backend = select(choice);
        if !driver_present() {
            assert_eq!(
                backend.name(),
                cpu_best().name(),
                "{choice}: no driver, so the CPU backend"
            );
        }
        eprintln!("{choice}: {}", backend.describe());
        let mut stripe = TestStripe::random(7, true, 4096 + 17, Placement::Offset(3), &mut rng);
        let mut expected =
            TestStripe::random(7, true, 4096 + 17, Placement::Offset(0), &mut Rng::new(0));
        for (dst, src) in expected.chunks.iter_mut().zip(&stripe.chunks) {
            dst.as_mut_slice().copy_from_slice(src.as_slice());
        }
        stripe.gen(backend.as_ref());
        expected.gen(&Reference);
        assert_eq!(stripe.to_vecs(), expected.to_vecs(), "{choice}");
        stripe.chunks[2].as_mut_slice().fill(0);
        stripe.chunks[5].as_mut_slice().fill(0);
        backend
            .recover(&mut stripe.all_mut(), true, &[2, 5])
            .expect("recoverable");
        assert_eq!(stripe.to_vecs(), expected.to_vecs(), "{choice} recover");
        stripe.chunks[4].as_mut_slice()[9] ^= 1;
        assert_eq!(
            backend.check(&stripe.all(), true),
            CheckOutcome::BadChunk(4)
        );
    }
}

#[test]
fn gpu_matches_reference_on_every_erasure() {
    let Some(gpu) = gpu_backend(GpuPolicy::Always) else {
        return;
    };
    eprintln!("{}", gpu.describe());
    let mut rng = Rng::new(22);
    for k in 1..=32 {
        let len = [64, 200, 4 * 64 + 1, 4096 + 16][k % 4];
        let placement = PLACEMENTS[k % PLACEMENTS.len()];
        for has_q in [false, true] {
            let mut stripe = TestStripe::random(k, has_q, len, placement, &mut rng);
            let expected = {
                let mut e =
                    TestStripe::random(k, has_q, len, Placement::Offset(0), &mut Rng::new(0));
                for (dst, src) in e.chunks.iter_mut().zip(&stripe.chunks) {
                    dst.as_mut_slice().copy_from_slice(src.as_slice());
                }
                e.gen(&Reference);
                e.to_vecs()
            };
            stripe.gen(gpu.as_ref());
            assert_eq!(
                stripe.to_vecs(),
                expected,
                "gpu gen k={k} len={len} has_q={has_q}"
            );
            let chunks = stripe.chunks.len();
            let mut cases: Vec<Vec<usize>> = (0..chunks).map(|x| vec![x]).collect();
            if has_q {
                for x in 0..chunks {
                    for y in x + 1..chunks {
                        cases.push(vec![x, y]);
                    }
                }
            }
            for missing in cases {
                for &m in &missing {
                    rng.fill(stripe.chunks[m].as_mut_slice());
                }
                gpu.recover(&mut stripe.all_mut(), has_q, &missing)
                    .expect("recoverable");
                assert!(
                    stripe.to_vecs() == expected,
                    "gpu recover k={k} len={len} has_q={has_q} missing={missing:?}"
                );
            }
            assert_eq!(gpu.check(&stripe.all(), has_q), CheckOutcome::Consistent);
            let bad = rng.below(chunks);
            stripe.chunks[bad].as_mut_slice()[len / 2] ^= 0x80;
            let want = if has_q {
                CheckOutcome::BadChunk(bad)
            } else {
                CheckOutcome::Mismatch
            };
            assert_eq!(
                gpu.check(&stripe.all(), has_q),
                want,
                "gpu check k={k} bad={bad}"
            );
        }
    }
    assert!(
        gpu.gpu_enabled(),
        "the GPU must not have switched itself off: {}",
        gpu.describe()
    );
}

#[test]
fn gpu_batches_larger_than_the_ring_match_reference() {
    let Some(gpu) = gpu_backend(GpuPolicy::Always) else {
        return;
    };
    // 8 x 64 KiB + tail per stripe: 16 stripes per 8 MiB slot, so 70 stripes go round the
    // three-slot ring twice.
    gen_recover_check_batch(&gpu, 8, 64 * 1024 + 40, 70, 23);
}

#[test]
fn gpu_stripes_larger_than_a_slot_match_reference() {
    let Some(gpu) = gpu_backend(GpuPolicy::Always) else {
        return;
    };
    // 10 x 1 MiB does not fit an 8 MiB slot: each stripe goes as two column halves.
    gen_recover_check_batch(&gpu, 10, 1 << 20, 6, 29);
    // 6 x (3 MiB + 64): four column slices of 786,448 bytes.
    gen_recover_check_batch(&gpu, 6, (3 << 20) + 64, 4, 31);
}

/// gen, recover (three erasure pairs, a third of the batch each) and check (a bad data chunk in
/// the last byte of stripe 1, a bad Q in the middle of the last stripe) of `count` random stripes
/// of `k` data chunks of `len` bytes, all on the GPU, compared with the reference.
fn gen_recover_check_batch(gpu: &CudaBackend, k: usize, len: usize, count: usize, seed: u64) {
    assert!(count >= 3);
    let cpu_batches_before = gpu.batches().1;
    let mut rng = Rng::new(seed);
    let stripes: Vec<TestStripe> = (0..count)
        .map(|i| TestStripe::random(k, true, len, PLACEMENTS[i % 4], &mut rng))
        .collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> = stripes
        .iter()
        .map(|s| {
            let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
            Reference.gen_pq(&s.data(), &mut p, &mut q);
            (p, q)
        })
        .collect();
    let datas: Vec<Vec<&[u8]>> = stripes.iter().map(|s| s.data()).collect();
    let mut outputs: Vec<(Vec<u8>, Vec<u8>)> = vec![(vec![0u8; len], vec![0u8; len]); count];
    {
        let mut batch: Vec<StripeGen> = datas
            .iter()
            .zip(outputs.iter_mut())
            .map(|(d, (p, q))| StripeGen {
                data: d,
                p,
                q: Some(q),
            })
            .collect();
        gpu.gen_batch(&mut batch);
    }
    assert!(outputs == expected, "k={k} len={len}: gpu gen_batch");

    // Recover a different pair in each third of the batch (three runs of one plan each).
    let mut whole: Vec<Vec<Vec<u8>>> = stripes
        .iter()
        .zip(&expected)
        .map(|(s, (p, q))| {
            let mut c: Vec<Vec<u8>> = s.data().iter().map(|d| d.to_vec()).collect();
            c.push(p.clone());
            c.push(q.clone());
            c
        })
        .collect();
    let original = whole.clone();
    let missing: Vec<[usize; 2]> = (0..count)
        .map(|i| [[0, k - 1], [3, k], [k, k + 1]][i * 3 / count])
        .collect();
    for (c, m) in whole.iter_mut().zip(&missing) {
        for &i in m {
            c[i].fill(0xee);
        }
    }
    {
        let mut lists: Vec<Vec<&mut [u8]>> = whole
            .iter_mut()
            .map(|c| c.iter_mut().map(|c| c.as_mut_slice()).collect())
            .collect();
        let mut batch: Vec<StripeRecover> = lists
            .iter_mut()
            .zip(&missing)
            .map(|(c, m)| StripeRecover {
                chunks: c,
                has_q: true,
                missing: m,
            })
            .collect();
        gpu.recover_batch(&mut batch).expect("recoverable");
    }
    assert!(whole == original, "k={k} len={len}: gpu recover_batch");

    // Check: one stripe with a bad data chunk, one with a bad Q.
    let (bad_data, bad_q) = (1, count - 1);
    whole[bad_data][2][len - 1] ^= 0x11;
    whole[bad_q][k + 1][len / 2 + 7] ^= 0x01;
    let views: Vec<Vec<&[u8]>> = whole
        .iter()
        .map(|c| c.iter().map(|c| c.as_slice()).collect())
        .collect();
    let refs: Vec<&[&[u8]]> = views.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![CheckOutcome::Mismatch; count];
    gpu.check_batch(&refs, true, &mut out);
    for (i, outcome) in out.iter().enumerate() {
        let want = if i == bad_data {
            CheckOutcome::BadChunk(2)
        } else if i == bad_q {
            CheckOutcome::BadChunk(k + 1)
        } else {
            CheckOutcome::Consistent
        };
        assert_eq!(*outcome, want, "k={k} len={len}: stripe {i}");
    }
    assert!(gpu.gpu_enabled(), "{}", gpu.describe());
    assert_eq!(
        gpu.batches().1,
        cpu_batches_before,
        "k={k} len={len}: a batch fell back to the CPU"
    );
    eprintln!("k={k} len={len}: {}", gpu.describe());
}

#[test]
fn gpu_device_figures() {
    let Some(gpu) = gpu_backend(GpuPolicy::Always) else {
        return;
    };
    let figures = gpu
        .bench_device(10, 64 * 1024, 64, 0.2)
        .expect("device benchmarks run");
    eprintln!("{figures:?}");
    assert!(figures.kernel_gbps > 0.0 && figures.device_memcpy_gbps > 0.0);
    assert!(figures.recover_kernel_gbps.is_some_and(|gbps| gbps > 0.0));
    assert!(figures.pinned_roundtrip_gbps > 0.0 && figures.pinned_to_device_gbps > 0.0);
}

/// Batches whose chunks lie in host memory registered through `alloc_host` are served in place (no staging
/// copy) and are byte-identical to the reference: gen, every 1- and 2-erasure recovery (all pairs up to k = 8,
/// some beyond), check; a batch with one chunk outside registered memory, or one chunk off a 16-byte boundary,
/// goes through the slots instead, with the same results.
#[test]
fn gpu_in_place_batches_match_reference() {
    let Some(gpu) = gpu_backend(GpuPolicy::Always) else {
        return;
    };
    let mut rng = Rng::new(41);
    for (k, len) in [
        (1, 4096),
        (2, 80),
        (3, 65536),
        (5, 4096 + 48),
        (8, 65536),
        (16, 4096),
        (32, 1024),
    ] {
        for has_q in [false, true] {
            in_place_case(&gpu, k, has_q, len, 5, &mut rng);
        }
    }
    assert!(gpu.gpu_enabled(), "{}", gpu.describe());
    eprintln!("{}", gpu.describe());
}

/// Batches in place from several threads at once (each thread its own backend over the one GPU, so that each
/// counts its own batches): they run side by side on the in-place lanes, and every one of them is
/// byte-identical to the reference, gen, recovery and check alike.
#[test]
fn gpu_in_place_batches_from_many_threads_match_reference() {
    let Some(first) = gpu_backend(GpuPolicy::Always) else {
        return;
    };
    let threads = 8;
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let gpu = gpu_backend(GpuPolicy::Always).expect("the GPU opened once opens again");
                let mut rng = Rng::new(4100 + t);
                for round in 0..6 {
                    let (k, len) = [(8, 65536), (4, 4096), (10, 16384)][round % 3];
                    in_place_case(&gpu, k, true, len, 4, &mut rng);
                }
                assert!(gpu.gpu_enabled(), "thread {t}: {}", gpu.describe());
            });
        }
    });
    assert!(first.gpu_enabled(), "{}", first.describe());
}

/// Recovers `batch` and checks that it ran as one batch in place.
fn recover_in_one_launch(gpu: &CudaBackend, batch: &mut [StripeRecover], what: &str) {
    let before = gpu.batches_in_place();
    gpu.recover_batch(batch).expect("recoverable");
    assert_eq!(
        gpu.batches_in_place(),
        before + 1,
        "recovery in one launch in place ({what})"
    );
}

/// `count` stripes of `k` data chunks of `len` bytes, laid out one after another in `mem`, split into chunks.
fn stripes_in(mem: &mut [u8], width: usize, len: usize) -> Vec<Vec<&mut [u8]>> {
    mem.chunks_mut(width * len)
        .map(|s| s.chunks_mut(len).collect())
        .collect()
}

fn in_place_case(
    gpu: &Arc<CudaBackend>,
    k: usize,
    has_q: bool,
    len: usize,
    count: usize,
    rng: &mut Rng,
) {
    let width = k + 1 + has_q as usize;
    let what = format!("k={k} has_q={has_q} len={len}");
    let stripes_bytes = count * width * len;
    // One page more than the stripes: room for a chunk placed off the word boundary.
    let mut arena = gpu
        .alloc_host(stripes_bytes + len + 4096)
        .unwrap_or_else(|| panic!("a GPU that runs batches must register host memory ({what})"));
    assert!(arena.is_registered());
    rng.fill(&mut arena[..]);
    let mut expected: Vec<Vec<Vec<u8>>> = arena[..stripes_bytes]
        .chunks(width * len)
        .map(|s| s.chunks(len).map(|c| c.to_vec()).collect())
        .collect();
    for stripe in &mut expected {
        let (data, parity) = stripe.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
        match parity {
            [p] => Reference.gen_p(&data, p),
            [p, q] => Reference.gen_pq(&data, p, q),
            _ => unreachable!("one or two parity chunks"),
        }
    }
    let (stripes_mem, spare) = arena.split_at_mut(stripes_bytes);
    let contents = |mem: &[u8]| -> Vec<Vec<Vec<u8>>> {
        mem.chunks(width * len)
            .map(|s| s.chunks(len).map(|c| c.to_vec()).collect())
            .collect()
    };

    let before = gpu.batches_in_place();
    {
        let mut stripes = stripes_in(stripes_mem, width, len);
        let mut datas: Vec<Vec<&[u8]>> = Vec::new();
        let mut parities: Vec<Vec<&mut [u8]>> = Vec::new();
        for stripe in stripes.drain(..) {
            let mut chunks = stripe.into_iter();
            datas.push(chunks.by_ref().take(k).map(|c| &*c).collect());
            parities.push(chunks.collect());
        }
        let mut batch: Vec<StripeGen> = datas
            .iter()
            .zip(parities.iter_mut())
            .map(|(data, parity)| {
                let (p, q) = parity.split_first_mut().expect("P");
                StripeGen {
                    data,
                    p,
                    q: q.first_mut().map(|q| &mut **q),
                }
            })
            .collect();
        gpu.gen_batch(&mut batch);
    }
    assert!(contents(stripes_mem) == expected, "in-place gen {what}");
    assert_eq!(gpu.batches_in_place(), before + 1, "gen in place ({what})");

    let mut cases: Vec<Vec<usize>> = (0..width).map(|x| vec![x]).collect();
    if has_q {
        for x in 0..width {
            for y in x + 1..width {
                if k <= 8 || (x + y) % 7 == 0 {
                    cases.push(vec![x, y]);
                }
            }
        }
    }
    for missing in &cases {
        let mut stripes = stripes_in(stripes_mem, width, len);
        for stripe in stripes.iter_mut() {
            for &m in missing {
                rng.fill(stripe[m]);
            }
        }
        let mut batch: Vec<StripeRecover> = stripes
            .iter_mut()
            .map(|chunks| StripeRecover {
                chunks,
                has_q,
                missing,
            })
            .collect();
        recover_in_one_launch(gpu, &mut batch, &what);
        drop(batch);
        assert!(
            contents(stripes_mem) == expected,
            "in-place recover {what} missing={missing:?}"
        );
    }

    // One batch whose stripes each lost something else (a rebuild's rows: the lost member holds data in one row,
    // P or Q in the next): one launch in place, every stripe with its own plan.
    let mut stripes = stripes_in(stripes_mem, width, len);
    let lost: Vec<&Vec<usize>> = (0..count)
        .map(|j| &cases[(j * 5 + 3) % cases.len()])
        .collect();
    for (j, (stripe, missing)) in stripes.iter_mut().zip(&lost).enumerate() {
        if has_q && j == 0 {
            continue; // recovered without Q, below
        }
        for &m in missing.iter() {
            rng.fill(stripe[m]);
        }
    }
    // With Q, stripe 0 also comes without it, as a rebuild recovers a row whose Q it did not read: from the data
    // and P alone (one erasure among them).
    let p_only = [k / 2];
    let mut batch: Vec<StripeRecover> = stripes
        .iter_mut()
        .zip(&lost)
        .enumerate()
        .map(|(j, (chunks, missing))| {
            if has_q && j == 0 {
                rng.fill(chunks[k / 2]);
                StripeRecover {
                    chunks: &mut chunks[..k + 1],
                    has_q: false,
                    missing: &p_only,
                }
            } else {
                StripeRecover {
                    chunks,
                    has_q,
                    missing,
                }
            }
        })
        .collect();
    recover_in_one_launch(gpu, &mut batch, &what);
    drop(batch);
    assert!(
        contents(stripes_mem) == expected,
        "in-place recover of mixed erasures {what}: {lost:?}"
    );

    let check = |mem: &[u8]| -> Vec<CheckOutcome> {
        let views: Vec<Vec<&[u8]>> = mem
            .chunks(width * len)
            .map(|s| s.chunks(len).collect())
            .collect();
        let stripes: Vec<&[&[u8]]> = views.iter().map(|v| &v[..]).collect();
        let mut out = vec![CheckOutcome::Mismatch; stripes.len()];
        gpu.check_batch(&stripes, has_q, &mut out);
        out
    };
    assert!(
        check(stripes_mem)
            .iter()
            .all(|o| *o == CheckOutcome::Consistent),
        "in-place check {what}"
    );
    let bad = rng.below(width);
    let at = (width + bad) * len + len - 1; // stripe 1, chunk `bad`, last byte
    stripes_mem[at] ^= 0x40;
    let outcomes = check(stripes_mem);
    let want = if has_q {
        CheckOutcome::BadChunk(bad)
    } else {
        CheckOutcome::Mismatch
    };
    for (j, outcome) in outcomes.iter().enumerate() {
        let want = if j == 1 {
            want
        } else {
            CheckOutcome::Consistent
        };
        assert_eq!(
            *outcome, want,
            "in-place check {what}: stripe {j}, bad chunk {bad}"
        );
    }
    stripes_mem[at] ^= 0x40;

    // Not in place: data chunk 0 of stripe 0 in ordinary memory, then 8 bytes off a word boundary (registered).
    let before = gpu.batches_in_place();
    let ordinary = expected[0][0].clone();
    let shifted = &mut spare[8..8 + len];
    shifted.copy_from_slice(&ordinary);
    let stripe0: Vec<&[u8]> = stripes_mem[..width * len].chunks(len).collect();
    for first in [&ordinary[..], &*shifted] {
        let mut data: Vec<&[u8]> = stripe0[..k].to_vec();
        data[0] = first;
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        let mut batch = [StripeGen {
            data: &data,
            p: &mut p,
            q: has_q.then_some(&mut q[..]),
        }];
        gpu.gen_batch(&mut batch);
        assert_eq!(p, expected[0][k], "{what}: P of a batch not in place");
        if has_q {
            assert_eq!(q, expected[0][k + 1], "{what}: Q of a batch not in place");
        }
    }
    assert_eq!(
        gpu.batches_in_place(),
        before,
        "{what}: a batch with a chunk outside registered memory or off a word boundary went in place"
    );
}
