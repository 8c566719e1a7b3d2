//! The reference backend: plain scalar Rust written to be read, one byte at a time, straight from
//! the definitions. Every other backend is tested byte for byte against it, and it is tested against
//! ISA-L (tests/isal.rs).

// Byte and chunk indices are the definitions' own subscripts: index loops read like the math.
#![allow(clippy::needless_range_loop)]

use crate::stripe::{
    assert_gen_geometry, assert_update_geometry, validate_recover, BadChunkLocator,
};
use crate::{gf, Backend, CheckOutcome, ParityError};

#[derive(Debug, Default, Clone, Copy)]
pub struct Reference;

/// Weight of data chunk i in Q.
fn q_weight(i: usize) -> u8 {
    gf::exp(i)
}

impl Backend for Reference {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        assert_gen_geometry(data, p.len(), false);
        for (byte, p_byte) in p.iter_mut().enumerate() {
            *p_byte = data.iter().fold(0, |acc, chunk| acc ^ chunk[byte]);
        }
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert_gen_geometry(data, p.len(), true);
        assert_eq!(p.len(), q.len(), "parity: P and Q differ in length");
        for byte in 0..p.len() {
            let mut p_byte = 0;
            let mut q_byte = 0;
            for (i, chunk) in data.iter().enumerate() {
                p_byte ^= chunk[byte];
                q_byte ^= gf::mul(q_weight(i), chunk[byte]);
            }
            p[byte] = p_byte;
            q[byte] = q_byte;
        }
    }

    fn update(&self, index: usize, old: &[u8], new: &[u8], p: &mut [u8], mut q: Option<&mut [u8]>) {
        assert_update_geometry(index, old, new, p, q.as_ref().map(|q| q.len()));
        for byte in 0..p.len() {
            let delta = old[byte] ^ new[byte];
            p[byte] ^= delta;
            if let Some(q) = q.as_deref_mut() {
                q[byte] ^= gf::mul(q_weight(index), delta);
            }
        }
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
        let p_index = k;
        let q_index = k + 1;
        let chunk_bytes = chunks[0].len();
        let is_missing = |i: usize| erasures.as_slice().contains(&i);
        let mut missing_data = [0usize; 2];
        let mut missing_data_count = 0;
        for &i in erasures.as_slice().iter().filter(|&&i| i < k) {
            missing_data[missing_data_count] = i;
            missing_data_count += 1;
        }

        for byte in 0..chunk_bytes {
            // Syndromes of the surviving data: what P and Q lack.
            let mut p_syndrome = 0u8;
            let mut q_syndrome = 0u8;
            for i in (0..k).filter(|&i| !is_missing(i)) {
                p_syndrome ^= chunks[i][byte];
                q_syndrome ^= gf::mul(q_weight(i), chunks[i][byte]);
            }
            match &missing_data[..missing_data_count] {
                [] => {}
                &[x] if !is_missing(p_index) => {
                    // P = sum of data, so the one lost data chunk is P minus the others.
                    chunks[x][byte] = chunks[p_index][byte] ^ p_syndrome;
                }
                &[x] => {
                    // P is gone too: Q = 2^x Dx + (the others), so Dx = (Q - others) / 2^x.
                    debug_assert!(has_q && !is_missing(q_index));
                    chunks[x][byte] = gf::div(chunks[q_index][byte] ^ q_syndrome, q_weight(x));
                }
                &[x, y] => {
                    // Pxy = Dx + Dy and Qxy = 2^x Dx + 2^y Dy; eliminate Dy:
                    // Dx = (Qxy + 2^y Pxy) / (2^x + 2^y), then Dy = Pxy + Dx.
                    let pxy = chunks[p_index][byte] ^ p_syndrome;
                    let qxy = chunks[q_index][byte] ^ q_syndrome;
                    let dx = gf::div(qxy ^ gf::mul(q_weight(y), pxy), q_weight(x) ^ q_weight(y));
                    chunks[x][byte] = dx;
                    chunks[y][byte] = pxy ^ dx;
                }
                _ => unreachable!("validate_recover allows at most two erasures"),
            }
            // With every data chunk whole again, lost parity is simply generated.
            if is_missing(p_index) || (has_q && is_missing(q_index)) {
                let mut p_byte = 0u8;
                let mut q_byte = 0u8;
                for i in 0..k {
                    p_byte ^= chunks[i][byte];
                    q_byte ^= gf::mul(q_weight(i), chunks[i][byte]);
                }
                if is_missing(p_index) {
                    chunks[p_index][byte] = p_byte;
                }
                if has_q && is_missing(q_index) {
                    chunks[q_index][byte] = q_byte;
                }
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
        assert_gen_geometry(&chunks[..k], chunks[k].len(), has_q);
        let mut locator = BadChunkLocator::new(k);
        for byte in 0..chunks[k].len() {
            let mut sp = chunks[k][byte];
            let mut sq = if has_q { chunks[k + 1][byte] } else { 0 };
            for (i, chunk) in chunks[..k].iter().enumerate() {
                sp ^= chunk[byte];
                sq ^= gf::mul(q_weight(i), chunk[byte]);
            }
            if !has_q {
                if sp != 0 {
                    return CheckOutcome::Mismatch;
                }
                continue;
            }
            locator.feed(&[sp], &[sq]);
            if locator.is_ambiguous() {
                return CheckOutcome::Mismatch;
            }
        }
        locator.outcome()
    }
}
