"""Run-ledger append and verify rates, vs a bare hash-chained JSON-lines log as the peer.

The peer does the minimum a hash chain needs (canonical JSON, SHA-256, one write per record); ds
adds the Merkle leaf and tree update and flushes every record to the OS. ``fsync`` mode makes each
record power-loss durable and is measured on fewer events.

``--baseline REV`` (default: the ledger before it took a writer lock, cut failed appends back and
signed heads at every commit point) loads ``ledger.py`` as it was at that git revision and measures
it in the same run, interleaved round by round with the current one, so the two are side by side
under the same machine load.

``reopen``: a writer opening an existing signed ledger (one head per 1000 records, as a run with
frequent checkpoints has), before and after the writer verified the file against its heads and
seal on reopen (``--reopen-baseline``, default: the ledger before that check), side by side. The
difference is what the reopen verification costs; it is reported per million records.

    .venv/bin/python tools/bench/ledger.py [--events 50000] [--baseline REV] [--reopen-baseline REV]
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

from ds.checkpoint.ledger import RunLedger, verify_file

BASELINE = "731abe2725c0b91c1bd6c0133501f7a4a998e8b8"
REOPEN_BASELINE = "6a2b0354de6032813813116ed7e3cb8414a45ab9"
ROOT = Path(__file__).resolve().parents[2]


def _baseline_module(rev: str):  # type: ignore[no-untyped-def]
    """ds.checkpoint.ledger as it was at ``rev`` (its imports resolve to today's helpers)."""
    import subprocess
    import types

    src = subprocess.run(
        ["git", "show", f"{rev}:packages/checkpoint-ledger/src/ds/checkpoint/ledger.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    mod = types.ModuleType("ds_ledger_baseline")
    exec(compile(src, f"ledger.py@{rev[:7]}", "exec"), mod.__dict__)
    return mod


def _payload(i: int) -> dict[str, object]:
    return {"step": i, "loss": 2.5 / (i + 1), "lr": 3e-4, "grad_norm": 0.9, "samples": 64}


def _ds(path: str, n: int, fsync: bool = False, cls: type = RunLedger) -> float:
    led = cls(path, fsync=fsync)
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


def _reopen_case(bench: Bench, d: str, n: int, rounds: int, rev: str) -> None:
    from ds.checkpoint import signing

    key = signing.generate_key_hex()
    path = os.path.join(d, "reopen.jsonl")
    with RunLedger(path, signing_key=key) as led:
        for i in range(n):
            led.record_training_event("step", _payload(i))
            if i % 1000 == 999:
                led.tree_head()
    impls = {"ds": RunLedger, f"ds before ({rev[:7]})": None}
    impls[f"ds before ({rev[:7]})"] = _baseline_module(rev).RunLedger
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):
        for name, cls in impls.items():
            t0 = time.perf_counter()
            led = cls(path, signing_key=key)
            times[name].append(time.perf_counter() - t0)
            led.close_local()
    # The verification alone, without the chain scan both versions do: reading the heads, their
    # roots taken during the scan (O(log n) each), signatures, key chain, seal.
    from ds.checkpoint import _reopen
    from ds.checkpoint._verify import read_heads, scan

    heads = read_heads(path)
    s = scan(path, roots_at={h.size for h in heads})
    check: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        hs = read_heads(path)
        for _h in hs:  # what roots_at adds to the scan: one O(log n) root per head
            s.tree.root()
        _reopen.check(path, s, hs, signing.load_private_key(key))
        check.append(time.perf_counter() - t0)
    times["ds: verification alone"] = check
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    for name, ts in times.items():
        bench.add(name, f"reopen {n} signed records", ts, s_per_million=med[name] * 1e6 / n)
    now, before = med["ds"], med[f"ds before ({rev[:7]})"]
    alone = med["ds: verification alone"]
    print(
        f"reopen: verification alone {alone * 1e6 / n:.3f} s per million records; whole reopen "
        f"now - before {(now - before) * 1e6 / n:.3f} s per million (noise included)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the 'before' ledger")
    ap.add_argument("--reopen-baseline", default=REOPEN_BASELINE, help="'before' for reopen")
    ap.add_argument("--only-reopen", action="store_true", help="measure the reopen case alone")
    args = ap.parse_args()
    n = args.events
    if args.only_reopen:
        bench = Bench("ledger_reopen", unit="s")
        _reopen_case(
            bench, tempfile.mkdtemp(prefix="ds-ledger-bench-"), n, args.rounds, args.reopen_baseline
        )
        bench.report()
        return
    base = _baseline_module(args.baseline)
    before = f"ds before ({args.baseline[:7]})"
    bench = Bench("ledger", peer="plain-hash-chain", unit="s")
    d = tempfile.mkdtemp(prefix="ds-ledger-bench-")
    impls = {"ds": RunLedger, before: base.RunLedger}
    verifiers = {"ds": verify_file, before: base.verify_file}
    times: dict[str, list[float]] = {k: [] for k in [*impls, "plain-hash-chain"]}
    vtimes: dict[str, list[float]] = {k: [] for k in impls}
    for r in range(args.rounds):
        for name, cls in impls.items():
            p = os.path.join(d, f"{name[:9].replace(' ', '_')}{r}.jsonl")
            times[name].append(_ds(p, n, cls=cls))
            t0 = time.perf_counter()
            assert verifiers[name](p).ok
            vtimes[name].append(time.perf_counter() - t0)
        times["plain-hash-chain"].append(_plain_chain(os.path.join(d, f"plain{r}.jsonl"), n))
    case = f"{n} step events"
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    for impl, ts in times.items():
        bench.add(impl, f"append {case}", ts, events_per_s=n / med(ts))
    for impl, ts in vtimes.items():
        bench.add(impl, f"verify {case}", ts, events_per_s=n / med(ts))
    nf = max(200, n // 100)
    for name, cls in impls.items():
        tf = [
            _ds(os.path.join(d, f"f{name[:2]}{r}.jsonl"), nf, fsync=True, cls=cls) for r in range(3)
        ]
        bench.add(
            f"{name} (fsync each record)",
            f"append {nf} step events",
            tf,
            events_per_s=nf / sorted(tf)[1],
        )
    _reopen_case(bench, d, n, args.rounds, args.reopen_baseline)
    bench.report()


if __name__ == "__main__":
    main()
