#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (issue #7, docs/gpu.md): builds strata with the
# CUDA library for sm_80, sm_86, sm_89, sm_90 and sm_120, runs the whole test suite there (the CUDA
# kernel and backend tests among it: each kernel against the CPU, whole-model logits against the
# fixtures, the GPU tier's routed experts on the device against the CPU-only path), records what
# the driver reports, runs `strata calibrate` (this host's limits), then benchmarks on a synthetic
# Qwen3-30B-A3B Q4_K_M:
#  - the real device at VRAM budgets of 8 and 24 GiB (an RTX 5060 and an RTX 3090): the dense
#    part on the CUDA backend, the hottest routed experts in the VRAM cache on the GPU, the rest on
#    this host's CPUs; against CPU only (budget 0);
#  - three tiers at once: 8 GiB of VRAM with budgets.ram = 8 GiB (the experts that fit in
#    neither read from the file), bench and `strata profile` (the per-link split beside the
#    planner's prediction);
#  - the same budgets on the simulated device, whose modelled times (from this host's limits
#    where `strata calibrate` finds them) are the cost model's view of the same split.
# results.md says which figure is which. Everything goes under OUT_DIR; results.md there is the
# summary to copy into bench/RESULTS.md. Meant to finish within about 10 minutes on a 16-core host
# with MODEL given (benches capped at 100 s on the device, 60 s simulated; not yet timed on one).
#
# Usage: scripts/gpu-check.sh OUT_DIR
#   BUILD_DIR (default build-gpu), MODEL (a GGUF to reuse), CUDA_ARCHS (default "80;86;89;90;120";
#   sm_120 needs CUDA 12.8 or later)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-check.sh OUT_DIR}
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
jobs=$(nproc)
summary="$out/results.md"
start=$SECONDS
step() { echo "gpu-check: $* ($((SECONDS - start)) s)" | tee -a "$out/steps.log"; }

