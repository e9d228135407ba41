"""The suite's rank launcher: a rank forked from the zygote behaves as ``python script.py`` would
(arguments, environment, working directory, ``sys.path[0]``, output, exit status, exit
handlers, non-daemon threads, the OpenMP thread count), and a rank past its deadline is killed."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from world import run_ranks, world_env
from zygote import Zygote

SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    import torch
    rank = int(sys.argv[1])
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0], flush=True)
    print("env", os.environ.get("DS_PROBE"), "threads", torch.get_num_threads(), flush=True)
    print("parent", os.getppid(), flush=True)
    print("to stderr", file=sys.stderr)
    atexit.register(lambda: print("atexit ran", flush=True))
    def late():
        time.sleep(0.3)
        print("thread joined", flush=True)
    threading.Thread(target=late).start()
    if rank == 1:
        raise SystemExit(3)
    if rank == 2:
        time.sleep(60)
    """
)


def _run(tmp_path: Path, world: int, timeout: float, threads: str = "1") -> list:
    script = tmp_path / "sub" / "probe.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    env = world_env({"DS_PROBE": "yes", "OMP_NUM_THREADS": threads})
    return run_ranks(
        lambda r: [str(script), str(r)], world, timeout=timeout, env=env, merge_stderr=False
    )


@pytest.mark.parametrize("zygote", ["1", "0"])
def test_a_rank_runs_as_python_would(zygote: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DS_TEST_ZYGOTE", zygote)
    monkeypatch.chdir(tmp_path)
    ok, failed = _run(tmp_path, 2, timeout=120)
    assert ok.returncode == 0 and failed.returncode == 3
    sub = str(tmp_path / "sub")
    assert f"argv ['0'] cwd {tmp_path} path0 {sub}" in ok.stdout
    assert "env yes threads 1" in ok.stdout
    forked = f"parent {os.getpid()}" not in ok.stdout  # a zygote's rank is its reaper's child
    assert forked == (zygote == "1")
    assert ok.stderr.strip() == "to stderr" and "to stderr" not in ok.stdout
    # The interpreter's exit: non-daemon threads joined, then the exit handlers.
    assert ok.stdout.index("thread joined") < ok.stdout.index("atexit ran")
    assert "atexit ran" in failed.stdout


def test_the_zygote_starts_ranks_that_ask_nothing_else_of_the_interpreter(tmp_path: Path) -> None:
    zygote = Zygote.get()
    assert zygote is not None
    script = str(tmp_path / "x.py")
    env = world_env()
    assert zygote.can_run([script], env)
    assert not zygote.can_run([script], {**env, "PYTHONPATH": str(tmp_path)})
    assert not zygote.can_run(["-c", "pass"], env)


def test_a_rank_past_its_deadline_is_killed(tmp_path: Path) -> None:
    # Ranks 0 and 1 end within a second of their fork; rank 2 sleeps 60 s.
    results = _run(tmp_path, 3, timeout=8)
    assert [r.returncode for r in results] == [0, 3, None]


def test_a_rank_asking_for_more_threads_gets_them(tmp_path: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core")
    (ok,) = _run(tmp_path, 1, timeout=120, threads="2")
    assert "threads 2" in ok.stdout, ok.stdout + ok.stderr


FILTERS = textwrap.dedent(
    """
    import os, warnings
    import torch, torch.distributed, transformers.modeling_utils
    print(os.getppid())
    print([(a, c.__name__, getattr(m, "pattern", m)) for a, _, c, m, _ in warnings.filters])
    warnings.warn("old", DeprecationWarning)
    """
)


def test_a_forked_rank_has_the_warning_filters_a_fresh_one_has(tmp_path: Path, monkeypatch) -> None:
    # PYTHONWARNINGS is read at interpreter start; a forked rank replays it.
    script = tmp_path / "filters.py"
    script.write_text(FILTERS)
    env = world_env({"PYTHONWARNINGS": "error::DeprecationWarning,ignore::FutureWarning"})
    seen = {}
    for zygote in ("1", "0"):
        monkeypatch.setenv("DS_TEST_ZYGOTE", zygote)
        (rank,) = run_ranks(lambda r: [str(script)], 1, timeout=120, env=env, merge_stderr=False)
        assert rank.returncode == 1 and "DeprecationWarning: old" in rank.stderr, rank
        parent, seen[zygote] = rank.stdout.split("\n", 1)
        assert (parent != str(os.getpid())) == (zygote == "1")  # "1": forked by the zygote
    assert seen["1"] == seen["0"] and "('error', 'DeprecationWarning', None)" in seen["1"]
