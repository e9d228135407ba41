"""Shared pieces of the multi-node runners."""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence

from ds.interfaces.errors import LaunchError
from ds.interfaces.runner import LaunchSpec


def encode_hosts(hosts: Mapping[str, Sequence[int]]) -> str:
    raw = json.dumps({h: list(s) for h, s in hosts.items()}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_hosts(text: str) -> dict[str, list[int]]:
    data = json.loads(base64.urlsafe_b64decode(text.encode()).decode())
    return {str(h): [int(s) for s in slots] for h, slots in data.items()}


def rendezvous_env(spec: LaunchSpec) -> dict[str, str]:
    env = dict(spec.env)
    env["MASTER_ADDR"] = spec.master_addr
    env["MASTER_PORT"] = str(spec.master_port)
    return env


def uniform_slots(spec: LaunchSpec, runner: str) -> int:
    """Ranks per host for runners that cannot place individual slots (MPI, SLURM)."""
    counts = {len(s) for s in spec.hosts.values()}
    if len(counts) != 1:
        raise LaunchError(
            f"the {runner} runner needs the same number of slots on every host, got "
            f"{ {h: len(s) for h, s in spec.hosts.items()} }; use --num_gpus/--nproc to even them"
        )
    for host, slots in spec.hosts.items():
        if list(slots) != list(range(len(slots))):
            raise LaunchError(
                f"the {runner} runner cannot select individual slots (host {host!r} has "
                f"{list(slots)}); drop the slot list from --include/--exclude"
            )
    return counts.pop()


def rank_shim(user_command: Sequence[str], python: str | None = None) -> list[str]:
    return [python or sys.executable, "-u", "-m", "ds.launcher.rankenv", "--", *user_command]


def agent_command(
    spec: LaunchSpec,
    node: str,
    agent_args: Sequence[str],
    python: str | None = None,
) -> list[str]:
    """The per-node launcher command (``node`` is a node rank, or a pdsh placeholder)."""
    return [
        python or sys.executable,
        "-u",
        "-m",
        "ds.launcher.agent",
        f"--world_info={encode_hosts(spec.hosts)}",
        node,
        f"--master_addr={spec.master_addr}",
        f"--master_port={spec.master_port}",
        *agent_args,
        "--",
        *spec.user_command,
    ]


def remote_shell(env: Mapping[str, str], argv: Sequence[str], cwd: str | None = None) -> str:
    """One shell line for a remote node: cd to the job directory, export the env, run argv."""
    parts = [f"cd {shlex.quote(cwd or os.getcwd())}"]
    parts += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    parts.append(shlex.join(argv))
    return "; ".join(parts)


def which(binary: str) -> bool:
    return shutil.which(binary) is not None


class RemoteAgentRunner:
    """Shared settings of the runners that start the per-node agent over a remote shell."""

    program: str  # the remote-shell client: the runner's name, and what must be on PATH

    def __init__(
        self,
        agent_args: Sequence[str] = (),
        python: str | None = None,
        cwd: str | None = None,
        ssh_port: int | None = None,
    ) -> None:
        self.agent_args = list(agent_args)
        self.python = python
        self.cwd = cwd
        self.ssh_port = ssh_port

    def name(self) -> str:
        return self.program

    def backend_exists(self) -> bool:
        return which(self.program)
