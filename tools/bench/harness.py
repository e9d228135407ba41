"""Common benchmark runner: median of N after warm-up, side-by-side peers, ratio columns, JSON.

Usage::

    from harness import Bench
    bench = Bench("optim", peer="torch-fused")
    bench.measure("ds", case="50M fp32 flat", fn=step_ds, repeat=20, warmup=3, work_bytes=nbytes)
    bench.measure("torch-fused", case="50M fp32 flat", fn=step_torch, repeat=20, warmup=3)
    bench.report()  # prints the table and writes bench-results/optim.json

``interleave`` runs several implementations round-robin so a noisy, shared machine hits all of them
alike (the only fair comparison when bandwidth drifts within seconds).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS_DIR = Path(
    os.environ.get("DS_BENCH_DIR", Path(__file__).resolve().parents[2] / "bench-results")
)


@dataclass
class Result:
    impl: str
    case: str
    times_s: list[float]
    work_bytes: int | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def gbps(self) -> float | None:
        if not self.work_bytes:
            return None
        return self.work_bytes / self.median_s / 1e9


def _time(fn: Callable[[], object], repeat: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


class Bench:
    def __init__(self, name: str, peer: str | None = None, unit: str = "ms") -> None:
        self.name = name
        self.peer = peer
        self.unit = unit
        self.results: list[Result] = []

    def measure(
        self,
        impl: str,
        case: str,
        fn: Callable[[], object],
        repeat: int = 10,
        warmup: int = 2,
        work_bytes: int | None = None,
        **extra: float,
    ) -> Result:
        r = Result(impl, case, _time(fn, repeat, warmup), work_bytes, dict(extra))
        self.results.append(r)
        return r

    def add(
        self,
        impl: str,
        case: str,
        times_s: list[float],
        work_bytes: int | None = None,
        **extra: float,
    ) -> Result:
        """Record externally measured times (e.g. from subprocesses)."""
        r = Result(impl, case, list(times_s), work_bytes, dict(extra))
        self.results.append(r)
        return r

    def interleave(
        self,
        case: str,
        fns: Mapping[str, Callable[[], object]],
        rounds: int = 10,
        warmup: int = 2,
        work_bytes: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> dict[str, Result]:
        """``clock``: wall time by default; ``time.process_time`` measures the process's CPU
        seconds, which other load on a shared machine distorts less."""
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(rounds):
            for k, fn in fns.items():
                t0 = clock()
                fn()
                times[k].append(clock() - t0)
        return {k: self.add(k, case, v, work_bytes) for k, v in times.items()}

    # reporting -------------------------------------------------------------
    def _scale(self) -> float:
        return {"s": 1.0, "ms": 1e3, "us": 1e6}[self.unit]

    def table(self) -> str:
        cases: dict[str, list[Result]] = {}
        for r in self.results:
            cases.setdefault(r.case, []).append(r)
        extra_keys = sorted({k for r in self.results for k in r.extra})
        head = ["case", "impl", f"median ({self.unit})", "min", "GB/s"]
        if self.peer:
            head.append(f"ratio vs {self.peer}")
        head += extra_keys
        rows = [head]
        for case, rs in cases.items():
            peer = next((r for r in rs if r.impl == self.peer), None)
            for r in rs:
                row = [
                    case,
                    r.impl,
                    f"{r.median_s * self._scale():.3f}",
                    f"{min(r.times_s) * self._scale():.3f}",
                    f"{r.gbps:.2f}" if r.gbps is not None else "-",
                ]
                if self.peer:
                    row.append(f"{r.median_s / peer.median_s:.3f}x" if peer else "-")
                row += [f"{r.extra[k]:.4g}" if k in r.extra else "-" for k in extra_keys]
                rows.append(row)
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
        lines = [
            "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in rows
        ]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "bench": self.name,
            "peer": self.peer,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
            },
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": [dict(asdict(r), median_s=r.median_s, gbps=r.gbps) for r in self.results],
        }

    def report(self, path: Path | None = None) -> Path:
        print(f"\n## {self.name}\n")
        print(self.table())
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out = path or RESULTS_DIR / f"{self.name}.json"
        out.write_text(json.dumps(self.to_json(), indent=2))
        print(f"\nresults written to {out}")
        return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a benchmark world's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ceilings ------------------------------------------------------------------
def gemm_ceiling(threads: int = 1, dtype: str = "fp32") -> float:
    """This machine's GEMM FLOP/s at ``threads`` torch threads (``ds bench peak``'s cache,
    measured once when absent)."""
    from ds.monitor.ceiling import ceiling

    return float(ceiling(threads, dtypes=(dtype,))["flops"][dtype])


def bandwidth_ceiling(threads: int = 1) -> float:
    """This machine's memory bandwidth (STREAM triad, bytes/s) at ``threads`` torch threads."""
    from ds.monitor.ceiling import ceiling

    return float(ceiling(threads, dtypes=(), bandwidth=True)["bandwidth_bytes_per_s"])


def gpt_train_flops_per_token(nonembed_params: int, layers: int, d: int, seq: int) -> float:
    """Training FLOPs per token as PaLM's MFU counts them: 6 per non-embedding parameter (forward
    and backward matrix products) plus 12 x layers x d x seq for attention's two products."""
    return 6.0 * nonembed_params + 12.0 * layers * d * seq
