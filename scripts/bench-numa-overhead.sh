#!/usr/bin/env bash
# Decode speed of two strata binaries (or one binary on this machine and on a 2-node stand-in),
# alternating rounds, to measure what the NUMA machinery costs (bench/RESULTS.md, issue #5).
# Usage: scripts/bench-numa-overhead.sh OLD_STRATA NEW_STRATA MODEL.gguf [ROUNDS]
# Prints "round config avg_ts samples..." lines, then mean ± sd per config.
set -euo pipefail
old=$1 new=$2 model=$3 rounds=${4:-4}
log=$(mktemp)
for round in $(seq "$rounds"); do
  for cfg in old new stand-in-2; do
    bin=$new
    [ "$cfg" = old ] && bin=$old
    if [ "$cfg" = stand-in-2 ]; then
      out=$(STRATA_TOPOLOGY="numa:2 core:1 pu:1" "$bin" bench -m "$model" -p 0 -n 64 -r 3 --json 2>/dev/null)
    else
      out=$("$bin" bench -m "$model" -p 0 -n 64 -r 3 --json 2>/dev/null)
    fi
    echo "$round $cfg $(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin)[0]; print("%.3f %s" % (j["avg_ts"], " ".join("%.3f" % x for x in j["samples_ts"])))')" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import statistics as st, sys
d = {}
for line in open(sys.argv[1]):
    p = line.split()
    d.setdefault(p[1], []).append(float(p[2]))
for k, v in d.items():
    print("%-10s %d rounds  %.2f +- %.2f tok/s" % (k, len(v), st.mean(v), st.stdev(v) if len(v) > 1 else 0))
PY
rm -f "$log"
