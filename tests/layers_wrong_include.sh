#!/usr/bin/env bash
# The layering check (scripts/check-layers.sh) fails where it must: a copy of src/ passes as it is;
# the same copy with one include that breaks src/layers.txt (cpu/ including engine/) fails and
# names the file and line; an unlisted folder fails too.
# Usage: tests/layers_wrong_include.sh SRC_DIR CHECK_SCRIPT
set -euo pipefail
src=$1
check=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src" "$tmp/src"

bash "$check" "$tmp/src" > "$tmp/clean.txt" || { cat "$tmp/clean.txt"; echo "FAIL: the pristine copy fails"; exit 1; }

# one wrong include at a known line of a real file
target="$tmp/src/cpu/ops.h"
echo '#include "engine/session.h"' >> "$target"
line=$(wc -l < "$target")
if bash "$check" "$tmp/src" > "$tmp/wrong.txt"; then
  cat "$tmp/wrong.txt"; echo "FAIL: cpu/ including engine/ passed"; exit 1
fi
grep -q "^src/cpu/ops.h:$line: cpu/ may not include engine/" "$tmp/wrong.txt" ||
  { cat "$tmp/wrong.txt"; echo "FAIL: the break is not named as src/cpu/ops.h:$line"; exit 1; }
[ "$(grep -c 'may not include' "$tmp/wrong.txt")" = 1 ] || { cat "$tmp/wrong.txt"; echo "FAIL: more than the one break"; exit 1; }

# the same through angle brackets, and through '..'
sed -i '$d' "$target"
echo '#include <engine/session.h>' >> "$target"
if bash "$check" "$tmp/src" > "$tmp/angle.txt"; then cat "$tmp/angle.txt"; echo "FAIL: <engine/...> in cpu/ passed"; exit 1; fi
grep -q "^src/cpu/ops.h:$line: cpu/ may not include engine/" "$tmp/angle.txt" || { cat "$tmp/angle.txt"; echo "FAIL: <...> not named"; exit 1; }
sed -i '$d' "$target"
echo '#include "cpu/../engine/session.h"' >> "$target"
if bash "$check" "$tmp/src" > "$tmp/dots.txt"; then cat "$tmp/dots.txt"; echo "FAIL: an include through .. passed"; exit 1; fi
grep -q "^src/cpu/ops.h:$line: an include through '..'" "$tmp/dots.txt" || { cat "$tmp/dots.txt"; echo "FAIL: '..' not named"; exit 1; }

# a folder the layers file does not list
sed -i '$d' "$target"
mkdir "$tmp/src/extra" && echo '#include "base/error.h"' > "$tmp/src/extra/x.h"
if bash "$check" "$tmp/src" > "$tmp/extra.txt"; then
  cat "$tmp/extra.txt"; echo "FAIL: an unlisted folder passed"; exit 1
fi
grep -q "src/extra: a folder of src/" "$tmp/extra.txt" || { cat "$tmp/extra.txt"; echo "FAIL: the unlisted folder is not named"; exit 1; }
echo "layers: the check passes the tree, fails on a wrong include (src/cpu/ops.h:$line, as \"...\", <...> and through ..) and on an unlisted folder"
