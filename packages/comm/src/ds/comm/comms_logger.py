"""Comms logger: count, latency, algorithmic and bus bandwidth per op and message size.

Configured like DeepSpeed's ``comms_logger`` section::

    {"comms_logger": {"enabled": true, "verbose": false, "prof_all": true,
                      "prof_ops": ["all_reduce"], "debug": false}}

``verbose`` logs every op as it completes; ``prof_all`` profiles every op, otherwise only those in
``prof_ops``; ``debug`` keys records by the calling function as well (``all_reduce | step``).

Bus bandwidth follows the usual convention (nccl-tests): algbw * 2(n-1)/n for all-reduce,
algbw * (n-1)/n for all-gather, reduce-scatter and all-to-all, algbw otherwise.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ds.comm._format import fmt_bytes
from ds.interfaces.logging import get_logger

if TYPE_CHECKING:
    from ds.comm.comms_logger_config import CommsLoggerConfig

log = get_logger(__name__)


def __getattr__(name: str) -> Any:
    # The pydantic model is imported on first use: pydantic costs ~0.4 s to import and most
    # processes never configure the logger.
    if name == "CommsLoggerConfig":
        from ds.comm.comms_logger_config import CommsLoggerConfig

        return CommsLoggerConfig
    raise AttributeError(name)


def bus_factor(op: str, n: int) -> float:
    if n <= 1:
        return 1.0
    if op.startswith("all_reduce"):
        return 2.0 * (n - 1) / n
    if op.startswith(("all_gather", "reduce_scatter", "all_to_all")):
        return (n - 1) / n
    return 1.0


@dataclass
class OpStats:
    count: int = 0
    latencies_s: list[float] = field(default_factory=list)
    group_size: int = 1

    def add(self, latency_s: float, group_size: int) -> None:
        self.count += 1
        self.latencies_s.append(latency_s)
        self.group_size = group_size


def _caller() -> str:
    # Skip frames inside ds.comm to name the user's function.
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("ds.comm"):
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_name if frame is not None else "?"


class CommsLogger:
    """Collects per-(op, message size) statistics; ``log_summary()`` prints the table."""

    def __init__(self, config: CommsLoggerConfig | dict[str, Any] | None = None) -> None:
        from ds.comm.comms_logger_config import CommsLoggerConfig

        if config is None:
            config = CommsLoggerConfig(enabled=True)
        elif isinstance(config, dict):
            config = CommsLoggerConfig(**config)
        self.config = config
        self._prof = frozenset(config.prof_ops)
        self.stats: dict[str, dict[int, OpStats]] = {}

    def wants(self, op: str) -> bool:
        c = self.config
        return c.enabled and (c.prof_all or op in self._prof)

    def record(self, op: str, nbytes: int, latency_s: float, group_size: int) -> None:
        name = f"{op} | {_caller()}" if self.config.debug else op
        by_size = self.stats.setdefault(name, {})
        entry = by_size.get(nbytes)
        if entry is None:
            entry = by_size[nbytes] = OpStats()
        entry.add(latency_s, group_size)
        if self.config.verbose:
            algbw = nbytes / latency_s if latency_s > 0 else 0.0
            log.info(
                "comm op",
                op=name,
                size=fmt_bytes(nbytes),
                latency_ms=round(latency_s * 1e3, 3),
                algbw_gbps=round(algbw / 1e9, 3),
                busbw_gbps=round(algbw * bus_factor(op, group_size) / 1e9, 3),
            )

    def reset(self) -> None:
        self.stats.clear()

    def rows(self) -> list[dict[str, Any]]:
        """One row per (op, message size): count, total/avg latency, algbw and busbw (GB/s)."""
        out = []
        for name in sorted(self.stats):
            for nbytes in sorted(self.stats[name]):
                s = self.stats[name][nbytes]
                avg = statistics.fmean(s.latencies_s)
                algbw = nbytes / avg if avg > 0 else 0.0
                out.append(
                    {
                        "op": name,
                        "bytes": nbytes,
                        "count": s.count,
                        "total_ms": sum(s.latencies_s) * 1e3,
                        "avg_ms": avg * 1e3,
                        "algbw_gbps": algbw / 1e9,
                        "busbw_gbps": algbw * bus_factor(name, s.group_size) / 1e9,
                    }
                )
        return out

    def summary(self) -> str:
        head = ["op", "size", "count", "total (ms)", "avg (ms)", "algbw (GB/s)", "busbw (GB/s)"]
        table = [head]
        for r in self.rows():
            table.append(
                [
                    r["op"],
                    fmt_bytes(r["bytes"]),
                    str(r["count"]),
                    f"{r['total_ms']:.3f}",
                    f"{r['avg_ms']:.3f}",
                    f"{r['algbw_gbps']:.3f}",
                    f"{r['busbw_gbps']:.3f}",
                ]
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def log_summary(
        self, rank: int = 0, ranks: tuple[int, ...] = (0,), file: IO[str] | None = None
    ) -> str:
        """Print the summary table on the listed ranks (rank 0 by default); return it everywhere."""
        text = self.summary()
        if rank in ranks:
            print(f"Comms summary (rank {rank})\n{text}", file=file or sys.stdout, flush=True)
        return text
