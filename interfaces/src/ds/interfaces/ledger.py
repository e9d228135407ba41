"""Run ledger and readiness gate contracts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ds.interfaces.telemetry import StepMetrics


@dataclass(frozen=True)
class TreeHead:
    """A signed (or unsigned) commitment to the first ``size`` ledger records."""

    size: int
    root_hash: str  # hex
    timestamp: float
    signature: str | None = None  # hex Ed25519 signature over the canonical head bytes
    public_key: str | None = None  # hex


@dataclass(frozen=True)
class VerificationResult:
    ok: bool
    records: int
    first_bad_index: int | None = None
    reason: str | None = None
    signed: bool = False
    uncovered: int = 0  # records after the last tree head: chained, but committed by no head


@runtime_checkable
class Ledger(Protocol):
    def record_training_event(self, kind: str, payload: Mapping[str, Any]) -> int: ...
    def verify_ledger_integrity(self) -> VerificationResult: ...
    def tree_head(self) -> TreeHead: ...
    def prove_inclusion(self, index: int, tree_size: int | None = None) -> list[str]: ...
    def prove_consistency(self, old_size: int, new_size: int | None = None) -> list[str]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Finding:
    metric: str
    value: float
    threshold: float
    severity: str  # "info" | "warning" | "critical"
    message: str


@dataclass(frozen=True)
class Assessment:
    score: float  # 0-100 production readiness
    findings: Sequence[Finding] = field(default_factory=tuple)
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(f.severity == "critical" for f in self.findings)


@runtime_checkable
class ReadinessGate(Protocol):
    def evaluate_training_step(self, metrics: StepMetrics) -> Assessment: ...
    def report(self) -> Assessment: ...
