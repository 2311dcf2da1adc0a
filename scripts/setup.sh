#!/usr/bin/env bash
# Installs the Debian packages strata builds against. Idempotent: packages already present are
# skipped; prints what it installs. Downloads nothing but Debian packages.
# --train: also what scripts/train-demo.sh needs (PyTorch, NumPy, OpenBLAS, the King James text).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev   # tests, kernel benchmarks
  libsimde-dev                                 # the AVX-512 kernels' tests on CPUs without AVX-512
  clang libclang-rt-14-dev                     # libFuzzer targets (STRATA_FUZZ)
  libhwloc-dev liburing-dev                    # topology / NUMA binding, io_uring block reader
  libxsimd-dev libdnnl-dev                     # portable SIMD, large CPU matmuls
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libcpp-httplib-dev
  python3 python3-jinja2                       # the chat-template oracle (tests/jinja)
)
if [ "${1:-}" = "--train" ]; then
  # Debian's torch uses the BLAS alternative: OpenBLAS makes it ~15x faster than the reference BLAS
  packages+=(python3-torch python3-numpy libopenblas0-pthread bible-kjv)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
