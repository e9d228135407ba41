"""Real jobs on this machine: gloo all-reduce, crash handling, restarts, logs, binding."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess


def results(stdout: str) -> dict[int, dict[str, str]]:
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"\[rank(\d+)\] RESULT (.*)", line)
        if m:
            fields = dict(kv.split("=", 1) for kv in m.group(2).split())
            out[int(m.group(1))] = fields
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc", [2, 3])
def test_gloo_all_reduce(run_ds, scripts: Path, env_for, tmp_path: Path, nproc: int) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / ".ds_env").write_text("FROM_ENV_FILE=yes\n")
    proc = run_ds("--nproc", str(nproc), "--env", "FOO=bar", str(scripts / "allreduce.py"))
    assert proc.returncode == 0, proc.stderr
    res = results(proc.stdout)
    assert sorted(res) == list(range(nproc))
    cores = len(os.sched_getaffinity(0))
    for rank, f in res.items():
        assert f["rank"] == str(rank)
        assert f["world"] == str(nproc)
        assert f["sum"] == str(nproc * (nproc + 1) // 2)
        assert f["local"] == str(rank) and f["local_world"] == str(nproc) and f["node"] == "0"
        # Threads per rank never oversubscribe the cores, and torch follows the setting.
        assert f["omp"] == f["threads"] == str(max(1, cores // nproc))
        assert f["foo"] == "bar"
        assert f["envfile"] == "yes"


@pytest.mark.timeout(60)
def test_crash_stops_everyone_within_5s_and_reports(
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    stamp = tmp_path / "crash_time"
    proc = run_ds(
        "--nproc",
        "3",
        "--log_dir",
        str(tmp_path / "logs"),
        str(scripts / "crash.py"),
        env=env_for(CRASH_STAMP=str(stamp)),
    )
    ended = time.time()
    assert proc.returncode == 7
    crashed = float(stamp.read_text())
    assert ended - crashed < 5.0, f"job took {ended - crashed:.1f}s to stop after the crash"
    err = proc.stderr
    assert "rank 1 (pid " in err and "failed first: exit code 7" in err
    assert "stopped the other process(es): rank 0, rank 2" in err
    assert "    rank 1 giving up on attempt 0" in err
    assert "    second to last line" in err
    assert "[rank1] rank 1 giving up on attempt 0" in proc.stdout
    report = json.loads((tmp_path / "logs" / "failure.json").read_text())
    assert report["failed"] == "rank 1" and report["exit_code"] == 7
    # stdout and stderr are separate pipes: their relative order is not defined.
    assert sorted(report["tail"][-2:]) == ["rank 1 giving up on attempt 0", "second to last line"]
    log1 = (tmp_path / "logs" / "rank1.log").read_text()
    assert "giving up" in log1 and "second to last line" in log1
    assert (tmp_path / "logs" / "rank0.log").exists()


@pytest.mark.timeout(60)
def test_rank_killed_by_signal_is_reported(run_ds, scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_ds(
        "--nproc",
        "2",
        str(scripts / "crash.py"),
        env=env_for(CRASH_STAMP=str(tmp_path / "t"), CRASH_SIGNAL="9"),
    )
    assert proc.returncode == 128 + 9
    assert "failed first: killed by signal SIGKILL (9)" in proc.stderr


def _crash_with_one_restart(run_ds, scripts: Path, env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Two ranks of crash.py (rank 1 exits 7 until restart CRASH_UNTIL_RESTART) with one restart."""
    return run_ds("--nproc", "2", "--max_restarts", "1", str(scripts / "crash.py"), env=env)


