"""After a collective times out, destroy_process_group returns and the rank exits with its own code
while the collective is still pending (gloo's destructor would otherwise join it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import launch


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["watchdog", "context", "handle"])
def test_rank_exits_after_a_timeout_while_the_collective_is_pending(
    tmp_path: Path, mode: str
) -> None:
    r0, r1 = launch("abandon.py", 2, args=[mode, str(tmp_path)], timeout=100, fresh=True)
    report = f"rank 0 rc={r0.returncode}\n{r0.stdout}\n{r0.stderr[-2000:]}\nrank 1 {r1.stdout}"
    assert r0.returncode == 3, report
    if mode == "handle":
        assert "timed out: RuntimeError: " in r0.stdout, report
    else:
        assert "timed out: CollectiveTimeoutError: rank 0 waited" in r0.stdout, report
        assert "all_reduce" in r0.stdout, report
    assert r0.stdout.rstrip().endswith("destroyed"), report
    assert r1.returncode == 0 and "peer gone while its collective was pending" in r1.stdout, report
