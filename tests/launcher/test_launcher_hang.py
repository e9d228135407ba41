"""A collective that never completes ends the job: real 2-rank ``ds run`` jobs on gloo.

Rank 1 skips an all-reduce and stays alive elsewhere, so nothing but a timeout can end the job.
Each job must end within its timeout plus 10 s of rank 0 entering the collective, with a non-zero
exit code and a summary naming the rank and the op.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ds.launcher.run_args import parse
from ds.launcher.run_cmd import agent_args, free_port, hang_timeout
from ds.launcher.runners.base import encode_hosts

from .conftest import clean_env

pytestmark = pytest.mark.multiprocess

TIMEOUT_S = 3.0


def _elapsed_since(stamp: Path) -> float:
    assert stamp.exists(), "rank 0 never reached the collective"
    return time.time() - float(stamp.read_text())


def _hang_env(env_for: Any, tmp_path: Path, api: str, **extra: str) -> tuple[Path, dict[str, str]]:
    """hang.py's environment: the API whose collective hangs, and the file rank 0 stamps on
    entering it (returned first)."""
    stamp = tmp_path / "entered"
    return stamp, env_for(HANG_API=api, HANG_STAMP=str(stamp), **extra)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("exit_how", ["raise", "sys_exit"])
def test_ds_comm_watchdog_timeout_ends_the_job(
    run_ds, scripts: Path, env_for, tmp_path: Path, exit_how: str
) -> None:  # type: ignore[no-untyped-def]
    stamp, env = _hang_env(
        env_for, tmp_path, "ds", HANG_WATCHDOG=str(TIMEOUT_S), HANG_EXIT=exit_how
    )
    proc = run_ds("--nproc", "2", str(scripts / "hang.py"), env=env, timeout=150)
    elapsed = _elapsed_since(stamp)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert elapsed <= TIMEOUT_S + 10, f"the job took {elapsed:.1f} s to end\n{proc.stderr}"
    assert "ds run: rank 0 (pid " in proc.stderr and "failed first: exit code 1" in proc.stderr
    assert "stopped the other process(es): rank 1" in proc.stderr
    # The rank's last words, repeated in the summary, say which op and which peer.
    summary = proc.stderr[proc.stderr.index("ds run: rank 0 (pid ") :]
    assert "rank 0 waited" in summary
    assert "in all_reduce(#2, 16 B) on group world (ranks 0..1)" in summary
    assert "ranks missing: 1 (last entered #1 all_reduce)" in summary
    assert "never gets here" not in proc.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["flag", "env"])
def test_launcher_collective_timeout_ends_a_raw_torch_hang(
    run_ds, scripts: Path, env_for, tmp_path: Path, how: str
) -> None:  # type: ignore[no-untyped-def]
    stamp, env = _hang_env(env_for, tmp_path, "torch")
    flags = ["--collective_timeout", f"{TIMEOUT_S:g}"]
    if how == "env":
        env["DS_COLLECTIVE_TIMEOUT"] = f"{TIMEOUT_S:g}"
        flags = []
    proc = run_ds(
        "--nproc",
        "2",
        "--log_dir",
        str(tmp_path / "logs"),
        *flags,
        str(scripts / "hang.py"),
        env=env,
        timeout=150,
    )
    elapsed = _elapsed_since(stamp)
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert elapsed <= TIMEOUT_S + 10, f"the job took {elapsed:.1f} s to end\n{proc.stderr}"
    lines = [x for x in proc.stderr.splitlines() if x.startswith("ds run: rank 0 (pid ")]
    assert len(lines) == 1, proc.stderr
    assert " hung: no progress for " in lines[0]
    assert "s in torch.distributed all_reduce (--collective_timeout 3)" in lines[0]
    assert lines[0].endswith("; meanwhile rank 1 not in a collective")
    assert "stopped the other process(es): rank 0, rank 1" in proc.stderr
    report = json.loads((tmp_path / "logs" / "failure.json").read_text())
    assert report["failed"] == "rank 0" and report["exit_code"] == 124
    assert "torch.distributed all_reduce" in report["hang"]


@pytest.mark.timeout(180)
def test_launcher_collective_timeout_ends_a_hang_at_interpreter_exit(
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Rank 0 bounds its own wait with torch (2 s), raises, and its interpreter then hangs at exit.
    stamp, env = _hang_env(env_for, tmp_path, "torch", HANG_WAIT_S="2")
    proc = run_ds("--nproc", "2", "--collective_timeout", "3", str(scripts / "hang.py"), env=env)
    elapsed = _elapsed_since(stamp)
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert elapsed <= 2 + TIMEOUT_S + 10, f"the job took {elapsed:.1f} s to end\n{proc.stderr}"
    line = next(x for x in proc.stderr.splitlines() if x.startswith("ds run: rank 0 (pid "))
    assert " hung: no progress for " in line
    assert "s in interpreter exit, after its script ended (--collective_timeout 3)" in line
    assert "RuntimeError" in proc.stderr  # the rank's own timeout, in its output


@pytest.mark.timeout(120)
def test_rank_hook_leaves_the_rank_environment_as_given(
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # A sitecustomize of the user's own, on the user's PYTHONPATH, still runs under the hook,
    # and the script, its imports and its children see the PYTHONPATH the user set.
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text("USER_SITECUSTOMIZE = True\n")
    env = env_for(PYTHONPATH=str(user))
    on = run_ds("--nproc", "2", "--collective_timeout", "30", str(scripts / "hook_env.py"), env=env)
    off = run_ds("--nproc", "2", str(scripts / "hook_env.py"), env=env)
    for proc, watched in ((on, True), (off, False)):
        assert proc.returncode == 0, proc.stderr
        lines = sorted(x for x in proc.stdout.splitlines() if " HOOK " in x)
        assert len(lines) == 2, proc.stdout
        for rank, line in enumerate(lines):
            assert line.split()[2:] == [
                f"pythonpath={user}",
                "heartbeat_env=False",
                "hook_on_path=False",
                "user_site=True",
                f"thread={watched}",
            ], (rank, line)


@pytest.mark.timeout(180)
def test_many_short_waits_are_not_a_hang(run_ds, scripts: Path, env_for) -> None:  # type: ignore[no-untyped-def]
    # Rank 0 waits ~8 x 0.8 s in all_reduce, longer than the timeout in total but never in one
    # call: each call is told apart, and so is the interpreter's exit, so the job runs to its end.
    env = env_for(SLOW_PEER_S="0.8")
    proc = run_ds(
        "--nproc", "2", "--collective_timeout", "5", str(scripts / "slow_peer.py"), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("RESULT sum=512") == 2, proc.stdout


@pytest.mark.timeout(60)
def test_multi_node_agents_get_the_timeout() -> None:
    args = parse(["--collective-timeout", "7.5", "t.py"])
    args.hang_timeout_s = hang_timeout(args)
    assert "--collective_timeout=7.5" in agent_args(args, None, [])
    off = parse(["--collective_timeout", "0", "t.py"])
    off.hang_timeout_s = hang_timeout(off)
    assert off.hang_timeout_s is None
    assert not [a for a in agent_args(off, None, []) if "collective" in a]


@pytest.mark.timeout(180)
def test_node_agent_ends_a_raw_torch_hang(scripts: Path, tmp_path: Path) -> None:
    # The per-node agent the pdsh and ssh runners start, run here directly for one node.
    stamp = tmp_path / "entered"
    agent = [
        sys.executable,
        "-m",
        "ds.launcher.agent",
        f"--world_info={encode_hosts({'localhost': [0, 1]})}",
        "--node_rank=0",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        f"--collective_timeout={TIMEOUT_S:g}",
        "--",
        sys.executable,
        "-u",
        str(scripts / "hang.py"),
    ]
    env = clean_env(HANG_API="torch", HANG_STAMP=str(stamp))
    proc = subprocess.run(agent, capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path)
    elapsed = _elapsed_since(stamp)
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert elapsed <= TIMEOUT_S + 10, f"the job took {elapsed:.1f} s to end\n{proc.stderr}"
    assert "ds agent localhost: rank 0 (pid " in proc.stderr
    assert "hung: no progress for " in proc.stderr and "torch.distributed all_reduce" in proc.stderr
    assert os.listdir(tmp_path) == ["entered"]  # nothing left behind in the working directory