{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "host: $(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$summary"

step "driver"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv \
    > "$out/gpus.csv" 2>&1
  echo "gpus: $(tail -n +2 "$out/gpus.csv" | paste -sd ';')" >> "$summary"
else
  echo "gpus: nvidia-smi not found (no driver): the CUDA tests will skip" >> "$summary"
fi
export PATH="$PATH:/usr/local/cuda/bin"

archs=${CUDA_ARCHS:-80;86;89;90;120}
step "build (CUDA architectures $archs)"
bash scripts/setup.sh > "$out/setup.log" 2>&1
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON \
     "-DCMAKE_CUDA_ARCHITECTURES=$archs" > "$out/cmake.log" 2>&1 ||
   ! cmake --build "$build" -j "$jobs" > "$out/build.log" 2>&1; then
  echo "build: FAILED (build.log / cmake.log)" >> "$summary"
  tail -30 "$out/build.log" "$out/cmake.log" 2>/dev/null
  exit 1
fi
echo "build: ok for CUDA architectures $archs" >> "$summary"

step "tests"
ctest --test-dir "$build" -j "$jobs" --output-on-failure > "$out/ctest.log" 2>&1
rc_tests=$?
echo "tests: $(grep -E 'tests passed' "$out/ctest.log" | tail -1) (ctest.log)" >> "$summary"
grep -E "Gpu|Cuda|Vram" "$out/ctest.log" | grep -E "Passed|Failed|Skipped|Not Run" > "$out/gpu-tests.txt" || true
{ echo; echo "GPU tests:"; sed 's/^/    /' "$out/gpu-tests.txt"; } >> "$summary"
timeout 120 "$build/src/strata" calibrate > "$out/calibrate.log" 2>&1 || true

step "benchmark"
model=${MODEL:-$build/q3-30b-q4k.gguf}
if [ ! -f "$model" ]; then
  "$build/src/strata" synth --shape qwen3-30b-a3b --quant q4_k -o "$model" > "$out/synth.log" 2>&1 || {
    echo "benchmark: could not write the synthetic model (synth.log)" >> "$summary"; exit 1; }
fi
{
  echo
  echo "## The GPU tier on the device, Qwen3-30B-A3B Q4_K_M (synthetic), synthetic routing"
  echo
  echo "Dense part (attention, norms, routers, lm head) on the CUDA backend with the reference-grade kernels,"
  echo "activations copied per op; the hottest routed experts from VRAM slots on the GPU, the rest on this host's"
  echo "CPUs at the same time. Budget 0 is the CPU alone."
  echo
} >> "$summary"
for vram in 0 8GiB 24GiB; do
  step "bench, budgets.vram = $vram (0: the CPU alone)"
  timeout 100 "$build/src/strata" bench -m "$model" --set "budgets.vram=$vram" --set gpu.max_promotions=64 \
    -p 256 -n 64,32 -r 1 --routing synthetic > "$out/bench-cuda-$vram.log" 2>&1
  rc_bench=$?
  echo "### budgets.vram = $vram (bench exit status $rc_bench)" >> "$summary"
  [ $rc_bench -ne 0 ] && rc_tests=1
  grep -E "^\||CUDA|GPU tier|budgets.vram" "$out/bench-cuda-$vram.log" >> "$summary" ||
    echo "(no output: bench-cuda-$vram.log)" >> "$summary"
  echo >> "$summary"
done
{
  echo
  echo "## Three tiers on the device: 8 GiB of VRAM, 8 GiB of RAM, the rest of the experts read from the file"
  echo
  echo "budgets.vram = 8GiB with budgets.ram = 8GiB (below the model): hot experts in VRAM slots promoted from the"
  echo "NVMe tier's RAM slots, warm ones computed by the CPU from RAM, the rest read on demand and ahead of need;"
  echo "then strata profile of the same config (the per-link split, and the planner's prediction beside it)."
  echo
} >> "$summary"
step "bench, three tiers"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
timeout 100 "$build/src/strata" bench -m "$model" --set budgets.vram=8GiB --set budgets.ram=8GiB \
  --set gpu.max_promotions=64 -p 0 -n 32 -r 1 --routing synthetic > "$out/bench-three-tiers.log" 2>&1
rc_bench=$?
echo "### three tiers (bench exit status $rc_bench)" >> "$summary"
[ $rc_bench -ne 0 ] && rc_tests=1
grep -E "^\||CUDA|GPU tier|NVMe|budgets" "$out/bench-three-tiers.log" >> "$summary" ||
  echo "(no output: bench-three-tiers.log)" >> "$summary"
step "profile, three tiers"
timeout 100 "$build/src/strata" profile -m "$model" --set budgets.vram=8GiB --set budgets.ram=8GiB \
  --set gpu.max_promotions=64 -p 64 -n 16 --trace "$out/three-tiers.trace.json" --svg "$out/three-tiers.svg" \
  > "$out/profile-three-tiers.log" 2>&1
rc_bench=$?
echo "### strata profile, three tiers (exit status $rc_bench)" >> "$summary"
[ $rc_bench -ne 0 ] && rc_tests=1
sed -n '/^split of decode time/,/^per token, by part/p' "$out/profile-three-tiers.log" >> "$summary"
echo >> "$summary"
{
  echo
  echo "## GPU tier, Qwen3-30B-A3B Q4_K_M (synthetic), synthetic routing, simulated device"
  echo
  echo "The same budgets on the simulated device: every expert computed on this host's CPUs, the split and the"
  echo "modelled times from this host's calibrated limits (calibrate.log), to set against the device's figures above."
  echo
} >> "$summary"
for budget in 8GiB 24GiB; do
  step "bench at $budget"
  timeout 60 "$build/src/strata" bench -m "$model" --set gpu.simulate=true --set "budgets.vram=$budget" \
    --set gpu.max_promotions=64 -p 256 -n 96,32 -r 1 --routing synthetic > "$out/bench-$budget.log" 2>&1
  rc_bench=$?
  echo "### budgets.vram = $budget (bench exit status $rc_bench)" >> "$summary"
  [ $rc_bench -ne 0 ] && rc_tests=1
  grep -E "^\||simulated GPU|GPU tier" "$out/bench-$budget.log" >> "$summary" || echo "(no output: bench-$budget.log)" >> "$summary"
  echo >> "$summary"
done
step "done"
echo "total: $((SECONDS - start)) s" >> "$summary"
cat "$summary"
exit $rc_tests
