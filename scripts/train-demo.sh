#!/usr/bin/env bash
# Trains strata's demo model (tools/demo/train.py: a 7.6 M-parameter qwen3moe on the King James
# Bible, Jude and Revelation held out), checks strata computes what PyTorch computed, quantizes it
# and scores every quant on the held-out books. CPU only, about 45 minutes on 2 cores.
#   scripts/train-demo.sh [OUT_DIR] [--install] [train.py options, e.g. --steps 600]
# --install copies the Q8_0 file, the held-out text and the word list into tests/data/models/demo
# (the bundled default model). Not part of CI: CI uses the committed file.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out=build/demo
install=0
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out=$1; shift; fi
if [ "${1:-}" = "--install" ]; then install=1; shift; fi

bash scripts/setup.sh --train >&2
build=${STRATA_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${STRATA_CMAKE_ARGS:-} >&2
fi
cmake --build "$build" -j "$(nproc)" --target strata >&2
S="$build/src/strata"
py=/usr/bin/python3  # Debian's, which has torch and numpy

"$py" tools/demo/train.py --out "$out" "$@"

# strata's exact path on the float file against PyTorch's logits of the same tokens
"$S" logits -m "$out/strata-demo-F32.gguf" --tokens "$out/check-tokens.json" --exact -o "$out/check-strata.f32" >&2
"$py" - "$out" <<'PY'
import sys, numpy as np
d = sys.argv[1]
a = np.fromfile(f"{d}/check-logits.f32", dtype=np.float32)
b = np.fromfile(f"{d}/check-strata.f32", dtype=np.float32)
err = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
print(f"train-demo: strata --exact vs PyTorch logits: max |diff| {err:.2e} (logit std {a.std():.2f})")
sys.exit(0 if err < 1e-3 * max(1.0, float(np.abs(a).max())) else 1)
PY

for q in Q8_0 Q6_K Q4_K_M Q4_0 MXFP4_MOE; do
  "$S" quantize "$out/strata-demo-F32.gguf" "$out/strata-demo-$q.gguf" "$q" | head -1
done
printf '\n%-10s %9s %10s %10s %9s\n' quant size ppl "KL(exact)" "top-1" 
for q in F32 Q8_0 Q6_K Q4_K_M Q4_0 MXFP4_MOE; do
  f="$out/strata-demo-$q.gguf"
  "$S" perplexity -m "$f" -f "$out/heldout.txt" --kl-exact --json 2>/dev/null > "$out/ppl-$q.json"
  "$py" - "$f" "$out/ppl-$q.json" "$q" <<'PY'
import json, os, sys
f, j, q = sys.argv[1:]
r = json.load(open(j))
print(f"{q:<10} {os.path.getsize(f) / 1e6:7.2f}MB {r['perplexity']:10.4f} {r['kl_mean']:10.6f} {r['top1_agreement']:9.4f}")
PY
done

if [ "$install" = 1 ]; then
  dest=tests/data/models/demo
  mkdir -p "$dest"
  cp "$out/strata-demo-Q8_0.gguf" "$out/heldout.txt" "$out/kjv-words.txt" "$out/train-summary.json" "$dest/"
  echo "train-demo: installed the Q8_0 model into $dest"
fi
