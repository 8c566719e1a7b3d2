#!/usr/bin/env bash
# One command for a newcomer and for CI: install what the tests need, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
nvrtc_dir=$(scripts/nvrtc-path.sh || true)
if [ -n "$nvrtc_dir" ]; then export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
# Release code with debug assertions on: the data path's invariants stay checked, and the exhaustive
# parity and layout tests finish in minutes on 2 cores.
cargo build --profile release-test --workspace --bins
export PARAID_BIN="$PWD/target/release-test/paraid"
# The benchmark scripts' own logic (doc rewriting, fio/sysbench parsing, ratios): plain Python, no benchmark run.
python3 -m unittest discover -s bench/lib -p 'test_*.py'
cargo test --profile release-test --workspace --no-fail-fast -- --test-threads=2 --skip seeded_simulation
# The GPU tests ran above; say plainly what they did here (cargo hides a passing test's output).
cargo test --profile release-test -p paraid-parity --test cuda -- --nocapture --test-threads=1 2>&1 \
  | grep -E '^test |skipped|compiled' | sed 's/^\.//; s/^/gpu: /'
cargo test --profile release-test -p paraid-engine --test gpu -- --nocapture --test-threads=1 2>&1 \
  | grep -E '^test |skipped' | sed 's/^/gpu (engine): /'
cargo test --profile release-test -p paraid-engine --test sim -- --nocapture --test-threads=1 \
  seeded_simulation_with_gpu_parity 2>&1 | grep -E '^test |skipped' | sed 's/^/gpu (simulation): /'
# The ublk frontend's kernel tests ran above too; this kernel has no ublk_drv, so they skipped: say so plainly.
# crates/ublk/tests/vm/run runs them, and paraid served over ublk, in the vmlab guest whose kernel has it.
cargo test --profile release-test -p paraid-ublk --test kernel -- --nocapture --test-threads=1 2>&1 \
  | grep -E '^test |skipped' | sed 's/^/ublk: /'
# The FUSE frontend's tests need root and /dev/fuse (they skip plainly otherwise): say which way they went.
cargo test --profile release-test -p paraid-fuse --test file -- --nocapture --test-threads=1 2>&1 \
  | grep -E '^test |SKIPPED' | sed 's/^/fuse: /'
# PARAID_VM_TESTS=1 also runs them for real, with paraid served over ublk, in the vmlab guest (about 6 min under
# TCG; needs ../shared/vmlab). CI leaves it off: the guest's packages come from a mirror CI may not reach.
if [ "${PARAID_VM_TESTS:-0}" = 1 ]; then
  crates/ublk/tests/vm/run
fi
# The seeded simulation (crates/engine/tests/sim.rs), with the partial parity log on as users run it: 200 seeds
# of workload, member failures, power losses, kills, rebuilds and silent corruption against a model of every block.
# A failure prints its seed; replay with
# PARAID_SIM_SEED=19 cargo test -p paraid-engine --profile release-test --test sim -- --nocapture
cargo test --profile release-test -p paraid-engine --test sim -- --test-threads=2 seeded_simulation
