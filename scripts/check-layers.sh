#!/usr/bin/env bash
# The layering check (src/layers.txt): every `#include "DIR/..."` or `<DIR/...>` in src/FOLDER/
# names FOLDER itself or a folder that layers.txt lets FOLDER include (a folder of src/ reached
# through '..' is refused; files directly in src/ would belong to no layer, and are refused too). Prints each break as FILE:LINE and exits 1;
# exits 0 when every include holds. Usage: scripts/check-layers.sh [SRC_DIR] (default: src/ beside
# this script).
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/../src}" && pwd)
root=$(dirname "$src")
rules="$src/layers.txt"
[ -f "$rules" ] || { echo "check-layers: $rules: no such file" >&2; exit 2; }

declare -A allowed
while IFS= read -r line; do
  line=${line%%#*}
  [[ "$line" =~ ^[[:space:]]*$ ]] && continue
  if [[ ! "$line" =~ ^[[:space:]]*([a-z_0-9]+):(.*)$ ]]; then
    echo "check-layers: $rules: cannot read the line '$line' (expected 'folder: folder ...')" >&2
    exit 2
  fi
  deps=$(echo ${BASH_REMATCH[2]})
  allowed[${BASH_REMATCH[1]}]=" $deps "
done < "$rules"

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]*)[">]'
bad=0
checked=0
for file in "$src"/*.h "$src"/*.cpp; do
  [ -e "$file" ] || continue
  echo "${file#$root/}: a source file directly in src/ belongs to no folder of $rules"
  bad=$((bad + 1))
done
for dir in "$src"/*/; do
  folder=$(basename "$dir")
  if [ -z "${allowed[$folder]+set}" ]; then
    echo "src/$folder: a folder of src/ that $rules does not list"
    bad=$((bad + 1))
    continue
  fi
  while IFS= read -r file; do
    checked=$((checked + 1))
    n=0
    while IFS= read -r text; do
      n=$((n + 1))
      [[ "$text" =~ $include_re ]] || continue
      path=${BASH_REMATCH[1]}
      to=${path%%/*}
      [ "$to" = "$path" ] && continue  # no folder: a system header, or one beside the file
      if [[ "$path" == *..* ]]; then
        echo "${file#$root/}:$n: an include through '..' ($path): name the folder of src/ itself"
        bad=$((bad + 1))
        continue
      fi
      [ -d "$src/$to" ] || continue  # not a folder of src/ (a system or third-party header)
      [ "$to" = "$folder" ] && continue
      if [[ "${allowed[$folder]}" != *" $to "* ]]; then
        list=${allowed[$folder]# }
        echo "${file#$root/}:$n: $folder/ may not include $to/ (src/layers.txt: $folder: ${list% })"
        bad=$((bad + 1))
      fi
    done < "$file"
  done < <(find "$dir" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)
done
if [ "$bad" -gt 0 ]; then
  echo "check-layers: $bad include(s) break the layers of ${rules#$root/}"
  exit 1
fi
echo "check-layers: $checked files, every include holds the layers of ${rules#$root/}"
