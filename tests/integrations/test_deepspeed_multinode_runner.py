"""``deepspeed.launcher.multinode_runner``: DeepSpeed's builder classes build the commands of
ds's launcher runners for the same back-ends, with DeepSpeed's constructor and return shapes."""

from __future__ import annotations

import os

import pytest

from ds.full.compat.deepspeed.launcher import multinode_runner as mn
from ds.full.compat.deepspeed.launcher.runner import encode_world_info, parse_args
from ds.interfaces.errors import LaunchError

POOL = {"worker-0": 4, "worker-1": 4}


def _args(*extra: str):  # type: ignore[no-untyped-def]
    return parse_args([*extra, "train.py", "--lr", "1"])


def test_pdsh_builder_returns_command_kill_command_and_environment() -> None:
    runner = mn.PDSHRunner(_args(), encode_world_info(POOL))
    env = dict(os.environ)
    cmd, kill_cmd, env_out = runner.get_cmd(env, POOL)
    assert cmd[0] == "pdsh" and "worker-0,worker-1" in cmd
    assert "train.py" in cmd[-1] and "--lr" in cmd[-1]
    assert kill_cmd[0] == "pdsh" and env_out["PDSH_RCMD_TYPE"] == "ssh"
    assert runner.name == "pdsh" and isinstance(runner.backend_exists(), bool)


@pytest.mark.parametrize(
    ("cls", "binary", "nic"),
    [(mn.OpenMPIRunner, "mpirun", True), (mn.MPICHRunner, "mpirun", False),
     (mn.IMPIRunner, "mpirun", False), (mn.SlurmRunner, "srun", False),
     (mn.MVAPICHRunner, "mpirun", False)],
)  # fmt: skip
def test_mpi_and_slurm_builders_run_ds_rank_shim(cls: type, binary: str, nic: bool) -> None:
    runner = cls(_args(), encode_world_info(POOL), POOL)
    cmd = runner.get_cmd(dict(os.environ), POOL)
    assert cmd[0] == binary
    assert "8" in cmd  # world size
    assert cmd[-3:] == ["train.py", "--lr", "1"]
    assert ("eth0" in cmd) is nic
    assert isinstance(runner, mn.MultiNodeRunner)


def test_openmpi_launcher_args_choose_the_interface() -> None:
    for flag in ("-mca btl_tcp_if_include eth1", "--mca btl_tcp_if_include eth1"):
        args = _args("--launcher_args", flag)
        cmd = mn.OpenMPIRunner(args, encode_world_info(POOL), POOL).get_cmd({}, POOL)
        assert "eth0" not in cmd and "eth1" in cmd


def test_slot_lists_and_what_the_runners_refuse() -> None:
    pool = {"worker-0": [0, 1], "worker-1": [0, 1]}
    cmd = mn.SlurmRunner(_args(), encode_world_info(pool), pool).get_cmd({}, pool)
    assert cmd[cmd.index("--ntasks-per-node") + 1] == "2"
    for bad in ({"a": 2, "b": 3}, {"a": [0, 2]}):
        with pytest.raises(LaunchError):
            mn.SlurmRunner(_args(), "", bad).get_cmd({}, bad)


def test_add_export_keeps_shell_words_and_the_remote_line_gives_back_the_values() -> None:
    import subprocess

    runner = mn.PDSHRunner(_args(), encode_world_info(POOL))
    odd = 'a "b" $HOME `id`'
    runner.add_export("SLURM_JOB_CPUS_PER_NODE", " 64(x2) ")
    runner.add_export("PYTHONPATH", "/usr/lib/python3/site-packages")
    runner.add_export("ODD", odd)
    # DeepSpeed's form: a plain value bare, one with shell syntax double-quoted.
    assert runner.exports["SLURM_JOB_CPUS_PER_NODE"] == '"64(x2)"'
    assert runner.exports["PYTHONPATH"] == "/usr/lib/python3/site-packages"
    for word, value in [(runner.exports["ODD"], odd), ('"64(x2)"', "64(x2)")]:
        assert mn.export_value(word) == value
        echoed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True,
                                text=True, timeout=30).stdout  # fmt: skip
        assert echoed == value
    cmd, _, _ = runner.get_cmd(dict(os.environ), POOL)
    exports = cmd[-1].split("; ")[1:-1]
    show = "; ".join(
        [*exports, 'printf "%s|%s|%s" "$SLURM_JOB_CPUS_PER_NODE" "$ODD" "$PYTHONPATH"']
    )
    out = subprocess.run(["bash", "-c", show], capture_output=True, text=True, timeout=30).stdout
    assert out == f"64(x2)|{odd}|/usr/lib/python3/site-packages"
