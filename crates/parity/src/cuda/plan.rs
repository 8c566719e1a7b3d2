//! What the GPU kernel computes for one uniform group of stripes: which chunks it loads, which it
//! writes, and with which coefficients (see kernels/stripe.cu). Pure arithmetic, tested on the CPU
//! with [`emulate`], a byte-by-byte model of the kernel.

use crate::gf;
use crate::stripe::Erasures;

/// Stripe indices the kernel's plan can name: data 0..k, P = k, Q = k + 1.
pub(crate) const PLAN_CHUNKS: usize = 256;
/// Kernel flag: check only (syndromes must be zero), no outputs.
pub(crate) const FLAG_CHECK: u32 = 1;
/// Kernel flag: no output needs the Q accumulator.
pub(crate) const FLAG_NO_Q: u32 = 2;
/// The kernel works on 16-byte words; chunks are padded to a whole word.
pub(crate) const WORD_BYTES: usize = 16;

/// The kernel's `ParaidPlan`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub k: i32,
    pub in_chunks: i32,
    pub out_chunks: i32,
    pub pitch_words: i32,
    pub flags: u32,
    pub src_of: [i32; PLAN_CHUNKS],
    pub coef: [u8; 4],
}

impl Plan {
    /// The plan's bytes, as copied to device memory for the kernel.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: #[repr(C)] plain old data without padding (asserted in the tests), so every
        // byte is initialised.
        unsafe {
            std::slice::from_raw_parts(
                self as *const Plan as *const u8,
                std::mem::size_of::<Plan>(),
            )
        }
    }
}

/// Whether a stripe of k data chunks fits a plan (P and Q slots included).
pub(crate) fn fits(k: usize) -> bool {
    k + 2 <= PLAN_CHUNKS
}

/// A plan plus the host side of the layout: the stripe index of each input and output chunk.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    pub plan: Plan,
    pub chunk_bytes: usize,
    pub inputs: [u16; PLAN_CHUNKS],
    pub outputs: [u16; 2],
}

impl Job {
    pub fn pitch_bytes(&self) -> usize {
        self.plan.pitch_words as usize * WORD_BYTES
    }

