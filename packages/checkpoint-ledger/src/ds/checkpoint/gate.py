"""ProductionDebtZeROGate: a 0-100 production readiness score from the engine's step telemetry.

Three metrics, each over a sliding window of the last ``window`` steps (see docs/ledger.md):

* DDI, DeepSpeed Debt Index (0-100, lower is better)::

      O = sum(offload_time_s) / sum(step_time_s)          offload thrashing share of step time
      C = sum(allgather_stall_s) / sum(step_time_s)       compute waiting on parameter gathers
      S = sum(sync_wait_s) / sum(step_time_s)             barriers / waits on other ranks
      L = min(1, max(0, median(window step_time_s) / median(baseline step_time_s) - 1))
      DDI = 100 * (0.40 * O + 0.25 * C + 0.20 * S + 0.15 * L)

  The baseline is the first ``baseline_steps`` steps the gate saw; L is step-latency degradation.
  Each share is clipped to [0, 1], so DDI is within [0, 100].
* ZOMM, ZeRO Offload Memory Multiplier: ``max over window of (peak_host_rss_bytes +
  nvme_buffer_bytes) / allotted_device_bytes``; not measured while ``allotted_device_bytes`` is 0.
* P99 step latency: the nearest-rank 99th percentile of ``step_time_s`` over the window.

Scoring: a measured metric with value v and threshold t scores ``1 - 0.25 * v / t`` when
``v <= t`` (0.75..1) and ``max(0, 0.5 - 0.5 * (v / t - 1))`` when it breaches (0..0.5). The
readiness score is 100 times the mean over the measured metrics. A breach is a ``critical``
finding; a value above ``warn_fraction * t`` is a ``warning``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.ledger import Assessment, Finding
from ds.interfaces.telemetry import StepMetrics

DDI_WEIGHTS = {
    "offload": 0.40,
    "allgather_stall": 0.25,
    "sync_wait": 0.20,
    "latency_degradation": 0.15,
}


@dataclass(frozen=True)
class GateThresholds:
    ddi_max: float = 12.0
    zomm_max: float = 1.08
    p99_step_latency_s_max: float = 0.45
    window: int = 100
    baseline_steps: int = 10
    warn_fraction: float = 0.9

    def __post_init__(self) -> None:
        for name in ("ddi_max", "zomm_max", "p99_step_latency_s_max", "warn_fraction"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"gate.{name} must be > 0, got {getattr(self, name)}")
        if self.window < 1 or self.baseline_steps < 1:
            raise ConfigError(
                f"gate.window and gate.baseline_steps must be >= 1, got {self.window}, "
                f"{self.baseline_steps}"
            )


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _share(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole)) if whole > 0 else 0.0


def _subscore(value: float, threshold: float) -> float:
    ratio = value / threshold
    if ratio <= 1.0:
        return 1.0 - 0.25 * ratio
    return max(0.0, 0.5 - 0.5 * (ratio - 1.0))


class ProductionDebtZeROGate:
    """The default :class:`ds.interfaces.ledger.ReadinessGate`.

    Feed it every StepMetrics (``evaluate_training_step`` or ``attach(bus)``); ``report`` gives
    the assessment of the current window and, with a ledger, records it.
    """

    def __init__(
        self,
        thresholds: GateThresholds | None = None,
        *,
        ledger: Any | None = None,
        **overrides: Any,
    ) -> None:
        if thresholds is None:
            thresholds = GateThresholds(**overrides)
        elif overrides:
            raise ConfigError("pass either thresholds= or keyword thresholds, not both")
        self.thresholds = thresholds
        self._ledger = ledger
        self._window: deque[StepMetrics] = deque(maxlen=thresholds.window)
        self._baseline: list[float] = []
        self._last: Assessment = Assessment(100.0)

    def attach(self, bus: Any) -> None:
        bus.subscribe(self.evaluate_training_step, StepMetrics)

    def evaluate_training_step(self, metrics: StepMetrics) -> Assessment:
        if len(self._baseline) < self.thresholds.baseline_steps:
            self._baseline.append(metrics.step_time_s)
        self._window.append(metrics)
        self._last = self._assess()
        return self._last

    def metrics(self) -> dict[str, float]:
        return window_metrics([_inputs(m) for m in self._window], self._baseline)

    def inputs(self) -> dict[str, Any]:
        """Everything the current assessment is computed from (recorded in the ledger)."""
        return {
            "window": [_inputs(m) for m in self._window],
            "baseline_step_time_s": list(self._baseline),
            "thresholds": dataclasses.asdict(self.thresholds),
        }

    def _assess(self) -> Assessment:
        return assess(self.metrics(), self.thresholds, len(self._window))

    def report(self) -> Assessment:
        if self._ledger is not None:
            a = self._last
            self._ledger.record_training_event(
                "readiness_assessment",
                {
                    "score": a.score,
                    "passed": a.passed,
                    "metrics": dict(a.metrics),
                    "findings": [f.__dict__ for f in a.findings],
                    "steps": len(self._window),
                    "inputs": self.inputs(),
                },
            )
        return self._last


# The StepMetrics fields the gate reads: recorded per step, so a score can be recomputed.
INPUT_FIELDS = (
    "step",
    "step_time_s",
    "offload_time_s",
    "allgather_stall_s",
    "sync_wait_s",
    "peak_host_rss_bytes",
    "nvme_buffer_bytes",
    "allotted_device_bytes",
)


def _inputs(m: StepMetrics) -> dict[str, Any]:
    return {k: getattr(m, k) for k in INPUT_FIELDS}


def window_metrics(window: list[dict[str, Any]], baseline: list[float]) -> dict[str, float]:
    """DDI (and its parts), ZOMM and P99 of a window of recorded step inputs."""
    if not window:
        return {}
    total = sum(m["step_time_s"] for m in window)
    parts = {
        "offload": _share(sum(m["offload_time_s"] for m in window), total),
        "allgather_stall": _share(sum(m["allgather_stall_s"] for m in window), total),
        "sync_wait": _share(sum(m["sync_wait_s"] for m in window), total),
    }
    base = statistics.median(baseline) if baseline else 0.0
    now = statistics.median(m["step_time_s"] for m in window)
    parts["latency_degradation"] = min(1.0, max(0.0, now / base - 1.0)) if base > 0 else 0.0
    out = {f"ddi.{k}": v for k, v in parts.items()}
    out["ddi"] = 100.0 * sum(DDI_WEIGHTS[k] * v for k, v in parts.items())
    out["p99_step_latency_s"] = p99([m["step_time_s"] for m in window])
    zomm = [
        (m["peak_host_rss_bytes"] + m["nvme_buffer_bytes"]) / m["allotted_device_bytes"]
        for m in window
        if m["allotted_device_bytes"] > 0
    ]
    if zomm:
        out["zomm"] = max(zomm)
    return out


def assess(values: dict[str, float], t: GateThresholds, steps: int) -> Assessment:
    """The assessment of computed metrics against thresholds (``steps``: the window's length)."""
    checks = [
        (
            "ddi",
            t.ddi_max,
            "DeepSpeed Debt Index {v:.2f} (limit {t:.2f}): offload, gather "
            "stalls, sync waits or latency drift eat step time",
        ),
        (
            "zomm",
            t.zomm_max,
            "ZeRO Offload Memory Multiplier {v:.3f}x (limit {t:.2f}x): host "
            "RAM + NVMe buffers exceed the device memory budget; reduce offload buffers",
        ),
        (
            "p99_step_latency_s",
            t.p99_step_latency_s_max,
            "P99 step latency {v:.3f} s (limit {t:.3f} s) over the last {n} steps",
        ),
    ]
    findings: list[Finding] = []
    scores: list[float] = []
    for name, thr, msg in checks:
        if name not in values:
            continue
        v = values[name]
        scores.append(_subscore(v, thr))
        text = msg.format(v=v, t=thr, n=steps)
        if v > thr:
            findings.append(Finding(name, v, thr, "critical", text))
        elif v > t.warn_fraction * thr:
            findings.append(Finding(name, v, thr, "warning", "near limit: " + text))
    score = 100.0 * sum(scores) / len(scores) if scores else 100.0
    return Assessment(round(score, 3), tuple(findings), values)
