#!/usr/bin/env bash
# Installs what paraid needs on Debian 12. `--test` adds the clients the integration tests drive
# (real NBD clients, fio, qemu-io, XFS, FUSE), ISA-L (the parity oracle) and NVRTC (to compile the CUDA
# kernels in CI without a GPU). `--bench` adds the peers and tools of the benchmark suites in bench/ (btrfs,
# MariaDB, sysbench, matplotlib). Idempotent; quiet when everything is already there.
set -euo pipefail
want_test=0
want_bench=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --bench) want_bench=1 ;;
    *) echo "install-deps: unknown option '$arg' (expected --test, --bench)" >&2; exit 2 ;;
  esac
done

need_root() { if [ "$(id -u)" -ne 0 ]; then echo "sudo"; fi; }
SUDO=$(need_root)

pkgs=(build-essential pkg-config libnbd-bin) # libnbd-bin has nbdinfo, nbdcopy and nbdfuse
if [ $want_test = 1 ]; then
  pkgs+=(libisal-dev python3-libnbd qemu-utils fio nbdkit xfsprogs e2fsprogs fuse3 util-linux python3-pip python3-venv)
fi
if [ $want_bench = 1 ]; then
  pkgs+=(fio nbdkit fuse3 xfsprogs btrfs-progs mariadb-server sysbench python3-matplotlib util-linux)
fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  for c in "$HOME/.cargo/bin/cargo" /usr/local/cargo/bin/cargo; do
    [ -x "$c" ] && export PATH="$(dirname "$c"):$PATH" && break
  done
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: no Rust toolchain found: install rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi

if [ $want_test = 1 ]; then
  # NVRTC from PyPI (CUDA 13.0, matching the H100 driver): lets CI compile every .cu kernel with no GPU.
  if ! python3 -c 'import nvidia.cuda_nvrtc' >/dev/null 2>&1 && [ -z "$(scripts/nvrtc-path.sh 2>/dev/null)" ]; then
    echo "install-deps: pip install nvidia-cuda-nvrtc==13.0.*"
    python3 -m pip install -q 'nvidia-cuda-nvrtc==13.0.*' 2>/dev/null \
      || python3 -m pip install -q --break-system-packages 'nvidia-cuda-nvrtc==13.0.*'
  fi
fi
