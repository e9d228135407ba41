"""ds.checkpoint: resharding checkpoints, a tamper-evident run ledger and a readiness gate.

Submodules: ``engine`` (ShardedCheckpointEngine), ``ledger`` (RunLedger),
``merkle`` (RFC 6962 proofs), ``gate`` (ReadinessGate), ``boundary`` (approvals),
``export`` (consolidated safetensors / torch files), ``config``. Names are re-exported lazily so
``import ds.checkpoint`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ShardedCheckpointEngine": "ds.checkpoint.engine",
    "RunLedger": "ds.checkpoint.ledger",
    "TechnicalDueDiligenceLedger": "ds.checkpoint.ledger",
    "ReadinessGate": "ds.checkpoint.gate",
    "ProductionDebtZeROGate": "ds.checkpoint.gate",
    "GateThresholds": "ds.checkpoint.gate",
    "MutationBoundary": "ds.checkpoint.boundary",
    "never_equate_intent_to_approval": "ds.checkpoint.boundary",
    "CheckpointConfig": "ds.checkpoint.config",
    "build_engine": "ds.checkpoint.config",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ds.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
