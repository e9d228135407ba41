"""This machine's ceilings, measured by torch: dense GEMM FLOP/s per dtype and memory bandwidth.

A CPU's peak depends on its cores, clocks, vector units and on how many threads a process runs,
none of which a portable API reports, so ds measures it: ``torch.matmul`` on square matrices grown
until one product takes long enough to saturate (the median of a few repeats at that size), and a
STREAM triad ``a = b + s * c`` on arrays far larger than the caches (bytes moved per second, the
median of a few repeats). Both run with the calling process's torch thread count (or the one
given), which is also part of the cache key: a rank of a 2-process job on 2 cores runs 1 thread
and is compared with what 1 thread can do. With 1 thread the time is the thread's CPU time, so a
busy shared machine does not lower the figure; with more, wall time.

Results are cached as JSON in ``$DS_PEAK_CACHE`` or ``~/.cache/ds/peak.json``
(``$XDG_CACHE_HOME`` respected), one entry per host, torch version and thread count. The cache
keeps the highest figure measured for each entry (a ceiling; a run on a busy machine does not
lower it); delete the file to start over.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
# One product must take at least this long at the size measured (a small one would not
# saturate the vector units or would be all overhead).
MIN_GEMM_S = 0.03


def dtype_key(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def cache_path() -> Path:
    if os.environ.get("DS_PEAK_CACHE"):
        return Path(os.environ["DS_PEAK_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ds" / "peak.json"


def cache_key(threads: int) -> str:
    return f"{socket.gethostname()} | torch {torch.__version__} | {threads} threads"


@contextmanager
def _threads(n: int | None) -> Iterator[int]:
    before = torch.get_num_threads()
    if n is not None and n != before:
        if n < 1:
            raise ValueError(f"threads = {n}: must be >= 1")
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _times(fn: Callable[[], object], repeat: int, warmup: bool = True) -> list[float]:
    # One thread: the thread's CPU time, so that other processes on a shared machine do not
    # lower the ceiling (the work runs in the calling thread). More threads: wall time.
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def measure_gemm(dtype: torch.dtype, max_n: int = 2048, repeat: int = 5) -> tuple[float, int]:
    """``(FLOP/s, n)``: ``n x n @ n x n`` products, ``n`` doubled from 256 until one takes
    ``MIN_GEMM_S`` or ``n`` reaches ``max_n``; the median of ``repeat`` at that size."""
    if max_n < 16:
        raise ValueError(f"max_n = {max_n}: must be >= 16 (the largest matrix side)")
    n = min(256, max_n)
    while True:
        product = functools.partial(
            torch.matmul, torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype),
            out=torch.empty(n, n, dtype=dtype),
        )  # fmt: skip
        times = _times(product, 1)
        if times[0] >= MIN_GEMM_S or n * 2 > max_n:
            break
        n *= 2
    times += _times(product, repeat - 1, warmup=False)
    return 2.0 * n**3 / statistics.median(times), n


def measure_bandwidth(mib: int = 128, repeat: int = 5) -> float:
    """Bytes per second of the STREAM triad ``a = b + s * c`` on float32 arrays of ``mib`` MiB
    each (2 reads and 1 write per element, no write-allocate traffic counted, as STREAM)."""
    if mib < 1:
        raise ValueError(f"mib = {mib}: must be >= 1 (the size of each array in MiB)")
    n = mib * 2**20 // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    t = statistics.median(_times(lambda: torch.add(b, c, alpha=3.0, out=a), max(1, repeat)))
    return 3 * n * 4 / t


def measure(
    threads: int | None = None,
    dtypes: Iterable[str] = tuple(DTYPES),
    bandwidth: bool = True,
    max_n: int = 2048,
    mib: int = 128,
    repeat: int = 5,
) -> dict[str, Any]:
    """A fresh measurement (not cached): ``{"threads", "flops": {dtype: FLOP/s}, "gemm_n",
    "bandwidth_bytes_per_s"}``."""
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; choose from {', '.join(DTYPES)}")
    out: dict[str, Any] = {"flops": {}, "gemm_n": {}}
    with _threads(threads) as n_threads, torch.no_grad():
        out["threads"] = n_threads
        for key in dtypes:
            out["flops"][key], out["gemm_n"][key] = measure_gemm(DTYPES[key], max_n, repeat)
        if bandwidth:
            out["bandwidth_bytes_per_s"] = measure_bandwidth(mib, repeat)
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The highest figure of each (a ceiling), with the matrix side it was measured at."""
    merged = dict(old, **{k: v for k, v in new.items() if k not in ("flops", "gemm_n")})
    flops, sides = dict(old.get("flops", {})), dict(old.get("gemm_n", {}))
    for key, value in new.get("flops", {}).items():
        if value > flops.get(key, 0.0):
            flops[key], sides[key] = value, new["gemm_n"][key]
    merged["flops"], merged["gemm_n"] = flops, sides
    bw = [x.get("bandwidth_bytes_per_s", 0.0) for x in (old, new)]
    if max(bw) > 0:
        merged["bandwidth_bytes_per_s"] = max(bw)
    return merged


def store(entry: dict[str, Any], path: Path | None = None) -> dict[str, Any]:
    """Merge ``entry`` (from :func:`measure`) into the cache; returns the cached entry."""
    path = path or cache_path()
    data = _read(path)
    key = cache_key(int(entry["threads"]))
    merged = _merge(data.get(key, {}), entry)
    merged.update(
        host=socket.gethostname(),
        torch=torch.__version__,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    data[key] = merged
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".peak-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)  # concurrent writers: the last one wins whole, never a torn file
    except OSError:
        pass  # a read-only home: measured again next time, still correct
    return merged


def cached(threads: int | None = None, path: Path | None = None) -> dict[str, Any] | None:
    """The cached entry for this host, torch version and thread count, or ``None``."""
    n = threads if threads is not None else torch.get_num_threads()
    entry = _read(path or cache_path()).get(cache_key(n))
    return entry if isinstance(entry, dict) else None


def ceiling(
    threads: int | None = None,
    dtypes: Iterable[str] = ("fp32",),
    bandwidth: bool = False,
) -> dict[str, Any]:
    """The cached ceilings, measuring (and caching) only what the cache lacks."""
    n = threads if threads is not None else torch.get_num_threads()
    entry = cached(n) or {}
    missing = [k for k in dtypes if not entry.get("flops", {}).get(k)]
    need_bw = bandwidth and not entry.get("bandwidth_bytes_per_s")
    if not missing and not need_bw:
        return entry
    return store(measure(n, missing, bandwidth=need_bw))
