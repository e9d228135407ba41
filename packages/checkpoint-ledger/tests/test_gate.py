"""Readiness gate metrics from hand-computed telemetry."""

from __future__ import annotations

import pytest

from ds.checkpoint.gate import GateThresholds, ProductionDebtZeROGate, p99
from ds.interfaces.errors import ConfigError
from ds.interfaces.ledger import ReadinessGate
from ds.interfaces.telemetry import EventBus, StepMetrics

GIB = 1 << 30


def _step(i: int, t: float = 0.2, **kw: float) -> StepMetrics:
    return StepMetrics(step=i, loss=1.0, lr=1e-3, step_time_s=t, **kw)  # type: ignore[arg-type]


def test_is_a_readiness_gate() -> None:
    assert isinstance(ProductionDebtZeROGate(), ReadinessGate)


def test_clean_run_scores_high_with_no_findings() -> None:
    gate = ProductionDebtZeROGate()
    a = gate.evaluate_training_step(_step(0, 30.0))  # the warm-up step is not measured
    assert a.metrics == {} and a.passed
    for i in range(1, 50):
        a = gate.evaluate_training_step(
            _step(
                i,
                0.2,
                peak_host_rss_bytes=2 * GIB,
                host_memory_limit_bytes=64 * GIB,
                peak_device_bytes=8 * GIB,
                allotted_device_bytes=80 * GIB,
            )
        )
    assert a.findings == ()
    assert a.passed
    # ddi 0, zomm max(2/64, 8/80) = 0.1, p99 0.2 against 3 x the median 0.2: subscores
    # 1, 1 - 0.25 * 0.1 / 0.95, 1 - 0.25 / 3
    expected = 100 * (1 + (1 - 0.25 * 0.1 / 0.95) + (1 - 0.25 / 3)) / 3
    assert a.score == pytest.approx(expected, abs=1e-3)
    assert a.score > 90
    assert a.metrics["ddi"] == 0.0
    assert a.metrics["zomm"] == pytest.approx(8 / 80)


def test_offload_thrashing_run_reports_zomm_breach() -> None:
    gate = ProductionDebtZeROGate(warmup_steps=0)
    a = None
    for i in range(20):
        a = gate.evaluate_training_step(
            _step(
                i,
                0.3,
                offload_time_s=0.15,
                offload_in_bytes=GIB,
                offload_out_bytes=GIB,
                peak_host_rss_bytes=20 * GIB,
                host_memory_limit_bytes=20 * GIB + GIB // 2,  # a container's limit
                nvme_buffer_bytes=4 * GIB,
                peak_device_bytes=GIB,
                allotted_device_bytes=16 * GIB,
            )
        )
    assert a is not None
    assert a.metrics["zomm"] == pytest.approx(20 / 20.5)
    # O = 0.5 -> DDI = 100 * 0.35 * 0.5 = 17.5 > 12
    assert a.metrics["ddi"] == pytest.approx(17.5)
    crit = {f.metric for f in a.findings if f.severity == "critical"}
    assert crit == {"zomm", "ddi"}
    assert not a.passed
    zomm = next(f for f in a.findings if f.metric == "zomm")
    assert zomm.threshold == 0.95 and "of the limit it is killed at" in zomm.message
    assert a.score < 60


def test_ddi_components_hand_computed() -> None:
    gate = ProductionDebtZeROGate(baseline_steps=2, warmup_steps=0)
    gate.evaluate_training_step(_step(0, 0.1))
    gate.evaluate_training_step(_step(1, 0.1))
    # Two slow steps: window = [0.1, 0.1, 0.2, 0.2]; median 0.15 vs baseline 0.1 -> L = 0.5
    gate.evaluate_training_step(_step(2, 0.2, allgather_stall_s=0.04, sync_wait_s=0.02))
    a = gate.evaluate_training_step(_step(3, 0.2, allgather_stall_s=0.04, sync_wait_s=0.02))
    total = 0.6
    c, s = 0.08 / total, 0.04 / total
    assert a.metrics["ddi.allgather_stall"] == pytest.approx(c)
    assert a.metrics["ddi.sync_wait"] == pytest.approx(s)
    assert a.metrics["ddi.latency_degradation"] == pytest.approx(0.5)
    assert a.metrics["ddi"] == pytest.approx(100 * (0.25 * c + 0.25 * s + 0.15 * 0.5))


