//! GPU rows (filled in with the CUDA backend).

use crate::{Args, Row, StripeView};

pub fn bench(_stripe: &StripeView<'_>, _args: &Args, _rows: &mut Vec<Row>) {
    eprintln!("bench-parity: GPU rows skipped: not built yet");
}
