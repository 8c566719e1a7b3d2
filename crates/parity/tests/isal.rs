//! The reference against ISA-L (Debian libisal-dev), an oracle we did not write: `xor_gen`, `pq_gen`,
//! and `ec_encode_data` doing the same 2-erasure recovery from an inverted RAID6 matrix.

mod common;

use std::os::raw::{c_int, c_uchar, c_void};

use common::{Placement, Rng, TestStripe};
use paraid_parity::reference::Reference;
use paraid_parity::{cpu_backends, gf, Backend};

#[link(name = "isal")]
extern "C" {
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn gf_mul(a: c_uchar, b: c_uchar) -> c_uchar;
    fn gf_invert_matrix(input: *mut c_uchar, output: *mut c_uchar, n: c_int) -> c_int;
    fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
    fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *mut c_uchar,
        data: *mut *mut c_uchar,
        coding: *mut *mut c_uchar,
    );
}

/// ISA-L's P (and Q) of `data`, into fresh buffers.
fn isal_parity(data: &[&[u8]], has_q: bool) -> (Vec<u8>, Vec<u8>) {
    let len = data[0].len();
    // ISA-L's AVX2 kernels store P and Q with aligned (non-temporal) stores: a Vec<u8> is not 32-byte aligned
    // in general, and the test crashed (SIGSEGV) on a machine whose allocator placed it otherwise. 64 bytes of
    // slack, and the parity taken from the first 64-byte boundary.
    let mut p_room = vec![0u8; len + 64];
    let mut q_room = vec![0u8; len + 64];
    let p_at = p_room.as_ptr().align_offset(64);
    let q_at = q_room.as_ptr().align_offset(64);
    let mut array: Vec<*mut c_void> = data.iter().map(|c| c.as_ptr() as *mut c_void).collect();
    array.push(p_room[p_at..].as_mut_ptr() as *mut c_void);
    if has_q {
        array.push(q_room[q_at..].as_mut_ptr() as *mut c_void);
    }
    // SAFETY: every pointer covers `len` bytes; ISA-L writes only the last one (two) of them.
    let rc = unsafe {
        if has_q {
            pq_gen(array.len() as c_int, len as c_int, array.as_mut_ptr())
        } else {
            xor_gen(array.len() as c_int, len as c_int, array.as_mut_ptr())
        }
    };
    assert_eq!(
        rc,
        0,
        "ISA-L {} returned {rc}",
        if has_q { "pq_gen" } else { "xor_gen" }
    );
    (
        p_room[p_at..p_at + len].to_vec(),
        q_room[q_at..q_at + len].to_vec(),
    )
}

#[test]
fn isal_gf_mul_agrees_with_ours() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            assert_eq!(unsafe { gf_mul(a, b) }, gf::mul(a, b), "{a} * {b}");
        }
    }
}

#[test]
fn reference_matches_isal_xor_gen_and_pq_gen() {
    let mut rng = Rng::new(11);
    // ISA-L's SIMD paths want lengths in whole 32-byte vectors and 32-byte aligned pointers
    // (our buffers are 64-byte aligned with Offset(0)); ours take any length.
    let mut geometries: Vec<(usize, usize)> =
        (2..=32).map(|k| (k, 64 * (1 + rng.below(40)))).collect();
    for _ in 0..12 {
        geometries.push((1 + rng.below(253), 64 * (1 + rng.below(64))));
    }
    geometries.push((253, 4096));
    geometries.push((10, 65536));
    for (k, len) in geometries {
        for has_q in [false, true] {
            if has_q && k < 2 {
                continue;
            }
            let mut stripe = TestStripe::random(k, has_q, len, Placement::Offset(0), &mut rng);
            let (p, q) = isal_parity(&stripe.data(), has_q);
            stripe.gen(&Reference);
            assert!(
                stripe.chunks[k].as_slice() == p.as_slice(),
                "P differs from ISA-L: k={k} len={len} has_q={has_q}"
            );
            if has_q {
                assert!(
                    stripe.chunks[k + 1].as_slice() == q.as_slice(),
                    "Q differs from ISA-L pq_gen: k={k} len={len}"
                );
            }
            // Every other backend too, so a failure names the backend directly.
            for backend in cpu_backends() {
                let mut again =
                    TestStripe::random(k, has_q, len, Placement::Offset(0), &mut Rng::new(0));
                for (dst, src) in again.chunks[..k].iter_mut().zip(&stripe.chunks[..k]) {
                    dst.as_mut_slice().copy_from_slice(src.as_slice());
                }
                again.gen(backend.as_ref());
                assert!(
                    again.to_vecs() == stripe.to_vecs(),
                    "{} differs from ISA-L: k={k} len={len} has_q={has_q}",
                    backend.name()
                );
            }
        }
    }
}

