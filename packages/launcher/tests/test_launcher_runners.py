"""The exact command lines each multi-node runner generates."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from ds.interfaces import registry
from ds.interfaces.errors import LaunchError
from ds.interfaces.runner import LaunchSpec, Runner
from ds.launcher.runners.base import decode_hosts, encode_hosts
from ds.launcher.runners.mpi import IMPIRunner, MPICHRunner, MVAPICHRunner, OpenMPIRunner
from ds.launcher.runners.pdsh import PdshRunner
from ds.launcher.runners.slurm import SlurmRunner
from ds.launcher.runners.ssh import SshRunner

PY = "/opt/py/bin/python"
USER = [PY, "-u", "train.py", "--lr", "0.1"]
SHIM = [PY, "-u", "-m", "ds.launcher.rankenv", "--", *USER]


def spec(**kw: object) -> LaunchSpec:
    base: dict[str, object] = {
        "hosts": {"n0": [0, 1], "n1": [0, 1]},
        "master_addr": "n0",
        "master_port": 29600,
        "user_command": USER,
        "env": {"NCCL_DEBUG": "INFO"},
        "launcher_args": ["--extra", "1"],
    }
    base.update(kw)
    return LaunchSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["pdsh", "ssh", "openmpi", "mpich", "impi", "mvapich", "slurm"])
def test_every_runner_is_registered_and_conforms(name: str) -> None:
    cls = registry.get(registry.RUNNERS, name)
    runner = cls()
    assert isinstance(runner, Runner)
    assert runner.name() == name
    assert isinstance(runner.backend_exists(), bool)


def test_world_info_roundtrip() -> None:
    hosts = {"a": [0, 2], "b-1.x": [1]}
    assert decode_hosts(encode_hosts(hosts)) == hosts


def test_pdsh_argv() -> None:
    r = PdshRunner(agent_args=["--terminate_timeout=3.0"], python=PY, cwd="/job dir")
    (cmd,) = r.get_cmd(spec())
    assert cmd[:8] == ["pdsh", "-S", "-f", "1024", "-R", "ssh", "-w", "n0,n1"]
    assert cmd[8:10] == ["--extra", "1"]
    assert len(cmd) == 11
    remote = cmd[10]
    assert remote.startswith("cd '/job dir'; export NCCL_DEBUG=INFO; ")
    agent = shlex.split(remote.split("; ")[-1])
    world = encode_hosts({"n0": [0, 1], "n1": [0, 1]})
    assert agent == [
        PY,
        "-u",
        "-m",
        "ds.launcher.agent",
        f"--world_info={world}",
        "--node_host=%h",
        "--master_addr=n0",
        "--master_port=29600",
        "--terminate_timeout=3.0",
        "--watch_output",
        "--",
        *USER,
    ]
    assert PdshRunner(ssh_port=2222).env() == {"PDSH_SSH_ARGS_APPEND": "-p 2222"}


def test_ssh_argv_one_per_node() -> None:
    r = SshRunner(python=PY, cwd="/job", ssh_port=2200)
    cmds = r.get_cmd(spec(launcher_args=[]))
    assert len(cmds) == 2
    for node_rank, (cmd, host) in enumerate(zip(cmds, ["n0", "n1"])):
        assert cmd[:6] == ["ssh", "-o", "BatchMode=yes", "-p", "2200", host]
        agent = shlex.split(cmd[6].split("; ")[-1])
        assert f"--node_rank={node_rank}" in agent
        assert "--watch_stdin" in agent and "--watch_output" in agent
        assert agent[agent.index("--") + 1 :] == USER


def test_openmpi_argv() -> None:
    (cmd,) = OpenMPIRunner(python=PY, as_root=True).get_cmd(spec())
    assert cmd == [
        "mpirun",
        "-n",
        "4",
        "--host",
        "n0:2,n1:2",
        "--allow-run-as-root",
        "--bind-to",
        "none",
        "--mca",
        "btl",
        "^openib",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "MASTER_ADDR=n0",
        "-x",
        "MASTER_PORT=29600",
        "--extra",
        "1",
        *SHIM,
    ]
    (cmd,) = OpenMPIRunner(python=PY, as_root=False).get_cmd(spec())
    assert "--allow-run-as-root" not in cmd


@pytest.mark.parametrize(("cls", "binary"), [(MPICHRunner, "mpiexec"), (IMPIRunner, "mpirun")])
def test_hydra_argv(cls: type, binary: str) -> None:
    (cmd,) = cls(python=PY).get_cmd(spec())
    extra = ["-genv", "I_MPI_PIN", "0"] if binary == "mpirun" else []
    assert cmd == [
        binary,
        "-n",
        "4",
        "-ppn",
        "2",
        "-hosts",
        "n0,n1",
        *extra,
        "-genv",
        "NCCL_DEBUG",
        "INFO",
        "-genv",
        "MASTER_ADDR",
        "n0",
        "-genv",
        "MASTER_PORT",
        "29600",
        "--extra",
        "1",
        *SHIM,
    ]


def test_mvapich_argv_and_hostfile(tmp_path: Path) -> None:
    r = MVAPICHRunner(python=PY, hostfile_dir=str(tmp_path))
    (cmd,) = r.get_cmd(spec())
    assert cmd[:3] == ["mpirun_rsh", "-np", "4"]
    assert cmd[3] == "-hostfile"
    assert Path(cmd[4]).read_text() == "n0\nn0\nn1\nn1\n"
    assert cmd[5:] == [
        "MV2_SUPPORT_DL=1",
        "MV2_ENABLE_AFFINITY=0",
        "NCCL_DEBUG=INFO",
        "MASTER_ADDR=n0",
        "MASTER_PORT=29600",
        "--extra",
        "1",
        *SHIM,
    ]


def test_slurm_argv() -> None:
    (cmd,) = SlurmRunner(python=PY).get_cmd(spec())
    assert cmd == [
        "srun",
        "-n",
        "4",
        "--nodes",
        "2",
        "--ntasks-per-node",
        "2",
        "--nodelist",
        "n0,n1",
        "--export",
        "ALL,NCCL_DEBUG=INFO,MASTER_ADDR=n0,MASTER_PORT=29600",
        "--extra",
        "1",
        *SHIM,
    ]
    with pytest.raises(LaunchError, match="commas"):
        SlurmRunner(python=PY).get_cmd(spec(env={"X": "a,b"}))


@pytest.mark.parametrize("cls", [OpenMPIRunner, MPICHRunner, IMPIRunner, SlurmRunner])
def test_mpi_like_runners_reject_uneven_or_picked_slots(cls: type) -> None:
    with pytest.raises(LaunchError, match="same number of slots"):
        cls(python=PY).get_cmd(spec(hosts={"n0": [0, 1], "n1": [0]}))
    with pytest.raises(LaunchError, match="cannot select individual slots"):
        cls(python=PY).get_cmd(spec(hosts={"n0": [1, 3], "n1": [0, 1]}))


def test_remote_shell_line_keeps_exported_values_through_bash() -> None:
    # The line pdsh and ssh hand to the remote shell: values with shell syntax in them (SLURM's
    # "64(x2)", spaces, quotes, $ and backticks) must arrive as they were, plain ones bare.
    import json
    import subprocess
    import sys

    from ds.launcher.runners.base import remote_shell

    env = {
        "SLURM_JOB_CPUS_PER_NODE": "64(x2)",
        "ODD": "a b \"c\" 'd' $HOME `id` \\n;|&<>*",
        "PYTHONPATH": "/usr/local/lib/python3.11/site-packages",
    }
    keys = sorted(env)
    show = f"import json, os; print(json.dumps({{k: os.environ[k] for k in {keys!r}}}))"
    line = remote_shell(env, [sys.executable, "-c", show], cwd="/")
    assert "export PYTHONPATH=/usr/local/lib/python3.11/site-packages;" in line
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == env
