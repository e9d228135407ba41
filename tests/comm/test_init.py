"""init_distributed: single process, env switches, incomplete env, explicit ranks, torch spelling."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import WORKERS, _base_env, launch, ok_or_report


def _run_one(case: str, extra_env: dict[str, str]) -> dict:
    env = _base_env()
    env.update(extra_env)
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "init_cases.py"), case],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_no_environment_is_a_single_process_group_with_env_switches():
    seen = _run_one("single", {"DS_COMM_WATCHDOG": "30", "DS_COMM_DEBUG": "1"})
    assert (seen["source"], seen["rank"], seen["world"]) == ("single", 0, 1)
    assert seen["sum"] == [1.0, 1.0]
    assert seen["again"] is None  # idempotent
    assert seen["exported"] == ["0", "1", "127.0.0.1"]
    assert seen["watchdog_timeout"] == 30.0
    assert seen["check_consistency"] is True


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_incomplete_env_is_a_config_error_and_torch_spelling_works():
    seen = _run_one("incomplete_then_torch_spelling", {"RANK": "0"})
    assert "RANK is set but WORLD_SIZE is not" in seen["error"]
    assert seen["after"] == [2.0, 2.0, 2.0]
    assert seen["initialized"] is True


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_explicit_rank_and_world_size():
    rank_env = [
        {"TEST_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}"} for r in range(2)
    ]
    res = launch("init_cases.py", 2, rank_env=rank_env, args=["explicit"], timeout=100)
    ok_or_report(res)
    for r, rr in enumerate(res):
        seen = json.loads(rr.stdout.strip().splitlines()[-1])
        assert seen == {
            "source": "explicit",
            "rank": r,
            "sum": 3.0,
            "watchdog_timeout": 12.0,  # from the config's "comm" section, applied after init
            "logged": [["all_reduce", 1]],
        }
