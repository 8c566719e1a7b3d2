//! Geometry checks and the bad-chunk locator shared by every backend.

use crate::{gf, CheckOutcome, ParityError, MAX_CHUNKS, MAX_DATA_CHUNKS_RAID6};

/// Panics unless `data` is a valid set of data chunks of one length `chunk_bytes` for RAID5
/// (`has_q` false) or RAID6. The infallible calls treat bad geometry as a caller bug.
pub(crate) fn assert_gen_geometry(data: &[&[u8]], chunk_bytes: usize, has_q: bool) {
    assert!(
        !data.is_empty(),
        "parity: a stripe needs at least one data chunk"
    );
    assert!(
        data.len() < MAX_CHUNKS,
        "parity: a stripe takes at most {} data chunks, got {}",
        MAX_CHUNKS - 1,
        data.len()
    );
    if has_q {
        assert!(
            data.len() <= MAX_DATA_CHUNKS_RAID6,
            "parity: RAID6 takes at most {MAX_DATA_CHUNKS_RAID6} data chunks, got {}",
            data.len()
        );
    }
    for (i, chunk) in data.iter().enumerate() {
        assert_eq!(
            chunk.len(),
            chunk_bytes,
            "parity: data chunk {i} has a different length than the parity"
        );
    }
}

/// Panics unless an `update` call's buffers agree.
pub(crate) fn assert_update_geometry(
    index: usize,
    old: &[u8],
    new: &[u8],
    p: &[u8],
    q_bytes: Option<usize>,
) {
    assert_eq!(
        old.len(),
        new.len(),
        "parity update: old and new data differ in length"
    );
    assert_eq!(
        old.len(),
        p.len(),
        "parity update: data and P differ in length"
    );
    if let Some(q_bytes) = q_bytes {
        assert_eq!(
            old.len(),
            q_bytes,
            "parity update: data and Q differ in length"
        );
        assert!(
            index < MAX_DATA_CHUNKS_RAID6,
            "parity update: data index {index} is beyond RAID6's {MAX_DATA_CHUNKS_RAID6}"
        );
    }
}

/// The missing chunks of one stripe, sorted, without duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Erasures {
    /// Number of data chunks.
    pub k: usize,
    pub count: usize,
    pub index: [usize; 2],
}

impl Erasures {
    pub fn as_slice(&self) -> &[usize] {
        &self.index[..self.count]
    }
}

/// Checks a recover call's stripe and missing list; returns the sorted, deduplicated erasures.
pub(crate) fn validate_recover(
    lengths: impl Iterator<Item = usize>,
    chunks: usize,
    has_q: bool,
    missing: &[usize],
) -> Result<Erasures, ParityError> {
    let parity_chunks = if has_q { 2 } else { 1 };
    if chunks <= parity_chunks {
        return Err(ParityError::Geometry {
            what: "a stripe needs at least one data chunk",
        });
    }
    let k = chunks - parity_chunks;
    if has_q && k > MAX_DATA_CHUNKS_RAID6 {
        return Err(ParityError::Geometry {
            what: "RAID6 takes at most 253 data chunks",
        });
    }
    if chunks > MAX_CHUNKS {
        return Err(ParityError::Geometry {
            what: "a stripe has at most 256 chunks",
        });
    }
    let mut expected = None;
    for found in lengths {
        match expected {
            None => expected = Some(found),
            Some(expected) if expected != found => {
                return Err(ParityError::LengthMismatch { expected, found })
            }
            Some(_) => {}
        }
    }
    if let Some(&index) = missing.iter().find(|&&index| index >= chunks) {
        return Err(ParityError::MissingIndexOutOfRange { index, chunks });
    }
    let distinct = missing
        .iter()
        .enumerate()
        .filter(|&(at, index)| !missing[..at].contains(index))
        .count();
    if distinct > parity_chunks {
        return Err(ParityError::TooManyMissing {
            missing: distinct,
            tolerated: parity_chunks,
        });
    }
    let mut erasures = Erasures {
        k,
        count: 0,
        index: [0; 2],
    };
    for &index in missing {
        if !erasures.as_slice().contains(&index) {
            erasures.index[erasures.count] = index;
            erasures.count += 1;
        }
    }
    if erasures.count == 2 && erasures.index[0] > erasures.index[1] {
        erasures.index.swap(0, 1);
    }
    Ok(erasures)
}

/// Names the one bad chunk of a RAID6 stripe from its syndromes, fed a block at a time.
///
/// With Sp = P ^ XOR(D) and Sq = Q ^ sum(2^i D_i) per byte, one bad chunk leaves a fingerprint at
/// every byte it corrupts: data i gives Sp = e, Sq = 2^i e (so i = log Sq - log Sp); P gives Sp != 0,
/// Sq = 0; Q gives Sp = 0, Sq != 0. Any byte that disagrees with the others means more than one
/// chunk is bad.
pub(crate) struct BadChunkLocator {
    k: usize,
    candidate: Option<usize>,
    ambiguous: bool,
}

