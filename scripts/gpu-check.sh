#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU that cannot build the project (no Rust, no network), in two
# steps. Where the project builds (this repository's own scripts installed its tools):
#
#   scripts/gpu-check.sh bundle DIR     # builds the GPU tests, the simulation and the parity benchmark, copies
#                                       # them stripped into DIR with the libraries they need (ISA-L)
#
# and on the GPU machine, from the repository root, with DIR carried there:
#
#   scripts/gpu-check.sh run DIR OUTDIR [SIM_SEEDS] [PARTS]
#
# which runs the PARTS asked for (default "tests bench writes"), each step under a time limit, writing logs and
# the benchmarks' JSON rows into OUTDIR. tests:
#   1. crates/parity/tests/cuda.rs: GPU against the reference, byte for byte, every 1- and 2-erasure case;
#   2. crates/engine/tests/gpu.rs: a RAID6 written, degraded, rebuilt, checked and repaired on the GPU;
#   3. crates/engine/tests/faults_backend.rs: fault matrix row 14, the backend differential (GPU included);
#   4. crates/engine/tests/sim.rs seeded_simulation_with_gpu_parity: the seeded simulation, every batched
#      parity operation on the GPU, then the simulation example over SIM_SEEDS seeds (default 4000) on every core,
#      concurrent batches, failing if the GPU was switched off or ran nothing;
# bench:
#   5. bench/parity: every CPU backend, ISA-L and the GPU rows at k=10, 64 KiB chunks (among them 64 MiB
#      batches on the CPU, the GPU staged and the GPU in place, with the host CPU each costs), then the GPU
#      across geometries (headline.jsonl, gpusweep.jsonl: bench/parity/report.py turns them into the doc's
#      tables);
#   6. crates/engine/examples/rebuild_rate.rs: a RAID6 of six 2 GiB files on /dev/shm rebuilt onto a blank
#      member with the CPU, the GPU and auto, twice each, and checked after (rebuild_rate.log).
# writes (whole stripes a client writes, parity on the CPU, the GPU and auto):
#   7. crates/engine/examples/write_rate.rs: eight writers of 1 MiB requests into a RAID6 of six 1 GiB files
#      on /dev/shm, from memory the array lends (registered with the GPU) and from plain memory; then 4 MiB
#      requests with auto and the CPU; then members on the machine's disk (write_rate.log);
#   8. bench/gpu/nbd-writes: the same over NBD, `paraid serve` written by nbd_load, requests of 1 and 4 MiB,
#      the server's CPU per GB (nbd_writes.jsonl).
# launch (what one in-place batch costs the host, per way of waiting for the GPU: PARAID_GPU_WAIT, each of
# PARAID_GPU_WAITS, default all four):
#   9. bench-parity --launch-cost (bench/parity/src/launch.rs): tiny batches (the launch alone) and 1 MiB
#      batches, one thread and eight, blocked, spinning, yielding and polling then blocked (launch_cost.jsonl);
#      then write_rate's eight writers of 1 MiB batches in place with each (launch.log).
# Each step has a time limit; the parts together fit a 10-minute device call.
# A GPU test that finds no GPU prints that it skipped and why, so the log says whether the GPU was used.
set -uo pipefail
cd "$(dirname "$0")/.."

bundle() {
  local dir=$1
  set -e
  cargo build --profile release-test -p paraid-parity --test cuda
  cargo build --profile release-test -p paraid-engine --test gpu --test faults_backend --test sim --example sim
  cargo build --release -p paraid-engine --example rebuild_rate
  cargo build --release -p paraid-bench-parity
  cargo build --release -p paraid-engine --example write_rate
  cargo build --release -p paraid-nbd --example nbd_load
  cargo build --release -p paraid
  mkdir -p "$dir/lib"
  # The test binaries' names carry a hash; the newest of each name is the one just built.
  for t in cuda gpu faults_backend sim; do
    local bin
    bin=$(ls -t target/release-test/deps/"$t"-* | grep -v '\.d$' | head -n 1)
    strip -o "$dir/test-$t" "$bin"
  done
  strip -o "$dir/sim" target/release-test/examples/sim
  strip -o "$dir/rebuild_rate" target/release/examples/rebuild_rate
  strip -o "$dir/bench-parity" target/release/bench-parity
  strip -o "$dir/write_rate" target/release/examples/write_rate
  strip -o "$dir/nbd_load" target/release/examples/nbd_load
  strip -o "$dir/paraid" target/release/paraid
  cp -L "$(ldconfig -p | awk '/libisal\.so\.2 /{print $NF; exit}')" "$dir/lib/"
  git rev-parse --short HEAD >"$dir/commit"
  du -sh "$dir"
}

