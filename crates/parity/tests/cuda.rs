//! The CUDA backend: every kernel compiles with NVRTC (no GPU needed), the fallback works where
//! there is no GPU, and, where there is one, the GPU is byte-identical to the reference.

mod common;

use std::sync::Arc;

use common::{Placement, Rng, TestStripe, PLACEMENTS};
use paraid_parity::cuda::{
    compile_kernel, driver_present, nvrtc_present, CudaBackend, GpuPolicy, KERNEL_SOURCES,
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
            assert!(
                text.contains(".entry paraid_stripe"),
                "{name} for {arch:?}: no paraid_stripe entry in the PTX"
            );
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
