#!/usr/bin/env bash
# Run the whole ds test suite (unit, multi-process, lint contracts) in the pinned environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/bootstrap.sh
# Collectives in tests fail with a named rank and op instead of hanging (ds.comm watchdog).
export DS_COMM_WATCHDOG="${DS_COMM_WATCHDOG:-120}"
exec .venv/bin/python -m pytest interfaces/tests packages integrations tests "$@"
