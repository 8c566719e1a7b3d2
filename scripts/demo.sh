#!/usr/bin/env bash
# One command for a newcomer: install, build, and run `paraid demo` (a RAID6 of six sparse files, served
# over NBD, written and read back with a real NBD client).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -p paraid
exec target/release/paraid demo "$@"