    pub fn input_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.inputs[..self.plan.in_chunks as usize]
            .iter()
            .map(|&i| i as usize)
    }

    pub fn output_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.outputs[..self.plan.out_chunks as usize]
            .iter()
            .map(|&i| i as usize)
    }

    /// Bytes of one stripe in the input region.
    pub fn in_row_bytes(&self) -> usize {
        self.plan.in_chunks as usize * self.pitch_bytes()
    }

    /// Bytes of one stripe in the output region.
    pub fn out_row_bytes(&self) -> usize {
        self.plan.out_chunks as usize * self.pitch_bytes()
    }

    fn new(k: usize, chunk_bytes: usize, load: impl Fn(usize) -> bool, chunks: usize) -> Job {
        assert!(
            chunks <= PLAN_CHUNKS && k < chunks,
            "GPU plan: {k} data chunks do not fit"
        );
        let mut plan = Plan {
            k: k as i32,
            in_chunks: 0,
            out_chunks: 0,
            pitch_words: chunk_bytes.div_ceil(WORD_BYTES) as i32,
            flags: 0,
            src_of: [-1; PLAN_CHUNKS],
            coef: [0; 4],
        };
        let mut inputs = [0u16; PLAN_CHUNKS];
        for i in (0..chunks).filter(|&i| load(i)) {
            plan.src_of[i] = plan.in_chunks;
            inputs[plan.in_chunks as usize] = i as u16;
            plan.in_chunks += 1;
        }
        Job {
            plan,
            chunk_bytes,
            inputs,
            outputs: [0; 2],
        }
    }

    fn output(&mut self, index: usize, coef_u: u8, coef_v: u8) {
        let o = self.plan.out_chunks as usize;
        self.outputs[o] = index as u16;
        self.plan.coef[2 * o] = coef_u;
        self.plan.coef[2 * o + 1] = coef_v;
        self.plan.out_chunks += 1;
    }

    fn finish(mut self) -> Job {
        let uses_v = (0..self.plan.out_chunks as usize).any(|o| self.plan.coef[2 * o + 1] != 0);
        if !uses_v && self.plan.flags & FLAG_CHECK == 0 {
            self.plan.flags |= FLAG_NO_Q;
        }
        self
    }

    /// P (and Q) of k data chunks.
    pub fn gen(k: usize, has_q: bool, chunk_bytes: usize) -> Job {
        let mut job = Job::new(k, chunk_bytes, |i| i < k, k + if has_q { 2 } else { 1 });
        job.output(k, 1, 0);
        if has_q {
            job.output(k + 1, 0, 1);
        }
        job.finish()
    }

    /// Syndromes of whole stripes: the kernel flags any stripe whose u or v is non-zero.
    pub fn check(k: usize, has_q: bool, chunk_bytes: usize) -> Job {
        let chunks = k + if has_q { 2 } else { 1 };
        let mut job = Job::new(k, chunk_bytes, |_| true, chunks);
        job.plan.flags |= FLAG_CHECK;
        if !has_q {
            job.plan.flags |= FLAG_NO_Q;
        }
        job
    }

    /// Rebuilds `erasures` (one or two, sorted). With u = (P) ^ XOR(loaded data) and
    /// v = (Q) ^ sum 2^i D_i (loaded data), where P and Q count only when loaded:
    /// - data x from P:          load P,    Dx = u
    /// - P:                      data only, P = u
    /// - Q:                      data only, Q = v
    /// - data x and y:           load P, Q: Dx = a u ^ b v, Dy = (1 ^ a) u ^ b v, where
    ///   a = 2^y / (2^x ^ 2^y) and b = 1 / (2^x ^ 2^y)
    /// - data x and P:           load Q:    Dx = 2^-x v, P = u ^ 2^-x v
    /// - data x and Q:           load P:    Dx = u, Q = v ^ 2^x u
    /// - P and Q:                data only, P = u, Q = v
    pub(crate) fn recover(k: usize, has_q: bool, erasures: &Erasures, chunk_bytes: usize) -> Job {
        let chunks = k + if has_q { 2 } else { 1 };
        let (p, q) = (k, k + 1);
        let lost = erasures.as_slice();
        let missing = |i: usize| lost.contains(&i);
        let lost_data = lost.iter().filter(|&&i| i < k).count();
        // Parity chunks are read only where they carry information.
        let needs_p = !missing(p) && lost_data >= 1;
        let needs_q = has_q && !missing(q) && (lost_data == 2 || (lost_data == 1 && missing(p)));
        let load = |i: usize| !missing(i) && (i < k || (i == p && needs_p) || (i == q && needs_q));
        let mut job = Job::new(k, chunk_bytes, load, chunks);
        match *lost {
            [x] if x < k => job.output(x, 1, 0),
            [x] if x == p => job.output(p, 1, 0),
            [x] => {
                debug_assert_eq!(x, q);
                job.output(q, 0, 1)
            }
            [x, y] if y < k => {
                let denominator = gf::exp(x) ^ gf::exp(y);
                let a = gf::div(gf::exp(y), denominator);
                let b = gf::inv(denominator);
                job.output(x, a, b);
                job.output(y, 1 ^ a, b);
            }
            [x, y] if x < k && y == p => {
                job.output(x, 0, gf::exp_neg(x));
                job.output(p, 1, gf::exp_neg(x));
            }
            [x, y] if x < k && y == q => {
                job.output(x, 1, 0);
                job.output(q, gf::exp(x), 1);
            }
            [x, y] => {
                debug_assert!(x == p && y == q);
                job.output(p, 1, 0);
                job.output(q, 0, 1);
            }
            [] => {}
            _ => unreachable!("at most two erasures"),
        }
        job.finish()
    }
}

