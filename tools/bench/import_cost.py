"""Cold-import CPU time of ds.interfaces and of ``ds.full`` (what ``import deepspeed`` through the
shim costs), with ``import torch`` as the reference: what a process pays before any work.

Each sample is a fresh interpreter importing from bytecode (a private cache, filled by a first
uncounted import), timed with ``process_time`` inside the child so machine load stretches it
less than wall time. Rounds are interleaved across the three imports; medians are reported.

    .venv/bin/python tools/bench/import_cost.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench

# The stdlib every torch program has imported already; the cost that matters is the rest.
PRELOAD = "import typing, dataclasses, enum, logging, threading, functools, collections.abc"
IMPORTS = {
    "ds.interfaces": "import ds.interfaces, ds.interfaces.training, ds.interfaces.comm",
    "ds.full": "import ds.full",
    "torch": "import torch",
}


def _cpu_seconds(statement: str, cache: str) -> float:
    code = f"import time\n{PRELOAD}\nt0 = time.process_time()\n{statement}\n"
    code += "print(time.process_time() - t0)"
    env = dict(os.environ, PYTHONPYCACHEPREFIX=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    bench = Bench("import_cost", peer="torch")
    with tempfile.TemporaryDirectory() as cache:
        for stmt in IMPORTS.values():
            _cpu_seconds(stmt, cache)  # fills the bytecode cache
        times: dict[str, list[float]] = {k: [] for k in IMPORTS}
        for _ in range(args.rounds):
            for name, stmt in IMPORTS.items():
                times[name].append(_cpu_seconds(stmt, cache))
    for name, ts in times.items():
        bench.add(name, "cold import (CPU time)", ts)
    print(f"load average: {os.getloadavg()}")
    bench.report()


if __name__ == "__main__":
    main()
