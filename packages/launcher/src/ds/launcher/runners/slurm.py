"""SLURM: one srun that starts every rank inside the current allocation."""

from __future__ import annotations

from ds.interfaces.errors import LaunchError
from ds.interfaces.runner import LaunchSpec
from ds.launcher.runners.base import rank_shim, rendezvous_env, uniform_slots, which


class SlurmRunner:
    def __init__(self, python: str | None = None) -> None:
        self.python = python

    def name(self) -> str:
        return "slurm"

    def backend_exists(self) -> bool:
        return which("srun")

    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]:
        ppn = uniform_slots(spec, self.name())
        env = rendezvous_env(spec)
        for k, v in env.items():
            if "," in v:
                # srun --export separates variables with commas and has no escape for them.
                raise LaunchError(
                    f"the slurm runner cannot export {k}={v!r}: srun --export values cannot "
                    "contain commas; remove the comma or set the variable in the batch script"
                )
        cmd = [
            "srun",
            "-n",
            str(spec.world_size),
            "--nodes",
            str(len(spec.hosts)),
            "--ntasks-per-node",
            str(ppn),
            "--nodelist",
            ",".join(spec.hosts),
            "--export",
            ",".join(["ALL", *(f"{k}={v}" for k, v in env.items())]),
        ]
        cmd += list(spec.launcher_args)
        cmd += rank_shim(spec.user_command, self.python)
        return [cmd]
