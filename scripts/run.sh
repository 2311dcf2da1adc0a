#!/usr/bin/env bash
# Sets up (Debian packages), builds strata and runs it. With no arguments it runs the main job on
# the bundled default model; otherwise the arguments are passed to the strata executable.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh >&2
build=${STRATA_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${STRATA_CMAKE_ARGS:-} >&2
fi
cmake --build "$build" -j "$(nproc)" --target strata >&2

bundled="$root/tests/data/models/qwen3moe/model-Q4_K_M.gguf"
if [ $# -eq 0 ]; then
  # Inference (`strata run`) is not built yet (issue #3); until then the main job is describing
  # the bundled model: what it is made of and what one decoded token must read.
  set -- info "$bundled"
fi
exec "$build/src/strata" "$@"
