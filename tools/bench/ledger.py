"""Run-ledger append and verify rates, vs a bare hash-chained JSON-lines log as the peer.

The peer does the minimum a hash chain needs (canonical JSON, SHA-256, one write per record); ds
adds the Merkle leaf and tree update and flushes every record to the OS. ``fsync`` mode makes each
record power-loss durable and is measured on fewer events.

``--baseline REV`` (default: the ledger before it took a writer lock, cut failed appends back and
signed heads at every commit point) loads ``ledger.py`` as it was at that git revision and measures
it in the same run, interleaved round by round with the current one, so the two are side by side
under the same machine load.

``reopen``: a writer opening an existing signed ledger (one head per 1000 records, as a run with
frequent checkpoints has), reported per million records: as it is (resumed from the writer's
sealed state: one SHA-256 pass over the file, no record parsed), the same writer with the state
moved aside (the full check: every record parsed, re-encoded and hashed), and the ledger before
the writer verified anything on reopen (``--reopen-baseline``), interleaved round by round;
``--reopen-sizes 100000,1000000`` measures several sizes, ``--full-rounds`` caps the rounds of
the two slow ones.

    .venv/bin/python tools/bench/ledger.py [--events 50000] [--baseline REV] [--reopen-baseline REV]
        [--only-reopen] [--reopen-sizes N,...] [--full-rounds K]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
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


def _reopen_case(bench: Bench, d: str, n: int, rounds: int, rev: str, full_rounds: int) -> None:
    from ds.checkpoint import _reopen, _resume, signing

    key = signing.generate_key_hex()
    path = os.path.join(d, f"reopen{n}.jsonl")
    with RunLedger(path, signing_key=key) as led:
        for i in range(n):
            led.record_training_event("step", _payload(i))
            if i % 1000 == 999:
                led.tree_head()
    state = _resume.state_path(path)

    def full_check(p: str, **kw: object) -> RunLedger:  # the reopen without its sealed state
        os.replace(state, state + ".aside")
        try:
            return RunLedger(p, **kw)  # type: ignore[arg-type]
        finally:
            os.replace(state + ".aside", state)

    before = f"ds before ({rev[:7]})"
    impls = {"ds": RunLedger, "ds: full check (no sealed state)": full_check}
    base = _baseline_module(rev)
    impls[before] = getattr(base, "RunLedger", None) or base.TechnicalDueDiligenceLedger
    times: dict[str, list[float]] = {k: [] for k in impls}
    for r in range(max(rounds, full_rounds)):
        for name, cls in impls.items():
            if name != "ds" and r >= full_rounds:
                continue
            t0 = time.perf_counter()
            led = cls(path, signing_key=key)
            times[name].append(time.perf_counter() - t0)
            led.close_local()
    # The verification alone: the sealed state's digest over the file prefix, the heads, the
    # records after the state (none here: the last head sealed them all), the reopen check.
    mac = signing.seal_key(signing.load_private_key(key))
    check: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        got = _resume.open_scan(path, mac)
        assert got is not None
        _reopen.check(path, got[0], got[1], signing.load_private_key(key), got[2])
        check.append(time.perf_counter() - t0)
    times["ds: verification alone"] = check
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    for name, ts in times.items():
        bench.add(name, f"reopen {n} signed records", ts, s_per_million=med[name] * 1e6 / n)
    print(
        f"reopen {n}: {med['ds'] * 1e6 / n:.3f} s per million records (verification alone "
        f"{med['ds: verification alone'] * 1e6 / n:.3f}); full check "
        f"{med['ds: full check (no sealed state)'] * 1e6 / n:.1f}, before "
        f"{med[before] * 1e6 / n:.1f}; {os.path.getsize(path) / n:.0f} bytes per record; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the 'before' ledger")
    ap.add_argument("--reopen-baseline", default=REOPEN_BASELINE, help="'before' for reopen")
    ap.add_argument("--only-reopen", action="store_true", help="measure the reopen case alone")
    ap.add_argument(
        "--reopen-sizes",
        default="",
        help="comma-separated ledger sizes for reopen (default: --events)",
    )
    ap.add_argument(
        "--full-rounds",
        type=int,
        default=0,
        help="rounds of the full-scan reopens (default --rounds)",
    )
    args = ap.parse_args()
    n = args.events
    sizes = [int(x) for x in args.reopen_sizes.split(",") if x] or [n]
    full_rounds = args.full_rounds or args.rounds
    if args.only_reopen:
        bench = Bench("ledger_reopen", unit="s")
        for size in sizes:
            d = tempfile.mkdtemp(prefix="ds-ledger-bench-")
            _reopen_case(bench, d, size, args.rounds, args.reopen_baseline, full_rounds)
            shutil.rmtree(d)
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
    for size in sizes:
        _reopen_case(bench, d, size, args.rounds, args.reopen_baseline, full_rounds)
    bench.report()


if __name__ == "__main__":
    main()
