#!/usr/bin/env bash
# CI's sanitizer step (issue #12, docs/reliability.md):
#   asan: the whole test suite built with AddressSanitizer + UndefinedBehaviorSanitizer (leaks
#         included); any report fails the test that caused it.
#   tsan: the concurrency tests (thread pool, NUMA groups, block reader, mapped file population, expert store and cache, batched
#         sessions, server and scheduler) built with ThreadSanitizer.
# Both build at -O1 with line tables only (-g1): a third of a -O2 -g build's compile time on a
# 2-core machine, and reports still name files and lines.
# Usage: scripts/sanitize.sh [asan|tsan|all]  (build dirs: build-asan, build-tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
which=${1:-all}
jobs=$(nproc)
flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
       "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" -DSTRATA_BUILD_BENCH=OFF -DSTRATA_CUDA=OFF)
# the tests spawn the CLI and the pool: the environment the README's suite runs with, plus reports
# that stop at the first finding with a stack
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"

if [ "$which" = asan ] || [ "$which" = all ]; then
  echo "sanitize: AddressSanitizer + UBSan build of the whole suite (build-asan)"
  start=$SECONDS
  cmake -S . -B build-asan "${flags[@]}" "-DSTRATA_SANITIZE=address;undefined"
  cmake --build build-asan -j "$jobs"
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
  echo "sanitize: asan+ubsan clean in $((SECONDS - start)) s"
fi

if [ "$which" = tsan ] || [ "$which" = all ]; then
  echo "sanitize: ThreadSanitizer build of the concurrency tests (build-tsan)"
  start=$SECONDS
  tests="test_thread_pool.cpp;test_numa.cpp;test_block_reader.cpp;test_expert_store.cpp;test_expert_cache.cpp;test_session_batch.cpp;test_server.cpp;test_mapped_file.cpp"
  cmake -S . -B build-tsan "${flags[@]}" -DSTRATA_SANITIZE=thread "-DSTRATA_TEST_SOURCES=$tests"
  cmake --build build-tsan -j "$jobs" --target strata_tests
  # OpenMP (libgomp) is not instrumented: its barriers are invisible to TSan, so its parallel
  # regions (synthetic model writing in the tests' setup) run on one thread here. strata's own
  # compute pool, reader threads and server threads are what this step checks.
  OMP_NUM_THREADS=1 ctest --test-dir build-tsan --output-on-failure -j "$jobs"
  echo "sanitize: tsan clean in $((SECONDS - start)) s"
fi