def test_p99_over_sliding_window() -> None:
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([0.1] * 99 + [5.0]) == 0.1
    assert p99([0.1] * 98 + [5.0, 5.0]) == 5.0
    gate = ProductionDebtZeROGate(window=10, warmup_steps=0)
    for i in range(9):
        gate.evaluate_training_step(_step(i, 0.1))
    a = gate.evaluate_training_step(_step(9, 1.0))  # a tail of 10x the median step
    assert a.metrics["p99_step_latency_s"] == 1.0
    crit = [f for f in a.findings if f.metric == "p99_step_latency_s"]
    assert crit and crit[0].severity == "critical" and crit[0].threshold == pytest.approx(0.3)
    for i in range(10, 20):  # the slow step slides out of the window
        a = gate.evaluate_training_step(_step(i, 0.1))
    assert a.metrics["p99_step_latency_s"] == pytest.approx(0.1)
    assert not any(f.metric == "p99_step_latency_s" for f in a.findings)
    # Uniformly slow steps (a bigger model) are no tail: only an absolute limit, if set, fails.
    slow = ProductionDebtZeROGate(warmup_steps=0)
    for i in range(20):
        a = slow.evaluate_training_step(_step(i, 9.0))
    assert a.passed and a.metrics["p99_step_latency_s"] == 9.0


def test_thresholds_are_configurable_and_warnings_precede_breaches() -> None:
    gate = ProductionDebtZeROGate(p99_step_latency_s_max=1.0, warmup_steps=0)
    a = gate.evaluate_training_step(_step(0, 0.95))
    assert [(f.metric, f.severity) for f in a.findings] == [("p99_step_latency_s", "warning")]
    assert a.passed
    with pytest.raises(ConfigError, match=r"gate\.window"):
        GateThresholds(window=0)
    with pytest.raises(ConfigError, match=r"gate\.p99_step_latency_s_max"):
        GateThresholds(p99_step_latency_s_max=-1.0)


def test_subscribes_to_the_event_bus() -> None:
    bus = EventBus()
    gate = ProductionDebtZeROGate(p99_step_latency_s_max=0.5)
    gate.attach(bus)
    for i in range(5):
        bus.publish(_step(i, 0.9))
    a = gate.report()
    assert a.metrics["p99_step_latency_s"] == 0.9 and not a.passed
    assert bus.errors == []


def test_report_is_recorded_in_the_ledger(tmp_path) -> None:
    import json

    from ds.checkpoint.ledger import RunLedger

    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        gate = ProductionDebtZeROGate(ledger=led, p99_step_latency_s_max=0.5, warmup_steps=0)
        gate.evaluate_training_step(_step(0, 0.9))
        a = gate.report()
    rec = json.loads((tmp_path / "l.jsonl").read_text().splitlines()[-1])
    assert rec["kind"] == "readiness_assessment"
    assert rec["payload"]["score"] == a.score and rec["payload"]["passed"] is False
    assert rec["payload"]["findings"][0]["metric"] == "p99_step_latency_s"


def test_waits_on_a_late_peer_name_it() -> None:
    """Exposed waits beyond the collectives' own cost fail the gate and name the late rank."""
    gate = ProductionDebtZeROGate(warmup_steps=0)
    for i in range(10):
        a = gate.evaluate_training_step(_step(i, 0.6, sync_wait_s=0.5, late_rank=1))
    assert a.metrics["late_rank"] == 1.0 and a.metrics["ddi.sync_wait"] == pytest.approx(5 / 6)
    ddi = next(f for f in a.findings if f.metric == "ddi")
    assert ddi.severity == "critical" and "on rank 1, which arrived last" in ddi.message
    healthy = ProductionDebtZeROGate(warmup_steps=0)
    for i in range(10):  # a late rank with nobody waiting on it is not blamed
        a = healthy.evaluate_training_step(_step(i, 0.6, late_rank=1))
    assert "late_rank" not in a.metrics and a.passed


def test_rescore_recomputes_only_the_formula_that_recorded(tmp_path) -> None:
    import json

    from ds.checkpoint.ledger import RunLedger
    from ds.checkpoint.rescore import rescore_record
    from ds.interfaces.errors import LedgerError

    with RunLedger(str(tmp_path / "l.jsonl")) as led:
        gate = ProductionDebtZeROGate(ledger=led)
        for i in range(6):
            gate.evaluate_training_step(_step(i, 0.3, sync_wait_s=0.2, late_rank=1))
        gate.report()
    rec = json.loads((tmp_path / "l.jsonl").read_text().splitlines()[-1])
    assert rescore_record(rec["i"], rec["payload"]).ok
    old = dict(rec["payload"], inputs={k: v for k, v in rec["payload"]["inputs"].items()
                                       if k != "formula"})  # fmt: skip
    with pytest.raises(LedgerError, match="gate formula 1, this ds-checkpoint-ledger computes"):
        rescore_record(rec["i"], old)