run() {
  local dir=$1 out=$2 sim_seeds=${3:-4000} parts=${4:-tests bench writes}
  mkdir -p "$out"
  local nvrtc_dir
  nvrtc_dir=$(scripts/nvrtc-path.sh || true)
  export LD_LIBRARY_PATH="$PWD/$dir/lib${nvrtc_dir:+:$nvrtc_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export RUST_LOG=${RUST_LOG:-paraid_parity=info}
  {
    echo "commit $(cat "$dir/commit"), $(date -u '+%Y-%m-%d %H:%M UTC')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "nvrtc: ${nvrtc_dir:-not found}"
    grep -m1 'model name' /proc/cpuinfo
    echo "cores: $(nproc); flags: $(grep -m1 -o -w -E 'avx2|avx512bw|gfni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    uname -r
  } >"$out/machine.txt" 2>&1
  cat "$out/machine.txt"
  step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)" >&2
    local started=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - started)) s" >&2
  }
  if [[ " $parts " == *" tests "* ]]; then
  {
    step "parity cuda tests" 150 "$dir/test-cuda" --nocapture --test-threads=1
    step "engine gpu test" 120 "$dir/test-gpu" --nocapture --test-threads=1
    step "fault matrix row 14" 120 "$dir/test-faults_backend" --nocapture --test-threads=1
    step "simulation test with GPU parity" 150 "$dir/test-sim" --nocapture seeded_simulation_with_gpu_parity
    step "simulation, $sim_seeds seeds, GPU parity" 150 "$dir/sim" --seeds "$sim_seeds" --first 20000000 \
      --jobs "$(nproc)" --concurrent --parity gpu
  } 2>&1 | tee "$out/tests.log"
  fi
  if [[ " $parts " == *" bench "* ]]; then
  {
    step "parity benchmark, k=10 64 KiB" 150 "$dir/bench-parity" --json --seconds 1 >"$out/headline.jsonl"
    : >"$out/gpusweep.jsonl"
    for g in '10 4096' '10 1048576' '4 65536' '32 65536'; do
      set -- $g
      step "parity benchmark, GPU, k=$1 chunk $2" 60 "$dir/bench-parity" --json --seconds 0.5 \
        --data-chunks "$1" --chunk-bytes "$2" --backend avx512-gfni --backend cuda >>"$out/gpusweep.jsonl"
    done
    # Seven member files (six and the blank one) on /dev/shm: 2 GiB each where it has room, else 256 MiB.
    local shm_free_mib member_mib=256
    shm_free_mib=$(df -m --output=avail /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
    if [ "${shm_free_mib:-0}" -ge 16384 ]; then member_mib=2048; fi
    step "rebuild rate, CPU against GPU ($member_mib MiB members)" 120 "$dir/rebuild_rate" \
      --member-mib "$member_mib" cpu gpu auto cpu gpu auto >"$out/rebuild_rate.log"
  } 2>&1 | tee "$out/bench.log"
  fi
  if [[ " $parts " == *" writes "* ]]; then
  {
    step "whole-stripe writes, engine, 1 GiB members on /dev/shm" 150 "$dir/write_rate" --member-mib 1024 \
      --threads 8 --seconds 4 cpu gpu auto >"$out/write_rate.log"
    # 4 MiB batches, at auto's floor for batches in place: whether the GPU pays for a client's writes this large.
    step "whole-stripe writes, engine, 4 MiB requests" 90 "$dir/write_rate" --member-mib 1024 --threads 8 \
      --seconds 4 --request-kib 4096 --memory lent auto cpu >>"$out/write_rate.log"
    step "whole-stripe writes, engine, 512 MiB members on the disk" 90 "$dir/write_rate" --dir /tmp \
      --member-mib 512 --threads 8 --seconds 4 --memory lent cpu gpu >>"$out/write_rate.log"
    step "whole-stripe writes over NBD, 1 GiB members on /dev/shm" 200 bench/gpu/nbd-writes "$dir" /dev/shm \
      1024 5 4 "cpu gpu auto" "1M 4M" >"$out/nbd_writes.jsonl"
  } 2>&1 | tee "$out/writes.log"
  fi
  if [[ " $parts " == *" launch "* ]]; then
  {
    : >"$out/launch_cost.jsonl"
    for wait in ${PARAID_GPU_WAITS:-block spin yield poll-then-block}; do
      export PARAID_GPU_WAIT=$wait
      for shape in "--chunk-bytes 4096 --stripes 1 --threads 1" "--chunk-bytes 65536 --stripes 4 --threads 1" \
        "--chunk-bytes 65536 --stripes 4 --threads 8"; do
        # shellcheck disable=SC2086 # the shape is words
        step "launch cost, $wait, $shape" 30 "$dir/bench-parity" --launch-cost --data-chunks 4 $shape \
          --seconds 2 >>"$out/launch_cost.jsonl"
      done
      step "whole-stripe writes in place, $wait" 60 "$dir/write_rate" --member-mib 1024 \
        --threads 8 --seconds 4 --memory lent gpu
    done
    unset PARAID_GPU_WAIT
  } 2>&1 | tee "$out/launch.log"
  fi
  # Each step's exit is in the logs (the steps ran in pipelines' subshells).
  ! grep -h '^== .*: exit [^0]' "$out"/*.log
}

case "${1:-}" in
  bundle) bundle "${2:?bundle DIR}" ;;
  run) run "${2:?run DIR OUTDIR}" "${3:?run DIR OUTDIR}" "${4:-}" "${5:-}" ;;
  *)
    echo "usage: scripts/gpu-check.sh bundle DIR | run DIR OUTDIR [SIM_SEEDS] [PARTS]" >&2
    exit 2
    ;;
esac
