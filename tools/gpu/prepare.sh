#!/usr/bin/env bash
# Prepares the GPU check (tools/gpu/check.sh) on this machine, for a GPU machine that runs its own
# image (python3 3.12, torch, triton, transformers; no package registry): builds wheels of the
# pure-Python ds distributions and downloads cp312 manylinux wheels of what ds needs and the image
# lacks (tools/gpu/carry.py; pinned to this environment's versions) into .whl/ (ignored by git).
# ops-kernels is not built here: its source travels and check.sh builds it there for its Python.
# The working tree plus .whl/ must stay within the 64 MiB that travel; the size is checked.
#   tools/gpu/prepare.sh [--no-download] [--dest DIR]
# Then, on the GPU machine (carry .whl):  tools/gpu/check.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DEST="$ROOT/.whl"
DOWNLOAD=1
LIMIT=$((64 * 1024 * 1024))
while [ $# -gt 0 ]; do
  case "$1" in
    --no-download) DOWNLOAD=0 ;;
    --dest) DEST="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
rm -rf "$DEST"
mkdir -p "$DEST"
cd "$ROOT"
mapfile -t DISTS < <("$PY" tools/gpu/carry.py dists | sed "s|^|$ROOT/|")
echo "prepare.sh: building ${#DISTS[@]} ds wheels"
"$PY" -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$DEST" "${DISTS[@]}"
if [ "$DOWNLOAD" = 1 ]; then
  "$PY" tools/gpu/carry.py missing > "$DEST/carried.txt"
  echo "prepare.sh: downloading $(tr '\n' ' ' < "$DEST/carried.txt")"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 \
    -d "$DEST" -r "$DEST/carried.txt"
fi
WHEELS=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
TREE=$( (git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
TOTAL=$((WHEELS + TREE))
awk -v n="$(ls "$DEST"/*.whl | wc -l)" -v w="$WHEELS" -v t="$TREE" -v all="$TOTAL" 'BEGIN {
  m = 1048576
  printf "prepare.sh: %d wheels, %.1f MiB; working tree %.1f MiB; together %.1f MiB of 64\n",
    n, w / m, t / m, all / m }'
if [ "$TOTAL" -gt "$LIMIT" ]; then
  echo "prepare.sh: over the 64 MiB that travel to the GPU machine" >&2
  exit 1
fi
