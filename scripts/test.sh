#!/usr/bin/env bash
# Sets up (Debian packages), builds and runs the whole test suite. This is the README's test
# command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${STRATA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${STRATA_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
# the official OpenAI client (npm) against strata serve; SKIPPED without Node.js or registry access
STRATA_BUILD_DIR="$build" bash scripts/openai-client-check.sh
