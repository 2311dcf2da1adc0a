#!/usr/bin/env bash
# The official OpenAI client library (the `openai` npm package, pinned in tests/openai-client)
# against `strata serve` on the random-weight qwen3moe fixture: a plain and a streamed chat completion, a forced
# tool call plain and streamed and its result sent back, a text completion and a refused bad request. Runs when Node.js and npm are present (CI calls it through
# scripts/test.sh); says SKIPPED and exits 0 when they are not, or when the npm registry cannot
# be reached to install the package.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${STRATA_BUILD_DIR:-build}"
strata="$build/src/strata"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "openai-client: SKIPPED (no Node.js / npm on this machine)"
  exit 0
fi
if [ ! -x "$strata" ]; then
  echo "openai-client: $strata is not built" >&2
  exit 1
fi
work="$build/openai-client"
mkdir -p "$work"
cp tests/openai-client/package.json tests/openai-client/package-lock.json tests/openai-client/check.mjs "$work/"
if [ ! -d "$work/node_modules/openai" ]; then
  if ! (cd "$work" && timeout 300 npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1); then
    echo "openai-client: SKIPPED (npm install of the openai package failed: no registry access?)"
    exit 0
  fi
fi
log="$work/serve.log"
# Qwen3's own template (the bundled model has none): tools, tool calls and reasoning
"$strata" serve -m tests/data/models/qwen3moe/model-Q4_K_M.gguf --port 0 --ctx 2048 --chat-template-file tests/data/chat/templates/Qwen-Qwen3-0.6B.jinja > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*on http:\/\/127\.0\.0\.1:\([0-9]*\)\/v1.*/\1/p' "$log" | head -1)
  [ -n "$port" ] && break
  if ! kill -0 $pid 2>/dev/null; then
    echo "openai-client: strata serve exited:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "openai-client: strata serve did not start" >&2
  cat "$log" >&2
  exit 1
fi
timeout 300 node "$work/check.mjs" "http://127.0.0.1:$port/v1"
