"""The inference benchmark's workload through `ds serve`: TTFT and per-token latency percentiles
at several client concurrencies (streaming completions over loopback HTTP).

Used by tools/bench/inference.py --http; runnable alone on a saved model directory:

    .venv/bin/python tools/bench/inference_http.py MODEL_DIR --clients 1 8 32 --requests 32
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness import free_port


def start_server(model_dir: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = free_port()
    ds = shutil.which("ds", path=str(Path(sys.executable).parent))
    cmd = [ds, "serve"] if ds else [sys.executable, "-m", "ds.inference.cli"]
    proc = subprocess.Popen(
        [*cmd, str(model_dir), "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"ds serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("ds serve did not start")
        time.sleep(0.5)


def _one(client: Any, prompt: list[int], max_tokens: int) -> tuple[float, list[float], int]:
    """TTFT, the gaps between later tokens, and the tokens received."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["ignore_eos"] = True
    with client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                n = len(json.loads(line[6:])["choices"][0]["token_ids"])
                stamps += [time.perf_counter()] * n
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return stamps[0] - t0, gaps, len(stamps)


def load(url: str, prompts: list[list[int]], outs: list[int], clients: int) -> dict[str, float]:
    """Send every request with ``clients`` concurrent connections; latency percentiles."""
    import httpx

    todo = list(range(len(prompts)))
    lock = threading.Lock()
    ttft: list[float] = []
    gaps: list[float] = []
    tokens = [0]

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=600) as c:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                first, g, n = _one(c, prompts[i], outs[i])
                with lock:
                    ttft.append(first)
                    gaps.extend(g)
                    tokens[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    def pct(xs: list[float], q: float) -> float:
        return (
            statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]
            if len(xs) > 1
            else xs[0]
        )

    return {
        "wall_s": wall,
        "tokens_per_s": tokens[0] / wall,
        "ttft_p50_ms": 1e3 * pct(ttft, 50),
        "ttft_p99_ms": 1e3 * pct(ttft, 99),
        "tpot_p50_ms": 1e3 * pct(gaps, 50),
        "tpot_p99_ms": 1e3 * pct(gaps, 99),
    }


def run(
    model_dir: Path,
    prompts: list[list[int]],
    outs: list[int],
    clients: list[int],
    server_args: list[str],
) -> list[tuple[int, dict[str, float]]]:
    proc, url = start_server(model_dir, server_args)
    try:
        load(url, prompts[:2], [4, 4], 2)  # warm-up
        return [(c, load(url, prompts, outs, c)) for c in clients]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def table(rows: list[tuple[int, dict[str, float]]], case: str) -> str:
    head = "| case | clients | wall (s) | output tok/s | TTFT p50 / p99 (ms) | per-token p50 / p99 (ms) |"
    lines = [head, "|---|---|---|---|---|---|"]
    for c, r in rows:
        lines.append(
            f"| {case} | {c} | {r['wall_s']:.1f} | {r['tokens_per_s']:.1f} | "
            f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
            f"{r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from inference import workload

    prompts, outs = workload(args.requests)
    # The same prompts at every client count: no prefix cache, or later counts would hit it.
    rows = run(args.model_dir, prompts, outs, args.clients, ["--no-enable-prefix-caching"])
    print(table(rows, f"{args.requests} req"))


if __name__ == "__main__":
    main()
