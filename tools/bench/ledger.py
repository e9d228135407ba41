"""Run-ledger append and verify rates, vs a bare hash-chained JSON-lines log as the peer.

The peer does the minimum a hash chain needs (canonical JSON, SHA-256, one write per record); ds
adds the Merkle leaf and tree update and flushes every record to the OS. ``fsync`` mode makes each
record power-loss durable and is measured on fewer events.

    .venv/bin/python tools/bench/ledger.py [--events 50000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench

from ds.checkpoint.ledger import TechnicalDueDiligenceLedger, verify_file


def _payload(i: int) -> dict[str, object]:
    return {"step": i, "loss": 2.5 / (i + 1), "lr": 3e-4, "grad_norm": 0.9, "samples": 64}


def _ds(path: str, n: int, fsync: bool = False) -> float:
    led = TechnicalDueDiligenceLedger(path, fsync=fsync)
    t0 = time.perf_counter()
    for i in range(n):
        led.record_training_event("step", _payload(i))
    dt = time.perf_counter() - t0
    led.close()
    return dt


def _plain_chain(path: str, n: int) -> float:
    prev = "0" * 64
    t0 = time.perf_counter()
    with open(path, "ab") as f:
        for i in range(n):
            body = json.dumps(
                {"i": i, "kind": "step", "payload": _payload(i), "prev": prev, "t": time.time()},
                sort_keys=True,
                separators=(",", ":"),
            )
            prev = hashlib.sha256(body.encode()).hexdigest()
            f.write(body.encode() + b"\n")
            f.flush()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.events
    bench = Bench("ledger", peer="plain-hash-chain", unit="s")
    d = tempfile.mkdtemp(prefix="ds-ledger-bench-")
    times: dict[str, list[float]] = {"ds": [], "plain-hash-chain": [], "ds verify": []}
    for r in range(args.rounds):
        p = os.path.join(d, f"ds{r}.jsonl")
        times["ds"].append(_ds(p, n))
        times["plain-hash-chain"].append(_plain_chain(os.path.join(d, f"plain{r}.jsonl"), n))
        t0 = time.perf_counter()
        assert verify_file(p).ok
        times["ds verify"].append(time.perf_counter() - t0)
    case = f"{n} step events"
    for impl in ("ds", "plain-hash-chain"):
        rate = n / sorted(times[impl])[len(times[impl]) // 2]
        bench.add(impl, f"append {case}", times[impl], events_per_s=rate)
    bench.add(
        "ds",
        f"verify {case}",
        times["ds verify"],
        events_per_s=n / sorted(times["ds verify"])[args.rounds // 2],
    )
    nf = max(200, n // 100)
    tf = [_ds(os.path.join(d, f"f{r}.jsonl"), nf, fsync=True) for r in range(3)]
    bench.add(
        "ds (fsync each record)", f"append {nf} step events", tf, events_per_s=nf / sorted(tf)[1]
    )
    bench.report()


if __name__ == "__main__":
    main()
