#!/usr/bin/env bash
# Create (or refresh) .venv with the pinned dev environment and every ds distribution installed
# editable. Idempotent: a second run only reinstalls what changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"
# --no-compile: pip would byte-compile every file of torch and transformers (about 40 s of the
# install on 2 cores); Python compiles the modules a process imports, once, on first import.
PIP=("$VPY" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --no-compile -c tools/constraints-dev.txt -r tools/requirements-dev.txt
# Distributions, in dependency order. ops-kernels compiles its extension here (never at import).
DISTS=(interfaces packages/accel-abstraction packages/comm packages/ops-kernels packages/zero-runtime
       packages/inference-v2 packages/checkpoint-ledger packages/launcher packages/monitor
       packages/sim packages/autotune packages/parallel packages/ds-full)
ARGS=()
for d in "${DISTS[@]}"; do ARGS+=(-e "$d"); done
"${PIP[@]}" install --no-compile --no-build-isolation -c tools/constraints-dev.txt "${ARGS[@]}"
if [ -f tools/requirements-integrations.txt ]; then
  "${PIP[@]}" install --no-compile -c tools/constraints-dev.txt -r tools/requirements-integrations.txt
fi
"${PIP[@]}" install --no-compile --no-build-isolation --no-deps -e integrations/hf -e integrations/lightning
echo "ds dev environment ready: $ROOT/.venv" >&2
