#!/usr/bin/env bash
# bench/parity: builds the parity benchmark in release and runs it with the given flags:
#   bench/parity.sh [--json] [--data-chunks K] [--chunk-bytes B] [--seconds S] [--backend NAME]...
# GB/s of data per core for gen, update and 2-erasure recover on every backend here and on ISA-L
# (libisal-dev), plus the GPU rows where a CUDA driver and GPU exist.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
nvrtc_dir=$(scripts/nvrtc-path.sh || true)
if [ -n "$nvrtc_dir" ]; then export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
cargo build --quiet --release -p paraid-bench-parity
exec "${CARGO_TARGET_DIR:-$root/target}/release/bench-parity" "$@"