/// The kernel, one byte at a time: `inputs[j]` is input chunk j of one stripe (`chunk_bytes`
/// long), `outputs[o]` output chunk o. Returns whether a check found a non-zero syndrome.
#[cfg(test)]
pub(crate) fn emulate(plan: &Plan, inputs: &[&[u8]], outputs: &mut [Vec<u8>]) -> bool {
    let k = plan.k as usize;
    let want_q = plan.flags & FLAG_NO_Q == 0;
    let len = inputs.first().map_or(0, |c| c.len());
    let mut bad = false;
    for byte in 0..len {
        let (mut u, mut v) = (0u8, 0u8);
        for i in (0..k).rev() {
            if want_q {
                v = gf::mul(2, v);
            }
            if plan.src_of[i] >= 0 {
                let d = inputs[plan.src_of[i] as usize][byte];
                u ^= d;
                v ^= d;
            }
        }
        if plan.src_of[k] >= 0 {
            u ^= inputs[plan.src_of[k] as usize][byte];
        }
        let q_at = if k + 1 < PLAN_CHUNKS {
            plan.src_of[k + 1]
        } else {
            -1
        };
        if want_q && q_at >= 0 {
            v ^= inputs[q_at as usize][byte];
        }
        if plan.flags & FLAG_CHECK != 0 {
            bad |= u != 0 || (want_q && v != 0);
            continue;
        }
        for (o, out) in outputs
            .iter_mut()
            .enumerate()
            .take(plan.out_chunks as usize)
        {
            out[byte] = gf::mul(plan.coef[2 * o], u) ^ gf::mul(plan.coef[2 * o + 1], v);
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::Reference;
    use crate::stripe::validate_recover;
    use crate::Backend;

    fn random_stripe(k: usize, has_q: bool, len: usize, seed: &mut u64) -> Vec<Vec<u8>> {
        let chunks = k + if has_q { 2 } else { 1 };
        let mut stripe: Vec<Vec<u8>> = (0..chunks)
            .map(|_| {
                (0..len)
                    .map(|_| {
                        *seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        (*seed >> 56) as u8
                    })
                    .collect()
            })
            .collect();
        let (data, parity) = stripe.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
        match parity {
            [p] => Reference.gen_p(&data, p),
            [p, q] => Reference.gen_pq(&data, p, q),
            _ => unreachable!(),
        }
        stripe
    }

    fn run(job: &Job, stripe: &[Vec<u8>]) -> (Vec<Vec<u8>>, bool) {
        let inputs: Vec<&[u8]> = job.input_indices().map(|i| stripe[i].as_slice()).collect();
        let mut outputs = vec![vec![0u8; job.chunk_bytes]; job.plan.out_chunks as usize];
        let bad = emulate(&job.plan, &inputs, &mut outputs);
        (outputs, bad)
    }

    #[test]
    fn plan_layout_matches_the_kernel_struct() {
        // 5 ints, 256 ints, 4 bytes: what stripe.cu's ParaidPlan occupies.
        assert_eq!(std::mem::size_of::<Plan>(), 5 * 4 + PLAN_CHUNKS * 4 + 4);
        let source = include_str!("kernels/stripe.cu");
        assert!(source.contains(&format!("#define PARAID_MAX_CHUNKS {PLAN_CHUNKS}")));
        assert!(source.contains(&format!("#define PARAID_FLAG_CHECK {FLAG_CHECK}u")));
        assert!(source.contains(&format!("#define PARAID_FLAG_NO_Q {FLAG_NO_Q}u")));
    }

    #[test]
    fn gen_plan_computes_parity() {
        let mut seed = 1;
        for k in 1..=20 {
            for has_q in [false, true] {
                let stripe = random_stripe(k, has_q, 33, &mut seed);
                let job = Job::gen(k, has_q, 33);
                assert_eq!(job.plan.in_chunks as usize, k, "gen loads only the data");
                let (outputs, _) = run(&job, &stripe);
                for (out, index) in outputs.iter().zip(job.output_indices()) {
                    assert_eq!(out, &stripe[index], "k={k} has_q={has_q} chunk {index}");
                }
            }
        }
    }

    #[test]
    fn recover_plan_rebuilds_every_erasure_and_loads_only_what_it_needs() {
        let mut seed = 2;
        for k in 1..=12 {
            for has_q in [false, true] {
                let chunks = k + if has_q { 2 } else { 1 };
                let stripe = random_stripe(k, has_q, 40, &mut seed);
                let mut cases: Vec<Vec<usize>> = (0..chunks).map(|x| vec![x]).collect();
                if has_q {
                    for x in 0..chunks {
                        for y in x + 1..chunks {
                            cases.push(vec![x, y]);
                        }
                    }
                }
                for missing in cases {
                    let erasures =
                        validate_recover(std::iter::repeat_n(40, chunks), chunks, has_q, &missing)
                            .expect("valid erasures");
                    let job = Job::recover(k, has_q, &erasures, 40);
                    assert!(
                        job.input_indices().all(|i| !missing.contains(&i)),
                        "a lost chunk is loaded: {missing:?}"
                    );
                    assert!(
                        job.plan.in_chunks as usize <= k,
                        "recovery never needs more than k chunks: {missing:?}"
                    );
                    let (outputs, _) = run(&job, &stripe);
                    let written: Vec<usize> = job.output_indices().collect();
                    assert_eq!(written, missing, "outputs are the lost chunks");
                    for (out, index) in outputs.iter().zip(written) {
                        assert_eq!(
                            out, &stripe[index],
                            "k={k} has_q={has_q} missing={missing:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn check_plan_flags_any_corruption() {
        let mut seed = 3;
        for k in [1, 2, 5, 9] {
            for has_q in [false, true] {
                let mut stripe = random_stripe(k, has_q, 24, &mut seed);
                let job = Job::check(k, has_q, 24);
                assert!(!run(&job, &stripe).1, "consistent stripe flagged");
                for bad in 0..stripe.len() {
                    stripe[bad][7] ^= 0x40;
                    assert!(
                        run(&job, &stripe).1,
                        "corrupt chunk {bad} not flagged (k={k} has_q={has_q})"
                    );
                    stripe[bad][7] ^= 0x40;
                }
            }
        }
    }
}
