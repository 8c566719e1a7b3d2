//! CPU SIMD backends: AVX2, AVX-512BW and GFNI (on AVX-512), detected at run time.
//!
//! Each instruction-set file supplies vector primitives; [`kernels`] holds the algorithms, written
//! once; this file turns a stripe operation into kernel calls: which chunks are sources, which are
//! outputs, and with which coefficients. No allocation: stack arrays of at most [`MAX_CHUNKS`].

use std::marker::PhantomData;
use std::sync::Arc;

use crate::stripe::{
    assert_gen_geometry, assert_update_geometry, validate_recover, BadChunkLocator,
};
use crate::{gf, Backend, CheckOutcome, ParityError, MAX_CHUNKS};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod gfni;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) mod kernels;

use kernels::PqArgs;

/// An instruction set: its name and whether this CPU has it.
pub(crate) trait Isa {
    const NAME: &'static str;
    fn detected() -> bool;
}

/// The kernels one instruction set provides (see [`kernels`] for what each computes).
///
/// # Safety
/// Callers must have checked [`Isa::detected`]; slices must have the lengths the kernels assert.
pub(crate) trait Kernels {
    unsafe fn xor_gen(srcs: &[&[u8]], dst: &mut [u8]);
    unsafe fn pq_gen(args: &PqArgs<'_>, sparse: bool);
    unsafe fn pq_zero(args: &PqArgs<'_>, with_q: bool) -> bool;
    unsafe fn update(coef: u8, old: &[u8], new: &[u8], p: &mut [u8], q: *mut u8);
    unsafe fn scale(c: u8, buf: &mut [u8]);
}

/// A backend over one instruction set's kernels. Only constructed once the CPU is known to have
/// the instructions, which is what makes the kernel calls below sound.
struct SimdBackend<K> {
    isa: PhantomData<fn() -> K>,
}

impl<K: Isa + Kernels + 'static> SimdBackend<K> {
    fn detect() -> Option<Arc<dyn Backend>> {
        if K::detected() {
            Some(Arc::new(SimdBackend::<K> { isa: PhantomData }))
        } else {
            None
        }
    }
}

/// Every SIMD backend this CPU can run, from the least to the most capable.
pub fn detected_backends() -> Vec<Arc<dyn Backend>> {
    #[allow(unused_mut)]
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        found.extend(SimdBackend::<avx2::Avx2>::detect());
        found.extend(SimdBackend::<avx512::Avx512Bw>::detect());
        found.extend(SimdBackend::<gfni::Avx512Gfni>::detect());
    }
    found
}

/// The backend named `name` ("avx2", "avx512bw", "avx512-gfni") if this CPU can run it.
pub fn backend_by_name(name: &str) -> Option<Arc<dyn Backend>> {
    detected_backends().into_iter().find(|b| b.name() == name)
}

const NO_CHUNK: &[u8] = &[];

fn all_zero(buf: &[u8]) -> bool {
    buf.iter().fold(0u8, |acc, &b| acc | b) == 0
}

