"""Real launches through the multi-node engines that can run on this machine.

OpenMPI's mpirun, and ssh/pdsh against an sshd listening on the loopback interface. Each test
skips with the reason when its tool is not installed (apt-get install openmpi-bin pdsh
openssh-server openssh-client).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from world import free_port

from ds.launcher.runners.mpi import mpi_flavor

pytestmark = pytest.mark.multiprocess

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


@pytest.fixture(scope="module")
def loopback_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, list[str]]]:
    """An sshd on 127.0.0.1 accepting a throw-away key for the current user."""
    if SSHD is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("needs openssh-server and openssh-client (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "user_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True
        )
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
        "StrictModes no\nPermitRootLogin yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    opts = [
        "-i",
        str(d / "user_key"),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        # A real file, never /dev/null: ssh rewrites known-hosts files by rename, which would
        # replace the /dev/null device with a regular file for the whole machine.
        f"UserKnownHostsFile={d / 'known_hosts'}",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "LogLevel=ERROR",
    ]
    deadline = time.monotonic() + 15
    ok = False
    while time.monotonic() < deadline and proc.poll() is None:
        probe = subprocess.run(
            ["ssh", "-p", str(port), "-o", "BatchMode=yes", *opts, "127.0.0.1", "true"],
            capture_output=True,
            timeout=15,
        )
        if probe.returncode == 0:
            ok = True
            break
        time.sleep(0.2)
    if not ok:
        proc.kill()
        err = proc.communicate()[1].decode(errors="replace").strip().splitlines()[-1:]
        pytest.skip(f"cannot start a loopback sshd here: {err}")
    yield port, opts
    proc.terminate()
    proc.wait(timeout=10)


def _results(stdout: str) -> dict[int, str]:
    return {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r"RESULT rank=(\d+) world=\d+ sum=(\d+)", stdout)
    }


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_openmpi_launch_two_ranks(run_ds, scripts: Path, env_for) -> None:  # type: ignore[no-untyped-def]
    if mpi_flavor("mpirun") != "openmpi":
        pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)")
    env = env_for(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_plm_rsh_agent="false",
    )
    proc = run_ds("--launcher", "openmpi", "--nproc", "2", str(scripts / "mpi_rank.py"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = re.findall(r"MPIRESULT rank=(\d) world=2 sum=3 via=(\S+) discovered=(\S+)", proc.stdout)
    assert sorted(r for r, _, _ in lines) == ["0", "1"], proc.stdout
    for _, via, discovered in lines:
        if via == "ds.comm":
            assert discovered == "yes"


@pytest.mark.timeout(120)
def test_openmpi_rank_failure_propagates(run_ds, scripts: Path, env_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if mpi_flavor("mpirun") != "openmpi":
        pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)")
    env = env_for(CRASH_STAMP=str(tmp_path / "t"), OMPI_MCA_plm_rsh_agent="false")
    proc = run_ds("--launcher", "openmpi", "--nproc", "2", str(scripts / "crash.py"), env=env)
    assert proc.returncode != 0
    assert "ds run: openmpi (pid" in proc.stderr and "failed first" in proc.stderr


def _over_loopback(runner: str, tmp_path: Path, loopback_sshd: tuple[int, list[str]]) -> list[str]:
    """``ds run`` arguments that start two ranks through ``runner`` on this machine's loopback
    sshd (a one-host hostfile of 2 slots); skips where the runner is not installed."""
    if shutil.which(runner) is None:
        pytest.skip(f"needs {runner} (apt-get install {runner})")
    port, opts = loopback_sshd
    hf = tmp_path / "hostfile"
    hf.write_text("127.0.0.1 slots=2\n")
    extra = ["--launcher_args", " ".join(opts)] if runner == "ssh" else []
    return ["--hostfile", str(hf), "--launcher", runner, "--ssh_port", str(port), *extra]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("runner", ["ssh", "pdsh"])
def test_ssh_and_pdsh_launch_over_loopback(  # type: ignore[no-untyped-def]
    run_ds, scripts: Path, env_for, tmp_path: Path, loopback_sshd, runner: str
) -> None:
    over_ssh = _over_loopback(runner, tmp_path, loopback_sshd)
    (tmp_path / ".deepspeed_env").write_text("FROM_ENV_FILE=yes\n")  # propagated to every node
    env = env_for(PDSH_SSH_ARGS_APPEND=" ".join(loopback_sshd[1]))
    proc = run_ds(
        *over_ssh,
        "--env",
        "FOO=remote",
        str(scripts / "allreduce.py"),
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _results(proc.stdout) == {0: "3", 1: "3"}, proc.stdout
    assert proc.stdout.count("foo=remote") == 2
    assert proc.stdout.count("envfile=yes") == 2


def _running(pid: int) -> bool:
    import psutil

    try:  # a process can end between any two looks at it
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("runner", "sig"), [("ssh", "SIGKILL"), ("pdsh", "SIGTERM")])
def test_remote_ranks_stop_when_launcher_goes(  # type: ignore[no-untyped-def]
    scripts: Path, env_for, tmp_path: Path, loopback_sshd, runner: str, sig: str
) -> None:
    """ssh: the launcher is SIGKILLed (no clean-up at all); pdsh: it is stopped with SIGTERM and
    stops pdsh. Either way the remote agents notice the lost connection and stop their ranks."""
    import signal
    import sys

    import psutil

    over_ssh = _over_loopback(runner, tmp_path, loopback_sshd)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    exe = Path(sys.executable).parent / "ds"
    ds = [str(exe)] if exe.exists() else [sys.executable, "-m", "ds.launcher.cli"]
    launcher = subprocess.Popen(
        [
            *ds,
            "run",
            *over_ssh,
            "--env",
            f"PID_DIR={pid_dir}",
            str(scripts / "tree.py"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env_for(PDSH_SSH_ARGS_APPEND=" ".join(loopback_sshd[1])),
    )
    deadline = time.monotonic() + 60
    while len(list(pid_dir.glob("rank*.pids"))) < 2 and time.monotonic() < deadline:
        assert launcher.poll() is None, "launcher exited early"
        time.sleep(0.1)
    time.sleep(0.2)
    pids = [int(p) for f in pid_dir.glob("rank*.pids") for p in f.read_text().split()]
    assert len(pids) == 6
    clients = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
    launcher.send_signal(getattr(signal, sig))
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 15
    left = pids + clients
    while left and time.monotonic() < deadline:
        left = [p for p in left if _running(p)]
        time.sleep(0.1)
    assert left == [], f"still running after the launcher went: {left}"


@pytest.mark.timeout(180)
def test_openmpi_job_restarts_with_the_attempt_number(  # type: ignore[no-untyped-def]
    run_ds, scripts: Path, env_for, tmp_path: Path
) -> None:
    if mpi_flavor("mpirun") != "openmpi":
        pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)")
    env = env_for(
        CRASH_STAMP=str(tmp_path / "t"), CRASH_UNTIL_RESTART="1", OMPI_MCA_plm_rsh_agent="false"
    )
    proc = run_ds(
        "--launcher",
        "openmpi",
        "--nproc",
        "2",
        "--max_restarts",
        "1",
        "--log_dir",
        str(tmp_path / "logs"),
        str(scripts / "crash.py"),
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "restarting the whole group (1/1)" in proc.stderr
    assert "rank 1 succeeded on attempt 1" in proc.stdout
    assert "giving up on attempt 0" in (tmp_path / "logs" / "openmpi.log").read_text()
    assert "succeeded on attempt 1" in (tmp_path / "logs" / "openmpi.restart1.log").read_text()
