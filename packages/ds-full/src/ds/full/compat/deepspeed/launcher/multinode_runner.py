"""``deepspeed.launcher.multinode_runner``: DeepSpeed's per-backend command builders as views of
ds's launcher runners (``ds.launcher.runners``).

A builder takes DeepSpeed's launcher arguments (``deepspeed.launcher.runner.parse_args``) and the
base64 world info, and ``get_cmd(environment, active_resources)`` returns the command ds's runner
for the same back-end would start: the ranks run through ds's rank shim, which turns MPI/SLURM
rank variables into RANK/LOCAL_RANK/WORLD_SIZE. ``active_resources`` maps each host to its slot
indices or to a slot count, as DeepSpeed's resource pool does.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from ds.interfaces.runner import LaunchSpec
from ds.launcher.runners import mpi as _mpi
from ds.launcher.runners import pdsh as _pdsh
from ds.launcher.runners import slurm as _slurm
from ds.launcher.runners.base import which

# Open MPI's TCP transport picks interfaces itself unless told; DeepSpeed's builder names eth0
# unless the launcher arguments choose one.
_OMPI_DEFAULT_NIC = ["--mca", "btl_tcp_if_include", "eth0"]


# The characters a shell word may hold bare (the set shlex.quote leaves unquoted).
_SHELL_BARE = re.compile(r"[^\w@%+=:,./-]", re.ASCII)
# Inside double quotes a shell still expands these four; a backslash makes each literal.
_IN_DOUBLE_QUOTES = re.compile(r'([\\"$`])')


def export_word(value: str) -> str:
    """``value`` as the shell word DeepSpeed keeps in ``exports``: bare when it is plain, else in
    double quotes with the characters a shell expands there escaped."""
    if not _SHELL_BARE.search(value):
        return value
    return '"' + _IN_DOUBLE_QUOTES.sub(r"\\\1", value) + '"'


def export_value(word: str) -> str:
    """The value an ``exports`` entry stands for (the inverse of :func:`export_word`); an entry a
    caller wrote bare is taken as it is."""
    if len(word) >= 2 and word[0] == word[-1] == '"':
        return re.sub(r'\\([\\"$`])', r"\1", word[1:-1])
    return word


def _slots(active_resources: Mapping[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for host, slots in active_resources.items():
        out[host] = list(range(slots)) if isinstance(slots, int) else [int(s) for s in slots]
    return out


class MultiNodeRunner:
    """The shared part of DeepSpeed's builders: arguments, exports and the ds runner behind."""

    def __init__(self, args: argparse.Namespace, world_info_base64: str) -> None:
        self.args = args
        self.world_info_base64 = world_info_base64
        self.user_script = args.user_script
        self.user_arguments = self.parse_user_args()
        self.exports: dict[str, str] = {}
        self.validate_args()

    def _runner(self) -> Any:  # pragma: no cover - every builder overrides it
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    def backend_exists(self) -> bool:
        return bool(self._runner().backend_exists())

    def add_export(self, key: str, var: str) -> None:
        # ``exports`` holds shell words, as DeepSpeed's builders paste them into a command line;
        # ds's runners get the plain values back and quote them for their own command lines.
        self.exports[key.strip()] = export_word(var.strip())

    def parse_user_args(self) -> list[str]:
        return list(self.args.user_args)

    def validate_args(self) -> None:
        pass

    def _launcher_args(self) -> list[str]:
        return shlex.split(getattr(self.args, "launcher_args", "") or "")

    def _spec(
        self, environment: Mapping[str, str], active_resources: Mapping[str, Any]
    ) -> LaunchSpec:
        hosts = _slots(active_resources)
        master = getattr(self.args, "master_addr", "") or next(iter(hosts))
        python = [sys.executable, "-u"] if not getattr(self.args, "no_python", False) else []
        module = ["-m"] if getattr(self.args, "module", False) else []
        return LaunchSpec(
            hosts=hosts,
            master_addr=master,
            master_port=int(getattr(self.args, "master_port", 29500)),
            user_command=[*python, *module, self.user_script, *self.user_arguments],
            env={k: export_value(v) for k, v in self.exports.items()},
            launcher_args=self._launcher_args(),
        )

    def _build(
        self, environment: Mapping[str, str], active_resources: Mapping[str, Any]
    ) -> list[str]:
        (cmd,) = self._runner().get_cmd(self._spec(environment, active_resources))
        return cmd

    def get_cmd(
        self, environment: MutableMapping[str, str], active_resources: Mapping[str, Any]
    ) -> Any:
        return self._build(environment, active_resources)