impl<K: Isa + Kernels> Backend for SimdBackend<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        assert_gen_geometry(data, p.len(), false);
        // SAFETY: the ISA was detected at construction; lengths checked above.
        unsafe { K::xor_gen(data, p) }
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert_gen_geometry(data, p.len(), true);
        assert_eq!(p.len(), q.len(), "parity: P and Q differ in length");
        let args = PqArgs {
            srcs: data,
            len: p.len(),
            p_init: std::ptr::null(),
            q_init: std::ptr::null(),
            p: p.as_mut_ptr(),
            q: q.as_mut_ptr(),
            finish: None,
        };
        // SAFETY: as above; P and Q are distinct &mut buffers of `len` bytes.
        unsafe { K::pq_gen(&args, false) }
    }

    fn update(&self, index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: Option<&mut [u8]>) {
        assert_update_geometry(index, old, new, p, q.as_ref().map(|q| q.len()));
        let q = q.map_or(std::ptr::null_mut(), |q| q.as_mut_ptr());
        // SAFETY: as above; Q, when given, is a distinct &mut buffer of the same length.
        unsafe { K::update(gf::exp(index), old, new, p, q) }
    }

    fn recover(
        &self,
        chunks: &mut [&mut [u8]],
        has_q: bool,
        missing: &[usize],
    ) -> Result<(), ParityError> {
        let erasures =
            validate_recover(chunks.iter().map(|c| c.len()), chunks.len(), has_q, missing)?;
        let k = erasures.k;
        let len = chunks[0].len();
        if erasures.count == 0 || len == 0 {
            return Ok(());
        }
        // Survivors become read-only sources (lost slots left empty); the lost chunks, outputs.
        let mut srcs: [&[u8]; MAX_CHUNKS] = [NO_CHUNK; MAX_CHUNKS];
        let mut lost: [Option<&mut [u8]>; 2] = [None, None];
        for (i, chunk) in chunks.iter_mut().enumerate() {
            match erasures.as_slice().iter().position(|&m| m == i) {
                Some(slot) => lost[slot] = Some(&mut **chunk),
                None => srcs[i] = &**chunk,
            }
        }
        let [first, second] = lost;
        let first = first.expect("validate_recover returned at least one erasure");
        let (p_index, q_index) = (k, k + 1);
        // SAFETY (every kernel call below): the ISA was detected at construction; every source and
        // output is `len` bytes (validate_recover); outputs are the lost chunks, which no source
        // aliases.
        unsafe {
            match (erasures.as_slice(), second) {
                // One data chunk, or RAID5's P, from P and the other data: an XOR.
                (&[m], None) if m <= p_index => {
                    // XOR does not care about order: P takes the lost chunk's slot.
                    srcs[m] = srcs[p_index];
                    K::xor_gen(&srcs[..k], first);
                }
                // RAID6's Q alone: generate it.
                (&[m], None) => {
                    debug_assert_eq!(m, q_index);
                    let args = PqArgs {
                        srcs: &srcs[..k],
                        len,
                        p_init: std::ptr::null(),
                        q_init: std::ptr::null(),
                        p: std::ptr::null_mut(),
                        q: first.as_mut_ptr(),
                        finish: None,
                    };
                    K::pq_gen(&args, false);
                }
                (&[x, y], Some(second)) if x == p_index && y == q_index => {
                    let args = PqArgs {
                        srcs: &srcs[..k],
                        len,
                        p_init: std::ptr::null(),
                        q_init: std::ptr::null(),
                        p: first.as_mut_ptr(),
                        q: second.as_mut_ptr(),
                        finish: None,
                    };
                    K::pq_gen(&args, false);
                }
                // Data and Q: the data from P, then Q from all the data.
                (&[x, y], Some(second)) if y == q_index => {
                    srcs[x] = srcs[p_index];
                    K::xor_gen(&srcs[..k], first);
                    srcs[x] = first;
                    let args = PqArgs {
                        srcs: &srcs[..k],
                        len,
                        p_init: std::ptr::null(),
                        q_init: std::ptr::null(),
                        p: std::ptr::null_mut(),
                        q: second.as_mut_ptr(),
                        finish: None,
                    };
                    K::pq_gen(&args, false);
                }
                // Data and P: Dx = 2^-x (Q ^ Q of the other data), then P from all the data.
                (&[x, y], Some(second)) if y == p_index => {
                    let args = PqArgs {
                        srcs: &srcs[..k],
                        len,
                        p_init: std::ptr::null(),
                        q_init: srcs[q_index].as_ptr(),
                        p: std::ptr::null_mut(),
                        q: first.as_mut_ptr(),
                        finish: None,
                    };
                    K::pq_gen(&args, true);
                    K::scale(gf::exp_neg(x), first);
                    srcs[x] = first;
                    K::xor_gen(&srcs[..k], second);
                }
                // Two data chunks: one pass for the syndromes Pxy = Dx ^ Dy and
                // Qxy = 2^x Dx ^ 2^y Dy, then Dx = (Qxy ^ 2^y Pxy) / (2^x ^ 2^y), Dy = Pxy ^ Dx.
                (&[x, y], Some(second)) => {
                    debug_assert!(x < y && y < k);
                    let denominator = gf::exp(x) ^ gf::exp(y);
                    let args = PqArgs {
                        srcs: &srcs[..k],
                        len,
                        p_init: srcs[p_index].as_ptr(),
                        q_init: srcs[q_index].as_ptr(),
                        p: first.as_mut_ptr(),
                        q: second.as_mut_ptr(),
                        finish: Some((gf::div(gf::exp(y), denominator), gf::inv(denominator))),
                    };
                    K::pq_gen(&args, true);
                }
                _ => unreachable!("validate_recover returns one or two sorted erasures"),
            }
        }
        Ok(())
    }

    fn check(&self, chunks: &[&[u8]], has_q: bool) -> CheckOutcome {
        let parity_chunks = if has_q { 2 } else { 1 };
        assert!(
            chunks.len() > parity_chunks,
            "parity check: a stripe needs at least one data chunk"
        );
        let k = chunks.len() - parity_chunks;
        let len = chunks[k].len();
        assert_gen_geometry(&chunks[..k], len, has_q);
        if has_q {
            assert_eq!(
                chunks[k + 1].len(),
                len,
                "parity check: P and Q differ in length"
            );
        }
        // The common case, a consistent stripe: one pass, syndromes tested in registers.
        let args = PqArgs {
            srcs: &chunks[..k],
            len,
            p_init: chunks[k].as_ptr(),
            q_init: if has_q {
                chunks[k + 1].as_ptr()
            } else {
                std::ptr::null()
            },
            p: std::ptr::null_mut(),
            q: std::ptr::null_mut(),
            finish: None,
        };
        // SAFETY: the ISA was detected at construction; every chunk is `len` bytes.
        if len == 0 || unsafe { K::pq_zero(&args, has_q) } {
            return CheckOutcome::Consistent;
        }
        if !has_q {
            return CheckOutcome::Mismatch;
        }
        // Something is wrong: syndromes a block at a time, into stack scratch, to name the chunk.
        const BLOCK_BYTES: usize = 8192;
        let mut sp = [0u8; BLOCK_BYTES];
        let mut sq = [0u8; BLOCK_BYTES];
        let mut srcs: [&[u8]; MAX_CHUNKS] = [NO_CHUNK; MAX_CHUNKS];
        let mut locator = BadChunkLocator::new(k);
        let mut off = 0;
        while off < len {
            let n = BLOCK_BYTES.min(len - off);
            for (src, chunk) in srcs.iter_mut().zip(&chunks[..=k]) {
                *src = &chunk[off..off + n];
            }
            // SAFETY: the ISA was detected at construction; every source is n bytes, and so are
            // the scratch outputs and the init pointers' ranges.
            unsafe {
                if !has_q {
                    K::xor_gen(&srcs[..=k], &mut sp[..n]);
                    if !all_zero(&sp[..n]) {
                        return CheckOutcome::Mismatch;
                    }
                } else {
                    let args = PqArgs {
                        srcs: &srcs[..k],
                        len: n,
                        p_init: chunks[k][off..].as_ptr(),
                        q_init: chunks[k + 1][off..].as_ptr(),
                        p: sp.as_mut_ptr(),
                        q: sq.as_mut_ptr(),
                        finish: None,
                    };
                    K::pq_gen(&args, false);
                    if !(all_zero(&sp[..n]) && all_zero(&sq[..n])) {
                        locator.feed(&sp[..n], &sq[..n]);
                        if locator.is_ambiguous() {
                            return CheckOutcome::Mismatch;
                        }
                    }
                }
            }
            off += n;
        }
        locator.outcome()
    }
}
