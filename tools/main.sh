#!/usr/bin/env bash
# The main job: a real 2-process ZeRO-2 training run on CPU with checkpoint, ledger and report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/bootstrap.sh
exec .venv/bin/ds run --nproc 2 examples/train_gpt.py --config examples/ds_config_zero2.json "$@"