class PDSHRunner(MultiNodeRunner):
    """pdsh fan-out of ds's per-node agent; returns ``(cmd, kill_cmd, environment)``."""

    def _runner(self) -> _pdsh.PdshRunner:
        return _pdsh.PdshRunner(ssh_port=getattr(self.args, "ssh_port", None))

    @property
    def name(self) -> str:
        return "pdsh"

    def get_cmd(
        self, environment: MutableMapping[str, str], active_resources: Mapping[str, Any]
    ) -> Any:
        environment["PDSH_RCMD_TYPE"] = "ssh"
        environment.update(self._runner().env())
        cmd = self._build(environment, active_resources)
        kill_cmd = ["pdsh", "-S", "-f", "1024", "-w", ",".join(active_resources), "pkill -f "
                    + shlex.quote(self.user_script)]  # fmt: skip
        return cmd, kill_cmd, environment


class OpenMPIRunner(MultiNodeRunner):
    def __init__(
        self, args: argparse.Namespace, world_info_base64: str, resource_pool: Mapping[str, Any]
    ) -> None:
        super().__init__(args, world_info_base64)
        self.resource_pool = resource_pool

    def _runner(self) -> _mpi.OpenMPIRunner:
        return _mpi.OpenMPIRunner()

    @property
    def name(self) -> str:
        # The MPI-family builders and SLURM are named as the ds runner behind them.
        return str(self._runner().name())

    def _launcher_args(self) -> list[str]:
        extra = super()._launcher_args()
        return extra if "btl_tcp_if_include" in extra else [*_OMPI_DEFAULT_NIC, *extra]


class _MpirunHydra(_mpi._HydraRunner):
    binary = "mpirun"  # Hydra's mpirun and mpiexec are the same program
    runner_name = "mpich"

    def backend_exists(self) -> bool:
        return which("mpirun")


class MPICHRunner(OpenMPIRunner):
    def _runner(self) -> _mpi._HydraRunner:
        return _MpirunHydra()

    def _launcher_args(self) -> list[str]:
        return MultiNodeRunner._launcher_args(self)


class IMPIRunner(MPICHRunner):
    def _runner(self) -> _mpi._HydraRunner:
        return _mpi.IMPIRunner()


class SlurmRunner(MPICHRunner):
    def _runner(self) -> _slurm.SlurmRunner:
        return _slurm.SlurmRunner()


class _MvapichHydra(_mpi._HydraRunner):
    """MVAPICH2's ``mpirun`` (Hydra), the launcher DeepSpeed's builder uses; ds's own MVAPICH
    runner starts ranks with ``mpirun_rsh`` instead."""

    binary = "mpirun"
    runner_name = "mvapich"

    def backend_exists(self) -> bool:
        return _mpi.MVAPICHRunner().backend_exists() and which("mpirun")

    def extra_env(self) -> dict[str, str]:
        return {"MV2_SUPPORT_DL": "1", "MV2_ENABLE_AFFINITY": "0"}


class MVAPICHRunner(MPICHRunner):
    def _runner(self) -> _mpi._HydraRunner:
        return _MvapichHydra()


__all__ = [
    "IMPIRunner",
    "MPICHRunner",
    "MVAPICHRunner",
    "MultiNodeRunner",
    "OpenMPIRunner",
    "PDSHRunner",
    "SlurmRunner",
]
