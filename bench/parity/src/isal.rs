//! ISA-L (Debian libisal-dev) through FFI: the yardstick. Benchmarks and tests only, never the
//! library.

use std::os::raw::{c_int, c_uchar, c_void};

#[link(name = "isal")]
extern "C" {
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
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

/// ISA-L call failures, named after the call.
#[derive(Debug)]
pub enum IsalError {
    XorGen { rc: i32 },
    PqGen { rc: i32 },
    InvertMatrix { rc: i32 },
}

impl std::fmt::Display for IsalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IsalError::XorGen { rc } => write!(f, "ISA-L xor_gen returned {rc}"),
            IsalError::PqGen { rc } => write!(f, "ISA-L pq_gen returned {rc}"),
            IsalError::InvertMatrix { rc } => {
                write!(f, "ISA-L gf_invert_matrix returned {rc} (singular matrix)")
            }
        }
    }
}

impl std::error::Error for IsalError {}

/// `xor_gen`: the last pointer is P. `array` holds k+1 pointers of `len` bytes each.
pub fn isal_xor_gen(array: &mut [*mut c_void], len: usize) -> Result<(), IsalError> {
    // SAFETY: the caller's pointers each cover `len` bytes (see bench buffers).
    let rc = unsafe { xor_gen(array.len() as c_int, len as c_int, array.as_mut_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(IsalError::XorGen { rc })
    }
}

/// `pq_gen`: the last two pointers are P and Q.
pub fn isal_pq_gen(array: &mut [*mut c_void], len: usize) -> Result<(), IsalError> {
    // SAFETY: as above.
    let rc = unsafe { pq_gen(array.len() as c_int, len as c_int, array.as_mut_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(IsalError::PqGen { rc })
    }
}

/// ISA-L's way to rebuild two lost data chunks x < y of a k+2 RAID6 stripe: invert the k x k matrix
/// of k survivors (the other data, P, Q) and multiply with `ec_encode_data`. Tables made once.
pub struct IsalRecover {
    k: usize,
    tables: Vec<u8>,
    /// Stripe indices of the k survivors, in the order `ec_encode_data` takes them.
    pub survivors: Vec<usize>,
}

impl IsalRecover {
    pub fn new(k: usize, x: usize, y: usize) -> Result<Self, IsalError> {
        // RAID6 as a generator matrix: identity, then P (ones), then Q (2^i).
        let mut matrix = vec![0u8; (k + 2) * k];
        let mut two_to_i = 1u8;
        for i in 0..k {
            matrix[i * k + i] = 1;
            matrix[k * k + i] = 1;
            matrix[(k + 1) * k + i] = two_to_i;
            two_to_i = (two_to_i << 1) ^ if two_to_i & 0x80 != 0 { 0x1d } else { 0 };
        }
        let survivors: Vec<usize> = (0..k + 2).filter(|&r| r != x && r != y).collect();
        let mut square: Vec<u8> = survivors
            .iter()
            .flat_map(|&r| matrix[r * k..(r + 1) * k].to_vec())
            .collect();
        let mut inverse = vec![0u8; k * k];
        // SAFETY: both matrices are k x k.
        let rc = unsafe { gf_invert_matrix(square.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
        if rc != 0 {
            return Err(IsalError::InvertMatrix { rc });
        }
        let mut decode = inverse[x * k..(x + 1) * k].to_vec();
        decode.extend_from_slice(&inverse[y * k..(y + 1) * k]);
        let mut tables = vec![0u8; 32 * k * 2];
        // SAFETY: decode is 2 x k, tables 32 * k * 2 bytes as ec_init_tables documents.
        unsafe { ec_init_tables(k as c_int, 2, decode.as_mut_ptr(), tables.as_mut_ptr()) };
        Ok(IsalRecover {
            k,
            tables,
            survivors,
        })
    }

    /// `sources`: k pointers (the survivors, in `survivors` order); `outputs`: Dx, Dy.
    pub fn run(&mut self, sources: &mut [*mut u8], outputs: &mut [*mut u8; 2], len: usize) {
        assert_eq!(sources.len(), self.k);
        // SAFETY: k sources and 2 outputs of `len` bytes; tables made for this k.
        unsafe {
            ec_encode_data(
                len as c_int,
                self.k as c_int,
                2,
                self.tables.as_mut_ptr(),
                sources.as_mut_ptr(),
                outputs.as_mut_ptr(),
            );
        }
    }
}
