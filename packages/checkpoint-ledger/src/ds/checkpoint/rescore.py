"""``ds ledger rescore``: recompute every readiness assessment of a ledger from its recorded inputs.

Each ``readiness_assessment`` record carries the window of step inputs, the latency baseline and
the thresholds the gate used (``payload.inputs``). Recomputing the metrics and the score from
those alone, with the formulae of :mod:`ds.checkpoint.gate`, and comparing them with what was
recorded tells an auditor whether the gate's verdict follows from the measurements. (Whether the
records themselves are authentic is ``ds ledger verify``'s question.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

from ds.checkpoint.gate import FORMULA_VERSION, GateThresholds, assess, window_metrics
from ds.interfaces.errors import LedgerError


@dataclass(frozen=True)
class Rescore:
    index: int
    recorded_score: float
    score: float
    passed: bool
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def rescore_record(index: int, payload: dict[str, Any]) -> Rescore:
    inputs = payload.get("inputs")
    if not isinstance(inputs, dict):
        raise LedgerError(
            f"record {index}: this readiness_assessment records no inputs (written by a gate "
            "that did not record them); it cannot be recomputed"
        )
    formula = inputs.get("formula", 1)
    if formula != FORMULA_VERSION:
        raise LedgerError(
            f"record {index}: this readiness_assessment was computed with gate formula {formula}, "
            f"this ds-checkpoint-ledger computes formula {FORMULA_VERSION}; rescore it with the "
            "version that recorded it"
        )
    thresholds = GateThresholds(**inputs["thresholds"])
    window = inputs["window"]
    metrics = window_metrics(window, inputs["baseline_step_time_s"])
    a = assess(metrics, thresholds, len(window))
    problems = []
    recorded = payload.get("metrics", {})
    for name in sorted(set(metrics) | set(recorded)):
        if name not in metrics or name not in recorded or not _close(metrics[name], recorded[name]):
            problems.append(
                f"{name}: recorded {recorded.get(name)}, recomputed {metrics.get(name)}"
            )
    if not _close(a.score, float(payload.get("score", float("nan")))):
        problems.append(f"score: recorded {payload.get('score')}, recomputed {a.score}")
    if bool(payload.get("passed")) != a.passed:
        problems.append(f"passed: recorded {payload.get('passed')}, recomputed {a.passed}")
    return Rescore(
        index, float(payload.get("score", float("nan"))), a.score, a.passed, tuple(problems)
    )


def rescore_file(path: str) -> list[Rescore]:
    from ds.checkpoint.ledger import scan

    s = scan(path)
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[: s.records]
    out = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("kind") == "readiness_assessment":
            out.append(rescore_record(int(rec["i"]), rec["payload"]))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="ds ledger rescore",
        description="Recompute each readiness assessment from its recorded inputs; exit 1 if any "
        "recorded score or metric does not follow from them, 2 for bad input.",
    )
    p.add_argument("path")
    args = p.parse_args(argv)
    try:
        results = rescore_file(args.path)
    except (LedgerError, OSError, KeyError, TypeError, ValueError) as exc:
        print(f"error: {args.path}: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"error: {args.path}: no readiness_assessment records", file=sys.stderr)
        return 2
    bad = 0
    for r in results:
        verdict = "passed" if r.passed else "failed"
        if r.ok:
            print(f"record {r.index}: score {r.score:.3f} ({verdict}) recomputed, matches")
        else:
            bad += 1
            print(f"record {r.index}: MISMATCH: " + "; ".join(r.problems))
    return 1 if bad else 0
