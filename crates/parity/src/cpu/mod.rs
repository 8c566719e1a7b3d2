//! CPU SIMD backends.