impl BadChunkLocator {
    pub fn new(k: usize) -> Self {
        BadChunkLocator {
            k,
            candidate: None,
            ambiguous: false,
        }
    }

    /// True once the answer can only be `Mismatch`: callers may stop feeding.
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }

    pub fn feed(&mut self, sp: &[u8], sq: &[u8]) {
        debug_assert_eq!(sp.len(), sq.len());
        if self.ambiguous {
            return;
        }
        // Whole words of zero syndrome are the common case even in a bad stripe: skip them fast.
        let mut at = 0;
        while at < sp.len() {
            let word_end = (at + 8).min(sp.len());
            if sp[at..word_end].iter().all(|&b| b == 0) && sq[at..word_end].iter().all(|&b| b == 0)
            {
                at = word_end;
                continue;
            }
            for byte in at..word_end {
                self.feed_byte(sp[byte], sq[byte]);
            }
            if self.ambiguous {
                return;
            }
            at = word_end;
        }
    }

    fn feed_byte(&mut self, sp: u8, sq: u8) {
        let this = match (sp, sq) {
            (0, 0) => return,
            (_, 0) => self.k,
            (0, _) => self.k + 1,
            (sp, sq) => {
                let data_index = (gf::log(sq) + gf::ORDER - gf::log(sp)) % gf::ORDER;
                if data_index >= self.k {
                    self.ambiguous = true;
                    return;
                }
                data_index
            }
        };
        match self.candidate {
            None => self.candidate = Some(this),
            Some(candidate) if candidate != this => self.ambiguous = true,
            Some(_) => {}
        }
    }

    pub fn outcome(&self) -> CheckOutcome {
        match (self.ambiguous, self.candidate) {
            (true, _) => CheckOutcome::Mismatch,
            (false, None) => CheckOutcome::Consistent,
            (false, Some(index)) => CheckOutcome::BadChunk(index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_recover_rejects_bad_input() {
        let lens = |n: usize, len: usize| std::iter::repeat_n(len, n);
        assert_eq!(
            validate_recover(lens(6, 64), 6, true, &[0, 1, 2]),
            Err(ParityError::TooManyMissing {
                missing: 3,
                tolerated: 2
            })
        );
        assert_eq!(
            validate_recover(lens(6, 64), 6, false, &[0, 1]),
            Err(ParityError::TooManyMissing {
                missing: 2,
                tolerated: 1
            })
        );
        assert_eq!(
            validate_recover(lens(6, 64), 6, true, &[6]),
            Err(ParityError::MissingIndexOutOfRange {
                index: 6,
                chunks: 6
            })
        );
        assert_eq!(
            validate_recover([64, 64, 32].into_iter(), 3, false, &[0]),
            Err(ParityError::LengthMismatch {
                expected: 64,
                found: 32
            })
        );
        assert!(matches!(
            validate_recover(lens(2, 64), 2, true, &[0]),
            Err(ParityError::Geometry { .. })
        ));
        assert!(matches!(
            validate_recover(lens(256, 64), 256, true, &[0]),
            Err(ParityError::Geometry { .. })
        ));
        assert!(matches!(
            validate_recover(lens(257, 64), 257, false, &[0]),
            Err(ParityError::Geometry { .. })
        ));
        assert!(
            validate_recover(lens(256, 64), 256, false, &[0]).is_ok(),
            "RAID5 with 255 data chunks"
        );
        let erasures =
            validate_recover(lens(6, 64), 6, true, &[5, 1, 5]).expect("two distinct erasures");
        assert_eq!(erasures.as_slice(), &[1, 5]);
        assert_eq!(erasures.k, 4);
    }

    #[test]
    fn locator_names_single_bad_chunk() {
        let k = 5;
        let mut loc = BadChunkLocator::new(k);
        loc.feed(&[0, 7, 0], &[0, gf::mul(gf::exp(3), 7), 0]);
        assert_eq!(loc.outcome(), CheckOutcome::BadChunk(3));
        let mut loc = BadChunkLocator::new(k);
        loc.feed(&[1, 0], &[0, 0]);
        assert_eq!(loc.outcome(), CheckOutcome::BadChunk(k));
        let mut loc = BadChunkLocator::new(k);
        loc.feed(&[0, 0], &[0, 9]);
        assert_eq!(loc.outcome(), CheckOutcome::BadChunk(k + 1));
        let mut loc = BadChunkLocator::new(k);
        loc.feed(&[1, 0], &[0, 9]);
        assert_eq!(loc.outcome(), CheckOutcome::Mismatch);
        let mut loc = BadChunkLocator::new(k);
        loc.feed(&[0; 9], &[0; 9]);
        assert_eq!(loc.outcome(), CheckOutcome::Consistent);
    }
}
