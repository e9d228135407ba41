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
# pip byte-compiles what it installs. Keep it: with PYTHONDONTWRITEBYTECODE set (as on this
# machine) nothing else would, and every test process would compile torch's sources on import.
PIP=("$VPY" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -c tools/constraints-dev.txt -r tools/requirements-dev.txt
# Distributions, in dependency order. ops-kernels compiles its extension here (never at import).
DISTS=(interfaces packages/accel-abstraction packages/comm packages/ops-kernels packages/zero-runtime
       packages/inference-v2 packages/checkpoint-ledger packages/launcher packages/monitor
       packages/sim packages/autotune packages/parallel packages/ds-full)
ARGS=()
for d in "${DISTS[@]}"; do ARGS+=(-e "$d"); done
"${PIP[@]}" install --no-build-isolation -c tools/constraints-dev.txt "${ARGS[@]}"
if [ -f tools/requirements-integrations.txt ]; then
  "${PIP[@]}" install -c tools/constraints-dev.txt -r tools/requirements-integrations.txt
fi
"${PIP[@]}" install --no-build-isolation --no-deps -e integrations/hf -e integrations/lightning
echo "ds dev environment ready: $ROOT/.venv" >&2