@pytest.mark.timeout(90)
def test_max_restarts_restarts_once_then_succeeds(
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    env = env_for(CRASH_STAMP=str(tmp_path / "t"), CRASH_UNTIL_RESTART="1")
    proc = _crash_with_one_restart(run_ds, scripts, env)
    assert proc.returncode == 0, proc.stderr
    assert "restarting the whole group (1/1)" in proc.stderr
    assert "[rank0] rank 0 succeeded on attempt 1" in proc.stdout
    assert "[rank1] rank 1 succeeded on attempt 1" in proc.stdout


@pytest.mark.timeout(90)
def test_restart_budget_exhausted(run_ds, scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = _crash_with_one_restart(run_ds, scripts, env_for(CRASH_STAMP=str(tmp_path / "t")))
    assert proc.returncode == 7
    assert proc.stderr.count("failed first: exit code 7") == 2
    assert "[rank1] rank 1 giving up on attempt 1" in proc.stdout


@pytest.mark.timeout(60)
def test_module_flag(run_ds, scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(
        "import os, sys\nprint('MOD', os.environ['RANK'], sys.argv[1:], __name__)\n"
    )
    proc = run_ds(
        "--nproc",
        "2",
        "--module",
        "mypkg.job",
        "--flag",
        "x",
        env=env_for(PYTHONPATH=str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr
    assert "[rank0] MOD 0 ['--flag', 'x'] __main__" in proc.stdout
    assert "[rank1] MOD 1 ['--flag', 'x'] __main__" in proc.stdout


@pytest.mark.timeout(60)
def test_bind_cores_to_rank(run_ds, scripts: Path, env_for) -> None:  # type: ignore[no-untyped-def]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("core binding needs at least 2 usable cores")
    proc = run_ds("--nproc", "2", "--bind_cores_to_rank", str(scripts / "affinity.py"))
    assert proc.returncode == 0, proc.stderr
    seen = dict(re.findall(r"CPUS rank=(\d) cpus=(\[[\d, ]+\])", proc.stdout))
    half = len(cores) // 2
    assert seen["0"] == str(cores[:half]) and seen["1"] == str(cores[half : 2 * half])
    assert f"omp={half}" in proc.stdout


def _slots_1_and_3_of_4(tmp_path: Path) -> list[str]:
    """``ds run`` arguments that start ranks on slots 1 and 3 of a 4-slot localhost hostfile."""
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=4\n")
    return ["--hostfile", str(hf), "--include", "localhost:1,3"]


@pytest.mark.timeout(60)
def test_deepspeed_flag_spellings(run_ds, scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_ds(
        *_slots_1_and_3_of_4(tmp_path),
        "--enable_each_rank_log",
        str(tmp_path / "each"),
        "--master_port",
        "0",
        "--no_local_rank",
        str(scripts / "affinity.py"),
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "each").iterdir()) == ["rank0.log", "rank1.log"]


@pytest.mark.timeout(60)
def test_device_visibility_follows_selected_slots(  # type: ignore[no-untyped-def]
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:
    # Four devices visible (simulated by the visibility list: there is no GPU here).
    proc = run_ds(
        *_slots_1_and_3_of_4(tmp_path),
        "--save_pid",
        str(scripts / "affinity.py"),
        env=env_for(DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES="0,1,2,3"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("visible=1,3") == 2
    # A list the user set is indexed by the slots, not replaced by them.
    own = run_ds(
        "--include",
        "localhost:1,3",
        str(scripts / "affinity.py"),
        env=env_for(DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES="4,5,6,7"),
    )
    assert own.returncode == 0, own.stderr
    assert own.stdout.count("visible=5,7") == 2
    cpu = run_ds("--nproc", "2", str(scripts / "affinity.py"), env=env_for(DS_ACCELERATOR="cpu"))
    assert cpu.returncode == 0, cpu.stderr
    assert cpu.stdout.count("visible=-") == 2


@pytest.mark.timeout(120)
def test_no_ssh_runs_one_node_per_command(scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two `ds run --no_ssh --node_rank N` commands form one 3-rank job, as on two hosts."""
    import socket
    import subprocess
    import sys

    hf = tmp_path / "hostfile"
    hf.write_text("node-a slots=2\nnode-b slots=1\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "ds"
    ds = [str(exe)] if exe.exists() else [sys.executable, "-m", "ds.launcher.cli"]
    procs = [
        subprocess.Popen(
            [
                *ds,
                "run",
                "--hostfile",
                str(hf),
                "--no_ssh",
                "--node_rank",
                str(n),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(scripts / "allreduce.py"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_for(),
            cwd=tmp_path,
        )
        for n in (0, 1)
    ]
    outs = [p.communicate(timeout=100) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    res0, res1 = results(outs[0][0]), results(outs[1][0])
    assert sorted(res0) == [0, 1] and sorted(res1) == [2]
    assert all(f["world"] == "3" and f["sum"] == "6" for f in [*res0.values(), *res1.values()])
    assert res1[2]["node"] == "1" and res1[2]["local"] == "0" and res1[2]["local_world"] == "1"


@pytest.mark.timeout(60)
def test_no_ssh_needs_rendezvous(run_ds, scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hf = tmp_path / "hostfile"
    hf.write_text("node-a slots=1\nnode-b slots=1\n")
    proc = run_ds("--hostfile", str(hf), "--no_ssh", "--node_rank", "1", str(scripts / "marker.py"))
    assert proc.returncode == 2
    assert "needs --master_addr and --master_port" in proc.stderr


@pytest.mark.timeout(60)
def test_more_ranks_than_visible_devices_is_refused_before_start(  # type: ignore[no-untyped-def]
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    proc = run_ds(
        "--nproc",
        "8",
        str(scripts / "marker.py"),
        env=env_for(DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES="0,1", MARKER=str(marker)),
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--nproc 8 needs 8 cuda device(s)" in lines[0] and "but 2 are visible" in lines[0]
    assert not marker.exists() and proc.stdout == ""