/// The RAID6 generator matrix as ISA-L sees it: k identity rows, then P (all ones), then Q (2^i).
fn raid6_matrix(k: usize) -> Vec<u8> {
    let mut m = vec![0u8; (k + 2) * k];
    for i in 0..k {
        m[i * k + i] = 1;
        m[k * k + i] = 1;
        m[(k + 1) * k + i] = gf::exp(i);
    }
    m
}

#[test]
fn reference_recover_matches_isal_ec_encode_data() {
    let mut rng = Rng::new(12);
    for k in [2usize, 3, 4, 6, 10, 16, 32] {
        let len = 64 * (1 + rng.below(16));
        let mut stripe = TestStripe::random(k, true, len, Placement::Offset(0), &mut rng);
        stripe.gen(&Reference);
        let original = stripe.to_vecs();
        let matrix = raid6_matrix(k);
        for _ in 0..6 {
            let x = rng.below(k);
            let y = (x + 1 + rng.below(k - 1)) % k;
            // Survivors: the other data rows and P, Q; take the first k of them and invert.
            let survivors: Vec<usize> = (0..k + 2).filter(|&r| r != x && r != y).take(k).collect();
            let mut square: Vec<u8> = survivors
                .iter()
                .flat_map(|&r| matrix[r * k..(r + 1) * k].to_vec())
                .collect();
            let mut inverse = vec![0u8; k * k];
            assert_eq!(
                unsafe { gf_invert_matrix(square.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) },
                0
            );
            // Rows of the inverse that rebuild data x and y from the survivors.
            let mut decode: Vec<u8> = inverse[x * k..(x + 1) * k].to_vec();
            decode.extend_from_slice(&inverse[y * k..(y + 1) * k]);
            let mut tables = vec![0u8; 32 * k * 2];
            let mut out_x = vec![0u8; len];
            let mut out_y = vec![0u8; len];
            let mut sources: Vec<*mut u8> = survivors
                .iter()
                .map(|&r| original[r].as_ptr() as *mut u8)
                .collect();
            let mut outputs = [out_x.as_mut_ptr(), out_y.as_mut_ptr()];
            unsafe {
                ec_init_tables(k as c_int, 2, decode.as_mut_ptr(), tables.as_mut_ptr());
                ec_encode_data(
                    len as c_int,
                    k as c_int,
                    2,
                    tables.as_mut_ptr(),
                    sources.as_mut_ptr(),
                    outputs.as_mut_ptr(),
                );
            }
            assert_eq!(
                out_x, original[x],
                "ISA-L itself did not recover data {x} (k={k})"
            );
            assert_eq!(
                out_y, original[y],
                "ISA-L itself did not recover data {y} (k={k})"
            );

            stripe.chunks[x].as_mut_slice().fill(0);
            stripe.chunks[y].as_mut_slice().fill(0);
            Reference
                .recover(&mut stripe.all_mut(), true, &[x, y])
                .expect("two erasures are recoverable");
            assert!(
                stripe.chunks[x].as_slice() == out_x.as_slice(),
                "reference and ISA-L disagree on data {x} (k={k})"
            );
            assert!(
                stripe.chunks[y].as_slice() == out_y.as_slice(),
                "reference and ISA-L disagree on data {y} (k={k})"
            );
        }
    }
}
