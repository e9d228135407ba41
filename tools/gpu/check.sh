#!/usr/bin/env bash
# The GPU check (tools/gpu/check.py lists its rows), run on the GPU machine's own image:
#   here:   tools/gpu/prepare.sh                      (wheels into .whl/, which then travels)
#   there:  tools/gpu/check.sh [check.py arguments]   (carry .whl)
# Installs ds and the wheels the image lacks from .whl/ with pip --no-index --no-deps --target
# (a site directory on PYTHONPATH: dist-info included, so entry points find the providers),
# builds ds-ops-kernels' native extension there for that Python, prints versions and nvidia-smi,
# then runs the rows under one budget so that everything ends within 8 minutes. The JSON report
# and this log go to $OUT (else bench-results/gpu/). Exit status 1: a row failed.
# DS_GPU_WHEELS: the wheel folder (default .whl); DS_GPU_SITE: the install directory (default
# /tmp/ds-site); DS_GPU_INSTALL=0 skips the install (ds already importable, as in the .venv);
# DS_GPU_CHECK_SECONDS: the whole run's limit (default 480).
set -uo pipefail
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
[ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ] && [ "${DS_GPU_INSTALL:-1}" = 0 ] && PY="$ROOT/.venv/bin/python"
OUTDIR="${OUT:-$ROOT/bench-results/gpu}"
TOTAL="${DS_GPU_CHECK_SECONDS:-480}"
mkdir -p "$OUTDIR"
for a in "$@"; do
  case "$a" in -h|--help) exec "$PY" "$ROOT/tools/gpu/check.py" --help ;; esac
done
exec > >(tee -a "$OUTDIR/check.log") 2>&1
echo "check.sh: $(date -u '+%F %T UTC') python $PY"
if [ "${DS_GPU_INSTALL:-1}" != 0 ]; then
  SITE="${DS_GPU_SITE:-/tmp/ds-site}"
  WHEELS="${DS_GPU_WHEELS:-$ROOT/.whl}"
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "check.sh: no wheels in $WHEELS (run tools/gpu/prepare.sh here, carry .whl)" >&2
    exit 2
  fi
  rm -rf "$SITE"
  # Two folders, both on the path: ds is a namespace package, so its portions merge (a second
  # --target install into one folder would skip the ds/ already there).
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$SITE/wheels" "$WHEELS"/*.whl; then
    echo "check.sh: the install from $WHEELS failed" >&2
    exit 2
  fi
  export PYTHONPATH="$SITE/wheels${PYTHONPATH:+:$PYTHONPATH}"
  # ds-ops-kernels with its native extension, built here for this Python (scikit-build-core,
  # nanobind, cmake and ninja from the image). A failed build leaves the rows that need it to
  # report the error; the others still run.
  if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
      --no-cache-dir --target "$SITE/native" "$ROOT/packages/ops-kernels"; then
    export PYTHONPATH="$SITE/native:$PYTHONPATH"
  else
    echo "check.sh: building ds-ops-kernels (native extension) failed; see above" >&2
  fi
  echo "check.sh: installed into $SITE in $(( $(date +%s) - START )) s"
fi
"$PY" - <<'PY'
import platform
from importlib import metadata
for name in ("torch", "triton", "transformers", "pydantic", "structlog", "ds-interfaces", "ds-ops-kernels"):
    try:
        v = metadata.version(name)
    except metadata.PackageNotFoundError:
        v = "missing"
    print(f"  {name} {v}")
print(f"  python {platform.python_version()}")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
export PYTHONUNBUFFERED=1
LEFT=$(( TOTAL - ($(date +%s) - START) ))
# The rows get what is left less a margin for start-up and the tables; a hard stop behind it.
BUDGET=$(( LEFT - 60 ))
[ "$BUDGET" -lt 30 ] && BUDGET=30
timeout --signal=TERM --kill-after=10 "$(( LEFT - 5 ))" "$PY" "$ROOT/tools/gpu/check.py" \
  --budget "$BUDGET" --out "$OUTDIR/check.json" "$@"
RC=$?
echo "check.sh: exit $RC after $(( $(date +%s) - START )) s; report $OUTDIR/check.json"
exec >&- 2>&-
sleep 1  # tee writes the last lines of check.log
exit $RC
