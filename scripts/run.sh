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

if [ $# -eq 0 ]; then
  # The main job: generate text with the bundled model (strata's default when -m is not given).
  set -- run
fi
exec "$build/src/strata" "$@"
