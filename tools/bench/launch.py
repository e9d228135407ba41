"""Launch latency: `ds run --nproc 2` vs `torchrun --nproc_per_node 2`.

Measures, for each launcher, the time from starting the command to *both* ranks executing the
first line of user code ("ready"), and to the whole job having exited ("total"), with a user script
that does nothing else. Rounds are interleaved so machine noise hits both launchers alike. Also
measures the import time of the `ds` entry point (`ds --help`).

    .venv/bin/python tools/bench/launch.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import Bench

BIN = Path(sys.executable).parent
USER_SCRIPT = """\
import os, time
from pathlib import Path
Path(os.environ["BENCH_OUT"], "rank" + os.environ["RANK"]).write_text(repr(time.time()))
"""


def _one(cmd: list[str], script: Path, out: Path) -> tuple[float, float]:
    for f in out.glob("rank*"):
        f.unlink()
    env = {**os.environ, "BENCH_OUT": str(out)}
    t0 = time.time()
    subprocess.run(
        [*cmd, str(script)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    total = time.time() - t0
    stamps = [float(f.read_text()) for f in out.glob("rank*")]
    if len(stamps) != 2:
        raise RuntimeError(f"{cmd[0]}: expected 2 ranks to report, got {len(stamps)}")
    return max(stamps) - t0, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    launchers = {
        "ds run": [str(BIN / "ds"), "run", "--nproc", "2"],
        "torchrun": [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2"],
    }
    bench = Bench("launch", peer="torchrun", unit="ms")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        script = out / "user.py"
        script.write_text(USER_SCRIPT)
        for cmd in launchers.values():  # warm-up: page cache, .pyc files
            _one(cmd, script, out)
        ready: dict[str, list[float]] = {k: [] for k in launchers}
        total: dict[str, list[float]] = {k: [] for k in launchers}
        for _ in range(args.rounds):
            for name, cmd in launchers.items():
                r, t = _one(cmd, script, out)
                ready[name].append(r)
                total[name].append(t)
    for name in launchers:
        bench.add(name, "both ranks running user code", ready[name])
    for name in launchers:
        bench.add(name, "job start to exit (empty script)", total[name])
    cli: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        subprocess.run([str(BIN / "ds"), "--help"], check=True, stdout=subprocess.DEVNULL)
        cli.append(time.perf_counter() - t0)
    bench.add("ds --help", "CLI start-up (ds --help)", cli)
    bench.report()


if __name__ == "__main__":
    main()
