//! The SIMD algorithms, written once over the [`Simd`] primitives that each instruction-set file
//! (avx2.rs, avx512.rs, gfni.rs) provides. Every function here is `#[inline(always)]`: it is compiled
//! into the `#[target_feature]` entry points of each instruction set, never called on its own.
//!
//! Loop shape (as in ISA-L and Linux lib/raid6): for each block of `UNROLL` vectors, walk every
//! source chunk, keeping P and Q accumulators in registers; Q by Horner's rule, so the only
//! multiplication in `gen` is by {02}. The last partial vector goes through the same block code with
//! loads and stores that touch only the bytes that exist.

// Register arrays are indexed in lock step (p[u], q[u], d[u]): index loops say that best.
#![allow(clippy::needless_range_loop)]

/// What an instruction set must provide. All functions are only sound on a CPU with the features of
/// the implementing type, which the backend checked before it was constructed.
pub(crate) trait Simd {
    /// One vector register.
    type V: Copy;
    /// Multiplication by one constant, prepared once per call (tables or a bit matrix).
    type MulConst: Copy;
    /// Vector width.
    const BYTES: usize;

    unsafe fn zero() -> Self::V;
    unsafe fn load(ptr: *const u8) -> Self::V;
    unsafe fn store(ptr: *mut u8, v: Self::V);
    /// Loads `bytes` (< BYTES) bytes and zero fills the rest, never touching memory past `bytes`.
    unsafe fn load_partial(ptr: *const u8, bytes: usize) -> Self::V;
    /// Stores the first `bytes` (< BYTES) bytes of `v`, never touching memory past `bytes`.
    unsafe fn store_partial(ptr: *mut u8, bytes: usize, v: Self::V);
    unsafe fn xor(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn or(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn is_zero(v: Self::V) -> bool;
    /// {02} * v in GF(2^8) with polynomial 0x11d.
    unsafe fn mul2(v: Self::V) -> Self::V;
    unsafe fn mul_const(c: u8) -> Self::MulConst;
    unsafe fn mul(m: Self::MulConst, v: Self::V) -> Self::V;
}

#[inline(always)]
unsafe fn ld<S: Simd>(ptr: *const u8, partial: Option<usize>) -> S::V {
    match partial {
        None => S::load(ptr),
        Some(bytes) => S::load_partial(ptr, bytes),
    }
}

#[inline(always)]
unsafe fn st<S: Simd>(ptr: *mut u8, v: S::V, partial: Option<usize>) {
    match partial {
        None => S::store(ptr, v),
        Some(bytes) => S::store_partial(ptr, bytes, v),
    }
}

/// Runs `block` over `len` bytes: whole blocks of U vectors, then single vectors, then the
/// partial vector at the end.
macro_rules! for_each_block {
    ($s:ty, $u:expr, $len:expr, |$off:ident, $partial:ident| $unrolled:expr, $single:expr) => {{
        let len: usize = $len;
        let mut $off = 0usize;
        let $partial: Option<usize> = None;
        while $off + $u * <$s>::BYTES <= len {
            $unrolled;
            $off += $u * <$s>::BYTES;
        }
        while $off + <$s>::BYTES <= len {
            $single;
            $off += <$s>::BYTES;
        }
        if $off < len {
            let $partial = Some(len - $off);
            $single;
        }
    }};
}

/// dst = XOR of srcs. Every source is `dst.len()` bytes; srcs is not empty.
#[inline(always)]
pub(crate) unsafe fn xor_gen<S: Simd, const UNROLL: usize>(srcs: &[&[u8]], dst: &mut [u8]) {
    debug_assert!(!srcs.is_empty());
    debug_assert!(srcs.iter().all(|s| s.len() == dst.len()));
    let dst = dst.as_mut_ptr();
    for_each_block!(
        S,
        UNROLL,
        srcs[0].len(),
        |off, partial| xor_block::<S, UNROLL>(srcs, dst, off, partial),
        xor_block::<S, 1>(srcs, dst, off, partial)
    );
}

#[inline(always)]
unsafe fn xor_block<S: Simd, const U: usize>(
    srcs: &[&[u8]],
    dst: *mut u8,
    off: usize,
    partial: Option<usize>,
) {
    let mut acc = [S::zero(); U];
    for u in 0..U {
        acc[u] = ld::<S>(srcs[0].as_ptr().add(off + u * S::BYTES), partial);
    }
    for src in &srcs[1..] {
        for u in 0..U {
            acc[u] = S::xor(
                acc[u],
                ld::<S>(src.as_ptr().add(off + u * S::BYTES), partial),
            );
        }
    }
    for u in 0..U {
        st::<S>(dst.add(off + u * S::BYTES), acc[u], partial);
    }
}

/// The P and Q accumulation that `gen`, `recover` and `check` share.
///
/// P = p_init ^ XOR(srcs), Q = q_init ^ sum 2^j * srcs[j]. With `SPARSE`, an empty source is a hole
/// (a lost chunk) that contributes nothing but keeps its weight slot, so the syndromes of a stripe
/// with lost chunks come out of one pass. Null output pointers are not written; null init pointers
/// count as zero.
///
/// With `finish` = (a, b) (two lost data chunks x < y: P and Q are then the syndromes
/// Pxy = Dx ^ Dy and Qxy = 2^x Dx ^ 2^y Dy), the same pass solves for the lost chunks and writes
/// Dx = a Pxy ^ b Qxy to `p` and Dy = Pxy ^ Dx to `q`: no second pass over the outputs.
pub(crate) struct PqArgs<'a> {
    pub srcs: &'a [&'a [u8]],
    pub len: usize,
    pub p_init: *const u8,
    pub q_init: *const u8,
    pub p: *mut u8,
    pub q: *mut u8,
    pub finish: Option<(u8, u8)>,
}

