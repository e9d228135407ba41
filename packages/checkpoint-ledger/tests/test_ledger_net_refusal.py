"""A refused write to the rank-0 ledger writer leaves a trace even when nobody configured logging."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _forgery import refused_write

# The writer of a job whose application never configured logging: it prints its address, then
# serves until its stdin closes, then prints how many connections it refused.
_SERVER = """
import sys
from ds.checkpoint import _ledger_net
from ds.checkpoint.ledger import RunLedger
led = RunLedger(sys.argv[1])
server = _ledger_net.LedgerServer(led, bind="127.0.0.1")
print(server.address[1], flush=True)
sys.stdin.read()
print("refused", server.refused, "records", len(led), flush=True)
server.stop()
led.close()
"""


@pytest.mark.timeout(120)
def test_refused_writes_print_a_line_without_any_logging_configured(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_LEDGER_HOST", "MASTER_ADDR")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(tmp_path / "run.jsonl")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(3):
            refused_write("127.0.0.1", port)
        out, err = proc.communicate("", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.split() == ["refused", "3", "records", "0"]
    lines = [x for x in err.splitlines() if x.startswith("ds ledger: refused")]
    # Refusals 1 and 2 are printed, 3 is not (then 4, 8, ...: a flood cannot fill the log).
    assert len(lines) == 2, err
    assert "without the job secret (1 refused so far; ledger " in lines[0]
    assert "run.jsonl)" in lines[0] and "127.0.0.1:" in lines[0]
    assert "(2 refused so far" in lines[1]
