"""ProductionDebtZeROGate: a 0-100 production readiness score from the engine's step telemetry.

Three metrics, each over a sliding window of the last ``window`` steps (docs/ledger.md says what
each term measures and why its limit is where it is; the limits are
:class:`ds.interfaces.ledger.GateThresholds`):

* DDI, DeepSpeed Debt Index (0-100, lower is better)::

      O = sum(offload_time_s) / sum(step_time_s)          host offload's share of step time
      C = sum(allgather_stall_s) / sum(step_time_s)       waiting on peers in parameter gathers
      S = sum(sync_wait_s) / sum(step_time_s)             waiting on peers in gradient syncs
      L = min(1, max(0, median(window step_time_s) / median(baseline step_time_s) - 1))
      DDI = 100 * (0.35 * O + 0.25 * C + 0.25 * S + 0.15 * L)

  C and S count exposed wait beyond the collectives' own cost (ds.monitor.gate_signals): a healthy run
  whose collectives are a large share of a small step scores near 0 on them. The baseline is the
  first ``baseline_steps`` steps the gate saw; L is step-latency degradation. When the ranks
  waited on a peer, the finding names the rank that arrived last (``late_rank``).
* ZOMM, memory against the limit the run is killed at: ``max over window of max(peak_host_rss /
  host_memory_limit, peak_device / allotted_device)`` (the host limit is the cgroup's when set).
* P99 step latency: the nearest-rank 99th percentile of ``step_time_s`` over the window, against
  ``p99_tail_max`` times the window's median step time (and ``p99_step_latency_s_max`` seconds
  when set): a tail, not an absolute time, so it holds for any model on any device.

The gate skips the first ``warmup_steps`` steps it sees (buffers allocated, caches cold: a
warm-up, not a tail).

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
from typing import Any

from ds.interfaces.errors import ConfigError
from ds.interfaces.ledger import Assessment, Finding, GateThresholds
from ds.interfaces.telemetry import StepMetrics

# Recorded with every assessment's inputs: ``ds ledger rescore`` recomputes only what the same
# formulae produced. 2: stalls beyond the collectives' own cost, memory against its limit, P99
# against the median, warm-up skipped.
FORMULA_VERSION = 2

DDI_WEIGHTS = {
    "offload": 0.35,
    "allgather_stall": 0.25,
    "sync_wait": 0.25,
    "latency_degradation": 0.15,
}


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


class ReadinessGate:
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
        self._skipped = 0

    def attach(self, bus: Any) -> None:
        bus.subscribe(self.evaluate_training_step, StepMetrics)

    def evaluate_training_step(self, metrics: StepMetrics) -> Assessment:
        if self._skipped < self.thresholds.warmup_steps:  # allocating, caches cold
            self._skipped += 1
            return self._last
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
            "formula": FORMULA_VERSION,
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
    "peak_device_bytes",
    "allotted_device_bytes",
    "host_memory_limit_bytes",
    "late_rank",
)


def _inputs(m: StepMetrics) -> dict[str, Any]:
    return {k: getattr(m, k) for k in INPUT_FIELDS}


def _late_rank(window: list[dict[str, Any]]) -> int:
    """The rank the others waited on longest over the window (-1: nobody waited)."""
    blame: dict[int, float] = {}
    for m in window:
        late = int(m.get("late_rank", -1))
        stall = m["allgather_stall_s"] + m["sync_wait_s"]
        if late >= 0 and stall > 0:
            blame[late] = blame.get(late, 0.0) + stall
    return max(blame, key=blame.__getitem__) if blame else -1


def _memory_share(m: dict[str, Any]) -> float | None:
    """Memory in use against the limit the run is killed at: host and device, the tighter."""
    shares = []
    host = m.get("host_memory_limit_bytes", 0)
    if host > 0:
        shares.append(m["peak_host_rss_bytes"] / host)
    if m["allotted_device_bytes"] > 0:
        shares.append(m.get("peak_device_bytes", 0) / m["allotted_device_bytes"])
    return max(shares) if shares else None


def window_metrics(window: list[dict[str, Any]], baseline: list[float]) -> dict[str, float]:
    """DDI (and its parts), ZOMM, P99 (and the median it is held against) of a window of
    recorded step inputs; ``late_rank`` when ranks waited on a peer."""
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
    out["median_step_latency_s"] = now
    zomm = [z for m in window if (z := _memory_share(m)) is not None]
    if zomm:
        out["zomm"] = max(zomm)
    late = _late_rank(window)
    if late >= 0:
        out["late_rank"] = float(late)
    return out


def _p99_limit(values: dict[str, float], t: GateThresholds) -> float:
    limit = t.p99_tail_max * values.get("median_step_latency_s", 0.0)
    if t.p99_step_latency_s_max is not None:
        limit = min(limit, t.p99_step_latency_s_max) if limit > 0 else t.p99_step_latency_s_max
    return limit


def assess(values: dict[str, float], t: GateThresholds, steps: int) -> Assessment:
    """The assessment of computed metrics against thresholds (``steps``: the window's length)."""
    late = int(values.get("late_rank", -1))
    waited = values.get("ddi.allgather_stall", 0.0) + values.get("ddi.sync_wait", 0.0)
    blame = (
        f"; the ranks waited {100 * waited:.0f}% of the step on rank {late}, which arrived last "
        "at the collectives (look for what slows that rank)"
        if late >= 0 and waited > 0
        else ""
    )
    checks = [
        (
            "ddi",
            t.ddi_max,
            "DeepSpeed Debt Index {v:.2f} (limit {t:.2f}): offload, waits on peers or latency "
            "drift eat step time" + blame,
        ),
        (
            "zomm",
            t.zomm_max,
            "memory in use is {v:.3f} of the limit it is killed at (limit {t:.2f}): host RSS "
            "against the cgroup or machine memory, or device memory; reduce offload buffers or "
            "batch size",
        ),
        (
            "p99_step_latency_s",
            _p99_limit(values, t),
            "P99 step latency {v:.3f} s (limit {t:.3f} s: the tail allowed over the median "
            "step) over the last {n} steps",
        ),
    ]
    findings: list[Finding] = []
    scores: list[float] = []
    for name, thr, msg in checks:
        if name not in values or not thr > 0:
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


# The seed name of the readiness gate, kept as an alias of the public API.
ProductionDebtZeROGate = ReadinessGate