#[inline(always)]
pub(crate) unsafe fn pq_gen<
    S: Simd,
    const UNROLL: usize,
    const SPARSE: bool,
    const FINISH: bool,
>(
    args: &PqArgs<'_>,
) {
    debug_assert!(!args.srcs.is_empty());
    debug_assert!(args
        .srcs
        .iter()
        .all(|s| s.len() == args.len || (SPARSE && s.is_empty())));
    debug_assert_eq!(FINISH, args.finish.is_some());
    debug_assert!(!FINISH || (!args.p.is_null() && !args.q.is_null()));
    let (a, b) = args.finish.unwrap_or((0, 0));
    let finish = (S::mul_const(a), S::mul_const(b));
    for_each_block!(
        S,
        UNROLL,
        args.len,
        |off, partial| pq_block::<S, UNROLL, SPARSE, FINISH>(args, finish, off, partial),
        pq_block::<S, 1, SPARSE, FINISH>(args, finish, off, partial)
    );
}

/// P and Q of one block, inits included.
#[inline(always)]
unsafe fn pq_accumulate<S: Simd, const U: usize, const SPARSE: bool>(
    args: &PqArgs<'_>,
    off: usize,
    partial: Option<usize>,
) -> ([S::V; U], [S::V; U]) {
    let srcs = args.srcs;
    let mut p = [S::zero(); U];
    let mut q = [S::zero(); U];
    let mut j = srcs.len();
    if !SPARSE {
        // Horner's rule starts from the highest-weighted chunk.
        j -= 1;
        for u in 0..U {
            p[u] = ld::<S>(srcs[j].as_ptr().add(off + u * S::BYTES), partial);
            q[u] = p[u];
        }
    }
    while j > 0 {
        j -= 1;
        let src = srcs[j];
        if SPARSE && src.is_empty() {
            for u in 0..U {
                q[u] = S::mul2(q[u]);
            }
            continue;
        }
        for u in 0..U {
            let d = ld::<S>(src.as_ptr().add(off + u * S::BYTES), partial);
            p[u] = S::xor(p[u], d);
            q[u] = S::xor(S::mul2(q[u]), d);
        }
    }
    for u in 0..U {
        let at = off + u * S::BYTES;
        if !args.p_init.is_null() {
            p[u] = S::xor(p[u], ld::<S>(args.p_init.add(at), partial));
        }
        if !args.q_init.is_null() {
            q[u] = S::xor(q[u], ld::<S>(args.q_init.add(at), partial));
        }
    }
    (p, q)
}

