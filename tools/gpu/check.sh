#!/usr/bin/env bash
# The real-GPU check (docs/ops.md, "GPU check"): on one GPU, in under 10 minutes, ZeRO 0-3 parity
# with and without offload on NCCL, the Triton kernels against their references, greedy
# inference parity with transformers, and ds / torch DDP / torch FSDP2 throughput on a ~1B Llama.
#   tools/gpu/check.sh [--sections parity,kernels,inference,bench] [--out FILE] [...]
# Arguments go to tools/gpu/check.py (--help lists them). Exit status 1: a check failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
if [ ! -x "$PY" ]; then
  echo "tools/gpu/check.sh: no python at $PY (run tools/bootstrap.sh or set PYTHON)" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# One rank on the first visible device; the whole run is bounded so a hang cannot eat the slot.
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
exec timeout --signal=TERM "${DS_GPU_CHECK_TIMEOUT:-600}" "$PY" "$ROOT/tools/gpu/check.py" "$@"
