"""ds.interfaces is the floor: cheap to import and free of siblings and heavy libraries."""

import os
import subprocess
import sys

MODULES = [
    "ds.interfaces",
    "ds.interfaces.accelerator",
    "ds.interfaces.checkpoint",
    "ds.interfaces.comm",
    "ds.interfaces.errors",
    "ds.interfaces.inference",
    "ds.interfaces.kernels",
    "ds.interfaces.ledger",
    "ds.interfaces.logging",
    "ds.interfaces.registry",
    "ds.interfaces.runner",
    "ds.interfaces.telemetry",
    "ds.interfaces.training",
]

# The stdlib modules every torch program has already imported; the cost that matters is what
# ds.interfaces adds on top of them.
PRELOAD = "import typing, dataclasses, enum, logging, threading, functools, collections.abc"

PROBE = f"""
import sys, time
{PRELOAD}
t0 = time.process_time()
import {", ".join(MODULES)}
dt = time.process_time() - t0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "pydantic"))
siblings = sorted(m for m in sys.modules if m.startswith("ds.") and not m.startswith("ds.interfaces"))
print(dt, len(heavy), len(siblings), heavy[:3], siblings[:3])
"""


def _probe(pycache: str | None = None) -> tuple[float, int, int]:
    env = dict(os.environ)
    if pycache is not None:
        # An installed wheel imports from bytecode pip compiled at install time; a run with
        # PYTHONDONTWRITEBYTECODE set would time the compiler instead. Give the probes a private
        # bytecode cache so they import the way an installed ds does.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env
    )
    dt, heavy, siblings, *_ = out.stdout.split(" ", 3)
    return float(dt), int(heavy), int(siblings)


def test_import_imports_no_sibling_and_nothing_heavy():
    _, heavy, siblings = _probe()
    assert heavy == 0
    assert siblings == 0


def test_import_costs_under_50ms(tmp_path):
    # CPU time (not wall time) of 5 cold interpreter imports, median: a loaded, shared machine
    # stretches wall time but not the work the import does. The first probe fills the bytecode
    # cache and is not counted.
    _probe(str(tmp_path))
    times = sorted(_probe(str(tmp_path))[0] for _ in range(5))
    assert times[2] < 0.050, f"import ds.interfaces took {times[2] * 1e3:.1f} ms (median of 5)"