#[inline(always)]
unsafe fn pq_block<S: Simd, const U: usize, const SPARSE: bool, const FINISH: bool>(
    args: &PqArgs<'_>,
    finish: (S::MulConst, S::MulConst),
    off: usize,
    partial: Option<usize>,
) {
    let (p, q) = pq_accumulate::<S, U, SPARSE>(args, off, partial);
    for u in 0..U {
        let at = off + u * S::BYTES;
        if FINISH {
            let dx = S::xor(S::mul(finish.0, p[u]), S::mul(finish.1, q[u]));
            st::<S>(args.p.add(at), dx, partial);
            st::<S>(args.q.add(at), S::xor(p[u], dx), partial);
            continue;
        }
        if !args.p.is_null() {
            st::<S>(args.p.add(at), p[u], partial);
        }
        if !args.q.is_null() {
            st::<S>(args.q.add(at), q[u], partial);
        }
    }
}

/// Whether every byte of P (and, with `WITH_Q`, Q) is zero: a consistency check's syndromes
/// (P and Q of the data, with the stored P and Q as inits), computed and tested in registers,
/// never stored. Outputs in `args` are ignored.
#[inline(always)]
pub(crate) unsafe fn pq_zero<S: Simd, const UNROLL: usize, const WITH_Q: bool>(
    args: &PqArgs<'_>,
) -> bool {
    debug_assert!(!args.srcs.is_empty());
    debug_assert!(args.srcs.iter().all(|s| s.len() == args.len));
    let mut any = S::zero();
    let mut block = |p: &[S::V], q: &[S::V]| {
        for u in 0..p.len() {
            any = S::or(any, p[u]);
            if WITH_Q {
                any = S::or(any, q[u]);
            }
        }
    };
    for_each_block!(
        S,
        UNROLL,
        args.len,
        |off, partial| {
            let (p, q) = pq_accumulate::<S, UNROLL, false>(args, off, partial);
            block(&p, &q)
        },
        {
            let (p, q) = pq_accumulate::<S, 1, false>(args, off, partial);
            block(&p, &q)
        }
    );
    S::is_zero(any)
}

/// Read-modify-write: delta = old ^ new; P ^= delta; Q ^= coef * delta (Q null: RAID5).
#[inline(always)]
pub(crate) unsafe fn update<S: Simd, const UNROLL: usize>(
    coef: u8,
    old: &[u8],
    new: &[u8],
    p: &mut [u8],
    q: *mut u8,
) {
    debug_assert!(old.len() == new.len() && new.len() == p.len());
    let m = S::mul_const(coef);
    let (old, new, len, p) = (old.as_ptr(), new.as_ptr(), p.len(), p.as_mut_ptr());
    for_each_block!(
        S,
        UNROLL,
        len,
        |off, partial| update_block::<S, UNROLL>(m, old, new, p, q, off, partial),
        update_block::<S, 1>(m, old, new, p, q, off, partial)
    );
}

#[inline(always)]
unsafe fn update_block<S: Simd, const U: usize>(
    m: S::MulConst,
    old: *const u8,
    new: *const u8,
    p: *mut u8,
    q: *mut u8,
    off: usize,
    partial: Option<usize>,
) {
    for u in 0..U {
        let at = off + u * S::BYTES;
        let delta = S::xor(ld::<S>(old.add(at), partial), ld::<S>(new.add(at), partial));
        st::<S>(
            p.add(at),
            S::xor(ld::<S>(p.add(at), partial), delta),
            partial,
        );
        if !q.is_null() {
            st::<S>(
                q.add(at),
                S::xor(ld::<S>(q.add(at), partial), S::mul(m, delta)),
                partial,
            );
        }
    }
}

/// buf = c * buf.
#[inline(always)]
pub(crate) unsafe fn scale<S: Simd, const UNROLL: usize>(c: u8, buf: &mut [u8]) {
    let m = S::mul_const(c);
    let (len, buf) = (buf.len(), buf.as_mut_ptr());
    for_each_block!(
        S,
        UNROLL,
        len,
        |off, partial| scale_block::<S, UNROLL>(m, buf, off, partial),
        scale_block::<S, 1>(m, buf, off, partial)
    );
}

