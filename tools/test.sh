#!/usr/bin/env bash
# Run the whole ds test suite (unit, multi-process, lint contracts) in the pinned environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/bootstrap.sh
exec .venv/bin/python -m pytest interfaces/tests packages integrations tests "$@"
