//! paraid's parity core: RAID5 (P) and RAID6 (P+Q) over GF(2^8) with polynomial 0x11d and generator
//! {02}, byte-identical to Linux md and ISA-L's `xor_gen` / `pq_gen`. No I/O.
//!
//! Stripe index convention: a stripe of k data chunks; indices 0..k are data, k is P, k+1 is Q.
//! P = XOR of the data; Q = sum over i of 2^i * D_i.
//!
//! Backends: [`reference::Reference`] (scalar, the oracle), the CPU SIMD backends in [`cpu`]
//! (AVX2, AVX-512BW, GFNI), and the CUDA backend in [`cuda`]. [`cpu_best`] and [`select`] choose
//! at run time.

pub mod cpu;
pub mod cuda;
pub mod dispatch;
pub mod gf;
pub mod host;
pub mod reference;
mod stripe;

use std::fmt;

pub use host::HostBuf;

pub use dispatch::{
    calibrate, cpu_backends, cpu_best, gpu_break_even_bytes, select, BackendChoice, Calibration,
};

/// Largest number of data chunks a RAID6 stripe may have: 2^i must be distinct for every data
/// chunk and different from the P and Q weights, as in Linux md and ISA-L.
pub const MAX_DATA_CHUNKS_RAID6: usize = 253;

/// Largest number of chunks (data + parity) in a stripe: RAID5 takes up to 255 data chunks. Bounds
/// the stack arrays that keep the hot path free of allocation.
pub const MAX_CHUNKS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParityError {
    /// More chunks are missing than the parity can rebuild.
    TooManyMissing { missing: usize, tolerated: usize },
    /// A missing index names no chunk of the stripe.
    MissingIndexOutOfRange { index: usize, chunks: usize },
    /// Chunks of one call differ in length.
    LengthMismatch { expected: usize, found: usize },
    /// The stripe's shape is not one parity can be computed for.
    Geometry { what: &'static str },
}

impl fmt::Display for ParityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParityError::TooManyMissing { missing, tolerated } => {
                write!(
                    f,
                    "cannot recover {missing} missing chunks: parity tolerates {tolerated}"
                )
            }
            ParityError::MissingIndexOutOfRange { index, chunks } => {
                write!(
                    f,
                    "missing chunk index {index} is out of range for a stripe of {chunks} chunks"
                )
            }
            ParityError::LengthMismatch { expected, found } => {
                write!(
                    f,
                    "chunk length mismatch: expected {expected} bytes, found {found}"
                )
            }
            ParityError::Geometry { what } => write!(f, "bad stripe geometry: {what}"),
        }
    }
}

impl std::error::Error for ParityError {}

/// What a consistency check found in one stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    Consistent,
    /// Exactly one chunk is wrong and we know which (stripe index: data i, k = P, k+1 = Q).
    /// RAID5 can never name the bad chunk: a RAID5 mismatch is reported as `Mismatch`.
    BadChunk(usize),
    /// Parity does not match and the bad chunk cannot be named (RAID5, or more than one bad chunk
    /// in RAID6).
    Mismatch,
}

/// Where a backend's batched stripe operations ran so far (a GPU backend's; a CPU backend keeps no count).
/// Serializable: the engine reports it as is (`status --json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchCounts {
    /// On the GPU through its staging slots.
    pub gpu_staged: u64,
    /// On the GPU in place (chunks in memory from `alloc_host`).
    pub gpu_in_place: u64,
    /// On the CPU: batches the GPU did not take (too small for `auto`, a shape it does not do) or after it failed.
    pub cpu: u64,
}

/// One stripe of a batched `gen`: P always, Q when given.
pub struct StripeGen<'a> {
    pub data: &'a [&'a [u8]],
    pub p: &'a mut [u8],
    pub q: Option<&'a mut [u8]>,
}

/// One stripe of a batched `recover` (see [`Backend::recover`]).
pub struct StripeRecover<'a> {
    pub chunks: &'a mut [&'a mut [u8]],
    pub has_q: bool,
    pub missing: &'a [usize],
}

/// A parity engine. Every backend is byte-identical to [`reference::Reference`].
///
/// Geometry errors in the infallible calls (k == 0, k > 253 with Q, unequal lengths) are
/// programming errors of the caller and panic with a message; `recover` reports them as errors
/// because its `missing` list comes from disk state.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;

    /// P = XOR of data.
    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]);

    /// P and Q from the data.
    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]);

    /// Read-modify-write of data chunk `index`: P ^= old ^ new; if Q given, Q ^= 2^index * (old ^ new).
    fn update(&self, index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: Option<&mut [u8]>);

    /// Rebuild, in place, the chunks whose stripe indices are listed in `missing`, from the others.
    /// `chunks` holds k+1 buffers (has_q = false, RAID5) or k+2 (has_q = true, RAID6) in stripe
    /// index order; the buffers at `missing` indices are outputs (their old contents are ignored).
    fn recover(
        &self,
        chunks: &mut [&mut [u8]],
        has_q: bool,
        missing: &[usize],
    ) -> Result<(), ParityError>;

    /// Verify a stripe (k+1 or k+2 chunks in stripe index order).
    fn check(&self, chunks: &[&[u8]], has_q: bool) -> CheckOutcome;

    /// Many stripes of `gen` in one call: P always, Q where the stripe gives a Q buffer.
    fn gen_batch(&self, stripes: &mut [StripeGen<'_>]) {
        for stripe in stripes.iter_mut() {
            match stripe.q.as_deref_mut() {
                Some(q) => self.gen_pq(stripe.data, stripe.p, q),
                None => self.gen_p(stripe.data, stripe.p),
            }
        }
    }

    /// Many stripes of `recover` in one call; stops at the first stripe that cannot be recovered.
    fn recover_batch(&self, stripes: &mut [StripeRecover<'_>]) -> Result<(), ParityError> {
        for stripe in stripes.iter_mut() {
            self.recover(stripe.chunks, stripe.has_q, stripe.missing)?;
        }
        Ok(())
    }

    /// Many stripes of `check` in one call; `out[i]` is the outcome of `stripes[i]`.
    fn check_batch(&self, stripes: &[&[&[u8]]], has_q: bool, out: &mut [CheckOutcome]) {
        assert_eq!(
            stripes.len(),
            out.len(),
            "check_batch: one outcome per stripe"
        );
        for (stripe, outcome) in stripes.iter().zip(out.iter_mut()) {
            *outcome = self.check(stripe, has_q);
        }
    }

    /// Optional: a zeroed, page-aligned buffer of `bytes` (rounded up to pages) that this backend reads and
    /// writes where it lies; batches whose chunks all lie in such buffers skip any staging copy (see
    /// [`host`]). None: the backend has no such memory (a CPU backend needs none) or could not make it; the
    /// caller uses ordinary memory, with the same results.
    fn alloc_host(&self, bytes: usize) -> Option<HostBuf> {
        let _ = bytes;
        None
    }

    /// Optional: where this backend's batches ran so far, for a dispatcher between devices (status, metrics).
    fn batch_counts(&self) -> Option<BatchCounts> {
        None
    }

    /// What this backend is and, for a dispatcher, where its work went. One line, for logs and
    /// the CLI.
    fn describe(&self) -> String {
        self.name().to_string()
    }
}