#[inline(always)]
unsafe fn scale_block<S: Simd, const U: usize>(
    m: S::MulConst,
    buf: *mut u8,
    off: usize,
    partial: Option<usize>,
) {
    for u in 0..U {
        let at = off + u * S::BYTES;
        st::<S>(
            buf.add(at),
            S::mul(m, ld::<S>(buf.add(at), partial)),
            partial,
        );
    }
}

/// Declares a [`Kernels`](super::Kernels) implementation for an instruction set: one
/// `#[target_feature]` entry point per algorithm, each compiling the generic body above with that
/// instruction set's primitives and `$unroll` vectors per block (enough independent chains to hide
/// the latency of the multiply-by-two steps, few enough to stay in registers).
macro_rules! kernel_entry_points {
    ($marker:ty, $simd:ty, $features:literal, $unroll:literal) => {
        impl $crate::cpu::Kernels for $marker {
            unsafe fn xor_gen(srcs: &[&[u8]], dst: &mut [u8]) {
                #[target_feature(enable = $features)]
                unsafe fn entry(srcs: &[&[u8]], dst: &mut [u8]) {
                    $crate::cpu::kernels::xor_gen::<$simd, $unroll>(srcs, dst)
                }
                entry(srcs, dst)
            }

            unsafe fn pq_gen(args: &$crate::cpu::kernels::PqArgs<'_>, sparse: bool) {
                #[target_feature(enable = $features)]
                unsafe fn dense(args: &$crate::cpu::kernels::PqArgs<'_>) {
                    $crate::cpu::kernels::pq_gen::<$simd, $unroll, false, false>(args)
                }
                #[target_feature(enable = $features)]
                unsafe fn sparse_entry(args: &$crate::cpu::kernels::PqArgs<'_>) {
                    $crate::cpu::kernels::pq_gen::<$simd, $unroll, true, false>(args)
                }
                #[target_feature(enable = $features)]
                unsafe fn sparse_finish(args: &$crate::cpu::kernels::PqArgs<'_>) {
                    $crate::cpu::kernels::pq_gen::<$simd, $unroll, true, true>(args)
                }
                match (sparse, args.finish.is_some()) {
                    (false, false) => dense(args),
                    (true, false) => sparse_entry(args),
                    (true, true) => sparse_finish(args),
                    (false, true) => unreachable!("finish is for recovery, which is sparse"),
                }
            }

            unsafe fn pq_zero(args: &$crate::cpu::kernels::PqArgs<'_>, with_q: bool) -> bool {
                #[target_feature(enable = $features)]
                unsafe fn with(args: &$crate::cpu::kernels::PqArgs<'_>) -> bool {
                    $crate::cpu::kernels::pq_zero::<$simd, $unroll, true>(args)
                }
                #[target_feature(enable = $features)]
                unsafe fn without(args: &$crate::cpu::kernels::PqArgs<'_>) -> bool {
                    $crate::cpu::kernels::pq_zero::<$simd, $unroll, false>(args)
                }
                if with_q {
                    with(args)
                } else {
                    without(args)
                }
            }

            unsafe fn update(coef: u8, old: &[u8], new: &[u8], p: &mut [u8], q: *mut u8) {
                #[target_feature(enable = $features)]
                unsafe fn entry(coef: u8, old: &[u8], new: &[u8], p: &mut [u8], q: *mut u8) {
                    $crate::cpu::kernels::update::<$simd, $unroll>(coef, old, new, p, q)
                }
                entry(coef, old, new, p, q)
            }

            unsafe fn scale(c: u8, buf: &mut [u8]) {
                #[target_feature(enable = $features)]
                unsafe fn entry(c: u8, buf: &mut [u8]) {
                    $crate::cpu::kernels::scale::<$simd, $unroll>(c, buf)
                }
                entry(c, buf)
            }
        }
    };
}
pub(crate) use kernel_entry_points;
