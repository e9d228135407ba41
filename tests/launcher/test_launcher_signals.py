"""Signals reach the whole process tree and nothing is left behind."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.multiprocess


def _ds() -> list[str]:
    exe = Path(sys.executable).parent / "ds"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ds.launcher.cli"]


def _start(
    tmp_path: Path, env_for: Any, script: Path, *extra: str, **env: str
) -> tuple[Path, subprocess.Popen[str]]:
    """``ds run --nproc 2 script`` in ``tmp_path``; the ranks write their pids into the returned
    folder (``PID_DIR``)."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = subprocess.Popen(
        [*_ds(), "run", "--nproc", "2", *extra, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(PID_DIR=str(pid_dir), **env),
        cwd=tmp_path,
    )
    return pid_dir, proc


def _wait_pids(pid_dir: Path, proc: subprocess.Popen[str], n: int = 2) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = sorted(pid_dir.glob("rank*.pids"))
        if len(files) == n and all(f.read_text().endswith("\n") for f in files):
            return [int(p) for f in files for p in f.read_text().split()]
        if proc.poll() is not None:
            raise AssertionError(f"launcher exited early: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("ranks did not start within 60 s")


def _gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    left = pids
    while time.monotonic() < deadline:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left:
            break
        time.sleep(0.05)
    return left


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_leaves_no_orphans(
    tmp_path: Path,
    scripts: Path,
    env_for,
    sig: signal.Signals,  # type: ignore[no-untyped-def]
) -> None:
    pid_dir, proc = _start(tmp_path, env_for, scripts / "tree.py")
    pids = _wait_pids(pid_dir, proc)
    assert len(pids) == 6  # 2 ranks x (rank, child in its group, grandchild that left it)
    assert all(psutil.pid_exists(p) for p in pids)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert f"received {sig.name}" in err
    assert _gone(pids, within_s=5) == []


@pytest.mark.timeout(90)
def test_rank_ignoring_sigterm_is_killed_after_grace(
    tmp_path: Path, scripts: Path, env_for
) -> None:  # type: ignore[no-untyped-def]
    pid_dir, proc = _start(
        tmp_path, env_for, scripts / "tree.py", "--terminate_timeout", "1", IGNORE_TERM="1"
    )
    pids = _wait_pids(pid_dir, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert _gone(pids, within_s=5) == []


@pytest.mark.timeout(90)
def test_failure_of_one_rank_kills_other_trees(tmp_path: Path, scripts: Path, env_for) -> None:  # type: ignore[no-untyped-def]
    pid_dir, proc = _start(tmp_path, env_for, scripts / "tree.py")
    pids = _wait_pids(pid_dir, proc)
    rank1 = int((pid_dir / "rank1.pids").read_text().split()[0])
    psutil.Process(rank1).kill()
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 137
    assert "rank 1 (pid" in err and "killed by signal SIGKILL" in err
    assert _gone(pids, within_s=5) == []


@pytest.mark.timeout(90)
def test_ranks_die_with_a_killed_launcher(tmp_path: Path, scripts: Path, env_for) -> None:  # type: ignore[no-untyped-def]
    pid_dir, proc = _start(tmp_path, env_for, scripts / "tree.py")
    _wait_pids(pid_dir, proc)
    ranks = [int(f.read_text().split()[0]) for f in pid_dir.glob("rank*.pids")]
    proc.kill()  # SIGKILL: the launcher gets no chance to stop anything
    proc.communicate(timeout=30)
    assert _gone(ranks, within_s=5) == []
    # The ranks' own children are reparented; clean them up for the next tests.
    for f in pid_dir.glob("rank*.pids"):
        for pid in map(int, f.read_text().split()[1:]):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


_STUBBORN = """
import os, signal, subprocess, sys, time
from pathlib import Path
from typing import Any
# A grandchild that left the rank's session, ignores SIGTERM and holds the rank's stdout open.
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
g = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
d = Path(os.environ["PID_DIR"])
(d / f"rank{os.environ['RANK']}.pids").write_text(f"{os.getpid()} {g.pid}\\n")
print("ready", flush=True)
if os.environ["RANK"] == "1":
    while len(list(d.glob("rank*.pids"))) < 2:
        time.sleep(0.05)
    time.sleep(0.5)  # both grandchildren are up and ignoring SIGTERM
    (d / "failed_at").write_text(repr(time.time()))
    sys.exit(3)
while True:
    time.sleep(1)
"""


@pytest.mark.timeout(90)
def test_teardown_with_sigterm_ignoring_setsid_grandchildren_within_5_s(
    tmp_path: Path, env_for
) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "stubborn.py"
    script.write_text(_STUBBORN)
    pid_dir, proc = _start(tmp_path, env_for, script)
    pids = _wait_pids(pid_dir, proc, n=2)
    _out, err = proc.communicate(timeout=60)
    ended = time.time()
    failed_at = float((pid_dir / "failed_at").read_text())
    assert proc.returncode == 3, err
    assert ended - failed_at < 5.0, f"teardown took {ended - failed_at:.2f} s"
    assert "rank 1 (pid" in err and "ready" in err  # the failed rank's last words are kept
    assert _gone(pids, within_s=1) == []
