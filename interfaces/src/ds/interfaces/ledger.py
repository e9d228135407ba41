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


@dataclass(frozen=True)
class GateThresholds:
    """The readiness gate's limits: the one definition of their names, defaults and checks (the
    config sections of ds.zero and ds.checkpoint are built from it). docs/ledger.md, "Readiness
    gate", says what each term measures and why its limit is where it is."""

    ddi_max: float = 12.0  # DeepSpeed Debt Index, 0-100
    zomm_max: float = 0.95  # memory in use / the memory limit the run is killed at
    p99_tail_max: float = 3.0  # P99 step time / median step time of the window
    p99_step_latency_s_max: float | None = None  # an absolute P99 limit in seconds, if wanted
    window: int = 100  # steps the metrics are computed over
    baseline_steps: int = 10  # first steps: the step-time baseline of the latency term
    warmup_steps: int = 1  # steps not measured at all (buffers allocated, caches cold)
    warn_fraction: float = 0.9  # a value above this share of its limit is a warning

    def __post_init__(self) -> None:
        from ds.interfaces.errors import ConfigError

        for name in ("ddi_max", "zomm_max", "p99_tail_max", "warn_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"gate.{name} must be a number > 0, got {value!r}")
        limit = self.p99_step_latency_s_max
        if limit is not None and (isinstance(limit, bool) or not limit > 0):
            raise ConfigError(f"gate.p99_step_latency_s_max must be > 0 or null, got {limit!r}")
        for name, least in (("window", 1), ("baseline_steps", 1), ("warmup_steps", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"gate.{name} must be an integer >= {least}, got {value!r}")


def gate_fields() -> dict[str, tuple[Any, Any]]:
    """``{name: (type, default)}`` of :class:`GateThresholds`, to build a config model from."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(GateThresholds)
    return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(GateThresholds)}


@runtime_checkable
class ReadinessGate(Protocol):
    def evaluate_training_step(self, metrics: StepMetrics) -> Assessment: ...
    def report(self) -> Assessment: ...
