"""Byte-size and bandwidth formatting shared by the logger, watchdog and benchmarks."""

from __future__ import annotations


def fmt_bytes(n: int | float) -> str:
    """1536 -> '1.5 KiB'; exact powers print without decimals ('4 MiB')."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if value == int(value):
                return f"{int(value)} {unit}"
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - loop always returns


def fmt_gbps(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3f}"
