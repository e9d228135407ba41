"""MPI runners: OpenMPI mpirun, MPICH and Intel MPI mpiexec/mpirun (Hydra), MVAPICH mpirun_rsh.

MPI starts every rank itself; each rank runs through ``ds.launcher.rankenv``, which turns the MPI
rank variables into RANK/LOCAL_RANK/WORLD_SIZE before replacing itself with the user command.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ds.interfaces.runner import LaunchSpec
from ds.launcher.runners.base import rank_shim, rendezvous_env, uniform_slots, which


@functools.cache
def mpi_flavor(binary: str) -> str | None:
    """Which MPI a launcher binary belongs to: openmpi, impi, mpich, mvapich, or None."""
    if not which(binary):
        return None
    try:
        text = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = (text.stdout + text.stderr).lower()
    if "open mpi" in out or "openrte" in out or "open-mpi" in out:
        return "openmpi"
    if "intel" in out:
        return "impi"
    if "mvapich" in out:
        return "mvapich"
    if "hydra" in out or "mpich" in out:
        return "mpich"
    return None


class OpenMPIRunner:
    def __init__(self, python: str | None = None, as_root: bool | None = None) -> None:
        self.python = python
        self.as_root = (os.geteuid() == 0) if as_root is None else as_root

    def name(self) -> str:
        return "openmpi"

    def backend_exists(self) -> bool:
        return mpi_flavor("mpirun") == "openmpi"

    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]:
        uniform_slots(spec, self.name())
        hosts = ",".join(f"{h}:{len(s)}" for h, s in spec.hosts.items())
        cmd = ["mpirun", "-n", str(spec.world_size), "--host", hosts]
        if self.as_root:
            cmd.append("--allow-run-as-root")
        # MPI's default core binding would pin each rank (and all its threads) to one core.
        cmd += ["--bind-to", "none", "--mca", "btl", "^openib"]
        for k, v in rendezvous_env(spec).items():
            cmd += ["-x", f"{k}={v}"]
        cmd += list(spec.launcher_args)
        cmd += rank_shim(spec.user_command, self.python)
        return [cmd]


class _HydraRunner:
    binary = "mpiexec"
    runner_name = "mpich"

    def __init__(self, python: str | None = None) -> None:
        self.python = python

    def name(self) -> str:
        return self.runner_name

    def backend_exists(self) -> bool:
        return mpi_flavor(self.binary) == self.runner_name

    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]:
        ppn = uniform_slots(spec, self.name())
        cmd = [self.binary, "-n", str(spec.world_size), "-ppn", str(ppn)]
        cmd += ["-hosts", ",".join(spec.hosts)]
        for k, v in {**self.extra_env(), **rendezvous_env(spec)}.items():
            cmd += ["-genv", k, v]
        cmd += list(spec.launcher_args)
        cmd += rank_shim(spec.user_command, self.python)
        return [cmd]

    def extra_env(self) -> dict[str, str]:
        return {}


class MPICHRunner(_HydraRunner):
    binary = "mpiexec"
    runner_name = "mpich"


class IMPIRunner(_HydraRunner):
    binary = "mpirun"
    runner_name = "impi"

    def extra_env(self) -> dict[str, str]:
        # Intel MPI pins ranks by default; ds sets per-rank thread counts itself.
        return {"I_MPI_PIN": "0"}


class MVAPICHRunner:
    def __init__(self, python: str | None = None, hostfile_dir: str | None = None) -> None:
        self.python = python
        self.hostfile_dir = Path(hostfile_dir or tempfile.gettempdir())

    def name(self) -> str:
        return "mvapich"

    def backend_exists(self) -> bool:
        return which("mpirun_rsh")

    def hostfile_for(self, hosts: Sequence[str]) -> Path:
        text = "".join(f"{h}\n" for h in hosts)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        path = self.hostfile_dir / f"ds_mvapich_hosts_{digest}"
        path.write_text(text)
        return path

    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]:
        ppn = uniform_slots(spec, self.name())
        # mpirun_rsh places ranks from a file listing each host once per rank.
        hostfile = self.hostfile_for([h for h in spec.hosts for _ in range(ppn)])
        cmd = ["mpirun_rsh", "-np", str(spec.world_size), "-hostfile", str(hostfile)]
        env = {"MV2_SUPPORT_DL": "1", "MV2_ENABLE_AFFINITY": "0", **rendezvous_env(spec)}
        cmd += [f"{k}={v}" for k, v in env.items()]
        cmd += list(spec.launcher_args)
        cmd += rank_shim(spec.user_command, self.python)
        return [cmd]
